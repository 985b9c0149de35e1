"""The pgqueuer side of bench.peers: the factory its workers run (``pgq run
bench.peer_pgqueuer:main``), as pgqueuer's quick start shows: one asyncpg connection,
``PgQueuer.from_asyncpg_connection``, async entrypoints. The connection string comes from
``$BENCH_PEERS_DSN``.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.models import Job

from bench.handlers import DSN_ENV, record_payload

APPLICATION_NAME = "bench.peer_pgqueuer"



@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    # application_name only lets bench.peers see that the worker is connected.
    connection = await asyncpg.connect(os.environ[DSN_ENV], server_settings={"application_name": APPLICATION_NAME})
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Do nothing (the backlog's job)."""

    @pgq.entrypoint("lateness")
    async def lateness(job: Job) -> None:
        """Record when this job started, relative to the due time in its payload."""
        assert job.payload is not None
        record_payload(job.payload, time.time())

    yield pgq


def _main() -> None:
    """``python -m bench.peer_pgqueuer [--batch-size N]``: ``pgqueuer.run`` (the documented
    programmatic equivalent of ``pgq run bench.peer_pgqueuer:main``; the ``pgq run`` command of
    pgqueuer 1.6.0 fails at start with typer 0.29: its ``--log-level`` parser hands the logger
    setup a str where a LogLevel is expected)."""
    import argparse
    import asyncio

    import pgqueuer

    parser = argparse.ArgumentParser(prog="python -m bench.peer_pgqueuer")
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(pgqueuer.run("bench.peer_pgqueuer:main", batch_size=args.batch_size))


if __name__ == "__main__":
    _main()
