"""Issue 12 (hardening), behaviour of items 1, 9, 10, 11, 12 and 13 (rules: docs/api.md "Limits", docs/operations.md).

Real server, no mocks. Times are compared on the server (the assertions show booleans, never a
value of now()); a fixed due time in the past (T) stands for "a message due at T". The bad-input
side of items 1 and 9 (SQLSTATE, message, nothing written) is in tests/test_sql_bad_input.py and
tests/test_cron_bad_input.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlhelpers import wait_until_server_time

import pyqueue
from pyqueue import DelayedQueue

T = "2020-01-01 00:00:00+00"  # the due time of the messages below: long past, so they are due


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def poll_token(conn: psycopg.Connection[Any], queue: str, lock_timeout: str = "1 hour") -> Any:
    rows = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 1, %s::interval)", (queue, lock_timeout)).fetchall()
    assert len(rows) == 1, rows
    return rows[0][0]


def count(conn: psycopg.Connection[Any], queue: str, key: str | None = None) -> int:
    return int(
        one(
            conn,
            "SELECT count(*) FROM dq_messages WHERE queue = %s AND (%s::text IS NULL OR key = %s)",
            (queue, key, key),
        )
    )


def kill_jobs(conn: psycopg.Connection[Any], *keys: str) -> None:
    """Queue 'jobs' (max_deliveries 1 -> 'jobs.dead'): offer ``keys``, deliver each once, nack: dead."""
    conn.execute("SELECT dq_configure_queue('jobs', 1, 'jobs.dead')")
    for key in keys:
        conn.execute("SELECT dq_offer('jobs', %s, %s::text)", (key, f"payload of {key}"))
        assert one(conn, "SELECT dq_nack(%s, interval '0', 'boom')", (poll_token(conn, "jobs"),)) is True
    assert count(conn, "jobs") == 0 and count(conn, "jobs.dead") == len(keys)


# --------------------------------------------------------------------------- item 1: timestamps


def test_rejected_minus_infinity_offer_leaves_python_polls_working(dsn: str, conn) -> None:
    """The audit's poison: a '-infinity' offer made every Python poll (and stats) of the queue fail."""
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("good", {"n": 1})
        for value in ("-infinity", "infinity"):
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SELECT dq_offer('jobs', 'poison', 'x'::text, %s::timestamptz)", (value,))
            assert info.value.sqlstate == "22008", info.value.diag.message_primary
        assert count(conn, "jobs", "poison") == 0
        messages = q.poll(max_count=10)
        assert [(m.key, m.payload, m.delivery_count) for m in messages] == [("good", {"n": 1}, 1)]
        assert messages[0].ack() is True
        assert q.stats().queue == "jobs"
        assert q.poll(max_count=10) == []


def test_offer_scheduled_at_bounds_are_inclusive_and_readable_by_python(dsn: str, conn) -> None:
    """[0001-01-02, 9999-12-30] UTC: both edges are stored and decode in Python; 1 us beyond is 22008."""
    low, high = "0001-01-02 00:00:00+00", "9999-12-30 00:00:00+00"
    assert one(conn, "SELECT dq_offer('edges', 'low', 'x'::text, %s::timestamptz)", (low,)) == "created"
    assert one(conn, "SELECT dq_offer('edges', 'high', 'x'::text, %s::timestamptz)", (high,)) == "created"
    for beyond in ("0001-01-01 23:59:59.999999+00", "9999-12-30 00:00:00.000001+00"):
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT dq_offer('edges', 'beyond', 'x'::text, %s::timestamptz)", (beyond,))
        assert info.value.sqlstate == "22008", info.value.diag.message_primary
        assert "9999-12-30" in (info.value.diag.message_primary or "")
    assert count(conn, "edges") == 2
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


def test_cron_occurrences_never_pass_9999_12_30(conn) -> None:
    rows = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE x > timestamptz '9999-12-30 00:00:00+00'),"
        "       max(x) = timestamptz '9999-12-30 00:00:00+00'"
        "  FROM dq_cron_occurrences('@daily', 'UTC', '9999-12-25 00:00:00+00', 'infinity', 20) x"
    ).fetchall()
    assert rows == [(5, 0, True)]  # 26, 27, 28, 29, 30 December 9999


def test_a_consumer_may_wait_and_idle_check_longer_than_the_1_hour_cap(dsn: str) -> None:
    """dq_wait refuses max_wait over 1 hour (item 8); the client's waits and idle checks may be longer
    and are then made of registrations of at most 1 hour (a 2-hour wait used to reach the server
    unchanged): poll(wait=2 h, idle_check=2 h) must not raise, and an offer still wakes it."""
    import asyncio
    import threading

    from pyqueue.aio import AsyncDelayedQueue

    def offer_soon(key: str) -> threading.Timer:
        timer = threading.Timer(0.5, lambda: psycopg.connect(dsn, autocommit=True).execute(
            "SELECT dq_offer('longwait', %s, 'x')", (key,)).connection.close())
        timer.start()
        return timer

    with DelayedQueue(dsn, "longwait") as q:
        timer = offer_soon("sync")
        got = q.poll(wait=timedelta(hours=2), idle_check=timedelta(hours=2))
        timer.join()
        assert [m.key for m in got] == ["sync"]
        got[0].ack()

    async def run() -> list[str]:
        async with AsyncDelayedQueue(dsn, "longwait") as aq:
            timer = offer_soon("async")
            got = await aq.poll(wait=timedelta(hours=2), idle_check=timedelta(hours=2))
            timer.join()
            return [m.key for m in got]

    assert asyncio.run(run()) == ["async"]


