"""Every outcome of a handler call settles its delivery, and the worker goes on.

A handler ends by returning or by raising, and what it raises need not be an ``Exception``:
``sys.exit()`` raises ``SystemExit``, an application may define its own ``BaseException``, an
awaited task that was cancelled raises ``asyncio.CancelledError`` in its awaiter, and an
exception's ``str()`` and ``repr()`` may themselves raise. Whatever it raised, the worker nacks
the message with its backoff, stores a text for the error as the message's last error (one the
database can store), logs it, and its handler slot goes on with the next message;
``KeyboardInterrupt`` also stops the worker (docs/python.md, "The handler contract").

Each case runs the thread :class:`pyqueue.Worker`, and the :class:`pyqueue.aio.AsyncWorker` with a
coroutine handler and with a plain one (run in a thread), against the real server, with one
handler slot (``concurrency=1``, ``prefetch=0``): a slot lost to the failure would leave the
next message unhandled. Waits end on what the worker or the server shows, at most ``HANG_S``."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from workerhandlers import HANG_S, SUPPORT

from pyqueue import Backoff, DelayedQueue, Worker
from pyqueue.aio import AsyncDelayedQueue, AsyncWorker

#: The backoff of every worker here: 0.5 s ± 20% after each failure.
BACKOFF = Backoff(base=timedelta(seconds=0.5), factor=1.0, cap=timedelta(seconds=0.5), jitter=0.2)

#: sync: pyqueue.Worker; async: AsyncWorker with a coroutine handler; async-thread: AsyncWorker
#: with a plain handler (asyncio.to_thread).
MODES = ["sync", "async", "async-thread"]


class Halt(BaseException):
    """An application's own BaseException (not an Exception)."""


class Unprintable(Exception):
    """An exception whose str() and repr() raise."""

    def __str__(self) -> str:
        raise RuntimeError("str() of this error fails")

    def __repr__(self) -> str:
        raise RuntimeError("repr() of this error fails")


async def await_a_cancelled_task() -> None:
    """Await a task that gets cancelled: its CancelledError comes out here, though nobody
    cancelled the caller."""
    task = asyncio.create_task(asyncio.sleep(HANG_S))
    await asyncio.sleep(0)  # the task starts
    task.cancel()
    await task


def cancelled_task_in_a_plain_function() -> None:
    """The same from a plain function: asyncio.run() of it raises the CancelledError."""
    asyncio.run(await_a_cancelled_task())


def sys_exit() -> None:
    sys.exit(3)


def halt() -> None:
    raise Halt("the application's own")


def unprintable() -> None:
    raise Unprintable()


def unstorable_text() -> None:
    raise ValueError("nul \x00 and lone surrogate \udc80")


def keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def cancel_own_task() -> None:
    """A coroutine handler only (see :func:`raise_in_coroutine`): cancels the task it runs in."""
    raise AssertionError("only a coroutine handler cancels its own task")


#: case: (what the plain handler calls, its error text as stored and logged)
CASES: dict[str, tuple[Callable[[], object], str]] = {
    "sys.exit": (sys_exit, "SystemExit: 3"),
    "BaseException subclass": (halt, "Halt: the application's own"),
    "awaited task cancelled": (cancelled_task_in_a_plain_function, "CancelledError"),
    "str and repr raise": (unprintable, "Unprintable: <str() raised RuntimeError>"),
    "NUL and lone surrogate": (unstorable_text, "ValueError: nul \\x00 and lone surrogate \\udc80"),
}


async def raise_in_coroutine(fail: Callable[[], object]) -> None:
    """What a coroutine handler does for the case of ``fail``: the cancelled task awaited in the
    worker's own loop; its own task (the worker's) cancelled by the handler; the others raised as
    they are."""
    if fail is cancelled_task_in_a_plain_function:
        await await_a_cancelled_task()
    elif fail is cancel_own_task:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
    else:
        fail()


