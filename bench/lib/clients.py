"""Client processes in lockstep: the harness of bench.core (and of bench.controls' regression and
drain runs). Every client is a process ('spawn') with its own autocommit connection. Clients line
up on a barrier, warm up, line up again and count rows for a fixed duration; client 0 takes the CPU
snapshots while everyone stands still. Waiter processes follow the wake-up protocol meanwhile.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

import psycopg
from psycopg import sql

from bench.lib.cpu import CpuSnapshot
from bench.lib.sides import QUEUE, Side, Step, Workload, connect, poll_ack_step, value

MAX_WAIT_S = 5.0  # the waiters' dq_wait max_wait
ASLEEP_WAIT_S = 600.0  # ... of waiters that stay asleep during the whole run
WAITER_BATCH = 100  # what a woken waiter polls at once
STOP = "__bench_stop__"  # notification payload that ends a waiter
BARRIER_TIMEOUT_S = 180.0


def join_or_terminate(procs: Iterable[BaseProcess]) -> None:
    """Wait up to 10 s for each process to end; terminate one still running."""
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join(5)


@dataclass
class ClientResult:
    rows: int
    elapsed_s: float
    warmup_rows: int
    exhausted: bool  # found nothing to do before the end (backlog drained)
    cpu: dict[str, float] | None = None  # client 0 only: CpuSnapshot.until over its measurement


def _loop(step: Step, seconds: float) -> tuple[int, float, bool]:
    rows, start = 0, time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        n = step()
        if n is None:
            return rows, time.perf_counter() - start, True
        rows += n
    return rows, time.perf_counter() - start, False


def _client_main(
    workload: Workload,
    side: Side,
    dsn: str,
    client: int,
    warmup_s: float,
    duration_s: float,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    try:
        with connect(dsn) as conn:
            step = workload.step(conn, side, client, workload.batch)
            ready.wait(BARRIER_TIMEOUT_S)
            warm_rows, _, _ = _loop(step, warmup_s)
            # Client 0 takes CPU snapshots while everyone stands still at the barrier, before the
            # measurement and after it (before any client disconnects and its backend exits).
            go.wait(BARRIER_TIMEOUT_S)
            if client == 0:
                snap, snap_t = CpuSnapshot.take(os.getppid(), conn.info.dbname), time.perf_counter()
            go.wait(BARRIER_TIMEOUT_S)
            rows, elapsed, exhausted = _loop(step, duration_s)
            result = ClientResult(rows, elapsed, warm_rows, exhausted)
            go.wait(BARRIER_TIMEOUT_S)
            if client == 0:
                later = CpuSnapshot.take(os.getppid(), conn.info.dbname)
                result.cpu = snap.until(later, time.perf_counter() - snap_t)
            go.wait(BARRIER_TIMEOUT_S)
        results.put(("client", client, result))
    except BaseException:
        ready.abort()
        go.abort()
        results.put(("error", client, traceback.format_exc()))


def _waiter_main(side: Side, dsn: str, waiter: int, consume: bool, ready: Any, stop: Any, results: Any) -> None:
    """A consumer following the wake-up protocol: LISTEN; loop: register with the side's wait
    statement (dq_wait), sleep on notifications for the time it returned, poll a batch and
    acknowledge it. With consume=False it registers once, for longer than the run, and does not
    react before the clients are done: a consumer that stays asleep, so every offer finds a
    waiter to notify (the worst case for offers)."""
    try:
        with connect(dsn) as conn:
            cur = conn.cursor()
            channel = value(cur, side.channel, {"queue": QUEUE})
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            poll_ack = poll_ack_step(conn, side, 100 + waiter, WAITER_BATCH)
            wait_args = {"queue": QUEUE, "max_wait": MAX_WAIT_S if consume else ASLEEP_WAIT_S}
            stats: dict[str, float] = dict.fromkeys(
                ("notifications", "woken_by_notify", "woken_by_timer", "polls", "rows", "asleep_s"), 0
            )

            def notified(timeout: float, stop_after: int | None = None) -> list[str]:
                got = [n.payload for n in conn.notifies(timeout=timeout, stop_after=stop_after)]
                stats["notifications"] += sum(payload != STOP for payload in got)
                return got

            sleep_s = value(cur, side.wait, wait_args)
            ready.wait(BARRIER_TIMEOUT_S)
            start = time.perf_counter()
            if not consume:
                stop.wait()
                stats["asleep_s"] = time.perf_counter() - start
            while not stop.is_set():
                if sleep_s > 0:
                    t0 = time.perf_counter()
                    got = notified(sleep_s, stop_after=1) + notified(0)  # and those queued meanwhile
                    stats["asleep_s"] += time.perf_counter() - t0
                    if STOP in got:
                        break
                    stats["woken_by_notify" if got else "woken_by_timer"] += 1
                stats["polls"] += 1
                stats["rows"] += poll_ack() or 0
                sleep_s = value(cur, side.wait, wait_args)
            stats["elapsed_s"] = time.perf_counter() - start
            while notified(0.05):  # count what is still queued
                pass
        results.put(("waiter", waiter, stats))
    except BaseException:
        ready.abort()
        results.put(("error", waiter, traceback.format_exc()))


@dataclass
class RunResult:
    side: str
    clients: int
    rows: int
    rows_per_s: float
    elapsed_s: float
    warmup_rows: int
    exhausted: bool
    wal_bytes_per_row: float  # WAL written during warm-up and measurement / rows done
    server_us_per_row: float  # CPU time of the database's backends per row, during the measurement
    other_cpu: float  # share of all CPUs used by other processes during the measurement
    notified_share: float | None  # notifications a waiter received / messages offered (warm-up included)
    waiters: list[dict[str, Any]]


def run_clients(
    admin: psycopg.Connection[Any], dsn: str, workload: Workload, side: Side, clients: int, warmup_s: float,
    duration_s: float,
) -> RunResult:
    """Run `clients` processes of `workload` (plus its waiters) against `side`, each warming up for
    `warmup_s` and counting for `duration_s` seconds; collect their counts."""
    ctx = mp.get_context("spawn")
    ready, go = ctx.Barrier(clients + workload.waiters), ctx.Barrier(clients)
    stop, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_client_main,
            daemon=True,
            args=(workload, side, dsn, i, warmup_s, duration_s, ready, go, results),
        )
        for i in range(clients)
    ]
    procs += [
        ctx.Process(
            target=_waiter_main, daemon=True, args=(side, dsn, i, workload.waiters_consume, ready, stop, results)
        )
        for i in range(workload.waiters)
    ]
    lsn0 = value(admin, "SELECT pg_current_wal_insert_lsn()")
    for p in procs:
        p.start()
    done: list[ClientResult] = []
    waiters: list[dict[str, Any]] = []
    timeout = BARRIER_TIMEOUT_S + warmup_s + duration_s + 60
    try:
        while len(done) < clients or len(waiters) < workload.waiters:
            if len(done) == clients and not stop.is_set():
                stop.set()  # clients are finished: wake the waiters and let them report
                channel = value(admin, side.channel, {"queue": QUEUE})
                admin.execute("SELECT pg_notify(%s, %s)", (channel, STOP))
            kind, _, payload = results.get(timeout=timeout)
            if kind == "error":
                raise RuntimeError(f"{workload.name} / {side.name} / {clients} clients failed:\n{payload}")
            (done if kind == "client" else waiters).append(payload)
    except queue_mod.Empty:
        raise RuntimeError(f"{workload.name} / {side.name}: no result within {timeout:.0f} s") from None
    finally:
        join_or_terminate(procs)
    wal = value(admin, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn0,))
    rows = sum(r.rows for r in done)
    cpu = next(r.cpu for r in done if r.cpu is not None)
    total_client_rows = rows + sum(r.warmup_rows for r in done)
    total_rows = total_client_rows + sum(w["rows"] for w in waiters)
    return RunResult(
        side=side.name,
        clients=clients,
        rows=rows,
        rows_per_s=sum(r.rows / r.elapsed_s for r in done),
        elapsed_s=max(r.elapsed_s for r in done),
        warmup_rows=sum(r.warmup_rows for r in done),
        exhausted=any(r.exhausted for r in done),
        wal_bytes_per_row=float(wal) / max(total_rows, 1),
        server_us_per_row=cpu["server_cpu_s"] * 1e6 / max(rows, 1),
        other_cpu=cpu["other_cpu"],
        notified_share=max(w["notifications"] for w in waiters) / max(total_client_rows, 1) if waiters else None,
        waiters=waiters,
    )
