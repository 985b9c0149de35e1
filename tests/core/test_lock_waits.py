"""Lock waits: times stored after the locks a function waited for, and max_in_flight at every
isolation level.

* A poll that waited for a limited queue's row, a nack or an extend that waited for a message row,
  reads the clock after the wait: the lock expiry, due time and error time it stores are not in the
  past when it returns (the isolation spec ``limit_poll_waits_then_reads_clock`` covers the poll).
* ``max_in_flight`` holds under REPEATABLE READ and SERIALIZABLE: a poller whose snapshot is older
  than another poller's committed acquisition gets 40001 instead of counting with its snapshot.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlhelpers import wait_for_lock_wait

LEVELS = ["REPEATABLE READ", "SERIALIZABLE"]


def offer(conn: psycopg.Connection[Any], queue: str, *keys: str) -> None:
    for key in keys:
        conn.execute("SELECT dq_offer(%s, %s, 'x'::text, '2020-01-01 00:00:00+00')", (queue, key))


def in_flight(conn: psycopg.Connection[Any], queue: str) -> int:
    return conn.execute("SELECT count(*) FROM dq_messages WHERE queue = %s AND lock_token IS NOT NULL "
                        "AND scheduled_at > clock_timestamp()", (queue,)).fetchone()[0]


def offer_unseen(conn: psycopg.Connection[Any]) -> None:
    """k1, offered after the late poller's snapshot (which therefore sees neither it nor its
    delivery) and first in the poll's order, so the first poller takes k1 and the late one, whose
    snapshot shows nothing in flight, would take k2 without touching any row the first one changed."""
    conn.execute("SELECT dq_offer('lim', 'k1', 'x'::text, '2020-01-01 00:00:00+00', priority => 1)")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("first_level", ["READ COMMITTED", "REPEATABLE READ"])
def test_max_in_flight_holds_for_a_poller_with_an_older_snapshot(dsn: str, conn, level: str,
                                                                  first_level: str) -> None:
    conn.execute("SELECT dq_configure_queue('lim', max_in_flight => 1)")
    offer(conn, "lim", "k2")
    with psycopg.connect(dsn) as late, psycopg.connect(dsn) as first:
        late.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        late.execute("SELECT 1")  # the snapshot is taken here, before the other poll commits
        offer_unseen(conn)
        first.execute(f"SET TRANSACTION ISOLATION LEVEL {first_level}")
        assert len(first.execute("SELECT * FROM dq_poll_many('lim', 1, interval '1 hour')").fetchall()) == 1
        first.commit()
        with pytest.raises(psycopg.errors.SerializationFailure):
            late.execute("SELECT * FROM dq_poll_many('lim', 10, interval '1 hour')")
        late.rollback()
        assert in_flight(conn, "lim") == 1
        # Retried in a new transaction, at the same level: the queue is full.
        late.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        assert late.execute("SELECT * FROM dq_poll_many('lim', 10, interval '1 hour')").fetchall() == []
        late.commit()
    assert in_flight(conn, "lim") == 1


@pytest.mark.parametrize("level", LEVELS)
def test_a_poller_that_waited_for_the_queue_row_gets_40001_under_snapshot_isolation(dsn: str, conn,
                                                                                   level: str) -> None:
    conn.execute("SELECT dq_configure_queue('lim', max_in_flight => 1)")
    offer(conn, "lim", "k2")
    outcome: list[object] = []
    with psycopg.connect(dsn) as late, psycopg.connect(dsn) as first:
        late.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        late.execute("SELECT 1")
        offer_unseen(conn)
        assert len(first.execute("SELECT * FROM dq_poll_many('lim', 1, interval '1 hour')").fetchall()) == 1

        def poll() -> None:
            try:
                outcome.append(late.execute("SELECT * FROM dq_poll_many('lim', 10, interval '1 hour')").fetchall())
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=poll)
        thread.start()
        wait_for_lock_wait(conn, "dq_poll_many('lim', 10")
        first.commit()
        thread.join(60)
        assert len(outcome) == 1 and isinstance(outcome[0], psycopg.errors.SerializationFailure), outcome
        late.rollback()
    assert in_flight(conn, "lim") == 1


def test_read_committed_pollers_still_fill_the_limit_exactly(dsn: str, conn) -> None:
    conn.execute("SELECT dq_configure_queue('lim', max_in_flight => 3)")
    offer(conn, "lim", *[f"k{i}" for i in range(10)])
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        assert len(a.execute("SELECT * FROM dq_poll_many('lim', 2, interval '1 hour')").fetchall()) == 2
        assert len(b.execute("SELECT * FROM dq_poll_many('lim', 10, interval '1 hour')").fetchall()) == 1
        assert b.execute("SELECT * FROM dq_poll_many('lim', 10, interval '1 hour')").fetchall() == []
    assert in_flight(conn, "lim") == 3


def hold_row_then_release(dsn: str, conn: psycopg.Connection[Any], key: str, waiter: str,
                          call: threading.Thread) -> Any:
    """Hold ``key``'s row (a lock only, as a poll holds a group head) until ``call`` waits for it,
    then for 1 s more; returns the server time at which the lock was released."""
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM dq_messages WHERE key = %s FOR UPDATE", (key,))
        call.start()
        wait_for_lock_wait(conn, waiter)
        holder.execute("SELECT pg_sleep(1)")
        released = holder.execute("SELECT clock_timestamp()").fetchone()[0]
        holder.commit()
    call.join(60)
    return released


@pytest.mark.parametrize("fn", ["dq_extend", "dq_nack"])
def test_extend_and_nack_read_the_clock_after_waiting_for_the_message(dsn: str, conn, fn: str) -> None:
    offer(conn, "q", "k")
    token = conn.execute("SELECT lock_token FROM dq_poll_many('q', 1, interval '1 hour')").fetchone()[0]
    result: list[Any] = []
    with psycopg.connect(dsn, autocommit=True) as consumer:
        if fn == "dq_extend":
            statement = "SELECT dq_extend(%s, interval '1 second')"
        else:
            statement = "SELECT dq_nack(%s, interval '1 second', 'failed')"
        call = threading.Thread(target=lambda: result.append(consumer.execute(statement, (token,)).fetchone()[0]))
        released = hold_row_then_release(dsn, conn, "k", fn, call)
    due, error_at = conn.execute("SELECT scheduled_at, last_error_at FROM dq_messages WHERE key = 'k'").fetchone()
    assert result and result[0] not in (None, False)
    # Read after the wait: at least 1 s (the lock or delay) after the row was released.
    assert due >= released + timedelta(seconds=1)
    if fn == "dq_extend":
        assert result[0] == due
    else:
        assert error_at >= released
