"""Handlers for the worker benchmark (bench.latency), run by `pyqueue worker` processes as
``bench.handlers:<name>`` (the driver starts them with the project folder as cwd).

They do as little as possible, so that what is measured is the worker and the queue:

* :func:`lateness` appends one line per delivery, ``<key> TAB <lateness ms>``, to the file named
  by ``$BENCH_LATENESS_FILE`` (one file per worker process), flushed per line; lateness is the
  handler's start (``time.time()``) minus the message's ``scheduled_at``. The driver runs on the
  same host as the database server, so both read the same wall clock.
* :func:`noop` returns at once; :func:`noop_async` is the same as a coroutine (``--async``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO, Any

LATENESS_FILE_ENV = "BENCH_LATENESS_FILE"

_lock = threading.Lock()
_out: IO[str] | None = None


def lateness(message: Any) -> None:
    """Record when this delivery's handler started, relative to when the message was due."""
    started = time.time()
    global _out
    line = f"{message.key}\t{(started - message.scheduled_at.timestamp()) * 1e3:.3f}\n"
    with _lock:  # the handler runs in several threads of the worker's pool
        if _out is None:
            _out = open(os.environ[LATENESS_FILE_ENV], "a", encoding="utf-8")  # open for the life of the process
        _out.write(line)
        _out.flush()


def noop(message: Any) -> None:
    """Do nothing: the message is acknowledged."""


async def noop_async(message: Any) -> None:
    """Do nothing, as a coroutine (for ``pyqueue worker --async``)."""