# --------------------------------------------------------------------------- item 9: payload limit


def test_payload_limit_default_and_lowered_per_queue(conn) -> None:
    size = "convert_to(repeat('x', %s), 'UTF8')"
    assert one(conn, f"SELECT dq_offer('big', 'k', {size})", (1048576,)) == "created"  # noqa: S608 - constant
    conn.execute("SELECT dq_configure_queue('small', max_payload_bytes => 2048)")
    assert one(conn, "SELECT max_payload_bytes FROM dq_queues WHERE queue = 'small'") == 2048
    assert one(conn, f"SELECT dq_offer('small', 'fits', {size})", (2048,)) == "created"  # noqa: S608
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
    assert one(conn, f"SELECT dq_offer('big', 'k2', {size})", (2049,)) == "created"  # noqa: S608
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
        assert count(conn, "jobs") == 0
        assert q.offer("k", b"x" * 1048576) is pyqueue.OfferOutcome.CREATED


# --------------------------------------------------------------------------- item 10: archive scheduled_at


@pytest.mark.parametrize("outcome", ["acked", "cancelled", "dead"])
def test_archive_scheduled_at_is_when_the_delivery_was_due(conn, outcome: str) -> None:
    """Due at T, polled with a 1-hour lock, finished at once: the archive says T, not poll + 1 hour."""
    if outcome == "dead":
        conn.execute("SELECT dq_configure_queue('jobs', 1, 'jobs.dead', archive => true)")
    else:
        conn.execute("SELECT dq_configure_queue('jobs', archive => true)")
    conn.execute("SELECT dq_offer('jobs', 'k', 'x'::text, %s::timestamptz)", (T,))
    token = poll_token(conn, "jobs", "1 hour")
    if outcome == "acked":
        assert one(conn, "SELECT dq_ack(%s)", (token,)) is True
    elif outcome == "cancelled":
        assert one(conn, "SELECT dq_cancel('jobs', 'k')") is True
    else:
        assert one(conn, "SELECT dq_nack(%s, interval '0', 'boom')", (token,)) is True
    got = conn.execute(
        "SELECT outcome, delivery_count, scheduled_at = %s::timestamptz FROM dq_archive WHERE queue = 'jobs'", (T,)
    ).fetchall()
    assert got == [(outcome, 1, True)]


