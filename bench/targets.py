"""Speed targets: the figures a user comparing queues measures first, each as a ratio to plain SQL
doing the same work on the same server in the same run, as the median of several runs with their spread.

    python -m bench.targets --dsn postgresql://postgres@127.0.0.1:55432/dq [--quick] [--repeat 3]
                            [--only KEY,...] [--out PATH]

Everything runs in one database, ``dq_bench_targets`` (dropped and recreated: the queue schema and
the baseline table ``bench_baseline``, see bench/README.md "The baseline"). Each figure is one
comparison, run ``--repeat`` times (default 3); within a repeat both sides run back to back, the
side that goes first alternating between repeats. A repeat's ratio is the queue's rate over the
baseline's; the figure is the median ratio, with the lowest and highest beside it (the spread of
identical runs on this host), and the median rate of each side.

Row-by-row paths (one message per call; no target, reported so that they are never mixed up with
the batched ones):

* ``offer``: ``dq_offer`` from 4 client processes, against a prepared ``INSERT … ON CONFLICT DO NOTHING``;
* ``poll_ack_1``: ``dq_poll_many(1)`` + ``dq_ack_many``, 1 client, against the baseline's
  ``UPDATE … SKIP LOCKED RETURNING`` + ``DELETE`` of one row.

Batched paths and worker processes (each with its target):

* ``offer_many``: ``dq_offer_many`` batches of 100 from 4 clients, against ``INSERT … SELECT unnest(…)
  ON CONFLICT DO NOTHING``; target 0.90;
* ``poll_ack``: ``dq_poll_many(100)`` + ``dq_ack_many``, 1 client, against the baseline loop at batch
  100; target 0.90;
* ``worker_async``: one ``pyqueue worker --async --concurrency 100 --batch-size 100`` process with a
  no-op coroutine handler drains a backlog of 30,000 due messages committed in one transaction,
  against one baseline client draining the same backlog at batch 100 (bench.lib.workers, as
  bench.latency measures its throughput); target 0.80;
* ``worker_sync``: the same with one sync ``pyqueue worker`` and a no-op function; target 0.75;
* ``worker_async_plain``: one ``pyqueue worker --async`` with a plain (non-coroutine) no-op function;
  target 0.60;
* ``workers16``: 16 sync worker processes (same flags) against 16 baseline clients, 100,000
  messages (bench.peers' processing figure); target 0.90.

The client-side figures run ``bench.core``'s workloads (bench.lib.clients) for 1 s of warm-up and
3 s of measurement per side. Every run records the share of the machine other processes took
(``other CPU``): on a shared host, compare ratios, not rates. A verdict is PASS when the median
ratio meets the target, MISS otherwise; a miss never fails the run.

``--quick`` (smaller backlogs, shorter runs, one repeat) is a smoke test: its ratios are indicative
only. Results: the full report in ``bench/results/raw/targets-<UTC time>.json``, its summary in
``bench/results/targets.json`` (``targets-quick.json`` with --quick); with ``--out x.json``, to
x.json and x.summary.json instead (see bench/README.md).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench import core
from bench.lib.clients import run_clients
from bench.lib.database import create_database, prepare_table, provenance, server_info
from bench.lib.report import arguments, console, machine_info, publish, rich_table, status
from bench.lib.sides import BASELINE, DQ, Side, Workload
from bench.lib.workers import Drain, interrupt_on_sigterm, run_baseline_side, run_workers_side

if TYPE_CHECKING:
    from rich.table import Table

DB_NAME = "dq_bench_targets"
SIDES = ("dq", "baseline")


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    mode: str
    repeat: int
    warmup_s: float
    duration_s: float
    poll_backlog: int  # due messages loaded before a poll+ack x100 run (both sides)
    poll_backlog_single: int  # ... before a poll+ack x1 run
    worker_backlog: int  # the backlog one worker process drains
    many_backlog: int  # the backlog 16 worker processes drain
    many_workers: int = 16


FULL = Config("full", 3, 1.0, 3.0, 250_000, 20_000, 30_000, 100_000)
QUICK = Config("quick", 1, 0.3, 1.0, 80_000, 5_000, 5_000, 10_000, many_workers=4)


@dataclass(frozen=True)
class Figure:
    key: str
    path: str  # "row by row", "batched" or "worker"
    title: str  # what the queue side does
    baseline: str  # what the plain-SQL side does
    target: float | None


FIGURES = (
    Figure("offer", "row by row", "dq_offer, 4 clients", "INSERT … ON CONFLICT DO NOTHING", None),
    Figure("poll_ack_1", "row by row", "dq_poll_many(1) + dq_ack_many, 1 client",
           "UPDATE … SKIP LOCKED RETURNING + DELETE, 1 row", None),
    Figure("offer_many", "batched", "dq_offer_many x100, 4 clients",
           "INSERT … SELECT unnest … ON CONFLICT DO NOTHING", 0.90),
    Figure("poll_ack", "batched", "dq_poll_many(100) + dq_ack_many, 1 client",
           "UPDATE … SKIP LOCKED RETURNING + DELETE, 100 rows", 0.90),
    Figure("worker_async", "worker", "1 worker --async, coroutine no-op", "1 baseline client", 0.80),
    Figure("worker_sync", "worker", "1 sync worker, function no-op", "1 baseline client", 0.75),
    Figure("worker_async_plain", "worker", "1 worker --async, plain-function no-op", "1 baseline client", 0.60),
    Figure("workers16", "worker", "16 sync workers", "16 baseline clients", 0.90),
)
BY_KEY = {f.key: f for f in FIGURES}


# --------------------------------------------------------------------------- one repeat of a figure

# A side of a figure: runs it once and returns (rows/s, other CPU share, details).
Runner = Callable[[], tuple[float, float, dict[str, Any]]]


def _client_runner(admin: psycopg.Connection[Any], dsn: str, wl: Workload, side: Side, clients: int,
                   cfg: Config) -> Runner:
    def run() -> tuple[float, float, dict[str, Any]]:
        prepare_table(admin, side, due_rows=wl.backlog)
        res = run_clients(admin, dsn, wl, side, clients, cfg.warmup_s, cfg.duration_s)
        if res.exhausted:
            console().log(f"[yellow]{wl.name} {side.name}: the backlog ran out; raise the backlog[/]")
        return res.rows_per_s, res.other_cpu, asdict(res)
    return run


def _drain_runner(admin: psycopg.Connection[Any], dsn: str, spec: Drain, processes: int, side: str,
                  workdir: Path) -> Runner:
    def run() -> tuple[float, float, dict[str, Any]]:
        if side == "dq":
            res = run_workers_side(admin, dsn, spec, processes, workdir)
            if res["duplicates"] or res["delivered"] < spec.backlog:
                raise RuntimeError(f"workers delivered {res['delivered']} of {spec.backlog}")
        else:
            res = run_baseline_side(admin, dsn, spec, processes)
        return res["rows_per_s"], res["other_cpu"], res
    return run


def runners(admin: psycopg.Connection[Any], dsn: str, key: str, cfg: Config, workdir: Path) -> dict[str, Runner]:
    """The two sides of figure `key`."""
    sides = {"dq": DQ, "baseline": BASELINE}
    # bench.core's workloads, with this benchmark's backlogs and client counts.
    workloads = {wl.name: wl for wl in core.FULL.workloads()}
    client_figures = {
        "offer": (workloads["offer"], 4),
        "poll_ack_1": (replace(workloads["poll+ack x1"], backlog=cfg.poll_backlog_single), 1),
        "offer_many": (workloads["offer_many x100"], 4),
        "poll_ack": (replace(workloads["poll+ack x100"], backlog=cfg.poll_backlog), 1),
    }
    if key in client_figures:
        wl, clients = client_figures[key]
        return {name: _client_runner(admin, dsn, wl, side, clients, cfg) for name, side in sides.items()}
    one = Drain(cfg.worker_backlog, batch_size=100, concurrency=100)
    specs = {
        "worker_async": (replace(one, use_async=True), 1),
        "worker_sync": (one, 1),
        "worker_async_plain": (replace(one, use_async=True, handler="bench.handlers:noop"), 1),
        "workers16": (replace(one, backlog=cfg.many_backlog), cfg.many_workers),
    }
    spec, processes = specs[key]
    return {name: _drain_runner(admin, dsn, spec, processes, name, workdir) for name in SIDES}


def measure(admin: psycopg.Connection[Any], dsn: str, figure: Figure, cfg: Config, workdir: Path) -> dict[str, Any]:
    """Run both sides of `figure` cfg.repeat times, alternating which goes first."""
    sides = runners(admin, dsn, figure.key, cfg, workdir)
    runs: list[dict[str, Any]] = []
    for rep in range(cfg.repeat):
        run: dict[str, Any] = {}
        for name in SIDES if rep % 2 == 0 else SIDES[::-1]:
            rate, other, details = sides[name]()
            run[name] = {"rows_per_s": rate, "other_cpu": other, "details": details}
        run["ratio"] = run["dq"]["rows_per_s"] / run["baseline"]["rows_per_s"]
        runs.append(run)
        console().log(
            f"{figure.key:<19} run {rep + 1}/{cfg.repeat}: dq {run['dq']['rows_per_s']:>9,.0f}/s "
            f"baseline {run['baseline']['rows_per_s']:>9,.0f}/s  ratio {run['ratio']:.2f}  other CPU "
            f"{run['dq']['other_cpu']:.0%} | {run['baseline']['other_cpu']:.0%}"
        )
    ratios = [r["ratio"] for r in runs]
    median = statistics.median(ratios)

    def cpu(side: str, key: str) -> float | None:
        values = [r[side]["details"].get(key) for r in runs]
        return None if None in values else statistics.median(values)
    return {
        **asdict(figure),
        "ratio": median,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "dq_rows_per_s": statistics.median(r["dq"]["rows_per_s"] for r in runs),
        "baseline_rows_per_s": statistics.median(r["baseline"]["rows_per_s"] for r in runs),
        "other_cpu_max": max(max(r["dq"]["other_cpu"], r["baseline"]["other_cpu"]) for r in runs),
        # CPU per row (µs, medians): the database's backends, and the consumer processes (worker figures)
        "server_us": {side: cpu(side, "server_us_per_row") for side in SIDES},
        "consumer_us": {side: cpu(side, "consumer_us_per_row") for side in SIDES},
        "pass": None if figure.target is None else median >= figure.target,
        "runs": runs,
    }


# --------------------------------------------------------------------------- report


def _us(pair: dict[str, float | None] | None) -> str:
    """A side-by-side CPU figure (queue | plain SQL, µs per row), blank where not measured."""
    if not pair or pair.get("dq") is None or pair.get("baseline") is None:
        return ""
    return f"{pair['dq']:.1f} | {pair['baseline']:.1f}"


def figures_table(report: dict[str, Any]) -> Table:
    rows = []
    for f in report["figures"]:
        target = f["target"]
        rows.append((
            f["path"], f["title"], f["baseline"], f"{f['dq_rows_per_s']:,.0f}", f"{f['baseline_rows_per_s']:,.0f}",
            f"{f['ratio']:.2f}", f"{f['ratio_min']:.2f}–{f['ratio_max']:.2f}", _us(f.get("server_us")),
            _us(f.get("consumer_us")), f"{f['other_cpu_max']:.0%}",
            "" if target is None else f"≥ {target:.2f}", "" if target is None else status(f["pass"]),
        ))
    repeat = report["config"]["repeat"]
    return rich_table(
        f"Speed targets ({report['mode']}): the queue / plain SQL on the same server, median of {repeat} "
        f"run{'s' if repeat > 1 else ''} (rates: rows/s, medians)",
        ("path", "queue", "plain SQL", "queue/s", "plain/s", "ratio", "spread", "server µs/row q|p",
         "consumer µs/row q|p", "other CPU", "target", "verdict"),
        rows, left=("path", "queue", "plain SQL"),
    )


def markdown(summary: dict[str, Any]) -> str:
    """The figures as the markdown table docs/performance.md quotes ("Speed targets")."""
    repeat = summary["config"]["repeat"]
    lines = [
        f"`python -m bench.targets` ({summary['mode']}, {summary['timestamp']}, commit "
        f"{summary['source'].get('git_head', '?')[:7]}): median of {repeat} runs; "
        "ratio = queue / plain SQL within a run.",
        "",
        "| path | queue | plain SQL | queue/s | plain/s | ratio | spread | other CPU | target | verdict |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for f in summary["figures"]:
        target = f["target"]
        lines.append(
            f"| {f['path']} | {f['title']} | {f['baseline']} | {f['dq_rows_per_s']:,.0f} | "
            f"{f['baseline_rows_per_s']:,.0f} | {f['ratio']:.2f} | {f['ratio_min']:.2f}–{f['ratio_max']:.2f} | "
            f"{f['other_cpu_max']:.0%} | {'' if target is None else f'≥ {target:.2f}'} | "
            f"{'' if target is None else ('PASS' if f['pass'] else 'MISS')} |"
        )
    return "\n".join(lines) + "\n"


def tables(report: dict[str, Any]) -> list[Table]:
    return [figures_table(report)]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The figures without the per-run details (the ratios and rates of each run stay)."""
    figures = [
        {**{k: v for k, v in f.items() if k != "runs"},
         "runs": [{"ratio": r["ratio"], **{s: {"rows_per_s": r[s]["rows_per_s"], "other_cpu": r[s]["other_cpu"]}
                                           for s in SIDES}} for r in f["runs"]]}
        for f in report["figures"]
    ]
    return {**{k: v for k, v in report.items() if k != "figures"}, "figures": figures}


