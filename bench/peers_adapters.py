"""Peers benchmark: pgdelayq beside procrastinate, pgqueuer and the plain-SQL baseline, on one server.

    python -m bench.peers --dsn postgresql://postgres@127.0.0.1:55432/dq [--quick] [--out PATH]

The same work for every queue, in one run, each library in a database of its own on the server
of ``--dsn`` (``peers_pgdelayq``, ``peers_procrastinate``, ``peers_pgqueuer``, ``peers_baseline``,
dropped and recreated at every run, each installed the way its documentation says):

1. Enqueue: ``jobs`` jobs (100,000) from one producer, one job per call, then in batches of
   1,000 with the library's batch call (``DelayedQueue.offer_many``, procrastinate's
   ``batch_defer_async``, pgqueuer's ``Queries.enqueue`` with lists; the baseline runs the
   BASELINE offer and offer_many statements of bench.lib.sides on ``bench_baseline``). jobs/s, and the CPU time of
   the producer and of the database's backends per job.
2. Processing: a backlog of ``jobs`` due no-op jobs is committed in one transaction while 1, 4
   and 16 worker processes wait idle; jobs/s from the commit until the queue is empty (counted
   every 50 ms), as bench.latency measures it (ours and the baseline are run_workers_side and
   run_baseline_side of bench.lib.workers, as there). Worker processes: ``python -m pyqueue
   worker`` (sync and ``--async``), ``procrastinate worker`` and pgqueuer's ``run`` (see
   bench.peer_procrastinate, bench.peer_pgqueuer), each with its library's recommended in-process
   concurrency.
3. Latency with idle workers (4 processes): ``now_jobs`` jobs due now, offered one by one at
   ``now_rate`` per second (handler start − the producer's clock before the call), and
   ``delayed_jobs`` jobs due evenly 1-10 s ahead, offered at once (handler start − due time).

A timed run stops after ``cap_s`` seconds even if work is left (a slow library would otherwise
take most of an hour); its rate is then what was done in that time, marked as capped.

Everything measured also records the CPU the workers / producer and the database's backends used
(bench.lib.cpu), and how much CPU other processes on the host took meanwhile.
Results: the full report in ``bench/results/raw/peers-<UTC time>.json``, its summary in
``bench/results/peers.json`` (``peers-quick.json`` for --quick; with ``--out x.json``, to x.json and
x.summary.json instead), and, for a full run, ``docs/performance.md`` (regenerated from the summary's
figures; its notes section is kept) and ``docs/performance.png``.
Every worker process started is stopped (SIGTERM, then SIGKILL), also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import itertools
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from bench.handlers import DSN_ENV, LATENESS_FILE_ENV, latency_payload
from bench.lib.cpu import CpuSnapshot, Window
from bench.lib.database import (
    create_database,
    drain_until,
    prepare_table,
    recreate_database,
    server_info,
    source_info,
    xacts,
)
from bench.lib.report import PROJECT, arguments, console, machine_info, percentile, publish, rich_table, without
from bench.lib.sides import BASELINE, DQ, PAYLOAD, QUEUE, Side, connect, offer_many_step, offer_step, value
from bench.lib.workers import (
    READY_TIMEOUT_S,
    STATS_SETTLE_S,
    Drain,
    Workers,
    interrupt_on_sigterm,
    run_baseline_side,
    run_workers_side,
)

if TYPE_CHECKING:
    from rich.table import Table

DOCS = PROJECT / "docs"
NOTES_START = "<!-- notes: kept when bench.peers regenerates this file -->"
NOTES_END = "<!-- end of notes -->"
PEER_SETTLE_S = 1.5  # after a peer's workers are connected: the rest of their start-up (LISTEN, first poll)
LATENCY_SLACK_S = 30.0  # how long after the last due time the handlers may still report
DELAY_STEP_S = 0.1  # due times of the delayed latency jobs are multiples of this (procrastinate batches by time)
T = TypeVar("T")
PAD = "x" * 60  # procrastinate's job arguments: key, due and this, about 100 bytes of JSON like the others


@dataclass(frozen=True)
class Config:
    mode: str
    jobs: int  # enqueued per enqueue run, and the backlog of every processing run
    cap_s: float  # the longest a timed run (enqueue, processing) may take
    workers: tuple[int, ...]  # worker processes of the processing runs
    now_jobs: int
    now_rate: float  # jobs due now offered per second
    delayed_jobs: int
    delayed_from_s: float
    delayed_to_s: float
    enqueue_batch: int = 1000
    latency_workers: int = 4
    dq_concurrency: int = 100  # pyqueue worker --concurrency / --batch-size (bench.latency's throughput flags)
    dq_batch: int = 100
    procrastinate_concurrency: int = 30  # procrastinate worker --concurrency (its docs' example)
    pgqueuer_batches: tuple[int, ...] = (10, 100)  # run(batch_size=): the default, and the tuning guide's larger one


FULL = Config("full", jobs=100_000, cap_s=60.0, workers=(1, 4, 16), now_jobs=1000, now_rate=100.0,
              delayed_jobs=1000, delayed_from_s=1.0, delayed_to_s=10.0)
QUICK = Config("quick", jobs=5_000, cap_s=6.0, workers=(1, 4), now_jobs=100, now_rate=100.0,
               delayed_jobs=100, delayed_from_s=1.0, delayed_to_s=2.0, pgqueuer_batches=(100,))


@dataclass(frozen=True)
class Contender:
    """One worker configuration measured in the processing and latency parts."""

    key: str
    label: str
    library: str
    setting: str  # how its workers run, for the report


def contenders(cfg: Config) -> list[Contender]:
    dq_flags = f"--concurrency {cfg.dq_concurrency} --batch-size {cfg.dq_batch}"
    return [
        Contender("dq-sync", "pgdelayq (sync worker)", "pgdelayq", f"pyqueue worker {dq_flags}"),
        Contender("dq-async", "pgdelayq (--async worker)", "pgdelayq", f"pyqueue worker --async {dq_flags}"),
        Contender("procrastinate", "procrastinate", "procrastinate",
                  f"procrastinate worker --concurrency {cfg.procrastinate_concurrency} --delete-jobs always"),
        *(Contender(f"pgqueuer-b{b}", f"pgqueuer (batch {b})", "pgqueuer",
                    f"pgqueuer.run(batch_size={b})" + (" (default)" if b == 10 else ""))
          for b in cfg.pgqueuer_batches),
    ]


BASELINE_CONTENDER = Contender("baseline", "baseline (plain SQL)", "baseline",
                               "bench.core BASELINE poll + ack, batch 100, one client process per worker")


# --------------------------------------------------------------------------- worker processes


@dataclass
class PeerWorkers(Workers):
    """A peer library's worker processes (``flags`` is the whole command after the Python
    interpreter); ready when ``ready_sql`` counts at least one session per worker in the
    database, plus PEER_SETTLE_S. Stopped like ours: SIGTERM, then SIGKILL."""

    ready_sql: str = ""
    ready_params: tuple[Any, ...] = ()

    def command(self) -> list[str]:
        return [sys.executable, *self.flags]

    def wait_ready(self, admin: psycopg.Connection[Any], timeout: float = READY_TIMEOUT_S) -> float:
        deadline = time.monotonic() + timeout
        while True:
            for w in self.procs:
                if w.proc.poll() is not None:
                    raise RuntimeError(f"{self.label}: a worker exited with {w.proc.returncode}:\n{w.text()[-3000:]}")
            ready = value(admin, self.ready_sql, self.ready_params or None)
            if ready >= self.count:
                time.sleep(PEER_SETTLE_S)
                return time.perf_counter() - self.procs[0].started
            if time.monotonic() > deadline:
                logs = "\n".join(w.text()[-1000:] for w in self.procs)
                raise RuntimeError(f"{self.label}: {ready}/{self.count} connected after {timeout:.0f} s\n{logs}")
            time.sleep(0.1)


# --------------------------------------------------------------------------- the libraries


def _reset(conn: psycopg.Connection[Any], tables: tuple[str, ...]) -> None:
    """Empty `tables`, VACUUM ANALYZE them and CHECKPOINT (bench.lib.database's prepare_table for peers)."""
    conn.execute(sql.SQL("TRUNCATE {} CASCADE").format(sql.SQL(", ").join(sql.Identifier(t) for t in tables)))
    for t in tables:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(t)))
    conn.execute("CHECKPOINT")


