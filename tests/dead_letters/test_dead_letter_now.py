"""dq_dead_letter: a consumer gives up on the message it holds, which moves to its queue's dead-letter
queue at once, exactly as a dq_nack at max_deliveries moves it (archive row, FIFO group, max_in_flight
slot); a stale token, a queue without a dead-letter queue and bad input change nothing. Both Python
clients' ``Message.dead_letter``."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pyqueue import DelayedQueue, NackOutcome, NackResult, NotConfigured
from pyqueue.aio import AsyncDelayedQueue

DEAD_LETTER = "SELECT outcome, dead_letter_queue FROM dq_dead_letter(%s, %s)"
ROW = ("SELECT queue, dead_from, dead_delivery_count, delivery_count, last_error, lock_token IS NULL "
       "FROM dq_messages WHERE key = %s ORDER BY id")


def poll_token(conn: psycopg.Connection[Any], queue: str, lock_timeout: str = "1 hour") -> Any:
    """The lock token of the first due message of ``queue``, polled now (None when none is)."""
    row = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 1, %s::interval)", (queue, lock_timeout)).fetchone()
    return row[0] if row else None


def polled_keys(conn: psycopg.Connection[Any], queue: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT key FROM dq_poll_many(%s, 10, interval '1 hour')", (queue,))]


def dead_letter(conn: psycopg.Connection[Any], token: Any, error: str | None = None) -> tuple[Any, ...]:
    row = conn.execute(DEAD_LETTER, (token, error)).fetchone()
    assert row is not None
    return tuple(row)


def snapshot(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Everything dq_dead_letter could change: the messages, the archive, the groups."""
    return [
        *conn.execute("SELECT m::text FROM dq_messages m ORDER BY id").fetchall(),
        *conn.execute("SELECT a::text FROM dq_archive a ORDER BY id").fetchall(),
        *conn.execute("SELECT g::text FROM dq_groups g ORDER BY 1").fetchall(),
    ]


