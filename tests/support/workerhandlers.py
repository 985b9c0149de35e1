"""Handlers for the worker tests (imported by `pyqueue worker` subprocesses: module workerhandlers),
and the waits and worker processes those tests share.

Each handler records what it handled in the table ``handled`` of the database in $DQ_DSN.

The waits never assert on what happens within a real-time window: each runs until a condition
seen on the server holds, at most :data:`HANG_S` seconds, a bound that only a hang exceeds (a
loaded 2-core host included). A worker is *idle* when the server shows it waiting: its session
has a ``dq_waiters`` row whose ``wake_at`` is still ahead (it registered by ``dq_poll_or_wait``
and nothing ended that wait) and sits idle between statements (``pg_stat_activity.state`` 'idle',
wait event 'ClientRead': the client sleeps on LISTEN)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from pyqueue import Message

#: This folder: the working directory of the ``pyqueue worker`` processes the tests start, so that
#: they import this module as ``workerhandlers``.
SUPPORT = Path(__file__).resolve().parent

#: Bounds every wait of the worker tests: only a hang takes this long, even on a loaded host.
HANG_S = 120.0

#: The sessions of ``queue`` waiting on LISTEN: registered by dq_poll_or_wait, wait not over, idle.
IDLE_WAITERS = """
    SELECT w.pid, w.wake_at FROM dq_waiters w JOIN pg_stat_activity a ON a.pid = w.pid
     WHERE w.queue = %s AND w.wake_at > clock_timestamp()
       AND a.state = 'idle' AND a.wait_event = 'ClientRead'
     ORDER BY w.pid"""


def wait_until(conn: psycopg.Connection[Any], query: str, params: Any = None, *,
               timeout: float = HANG_S) -> tuple[Any, ...]:
    """Run ``query`` until its first column is true; return that row. AssertionError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(query, params).fetchone()
        if row is not None and row[0]:
            return tuple(row)
        if time.monotonic() > deadline:
            raise AssertionError(f"still not true after {timeout:.0f} s: {query} {params or ''}")
        time.sleep(0.05)


def idle_waiters(conn: psycopg.Connection[Any], queue: str = "jobs", count: int = 1, *,
                 timeout: float = HANG_S) -> list[tuple[int, datetime]]:
    """Until ``count`` sessions wait on ``queue`` (see the module's docstring), at most ``timeout``
    seconds: their (pid, wake_at), when each wait would end by its own timer."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [(int(pid), wake_at) for pid, wake_at in conn.execute(IDLE_WAITERS, (queue,)).fetchall()]
        if len(rows) >= count:
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(rows)} of {count} sessions waiting on {queue!r} after {timeout:.0f} s")
        time.sleep(0.05)


def idle_worker_calls(dsn: str, *worker_args: str, idle_check: float,
                      timer_checks: int = 2) -> tuple[dict[str, int], str, int, float]:
    """Run ``pyqueue worker`` on queue 'jobs' with ``--idle-check idle_check`` and
    ``worker_args``, with ``track_functions`` on its own sessions only, until its own timer has
    re-checked the queue ``timer_checks`` times: its waiter row seen registered anew (a new
    ``wake_at``) that often after the first registration, at most :data:`HANG_S`. Then SIGTERM;
    once its sessions are gone (a session reports its function statistics as it ends) return the
    calls of each ``dq_*`` function its sessions made, its output, the registrations seen and its
    lifetime in seconds (start to exit, measured by the test). The window is the worker's own
    progress, so a loaded host makes it longer, never the count wrong."""
    app = f"idle-worker-{uuid.uuid4().hex[:8]}"
    worker_dsn = f"{dsn} application_name={app} options='-c track_functions=all'"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyqueue", "worker", "--dsn", worker_dsn, "--queue", "jobs",
         "--idle-check", str(idle_check), *worker_args, "workerhandlers:record"],
        cwd=SUPPORT, env=dict(os.environ, DQ_DSN=dsn), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    registrations: set[tuple[int, datetime]] = set()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + HANG_S
            while len(registrations) < 1 + timer_checks:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, f"{len(registrations)} registrations in {HANG_S:.0f} s"
                registrations.update(conn.execute(
                    "SELECT w.pid, w.wake_at FROM dq_waiters w JOIN pg_stat_activity a ON a.pid = w.pid "
                    "WHERE w.queue = 'jobs' AND a.application_name = %s", (app,)).fetchall())
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=HANG_S)
            lifetime = time.monotonic() - started
            wait_until(conn, "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = %s", (app,))
            conn.execute("SELECT pg_stat_clear_snapshot()")
            calls = dict(conn.execute(
                "SELECT funcname, calls FROM pg_stat_user_functions WHERE funcname LIKE 'dq%'").fetchall())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, out
    return calls, out, len(registrations), lifetime


#: The options of every worker :func:`start_worker` starts (``--async`` or none: the test chooses),
#: and every worker it started, which the test kills if it is still running.
WORKER_ARGS: list[str] = []
STARTED: list[subprocess.Popen[str]] = []


def run_until(worker: Any, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Run the sync ``worker`` (a :class:`pyqueue.Worker`) in a thread until ``done(its counters)``,
    at most :data:`HANG_S`; then stop it and wait for it to end. Returns its counters."""
    t = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    t.start()
    deadline = time.monotonic() + HANG_S
    while not done(worker.stats.snapshot()) and time.monotonic() < deadline:
        time.sleep(0.02)
    worker.stop()
    t.join(HANG_S)
    assert not t.is_alive()
    return worker.stats.snapshot()  # type: ignore[no-any-return]


