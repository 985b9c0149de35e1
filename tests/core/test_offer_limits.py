"""The limits of an offer (rules: docs/api.md "Limits"): its due time lies in [0001-01-02,
9999-12-30] UTC, both edges included and readable by Python, and an infinite one is refused without
harming the queue; its payload is at most the queue's max_payload_bytes (1 MiB by default, lowered
per queue); through SQL and through the Python client, which raises the typed errors.

Real server, no mocks. The bad-input side (SQLSTATE, message, nothing written) is in
tests/core/test_sql_bad_input.py and tests/cron/test_cron_bad_input.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlhelpers import message_count, value_of

import pyqueue
from pyqueue import DelayedQueue

# --------------------------------------------------------------------------- the due time


def test_rejected_minus_infinity_offer_leaves_python_polls_working(dsn: str, conn) -> None:
    """A '-infinity' offer, once accepted, made every Python poll (and stats) of the queue fail."""
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("good", {"n": 1})
        for value in ("-infinity", "infinity"):
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SELECT dq_offer('jobs', 'poison', 'x'::text, %s::timestamptz)", (value,))
            assert info.value.sqlstate == "22008", info.value.diag.message_primary
        assert message_count(conn, "jobs", "poison") == 0
        messages = q.poll(max_count=10)
        assert [(m.key, m.payload, m.delivery_count) for m in messages] == [("good", {"n": 1}, 1)]
        assert messages[0].ack() is True
        assert q.stats().queue == "jobs"
        assert q.poll(max_count=10) == []


def test_offer_scheduled_at_bounds_are_inclusive_and_readable_by_python(dsn: str, conn) -> None:
    """[0001-01-02, 9999-12-30] UTC: both edges are stored and decode in Python; 1 us beyond is 22008."""
    low, high = "0001-01-02 00:00:00+00", "9999-12-30 00:00:00+00"
    assert value_of(conn, "SELECT dq_offer('edges', 'low', 'x'::text, %s::timestamptz)", (low,)) == "created"
    assert value_of(conn, "SELECT dq_offer('edges', 'high', 'x'::text, %s::timestamptz)", (high,)) == "created"
    for beyond in ("0001-01-01 23:59:59.999999+00", "9999-12-30 00:00:00.000001+00"):
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT dq_offer('edges', 'beyond', 'x'::text, %s::timestamptz)", (beyond,))
        assert info.value.sqlstate == "22008", info.value.diag.message_primary
        assert "9999-12-30" in (info.value.diag.message_primary or "")
    assert message_count(conn, "edges") == 2
    with DelayedQueue(dsn, "edges") as q:
        assert q.get("high").scheduled_at == datetime(9999, 12, 30, tzinfo=UTC)
        (m,) = q.poll(max_count=10)
        assert (m.key, m.scheduled_at) == ("low", datetime(1, 1, 2, tzinfo=UTC))


def test_python_offer_after_9999_12_30_is_rejected(dsn: str) -> None:
    """datetime.max territory: Python can send 9999-12-31, which is past the bound (22008)."""
    with DelayedQueue(dsn, "jobs") as q:
        with pytest.raises(pyqueue.DatetimeOutOfRange) as info:
            q.offer("k", "x", at=datetime(9999, 12, 31, tzinfo=UTC))
        assert info.value.sqlstate == "22008"
        assert "scheduled_at" in info.value.message and "9999-12-30" in info.value.message
        assert isinstance(info.value, pyqueue.InvalidArgument)
        assert q.get("k") is None
        with pytest.raises(pyqueue.DatetimeOutOfRange):  # now + delay past the bound: no row either
            q.offer("k", "x", delay=timedelta(days=3_000_000))
        assert q.get("k") is None


# --------------------------------------------------------------------------- the payload


def test_payload_limit_default_and_lowered_per_queue(conn) -> None:
    size = "convert_to(repeat('x', %s), 'UTF8')"
    assert value_of(conn, f"SELECT dq_offer('big', 'k', {size})", (1048576,)) == "created"  # noqa: S608 - constant
    conn.execute("SELECT dq_configure_queue('small', max_payload_bytes => 2048)")
    assert value_of(conn, "SELECT max_payload_bytes FROM dq_queues WHERE queue = 'small'") == 2048
    assert value_of(conn, f"SELECT dq_offer('small', 'fits', {size})", (2048,)) == "created"  # noqa: S608
    with pytest.raises(psycopg.Error) as info:
        conn.execute(f"SELECT dq_offer('small', 'over', {size})", (2049,))  # noqa: S608
    message = info.value.diag.message_primary or ""
    assert info.value.sqlstate == "54000", message
    assert message.startswith("dq_offer:") and "2049" in message and "2048" in message, message
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            f"SELECT * FROM dq_offer_many('small', ARRAY['a', 'b'], ARRAY[{size}, {size}])",  # noqa: S608
            (10, 2049),
        )
    message = info.value.diag.message_primary or ""
    assert info.value.sqlstate == "54000", message
    assert "payloads[2]" in message and "2049" in message and "2048" in message, message
    assert conn.execute("SELECT key FROM dq_messages WHERE queue = 'small'").fetchall() == [("fits",)]
    # the limit is the queue's own: another queue keeps the default
    assert value_of(conn, f"SELECT dq_offer('big', 'k2', {size})", (2049,)) == "created"  # noqa: S608
    # max_payload_bytes is the 7th parameter; both ends of 1024 .. 1073741824 are accepted
    conn.execute("SELECT dq_configure_queue('p7', NULL, NULL, NULL, NULL, NULL, 4096)")
    conn.execute("SELECT dq_configure_queue('lo', max_payload_bytes => 1024)")
    conn.execute("SELECT dq_configure_queue('hi', max_payload_bytes => 1073741824)")
    got = conn.execute("SELECT queue, max_payload_bytes FROM dq_queues WHERE queue IN ('p7', 'lo', 'hi') ORDER BY 1")
    assert got.fetchall() == [("hi", 1073741824), ("lo", 1024), ("p7", 4096)]


def test_python_offer_over_the_limit_raises_limit_exceeded(dsn: str, conn) -> None:
    with DelayedQueue(dsn, "jobs") as q:
        with pytest.raises(pyqueue.LimitExceeded) as info:
            q.offer("k", b"x" * 1048577)
        assert info.value.sqlstate == "54000"
        assert "1048577" in info.value.message and "1048576" in info.value.message, info.value.message
        assert q.get("k") is None
        with pytest.raises(pyqueue.LimitExceeded) as info:
            q.offer_many([("a", b"x"), ("b", b"x" * 1048577)])
        assert "payloads[2]" in info.value.message, info.value.message
        assert message_count(conn, "jobs") == 0
        assert q.offer("k", b"x" * 1048576) is pyqueue.OfferOutcome.CREATED
