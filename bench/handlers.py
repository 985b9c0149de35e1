"""Handlers for the worker benchmarks (bench.latency, bench.peers), run by `pyqueue worker`
processes as ``bench.handlers:<name>`` (the drivers start them with the project folder as cwd).

They do as little as possible, so that what is measured is the worker and the queue:

* :func:`lateness` appends one line per delivery, ``<key> TAB <lateness ms>``, to the file named
  by ``$BENCH_LATENESS_FILE`` (one file per worker process), flushed per line; lateness is the
  handler's start (``time.time()``) minus the message's ``scheduled_at``. The driver runs on the
  same host as the database server, so both read the same wall clock.
* :func:`due_lateness` (and :func:`due_lateness_async`) writes the same line, but takes the due
  time from the payload (``<key>|<due epoch seconds>|<padding>``, see :func:`latency_payload`):
  bench.peers gives every queue library the same payload, so all are measured alike.
* :func:`noop` returns at once; :func:`noop_async` is the same as a coroutine (``--async``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO, Any

LATENESS_FILE_ENV = "BENCH_LATENESS_FILE"
DSN_ENV = "BENCH_PEERS_DSN"  # the database of the peer workers (bench.peer_procrastinate, bench.peer_pgqueuer)
PAYLOAD_BYTES = 100

_lock = threading.Lock()
_out: IO[str] | None = None


def record(key: str, lateness_ms: float) -> None:
    """Append ``key TAB lateness_ms`` to this process's lateness file (opened on first use)."""
    global _out
    line = f"{key}\t{lateness_ms:.3f}\n"
    with _lock:  # handlers run in several threads of the worker's pool
        if _out is None:
            _out = open(os.environ[LATENESS_FILE_ENV], "a", encoding="utf-8")  # open for the life of the process
        _out.write(line)
        _out.flush()


def latency_payload(key: str, due: float) -> bytes:
    """The payload of a latency job: its key and due time (epoch seconds), padded to PAYLOAD_BYTES."""
    return f"{key}|{due:.6f}|".encode().ljust(PAYLOAD_BYTES, b".")


def record_payload(payload: bytes, started: float) -> None:
    """Record the lateness of the job whose latency_payload is `payload`, started at `started`."""
    key, due, _ = payload.split(b"|", 2)
    record(key.decode(), (started - float(due)) * 1e3)


def lateness(message: Any) -> None:
    """Record when this delivery's handler started, relative to when the message was due."""
    started = time.time()
    record(message.key, (started - message.scheduled_at.timestamp()) * 1e3)


def due_lateness(message: Any) -> None:
    """Record when this delivery's handler started, relative to the due time in its payload."""
    record_payload(message.raw_payload, time.time())


async def due_lateness_async(message: Any) -> None:
    """:func:`due_lateness` as a coroutine (``--async``)."""
    record_payload(message.raw_payload, time.time())


def noop(message: Any) -> None:
    """Do nothing: the message is acknowledged."""


async def noop_async(message: Any) -> None:
    """Do nothing, as a coroutine (for ``pyqueue worker --async``)."""
