"""The ``pyqueue`` command line as a user runs it (a real ``python -m pyqueue`` process), and what an
offer it made stored, for the command-line tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
from workerhandlers import HANG_S


def cli(dsn: str | None, *args: str, columns: int | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``pyqueue ARGS --dsn DSN`` (no ``--dsn`` when ``dsn`` is None) in a new process, with the
    terminal width ``columns`` when given; its exit status and output, as text."""
    env = dict(os.environ)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "pyqueue", *args, *(["--dsn", dsn] if dsn else [])],
                          capture_output=True, text=True, timeout=HANG_S, env=env, cwd=cwd)


def stored(conn: psycopg.Connection, queue: str, key: str) -> tuple[str, bytes] | None:
    """(payload_type, payload) of the message ``key`` of ``queue``, or None when there is none."""
    row = conn.execute("SELECT payload_type, payload FROM dq_messages WHERE queue = %s AND key = %s",
                       (queue, key)).fetchone()
    return None if row is None else (row[0], bytes(row[1]))
