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

This module holds the configuration and the three parts; each library's adapter (install, enqueue,
fill, workers) is in bench.peers_adapters, the verdicts, tables, summary and docs in bench.peers_report.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.lib.cpu import Window
from bench.lib.database import drain_until, server_info, source_info, xacts
from bench.lib.report import arguments, console, machine_info, percentile, publish
from bench.lib.workers import STATS_SETTLE_S, Drain, interrupt_on_sigterm, run_baseline_side, run_workers_side
from bench.peers_adapters import BASELINE_CONTENDER, LIBRARIES, Contender, Library, Meter
from bench.peers_report import DOCS, chart, faster_ours, markdown_report, rich_tables, summary, targets

LATENCY_SLACK_S = 30.0  # how long after the last due time the handlers may still report
DELAY_STEP_S = 0.1  # due times of the delayed latency jobs are multiples of this (procrastinate batches by time)


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


# --------------------------------------------------------------------------- measurements


def _delays(cfg: Config) -> list[float]:
    """The delayed latency jobs' delays: evenly from delayed_from_s to delayed_to_s, in DELAY_STEP_S steps."""
    n, lo, hi = cfg.delayed_jobs, cfg.delayed_from_s, cfg.delayed_to_s
    return [round((lo + (hi - lo) * i / max(n - 1, 1)) / DELAY_STEP_S) * DELAY_STEP_S for i in range(n)]


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