def stored(dsn: str, key: str) -> tuple[int, str, float] | None:
    """The message ``key`` as stored: delivery_count, last_error, and the delay of its last nack
    (due_at − last_error_at while it is delivered: the nack's now + delay, and that now)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT delivery_count, last_error, extract(epoch FROM due_at - last_error_at)::float8 "
            "FROM dq_messages WHERE key = %s", (key,)).fetchone()


def run_worker(dsn: str, mode: str, fail: Callable[[], object], done: Callable[[Any], bool], *,
               stop: bool = True) -> tuple[dict[str, Any], list[tuple[str, int, Any]], Any]:
    """Run a worker of ``mode`` on queue 'jobs' (one handler slot, :data:`BACKOFF`) until
    ``done(worker)``, then stop it (``stop``) or wait for it to stop by itself; at most HANG_S.

    Its handler calls ``fail`` on the first delivery of key 'bad'; every other delivery records
    (key, delivery_count, :func:`stored` of it) and returns. Returns the worker's counters, those
    records in the order handled, and the worker (its deliveries' book is inspected)."""
    handled: list[tuple[str, int, Any]] = []
    settings: dict[str, Any] = {"concurrency": 1, "prefetch": 0, "backoff": BACKOFF, "idle_check": 0.5,
                                "shutdown_grace": 5}

    def handler(m: Any) -> None:
        if m.key == "bad" and m.delivery_count == 1:
            fail()
        handled.append((m.key, m.delivery_count, stored(dsn, m.key)))

    async def coroutine_handler(m: Any) -> None:
        if m.key == "bad" and m.delivery_count == 1:
            await raise_in_coroutine(fail)
        handled.append((m.key, m.delivery_count, await asyncio.to_thread(stored, dsn, m.key)))

    def ended(worker: Any, running: Callable[[], bool]) -> bool:
        return done(worker) or not running()

    if mode == "sync":
        with DelayedQueue(dsn, "jobs") as q:
            worker = Worker(q, handler, **settings)
            t = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
            t.start()
            try:
                deadline = time.monotonic() + HANG_S
                while not ended(worker, t.is_alive) and time.monotonic() < deadline:
                    time.sleep(0.02)
            finally:
                if stop:
                    worker.stop()
                t.join(HANG_S)
            assert not t.is_alive()
        return worker.stats.snapshot(), handled, worker

    async def main() -> Any:
        async with AsyncDelayedQueue(dsn, "jobs") as q:
            worker = AsyncWorker(q, coroutine_handler if mode == "async" else handler, **settings)
            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            try:
                deadline = time.monotonic() + HANG_S
                while not ended(worker, lambda: not task.done()) and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
            finally:
                if stop:
                    worker.stop()
                await asyncio.wait_for(task, HANG_S)
            return worker

    worker = asyncio.run(main())
    return worker.stats.snapshot(), handled, worker


def failure_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name in ("pyqueue.worker", "pyqueue.aio") and "handler failed for key 'bad'" in r.getMessage()]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_a_handler_that_raises_anything_is_nacked_and_the_slot_goes_on(
        dsn: str, mode: str, case: str, caplog: pytest.LogCaptureFixture) -> None:
    """'bad' fails on its first delivery with the case's exception; 'next' is offered after it.
    With one handler slot, 'next' is handled only if the slot survived the failure; 'bad' is
    delivered again after the backoff, and its second delivery sees the nack as stored."""
    fail, text = CASES[case]
    assert_nacked_and_the_slot_went_on(dsn, mode, fail, text, caplog)


