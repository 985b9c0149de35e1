"""Plain (non-coroutine) handlers in the asyncio worker: they run in the worker's own threads,
``concurrency`` of them at once, short ones one after the other in a thread whose outcomes reach
the loop in batches; each call sees its own copy of the runner's context, and a message whose
handler returned is acknowledged while a slow handler after it still runs. Against the real
server; waits end on what the worker shows, at most ``HANG_S``."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from workerhandlers import HANG_S

from pyqueue.aio import AsyncDelayedQueue, AsyncMessage, AsyncWorker

SEEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("SEEN", default=None)


def run_async_worker(dsn: str, handler: Callable[[AsyncMessage], Any], offers: list[tuple[str, Any]],
                     until: Callable[[AsyncWorker], bool], **settings: Any) -> AsyncWorker:
    """Offer ``offers`` to queue 'jobs', run an AsyncWorker with ``handler`` until ``until(worker)``
    (at most HANG_S), stop it; the worker."""
    async def main() -> AsyncWorker:
        async with AsyncDelayedQueue(dsn, "jobs") as q:
            await q.offer_many(offers)
            worker = AsyncWorker(q, handler, idle_check=0.5, **settings)
            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            deadline = time.monotonic() + HANG_S
            while not until(worker) and time.monotonic() < deadline and not task.done():
                await asyncio.sleep(0.02)
            worker.stop()
            await asyncio.wait_for(task, HANG_S)
            return worker

    return asyncio.run(main())


def test_concurrency_plain_handlers_run_at_once(dsn: str) -> None:
    """Eight blocking handlers with concurrency 8 all run at the same time (each waits for the
    other seven), in threads named after the worker, none on the loop's thread."""
    n = 8
    barrier = threading.Barrier(n, timeout=HANG_S)
    threads: set[str] = set()
    loop_thread = threading.current_thread().name

    def handler(m: AsyncMessage) -> None:
        threads.add(threading.current_thread().name)
        barrier.wait()

    worker = run_async_worker(dsn, handler, [(f"k{i}", i) for i in range(n)],
                              lambda w: w.stats.acknowledged >= n, concurrency=n)
    snap = worker.stats.snapshot()
    assert snap["delivered"] == n and snap["acknowledged"] == n and snap["failed"] == 0
    assert len(threads) == n and loop_thread not in threads
    assert all(name.startswith("pyqueue-handler") for name in threads)


def test_each_plain_call_has_its_own_context(dsn: str) -> None:
    """A context variable one handler sets is not seen by the next, even in the same thread."""
    seen: list[str | None] = []

    def handler(m: AsyncMessage) -> None:
        seen.append(SEEN.get())
        SEEN.set(m.key)

    worker = run_async_worker(dsn, handler, [(f"k{i}", i) for i in range(20)],
                              lambda w: w.stats.acknowledged >= 20, concurrency=1)
    assert worker.stats.acknowledged == 20
    assert seen == [None] * 20


def test_a_returned_message_is_acknowledged_while_a_slow_one_runs(dsn: str, conn: psycopg.Connection) -> None:
    """With one handler slot, 'fast' returns and 'slow' (offered after it, due after it) runs for
    seconds in the same thread: 'fast' is acknowledged (gone from the queue) while 'slow' runs."""
    fast_gone_while_slow_ran: list[bool] = []

    def handler(m: AsyncMessage) -> None:
        if m.key == "slow":
            deadline = time.monotonic() + HANG_S
            while time.monotonic() < deadline:
                gone = conn.execute("SELECT NOT EXISTS (SELECT FROM dq_messages WHERE key = 'fast')").fetchone()
                if gone == (True,):
                    fast_gone_while_slow_ran.append(True)
                    break
                time.sleep(0.02)

    conn.execute("SELECT dq_offer('jobs', 'fast', 'x'::text, dq_now() - interval '2 seconds')")
    worker = run_async_worker(dsn, handler, [("slow", 1)], lambda w: w.stats.acknowledged >= 2,
                              concurrency=1, batch_size=2, prefetch=0)
    assert worker.stats.acknowledged == 2
    assert fast_gone_while_slow_ran == [True]


def test_failures_of_plain_handlers_are_nacked_and_the_rest_acknowledged(dsn: str, conn: psycopg.Connection) -> None:
    """In a run of 50 short handlers of which every fifth raises: 10 nacks (delivery_count 1, the
    error stored), 40 acknowledgements, and every slot free again at the end."""
    def handler(m: AsyncMessage) -> None:
        if int(m.key[1:]) % 5 == 0:
            raise ValueError(f"bad {m.key}")

    worker = run_async_worker(dsn, handler, [(f"k{i}", i) for i in range(50)],
                              lambda w: w.stats.acknowledged + w.stats.failed >= 50, concurrency=4)
    snap = worker.stats.snapshot()
    assert snap["acknowledged"] == 40 and snap["failed"] == 10
    rows = conn.execute("SELECT key, delivery_count, last_error FROM dq_messages ORDER BY key").fetchall()
    assert sorted(k for k, _, _ in rows) == sorted(f"k{i}" for i in range(0, 50, 5))
    assert all(count == 1 and error == f"ValueError: bad {key}" for key, count, error in rows)
    assert worker._runners.held == 0
