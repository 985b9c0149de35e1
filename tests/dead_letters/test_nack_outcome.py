"""dq_nack_outcome: the nack that says where the message went (retried and when, dead-lettered and
where, or a stale token), through SQL, racing an ack or an extend of the same token on real
connections, and through both Python clients, also on an install that has only dq_nack."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlhelpers import wait_for_lock_wait

from pyqueue import DelayedQueue, NackOutcome, NackResult
from pyqueue.aio import AsyncDelayedQueue

NACK = "SELECT outcome, due, dead_letter_queue FROM dq_nack_outcome(%s, %s::interval, %s)"


def poll_token(conn: psycopg.Connection[Any], queue: str) -> Any:
    """The lock token of the one due message of ``queue``, polled now."""
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 1, interval '1 hour')", (queue,)).fetchone()
    return token


def nack(conn: psycopg.Connection[Any], token: Any, delay: str = "0", error: str | None = None) -> tuple[Any, ...]:
    row = conn.execute(NACK, (token, delay, error)).fetchone()
    assert row is not None
    return tuple(row)


def test_retried_reports_when_the_message_is_due_again(conn) -> None:
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now() - interval '1 minute')")
    token = poll_token(conn, "q")
    before = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    outcome, due, dead_letter_queue = nack(conn, token, "5 minutes", "boom")
    after = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    assert (outcome, dead_letter_queue) == ("retried", None)
    assert before + timedelta(minutes=5) <= due <= after + timedelta(minutes=5)
    stored = conn.execute("SELECT scheduled_at, last_error, lock_token FROM dq_messages WHERE key = 'k'").fetchone()
    assert stored == (due, "boom", None)


def test_dead_lettered_reports_the_dead_letter_queue(conn) -> None:
    conn.execute("SELECT dq_configure_queue('q', max_deliveries => 2, dead_letter_queue => 'q.dead')")
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now() - interval '1 minute')")
    assert nack(conn, poll_token(conn, "q"))[0] == "retried"
    assert nack(conn, poll_token(conn, "q"), "1 hour", "last") == ("dead_lettered", None, "q.dead")
    assert conn.execute("SELECT queue, dead_from, last_error FROM dq_messages WHERE key = 'k'").fetchall() == [
        ("q.dead", "q", "last")]


def test_a_queue_without_a_dead_letter_queue_retries_every_time(conn) -> None:
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now() - interval '1 minute')")
    outcomes = [nack(conn, poll_token(conn, "q"))[0] for _ in range(5)]
    assert outcomes == ["retried"] * 5
    assert conn.execute("SELECT delivery_count FROM dq_messages WHERE key = 'k'").fetchone() == (5,)


def test_a_stale_token_changes_nothing(conn) -> None:
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now() - interval '1 minute')")
    token = poll_token(conn, "q")
    assert conn.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)
    assert nack(conn, token) == ("stale", None, None)
    assert nack(conn, conn.execute("SELECT gen_random_uuid()").fetchone()[0]) == ("stale", None, None)
    # dq_nack, the same implementation, says false for it.
    assert conn.execute("SELECT dq_nack(%s)", (token,)).fetchone() == (False,)


@pytest.mark.parametrize(("statement", "sqlstate", "text"), [
    ("SELECT * FROM dq_nack_outcome(NULL)", "22004", "dq_nack_outcome: lock_token must not be NULL"),
    ("SELECT * FROM dq_nack_outcome(gen_random_uuid(), NULL)", "22004", "dq_nack_outcome: delay must not be NULL"),
    ("SELECT * FROM dq_nack_outcome(gen_random_uuid(), interval '-1 second')", "22023",
     "dq_nack_outcome: delay is -00:00:01, it must not be negative"),
    ("SELECT * FROM dq_nack_outcome(gen_random_uuid(), '0', repeat('e', 10001))", "22001",
     "dq_nack_outcome: error is 10001 characters"),
])
def test_bad_input_is_reported_by_dq_nack_outcome(conn, statement: str, sqlstate: str, text: str) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(statement)
    assert err.value.sqlstate == sqlstate
    assert str(err.value).startswith(text), str(err.value)


@pytest.mark.parametrize(("rival", "expected"), [
    ("SELECT dq_ack(%s)", "stale"),
    ("SELECT dq_extend(%s, interval '1 hour')", "retried"),
    ("SELECT * FROM dq_nack_outcome(%s, interval '1 hour')", "stale"),
])
def test_a_nack_racing_another_call_with_the_token_waits_for_it(dsn: str, conn, rival: str, expected: str) -> None:
    """Another session's ack, extend or nack of the same token, not yet committed, holds the row:
    the nack waits for it, then finds the token gone (stale) or still holding the message
    (retried, due after the rival committed)."""
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now() - interval '1 minute')")
    token = poll_token(conn, "q")
    result: list[tuple[Any, ...]] = []
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as consumer:
        holder.execute(rival, (token,))
        call = threading.Thread(target=lambda: result.append(nack(consumer, token, "10 seconds")))
        call.start()
        wait_for_lock_wait(conn, "dq_nack_outcome(")
        committed = holder.execute("SELECT clock_timestamp()").fetchone()[0]
        holder.commit()
        call.join(60)
    assert result and result[0][0] == expected, result
    stored = conn.execute("SELECT scheduled_at, lock_token FROM dq_messages WHERE key = 'k'").fetchone()
    if expected == "retried":
        assert result[0][1] >= committed + timedelta(seconds=10)
        assert stored == (result[0][1], None)
    elif rival.startswith("SELECT dq_ack"):
        assert stored is None
    else:  # the rival nack gave the message back for an hour
        assert stored is not None and stored[1] is None and stored[0] >= committed + timedelta(minutes=59)


def test_the_python_clients_report_the_outcome(dsn: str, conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', max_deliveries => 2, dead_letter_queue => 'jobs.dead')")
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("k", {"n": 1})
        [m] = q.poll()
        first = m.nack_outcome(60, error="boom")
        assert first.outcome is NackOutcome.RETRIED and first.due is not None and first.nacked
        assert m.settled == "nacked"
        assert m.nack_outcome() == NackResult(NackOutcome.STALE)
    conn.execute("UPDATE dq_messages SET scheduled_at = now() WHERE key = 'k'")

    async def second() -> NackResult:
        async with AsyncDelayedQueue(dsn, "jobs") as aq:
            [am] = await aq.poll()
            return await am.nack_outcome(error="again")

    assert asyncio.run(second()) == NackResult(NackOutcome.DEAD_LETTERED, dead_letter_queue="jobs.dead")


def test_an_install_without_dq_nack_outcome_is_answered_by_dq_nack_and_reads(dsn: str, conn) -> None:
    """A worker of this release on an install of the previous one (during an upgrade): dq_nack,
    then where the message went is read back, with the same result."""
    conn.execute("DROP FUNCTION dq_nack_outcome(uuid, interval, text)")
    conn.execute("SELECT dq_configure_queue('jobs', max_deliveries => 2, dead_letter_queue => 'jobs.dead')")
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("k", {"n": 1})
        [m] = q.poll()
        first = m.nack_outcome(60)
        stored = q.get("k")
        assert stored is not None and first == NackResult(NackOutcome.RETRIED, stored.scheduled_at)
        assert m.nack_outcome() == NackResult(NackOutcome.STALE)
        conn.execute("UPDATE dq_messages SET scheduled_at = now() WHERE key = 'k'")
        [m] = q.poll()
        assert m.nack_outcome() == NackResult(NackOutcome.DEAD_LETTERED, dead_letter_queue="jobs.dead")
