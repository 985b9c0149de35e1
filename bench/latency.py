"""Worker benchmark: lateness, idle query rate and throughput of real `pyqueue worker` processes.

    python -m bench.latency --dsn postgresql://postgres@127.0.0.1:55432/dq [--quick] [--out PATH]

Everything runs in one database, ``dq_bench_latency`` (dropped and recreated at every run: the
queue schema installed by ``pyqueue.migrate`` and the baseline table ``bench_baseline``), on the
server of ``--dsn``. The workers are
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
   run, the plain-SQL baseline (bench.lib.sides' BASELINE poll + ack on ``bench_baseline``) drains
   the same 100,000 rows with as many client processes and the same batch size.

Every throughput run also records the CPU time of the consumers (workers or baseline clients,
and this driver) and of the database's backends per message, the share of the machine other
processes took (bench.lib.cpu), and the transactions committed in the database per
message (``pg_stat_database.xact_commit``: in autocommit, one per statement, i.e. round trips).

Workers are always stopped (SIGTERM, then SIGKILL after a timeout), also on errors and when
this driver is interrupted; they also get SIGTERM if the driver dies (PR_SET_PDEATHSIG).

Results: the full report in ``bench/results/raw/latency-<UTC time>.json``, its summary in
``bench/results/latency.json`` (``latency-quick.json`` with --quick); with ``--out x.json``, to
x.json and x.summary.json instead (see bench/README.md).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.handlers import LATENESS_FILE_ENV
from bench.lib.database import (
    DRAIN_POLL_S,
    create_database,
    drain,
    function_stats,
    prepare_table,
    server_info,
    source_info,
    stats_since,
    tracked,
)
from bench.lib.report import arguments, console, machine_info, percentile, publish, rich_table, status, without
from bench.lib.sides import DQ, PAYLOAD, QUEUE, value
from bench.lib.workers import STATS_SETTLE_S, Drain, Workers, interrupt_on_sigterm, run_baseline_side, run_workers_side

if TYPE_CHECKING:
    from rich.table import Table

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

    def drain(self) -> Drain:
        """The throughput part's backlog and consumers."""
        return Drain(self.backlog, self.batch_size, self.concurrency, self.use_async, self.analyze_backlog)


FULL = Config("full", lateness_messages=10_000, lateness_span_s=30.0, idle_s=20.0, backlog=100_000)
QUICK = Config("quick", lateness_messages=2_000, lateness_span_s=10.0, idle_s=10.0, backlog=20_000)


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


def throughput_part(admin: psycopg.Connection[Any], dsn: str, cfg: Config, workdir: Path) -> list[dict[str, Any]]:
    cells = []
    for i, workers_n in enumerate(cfg.throughput_workers):
        cell: dict[str, Any] = {"processes": workers_n, "backlog": cfg.backlog, "batch_size": cfg.batch_size}
        for side in ("workers", "baseline") if i % 2 == 0 else ("baseline", "workers"):
            if side == "workers":
                cell[side] = run_workers_side(admin, dsn, cfg.drain(), workers_n, workdir)
            else:
                cell[side] = run_baseline_side(admin, dsn, cfg.drain(), workers_n)
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


def lateness_table(r: dict[str, Any]) -> Table:
    return rich_table(
        f"1. Lateness: handler start − scheduled_at, ms ({r['messages']:,} messages due evenly over "
        f"{r['span_s']:.0f} s, {r['workers']} idle workers)",
        ("p50", "p99", "max", "handled", "duplicates", "lost", "target", ""),
        [(f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['max_ms']:.1f}", f"{r['handled']:,}", str(r["duplicates"]),
          str(r["lost"]), f"p99 < {r['target_p99_ms']:.0f}", status(r["pass"]))],
        caption=f"worker flags: {r['worker_flags']}. One dq_offer_many of {r['offer_ms']:.0f} ms, committed "
        f"{'before' if r['offer_committed_before_first_due'] else '[red]after[/]'} the first message was "
        f"due ({r['lead_s']:.1f} s after the offer began); min {r['min_ms']:.1f} ms, mean "
        f"{r['mean_ms']:.1f} ms; per worker {r['per_worker_handled']}",
    )


