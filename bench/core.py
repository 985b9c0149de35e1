"""Core benchmark: the dq_* functions against plain SQL doing the same work on a same-shaped table.

    python -m bench.core --dsn postgresql://postgres@127.0.0.1:55432/dq [--quick] [--out PATH]

Everything runs in one database, ``dq_bench`` (dropped and recreated at every run), on the
server of ``--dsn``: the queue schema installed by ``pyqueue.migrate``, and ``bench_baseline``,
a copy of ``dq_messages`` (columns, identity, constraints, indexes and storage options) that
the baseline statements work on directly. The baseline is the most the server can do for the
work: the same rows written and read by plain statements, without validation, wake-ups or
function calls.

Throughput: every workload runs at several client counts; each client is a process ('spawn')
with its own autocommit connection. Clients line up on a barrier, warm up, line up again and
count rows for a fixed duration. The dq side and the baseline side of one cell run back to
back, each on freshly truncated (and, for polls, pre-filled) tables after a CHECKPOINT, `repeat`
times in alternating order; the best run of each side counts. Both sides use server-side
prepared statements from the first execution (prepare_threshold=0) and 100-byte payloads.
Offers with waiters come in two forms: waiters that stay asleep (every offer notifies) and
consumers that wake up and drain the queue (the protocol's steady state).

Every run also records the CPU time of the database's backends per row and how much CPU other
processes on the host took meanwhile (the host may be shared; see bench.lib.cpu).

Poll latency: one client; the queue holds 0 / 100k / 1M messages scheduled a day ahead; each
sample offers one due message, times the poll of one message and its ack, then times a poll
that finds nothing due.

Results: the full report in ``bench/results/raw/core-<UTC time>.json``, its summary in
``bench/results/core.json`` (``core-quick.json`` with --quick); with ``--out x.json``, to x.json
and x.summary.json instead (see bench/README.md).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.lib.clients import MAX_WAIT_S, WAITER_BATCH, RunResult, run_clients
from bench.lib.cpu import CpuSnapshot
from bench.lib.database import create_database, prepare_table, provenance, server_info
from bench.lib.report import arguments, console, publish, rich_table, status
from bench.lib.sides import (
    PAYLOAD,
    QUEUE,
    SIDES,
    Side,
    Workload,
    connect,
    offer_many_step,
    offer_step,
    poll_ack_step,
)

if TYPE_CHECKING:
    from rich.table import Table


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    mode: str
    clients: tuple[int, ...]
    warmup_s: float
    duration_s: float
    backlog_single: int  # pre-filled due messages for poll+ack batch 1
    backlog_batch: int  # ... for poll+ack batch 100
    latency_sizes: tuple[int, ...]
    latency_samples: int
    latency_warmup: int
    repeat: int  # runs per side and cell, in alternating order; the best run of each side counts

    def workloads(self) -> list[Workload]:
        return [
            Workload("offer", offer_step, 1, 0.70),
            Workload("offer, 2 waiters asleep", offer_step, 1, 0.70, waiters=2, waiters_consume=False),
            Workload("offer, 2 consumers", offer_step, 1, 0.70, waiters=2),
            Workload("offer_many x100", offer_many_step, 100, 0.85),
            Workload("offer_many x1000", offer_many_step, 1000, 0.85),
            Workload("poll+ack x1", poll_ack_step, 1, 0.70, backlog=self.backlog_single),
            Workload("poll+ack x100", poll_ack_step, 100, 0.85, backlog=self.backlog_batch),
        ]


FULL = Config("full", (1, 4, 16), 1.0, 3.0, 20_000, 200_000, (0, 100_000, 1_000_000), 500, 50, repeat=2)
QUICK = Config("quick", (1, 4), 0.5, 1.5, 20_000, 60_000, (0, 100_000), 200, 20, repeat=1)


# --------------------------------------------------------------------------- poll latency


def _ms(samples: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(samples) * 1e3,
        "p99_ms": statistics.quantiles(samples, n=100, method="inclusive")[98] * 1e3,
    }


def measure_latency(admin: psycopg.Connection[Any], dsn: str, side: Side, future: int, cfg: Config) -> dict[str, Any]:
    """Poll latency with `future` messages scheduled a day ahead: per sample, offer one due
    message, time poll(1) and ack, then time a poll(1) that finds nothing due."""
    prepare_table(admin, side, future_rows=future)
    poll, poll_ack, empty = [], [], []
    with connect(dsn) as conn:
        cur = conn.cursor()
        snap, start = CpuSnapshot.take(os.getpid(), conn.info.dbname), time.perf_counter()
        for i in range(cfg.latency_warmup + cfg.latency_samples):
            cur.execute(side.offer, (QUEUE, f"lat-{i:06d}", PAYLOAD))
            t0 = time.perf_counter()
            cur.execute(side.poll, (QUEUE, 1))
            rows = cur.fetchall()
            t1 = time.perf_counter()
            if len(rows) != 1:
                raise RuntimeError(f"{side.name}: poll found {len(rows)} rows, expected the one offered")
            cur.execute(side.ack, ([rows[0][3]],))
            t2 = time.perf_counter()
            cur.execute(side.poll, (QUEUE, 1))
            if cur.fetchall():
                raise RuntimeError(f"{side.name}: poll found a message where none was due")
            t3 = time.perf_counter()
            if i >= cfg.latency_warmup:
                poll.append(t1 - t0)
                poll_ack.append(t2 - t0)
                empty.append(t3 - t2)
        cpu = snap.until(CpuSnapshot.take(os.getpid(), conn.info.dbname), time.perf_counter() - start)
    return {
        "side": side.name,
        "future_messages": future,
        "other_cpu": cpu["other_cpu"],
        "poll_due": _ms(poll),
        "poll_ack_due": _ms(poll_ack),
        "poll_nothing_due": _ms(empty),
    }


# --------------------------------------------------------------------------- report


THROUGHPUT_COLUMNS = ("workload", "clients", "dq_* rows/s", "baseline rows/s", "ratio", "target", "",
                      "server µs/row dq | base", "other CPU")


def throughput_table(cells: list[dict[str, Any]]) -> Table:
    rows = []
    for c in cells:
        note = " (drained)" if c["dq"]["exhausted"] or c["baseline"]["exhausted"] else ""
        other = max(r["other_cpu"] for side in SIDES for r in c["runs"][side.name])
        rows.append((
            c["workload"],
            str(c["clients"]),
            f"{c['dq']['rows_per_s']:,.0f}",
            f"{c['baseline']['rows_per_s']:,.0f}",
            f"{c['ratio']:.0%}",
            f"≥ {c['target']:.0%}",
            status(c["pass"]) + note,
            f"{c['dq']['server_us_per_row']:,.1f} | {c['baseline']['server_us_per_row']:,.1f}",
            f"{other:.0%}",
        ))
    return rich_table(
        "Throughput (rows/s; dq_* functions vs plain SQL on the same table shape)", THROUGHPUT_COLUMNS, rows,
        left={"workload"},
        caption="best of the runs of each side. server µs/row: CPU time of the database's backends per row "
        "(the waiters' included). other CPU: the most CPU (share of all cores) that processes "
        "outside the benchmark used during any run of the cell",
    )


def latency_table(lat: list[dict[str, Any]], verdict: dict[str, Any]) -> Table:
    columns = ["future msgs", "operation"]
    for side in SIDES:
        columns += [f"{side.name} median", f"{side.name} p99"]
    rows = []
    for size in sorted({r["future_messages"] for r in lat}):
        by_side = {r["side"]: r for r in lat if r["future_messages"] == size}
        for op, label in (
            ("poll_due", "poll (1 due)"),
            ("poll_ack_due", "poll + ack (1 due)"),
            ("poll_nothing_due", "poll (nothing due)"),
        ):
            cells = []
            for side in SIDES:
                m = by_side[side.name][op]
                cells += [f"{m['median_ms']:.3f}", f"{m['p99_ms']:.3f}"]
            rows.append((f"{size:,}", label, *cells))
    return rich_table(
        "Poll latency, ms (one client; median / p99)", columns, rows, left={"operation"},
        caption=f"dq poll+ack median at {verdict['future_messages']:,} future messages = "
        f"{verdict['factor']:.2f}× the empty table (target ≤ 2×): {status(verdict['pass'])}",
    )


def tables(report: dict[str, Any]) -> list[Table]:
    return [throughput_table(report["throughput"]), latency_table(report["latency"], report["latency_target"])]


BEST_FIGURES = ("rows_per_s", "server_us_per_row", "wal_bytes_per_row", "other_cpu", "exhausted", "notified_share")
RUN_FIGURES = ("rows_per_s", "server_us_per_row", "other_cpu")


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the tables show, with the configuration, server and commit measured: of the best run of
    each side its rates, CPU, WAL and whether it drained the backlog; of every run its rows/s, server
    µs/row and other CPU."""

    def figures(run: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        return {k: run[k] for k in keys}

    cells = [{**c, **{side: figures(c[side], BEST_FIGURES) for side in ("dq", "baseline")},
              "runs": {side: [figures(r, RUN_FIGURES) for r in rs] for side, rs in c["runs"].items()}}
             for c in report["throughput"]]
    return {**report, "throughput": cells}


# --------------------------------------------------------------------------- main


def measure_cell(admin: psycopg.Connection[Any], dsn: str, wl: Workload, clients: int, cfg: Config) -> dict[str, Any]:
    """Run both sides of one (workload, clients) cell `cfg.repeat` times, alternating which side
    goes first; the best run of each side counts (the least disturbed on a shared host)."""
    runs: dict[str, list[RunResult]] = {side.name: [] for side in SIDES}
    for rep in range(cfg.repeat):
        for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
            prepare_table(admin, side, due_rows=wl.backlog)
            res = run_clients(admin, dsn, wl, side, clients, cfg.warmup_s, cfg.duration_s)
            runs[side.name].append(res)
            extra = "".join(
                f"; waiter {i}: asleep {w['asleep_s'] / w['elapsed_s']:.0%}, {w['notifications']:.0f} notifications,"
                f" {w['woken_by_notify']:.0f} + {w['woken_by_timer']:.0f} notify + timer wake-ups,"
                f" {w['rows']:.0f} rows consumed"
                for i, w in enumerate(res.waiters)
            )
            if res.notified_share is not None:
                extra = f"; {res.notified_share:.0%} of offers notified" + extra
            console().log(
                f"{wl.name:<23} {clients:>2} clients {side.name:<8} {res.rows_per_s:>9,.0f} rows/s"
                f"  server {res.server_us_per_row:,.0f} µs/row  WAL {res.wal_bytes_per_row:,.0f} B/row"
                f"  other CPU {res.other_cpu:.0%}" + (" [yellow](backlog drained)[/]" if res.exhausted else "") + extra
            )
    best = {name: max(rs, key=lambda r: r.rows_per_s) for name, rs in runs.items()}
    ratio = best["dq"].rows_per_s / best["baseline"].rows_per_s
    return {
        "workload": wl.name,
        "clients": clients,
        "batch": wl.batch,
        "waiters": wl.waiters,
        "waiters_consume": wl.waiters_consume,
        "backlog": wl.backlog,
        "target": wl.target,
        "ratio": ratio,
        "pass": ratio >= wl.target,
        **{name: asdict(r) for name, r in best.items()},
        "runs": {name: [asdict(r) for r in rs] for name, rs in runs.items()},
    }


def run(admin_dsn: str, cfg: Config, out: Path | None, db_name: str) -> dict[str, Any]:
    started = time.perf_counter()
    console().log(f"[bold]bench.core[/] ({cfg.mode}): creating database {db_name}")
    dsn = create_database(admin_dsn, db_name)
    with psycopg.connect(dsn, autocommit=True) as admin:
        server, source = server_info(admin), provenance(admin)
        cells = [measure_cell(admin, dsn, wl, clients, cfg) for wl in cfg.workloads() for clients in cfg.clients]
        latency = []
        for size in cfg.latency_sizes:
            for side in SIDES:
                latency.append(measure_latency(admin, dsn, side, size, cfg))
                r = latency[-1]
                console().log(
                    f"latency {size:>9,} future  {side.name:<8} poll+ack median "
                    f"{r['poll_ack_due']['median_ms']:.3f} ms, p99 {r['poll_ack_due']['p99_ms']:.3f} ms"
                    f"  other CPU {r['other_cpu']:.0%}"
                )
    dq_lat = {r["future_messages"]: r for r in latency if r["side"] == "dq"}
    largest = max(dq_lat)
    factor = dq_lat[largest]["poll_ack_due"]["median_ms"] / dq_lat[0]["poll_ack_due"]["median_ms"]
    verdict = {"future_messages": largest, "factor": factor, "target": 2.0, "pass": factor <= 2.0}
    wall = time.perf_counter() - started
    report = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": cfg.mode,
        "wall_time_s": round(wall, 1),
        "server": server,
        "source": source,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "config": {
            **asdict(cfg),
            "payload_bytes": len(PAYLOAD),
            "waiter_batch": WAITER_BATCH,
            "waiter_max_wait_s": MAX_WAIT_S,
            "prepare_threshold": 0,
        },
        "throughput": cells,
        "latency": latency,
        "latency_target": verdict,
    }
    publish("core", report, summary(report), tables(report), out, quick=cfg.mode == "quick")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.core", __doc__, quick="smoke test: 1 and 4 clients, short runs, 100k",
                       db_name="dq_bench")
    args = parser.parse_args(argv)
    run(args.dsn, QUICK if args.quick else FULL, args.out, args.db_name)


if __name__ == "__main__":
    main()