def run(admin_dsn: str, cfg: Config, keys: list[str], out: Path | None, db_name: str) -> dict[str, Any]:
    started = time.perf_counter()
    console().log(f"[bold]bench.targets[/] ({cfg.mode}): creating database {db_name}")
    dsn = create_database(admin_dsn, db_name)
    with psycopg.connect(dsn, autocommit=True) as admin, tempfile.TemporaryDirectory() as tmp:
        server, source = server_info(admin), provenance(admin)
        figures = [measure(admin, dsn, BY_KEY[k], cfg, Path(tmp)) for k in keys]
    report = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": cfg.mode,
        "wall_time_s": round(time.perf_counter() - started, 1),
        "server": server,
        "source": source,
        "machine": machine_info(),
        "cpu_count": os.cpu_count(),
        "psycopg": psycopg.__version__,
        "config": asdict(cfg),
        "figures": figures,
    }
    publish("targets", report, summary(report), tables(report), out, quick=cfg.mode == "quick")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.targets", __doc__, quick="smaller backlogs, shorter runs, one repeat",
                       db_name=DB_NAME)
    parser.add_argument("--repeat", type=int, default=None, help="runs per figure (default 3; 1 with --quick)")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated figures to run (default all: {','.join(BY_KEY)})")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.repeat is not None:
        if args.repeat < 1:
            parser.error("--repeat must be at least 1")
        cfg = replace(cfg, repeat=args.repeat)
    keys = list(BY_KEY) if args.only is None else [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown or not keys:
        parser.error(f"--only: unknown figure(s) {', '.join(unknown)}; known: {', '.join(BY_KEY)}")
    with interrupt_on_sigterm():
        run(args.dsn, cfg, keys, args.out, args.db_name)


if __name__ == "__main__":
    main()
