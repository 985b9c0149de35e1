"""Blocked children and the delivery controls (docs/workflows.md, "The rules"): once released, a child is
an ordinary message of its queue: priority orders it, pause holds it, max_in_flight and the rate limit
count it, its due time is its own; expiry that passed while it was blocked removes it (archived as
expired) at the first poll after its release; the archive keeps what happened to it.

Single-session SQL tests on one database per module (``module_conn``: queue tables emptied before each
test); the helpers are those of test_sql_dependencies.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from test_sql_dependencies import LONG_AGO, ack, blocked, deliver, offer, poll


def offer_p(c: psycopg.Connection[Any], key: str, priority: int, after: list[Any]) -> None:
    row = c.execute("SELECT dq_offer('q', %s, 'p'::text, %s, priority => %s, after => %s::jsonb)",
                    (key, LONG_AGO, priority, f'["{after[0]}"]')).fetchone()
    assert row == ("created",)


def test_released_children_come_in_priority_order(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    for key, priority in (("low", 0), ("high", 9), ("mid", 5)):
        offer_p(c, key, priority, ["A"])
    ack(c, deliver(c, "A"))
    keys = [r[0] for r in c.execute("SELECT key FROM dq_poll_many('q', 3, interval '1 minute')").fetchall()]
    assert keys == ["high", "mid", "low"]


def test_a_paused_queue_holds_a_released_child(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A", queue="parents")
    offer(c, "B", after=[["parents", "A"]])
    assert c.execute("SELECT dq_pause_queue('q')").fetchone() == (True,)
    ack(c, deliver(c, "A", "parents"))
    assert blocked(c) == {}  # released ...
    assert poll(c) == {}     # ... but the queue is paused
    assert c.execute("SELECT ready, blocked, paused FROM dq_stats WHERE queue = 'q'").fetchone() == (1, 0, True)
    assert c.execute("SELECT dq_resume_queue('q')").fetchone() == (True,)
    assert list(poll(c)) == ["B"]


def test_max_in_flight_counts_a_released_child(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    c.execute("SELECT dq_configure_queue('q', max_in_flight => 1)")
    offer(c, "A", queue="parents")
    offer(c, "busy")
    offer(c, "B", after=[["parents", "A"]])
    held = deliver(c, "busy")
    ack(c, deliver(c, "A", "parents"))
    assert poll(c) == {}  # released, but the one slot is taken
    ack(c, held)
    assert list(poll(c)) == ["B"]


def test_a_child_due_later_is_released_scheduled(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    later = datetime(2999, 1, 1, tzinfo=UTC)
    offer(c, "A")
    offer(c, "B", after=["A"], at=later)
    ack(c, deliver(c, "A"))
    assert c.execute("SELECT scheduled, blocked FROM dq_stats WHERE queue = 'q'").fetchone() == (1, 0)
    assert c.execute("SELECT scheduled_at FROM dq_messages WHERE key = 'B'").fetchone() == (later,)
    assert poll(c) == {}


def test_a_child_that_expired_while_blocked_is_removed_at_release(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    c.execute("SELECT dq_configure_queue('q', archive => true)")
    offer(c, "A", queue="parents")
    offer(c, "B", after=[["parents", "A"]], expires_at=LONG_AGO + timedelta(seconds=1))
    assert c.execute("SELECT blocked, expired FROM dq_stats WHERE queue = 'q'").fetchone() == (1, 0)
    ack(c, deliver(c, "A", "parents"))
    assert poll(c) == {}  # the poll that reaches it removes it
    assert c.execute("SELECT count(*) FROM dq_messages WHERE queue = 'q'").fetchone() == (0,)
    assert c.execute("SELECT outcome FROM dq_archive WHERE queue = 'q' AND key = 'B'").fetchall() == [("expired",)]


def test_the_rate_limit_counts_released_children(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    c.execute("SELECT dq_configure_queue('q', rate_limit => 2, rate_period => interval '1 hour')")
    offer(c, "A", queue="parents")
    for key in ("B1", "B2", "B3"):
        offer(c, key, after=[["parents", "A"]])
    ack(c, deliver(c, "A", "parents"))
    assert len(poll(c)) == 2  # two per hour
    assert poll(c) == {}
