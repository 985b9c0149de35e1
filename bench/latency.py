"""Worker benchmark: lateness, idle query rate and throughput of real `pyqueue worker` processes.

    python -m bench.latency --dsn postgresql://postgres@127.0.0.1:55432/dq [--quick] [--out PATH]

Everything runs in one database, ``dq_bench_latency`` (dropped and recreated at every run by
bench.core's create_database: the queue schema installed by ``pyqueue.migrate`` and the
baseline table ``bench_baseline``), on the server of ``--dsn``. The workers are
``python -m pyqueue worker`` processes with handlers from ``bench/handlers.py``.

1. Lateness: 4 workers (default flags) are started and idle (registered as waiting) when 10,000
   messages, scheduled evenly over 30 s on the database clock, are offered with one
   ``dq_offer_many``. The handler writes, per delivery, its start time minus ``scheduled_at`` to
   a file of its process; from those: p50 / p99 / max, handled, duplicates and lost messages.
2. Idle query rate: 4 workers on an empty queue for 20 s (idle_check 5 s), with
   ``track_functions = all`` on their own sessions only: the ``dq_*`` calls they made, read from
   ``pg_stat_user_functions`` after they stopped and their sessions closed.
3. Throughput: 1, 4 and 8 idle workers with a no-op handler; a backlog of 100,000 due messages
   is committed in one transaction, and the time from the commit until the queue is empty
   (``count(*)`` polled every 50 ms) gives messages/s. Beside it, on the same server in the same
   run, the plain-SQL baseline of bench.core (BASELINE's poll + ack on ``bench_baseline``) drains
   the same 100,000 rows with as many client processes and the same batch size.

Every throughput run also records the CPU time of the consumers (workers or baseline clients,
and this driver) and of the database's backends per message, the share of the machine other
processes took (bench.core's CpuSnapshot), and the transactions committed in the database per
message (``pg_stat_database.xact_commit``: in autocommit, one per statement, i.e. round trips).

Workers are always stopped (SIGTERM, then SIGKILL after a timeout), also on errors and when
this driver is interrupted; they also get SIGTERM if the driver dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.core import (
    BASELINE,
    DQ,
    FILL_BATCH,
    PAYLOAD,
    PROJECT,
    QUEUE,
    CpuSnapshot,
    Side,
    connect,
    console,
    create_database,
    poll_ack_step,
    prepare_table,
    provenance,
    server_info,
    value,
)
from bench.handlers import LATENESS_FILE_ENV

if TYPE_CHECKING:
    from rich.table import Table

RESULTS = PROJECT / "bench" / "results"
READY_TIMEOUT_S = 60.0  # workers started -> all ready and waiting
STOP_TIMEOUT_S = 30.0  # SIGTERM -> exited, else SIGKILL
DRAIN_POLL_S = 0.05  # how often the driver counts what is left
STATS_SETTLE_S = 1.5  # closed sessions report their statistics meanwhile
LEAD_S = 1.0  # the first lateness message is due this long after the offer starts (the offer commits first)


@dataclass(frozen=True)
class Config:
    mode: str
    lateness_messages: int
    lateness_span_s: float
    idle_s: float
    backlog: int
    lateness_workers: int = 4
    lateness_target_p99_ms: float = 50.0
    idle_workers: int = 4
    idle_check_s: float = 5.0
    throughput_workers: tuple[int, ...] = (1, 4, 8)
    # A no-op handler: enough handler slots that a poll can take a real batch (the worker polls
    # at most its free slots), and batches of 100 (bench.core's poll+ack x100).
    concurrency: int = 100
    batch_size: int = 100
    use_async: bool = False
    # Diagnostic, off by default: ANALYZE the table right after the backlog's commit (in the
    # measured time, both sides), which invalidates the plans the consumers' sessions cached
    # while the table was empty.
    analyze_backlog: bool = False


FULL = Config("full", lateness_messages=10_000, lateness_span_s=30.0, idle_s=20.0, backlog=100_000)
QUICK = Config("quick", lateness_messages=2_000, lateness_span_s=10.0, idle_s=10.0, backlog=20_000)


# --------------------------------------------------------------------------- worker processes


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the driver dies, whatever kills it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    log: Path
    started: float  # time.perf_counter()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Workers:
    """``pyqueue worker`` processes on QUEUE, run from the project folder (so that
    ``bench.handlers`` imports), each logging to its own file. Use as a context manager: on
    exit, whatever happened, every process is stopped."""

    dsn: str
    handler: str
    count: int
    flags: tuple[str, ...]
    workdir: Path
    label: str
    env: dict[str, str] = field(default_factory=dict)  # extra variables; {i} is the worker's number
    procs: list[WorkerProc] = field(default_factory=list)
    codes: list[int | None] = field(default_factory=list)
    stopped_at: float | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "pyqueue", "worker", "--dsn", self.dsn, "--queue", QUEUE, *self.flags,
                self.handler]

    def __enter__(self) -> Workers:
        try:
            for i in range(self.count):
                log = self.workdir / f"{self.label}-worker{i}.log"
                env = dict(os.environ, **{k: v.format(i=i) for k, v in self.env.items()})
                with log.open("wb") as out:
                    proc = subprocess.Popen(
                        self.command(), cwd=PROJECT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                    )
                self.procs.append(WorkerProc(proc, log, time.perf_counter()))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, admin: psycopg.Connection[Any], timeout: float = READY_TIMEOUT_S) -> float:
        """Wait until every worker logged "worker ready" and waits on the queue (its session is
        registered in dq_waiters: it has polled, found nothing and sleeps on LISTEN). Returns the
        seconds it took from the first start."""
        deadline = time.monotonic() + timeout
        while True:
            for w in self.procs:
                if w.proc.poll() is not None:
                    raise RuntimeError(f"{self.label}: a worker exited with {w.proc.returncode}:\n{w.text()[-3000:]}")
            ready = sum("worker ready" in w.text() for w in self.procs)
            waiting = value(
                admin,
                "SELECT count(DISTINCT w.pid) FROM dq_waiters w JOIN pg_stat_activity a ON a.pid = w.pid"
                " WHERE w.queue = %s AND a.datname = current_database()",
                (QUEUE,),
            )
            if ready == self.count and waiting >= self.count:
                return time.perf_counter() - self.procs[0].started
            if time.monotonic() > deadline:
                logs = "\n".join(w.text()[-1000:] for w in self.procs)
                raise RuntimeError(
                    f"{self.label}: {ready}/{self.count} ready, {waiting} waiting after {timeout:.0f} s\n{logs}")
            time.sleep(0.1)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> list[int | None]:
        """SIGTERM every worker, wait up to `timeout` in all, SIGKILL those still running.
        Idempotent; returns the exit codes (negative: killed by that signal)."""
        if self.stopped_at is None:
            self.stopped_at = time.perf_counter()
        for w in self.procs:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for w in self.procs:
            try:
                w.proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                console().log(f"[red]{self.label}: worker {w.proc.pid} still running {timeout:.0f} s after SIGTERM;"
                              " killing it[/]")
                w.proc.kill()
                w.proc.wait(10)
        self.codes = [w.proc.returncode for w in self.procs]
        return self.codes

    def check_clean_exit(self) -> None:
        bad = [(w.proc.pid, w.proc.returncode) for w in self.procs if w.proc.returncode != 0]
        if bad:
            raise RuntimeError(f"{self.label}: workers did not exit cleanly: {bad}\n{self.procs[0].text()[-3000:]}")

    def stats(self) -> list[dict[str, Any]]:
        """Each worker's own counters, from its "worker stopped: {...}" log line."""
        out = []
        for w in self.procs:
            line = next((ln for ln in w.text().splitlines() if "worker stopped: " in ln), None)
            out.append(ast.literal_eval(line.split("worker stopped: ", 1)[1]) if line else {})
        return out

    def warnings(self) -> list[str]:
        return [ln for w in self.procs for ln in w.text().splitlines() if " WARNING " in ln or " ERROR " in ln]