@pytest.fixture
def jobs(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """Queue ``jobs`` (max_deliveries 10, dead-letter queue ``jobs.dead``) with message ``k`` due."""
    conn.execute("SELECT dq_configure_queue('jobs', max_deliveries => 10, dead_letter_queue => 'jobs.dead')")
    conn.execute("SELECT dq_offer('jobs', 'k', 'x'::text, now() - interval '1 minute')")
    return conn


def test_the_held_message_moves_to_the_dead_letter_queue_at_its_first_delivery(jobs) -> None:
    token = poll_token(jobs, "jobs")
    assert dead_letter(jobs, token, "gave up") == ("dead_lettered", "jobs.dead")
    assert jobs.execute(ROW, ("k",)).fetchall() == [("jobs.dead", "jobs", 1, 0, "gave up", True)]
    assert polled_keys(jobs, "jobs") == []
    assert polled_keys(jobs, "jobs.dead") == ["k"]
    # The token held the message once: now it is stale.
    assert dead_letter(jobs, token) == ("stale", None)


def test_without_an_error_the_last_error_of_an_earlier_nack_is_kept(jobs) -> None:
    jobs.execute("SELECT dq_nack(%s, '0', 'first failure')", (poll_token(jobs, "jobs"),))
    assert dead_letter(jobs, poll_token(jobs, "jobs")) == ("dead_lettered", "jobs.dead")
    assert jobs.execute(ROW, ("k",)).fetchall() == [("jobs.dead", "jobs", 2, 0, "first failure", True)]


def test_a_stale_token_changes_nothing(jobs) -> None:
    token = poll_token(jobs, "jobs")
    jobs.execute("SELECT dq_nack(%s)", (token,))
    before = snapshot(jobs)
    assert dead_letter(jobs, token) == ("stale", None)
    assert dead_letter(jobs, jobs.execute("SELECT gen_random_uuid()").fetchone()[0]) == ("stale", None)
    assert snapshot(jobs) == before


def test_a_lock_past_its_expiry_still_held_by_its_token_is_dead_lettered(jobs, clock) -> None:
    """No poll took the message over since its lock expired: the late holder may still give up (as
    its ack or nack would succeed); once a poll took it, the old token is stale."""
    token = poll_token(jobs, "jobs", "10 seconds")
    clock.advance(60)
    assert dead_letter(jobs, token, "late") == ("dead_lettered", "jobs.dead")
    # The lock expired but the holder's error is recorded, not "lock expired".
    assert jobs.execute(ROW, ("k",)).fetchall() == [("jobs.dead", "jobs", 1, 0, "late", True)]
    jobs.execute("SELECT dq_offer('jobs', 'k2', 'x'::text, now() - interval '1 minute')")
    old = poll_token(jobs, "jobs", "10 seconds")
    clock.advance(60)
    assert poll_token(jobs, "jobs") is not None  # taken over
    assert dead_letter(jobs, old) == ("stale", None)


def test_the_next_message_of_a_fifo_group_becomes_deliverable(conn) -> None:
    conn.execute("SELECT dq_configure_queue('fifo', max_deliveries => 10, dead_letter_queue => 'fifo.dead')")
    for key in ("a", "b"):
        conn.execute("SELECT dq_offer('fifo', %s, 'x'::text, now() - interval '1 minute', message_group => 'g')",
                     (key,))
    token = poll_token(conn, "fifo")
    assert polled_keys(conn, "fifo") == []  # b waits behind a, its group's head
    assert dead_letter(conn, token, "poison") == ("dead_lettered", "fifo.dead")
    assert polled_keys(conn, "fifo") == ["b"]
    assert conn.execute("SELECT message_group FROM dq_messages WHERE key = 'a'").fetchone() == ("g",)


def test_a_max_in_flight_slot_is_freed(conn) -> None:
    conn.execute("SELECT dq_configure_queue('lim', max_deliveries => 10, dead_letter_queue => 'lim.dead', "
                 "max_in_flight => 1)")
    for key in ("a", "b"):
        conn.execute("SELECT dq_offer('lim', %s, 'x'::text, now() - interval '1 minute')", (key,))
    token = poll_token(conn, "lim")
    assert polled_keys(conn, "lim") == []  # the one slot is taken
    assert dead_letter(conn, token) == ("dead_lettered", "lim.dead")
    assert len(polled_keys(conn, "lim")) == 1


def test_the_archive_keeps_a_dead_row_as_at_max_deliveries(conn) -> None:
    conn.execute("SELECT dq_configure_queue('arc', max_deliveries => 10, dead_letter_queue => 'arc.dead', "
                 "archive => true)")
    conn.execute("SELECT dq_offer('arc', 'k', 'x'::text, now() - interval '1 minute')")
    (message_id,) = conn.execute("SELECT id FROM dq_messages WHERE key = 'k'").fetchone()
    assert dead_letter(conn, poll_token(conn, "arc"), "gave up")[0] == "dead_lettered"
    archived = conn.execute("SELECT id, queue, key, outcome, delivery_count, last_error FROM dq_archive").fetchall()
    assert archived == [(message_id, "arc", "k", "dead", 1, "gave up")]
    assert conn.execute("SELECT dead_from_id FROM dq_messages WHERE key = 'k'").fetchone() == (message_id,)


def test_a_queue_without_a_dead_letter_queue_refuses_and_the_caller_still_holds_the_message(conn) -> None:
    """No dead-letter queue, no delivery limit (max_deliveries needs one): nothing is ever
    dead-lettered there. 55000, nothing changes, and the token still acknowledges the message."""
    conn.execute("SELECT dq_offer('plain', 'k', 'x'::text, now() - interval '1 minute')")
    token = poll_token(conn, "plain")
    before = snapshot(conn)
    with pytest.raises(psycopg.Error) as err:
        dead_letter(conn, token, "gave up")
    assert err.value.sqlstate == "55000"
    assert str(err.value).startswith("dq_dead_letter: queue plain has no dead_letter_queue"), str(err.value)
    assert snapshot(conn) == before
    assert conn.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)