def test_an_async_handler_that_cancels_its_own_task_is_nacked_and_the_slot_goes_on(
        dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """A coroutine handler that cancels the task it runs in (the worker's) gets the CancelledError
    of that request: a failure of its message like any other, since the worker did not cancel it."""
    assert_nacked_and_the_slot_went_on(dsn, "async", cancel_own_task, "CancelledError", caplog)


def test_the_async_workers_own_cancellation_after_the_grace_is_not_a_failure(
        dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """A coroutine handler still running when ``shutdown_grace`` ends is cancelled by the worker:
    that is no outcome of the handler, so nothing is sent for it (not nacked, not counted failed);
    its lock stays until it expires and the message is delivered again (docs/state_machine.md)."""
    caplog.set_level(logging.WARNING)
    cancelled: list[bool] = []

    async def main() -> dict[str, Any]:
        started = asyncio.Event()

        async def handler(m: Any) -> None:
            started.set()
            try:
                await asyncio.Event().wait()  # never set: only a cancellation ends it
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        async with AsyncDelayedQueue(dsn, "jobs") as q:
            await q.offer("slow", "x")
            worker = AsyncWorker(q, handler, concurrency=1, idle_check=0.5, shutdown_grace=0.5, lock_timeout=600)
            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            await asyncio.wait_for(started.wait(), HANG_S)
            worker.stop()
            await asyncio.wait_for(task, HANG_S)
            return worker.stats.snapshot()

    snap = asyncio.run(main())
    assert cancelled == [True]
    assert snap["delivered"] == 1 and snap["failed"] == 0 and snap["acknowledged"] == 0, snap
    assert not failure_logs(caplog) and not [r for r in caplog.records if "handler failed" in r.getMessage()]
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT delivery_count, lock_token IS NOT NULL, scheduled_at > clock_timestamp(), "
                           "last_error FROM dq_messages WHERE key = 'slow'").fetchone()
    assert row == (1, True, True, None)  # still locked (until its scheduled_at) by the delivery given up


def assert_nacked_and_the_slot_went_on(dsn: str, mode: str, fail: Callable[[], object], text: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """Offer 'bad' and 'next', run a worker whose handler calls ``fail`` on the first delivery of
    'bad' (:func:`run_worker`) until both are acknowledged; then assert 'bad' was nacked with the
    backoff and ``text`` stored and logged, and that 'next' was handled."""
    caplog.set_level(logging.WARNING)
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("bad", "x")
        q.offer("next", "y")

    snap, handled, worker = run_worker(dsn, mode, fail, lambda w: w.stats.acknowledged >= 2)

    by_key = {(key, count): row for key, count, row in handled}
    assert sorted(by_key) == [("bad", 2), ("next", 1)], handled  # the slot went on, 'bad' came back
    delivery_count, last_error, nack_delay = by_key[("bad", 2)]
    assert delivery_count == 2
    assert last_error == text  # stored by the nack after the failure
    # nacked with the backoff: due again 0.5 s ± 20% after the nack (the server's own times)
    assert 0.4 - 1e-6 <= nack_delay <= 0.6 + 1e-6, nack_delay
    assert snap["delivered"] == 3 and snap["failed"] == 1 and snap["acknowledged"] == 2, snap
    assert snap["lock_lost"] == 0, snap
    assert len(worker._deliveries) == 0  # no delivery left running (its lock extended for ever)
    logs = failure_logs(caplog)
    assert len(logs) == 1, logs
    assert logs[0].startswith(f"handler failed for key 'bad' (delivery 1): {text}; retry in "), logs
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM dq_messages").fetchone() == (0,)


@pytest.mark.parametrize("mode", MODES)
def test_a_handler_that_raises_keyboard_interrupt_nacks_and_stops_the_worker(
        dsn: str, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """KeyboardInterrupt out of a handler settles its message like any failure (nacked with the
    backoff, the error stored and logged), then the worker stops as by ``stop()``: ``run()``
    returns without anything else stopping it."""
    caplog.set_level(logging.WARNING)
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("bad", "x")

    snap, handled, worker = run_worker(dsn, mode, keyboard_interrupt, lambda w: False, stop=False)

    assert handled == []
    assert snap["delivered"] == 1 and snap["failed"] == 1 and snap["acknowledged"] == 0, snap
    assert len(worker._deliveries) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT delivery_count, lock_token IS NULL, last_error, "
            "extract(epoch FROM scheduled_at - last_error_at)::float8 FROM dq_messages WHERE key = 'bad'").fetchone()
    assert row is not None
    delivery_count, unlocked, last_error, nack_delay = row
    assert (delivery_count, unlocked, last_error) == (1, True, "KeyboardInterrupt")
    assert 0.4 - 1e-6 <= nack_delay <= 0.6 + 1e-6, nack_delay
    logs = failure_logs(caplog)
    assert len(logs) == 1 and logs[0].startswith(
        "handler failed for key 'bad' (delivery 1): KeyboardInterrupt; retry in "), logs
    assert any("KeyboardInterrupt" in r.getMessage() and "stopping the worker" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("worker_args", [[], ["--async"]], ids=["sync", "async"])
def test_pyqueue_worker_exits_0_after_a_handler_raised_keyboard_interrupt(dsn: str, worker_args: list[str]) -> None:
    """The command line worker: the handler's KeyboardInterrupt nacks its message, then the process
    stops by itself as after a SIGTERM (status 0), saying why."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE handled (key text, delivery_count int, phase text, pid int)")
        conn.execute("SELECT dq_offer('jobs', 'bad', '1'::jsonb)")
        done = subprocess.run(
            [sys.executable, "-m", "pyqueue", "worker", "--dsn", dsn, "--queue", "jobs", "--idle-check", "0.5",
             *worker_args, "workerhandlers:interrupt"],
            cwd=SUPPORT, env=dict(os.environ, DQ_DSN=dsn), capture_output=True, text=True, timeout=HANG_S)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        assert "Traceback" not in out, out
        assert "handler for key 'bad' raised KeyboardInterrupt: stopping the worker" in out, out
        assert "handler failed for key 'bad' (delivery 1): KeyboardInterrupt; retry in " in out, out
        assert conn.execute("SELECT key, delivery_count, phase FROM handled").fetchall() == [("bad", 1, "interrupted")]
        assert conn.execute("SELECT delivery_count, lock_token IS NULL, last_error FROM dq_messages "
                            "WHERE key = 'bad'").fetchone() == (1, True, "KeyboardInterrupt")