def worker_flags(cfg: Config) -> tuple[str, ...]:
    """The flags of the throughput workers."""
    return ("--concurrency", str(cfg.concurrency), "--batch-size", str(cfg.batch_size),
            *(("--async",) if cfg.use_async else ()))


# --------------------------------------------------------------------------- helpers


def percentile(values: list[float], p: int) -> float:
    """The p-th percentile (1-99) of at least two values, linear between closest ranks."""
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def function_stats(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, float]]:
    """Calls and total time (ms) per dq_* function in this database, counted in the sessions that
    have track_functions on, read afresh."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return {name: (int(calls), float(ms)) for name, calls, ms in conn.execute(
        "SELECT funcname, calls, total_time FROM pg_stat_user_functions WHERE funcname LIKE 'dq%'").fetchall()}


def stats_since(conn: psycopg.Connection[Any], before: dict[str, tuple[int, float]]) -> dict[str, tuple[int, float]]:
    """function_stats now, less `before`: the functions called since, with their calls and ms."""
    after = function_stats(conn)
    diff = {k: (c - before.get(k, (0, 0.0))[0], ms - before.get(k, (0, 0.0))[1]) for k, (c, ms) in after.items()}
    return {k: v for k, v in diff.items() if v[0]}


def tracked(dsn: str) -> str:
    """`dsn` with track_functions on for the sessions opened with it (pg_stat_user_functions)."""
    return make_conninfo(dsn, options="-c track_functions=all")


def xacts(dsn: str) -> int:
    """Transactions committed and rolled back in this database so far, read on a session of its
    own (sessions report theirs when they close; an open one may hold them up to 10 s). That
    session's own one is reported when it closes, after the reading."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(value(conn, "SELECT xact_commit + xact_rollback FROM pg_stat_database"
                               " WHERE datname = current_database()"))


