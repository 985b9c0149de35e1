"""Faults found by the chaos run (bench.chaos), reproduced deterministically.

A server restart or a ``pg_terminate_backend`` of all of a process's sessions cuts every
connection its pool holds, but the pool only finds out when it hands each of them out. A call
that fails on a cut connection and is retried must get a live one, not the next cut one: the
worker retries a failed acknowledgement once, and a retry that fails again means a needless
redelivery (found by the chaos run as duplicates after each cut of all connections).

Each interleaving is made certain by events, not by timing: waits end on a condition, at most
``HANG_S`` (only a hang takes that long, even on a loaded host)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from workerhandlers import HANG_S, cut_all, idle_waiters, wait_until

from pyqueue import DatabaseError, DelayedQueue, Worker
from pyqueue.aio import AsyncDelayedQueue, AsyncWorker

POOL_SIZE = 4


def test_call_after_a_cut_gets_a_live_connection(dsn: str) -> None:
    app = f"cut-{uuid.uuid4().hex[:8]}"
    with ConnectionPool(make_conninfo(dsn, application_name=app), min_size=POOL_SIZE, max_size=POOL_SIZE,
                        kwargs={"autocommit": True}, open=True) as pool:
        pool.wait(HANG_S)
        q = DelayedQueue(pool, "jobs")
        q.offer("k", "x")
        assert cut_all(dsn, app) == POOL_SIZE
        with pytest.raises(DatabaseError):
            q.get("k")  # the first call finds its connection cut
        assert q.get("k") is not None  # the next one must not get another cut connection


def test_async_call_after_a_cut_gets_a_live_connection(dsn: str) -> None:
    app = f"cut-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with AsyncConnectionPool(make_conninfo(dsn, application_name=app), min_size=POOL_SIZE,
                                       max_size=POOL_SIZE, kwargs={"autocommit": True}, open=False) as pool:
            await pool.wait(HANG_S)
            q = AsyncDelayedQueue(pool, "jobs")
            await q.offer("k", "x")
            assert cut_all(dsn, app) == POOL_SIZE
            with pytest.raises(DatabaseError):
                await q.get("k")
            assert await q.get("k") is not None

    asyncio.run(main())


def test_worker_acknowledges_after_all_its_connections_were_cut(dsn: str) -> None:
    """The handler runs while every connection of the worker is cut; when it returns, the first
    acknowledgement fails and the worker's one retry must succeed: the message is acknowledged
    once and not delivered again."""
    app = f"cut-{uuid.uuid4().hex[:8]}"
    started, release = threading.Event(), threading.Event()

    def handler(message: object) -> None:
        started.set()
        release.wait(HANG_S)

    with ConnectionPool(make_conninfo(dsn, application_name=app), min_size=POOL_SIZE, max_size=POOL_SIZE,
                        kwargs={"autocommit": True}, open=True) as pool:
        pool.wait(HANG_S)
        q = DelayedQueue(pool, "jobs")
        q.offer("cut", "x")
        worker = Worker(q, handler, concurrency=1, lock_timeout=30, idle_check=0.5)
        t = threading.Thread(target=worker.run)
        t.start()
        try:
            assert started.wait(HANG_S)
            assert cut_all(dsn, app) >= POOL_SIZE
            release.set()
            deadline = time.monotonic() + HANG_S
            while worker.stats.snapshot()["acknowledged"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            release.set()
            worker.stop()
            t.join(HANG_S)
        assert not t.is_alive()
        q.close()
        assert worker.stats.snapshot()["acknowledged"] == 1
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_async_worker_acknowledges_after_all_its_connections_were_cut(dsn: str) -> None:
    app = f"cut-{uuid.uuid4().hex[:8]}"

    async def main() -> dict:
        started, release = asyncio.Event(), asyncio.Event()

        async def handler(message: object) -> None:
            started.set()
            await release.wait()

        async with AsyncConnectionPool(make_conninfo(dsn, application_name=app), min_size=POOL_SIZE,
                                       max_size=POOL_SIZE, kwargs={"autocommit": True}, open=False) as pool:
            await pool.wait(HANG_S)
            q = AsyncDelayedQueue(pool, "jobs")
            await q.offer("cut", "x")
            worker = AsyncWorker(q, handler, concurrency=1, lock_timeout=30, idle_check=0.5)
            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            try:
                await asyncio.wait_for(started.wait(), HANG_S)
                assert await asyncio.to_thread(cut_all, dsn, app) >= POOL_SIZE
                release.set()
                deadline = time.monotonic() + HANG_S
                while worker.stats.snapshot()["acknowledged"] < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            finally:
                release.set()
                worker.stop()
                await asyncio.wait_for(task, HANG_S)
            await q.close()
            return worker.stats.snapshot()

    assert asyncio.run(main())["acknowledged"] == 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_heartbeat_that_races_a_finishing_handler_reports_no_lost_lock(dsn: str, caplog) -> None:
    """The heartbeat takes the list of running messages, then extends each. A handler that finishes
    in between is acknowledged, and the extend of its (now deleted) message returns NULL: that is
    not a lost lock. The race is made certain by events, whatever the host's load: the handler
    returns only once a heartbeat has taken its message, and that heartbeat holds its list until
    the acknowledgement (the chaos run saw it as "lock … was lost" warnings with no fault at all)."""
    taken = threading.Event()  # a heartbeat took the running message
    followed = threading.Event()  # the heartbeat after the held one: the held one's extends are done

    class PreemptedHeartbeat(Worker):
        raced = False  # a heartbeat held a running message's lock token until that message was acknowledged

        def _to_extend(self) -> list:
            if type(self).raced:
                followed.set()
            running = super()._to_extend()
            if not running:
                return running
            taken.set()
            deadline = time.monotonic() + HANG_S
            while self.stats.snapshot()["acknowledged"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            if self.stats.snapshot()["acknowledged"] >= 1:
                type(self).raced = True
            return running

    with DelayedQueue(dsn, "jobs") as q:
        q.offer("race", "x")
        worker = PreemptedHeartbeat(q, lambda m: taken.wait(HANG_S), concurrency=1, lock_timeout=1.5, idle_check=0.5)
        t = threading.Thread(target=worker.run)
        t.start()
        try:
            # the held heartbeat extends the acknowledged message, then the next one comes
            assert followed.wait(HANG_S)
        finally:
            worker.stop()
            t.join(HANG_S)
        assert not t.is_alive()
    snap = worker.stats.snapshot()
    # A heartbeat took the running message and, held, extended it only after its acknowledgement:
    # the race ran.
    assert PreemptedHeartbeat.raced
    assert snap["acknowledged"] == 1 and snap["lock_lost"] == 0, snap
    assert not [r for r in caplog.records if "was lost" in r.getMessage()]
    assert len(worker._deliveries) == 0  # no token kept for a message that is gone


def test_an_idle_wait_that_outlives_close_closes_its_connection(dsn: str) -> None:
    """Worker.stop() cannot interrupt a wait for a notification from another thread: the idle wait
    ends by its timer, after the application may have closed the queue. The LISTEN connection it
    then gives back is closed, not kept (nothing would ever close it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        q = DelayedQueue(dsn, "jobs")
        worker = Worker(q, lambda m: None, concurrency=1, idle_check=3)
        t = threading.Thread(target=worker.run)
        t.start()
        [(pid, _)] = idle_waiters(conn)
        worker.stop()
        t.join(HANG_S)
        assert not t.is_alive()
        q.close()  # the idle wait still holds its connection, in the server's session `pid`
        waits = [th for th in threading.enumerate() if th.name == "pyqueue-idle-wait"]
        for th in waits:
            th.join(HANG_S)
            assert not th.is_alive()
        wait_until(conn, "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", (pid,))
        assert q._driver._listeners == []  # noqa: SLF001 - what close() would have had to close


def test_an_idle_wait_that_outlives_close_claims_nothing(dsn: str) -> None:
    """A notification that reaches the idle wait of a stopped worker after its queue was closed
    ends the wait without a poll: offers made then stay ready for other consumers, rather than
    claimed by a thread nobody listens to and held until their locks expire."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        q = DelayedQueue(dsn, "jobs")
        worker = Worker(q, lambda m: None, concurrency=1, idle_check=5)
        t = threading.Thread(target=worker.run)
        t.start()
        idle_waiters(conn)
        worker.stop()
        t.join(HANG_S)
        assert not t.is_alive()
        q.close()
        conn.execute("SELECT dq_offer_many('jobs', ARRAY['a','b','c'], ARRAY['x','y','z']::bytea[])")
        waits = [th for th in threading.enumerate() if th.name == "pyqueue-idle-wait"]
        for th in waits:
            th.join(HANG_S)
            assert not th.is_alive()
        assert conn.execute("SELECT count(*) FILTER (WHERE lock_token IS NULL), count(*) FROM dq_messages"
                            ).fetchone() == (3, 3)
