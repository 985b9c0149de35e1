"""Dead letters enforced by the database: per-queue max_deliveries, nack with an error text, lock
expiry again and again, redrive; through SQL, the Python binding and a real worker process."""

from __future__ import annotations

import time

import psycopg
import pytest
from workerhandlers import start_worker, stop, wait_for

import pyqueue
from pyqueue import DelayedQueue


def row(conn, queue: str, key: str):
    """The delivery count where it died (dead letters) or its own (ordinary messages), the error
    fields and the dead-letter fields of the one message with this key."""
    return conn.execute(
        "SELECT coalesce(dead_delivery_count, delivery_count), last_error, last_error_at IS NOT NULL, dead_from, "
        "dead_at IS NOT NULL, lock_token FROM dq_messages WHERE queue = %s AND key = %s", (queue, key)).fetchone()


def test_nack_at_the_limit_dead_letters_with_the_error(conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', 2, 'jobs.dead')")
    conn.execute("SELECT dq_offer('jobs', 'k', 'x')")
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('jobs')").fetchone()
    assert conn.execute("SELECT dq_nack(%s, '0', 'first failure')", (token,)).fetchone()[0] is True
    assert row(conn, "jobs", "k")[:2] == (1, "first failure")
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('jobs')").fetchone()
    assert conn.execute("SELECT dq_nack(%s, '1 hour', 'second failure')", (token,)).fetchone()[0] is True
    assert row(conn, "jobs", "k") is None
    assert row(conn, "jobs.dead", "k") == (2, "second failure", True, "jobs", True, None)
    assert conn.execute("SELECT count(*) FROM dq_poll_many('jobs', 10)").fetchone()[0] == 0
    # the dead-letter queue is an ordinary queue
    got = conn.execute("SELECT key, payload FROM dq_poll_many('jobs.dead')").fetchall()
    assert got == [("k", b"x")]


def test_lock_expiring_again_and_again_is_caught(conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', 3, 'jobs.dead')")
    conn.execute("SELECT dq_offer('jobs', 'crasher', 'x')")
    for expected in (1, 2, 3):
        got = conn.execute("SELECT delivery_count FROM dq_poll_many('jobs', 1, '50 ms')").fetchall()
        assert got == [(expected,)]
        time.sleep(0.1)  # the worker "died": its lock expires
    assert conn.execute("SELECT count(*) FROM dq_poll_many('jobs', 1)").fetchone()[0] == 0
    count, error, has_at, dead_from, has_dead_at, token = row(conn, "jobs.dead", "crasher")
    assert (count, dead_from, has_at, has_dead_at, token) == (3, "jobs", True, True, None)
    assert error == "lock expired: delivery 3 was not acknowledged"


def test_poll_delivers_the_rest_of_a_batch_that_had_a_dead_letter(conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', 1, 'jobs.dead')")
    conn.execute("SELECT dq_offer('jobs', 'a', 'x', now() - interval '1 minute')")
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('jobs')").fetchone()
    conn.execute("SELECT dq_nack(%s)", (token,))  # delivery 1 of 1 failed: dead now
    assert row(conn, "jobs.dead", "a") is not None
    conn.execute("SELECT dq_offer('jobs', 'b', 'y', now() - interval '2 minutes')")
    conn.execute("SELECT dq_offer('jobs', 'c', 'z')")
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('jobs', 1, '10 ms')").fetchone()  # b
    time.sleep(0.05)
    keys = [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('jobs', 10)")]
    assert keys == ["c"]  # b (lock expired at its limit) went to the dead-letter queue
    assert row(conn, "jobs.dead", "b") is not None


def test_a_key_that_dies_twice_keeps_both_dead_letters(conn) -> None:
    # Used to be "the newer replaces the older": the older dead letter was lost without a trace.
    conn.execute("SELECT dq_configure_queue('jobs', 1, 'jobs.dead')")
    for payload in ("old", "new"):
        conn.execute("SELECT dq_offer('jobs', 'k', %s)", (payload,))
        (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('jobs')").fetchone()
        conn.execute("SELECT dq_nack(%s, '0', %s)", (token, f"failed {payload}"))
    assert conn.execute(
        "SELECT payload, last_error, delivery_count, dead_delivery_count FROM dq_messages WHERE queue = 'jobs.dead' "
        "ORDER BY dead_at, id").fetchall() == [(b"old", "failed old", 0, 1), (b"new", "failed new", 0, 1)]
    # dq_get lists both; the first redrive sends one back, the other waits for the key to be free.
    assert [r[0] for r in conn.execute("SELECT payload FROM dq_get('jobs.dead', 'k')")] == [b"old", b"new"]
    assert conn.execute("SELECT dq_redrive('jobs.dead')").fetchone()[0] == 1
    assert conn.execute("SELECT payload FROM dq_messages WHERE queue = 'jobs'").fetchall() == [(b"old",)]
    assert conn.execute("SELECT payload FROM dq_messages WHERE queue = 'jobs.dead'").fetchall() == [(b"new",)]


def test_redrive_sends_back_and_never_overwrites_a_live_key(conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', 1, 'jobs.dead')")
    for key in ("a", "b"):
        conn.execute("SELECT dq_offer('jobs', %s, 'x')", (key,))
    for (token,) in conn.execute("SELECT lock_token FROM dq_poll_many('jobs', 2)").fetchall():
        conn.execute("SELECT dq_nack(%s, '0', 'boom')", (token,))
    conn.execute("SELECT dq_offer('jobs', 'b', 'a new b')")  # b is live again in jobs
    assert conn.execute("SELECT dq_redrive('jobs.dead')").fetchone()[0] == 1
    assert row(conn, "jobs", "a")[:4] == (0, "boom", True, None)
    live_b = conn.execute("SELECT payload FROM dq_messages WHERE queue = 'jobs' AND key = 'b'").fetchone()[0]
    assert live_b == b"a new b"
    assert row(conn, "jobs.dead", "b") is not None  # kept, not lost
    assert conn.execute("SELECT dq_redrive('jobs.dead')").fetchone()[0] == 0


def test_unconfigured_queue_redelivers_forever(conn) -> None:
    conn.execute("SELECT dq_offer('free', 'k', 'x')")
    for expected in range(1, 6):
        (token, count) = conn.execute("SELECT lock_token, delivery_count FROM dq_poll_many('free')").fetchone()
        assert count == expected
        conn.execute("SELECT dq_nack(%s, '0', 'again')", (token,))
    conn.execute("SELECT dq_configure_queue('free', 10, 'free.dead')")
    conn.execute("SELECT dq_configure_queue('free')")  # names nothing: changes nothing
    assert conn.execute("SELECT max_deliveries FROM dq_queues WHERE queue = 'free'").fetchone()[0] == 10
    # back to no limit: cleared by name
    conn.execute("SELECT dq_configure_queue('free', clear => ARRAY['max_deliveries', 'dead_letter_queue'])")
    assert conn.execute("SELECT max_deliveries FROM dq_queues WHERE queue = 'free'").fetchone()[0] is None


@pytest.mark.parametrize(
    ("statement", "sqlstate", "text"),
    [
        ("SELECT dq_configure_queue('q', 0, 'd')", "22023", "max_deliveries is 0"),
        ("SELECT dq_configure_queue('q', 3)", "22023", "needs a dead_letter_queue"),
        ("SELECT dq_configure_queue('q', 3, 'q')", "22023", "must differ"),
        ("SELECT dq_configure_queue('q', 3, '')", "22023", "dead_letter_queue must not be empty"),
        ("SELECT dq_configure_queue(NULL, 3, 'd')", "22004", "queue must not be NULL"),
        (f"SELECT dq_configure_queue('q', 3, '{'d' * 101}')", "22001", "the limit is 100"),
        ("SELECT dq_redrive('q', 0)", "22023", "max_count is 0"),
        ("SELECT dq_redrive(NULL)", "22004", "dead_letter_queue must not be NULL"),
        (f"SELECT dq_nack(gen_random_uuid(), '0', '{'e' * 10001}')", "22001", "the limit is 10000"),
    ],
)
def test_bad_input(conn, statement: str, sqlstate: str, text: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(statement)
    assert info.value.sqlstate == sqlstate
    assert text in str(info.value)
    assert conn.execute("SELECT count(*) FROM dq_queues").fetchone()[0] == 0


def test_python_configure_nack_error_redrive(dsn: str, conn) -> None:
    with DelayedQueue(dsn, "jobs") as q, DelayedQueue(dsn, "jobs.dead") as dead:
        q.configure(max_deliveries=1, dead_letter_queue="jobs.dead")
        q.offer("k", {"v": 1})
        (m,) = q.poll()
        assert m.nack(error="ValueError: bad") is True
        assert q.get("k") is None and dead.get("k") is not None
        assert dead.redrive() == 1
        assert q.get("k").delivery_count == 0
        with pytest.raises(pyqueue.InvalidArgument) as info:
            q.configure(max_deliveries=0, dead_letter_queue="x")
        assert info.value.sqlstate == "22023"


def test_worker_dead_letters_a_message_that_always_fails(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("CREATE TABLE handled (key text, delivery_count int, phase text, pid int)")
        with DelayedQueue(dsn, "jobs") as q:
            q.configure(max_deliveries=3, dead_letter_queue="jobs.dead")
            q.offer("poison", {"x": 1})
        # the CLI's default backoff: retries after about 1 s and 2 s, then the third failure is dead
        proc = start_worker(dsn, "workerhandlers:always_fail", "--idle-check", "0.5")
        wait_for(db, "SELECT count(*) FROM dq_messages WHERE queue = 'jobs.dead'", 1)
        code, out = stop(proc)
        assert code == 0, out
        assert db.execute("SELECT count(*) FROM handled").fetchone()[0] == 3
        last_error, dead_from = db.execute(
            "SELECT last_error, dead_from FROM dq_messages WHERE queue = 'jobs.dead' AND key = 'poison'").fetchone()
        assert last_error == "ValueError: cannot handle poison" and dead_from == "jobs"
        assert db.execute("SELECT count(*) FROM dq_messages WHERE queue = 'jobs'").fetchone()[0] == 0