def autovacuums(conn: psycopg.Connection[Any], side: Side) -> int:
    """How often autovacuum vacuumed or analyzed the side's table so far (either makes the
    sessions re-plan their cached statements on it)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(value(conn, "SELECT autovacuum_count + autoanalyze_count FROM pg_stat_user_tables WHERE relname = %s",
                     (side.table,)))


def remaining(conn: psycopg.Connection[Any], side: Side | str) -> int:
    """Rows left in the side's table (or in the table named `side`)."""
    table = side if isinstance(side, str) else side.table
    return int(value(conn, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))))


def drain_until(conn: psycopg.Connection[Any], side: Side | str, start: float,
                cap_s: float) -> tuple[float, int, int, float]:
    """Count the rows of the side's table (or of the table named `side`) every DRAIN_POLL_S until
    none is left or `cap_s` seconds have passed since `start` (perf_counter); returns the seconds
    from `start` to the last count, the rows it found, how many counts it took, and their mean ms."""
    polls, counting = 0, 0.0
    while True:
        polls += 1
        t = time.perf_counter()
        left = remaining(conn, side)
        counting += time.perf_counter() - t
        elapsed = time.perf_counter() - start
        if left == 0 or elapsed > cap_s:
            return elapsed, left, polls, counting * 1e3 / polls
        time.sleep(DRAIN_POLL_S)


def drain(conn: psycopg.Connection[Any], side: Side, start: float, timeout: float) -> tuple[float, int, float]:
    """Count the side's rows every DRAIN_POLL_S until none is left; returns the seconds from
    `start` (perf_counter) to the first count of 0, how many counts it took, and their mean ms."""
    elapsed, left, polls, count_ms = drain_until(conn, side, start, timeout)
    if left:
        raise RuntimeError(f"{side.name}: {left} rows left after {timeout:.0f} s")
    return elapsed, polls, count_ms


def fill_one_transaction(
    conn: psycopg.Connection[Any], side: Side, n: int, before_commit: Callable[[], None] | None = None
) -> float:
    """Write `n` due messages (an hour old) with the side's fill statement, all in ONE
    transaction (one in pg_stat_database's count); `before_commit` runs just before the commit.
    Returns the perf_counter time right after the commit."""
    with conn.transaction():
        t0 = value(conn, "SELECT now() - interval '1 hour'")
        for lo in range(0, n, FILL_BATCH):
            conn.execute(side.fill, {"queue": QUEUE, "prefix": "due-", "payload": PAYLOAD, "t0": t0, "lo": lo,
                                     "hi": min(lo + FILL_BATCH, n) - 1})
        if before_commit is not None:
            before_commit()
    return time.perf_counter()


# --------------------------------------------------------------------------- 1. lateness

OFFER_SPREAD = """
    SELECT count(*)
      FROM (SELECT array_agg(%(prefix)s || lpad(g::text, 6, '0') ORDER BY g) AS k,
                   array_agg(%(payload)s::bytea ORDER BY g) AS p,
                   array_agg(%(start)s::timestamptz + g * %(step)s::interval ORDER BY g) AS s
              FROM generate_series(0, %(n)s::int - 1) AS g) AS a,
           LATERAL dq_offer_many(%(queue)s::text, a.k, a.p, a.s)"""