def idle_table(r: dict[str, Any]) -> Table:
    return rich_table(
        f"2. Idle workers: queries on the server ({r['workers']} workers, empty queue, "
        f"idle_check {r['idle_check_s']:.0f} s)",
        ("workers' life s", "dq_poll_or_wait", "dq_channel", "queries", "queries/s per worker",
         "expected 1/idle_check", "budget per worker", ""),
        [(f"{r['life_s']:.1f}", str(r["calls"].get("dq_poll_or_wait", 0)), str(r["calls"].get("dq_channel", 0)),
          str(r["queries"]), f"{r['queries_per_s_per_worker']:.3f}", f"{r['expected_per_s']:.3f}",
          f"≤ {r['budget_per_worker']}", status(r["pass"]))],
        caption=f"counted with track_functions on the workers' sessions (pg_stat_user_functions): {r['calls']}; "
        "queries = calls not made inside dq_poll_or_wait. The life includes start-up (ready after "
        f"{r['ready_s']:.1f} s); budget: a dq_poll_or_wait at start and per idle_check, one dq_channel",
    )


def throughput_table(cells: list[dict[str, Any]], cfg: Config) -> Table:
    rows = []
    for c in cells:
        w, b = c["workers"], c["baseline"]
        rows.append((
            str(c["processes"]), f"{w['rows_per_s']:,.0f}" + "*" * bool(w["autovacuums"]),
            f"{b['rows_per_s']:,.0f}" + "*" * bool(b["autovacuums"]), f"{c['ratio']:.0%}",
            f"{w['xacts_per_row']:.3f} | {b['xacts_per_row']:.3f}",
            f"{w['consumer_us_per_row']:.0f} | {b['consumer_us_per_row']:.0f}",
            f"{w['server_us_per_row']:.0f} | {b['server_us_per_row']:.0f}",
            f"{w['msgs_per_poll']:.0f}", f"{w['poll_ms']:.1f} | {w['ack_ms']:.1f}",
            f"{max(w['other_cpu'], b['other_cpu']):.0%}",
        ))
    dups = sorted({c[side]["duplicates"] for c in cells for side in ("workers", "baseline")})
    return rich_table(
        f"3. Throughput: a backlog of {cfg.backlog:,} due messages committed at once, no-op handler "
        "(messages/s from the commit until the queue is empty)",
        ("procs", "workers\nmsg/s", "baseline\nrows/s", "ratio", "xacts/msg\nw | b", "consumer\nµs/msg w | b",
         "server\nµs/msg w | b", "msgs/poll\nw", "poll | ack\nms w", "other\nCPU"),
        rows,
        caption=f"workers: pyqueue worker {' '.join(cfg.drain().worker_flags())} bench.handlers:"
        f"{'noop_async' if cfg.use_async else 'noop'}; baseline: bench.core BASELINE poll + ack (plain SQL on "
        f"bench_baseline), batch {cfg.batch_size}, as many client processes. w | b: workers | baseline. xacts/msg: "
        "transactions in the database per message (one per statement; the driver's own excluded). consumer: CPU of "
        "the worker processes or baseline clients (and this driver); server: CPU of the database's backends (the "
        "driver's counting excluded). msgs/poll, poll | ack ms: per dq_poll_many / dq_ack call, server time "
        "(track_functions). other CPU: the most any run saw taken by processes outside the benchmark (share of all "
        f"cores). Duplicates delivered: {dups}. *: autovacuum vacuumed or analyzed the table during the run, so "
        "the sessions re-planned their cached statements on it (the workers planned theirs on the empty table)"
        + (". DIAGNOSTIC: the table was ANALYZEd right after the commit (in the measured time)"
           if cfg.analyze_backlog else ""),
    )


def tables(report: dict[str, Any]) -> list[Table]:
    cfg = Config(**{f.name: report["config"][f.name] for f in fields(Config) if f.name in report["config"]})
    return [lateness_table(report["lateness"]), idle_table(report["idle"]),
            throughput_table(report["throughput"], cfg)]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the tables show, with the configuration, machine, server and commit measured: without
    the workers' own counters and log warnings, and per throughput run without its per-function
    statistics and per-process counts."""
    per_process = ("worker_warnings", "functions", "per_worker_delivered", "per_client_rows")
    return {
        **report,
        "lateness": without(report["lateness"], "worker_stats", "worker_warnings"),
        "throughput": [{**c, "workers": without(c["workers"], *per_process),
                        "baseline": without(c["baseline"], *per_process)} for c in report["throughput"]],
    }


# --------------------------------------------------------------------------- main


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
            "throughput_worker_flags": list(cfg.drain().worker_flags()),
            "payload_bytes": len(PAYLOAD),
            "lead_s": LEAD_S,
            "drain_poll_s": DRAIN_POLL_S,
            "database": db_name,
        },
        "lateness": lateness,
        "idle": idle,
        "throughput": throughput,
    }
    publish("latency", report, summary(report), tables(report), out, quick=cfg.mode == "quick", at=timestamp)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.latency", __doc__, db_name="dq_bench_latency",
                       quick="development: 2,000 messages over 10 s, 10 s idle, a backlog of 20,000")
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
    main()
