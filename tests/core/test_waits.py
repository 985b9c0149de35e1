"""Waiting for messages: an offer wakes a waiting consumer unless its queue says ``notify => false``;
the waiter row of a session that died never makes an offer notify and is removed by the next
``dq_wait`` on the queue; a client may wait and idle-check longer than dq_wait's 1-hour cap.

Real server, no mocks: sessions die by pg_terminate_backend."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from sqlhelpers import row_of

from pyqueue import DelayedQueue
from pyqueue.aio import AsyncDelayedQueue


def listen(c: psycopg.Connection[Any], channel: str) -> None:
    c.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def terminate(conn: psycopg.Connection[Any], pid: int) -> None:
    """pg_terminate_backend(pid), then wait until the session is gone from pg_stat_activity."""
    assert row_of(conn, "SELECT pg_terminate_backend(%s)", (pid,)) == (True,)
    deadline = time.monotonic() + 30
    while row_of(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) != (0,):
        assert time.monotonic() < deadline, "the terminated session did not go away"
        time.sleep(0.02)


def waiter_pids(conn: psycopg.Connection[Any], queue: str) -> set[int]:
    return {r[0] for r in conn.execute("SELECT pid FROM dq_waiters WHERE queue = %s", (queue,))}


def test_a_dead_sessions_waiter_never_causes_a_notify_and_a_live_one_does(dsn, conn) -> None:
    (channel,) = row_of(conn, "SELECT dq_channel('wq')")
    # Every session is opened before the waiter dies, so none can reuse its pid.
    with psycopg.connect(dsn, autocommit=True) as doomed, psycopg.connect(dsn, autocommit=True) as listener, \
            psycopg.connect(dsn, autocommit=True) as live:
        listen(doomed, channel)
        doomed.execute("SELECT dq_wait('wq', '1 hour')")
        doomed_pid = doomed.info.backend_pid
        assert waiter_pids(conn, "wq") == {doomed_pid}
        listen(listener, channel)
        terminate(conn, doomed_pid)

        conn.execute("SELECT dq_offer('wq', 'k1', 'x')")
        conn.execute("SELECT * FROM dq_offer_many('wq', ARRAY['k2'], ARRAY['y']::bytea[])")
        got = list(listener.notifies(timeout=1.5))
        assert got == [], "a waiter of a dead session made offers notify"

        conn.execute("SELECT dq_purge('wq', confirm => true)")  # nothing due: the live waiter sleeps its hour
        listen(live, channel)
        live.execute("SELECT dq_wait('wq', '1 hour')")
        conn.execute("SELECT dq_offer('wq', 'k3', 'x')")
        got = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload) for n in got] == [(channel, "wq")], "a live waiter was not woken"


def test_the_next_dq_wait_on_the_queue_removes_dead_sessions_waiters(dsn, conn) -> None:
    with psycopg.connect(dsn, autocommit=True) as doomed, psycopg.connect(dsn, autocommit=True) as other:
        doomed.execute("SELECT dq_wait('wq', '1 hour')")
        doomed_pid, other_pid = doomed.info.backend_pid, other.info.backend_pid
        assert waiter_pids(conn, "wq") == {doomed_pid}
        terminate(conn, doomed_pid)
        other.execute("SELECT dq_wait('wq', '1 second')")
        assert waiter_pids(conn, "wq") == {other_pid}, "the dead session's waiter row was kept"


def _offer_wakes_a_waiter(dsn: str, conn: psycopg.Connection[Any], queue: str) -> bool:
    """A session waits on ``queue`` (``dq_wait`` registers it, LISTEN on its channel); another
    offers a message due now. Whether a notification reached the waiting session (within 3 s)."""
    with psycopg.connect(dsn, autocommit=True) as waiter:
        (channel,) = waiter.execute("SELECT dq_channel(%s)", (queue,)).fetchone()
        waiter.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        (wake_in,) = waiter.execute("SELECT dq_wait(%s, '1 minute')", (queue,)).fetchone()
        assert wake_in.total_seconds() > 30  # nothing due: it would sleep
        assert conn.execute("SELECT dq_offer(%s, 'k', 'x')", (queue,)).fetchone() == ("created",)
        return any(True for _ in waiter.notifies(timeout=3, stop_after=1))


def test_notify_false_stops_the_wake_up_of_waiting_consumers(conn: psycopg.Connection[Any], dsn: str) -> None:
    assert _offer_wakes_a_waiter(dsn, conn, "loud")  # the default: notifications on
    conn.execute("SELECT * FROM dq_configure_queue('quiet', notify => false)")
    assert not _offer_wakes_a_waiter(dsn, conn, "quiet")
    conn.execute("SELECT * FROM dq_configure_queue('quiet', notify => true)")
    conn.execute("SELECT dq_cancel('quiet', 'k')")
    assert _offer_wakes_a_waiter(dsn, conn, "quiet")


def test_a_consumer_may_wait_and_idle_check_longer_than_the_1_hour_cap(dsn: str) -> None:
    """dq_wait refuses max_wait over 1 hour; the client's waits and idle checks may be longer
    and are then made of registrations of at most 1 hour (a 2-hour wait used to reach the server
    unchanged): poll(wait=2 h, idle_check=2 h) must not raise, and an offer still wakes it."""
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