def lateness_part(admin: psycopg.Connection[Any], dsn: str, cfg: Config, workdir: Path) -> dict[str, Any]:
    n, span = cfg.lateness_messages, cfg.lateness_span_s
    prepare_table(admin, DQ)
    files = workdir / "lateness"
    files.mkdir()
    workers = Workers(dsn, "bench.handlers:lateness", cfg.lateness_workers, (), workdir, "lateness",
                      env={LATENESS_FILE_ENV: str(files / "worker{i}.tsv")})
    with workers:
        workers.wait_ready(admin)
        # The times come from the database clock: the first message is due LEAD_S after now, so
        # the offer has committed before anything is due, and the last one span later.
        start = value(admin, "SELECT clock_timestamp() + make_interval(secs => %s)", (LEAD_S,))
        step_s = span / n
        t_offer = time.perf_counter()
        offered = value(admin, OFFER_SPREAD, {"prefix": "lat-", "payload": PAYLOAD, "start": start,
                                              "step": f"{step_s * 1e6:.0f} microseconds", "n": n, "queue": QUEUE})
        offer_s = time.perf_counter() - t_offer
        committed = value(admin, "SELECT clock_timestamp()")
        if offered != n:
            raise RuntimeError(f"lateness: offered {offered} of {n}")
        console().log(f"lateness: {n:,} messages offered in {offer_s * 1e3:.0f} ms, due over {span:.0f} s "
                      f"from {LEAD_S:.1f} s after the offer began")
        # Wait for the last one to be due, then for the queue to be empty (everything acknowledged).
        time.sleep(max((start - committed).total_seconds() + span, 0))
        drain_s, _, _ = drain(admin, DQ, time.perf_counter(), timeout=60.0)
        workers.stop()
    workers.check_clean_exit()
    handled: dict[str, int] = {}
    samples: list[float] = []
    for path in sorted(files.glob("worker*.tsv")):
        for line in path.read_text().splitlines():
            key, ms = line.split("\t")
            handled[key] = handled.get(key, 0) + 1
            samples.append(float(ms))
    samples.sort()
    lost = sum(1 for i in range(n) if f"lat-{i:06d}" not in handled)
    stats = workers.stats()
    result = {
        "messages": n,
        "span_s": span,
        "lead_s": LEAD_S,
        "workers": cfg.lateness_workers,
        "worker_flags": "defaults (concurrency 4, batch 4, lock_timeout 30 s, idle_check 5 s)",
        "offer_ms": offer_s * 1e3,
        "offer_committed_before_first_due": committed < start,
        "empty_after_last_due_s": drain_s,
        "deliveries": len(samples),
        "handled": len(handled),
        "duplicates": len(samples) - len(handled),
        "lost": lost,
        "p50_ms": percentile(samples, 50),
        "p99_ms": percentile(samples, 99),
        "max_ms": samples[-1],
        "min_ms": samples[0],
        "mean_ms": statistics.fmean(samples),
        "target_p99_ms": cfg.lateness_target_p99_ms,
        "per_worker_handled": [len(p.read_text().splitlines()) for p in sorted(files.glob("worker*.tsv"))],
        "worker_stats": stats,
        "worker_warnings": workers.warnings()[:20],
    }
    result["pass"] = result["p99_ms"] < cfg.lateness_target_p99_ms and not result["lost"]
    console().log(f"lateness: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms,"
                  f" max {result['max_ms']:.1f} ms; {len(handled):,} handled,"
                  f" {result['duplicates']} duplicates, {lost} lost")
    return result


# --------------------------------------------------------------------------- 2. idle query rate


def idle_part(admin: psycopg.Connection[Any], dsn: str, cfg: Config, workdir: Path) -> dict[str, Any]:
    prepare_table(admin, DQ)
    before = function_stats(admin)
    workers = Workers(tracked(dsn), "bench.handlers:noop", cfg.idle_workers, ("--idle-check", str(cfg.idle_check_s)),
                      workdir, "idle")
    with workers:
        ready_s = workers.wait_ready(admin)
        time.sleep(cfg.idle_s)
        workers.stop()
    life_s = workers.stopped_at - workers.procs[0].started if workers.stopped_at else math.nan
    workers.check_clean_exit()
    time.sleep(STATS_SETTLE_S)
    calls = {k: c for k, (c, _) in stats_since(admin, before).items()}
    poll_or_wait = calls.get("dq_poll_or_wait", 0)
    # Statements the workers sent: every call but those made inside dq_poll_or_wait (each makes
    # one dq_poll_many, and one dq_wait when it found nothing: on an idle queue, always).
    nested = min(calls.get("dq_poll_many", 0), poll_or_wait) + min(calls.get("dq_wait", 0), poll_or_wait)
    queries = sum(v for k, v in calls.items() if not k.startswith("dq__")) - nested
    per_worker_s = queries / cfg.idle_workers / life_s
    # An idle worker's budget: one dq_poll_or_wait per idle_check (and one at start), plus its
    # dq_channel lookup at start.
    budget = (math.floor(life_s / cfg.idle_check_s) + 1) + 1
    result = {
        "workers": cfg.idle_workers,
        "idle_check_s": cfg.idle_check_s,
        "idle_s_after_ready": cfg.idle_s,
        "ready_s": ready_s,
        "life_s": life_s,
        "calls": calls,
        "queries": queries,
        "queries_per_s_per_worker": per_worker_s,
        "poll_or_wait_per_s_per_worker": poll_or_wait / cfg.idle_workers / life_s,
        "expected_per_s": 1 / cfg.idle_check_s,
        "budget_per_worker": budget,
        "pass": queries <= budget * cfg.idle_workers,
    }
    console().log(f"idle: {queries} queries from {cfg.idle_workers} workers in {life_s:.1f} s = "
                  f"{per_worker_s:.3f}/s per worker; calls {calls}")
    return result