@pytest.mark.parametrize(("statement", "sqlstate", "text"), [
    ("SELECT * FROM dq_dead_letter(NULL)", "22004", "dq_dead_letter: lock_token must not be NULL"),
    ("SELECT * FROM dq_dead_letter(NULL, 'boom')", "22004", "dq_dead_letter: lock_token must not be NULL"),
    ("SELECT * FROM dq_dead_letter(%(token)s, repeat('e', 10001))", "22001",
     "dq_dead_letter: error is 10001 characters"),
])
def test_bad_input_is_refused_and_nothing_changes(jobs, statement: str, sqlstate: str, text: str) -> None:
    token = poll_token(jobs, "jobs")
    before = snapshot(jobs)
    with pytest.raises(psycopg.Error) as err:
        jobs.execute(statement, {"token": token})
    assert err.value.sqlstate == sqlstate
    assert str(err.value).startswith(text), str(err.value)
    assert snapshot(jobs) == before


def test_a_consumer_role_may_call_it(jobs, login) -> None:
    token = poll_token(jobs, "jobs")
    with psycopg.connect(login("dq_consumer"), autocommit=True) as consumer:
        assert dead_letter(consumer, token) == ("dead_lettered", "jobs.dead")
    with psycopg.connect(login("dq_producer"), autocommit=True) as producer, pytest.raises(psycopg.Error) as err:
        dead_letter(producer, token)
    assert err.value.sqlstate == "42501"


def test_the_python_clients_dead_letter_a_message(dsn: str, conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', max_deliveries => 10, dead_letter_queue => 'jobs.dead')")
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("k1", {"n": 1})
        q.offer("k2", {"n": 2})
        first, second = q.poll(2)
        assert first.dead_letter("gave up") == NackResult(NackOutcome.DEAD_LETTERED, dead_letter_queue="jobs.dead")
        assert first.settled == "dead_lettered"
        assert first.dead_letter() == NackResult(NackOutcome.STALE)
        with psycopg.connect(dsn) as own:  # the caller's own transaction, rolled back: still held
            assert second.dead_letter(conn=own).outcome is NackOutcome.DEAD_LETTERED
            own.rollback()
        with psycopg.connect(dsn) as own:  # nack_outcome takes the caller's transaction too (a savepoint in it)
            own.execute("SELECT 1")
            assert second.nack_outcome(60, conn=own).outcome is NackOutcome.RETRIED
            own.rollback()
        assert second.nack()

    async def run() -> tuple[NackResult, NackResult]:
        async with AsyncDelayedQueue(dsn, "jobs") as aq:
            [am] = await aq.poll()
            return await am.dead_letter("async"), await am.dead_letter()

    assert asyncio.run(run()) == (NackResult(NackOutcome.DEAD_LETTERED, dead_letter_queue="jobs.dead"),
                                  NackResult(NackOutcome.STALE))
    dead = conn.execute("SELECT key, last_error FROM dq_messages WHERE queue = 'jobs.dead' ORDER BY key").fetchall()
    assert dead == [("k1", "gave up"), ("k2", "async")]


def test_the_python_clients_raise_not_configured_without_a_dead_letter_queue(dsn: str) -> None:
    with DelayedQueue(dsn, "plain") as q:
        q.offer("k", 1)
        [m] = q.poll()
        with pytest.raises(NotConfigured) as err:
            m.dead_letter("x")
        assert err.value.sqlstate == "55000" and m.settled is None
        assert m.ack()

    async def run() -> str | None:
        async with AsyncDelayedQueue(dsn, "plain") as aq:
            await aq.offer("k", 1)
            [am] = await aq.poll()
            with pytest.raises(NotConfigured):
                await am.dead_letter()
            return am.settled

    assert asyncio.run(run()) is None
