"""The queue libraries bench.peers compares, behind one interface: how each is installed, emptied
between runs, fed (enqueue one by one or in batches, a backlog in one transaction, the latency
jobs) and how its worker processes are started and known to be ready.

* :class:`Library`, with :class:`PgDelayQ` and :class:`Baseline` (bench.lib.sides' two sides, in
  databases of bench.lib.database's ``create_database``), :class:`Procrastinate` (its App in
  bench.peer_procrastinate) and :class:`PgQueuer` (its factory in bench.peer_pgqueuer), in
  :data:`LIBRARIES`;
* :class:`Contender`: one worker configuration measured, :class:`PeerWorkers`: a peer's worker
  processes, :class:`Meter`: a timed enqueue run and the CPU it took.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from bench.handlers import DSN_ENV, LATENESS_FILE_ENV, latency_payload
from bench.lib.cpu import CpuSnapshot
from bench.lib.database import create_database, prepare_table, recreate_database
from bench.lib.report import PROJECT
from bench.lib.sides import BASELINE, DQ, PAYLOAD, QUEUE, Side, connect, offer_many_step, offer_step, value
from bench.lib.workers import READY_TIMEOUT_S, Workers

PEER_SETTLE_S = 1.5  # after a peer's workers are connected: the rest of their start-up (LISTEN, first poll)
T = TypeVar("T")
PAD = "x" * 60  # procrastinate's job arguments: key, due and this, about 100 bytes of JSON like the others


@dataclass(frozen=True)
class Contender:
    """One worker configuration measured in the processing and latency parts."""

    key: str
    label: str
    library: str
    setting: str  # how its workers run, for the report


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