# --------------------------------------------------------------------------- 3. throughput


def _baseline_client(dsn: str, client: int, batch: int, ready: Any, go: Any, done: Any, results: Any) -> None:
    """A baseline consumer: BASELINE's poll + ack of `batch` rows until nothing is left; it keeps
    its session until the driver has measured (a backend that exits takes its CPU time along)."""
    try:
        with connect(dsn) as conn:
            step = poll_ack_step(conn, BASELINE, client, batch)
            ready.wait(READY_TIMEOUT_S)
            go.wait(READY_TIMEOUT_S)
            rows = 0
            while (n := step()) is not None:
                rows += n
            done.wait(READY_TIMEOUT_S + 600)
        results.put(("ok", client, rows))
    except BaseException:
        for barrier in (ready, go, done):
            barrier.abort()
        results.put(("error", client, traceback.format_exc()))


@dataclass
class Window:
    """CPU accounting of one measurement (bench.core's CpuSnapshot): taken before the backlog
    becomes visible, and after the queue was found empty, while every session that worked in
    between is still open (a process that exits meanwhile takes its CPU time along)."""

    db_name: str
    counter_pid: int  # the backend of the driver's counting session: its CPU is not the consumers' work
    snap: CpuSnapshot | None = None
    t0: float = 0.0
    counter0: float = 0.0

    @staticmethod
    def _cpu_s(pid: int) -> float:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        self.counter0 = self._cpu_s(self.counter_pid)
        self.snap, self.t0 = CpuSnapshot.take(os.getpid(), self.db_name), time.perf_counter()

    def result(self, n: int) -> dict[str, float]:
        assert self.snap is not None
        after = CpuSnapshot.take(os.getpid(), self.db_name)
        cpu = self.snap.until(after, time.perf_counter() - self.t0)
        counter = self._cpu_s(self.counter_pid) - self.counter0
        return {
            "server_us_per_row": (cpu["server_cpu_s"] - counter) * 1e6 / n,
            "consumer_us_per_row": (after.clients_s - self.snap.clients_s) * 1e6 / n,
            "counting_server_cpu_s": counter,
            "other_cpu": cpu["other_cpu"],
        }


def _drained(conn: psycopg.Connection[Any], side: Side, n: int, start: float, window: Window,
             analyze: bool) -> dict[str, Any]:
    if analyze:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(side.table)))
    elapsed, polls, count_ms = drain(conn, side, start, timeout=max(300.0, n / 200))
    return {"elapsed_s": elapsed, "rows_per_s": n / elapsed, "drain_polls": polls, "count_ms_mean": count_ms,
            **window.result(n)}


def run_workers_side(admin: psycopg.Connection[Any], dsn: str, cfg: Config, workers_n: int,
                     workdir: Path) -> dict[str, Any]:
    n = cfg.backlog
    prepare_table(admin, DQ)
    # track_functions on the workers' sessions: the calls and server time of each dq_* function.
    workers = Workers(tracked(dsn), "bench.handlers:noop_async" if cfg.use_async else "bench.handlers:noop",
                      workers_n, worker_flags(cfg), workdir, f"throughput{workers_n}")
    before = function_stats(admin)
    with workers:
        workers.wait_ready(admin)
        x0, av0 = xacts(dsn), autovacuums(admin, DQ)
        with psycopg.connect(dsn, autocommit=True) as fill, psycopg.connect(dsn, autocommit=True) as counter:
            window = Window(admin.info.dbname, counter.info.backend_pid)
            committed = fill_one_transaction(fill, DQ, n, before_commit=window.start)
            res = _drained(counter, DQ, n, committed, window, cfg.analyze_backlog)
        workers.stop()
    workers.check_clean_exit()
    time.sleep(STATS_SETTLE_S)
    # The workers' transactions (polls, acks, lock extensions): all, less this driver's (the
    # reading of x0, the fill, the counts).
    res["xacts_per_row"] = (xacts(dsn) - x0 - 2 - res["drain_polls"]) / n
    res["autovacuums"] = autovacuums(admin, DQ) - av0
    calls = stats_since(admin, before)
    res["functions"] = {k: {"calls": c, "total_ms": ms} for k, (c, ms) in calls.items()}
    polls = calls.get("dq_poll_many", (0, 0.0))
    acks = calls.get("dq_ack", (0, 0.0))
    res["msgs_per_poll"] = n / polls[0] if polls[0] else math.nan
    res["poll_ms"] = polls[1] / polls[0] if polls[0] else math.nan
    res["ack_ms"] = acks[1] / acks[0] if acks[0] else math.nan
    stats = workers.stats()
    res["delivered"] = sum(s.get("delivered", 0) for s in stats)
    res["acknowledged"] = sum(s.get("acknowledged", 0) for s in stats)
    res["duplicates"] = res["delivered"] - n
    res["per_worker_delivered"] = [s.get("delivered", 0) for s in stats]
    res["worker_warnings"] = workers.warnings()[:20]
    return res


