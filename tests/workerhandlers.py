"""Handlers for the worker tests (imported by `pyqueue worker` subprocesses: module workerhandlers).

Each records what it handled in the table ``handled`` of the database in $DQ_DSN."""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

from pyqueue import Message


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
