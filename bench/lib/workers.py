"""``pyqueue worker`` processes as a benchmark runs them (started from the project folder, each
logging to its own file, always stopped), and the drain of a backlog committed at once: by idle
workers, or by plain-SQL baseline clients (bench.latency's throughput part, bench.peers' processing
of our workers and of the baseline).

Workers are always stopped (SIGTERM, then SIGKILL after a timeout), also on errors and when the
driver is interrupted (:func:`interrupt_on_sigterm`); they also get SIGTERM if the driver dies
(:func:`die_with_parent`, PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ast
import ctypes
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.lib.clients import join_or_terminate
from bench.lib.cpu import Window
from bench.lib.database import (
    autovacuums,
    drain,
    fill_one_transaction,
    function_stats,
    prepare_table,
    stats_since,
    tracked,
    xacts,
)
from bench.lib.report import PROJECT, console
from bench.lib.sides import BASELINE, DQ, QUEUE, Side, connect, poll_ack_step, value

READY_TIMEOUT_S = 60.0  # workers started -> all ready and waiting
STOP_TIMEOUT_S = 30.0  # SIGTERM -> exited, else SIGKILL
STATS_SETTLE_S = 1.5  # closed sessions report their statistics meanwhile


def die_with_parent() -> None:
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
                        stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
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


# --------------------------------------------------------------------------- a backlog drained


@dataclass(frozen=True)
class Drain:
    """A backlog of due messages committed in one transaction while the consumers wait, and how
    they take it: messages/s from the commit until the queue is empty."""

    backlog: int
    batch_size: int = 100  # the workers' --batch-size, and what a baseline client polls at once
    concurrency: int = 100  # the workers' --concurrency
    use_async: bool = False  # the workers run --async
    # Diagnostic: ANALYZE the table right after the backlog's commit (in the measured time, both
    # sides), which invalidates the plans the consumers' sessions cached while the table was empty.
    analyze_backlog: bool = False
    # The workers' handler: bench.handlers:noop_async under --async, bench.handlers:noop otherwise
    # (bench.handlers:noop under --async is a plain function the async worker runs off its loop).
    handler: str | None = None

    def worker_flags(self) -> tuple[str, ...]:
        """The flags of the workers."""
        return ("--concurrency", str(self.concurrency), "--batch-size", str(self.batch_size),
                *(("--async",) if self.use_async else ()))


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


def _drained(conn: psycopg.Connection[Any], side: Side, n: int, start: float, window: Window,
             analyze: bool) -> dict[str, Any]:
    if analyze:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(side.table)))
    elapsed, polls, count_ms = drain(conn, side, start, timeout=max(300.0, n / 200))
    return {"elapsed_s": elapsed, "rows_per_s": n / elapsed, "drain_polls": polls, "count_ms_mean": count_ms,
            **window.result(n)}


def run_workers_side(admin: psycopg.Connection[Any], dsn: str, spec: Drain, workers_n: int,
                     workdir: Path) -> dict[str, Any]:
    """`workers_n` idle ``pyqueue worker`` processes (handler bench.handlers:noop, or
    noop_async) drain the backlog."""
    n = spec.backlog
    prepare_table(admin, DQ)
    # track_functions on the workers' sessions: the calls and server time of each dq_* function.
    handler = spec.handler or ("bench.handlers:noop_async" if spec.use_async else "bench.handlers:noop")
    workers = Workers(tracked(dsn), handler, workers_n, spec.worker_flags(), workdir, f"throughput{workers_n}")
    before = function_stats(admin)
    with workers:
        workers.wait_ready(admin)
        x0, av0 = xacts(dsn), autovacuums(admin, DQ)
        with psycopg.connect(dsn, autocommit=True) as fill, psycopg.connect(dsn, autocommit=True) as counter:
            window = Window(admin.info.dbname, counter.info.backend_pid)
            committed = fill_one_transaction(fill, DQ, n, before_commit=window.start)
            res = _drained(counter, DQ, n, committed, window, spec.analyze_backlog)
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


def run_baseline_side(admin: psycopg.Connection[Any], dsn: str, spec: Drain, clients: int) -> dict[str, Any]:
    """`clients` baseline client processes (BASELINE's poll + ack of a batch, until nothing is left)
    drain the backlog."""
    n = spec.backlog
    prepare_table(admin, BASELINE)
    with psycopg.connect(dsn, autocommit=True) as fill:
        fill_one_transaction(fill, BASELINE, n)
    ctx = mp.get_context("spawn")
    ready, go, done = (ctx.Barrier(clients + 1) for _ in range(3))
    results = ctx.Queue()
    procs = [ctx.Process(target=_baseline_client, daemon=True,
                         args=(dsn, i, spec.batch_size, ready, go, done, results)) for i in range(clients)]
    for p in procs:
        p.start()
    try:
        x0, av0 = xacts(dsn), autovacuums(admin, BASELINE)
        with psycopg.connect(dsn, autocommit=True) as counter:
            window = Window(admin.info.dbname, counter.info.backend_pid)
            ready.wait(READY_TIMEOUT_S)  # every client connected, its statements ready
            window.start()
            go.wait(READY_TIMEOUT_S)
            res = _drained(counter, BASELINE, n, time.perf_counter(), window, spec.analyze_backlog)
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
        join_or_terminate(procs)
    time.sleep(STATS_SETTLE_S)
    # The clients' transactions: all, less this driver's (the reading of x0, the counts).
    res["xacts_per_row"] = (xacts(dsn) - x0 - 1 - res["drain_polls"]) / n
    res["autovacuums"] = autovacuums(admin, BASELINE) - av0
    res["delivered"] = sum(rows)
    res["duplicates"] = res["delivered"] - n
    res["per_client_rows"] = rows
    return res