def run_baseline_side(admin: psycopg.Connection[Any], dsn: str, cfg: Config, clients: int) -> dict[str, Any]:
    n = cfg.backlog
    prepare_table(admin, BASELINE)
    with psycopg.connect(dsn, autocommit=True) as fill:
        fill_one_transaction(fill, BASELINE, n)
    ctx = mp.get_context("spawn")
    ready, go, done = (ctx.Barrier(clients + 1) for _ in range(3))
    results = ctx.Queue()
    procs = [ctx.Process(target=_baseline_client, daemon=True,
                         args=(dsn, i, cfg.batch_size, ready, go, done, results)) for i in range(clients)]
    for p in procs:
        p.start()
    try:
        x0, av0 = xacts(dsn), autovacuums(admin, BASELINE)
        with psycopg.connect(dsn, autocommit=True) as counter:
            window = Window(admin.info.dbname, counter.info.backend_pid)
            ready.wait(READY_TIMEOUT_S)  # every client connected, its statements ready
            window.start()
            go.wait(READY_TIMEOUT_S)
            res = _drained(counter, BASELINE, n, time.perf_counter(), window, cfg.analyze_backlog)
            done.wait(READY_TIMEOUT_S)
        rows = []
        for _ in range(clients):
            kind, client, payload = results.get(timeout=60)
            if kind == "error":
                raise RuntimeError(f"baseline client {client} failed:\n{payload}")
            rows.append(payload)
    except BaseException:
        for barrier in (ready, go, done):
            barrier.abort()
        raise
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)
    time.sleep(STATS_SETTLE_S)
    # The clients' transactions: all, less this driver's (the reading of x0, the counts).
    res["xacts_per_row"] = (xacts(dsn) - x0 - 1 - res["drain_polls"]) / n
    res["autovacuums"] = autovacuums(admin, BASELINE) - av0
    res["delivered"] = sum(rows)
    res["duplicates"] = res["delivered"] - n
    res["per_client_rows"] = rows
    return res


def throughput_part(admin: psycopg.Connection[Any], dsn: str, cfg: Config, workdir: Path) -> list[dict[str, Any]]:
    cells = []
    for i, workers_n in enumerate(cfg.throughput_workers):
        cell: dict[str, Any] = {"processes": workers_n, "backlog": cfg.backlog, "batch_size": cfg.batch_size}
        for side in ("workers", "baseline") if i % 2 == 0 else ("baseline", "workers"):
            if side == "workers":
                cell[side] = run_workers_side(admin, dsn, cfg, workers_n, workdir)
            else:
                cell[side] = run_baseline_side(admin, dsn, cfg, workers_n)
            r = cell[side]
            console().log(
                f"throughput {workers_n} {side:<8} {r['rows_per_s']:>9,.0f} msgs/s ({r['elapsed_s']:.2f} s)"
                f"  consumers {r['consumer_us_per_row']:.0f} µs/msg  server {r['server_us_per_row']:.0f} µs/msg"
                f"  {r['xacts_per_row']:.3f} xacts/msg  other CPU {r['other_cpu']:.0%}"
                f"  delivered {r['delivered']:,}  count(*) {r['count_ms_mean']:.1f} ms"
                f"  autovacuum/analyze runs {r['autovacuums']}"
                + (f"  {r['msgs_per_poll']:.0f} msgs/poll, poll {r['poll_ms']:.1f} ms, ack {r['ack_ms']:.1f} ms"
                   if side == "workers" else "")
            )
        cell["ratio"] = cell["workers"]["rows_per_s"] / cell["baseline"]["rows_per_s"]
        cells.append(cell)
    return cells


