"""Blocked messages are visible: dq_queue_stats / dq_stats / dq_metrics count them apart from ready,
scheduled and expired; dq_list_messages, dq_browse_messages, dq_message_detail and dq_dependencies
say blocked, with the due time and group the child gets once released and its pending parents.

Single-session SQL tests on one database per module, its queue tables emptied before each test
(``module_conn``, autocommit). Messages are offered due long ago, so whatever is not blocked is ready.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlhelpers import nested_plans

import pyqueue

Q = "q"
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
LATER = datetime(2100, 1, 1, tzinfo=UTC)
LOCK = timedelta(minutes=5)


def offer(conn: psycopg.Connection[Any], key: str, *, after: list[Any] | None = None, queue: str = Q,
          at: datetime = LONG_AGO, group: str | None = None, expires_at: datetime | None = None) -> str:
    row = conn.execute(
        "SELECT dq_offer(%s, %s, 'p'::text, %s, message_group => %s, expires_at => %s, after => %s::jsonb)",
        (queue, key, at, group, expires_at, None if after is None else json.dumps(after))).fetchone()
    assert row is not None
    return str(row[0])


def poll(conn: psycopg.Connection[Any], queue: str = Q) -> dict[str, uuid.UUID]:
    rows = conn.execute("SELECT key, lock_token FROM dq_poll_many(%s, 100, %s)", (queue, LOCK)).fetchall()
    return {r[0]: r[1] for r in rows}


def stats(conn: psycopg.Connection[Any], queue: str = Q) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM dq_queue_stats(%s)", (queue,))
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return dict(zip([d.name for d in cur.description], row, strict=True))


COUNTS = ("ready", "scheduled", "in_flight", "blocked", "expired", "held")


def counts(conn: psycopg.Connection[Any], queue: str = Q) -> dict[str, int]:
    s = stats(conn, queue)
    return {k: s[k] for k in COUNTS}


def view_counts(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int, int]]:
    """{queue: (ready, scheduled, blocked)} of the dq_stats view."""
    return {r[0]: (r[1], r[2], r[3]) for r in conn.execute("SELECT queue, ready, scheduled, blocked FROM dq_stats")}


def metric_counts(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int, int]]:
    """{queue: (ready, scheduled, blocked)} of dq_metrics()."""
    return {r[0]: (r[1], r[2], r[3]) for r in conn.execute("SELECT queue, ready, scheduled, blocked FROM dq_metrics()")}


def listed(conn: psycopg.Connection[Any], state: str | None = None, queue: str = Q) -> list[dict[str, Any]]:
    cur = conn.execute("SELECT * FROM dq_list_messages(%s, %s)", (queue, state))
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def browsed(conn: psycopg.Connection[Any], state: str | None = None, queue: str = Q) -> list[dict[str, Any]]:
    cur = conn.execute("SELECT * FROM dq_browse_messages(%s, %s)", (queue, state))
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# --------------------------------------------------------------------------- counts


def test_blocked_children_are_counted_per_queue_and_in_no_other_count(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "B", at=LATER)  # scheduled
    offer(c, "C1", after=["A"])  # blocked, due long ago once released
    offer(c, "C2", after=["A", "B"], at=LATER)  # blocked, due later once released
    offer(c, "X", queue="other", after=[[Q, "A"]])  # blocked in another queue by a parent of q
    offer(c, "Y", queue="other")
    assert counts(c) == {"ready": 1, "scheduled": 1, "in_flight": 0, "blocked": 2, "expired": 0, "held": 0}
    assert counts(c, "other") == {"ready": 1, "scheduled": 0, "in_flight": 0, "blocked": 1, "expired": 0,
                                  "held": 0}
    assert view_counts(c) == {Q: (1, 1, 2), "other": (1, 0, 1)}
    assert metric_counts(c) == {Q: (1, 1, 2), "other": (1, 0, 1)}
    s = stats(c)
    assert s["next_due"] == LATER  # B; a blocked child is never the next due
    assert s["approximate"] is False


def test_a_released_child_leaves_blocked_for_ready_or_scheduled(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "C1", after=["A"])
    offer(c, "C2", after=["A"], at=LATER)
    offer(c, "X", queue="other", after=[[Q, "A"]])
    got = poll(c)
    assert list(got) == ["A"]
    assert counts(c) == {"ready": 0, "scheduled": 0, "in_flight": 1, "blocked": 2, "expired": 0, "held": 0}
    assert c.execute("SELECT dq_ack(%s)", (got["A"],)).fetchone() == (True,)
    assert counts(c) == {"ready": 1, "scheduled": 1, "in_flight": 0, "blocked": 0, "expired": 0, "held": 0}
    assert view_counts(c) == {Q: (1, 1, 0), "other": (1, 0, 0)}


def test_a_cancelled_or_purged_blocked_child_leaves_the_count(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "C1", after=["A"])
    offer(c, "C2", after=["A"])
    offer(c, "X", queue="other", after=[[Q, "A"]])
    assert c.execute("SELECT dq_cancel(%s, 'C1')", (Q,)).fetchone() == (True,)
    assert counts(c)["blocked"] == 1
    assert c.execute("SELECT dq_cancel_waiting(%s, 'C2')", (Q,)).fetchone() == ("cancelled",)
    assert counts(c)["blocked"] == 0 and counts(c)["ready"] == 1
    assert c.execute("SELECT dq_purge('other', confirm => true)").fetchone() == (1,)
    assert metric_counts(c) == {Q: (1, 0, 0)}


def test_a_dead_lettered_parent_keeps_its_waiting_child_blocked(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    c.execute("SELECT dq_configure_queue(%s, 1, 'q.dead')", (Q,))
    offer(c, "A")
    offer(c, "C", after=["A"])
    token = poll(c)["A"]
    c.execute("SELECT dq_dead_letter(%s, 'boom')", (token,))
    assert counts(c)["blocked"] == 1 and stats(c)["dead"] == 1
    assert stats(c, "q.dead")["blocked"] == 0 and stats(c, "q.dead")["ready"] == 1


def test_a_blocked_child_past_its_expiry_is_blocked_not_expired(module_conn: psycopg.Connection[Any]) -> None:
    """Its expiry is checked once it is released: until then it is blocked, in no other count."""
    c = module_conn
    offer(c, "A")
    offer(c, "C", after=["A"], expires_at=LONG_AGO + timedelta(seconds=1))
    assert counts(c) == {"ready": 1, "scheduled": 0, "in_flight": 0, "blocked": 1, "expired": 0, "held": 0}
    assert [(r["key"], r["state"]) for r in browsed(c)] == [("A", "ready"), ("C", "blocked")]
    assert [r["key"] for r in browsed(c, "expired")] == []


def test_a_grouped_blocked_child_is_not_held(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "G1", group="g")
    offer(c, "G2", group="g", after=["A"])
    assert counts(c) == {"ready": 2, "scheduled": 0, "in_flight": 0, "blocked": 1, "expired": 0, "held": 0}
    token = poll(c)
    assert set(token) == {"A", "G1"}
    c.execute("SELECT dq_ack(%s)", (token["A"],))
    assert counts(c) == {"ready": 1, "scheduled": 0, "in_flight": 1, "blocked": 0, "expired": 0, "held": 1}


def test_blocked_past_the_exact_limit_stops_at_the_limit_and_is_flagged(module_conn: psycopg.Connection[Any]) -> None:
    """Blocked rows written as dq_offer stores them (due at 9999-12-31, parents_pending > 0): counted up
    to 20,000 + 1, the row approximate; scheduled and ready stay exact."""
    c = module_conn
    c.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, "
        "                         parents_pending, release_at) "
        "SELECT 'big', 'k' || g, 'x', 'bytes', '9999-12-31 00:00:00+00', now(), 1, now() "
        "FROM generate_series(1, 20005) g")
    offer(c, "due", queue="big")
    s = stats(c, "big")
    assert (s["blocked"], s["ready"], s["scheduled"], s["approximate"]) == (20001, 1, 0, True)
    c.execute("DELETE FROM dq_messages WHERE queue = 'big' AND key LIKE 'k1%'")
    s = stats(c, "big")
    assert s["approximate"] is False and s["blocked"] == 20005 - c.execute(
        "SELECT count(*) FROM generate_series(1, 20005) g WHERE g::text LIKE '1%'").fetchone()[0]


def test_stats_with_blocked_children_read_the_indexes_not_the_table(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    c.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, "
        "                         parents_pending, release_at) "
        "SELECT 'q' || (g % 5), 'k' || g, 'x', 'bytes', "
        "       CASE WHEN g % 2 = 0 THEN timestamptz '9999-12-31 00:00:00+00' ELSE now() + g * interval '1 second' END,"
        "       now(), (g % 2 = 0)::integer, CASE WHEN g % 2 = 0 THEN now() END "
        "FROM generate_series(1, 20000) g")
    c.execute("VACUUM ANALYZE dq_messages")
    assert stats(c, "q0")["blocked"] == 2000
    plans = nested_plans(c, "SELECT * FROM dq_stats")
    assert "dq_messages_ready_idx" in plans, plans
    assert "Seq Scan on dq_messages" not in plans, plans


# --------------------------------------------------------------------------- states


def test_list_messages_blocked_filter_shows_release_time_group_and_pending_parents(
        module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "B", at=LATER)
    offer(c, "P", queue="other")
    offer(c, "C", after=["A", "B", ["other", "P"], "never-offered"], at=LATER + timedelta(days=1), group="g")
    offer(c, "D", after=["A", ["other", "P"]])
    rows = listed(c, "blocked")
    assert [(r["key"], r["state"], r["scheduled_at"], r["message_group"], r["parents_pending"]) for r in rows] == [
        ("C", "blocked", LATER + timedelta(days=1), "g", 3), ("D", "blocked", LONG_AGO, None, 2)]
    assert [(r["key"], r["state"], r["parents_pending"]) for r in listed(c)] == [
        ("A", "ready", 0), ("B", "scheduled", 0), ("C", "blocked", 3), ("D", "blocked", 2)]
    token = poll(c, "other")["P"]
    c.execute("SELECT dq_ack(%s)", (token,))
    assert [(r["key"], r["parents_pending"]) for r in listed(c, "blocked")] == [("C", 2), ("D", 1)]
    assert [r["key"] for r in listed(c, "scheduled")] == ["B"]
    assert [r["key"] for r in listed(c, "ready")] == ["A"]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="ready, scheduled, in_flight, redelivered, blocked"):
        listed(c, "waiting")


def test_browse_and_detail_say_blocked(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "C", after=["A"], at=LATER, group="g")
    rows = browsed(c, "blocked")
    assert [(r["key"], r["state"], r["scheduled_at"], r["message_group"], r["parents_pending"]) for r in rows] == [
        ("C", "blocked", LATER, "g", 1)]
    assert [r["key"] for r in browsed(c, "scheduled")] == []
    assert [r["key"] for r in browsed(c, "held")] == []
    cur = c.execute("SELECT state, scheduled_at, message_group, parents_pending FROM dq_message_detail(%s, %s)",
                    (Q, rows[0]["id"]))
    assert cur.fetchone() == ("blocked", LATER, "g", 1)
    a_id = browsed(c, "ready")[0]["id"]
    assert c.execute("SELECT state, parents_pending FROM dq_message_detail(%s, %s)", (Q, a_id)).fetchone() == (
        "ready", 0)


def test_dependencies_name_a_blocked_parent_blocked(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "B", after=["A"])
    offer(c, "C", after=["B"])
    assert c.execute("SELECT relation, related_key, state FROM dq_dependencies(%s, 'C')", (Q,)).fetchall() == [
        ("parent", "B", "blocked")]
    assert c.execute("SELECT relation, related_key, state FROM dq_dependencies(%s, 'B')", (Q,)).fetchall() == [
        ("parent", "A", "ready"), ("child", "C", "blocked")]


# --------------------------------------------------------------------------- Python


def test_client_stats_carry_blocked(module_dsn: str, module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "C", after=["A"])
    with pyqueue.DelayedQueue(module_dsn, Q) as q:
        s = q.stats()
    assert (s.ready, s.scheduled, s.blocked) == (1, 0, 1)
    assert {r.queue: r.blocked for r in pyqueue.all_stats(c)} == {Q: 1}