async def run_until_async(worker: Any, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """:func:`run_until` for a :class:`pyqueue.aio.AsyncWorker`, in a task of the running loop."""
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    deadline = time.monotonic() + HANG_S
    while not done(worker.stats.snapshot()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    worker.stop()
    await asyncio.wait_for(task, HANG_S)
    return worker.stats.snapshot()  # type: ignore[no-any-return]


def start_worker(dsn: str, handler: str, *args: str) -> subprocess.Popen[str]:
    """Start ``pyqueue worker`` on queue 'jobs' with ``handler`` (``workerhandlers:NAME``), the
    options of :data:`WORKER_ARGS` and ``args``; its output (stdout and stderr) is a text pipe."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyqueue", "worker", "--dsn", dsn, "--queue", "jobs", *WORKER_ARGS, *args, handler],
        cwd=SUPPORT, env=dict(os.environ, DQ_DSN=dsn), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    STARTED.append(proc)
    return proc


def wait_for(conn: psycopg.Connection, query: str, expected: int) -> None:
    """Until ``query`` counts at least ``expected``, at most HANG_S."""
    wait_until(conn, f"SELECT ({query}) >= {int(expected)}")


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> tuple[int, str]:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=HANG_S)
    return proc.returncode, out


def read_until(proc: subprocess.Popen[str], text: str) -> str:
    """The worker's output as it comes, up to the first line that contains ``text`` (at most HANG_S)."""
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(HANG_S)
    assert lines and text in lines[-1], "".join(lines)
    return "".join(lines)


def cut_all(dsn: str, app: str) -> int:
    """pg_terminate_backend of every session of ``application_name = app``, as a restart would;
    returns how many, once they are gone (sessions the app opens meanwhile are left alone)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        sessions = [pid for pid, in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchall()]
        killed = [pid for pid, in conn.execute(
            "SELECT pid FROM unnest(%s::int[]) pid WHERE pg_terminate_backend(pid)", (sessions,)).fetchall()]
        wait_until(conn, "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s))", (killed,))
    return len(killed)


def _record(message: Message, phase: str) -> None:
    with psycopg.connect(os.environ["DQ_DSN"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO handled (key, delivery_count, phase, pid) VALUES (%s, %s, %s, %s)",
            (message.key, message.delivery_count, phase, os.getpid()),
        )


def record(message: Message) -> None:
    _record(message, "done")


async def record_async(message: Any) -> None:
    """A coroutine handler (for `pyqueue worker --async`): records on an async connection."""
    async with await psycopg.AsyncConnection.connect(os.environ["DQ_DSN"], autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO handled (key, delivery_count, phase, pid) VALUES (%s, %s, %s, %s)",
            (message.key, message.delivery_count, "done", os.getpid()),
        )


def fail_first(message: Message) -> None:
    if message.delivery_count == 1:
        _record(message, "failed")
        raise RuntimeError("first delivery fails")
    _record(message, "done")


def slow(message: Message) -> None:
    _record(message, "started")
    time.sleep(float(message.payload["sleep"]))
    _record(message, "done")


def always_fail(message: Message) -> None:
    _record(message, "failed")
    raise ValueError(f"cannot handle {message.key}")


def interrupt(message: Message) -> None:
    """Raises KeyboardInterrupt (the worker nacks the message, then stops)."""
    _record(message, "interrupted")
    raise KeyboardInterrupt


def assert_idle_budget(calls: dict[str, int], registrations: int, lifetime: float, idle_check: float) -> None:
    """What :func:`idle_worker_calls` returned is within an idle worker's budget, the documented one
    (at most one query per idle_check besides wake-ups, and the first poll): its start-up
    dq_channel, one dq_poll_or_wait per registration seen, and no other dq_* statement."""
    polls = calls.get("dq_poll_or_wait", 0)
    # Each registration seen was one call, and hardly any went unseen: at most one after the last
    # seen (the timer firing before the SIGTERM) and one where a wait's timer and its deadline meet.
    assert registrations <= polls <= registrations + 2, (calls, registrations)
    # In real time, over the worker's whole life: one poll at start-up, at most one per idle_check,
    # and that edge one (a loaded host only makes `lifetime` longer, so this bound looser).
    assert polls <= lifetime / idle_check + 2, (calls, lifetime)
    assert calls.get("dq_channel") == 1, calls
    top_level = {"dq_ack", "dq_nack", "dq_extend", "dq_offer", "dq_get", "dq_next_due", "dq_wait_done"}
    assert not top_level & set(calls), calls


def noop(message: Message) -> None:
    """Does nothing: the message is acknowledged."""