def _recreate(admin_dsn: str, name: str) -> str:
    """(Re)create the empty database `name`; its DSN as a URL (asyncpg takes no other form)."""
    params = conninfo_to_dict(recreate_database(admin_dsn, name))
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(str(password), safe='')}@" if password is not None else (f"{user}@" if user else "")
    host, port, dbname = params.pop("host", ""), params.pop("port", ""), params.pop("dbname")
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{auth}{host}{f':{port}' if port else ''}/{quote(str(dbname))}{query}"


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    out = subprocess.run(cmd, cwd=PROJECT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")


def peer_env(dsn: str, lateness_dir: Path | None) -> dict[str, str]:
    """A peer worker's environment: its database (bench.peer_*), and in the latency part its lateness
    file (worker{i}.tsv in `lateness_dir`)."""
    env = {DSN_ENV: dsn}
    if lateness_dir is not None:
        env[LATENESS_FILE_ENV] = str(lateness_dir / "worker{i}.tsv")
    return env


def _pace(i: int, t0: float, rate: float) -> float:
    """Seconds to wait until the i-th offer of a steady `rate` per second that began at t0."""
    return max(t0 + i / rate - time.perf_counter(), 0.0)


def _delays(cfg: Config) -> list[float]:
    """The delayed latency jobs' delays: evenly from delayed_from_s to delayed_to_s, in DELAY_STEP_S steps."""
    n, lo, hi = cfg.delayed_jobs, cfg.delayed_from_s, cfg.delayed_to_s
    return [round((lo + (hi - lo) * i / max(n - 1, 1)) / DELAY_STEP_S) * DELAY_STEP_S for i in range(n)]


def _arun(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, but Ctrl-C interrupts it at once: asyncio's own SIGINT handling only cancels
    the main task, and a library that swallows the cancellation lets the run go on (seen with
    procrastinate). SIGTERM already raises KeyboardInterrupt (bench.lib.workers.interrupt_on_sigterm)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        return asyncio.run(coro)
    finally:
        signal.signal(signal.SIGINT, previous)


class Library:
    """How one queue library is installed, fed and run."""

    name = ""
    db = ""
    tables: tuple[str, ...] = ()
    table = ""  # the table whose row count is the work left
    enqueue_api = ("", "")  # (single, batched) calls, for the report

    def setup(self, admin_dsn: str) -> str:
        raise NotImplementedError

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        _reset(conn, self.tables)

    def enqueue(self, dsn: str, batch: int, meter: Meter) -> None:
        """Enqueue jobs `batch` per call (1: one call each) while `meter.running`, between
        `meter.start()` and `meter.stop()`, with the connections open."""
        raise NotImplementedError

    def fill(self, dsn: str, n: int, before_commit: Callable[[], None]) -> float:
        """`n` due no-op jobs in ONE transaction; `before_commit` runs just before the commit.
        Returns time.perf_counter() right after the commit."""
        raise NotImplementedError

    def workers(self, dsn: str, c: Contender, count: int, workdir: Path, label: str,
                lateness_dir: Path | None) -> Workers:
        raise NotImplementedError

    def offer_now(self, dsn: str, prefix: str, n: int, rate: float) -> None:
        """Offer `n` latency jobs due now, one by one at `rate` per second."""
        raise NotImplementedError

    def offer_delayed(self, dsn: str, prefix: str, delays: list[float]) -> None:
        """Offer latency jobs due `delays` seconds ahead, at once."""
        raise NotImplementedError


class Meter:
    """A timed run of up to `n` jobs and `cap_s` seconds: the libraries call start(), loop while
    running(done) and call stop(done) with their connections still open (a backend that exits
    takes its CPU time along); then `cpu` holds the CPU seconds of this process (the producer) and
    of the database's backends, and the share of the host other processes took (CpuSnapshot)."""

    def __init__(self, db_name: str, n: int, cap_s: float) -> None:
        self.db_name, self.n, self.cap_s = db_name, n, cap_s
        self.done, self.elapsed_s, self.t0 = 0, 0.0, 0.0
        self.cpu: dict[str, float] = {}
        self._snap: CpuSnapshot | None = None

    def start(self) -> None:
        self._snap, self.t0 = CpuSnapshot.take(os.getpid(), self.db_name), time.perf_counter()

    def running(self, done: int) -> bool:
        return done < self.n and time.perf_counter() - self.t0 < self.cap_s

    def stop(self, done: int) -> None:
        self.done, self.elapsed_s = done, time.perf_counter() - self.t0
        assert self._snap is not None
        after = CpuSnapshot.take(os.getpid(), self.db_name)
        self.cpu = {**self._snap.until(after, self.elapsed_s), "client_cpu_s": after.clients_s - self._snap.clients_s}

    def loop(self, step: Callable[[], int]) -> None:
        """start(), step() while running, stop(): for synchronous producers."""
        done = 0
        self.start()
        while self.running(done):
            done += step()
        self.stop(done)


class OnSide(Library):
    """Ours or the baseline: a database of bench.lib.database's create_database, the side's table
    emptied by its prepare_table."""

    side: Side

    def setup(self, admin_dsn: str) -> str:
        return create_database(admin_dsn, self.db)

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        prepare_table(conn, self.side)


class PgDelayQ(OnSide):
    name = "pgdelayq"
    db = "peers_pgdelayq"
    side = DQ
    table = DQ.table
    enqueue_api = ("DelayedQueue.offer", "DelayedQueue.offer_many")

    def enqueue(self, dsn: str, batch: int, meter: Meter) -> None:
        from pyqueue import DelayedQueue

        keys = (f"e-{i:09d}" for i in itertools.count())
        with DelayedQueue(dsn, QUEUE, pool_size=1) as q:

            def one() -> int:
                q.offer(next(keys), PAYLOAD)
                return 1

            def many() -> int:
                return len(q.offer_many([(next(keys), PAYLOAD) for _ in range(batch)]))

            q.offer("warm-up", PAYLOAD)  # the pool's first connection is open before the clock starts
            meter.loop(one if batch == 1 else many)

    def workers(self, dsn: str, c: Contender, count: int, workdir: Path, label: str,
                lateness_dir: Path | None) -> Workers:
        use_async = c.key == "dq-async"
        if lateness_dir is None:
            handler = "bench.handlers:noop_async" if use_async else "bench.handlers:noop"
        else:
            handler = "bench.handlers:due_lateness_async" if use_async else "bench.handlers:due_lateness"
        flags = c.setting.split()[2:]  # after "pyqueue worker"
        env = {} if lateness_dir is None else {LATENESS_FILE_ENV: str(lateness_dir / "worker{i}.tsv")}
        return Workers(dsn, handler, count, tuple(flags), workdir, label, env=env)

    def offer_now(self, dsn: str, prefix: str, n: int, rate: float) -> None:
        from pyqueue import DelayedQueue

        with DelayedQueue(dsn, QUEUE, pool_size=1) as q:
            t0 = time.perf_counter()
            for i in range(n):
                time.sleep(_pace(i, t0, rate))
                key = f"{prefix}{i:06d}"
                q.offer(key, latency_payload(key, time.time()))

    def offer_delayed(self, dsn: str, prefix: str, delays: list[float]) -> None:
        from pyqueue import DelayedQueue, OfferRequest

        with DelayedQueue(dsn, QUEUE, pool_size=1) as q:
            base = time.time()
            items = []
            for i, d in enumerate(delays):
                key, due = f"{prefix}{i:06d}", base + d
                items.append(OfferRequest(key, latency_payload(key, due), at=datetime.fromtimestamp(due, UTC)))
            q.offer_many(items)


class Baseline(OnSide):
    name = "baseline"
    db = "peers_baseline"
    side = BASELINE
    table = BASELINE.table
    enqueue_api = ("BASELINE.offer (INSERT … ON CONFLICT)", "BASELINE.offer_many (INSERT … SELECT unnest)")

    def enqueue(self, dsn: str, batch: int, meter: Meter) -> None:
        with connect(dsn) as conn:
            step = offer_step(conn, BASELINE, 0, 1) if batch == 1 else offer_many_step(conn, BASELINE, 0, batch)
            meter.loop(lambda: step() or 0)


class Procrastinate(Library):
    name = "procrastinate"
    db = "peers_procrastinate"
    tables = ("procrastinate_jobs", "procrastinate_events", "procrastinate_workers")
    table = "procrastinate_jobs"
    enqueue_api = ("task.defer_async", "task.batch_defer_async")

    @staticmethod
    @asynccontextmanager
    async def opened(dsn: str) -> AsyncIterator[Any]:
        """bench.peer_procrastinate's app, on `dsn`, opened."""
        import procrastinate

        from bench.peer_procrastinate import app

        with app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn)):
            async with app.open_async():
                yield app

    def setup(self, admin_dsn: str) -> str:
        dsn = _recreate(admin_dsn, self.db)
        _run([sys.executable, "-m", "procrastinate", "--app", "bench.peer_procrastinate.app", "schema", "--apply"],
             env=dict(os.environ, **{DSN_ENV: dsn}))
        return dsn

    def enqueue(self, dsn: str, batch: int, meter: Meter) -> None:
        from bench.peer_procrastinate import noop

        async def run() -> None:
            async with self.opened(dsn):
                await noop.defer_async(key="warm-up", due=0.0, pad=PAD)  # the pool is open before the clock starts
                done = 0
                meter.start()
                while meter.running(done):
                    if batch == 1:
                        await noop.defer_async(key=f"e-{done:09d}", due=0.0, pad=PAD)
                        done += 1
                    else:
                        kwargs: list[dict[str, Any]] = [{"key": f"e-{j:09d}", "due": 0.0, "pad": PAD}
                                                         for j in range(done, done + batch)]
                        await noop.batch_defer_async(*kwargs)
                        done += batch
                meter.stop(done)

        _arun(run())

    def fill(self, dsn: str, n: int, before_commit: Callable[[], None]) -> float:
        from bench.peer_procrastinate import noop

        async def run() -> float:
            async with self.opened(dsn), await psycopg.AsyncConnection.connect(dsn) as conn:
                task = noop.configure(connection=conn)  # the documented in-transaction defer
                for lo in range(0, n, 10_000):
                    kwargs: list[dict[str, Any]] = [{"key": f"b-{i:09d}", "due": 0.0, "pad": PAD}
                                                     for i in range(lo, min(lo + 10_000, n))]
                    await task.batch_defer_async(*kwargs)
                before_commit()
                await conn.commit()
                return time.perf_counter()

        return _arun(run())

    def workers(self, dsn: str, c: Contender, count: int, workdir: Path, label: str,
                lateness_dir: Path | None) -> Workers:
        env = peer_env(dsn, lateness_dir)
        flags = ("-m", "procrastinate", "--app", "bench.peer_procrastinate.app", *c.setting.split()[1:])
        return PeerWorkers(dsn, "", count, flags, workdir, label, env=env,
                           ready_sql="SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                     " AND query LIKE 'LISTEN %procrastinate%'")

    def offer_now(self, dsn: str, prefix: str, n: int, rate: float) -> None:
        from bench.peer_procrastinate import lateness

        async def run() -> None:
            async with self.opened(dsn):
                task = lateness
                t0 = time.perf_counter()
                for i in range(n):
                    await asyncio.sleep(_pace(i, t0, rate))
                    await task.defer_async(key=f"{prefix}{i:06d}", due=time.time(), pad=PAD)

        _arun(run())

    def offer_delayed(self, dsn: str, prefix: str, delays: list[float]) -> None:
        from bench.peer_procrastinate import lateness

        async def run() -> None:
            async with self.opened(dsn):
                task = lateness
                base = time.time()
                groups: dict[float, list[dict[str, Any]]] = {}
                for i, d in enumerate(delays):  # one batch per due time (schedule_at is per batch)
                    groups.setdefault(d, []).append({"key": f"{prefix}{i:06d}", "due": base + d, "pad": PAD})
                for d, kwargs in groups.items():
                    await task.configure(schedule_at=datetime.fromtimestamp(base + d, UTC)).batch_defer_async(*kwargs)

        _arun(run())


class PgQueuer(Library):
    name = "pgqueuer"
    db = "peers_pgqueuer"
    tables = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")
    table = "pgqueuer"
    enqueue_api = ("Queries.enqueue(entrypoint, payload)", "Queries.enqueue([entrypoints], [payloads], [priorities])")

    def setup(self, admin_dsn: str) -> str:
        dsn = _recreate(admin_dsn, self.db)
        pgq = str(Path(sys.executable).with_name("pgq"))
        _run([pgq, "--pg-dsn", dsn, "install"])
        _run([pgq, "--pg-dsn", dsn, "autovac"])  # its performance guide's checklist: run after installing
        return dsn

    @staticmethod
    async def _queries(dsn: str) -> tuple[Any, Any]:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(dsn)
        return conn, Queries(AsyncpgDriver(conn))

    def enqueue(self, dsn: str, batch: int, meter: Meter) -> None:
        async def run() -> None:
            conn, q = await self._queries(dsn)
            try:
                done = 0
                meter.start()
                while meter.running(done):
                    if batch == 1:
                        await q.enqueue("noop", PAYLOAD)
                        done += 1
                    else:
                        await q.enqueue(["noop"] * batch, [PAYLOAD] * batch, [0] * batch)
                        done += batch
                meter.stop(done)
            finally:
                await conn.close()

        return _arun(run())

    def fill(self, dsn: str, n: int, before_commit: Callable[[], None]) -> float:
        async def run() -> float:
            conn, q = await self._queries(dsn)
            try:
                tx = conn.transaction()
                await tx.start()
                for lo in range(0, n, 10_000):
                    b = min(lo + 10_000, n) - lo
                    await q.enqueue(["noop"] * b, [PAYLOAD] * b, [0] * b)
                before_commit()
                await tx.commit()
                return time.perf_counter()
            finally:
                await conn.close()

        return _arun(run())

    def workers(self, dsn: str, c: Contender, count: int, workdir: Path, label: str,
                lateness_dir: Path | None) -> Workers:
        from bench.peer_pgqueuer import APPLICATION_NAME

        env = peer_env(dsn, lateness_dir)
        batch = c.key.removeprefix("pgqueuer-b")
        return PeerWorkers(dsn, "", count, ("-m", "bench.peer_pgqueuer", "--batch-size", batch), workdir, label,
                           env=env, ready_sql="SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                             " AND application_name = %s", ready_params=(APPLICATION_NAME,))

    def offer_now(self, dsn: str, prefix: str, n: int, rate: float) -> None:
        async def run() -> None:
            conn, q = await self._queries(dsn)
            try:
                t0 = time.perf_counter()
                for i in range(n):
                    await asyncio.sleep(_pace(i, t0, rate))
                    key = f"{prefix}{i:06d}"
                    await q.enqueue("lateness", latency_payload(key, time.time()))
            finally:
                await conn.close()

        _arun(run())

    def offer_delayed(self, dsn: str, prefix: str, delays: list[float]) -> None:
        async def run() -> None:
            conn, q = await self._queries(dsn)
            try:
                async with conn.transaction():
                    # execute_after is relative to the database's now(), the same in the whole transaction
                    base = float(await conn.fetchval("SELECT extract(epoch FROM now())::float8"))
                    keys = [f"{prefix}{i:06d}" for i in range(len(delays))]
                    await q.enqueue(["lateness"] * len(delays),
                                    [latency_payload(k, base + d) for k, d in zip(keys, delays, strict=True)],
                                    [0] * len(delays), [timedelta(seconds=d) for d in delays])
            finally:
                await conn.close()

        _arun(run())


LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (PgDelayQ(), Procrastinate(), PgQueuer(), Baseline())}


# --------------------------------------------------------------------------- measurements


def enqueue_part(dsns: dict[str, str], cfg: Config) -> list[dict[str, Any]]:
    rows = []
    for lib in LIBRARIES.values():
        api = {"single": lib.enqueue_api[0], "batched": lib.enqueue_api[1]}
        row: dict[str, Any] = {"library": lib.name, "api": api}
        for kind, batch in (("single", 1), ("batched", cfg.enqueue_batch)):
            with psycopg.connect(dsns[lib.name], autocommit=True) as admin:
                lib.reset(admin)
            meter = Meter(lib.db, cfg.jobs, cfg.cap_s)
            lib.enqueue(dsns[lib.name], batch, meter)
            done, elapsed, cpu = meter.done, meter.elapsed_s, meter.cpu
            row[kind] = {
                "batch": batch, "jobs": done, "elapsed_s": elapsed, "rows_per_s": done / elapsed,
                "capped": done < cfg.jobs, "client_us_per_row": cpu["client_cpu_s"] * 1e6 / done,
                "server_us_per_row": cpu["server_cpu_s"] * 1e6 / done, "other_cpu": cpu["other_cpu"],
            }
            r = row[kind]
            console().log(f"enqueue {kind:<7} {lib.name:<13} {r['rows_per_s']:>9,.0f} jobs/s ({done:,} in "
                          f"{elapsed:.1f} s{', capped' if r['capped'] else ''})  producer "
                          f"{r['client_us_per_row']:.0f} µs/job  server {r['server_us_per_row']:.0f} µs/job"
                          f"  other CPU {r['other_cpu']:.0%}")
        rows.append(row)
    return rows


def run_peer_side(admin: psycopg.Connection[Any], dsn: str, lib: Library, c: Contender, workers_n: int,
                  cfg: Config, workdir: Path) -> dict[str, Any]:
    """bench.lib.workers' run_workers_side for a peer library: idle workers, a backlog committed at
    once, jobs/s from the commit until the queue is empty (or cap_s)."""
    n = cfg.jobs
    lib.reset(admin)
    workers = lib.workers(dsn, c, workers_n, workdir, f"throughput-{c.key}-{workers_n}", None)
    with workers:
        workers.wait_ready(admin)
        with psycopg.connect(dsn, autocommit=True) as counter:
            window = Window(admin.info.dbname, counter.info.backend_pid)
            committed = lib.fill(dsn, n, before_commit=window.start)
            x0 = xacts(dsn)
            elapsed, left, polls, count_ms = drain_until(counter, lib.table, committed, cfg.cap_s)
            done = n - left
            res: dict[str, Any] = {"elapsed_s": elapsed, "rows_per_s": done / elapsed, "processed": done,
                                   "capped": left > 0, "drain_polls": polls, "count_ms_mean": count_ms,
                                   **window.result(max(done, 1))}
        workers.stop()
    time.sleep(STATS_SETTLE_S)
    # Transactions in the database per job: all since x0, less the reading of x0 and the counts.
    res["xacts_per_row"] = (xacts(dsn) - x0 - 1 - polls) / max(done, 1)
    res["exit_codes"] = workers.codes
    res["worker_warnings"] = workers.warnings()[:20]
    return res


def throughput_part(admins: dict[str, psycopg.Connection[Any]], dsns: dict[str, str], cfg: Config,
                    workdir: Path) -> list[dict[str, Any]]:
    spec = Drain(cfg.jobs, batch_size=cfg.dq_batch, concurrency=cfg.dq_concurrency)
    cells = []
    for workers_n in cfg.workers:
        for c in [*contenders(cfg), BASELINE_CONTENDER]:
            admin, dsn = admins[c.library], dsns[c.library]
            if c.library == "pgdelayq":
                res = run_workers_side(admin, dsn, replace(spec, use_async=c.key == "dq-async"), workers_n, workdir)
                res.update(processed=cfg.jobs, capped=False)
            elif c.library == "baseline":
                res = run_baseline_side(admin, dsn, spec, workers_n)
                res.update(processed=cfg.jobs, capped=False)
            else:
                res = run_peer_side(admin, dsn, LIBRARIES[c.library], c, workers_n, cfg, workdir)
            cells.append({"contender": c.key, "workers": workers_n, **res})
            console().log(
                f"processing {workers_n:>2} workers {c.key:<14} {res['rows_per_s']:>9,.0f} jobs/s "
                f"({res['processed']:,} in {res['elapsed_s']:.1f} s{', capped' if res['capped'] else ''})  "
                f"workers {res['consumer_us_per_row']:.0f} µs/job  server {res['server_us_per_row']:.0f} µs/job  "
                f"{res['xacts_per_row']:.3f} xacts/job  other CPU {res['other_cpu']:.0%}")
    return cells


def _lateness_samples(folder: Path, prefix: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for path in sorted(folder.glob("worker*.tsv")):
        for line in path.read_text().splitlines():
            key, ms = line.split("\t")
            if key.startswith(prefix):
                out.setdefault(key, []).append(float(ms))
    return out


def _wait_recorded(folder: Path, prefix: str, n: int, deadline: float) -> None:
    while time.monotonic() < deadline and len(_lateness_samples(folder, prefix)) < n:
        time.sleep(0.2)


def _lateness_stats(samples: dict[str, list[float]], n: int) -> dict[str, Any]:
    values = sorted(v for vs in samples.values() for v in vs)
    if len(values) < 2:
        return {"jobs": n, "handled": len(samples), "lost": n - len(samples), "duplicates": 0}
    return {
        "jobs": n, "handled": len(samples), "lost": n - len(samples),
        "duplicates": len(values) - len(samples),
        "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
        "max_ms": values[-1], "min_ms": values[0], "mean_ms": statistics.fmean(values),
    }


def latency_part(admins: dict[str, psycopg.Connection[Any]], dsns: dict[str, str], cfg: Config,
                 workdir: Path) -> list[dict[str, Any]]:
    out = []
    delays = _delays(cfg)
    for c in contenders(cfg):
        lib, admin, dsn = LIBRARIES[c.library], admins[c.library], dsns[c.library]
        lib.reset(admin)
        folder = workdir / f"lateness-{c.key}"
        folder.mkdir()
        workers = lib.workers(dsn, c, cfg.latency_workers, workdir, f"latency-{c.key}", folder)
        row: dict[str, Any] = {"contender": c.key, "workers": cfg.latency_workers}
        with workers:
            workers.wait_ready(admin)
            t0 = time.perf_counter()
            lib.offer_now(dsn, "now-", cfg.now_jobs, cfg.now_rate)
            _wait_recorded(folder, "now-", cfg.now_jobs, time.monotonic() + LATENCY_SLACK_S)
            row["now"] = _lateness_stats(_lateness_samples(folder, "now-"), cfg.now_jobs)
            row["now"]["offer_s"] = time.perf_counter() - t0
            lib.offer_delayed(dsn, "del-", delays)
            _wait_recorded(folder, "del-", len(delays), time.monotonic() + cfg.delayed_to_s + LATENCY_SLACK_S)
            row["delayed"] = _lateness_stats(_lateness_samples(folder, "del-"), len(delays))
            workers.stop()
        row["exit_codes"] = workers.codes
        row["worker_warnings"] = workers.warnings()[:20]
        out.append(row)
        console().log(f"latency {c.key:<14} " + "  ".join(
            f"{kind}: p50 {r.get('p50_ms', math.nan):.1f} ms, p99 {r.get('p99_ms', math.nan):.1f} ms, "
            f"max {r.get('max_ms', math.nan):.1f} ms, {r['handled']}/{r['jobs']} handled, {r['duplicates']} dup"
            for kind, r in (("due now", row["now"]), ("due 1-10 s", row["delayed"]))))
    return out


# --------------------------------------------------------------------------- verdicts


#: Processing targets against the plain-SQL baseline at the same process count: one --async worker
#: process ≥ 70% of one baseline client, more processes ≥ 90%; the sync worker ≥ 80% of the async one.
BASELINE_TARGET_ONE = 0.70
BASELINE_TARGET_MANY = 0.90
SYNC_VS_ASYNC_TARGET = 0.80


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The targets: processed throughput ≥ 2× the best peer (ours: the faster of our
    configurations, per worker count) and against the baseline (BASELINE_TARGET_ONE / _MANY, the
    --async worker at 1 process, the faster of ours beyond), the sync worker against the async one
    (SYNC_VS_ASYNC_TARGET), batched enqueue ≥ 70% of the baseline."""
    by_key = {c["key"]: c for c in result["contenders"]}
    out: dict[str, Any] = {"throughput": [], "baseline": [], "sync": [], "enqueue": None}
    for n in sorted({cell["workers"] for cell in result["throughput"]}):
        cells = [cell for cell in result["throughput"] if cell["workers"] == n]
        by_contender = {x["contender"]: x for x in cells}
        base = next((x for x in cells if by_key[x["contender"]]["library"] == "baseline"), None)
        sync, aio = by_contender.get("dq-sync"), by_contender.get("dq-async")
        ours = max((x for x in cells if by_key[x["contender"]]["library"] == "pgdelayq"),
                   key=lambda x: x["rows_per_s"], default=None)
        if base is not None and ours is not None:
            measured = aio if n == 1 and aio is not None else ours
            target = BASELINE_TARGET_ONE if n == 1 else BASELINE_TARGET_MANY
            ratio = measured["rows_per_s"] / base["rows_per_s"]
            out["baseline"].append({"workers": n, "ours": measured["contender"],
                                    "ours_rows_per_s": measured["rows_per_s"],
                                    "baseline_rows_per_s": base["rows_per_s"],
                                    "ratio": ratio, "target": target, "pass": ratio >= target})
        if sync is not None and aio is not None:
            ratio = sync["rows_per_s"] / aio["rows_per_s"]
            out["sync"].append({"workers": n, "sync_rows_per_s": sync["rows_per_s"],
                                "async_rows_per_s": aio["rows_per_s"], "ratio": ratio,
                                "target": SYNC_VS_ASYNC_TARGET, "pass": ratio >= SYNC_VS_ASYNC_TARGET})
        peers = [x for x in cells if by_key[x["contender"]]["library"] in ("procrastinate", "pgqueuer")]
        best = max(peers, key=lambda x: x["rows_per_s"], default=None)
        if ours is None or best is None:
            continue
        ratio = ours["rows_per_s"] / best["rows_per_s"]
        out["throughput"].append({"workers": n, "ours": ours["contender"], "ours_rows_per_s": ours["rows_per_s"],
                                  "best_peer": best["contender"], "best_peer_rows_per_s": best["rows_per_s"],
                                  "ratio": ratio, "target": 2.0, "pass": ratio >= 2.0})
    enq = {r["library"]: r for r in result["enqueue"]}
    if "pgdelayq" in enq and "baseline" in enq:
        ratio = enq["pgdelayq"]["batched"]["rows_per_s"] / enq["baseline"]["batched"]["rows_per_s"]
        out["enqueue"] = {"ratio": ratio, "target": 0.70, "pass": ratio >= 0.70}
    return out


def faster_ours(result: dict[str, Any]) -> str | None:
    """Which of our worker configurations processed more in all (sum of jobs/s over worker counts)."""
    totals: dict[str, float] = {}
    for cell in result["throughput"]:
        if cell["contender"].startswith("dq-"):
            totals[cell["contender"]] = totals.get(cell["contender"], 0.0) + cell["rows_per_s"]
    return max(totals, key=lambda k: totals[k]) if totals else None


# --------------------------------------------------------------------------- report: terminal


def _rate(r: dict[str, Any]) -> str:
    return f"{r['rows_per_s']:,.0f}" + ("†" if r.get("capped") else "")


def _ms(r: dict[str, Any], key: str) -> str:
    return f"{r[key]:,.1f}" if key in r else "–"


def _labels(result: dict[str, Any]) -> dict[str, str]:
    return {c["key"]: c["label"] for c in result["contenders"]}


def enqueue_rows(result: dict[str, Any]) -> list[list[str]]:
    base = next((r for r in result["enqueue"] if r["library"] == "baseline"), None)
    rows = []
    for r in result["enqueue"]:
        s, b = r["single"], r["batched"]
        vs = "–"
        if base:
            vs = (f"{s['rows_per_s'] / base['single']['rows_per_s']:.0%} | "
                  f"{b['rows_per_s'] / base['batched']['rows_per_s']:.0%}")
        rows.append([r["library"], _rate(s), _rate(b), vs,
                     f"{s['client_us_per_row']:.0f} | {s['server_us_per_row']:.0f}",
                     f"{b['client_us_per_row']:.1f} | {b['server_us_per_row']:.1f}"])
    return rows


ENQUEUE_HEADER = ["library", "single jobs/s", "batched jobs/s", "vs baseline single | batched",
                  "single µs/job producer | server", "batched µs/job producer | server"]


def throughput_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    counts = sorted({c["workers"] for c in result["throughput"]})
    labels = _labels(result)
    header = ["configuration", *(f"{n} worker{'s' * (n > 1)} jobs/s" for n in counts)]
    rows = []
    for key, label in labels.items():
        cells = {c["workers"]: c for c in result["throughput"] if c["contender"] == key}
        if cells:
            rows.append([label, *(_rate(cells[n]) if n in cells else "–" for n in counts)])
    return header, rows


def cpu_rows(result: dict[str, Any]) -> list[list[str]]:
    labels = _labels(result)
    rows = []
    for c in sorted(result["throughput"], key=lambda c: (list(labels).index(c["contender"]), c["workers"])):
        rows.append([labels[c["contender"]], str(c["workers"]), _rate(c), f"{c['processed']:,}",
                     f"{c['elapsed_s']:.1f}", f"{c['consumer_us_per_row']:.0f}", f"{c['server_us_per_row']:.0f}",
                     f"{c['xacts_per_row']:.3f}", f"{c['other_cpu']:.0%}"])
    return rows


CPU_HEADER = ["configuration", "workers", "jobs/s", "processed", "seconds", "worker µs/job", "server µs/job",
              "xacts/job", "other CPU"]


def latency_rows(result: dict[str, Any]) -> list[list[str]]:
    labels = _labels(result)
    rows = []
    for r in result["latency"]:
        now, dl = r["now"], r["delayed"]
        rows.append([labels[r["contender"]], _ms(now, "p50_ms"), _ms(now, "p99_ms"), _ms(now, "max_ms"),
                     _ms(dl, "p50_ms"), _ms(dl, "p99_ms"), _ms(dl, "max_ms"),
                     f"{now['lost'] + dl['lost']} | {now['duplicates'] + dl['duplicates']}"])
    return rows


def latency_header(result: dict[str, Any]) -> list[str]:
    c = result["config"]
    span = f"{c['delayed_from_s']:g}–{c['delayed_to_s']:g} s"
    return ["configuration", "due now p50 ms", "p99", "max", f"due in {span} p50 ms", "p99", "max", "lost | dup"]


def target_rows(result: dict[str, Any]) -> list[list[str]]:
    labels, t = _labels(result), result["targets"]
    rows = []
    for x in t["throughput"]:
        rows.append([f"processing, {x['workers']} worker{'s' * (x['workers'] > 1)}: ours ≥ 2× the best peer",
                     f"{labels[x['ours']]} {x['ours_rows_per_s']:,.0f} / {labels[x['best_peer']]} "
                     f"{x['best_peer_rows_per_s']:,.0f} = {x['ratio']:.2f}×", "PASS" if x["pass"] else "MISS"])
    for x in t.get("baseline", []):
        rows.append([f"processing, {x['workers']} worker{'s' * (x['workers'] > 1)}: ours ≥ {x['target']:.0%} of the "
                     "baseline", f"{labels[x['ours']]} {x['ours_rows_per_s']:,.0f} / baseline "
                     f"{x['baseline_rows_per_s']:,.0f} = {x['ratio']:.0%}", "PASS" if x["pass"] else "MISS"])
    for x in t.get("sync", []):
        rows.append([f"processing, {x['workers']} worker{'s' * (x['workers'] > 1)}: sync ≥ {x['target']:.0%} of async",
                     f"{x['sync_rows_per_s']:,.0f} / {x['async_rows_per_s']:,.0f} = {x['ratio']:.0%}",
                     "PASS" if x["pass"] else "MISS"])
    if t["enqueue"]:
        e = t["enqueue"]
        rows.append(["batched enqueue ≥ 70% of the baseline", f"{e['ratio']:.0%}", "PASS" if e["pass"] else "MISS"])
    return rows


def _rich(title: str, header: list[str], rows: list[list[str]], caption: str | None = None) -> Table:
    return rich_table(title, header, ([r.replace("PASS", "[green]PASS[/]").replace("MISS", "[red]MISS[/]") for r in row]
                                      for row in rows), caption=caption, left={header[0]})


def rich_tables(result: dict[str, Any]) -> list[Table]:
    c = result["config"]
    header, rows = throughput_rows(result)
    return [
        _rich(f"Enqueue {c['jobs']:,} jobs, one producer (single: one job per call; batched: "
              f"{c['enqueue_batch']:,} per call)",
              ENQUEUE_HEADER, enqueue_rows(result), "†: stopped by the time cap; the rate is what was done"),
        _rich(f"Processing a backlog of {c['jobs']:,} no-op jobs (jobs/s)", header, rows),
        _rich("Processing: CPU per job", CPU_HEADER, cpu_rows(result)),
        _rich(f"Latency with {c['latency_workers']} idle worker processes (handler start − due time)",
              latency_header(result), latency_rows(result)),
        _rich("Targets", ["target", "figure", ""], target_rows(result)),
    ]


PER_PROCESS = ("functions", "worker_warnings", "exit_codes", "per_worker_delivered", "per_client_rows")


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """What the tables, docs/performance.md and its chart show, with the configuration, machine,
    server and versions measured: without each run's per-function statistics, per-process counts,
    exit codes and log warnings."""
    return {**result, "throughput": [without(c, *PER_PROCESS) for c in result["throughput"]],
            "latency": [without(r, *PER_PROCESS) for r in result["latency"]]}


# --------------------------------------------------------------------------- report: docs


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in header) + " |", rule]
    lines += ["| " + " | ".join(r.replace("|", "\\|") for r in row) + " |" for row in rows]
    return "\n".join(lines)


def _keep_notes(previous: str | None) -> str:
    if previous and NOTES_START in previous and NOTES_END in previous:
        return previous[previous.index(NOTES_START):previous.index(NOTES_END) + len(NOTES_END)]
    return f"{NOTES_START}\n\n(No notes yet.)\n\n{NOTES_END}"


def markdown_report(result: dict[str, Any], json_name: str, previous: str | None = None) -> str:
    """docs/performance.md from a result; the notes section of `previous` (the file's former text) is kept."""
    c, m, s, v = result["config"], result["machine"], result["server"], result["versions"]
    labels = _labels(result)
    header, rows = throughput_rows(result)
    faster = result.get("faster_ours")
    mem = f"{m['mem_total_kb'] / 1024 ** 2:.1f} GiB RAM" if "mem_total_kb" in m else "RAM unknown"
    other = [x["other_cpu"] for x in result["throughput"]] + [
        r[k]["other_cpu"] for r in result["enqueue"] for k in ("single", "batched")]
    settings = ", ".join(f"`{k} = {s[k]}`" for k in s if k != "version")
    setups = "\n".join(f"- **{x['label']}**: " + (x["setting"] if x["library"] == "baseline" else f"`{x['setting']}`")
                       for x in result["contenders"])
    parts = [
        "# Performance: pgdelayq beside procrastinate, pgqueuer and plain SQL",
        "",
        f"Generated by `make bench-peers` (`python -m bench.peers`, mode **{result['mode']}**) on "
        f"{result['timestamp']} in {result['wall_time_s'] / 60:.0f} min; every figure below comes from "
        f"`bench/results/{json_name}`. Do not edit by hand, except the notes section at the end "
        "(kept when the file is regenerated).",
        "",
        "## What was measured",
        "",
        f"One PostgreSQL server, one run; each library in its own database, dropped and recreated per run, "
        f"installed as its documentation says. Payloads of about 100 bytes. Every timed run stops after "
        f"{c['cap_s']:.0f} s even if work is left; its rate is then what it did in that time (marked †).",
        "",
        f"- **Enqueue** {c['jobs']:,} jobs from one producer process: one job per call (and transaction), then "
        f"batches of {c['enqueue_batch']:,} with the library's batch call.",
        f"- **Processing**: a backlog of {c['jobs']:,} due no-op jobs is committed in one transaction while the "
        f"worker processes wait idle; jobs/s from the commit until the queue table is empty (counted every 50 ms).",
        f"- **Latency**: {c['latency_workers']} idle worker processes; {c['now_jobs']:,} jobs due now, offered "
        f"one by one at {c['now_rate']:g}/s (handler start − the producer's clock just before the call), then "
        f"{c['delayed_jobs']:,} jobs due {c['delayed_from_s']:g}–{c['delayed_to_s']:g} s ahead, offered at once "
        "(handler start − due time).",
        "- **Baseline**: bench.core's plain-SQL statements on `bench_baseline` (a copy of `dq_messages`): the most "
        "this server can do for this work (no wake-up protocol, so no latency row).",
        "",
        "Worker configurations (N processes of each, with the library's recommended in-process concurrency):",
        "",
        setups,
        "",
        "![throughput, enqueue and latency](performance.png)",
        "",
        "## Enqueue",
        "",
        markdown_table(ENQUEUE_HEADER, enqueue_rows(result)),
        "",
        "Calls: " + "; ".join(f"{r['library']}: `{r['api']['single']}`, `{r['api']['batched']}`"
                              for r in result["enqueue"]) + ".",
        "",
        "## Processing a backlog",
        "",
        markdown_table(header, rows),
        "",
        "Where the CPU went (worker: the worker processes or baseline clients, and the driver; server: the "
        "database's backends; xacts/job: transactions committed in the database per job, i.e. round trips; "
        "other CPU: share of all cores that processes outside the benchmark took meanwhile):",
        "",
        markdown_table(CPU_HEADER, cpu_rows(result)),
        "",
        "## Latency",
        "",
        markdown_table(latency_header(result), latency_rows(result)),
        "",
        "## Targets",
        "",
        markdown_table(["target", "figure", "verdict"], target_rows(result)),
        "",
        f"Ours counts as the faster of our two worker configurations at each worker count; over all counts the "
        f"faster was **{labels.get(faster or '', 'n/a')}**.",
        "",
        "## Environment",
        "",
        f"- Machine: {m.get('cpu_count')} cores ({m.get('cpu_model', 'model unknown')}), {mem}, {m.get('platform')}.",
        f"- Host load: load average {_loadavg(m.get('load_average'))} before the run, "
        f"{_loadavg(result.get('load_average_after'))} after; other processes took on average "
        f"{statistics.fmean(other) if other else 0:.0%} (at most {max(other, default=0):.0%}) of all cores during "
        "the timed runs.",
        f"- PostgreSQL: {s['version']}",
        f"- Server settings: {settings}.",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        "",
        "## Notes",
        "",
        _keep_notes(previous),
        "",
    ]
    return "\n".join(parts)


def _loadavg(la: Any) -> str:
    return " / ".join(f"{x:.2f}" for x in la) if la else "unknown"


def chart(result: dict[str, Any], path: Path) -> None:
    """docs/performance.png: processing jobs/s by worker count, enqueue jobs/s, latency p50/p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = _labels(result) | {"baseline": BASELINE_CONTENDER.label}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 5.2))
    counts = sorted({c["workers"] for c in result["throughput"]})
    keys = [k for k in labels if any(c["contender"] == k for c in result["throughput"])]
    width = 0.8 / max(len(keys), 1)
    for i, key in enumerate(keys):
        cells = {c["workers"]: c["rows_per_s"] for c in result["throughput"] if c["contender"] == key}
        ax1.bar([j + i * width for j in range(len(counts))], [cells.get(n, 0) for n in counts], width,
                label=labels[key])
    ax1.set_xticks([j + width * (len(keys) - 1) / 2 for j in range(len(counts))],
                   [f"{n} worker{'s' * (n > 1)}" for n in counts])
    ax1.set_ylabel("jobs/s")
    ax1.set_title(f"Processing a backlog of {result['config']['jobs']:,}")
    ax1.legend(fontsize=7)
    libs = [r["library"] for r in result["enqueue"]]
    for i, kind in enumerate(("single", "batched")):
        ax2.bar([j + i * 0.4 for j in range(len(libs))], [r[kind]["rows_per_s"] for r in result["enqueue"]], 0.4,
                label=kind)
    ax2.set_xticks([j + 0.2 for j in range(len(libs))], libs, fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("jobs/s (log)")
    ax2.set_title("Enqueue")
    ax2.legend(fontsize=7)
    lat = result["latency"]
    names = [labels[r["contender"]].replace(" (", "\n(") for r in lat]
    series = (("now", "p50_ms", "due now p50"), ("now", "p99_ms", "due now p99"),
              ("delayed", "p50_ms", "delayed p50"), ("delayed", "p99_ms", "delayed p99"))
    for i, (kind, stat, label) in enumerate(series):
        ax3.bar([j + i * 0.2 for j in range(len(lat))], [max(r[kind].get(stat, 0), 0.01) for r in lat], 0.2,
                label=label)
    ax3.set_xticks([j + 0.3 for j in range(len(lat))], names, fontsize=7)
    ax3.set_yscale("log")
    ax3.set_ylabel("ms (log)")
    ax3.set_title("Latency, idle workers")
    ax3.legend(fontsize=7)
    fig.suptitle(f"bench.peers {result['timestamp']} ({result['machine'].get('cpu_count')} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def versions(server: dict[str, Any]) -> dict[str, str]:
    import pyqueue

    out = {"pgdelayq": pyqueue.__version__, "python": sys.version.split()[0]}
    for dist in ("procrastinate", "pgqueuer", "asyncpg", "psycopg", "psycopg-pool", "matplotlib"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    out["postgresql"] = server["version"].split(" on ")[0].removeprefix("PostgreSQL ")
    return out


def run(admin_dsn: str, cfg: Config, out: Path | None, parts: tuple[str, ...], docs: bool) -> dict[str, Any]:
    started, timestamp = time.perf_counter(), datetime.now(UTC)
    console().log(f"[bold]bench.peers[/] ({cfg.mode}): creating the databases")
    machine = machine_info()
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    dsns = {name: lib.setup(admin_dsn) for name, lib in LIBRARIES.items()}
    admins = {name: psycopg.connect(dsn, autocommit=True) for name, dsn in dsns.items()}
    try:
        with interrupt_on_sigterm():
            server, source = server_info(admins["pgdelayq"]), source_info(admins["pgdelayq"])
            result: dict[str, Any] = {
                "timestamp": timestamp.isoformat(timespec="seconds"), "mode": cfg.mode, "config": asdict(cfg),
                "server": server, "versions": versions(server), "machine": machine, "source": source,
                "databases": {name: lib.db for name, lib in LIBRARIES.items()},
                "contenders": [asdict(c) for c in [*contenders(cfg), BASELINE_CONTENDER]],
                "enqueue": [], "throughput": [], "latency": [],
            }
            if "enqueue" in parts:
                result["enqueue"] = enqueue_part(dsns, cfg)
            if "processing" in parts:
                result["throughput"] = throughput_part(admins, dsns, cfg, workdir)
            if "latency" in parts:
                result["latency"] = latency_part(admins, dsns, cfg, workdir)
    except BaseException:
        console().log(f"[red]failed; worker logs kept in {workdir}[/]")
        raise
    finally:
        for conn in admins.values():
            conn.close()
    shutil.rmtree(workdir, ignore_errors=True)
    result["load_average_after"] = os.getloadavg()
    result["wall_time_s"] = round(time.perf_counter() - started, 1)
    result["targets"] = targets(result)
    result["faster_ours"] = faster_ours(result)
    _, short = publish("peers", result, summary(result), rich_tables(result), out, quick=cfg.mode == "quick",
                       at=timestamp)
    if docs:
        md = DOCS / "performance.md"
        md.write_text(markdown_report(result, short.name, md.read_text() if md.exists() else None))
        chart(result, DOCS / "performance.png")
        console().log(f"written: {md}, {DOCS / 'performance.png'}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.peers", __doc__,
                       quick="smoke test: 5,000 jobs, 1 and 4 workers, 15 s caps, shorter latency runs")
    parser.add_argument("--parts", default="enqueue,processing,latency",
                        help="comma-separated subset of enqueue,processing,latency (development)")
    parser.add_argument("--docs", action=argparse.BooleanOptionalAction, default=None,
                        help="regenerate docs/performance.md and docs/performance.png (default: only without --quick)")
    args = parser.parse_args(argv)
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    unknown = set(parts) - {"enqueue", "processing", "latency"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    docs = (not args.quick) if args.docs is None else args.docs
    run(args.dsn, QUICK if args.quick else FULL, args.out, parts, docs)


if __name__ == "__main__":
    main()