def test_archive_scheduled_at_is_the_due_time_of_the_last_delivery(conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', archive => true)")
    conn.execute("SELECT dq_offer('jobs', 'k', 'x'::text, %s::timestamptz)", (T,))
    assert one(conn, "SELECT dq_nack(%s, interval '0')", (poll_token(conn, "jobs"),)) is True
    second_due = one(conn, "SELECT scheduled_at FROM dq_messages WHERE queue = 'jobs' AND key = 'k'")
    wait_until_server_time(conn, second_due)
    rows = conn.execute(
        "SELECT lock_token, scheduled_at = %s FROM dq_poll_many('jobs', 1, interval '1 hour')", (second_due,)
    ).fetchall()
    assert [r[1] for r in rows] == [True]
    assert one(conn, "SELECT dq_ack(%s)", (rows[0][0],)) is True
    got = conn.execute(
        "SELECT delivery_count, scheduled_at = %s, scheduled_at_initially = %s::timestamptz FROM dq_archive",
        (second_due, T),
    ).fetchall()
    assert got == [(2, True, True)]


def test_poll_records_due_at_and_claimed_at(conn) -> None:
    conn.execute("SELECT dq_offer('jobs', 'k', 'x'::text, %s::timestamptz)", (T,))
    before = one(conn, "SELECT clock_timestamp()")
    poll_token(conn, "jobs", "1 hour")
    after = one(conn, "SELECT clock_timestamp()")
    got = conn.execute(
        "SELECT due_at = %s::timestamptz, claimed_at BETWEEN %s AND %s FROM dq_messages WHERE key = 'k'",
        (T, before, after),
    ).fetchall()
    assert got == [(True, True)]


# --------------------------------------------------------------------------- item 11: re-offers


def test_offer_into_the_dlq_with_a_dead_letters_key_is_a_separate_ordinary_message(conn) -> None:
    kill_jobs(conn, "k")
    assert one(conn, "SELECT dq_offer('jobs.dead', 'k', 'fresh'::text)") == "created"
    assert one(conn, "SELECT dq_offer('jobs.dead', 'k', 'fresher'::text)") == "updated"
    rows = conn.execute(
        "SELECT convert_from(payload, 'UTF8'), dead_from, last_error, last_error_at IS NULL FROM dq_messages"
        " WHERE queue = 'jobs.dead' AND key = 'k' ORDER BY dead_from NULLS FIRST"
    ).fetchall()
    assert rows == [("fresher", None, None, True), ("payload of k", "jobs", "boom", False)]
    assert one(conn, "SELECT dq_redrive('jobs.dead')") == 1  # only the dead letter goes back
    back = conn.execute("SELECT convert_from(payload, 'UTF8'), dead_from FROM dq_messages WHERE queue = 'jobs'")
    assert back.fetchall() == [("payload of k", None)]
    left = conn.execute("SELECT convert_from(payload, 'UTF8'), dead_from FROM dq_messages WHERE queue = 'jobs.dead'")
    assert left.fetchall() == [("fresher", None)]


REOFFER = {
    "dq_offer": "SELECT dq_offer('jobs', 'k', %(p)s::text, %(t)s::timestamptz)",
    "dq_offer_many": "SELECT outcome FROM dq_offer_many('jobs', ARRAY['k'], ARRAY[convert_to(%(p)s, 'UTF8')],"
    " ARRAY[%(t)s::timestamptz], payload_types => ARRAY['text'])",
}


@pytest.mark.parametrize("function", list(REOFFER))
def test_reoffer_with_a_changed_payload_clears_last_error(conn, function: str) -> None:
    conn.execute("SELECT dq_offer('jobs', 'k', 'a'::text, %s::timestamptz)", (T,))
    assert one(conn, "SELECT dq_nack(%s, interval '0', 'boom')", (poll_token(conn, "jobs"),)) is True
    state = "SELECT last_error, last_error_at IS NULL FROM dq_messages WHERE queue = 'jobs' AND key = 'k'"
    assert conn.execute(state).fetchall() == [("boom", False)]
    assert one(conn, REOFFER[function], {"p": "a", "t": T}) == "ignored"  # unchanged: nothing happens
    assert conn.execute(state).fetchall() == [("boom", False)]
    assert one(conn, REOFFER[function], {"p": "b", "t": T}) == "updated"
    assert conn.execute(state).fetchall() == [(None, True)]


# --------------------------------------------------------------------------- item 12: redrive and locks


def test_redrive_skips_dead_letters_in_flight(dsn: str, conn) -> None:
    kill_jobs(conn, "a", "b")
    with psycopg.connect(dsn, autocommit=True) as consumer:
        held, token = consumer.execute(
            "SELECT key, lock_token FROM dq_poll_many('jobs.dead', 1, interval '1 hour')"
        ).fetchone()
        other = "b" if held == "a" else "a"
        assert one(conn, "SELECT dq_redrive('jobs.dead')") == 1
        assert conn.execute("SELECT key FROM dq_messages WHERE queue = 'jobs'").fetchall() == [(other,)]
        assert one(consumer, "SELECT dq_ack(%s)", (token,)) is True
    assert count(conn, "jobs", held) == 0 and count(conn, "jobs.dead") == 0
    assert one(conn, "SELECT dq_redrive('jobs.dead')") == 0


def test_redrive_takes_a_dead_letter_whose_lock_expired(conn) -> None:
    kill_jobs(conn, "a", "b")
    held = conn.execute("SELECT key, locked_until FROM dq_poll_many('jobs.dead', 1, interval '1 hour')").fetchone()
    expired = conn.execute("SELECT key, locked_until FROM dq_poll_many('jobs.dead', 1, interval '50 ms')").fetchone()
    wait_until_server_time(conn, expired[1])
    assert one(conn, "SELECT dq_redrive('jobs.dead')") == 1
    assert conn.execute("SELECT key FROM dq_messages WHERE queue = 'jobs'").fetchall() == [(expired[0],)]
    assert conn.execute("SELECT key FROM dq_messages WHERE queue = 'jobs.dead'").fetchall() == [(held[0],)]


# --------------------------------------------------------------------------- item 13: purge hint


@pytest.mark.parametrize(
    "queue",
    ["it's", "back\\slash'", "x', confirm => true); SELECT dq_purge('victim'"],
    ids=["quote", "backslash", "injection"],
)
def test_purge_hint_quotes_the_queue_name(conn, queue: str) -> None:
    conn.execute("SELECT dq_offer(%s, 'k', 'x'::text)", (queue,))
    conn.execute("SELECT dq_offer('victim', 'k', 'x'::text)")
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT dq_purge(%s)", (queue,))
    assert info.value.sqlstate == "22023"
    hint = info.value.diag.message_hint or ""
    literal = one(conn, "SELECT format('%%L', %s::text)", (queue,))
    assert hint == f"SELECT dq_purge({literal}, confirm => true)", hint
    if queue == "it's":
        assert hint == "SELECT dq_purge('it''s', confirm => true)"
    assert conn.execute(hint).fetchall() == [(1,)]  # the hint, run as it is, purges that queue only
    assert count(conn, queue) == 0 and count(conn, "victim") == 1
