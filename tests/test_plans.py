"""The statements inside dq_poll_many use the intended plans (no sequential scan of the live
table), whatever the table holds: checked with auto_explain on the function's own statements."""

from __future__ import annotations

import psycopg


def nested_plans(conn: psycopg.Connection, statement: str) -> str:
    logs: list[str] = []
    conn.add_notice_handler(lambda diag: logs.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET client_min_messages = log")
    for _ in range(3):  # also after the plan cache has settled
        conn.execute(statement)
    conn.execute("SET client_min_messages = notice")
    return "\n".join(logs)


def test_poll_uses_index_scans_with_many_future_messages(conn) -> None:
    conn.execute(
        "SELECT count(*) FROM dq_offer_many('q', (SELECT array_agg('k' || g) FROM generate_series(1, 20000) g), "
        "(SELECT array_agg('\\x00'::bytea) FROM generate_series(1, 20000) g), "
        "(SELECT array_agg(now() + interval '1 day') FROM generate_series(1, 20000) g))"
    )
    conn.execute("SELECT dq_offer('q', 'due', '\\x01'::bytea, now() - interval '1 second')")
    conn.execute("VACUUM ANALYZE dq_messages")
    plans = nested_plans(conn, "SELECT * FROM dq_poll_many('q', 100, interval '1 hour')")
    assert "Index Scan using dq_messages_queue_scheduled_at_idx" in plans, plans
    assert "Index Scan using dq_messages_pkey" in plans, plans
    assert "Seq Scan on dq_messages" not in plans, plans