# --------------------------------------------------------------------------- report


def _status(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]MISS[/]"


def lateness_table(r: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title=f"1. Lateness: handler start − scheduled_at, ms ({r['messages']:,} messages due evenly over "
                        f"{r['span_s']:.0f} s, {r['workers']} idle workers)")
    for col in ("p50", "p99", "max", "handled", "duplicates", "lost", "target", ""):
        table.add_column(col, justify="right")
    table.add_row(f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['max_ms']:.1f}", f"{r['handled']:,}",
                  str(r["duplicates"]), str(r["lost"]), f"p99 < {r['target_p99_ms']:.0f}", _status(r["pass"]))
    table.caption = (f"worker flags: {r['worker_flags']}. One dq_offer_many of {r['offer_ms']:.0f} ms, committed "
                     f"{'before' if r['offer_committed_before_first_due'] else '[red]after[/]'} the first message was "
                     f"due ({r['lead_s']:.1f} s after the offer began); min {r['min_ms']:.1f} ms, mean "
                     f"{r['mean_ms']:.1f} ms; per worker {r['per_worker_handled']}")
    return table


def idle_table(r: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title=f"2. Idle workers: queries on the server ({r['workers']} workers, empty queue, "
                        f"idle_check {r['idle_check_s']:.0f} s)")
    for col in ("workers' life s", "dq_poll_or_wait", "dq_channel", "queries", "queries/s per worker",
                "expected 1/idle_check", "budget per worker", ""):
        table.add_column(col, justify="right")
    table.add_row(f"{r['life_s']:.1f}", str(r["calls"].get("dq_poll_or_wait", 0)), str(r["calls"].get("dq_channel", 0)),
                  str(r["queries"]), f"{r['queries_per_s_per_worker']:.3f}", f"{r['expected_per_s']:.3f}",
                  f"≤ {r['budget_per_worker']}", _status(r["pass"]))
    table.caption = (f"counted with track_functions on the workers' sessions (pg_stat_user_functions): {r['calls']}; "
                     "queries = calls not made inside dq_poll_or_wait. The life includes start-up (ready after "
                     f"{r['ready_s']:.1f} s); budget: a dq_poll_or_wait at start and per idle_check, one dq_channel")
    return table


def throughput_table(cells: list[dict[str, Any]], cfg: Config) -> Table:
    from rich.table import Table

    table = Table(title=f"3. Throughput: a backlog of {cfg.backlog:,} due messages committed at once, no-op handler "
                        "(messages/s from the commit until the queue is empty)")
    for col in ("procs", "workers\nmsg/s", "baseline\nrows/s", "ratio", "xacts/msg\nw | b", "consumer\nµs/msg w | b",
                "server\nµs/msg w | b", "msgs/poll\nw", "poll | ack\nms w", "other\nCPU"):
        table.add_column(col, justify="right")
    for c in cells:
        w, b = c["workers"], c["baseline"]
        table.add_row(
            str(c["processes"]), f"{w['rows_per_s']:,.0f}" + "*" * bool(w["autovacuums"]),
            f"{b['rows_per_s']:,.0f}" + "*" * bool(b["autovacuums"]), f"{c['ratio']:.0%}",
            f"{w['xacts_per_row']:.3f} | {b['xacts_per_row']:.3f}",
            f"{w['consumer_us_per_row']:.0f} | {b['consumer_us_per_row']:.0f}",
            f"{w['server_us_per_row']:.0f} | {b['server_us_per_row']:.0f}",
            f"{w['msgs_per_poll']:.0f}", f"{w['poll_ms']:.1f} | {w['ack_ms']:.1f}",
            f"{max(w['other_cpu'], b['other_cpu']):.0%}",
        )
    dups = sorted({c[side]["duplicates"] for c in cells for side in ("workers", "baseline")})
    table.caption = (
        f"workers: pyqueue worker {' '.join(worker_flags(cfg))} bench.handlers:"
        f"{'noop_async' if cfg.use_async else 'noop'}; baseline: bench.core BASELINE poll + ack (plain SQL on "
        f"bench_baseline), batch {cfg.batch_size}, as many client processes. w | b: workers | baseline. xacts/msg: "
        "transactions in the database per message (one per statement; the driver's own excluded). consumer: CPU of "
        "the worker processes or baseline clients (and this driver); server: CPU of the database's backends (the "
        "driver's counting excluded). msgs/poll, poll | ack ms: per dq_poll_many / dq_ack call, server time "
        "(track_functions). other CPU: the most any run saw taken by processes outside the benchmark (share of all "
        f"cores). Duplicates delivered: {dups}. *: autovacuum vacuumed or analyzed the table during the run, so "
        "the sessions re-planned their cached statements on it (the workers planned theirs on the empty table)"
        + (". DIAGNOSTIC: the table was ANALYZEd right after the commit (in the measured time)"
           if cfg.analyze_backlog else "")
    )
    return table


