"""The procrastinate side of bench.peers: the App its workers run (``procrastinate --app
bench.peer_procrastinate.app worker …``) and the tasks the driver defers.

Set up as procrastinate's documentation shows: an :class:`procrastinate.App` over a
:class:`procrastinate.PsycopgConnector` (its default pool), async tasks, and the worker run by the
``procrastinate worker`` command. The connection string comes from ``$BENCH_PEERS_DSN``.
"""

from __future__ import annotations

import os
import time

import procrastinate

from bench.handlers import DSN_ENV, record

QUEUE = "bench"

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(DSN_ENV, "")))


@app.task(name="noop", queue=QUEUE)
async def noop(key: str, due: float, pad: str) -> None:
    """Do nothing (the backlog's job)."""


@app.task(name="lateness", queue=QUEUE)
async def lateness(key: str, due: float, pad: str) -> None:
    """Record when this job started, relative to the due time it was deferred with."""
    record(key, (time.time() - due) * 1e3)
