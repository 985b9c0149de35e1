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
    assert "Index Scan using dq_messages_ready_idx" in plans, plans
    assert "Index Scan using dq_messages_pkey" in plans, plans
    assert "Seq Scan on dq_messages" not in plans, plans


def test_a_session_that_first_polled_an_empty_table_uses_the_index_for_a_backlog(conn) -> None:
    """Generic plans are made once per session: the first poll, on an empty never-analyzed table,
    must not leave a plan (sequential scan and sort) that the same session then uses on a backlog
    (found by bench/latency.py)."""
    conn.execute("ANALYZE dq_messages")  # empty, as after a queue drained and autovacuum analyzed it
    conn.execute("SELECT * FROM dq_poll_many('q', 100, interval '1 hour')")  # plans on the empty table
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially) "
        "SELECT 'q', 'k' || g, 'x', 'bytes', now() - interval '1 minute', now() FROM generate_series(1, 20000) g")
    plans = nested_plans(conn, "SELECT * FROM dq_poll_many('q', 100, interval '1 hour')")
    assert "Index Scan using dq_messages_ready_idx" in plans, plans
    assert "Seq Scan on dq_messages" not in plans, plans
    assert "Sort Key: d.scheduled_at" not in plans, plans  # the index gives the order
    assert "JIT:" not in plans, plans


def test_ack_keeps_using_the_lock_token_index_after_the_table_grew(conn) -> None:
    """The same hazard for dq_ack, whose plan PL/pgSQL may cache as generic after five calls."""
    conn.execute("ANALYZE dq_messages")
    for _ in range(8):
        conn.execute("SELECT dq_ack_many(ARRAY[gen_random_uuid()])")
        conn.execute("SELECT dq_ack(gen_random_uuid())")
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, lock_token) "
        "SELECT 'q', 'k' || g, 'x', 'bytes', now() + interval '1 minute', now(), gen_random_uuid() "
        "FROM generate_series(1, 20000) g")
    plans = nested_plans(conn, "SELECT dq_ack_many(ARRAY[gen_random_uuid()]), dq_ack(gen_random_uuid())")
    assert "Seq Scan on dq_messages" not in plans, plans
    assert "JIT:" not in plans, plans