# --------------------------------------------------------------------------- main


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
    }
    try:
        info["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                 if ln.startswith("model name"))
        info["mem_total_kb"] = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                                        if ln.startswith("MemTotal")))
    except (OSError, StopIteration):
        pass
    return info


def source_info(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """bench.core's provenance, plus local changes to the Python package and the benchmarks."""
    import pyqueue

    info = provenance(conn)
    out = subprocess.run(["git", "--no-optional-locks", "-C", str(PROJECT), "status", "--porcelain", "--", "pyqueue",
                          "bench"], capture_output=True, text=True)
    info["uncommitted_python_changes"] = out.stdout.splitlines() if out.returncode == 0 else out.stderr.strip()
    info["pyqueue_version"] = pyqueue.__version__
    return info


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM to the driver unwinds like Ctrl-C, so the workers are stopped on the way out."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(admin_dsn: str, cfg: Config, out: Path | None, db_name: str) -> dict[str, Any]:
    started = time.perf_counter()
    timestamp = datetime.now(UTC)
    console().log(f"[bold]bench.latency[/] ({cfg.mode}): creating database {db_name}")
    dsn = create_database(admin_dsn, db_name)
    machine_before = machine_info()
    workdir = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    try:
        with interrupt_on_sigterm(), psycopg.connect(dsn, autocommit=True) as admin:
            server, source = server_info(admin), source_info(admin)
            # The idle part first, on the fresh database: nothing else (autovacuum of the other
            # parts' dead rows) runs meanwhile.
            idle = idle_part(admin, dsn, cfg, workdir)
            lateness = lateness_part(admin, dsn, cfg, workdir)
            throughput = throughput_part(admin, dsn, cfg, workdir)
    except BaseException:
        console().log(f"[red]failed; worker logs kept in {workdir}[/]")
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started
    report = {
        "timestamp": timestamp.isoformat(timespec="seconds"),
        "mode": cfg.mode,
        "wall_time_s": round(wall, 1),
        "server": server,
        "source": source,
        "machine": machine_before,
        "load_average_after": os.getloadavg(),
        "config": {
            **asdict(cfg),
            "throughput_worker_flags": list(worker_flags(cfg)),
            "payload_bytes": len(PAYLOAD),
            "lead_s": LEAD_S,
            "drain_poll_s": DRAIN_POLL_S,
            "database": db_name,
        },
        "lateness": lateness,
        "idle": idle,
        "throughput": throughput,
    }
    console().print(lateness_table(lateness))
    console().print(idle_table(idle))
    console().print(throughput_table(throughput, cfg))
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2, default=str) + "\n"
    paths = [RESULTS / f"latency-{timestamp.strftime('%Y%m%dT%H%M%SZ')}.json"]
    if out is not None:
        paths.append(out)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    console().log(f"wall time {wall:.0f} s; results written to {', '.join(map(str, paths))}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True, help="admin DSN of the server (a database to connect to)")
    parser.add_argument("--quick", action="store_true",
                        help="development: 2,000 messages over 10 s, 10 s idle, a backlog of 20,000")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON results here")
    parser.add_argument("--db-name", default="dq_bench_latency", help="benchmark database (dropped and recreated)")
    parser.add_argument("--concurrency", type=int, default=None, help="throughput workers' --concurrency")
    parser.add_argument("--batch-size", type=int, default=None, help="throughput workers' (and baseline's) batch")
    parser.add_argument("--async", dest="use_async", action="store_true", help="throughput workers run --async")
    parser.add_argument("--analyze-backlog", action="store_true",
                        help="diagnostic: ANALYZE the table right after the backlog is committed (both sides)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {"use_async": args.use_async or cfg.use_async,
                                 "analyze_backlog": args.analyze_backlog or cfg.analyze_backlog}
    if args.concurrency is not None:
        overrides["concurrency"] = args.concurrency
    if args.batch_size is not None:
        overrides["batch_size"] = args.batch_size
    run(args.dsn, replace(cfg, **overrides), args.out, args.db_name)


if __name__ == "__main__":
    # Run through the imported module, so spawned processes find every function as bench.latency.*.
    from bench.latency import main as _main

    _main()
