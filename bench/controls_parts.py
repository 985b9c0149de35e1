"""Delivery-controls benchmark: what priorities, FIFO groups and rate limits cost, and how exact they are.

    python -m bench.controls --dsn postgresql://postgres@127.0.0.1:55432/dq [--quick] [--rows N] [--out PATH]
        [--parts regression,backlog,rate,levels] [--levels 1,100,20000,65536] [--level-samples N]

Four parts, on the server of ``--dsn``, in two databases dropped and recreated at every run:
``<prefix>`` (default ``dq_bench_controls``: this checkout's schema and bench.core's baseline
table) and ``<prefix>_old`` (the release before the controls).

1. **Regression.** A queue that uses none of the controls: batched offers (``dq_offer_many`` of
   100 and 1,000) and poll + ack (batches of 1 and 100) with bench.core's workloads and harness,
   on three sides: this checkout's functions (``new``), the functions of the release before the
   controls (``old``: the ``pyqueue``, ``migrations/`` and ``sql/`` of ``--old-ref``, by default
   the parent of the commit that added ``migrations/0011_delivery_controls.sql``, extracted with
   ``git archive`` and installed into a database of its own by its own ``pyqueue.migrate``), and
   bench.core's plain-SQL baseline. Each cell runs ``--repeat`` times (default 3), the sides in
   rotating order; the median counts, the spread is reported. Target: new / old >= 95 %.
2. **Due backlogs.** ``--rows`` (default 1,000,000) due messages, loaded with ``dq_offer_many``
   in batches of 10,000 (one backlog at a time: each load empties every queue table first):
   ``plain`` (no priority, no group), ``priorities`` (5 levels, -2..2, round robin), ``groups``
   (rows / 10 FIFO groups of 10 messages; message g belongs to group g mod groups, so a group's
   messages are spread over the whole backlog and the first rows / 10 due are all heads), and the
   plain-SQL baseline (bench.core's BASELINE fill: plain INSERT). Per repetition and backlog, in
   rotating order: load it afresh; time ``dq_poll_many(q, 100)`` and the ``dq_ack`` of what it
   returned, per call, from one session (p50 / p95 over all repetitions); in the first repetition,
   the plans of one poll and its ack (auto_explain with nested statements, ANALYZE and BUFFERS);
   then the drain rate of 4 client processes polling 100 and acknowledging (bench.core's
   run_clients: barrier, warm-up, a fixed measured time). Targets: poll p50 < 5 ms; drain of
   ``priorities`` and ``groups`` >= 50 % of ``plain``.
3. **Rate-limit precision.** ``dq_configure_queue(q, rate_limit => 1000, rate_period => '1
   second')`` on a due backlog larger than what can be delivered, 8 greedy client processes
   (poll 100, ack, again at once) for a warm-up of 2 s and 30 s measured. Every delivery's
   ``claimed_at`` (from ``dq_poll_many``) is collected; the rate is the deliveries claimed in the
   measured 30 s divided by 30 s, and the maximum count in any window [t, t + 1 s) is found over
   the sorted timestamps (every delivery of the run, the warm-up included). Targets: rate within
   5 % of 1000/s; no window above 1000.

4. **Priority levels.** For 1, 100, 20,000 and 65,536 levels (``--levels``) of messages due in a
   day, one message at each priority (centred on 0; 65,536 fills the whole smallint range), in
   three layouts: ``ungrouped`` (loaded with ``dq_offer_many``), ``grouped`` (each message heads a
   FIFO group of its own; written directly into ``dq_messages`` and ``dq_groups``, as the offer
   would leave them) and ``baseline`` (the same rows in bench.core's plain table, polled by one
   plain SQL statement over the due rows ordered by priority, then due time: the cost of reading
   the index once). Per cell, from one session: ``--level-samples`` empty polls
   (``dq_poll_many(q, 1)``), then the same with one due message at the lowest priority (each
   poll in a transaction that is rolled back, so the message stays due), p50 / p95; the shared
   buffers one such poll touches (``EXPLAIN (ANALYZE, BUFFERS)``, nested statements included);
   and, for the queue's functions, ``dq_wait(q, 1 s)`` on the empty queue (an idle consumer's
   other call). Target: an empty poll under 5 ms at every level count.

The machine may be shared: each figure comes with the CPU other processes took meanwhile
(bench.core's CpuSnapshot) and the spread of the repetitions.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue as queue_mod
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from bench import core
from bench.lib.clients import BARRIER_TIMEOUT_S, RunResult, join_or_terminate, run_clients
from bench.lib.cpu import CpuSnapshot
from bench.lib.database import (
    create_database,
    function_stats,
    prepare_table,
    provenance,
    recreate_database,
    server_info,
    stats_since,
    tracked,
)
from bench.lib.report import PROJECT, arguments, console, machine_info, percentile, publish, rich_table, status, without
from bench.lib.sides import (
    BASELINE,
    DQ,
    FILL_BATCH,
    PAYLOAD,
    QUEUE,
    Side,
    Workload,
    connect,
    poll_ack_step,
    value,
)
from bench.lib.workers import STATS_SETTLE_S

if TYPE_CHECKING:
    from rich.table import Table

CONTROLS_MIGRATION = "migrations/0011_delivery_controls.sql"
POLL_BATCH = 100  # dq_poll_many(q, 100) in parts 2 and 3

# This checkout's functions; the controls' tables are emptied with the messages.
NEW = replace(DQ, name="new", truncate=(*DQ.truncate, "dq_groups", "dq_rate_tokens"))
# The release before the controls, in a database of its own (same statements).
OLD = replace(DQ, name="old")

# The backlogs of part 2: bench.core's fill with priorities (g mod levels, centred on 0) and
# groups (g mod groups); levels 1 / groups 0 pass NULL arrays (every message at the defaults).
BACKLOG_FILL = """
    SELECT count(*)
      FROM (SELECT array_agg(%(prefix)s || lpad(g::text, 9, '0') ORDER BY g) AS k,
                   array_agg(%(payload)s::bytea ORDER BY g) AS p,
                   array_agg(%(t0)s::timestamptz + g * interval '1 millisecond' ORDER BY g) AS s,
                   array_agg(g %% %(levels)s::int - %(levels)s::int / 2 ORDER BY g) AS pr,
                   array_agg('group-' || lpad((g %% greatest(%(groups)s::int, 1))::text, 7, '0') ORDER BY g) AS mg
              FROM generate_series(%(lo)s::int, %(hi)s::int) AS g) AS a,
           LATERAL dq_offer_many(queue => %(queue)s::text, keys => a.k, payloads => a.p, scheduled_ats => a.s,
                                 priorities => CASE WHEN %(levels)s::int > 1 THEN a.pr END,
                                 message_groups => CASE WHEN %(groups)s::int > 0 THEN a.mg END)"""
# Each backlog is loaded alone: its load empties the tables of every side.
EVERY_TABLE = (*NEW.truncate, *BASELINE.truncate)
BACKLOG = replace(NEW, fill=BACKLOG_FILL, truncate=EVERY_TABLE)
BASELINE_BACKLOG = replace(BASELINE, truncate=EVERY_TABLE)

# Part 3: each delivery's claim time, in microseconds since the epoch (exact: numeric).
POLL_CLAIMED = (
    "SELECT lock_token, (extract(epoch FROM claimed_at) * 1000000)::bigint FROM dq_poll_many(%s::text, %s::int)"
)


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    mode: str
    rows: int  # messages per backlog of part 2
    clients: tuple[int, ...]  # client processes per regression cell
    repeat: int  # repetitions of every regression cell, poll sample and drain
    warmup_s: float  # regression cells (bench.core's harness)
    duration_s: float
    poll_samples: int  # timed dq_poll_many(q, 100) calls per backlog and repetition
    drain_workers: int
    drain_warmup_s: float
    drain_s: float
    priority_levels: int = 5
    group_size: int = 10
    rate_workers: int = 8
    rate_limit: int = 1000
    rate_period_s: float = 1.0
    rate_warmup_s: float = 2.0
    rate_s: float = 30.0
    target_regression: float = 0.95
    target_poll_p50_ms: float = 5.0
    target_drain: float = 0.5
    target_rate_error: float = 0.05
    level_counts: tuple[int, ...] = (1, 100, 20_000, 65_536)
    level_samples: int = 30  # timed polls per cell of part 4
    target_empty_poll_ms: float = 5.0

    @property
    def groups(self) -> int:
        return max(self.rows // self.group_size, 1)

    @property
    def rate_backlog(self) -> int:
        """Due messages for part 3: half as many again as the limit lets through in the run."""
        return int(self.rate_limit * (self.rate_warmup_s + self.rate_s + 2) / self.rate_period_s * 1.5)

    def regression_workloads(self) -> list[Workload]:
        """bench.core's batched offers and polls, with their batches and backlogs."""
        base = core.FULL if self.mode == "full" else core.QUICK
        names = ("offer_many x100", "offer_many x1000", "poll+ack x1", "poll+ack x100")
        return [replace(w, target=self.target_regression) for w in base.workloads() if w.name in names]


FULL = Config("full", rows=1_000_000, clients=(1, 4), repeat=3, warmup_s=1.0, duration_s=3.0, poll_samples=100,
              drain_workers=4, drain_warmup_s=1.0, drain_s=5.0)
QUICK = Config("quick", rows=100_000, clients=(1, 4), repeat=3, warmup_s=0.5, duration_s=1.5, poll_samples=30,
               drain_workers=4, drain_warmup_s=0.3, drain_s=1.0, level_samples=10)


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def rotated(items: tuple[Any, ...], rep: int) -> tuple[Any, ...]:
    """`items` starting at index rep (mod len): every item goes first once in len(items) repetitions."""
    k = rep % len(items)
    return items[k:] + items[:k]


# --------------------------------------------------------------------------- the old functions


def default_old_ref() -> str:
    """The parent of the commit that added the delivery-controls migration."""
    out = subprocess.run(["git", "-C", str(PROJECT), "log", "--diff-filter=A", "--format=%H", "--",
                          CONTROLS_MIGRATION], capture_output=True, text=True, check=True).stdout.split()
    if not out:
        raise SystemExit(f"bench.controls: no commit adds {CONTROLS_MIGRATION} in this checkout; pass --old-ref")
    return f"{out[-1]}^"


def install_old(admin_dsn: str, name: str, ref: str) -> tuple[str, str]:
    """(Re)create database `name` and install the functions of git revision `ref` into it, with
    that revision's own pyqueue.migrate; returns the DSN and the commit."""
    commit = subprocess.run(["git", "-C", str(PROJECT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(PROJECT), "archive", commit, "pyqueue", "migrations", "sql"],
                             capture_output=True, check=True).stdout
    dsn = recreate_database(admin_dsn, name)
    with tempfile.TemporaryDirectory(prefix="bench-controls-old-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        # The old package first on the path: its migrate reads the migrations/ and sql/ beside it.
        script = ("import importlib, sys; m = importlib.import_module('pyqueue.migrate'); "
                  "assert m.__file__.startswith(sys.argv[2]), m.__file__; m.migrate(sys.argv[1])")
        done = subprocess.run([sys.executable, "-c", script, dsn, tmp], cwd=tmp, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=tmp))
        if done.returncode != 0:
            raise RuntimeError(f"installing {ref} ({commit}) failed:\n{done.stdout}{done.stderr}")
    return dsn, commit


# --------------------------------------------------------------------------- 1. regression


def _log_run(label: str, res: RunResult) -> None:
    console().log(f"{label:<40} {res.side:<8} {res.rows_per_s:>9,.0f} rows/s  server {res.server_us_per_row:,.0f}"
                  f" µs/row  other CPU {res.other_cpu:.0%}" + (" [yellow](drained)[/]" if res.exhausted else ""))


def regression_part(cfg: Config, dbs: dict[str, tuple[psycopg.Connection[Any], str]]) -> list[dict[str, Any]]:
    """Every workload and client count, `cfg.repeat` times, the sides in rotating order."""
    sides = (NEW, OLD, BASELINE)
    cells = []
    for wl in cfg.regression_workloads():
        for clients in cfg.clients:
            runs: dict[str, list[RunResult]] = {s.name: [] for s in sides}
            for rep in range(cfg.repeat):
                for side in rotated(sides, rep):
                    admin, dsn = dbs[side.name]
                    prepare_table(admin, side, due_rows=wl.backlog)
                    res = run_clients(admin, dsn, wl, side, clients, cfg.warmup_s, cfg.duration_s)
                    _log_run(f"{wl.name} {clients} clients, run {rep + 1}", res)
                    runs[side.name].append(res)
            rates = {name: [r.rows_per_s for r in rs] for name, rs in runs.items()}
            ratio = statistics.median(rates["new"]) / statistics.median(rates["old"])
            paired = [n / o for n, o in zip(rates["new"], rates["old"], strict=True)]
            cells.append({
                "workload": wl.name, "batch": wl.batch, "backlog": wl.backlog, "clients": clients,
                "rows_per_s": {name: spread(v) for name, v in rates.items()},
                "server_us_per_row": {name: spread([r.server_us_per_row for r in rs]) for name, rs in runs.items()},
                "new_vs_old": ratio, "new_vs_old_per_run": spread(paired),
                # Server CPU per row is the steadier figure on a shared host: old / new, as a throughput ratio.
                "server_cpu_old_vs_new": statistics.median(r.server_us_per_row for r in runs["old"])
                / statistics.median(r.server_us_per_row for r in runs["new"]),
                "new_vs_baseline": statistics.median(rates["new"]) / statistics.median(rates["baseline"]),
                "old_vs_baseline": statistics.median(rates["old"]) / statistics.median(rates["baseline"]),
                "target": cfg.target_regression, "pass": ratio >= cfg.target_regression,
                "other_cpu_max": max(r.other_cpu for rs in runs.values() for r in rs),
                "exhausted": any(r.exhausted for rs in runs.values() for r in rs),
                "runs": {name: [asdict(r) for r in rs] for name, rs in runs.items()},
            })
    return cells


# --------------------------------------------------------------------------- 2. backlogs


@dataclass(frozen=True)
class Backlog:
    name: str
    side: Side
    levels: int = 1
    groups: int = 0

    def fill_params(self) -> dict[str, Any]:
        return {"levels": self.levels, "groups": self.groups}


def backlogs(cfg: Config) -> tuple[Backlog, ...]:
    return (
        Backlog("plain", BACKLOG),
        Backlog("priorities", BACKLOG, levels=cfg.priority_levels),
        Backlog("groups", BACKLOG, groups=cfg.groups),
        Backlog("baseline", BASELINE_BACKLOG),
    )


def load_backlog(admin: psycopg.Connection[Any], backlog: Backlog, rows: int) -> dict[str, Any]:
    """Empty every queue table and load `rows` due messages (bench.core's prepare_table); returns
    how long it took."""
    t0 = time.perf_counter()
    prepare_table(admin, backlog.side, due_rows=rows,
                  fill_params=backlog.fill_params() if backlog.side is BACKLOG else None)
    if backlog.side is BACKLOG:
        admin.execute("VACUUM ANALYZE dq_groups, dq_queues")
    load_s = time.perf_counter() - t0
    left = value(admin, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(backlog.side.table)))
    if left != rows:
        raise RuntimeError(f"{backlog.name}: loaded {left} rows of {rows}")
    return {"rows": rows, "load_s": load_s, "loader": "dq_offer_many" if backlog.side is BACKLOG else "INSERT"}


def time_polls(dsn: str, side: Side, samples: int) -> dict[str, Any]:
    """`samples` calls of the side's poll of POLL_BATCH, each followed by the ack of what it
    returned, timed per call from one session (statements prepared at their first execution:
    the first call of each is left out)."""
    polls, acks, sizes = [], [], []
    with connect(dsn) as conn:
        cur = conn.cursor()
        snap, start = CpuSnapshot.take(os.getpid(), conn.info.dbname), time.perf_counter()
        for i in range(samples + 1):
            t0 = time.perf_counter()
            cur.execute(side.poll, (QUEUE, POLL_BATCH))
            tokens = [row[3] for row in cur.fetchall()]
            t1 = time.perf_counter()
            if tokens:
                cur.execute(side.ack, (tokens,))
            t2 = time.perf_counter()
            if i:
                polls.append(t1 - t0)
                acks.append(t2 - t1)
                sizes.append(len(tokens))
        cpu = snap.until(CpuSnapshot.take(os.getpid(), conn.info.dbname), time.perf_counter() - start)
    return {"poll_s": polls, "ack_s": acks, "sizes": sizes, "other_cpu": cpu["other_cpu"]}


PLAN_MIN_MS = 0.1  # explain_poll keeps whole plans of statements at least this long


def condense_plans(lines: list[str]) -> dict[str, Any]:
    """auto_explain's plans: those of PLAN_MIN_MS or more whole, in order; the shorter ones
    counted by query text (their calls and total ms), as a statement run once per group of a
    batch repeats one plan a hundred times."""
    whole, short = [], {}
    for text in lines:
        head, _, rest = text.partition("\n")  # "duration: X ms  plan:", then "Query Text: ..."
        ms = float(head.split()[1]) if head.startswith("duration:") else PLAN_MIN_MS
        if ms >= PLAN_MIN_MS:
            whole.append(text)
        else:
            query = " ".join(rest.split("\n", 1)[0].split())
            calls, total = short.get(query, (0, 0.0))
            short[query] = (calls + 1, total + ms)
    return {"plans": whole, "shorter": [{"query": q, "calls": c, "total_ms": t} for q, (c, t) in short.items()]}


def explain_poll(dsn: str, side: Side) -> dict[str, Any]:
    """The plans of one poll of POLL_BATCH and of its ack, nested statements included, with
    actual times and buffers (auto_explain's log lines, sent to this session; condense_plans)."""
    lines: list[str] = []
    with connect(dsn) as conn:
        conn.add_notice_handler(lambda d: lines.append(d.message_primary or ""))
        for stmt in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                     "SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
                     "SET auto_explain.log_nested_statements = on", "SET client_min_messages = log"):
            conn.execute(stmt)
        tokens = [row[3] for row in conn.execute(side.poll, (QUEUE, POLL_BATCH)).fetchall()]
        if tokens:
            conn.execute(side.ack, (tokens,))
    return condense_plans(lines)


def function_times(admin: psycopg.Connection[Any], dsn: str, side: Side, samples: int) -> dict[str, Any]:
    """Where the server time of poll + ack goes: `samples` more polls and acks (not counted in
    the figures) with track_functions on; per dq_* function (nested ones included), its calls
    and total ms per poll + ack (pg_stat_user_functions)."""
    before = function_stats(admin)
    time_polls(tracked(dsn), side, samples)
    time.sleep(STATS_SETTLE_S)  # the closed session reports its statistics meanwhile
    n = samples + 1  # time_polls makes one more, untimed
    return {name: {"calls": calls / n, "ms": ms / n}
            for name, (calls, ms) in sorted(stats_since(admin, before).items(), key=lambda kv: -kv[1][1])}


def backlog_part(admin: psycopg.Connection[Any], dsn: str, cfg: Config) -> dict[str, Any]:
    """Per repetition and backlog (in rotating order): load it afresh, time the polls, take the
    plan (first repetition), measure the drain."""
    names = backlogs(cfg)
    loads: dict[str, list[dict[str, Any]]] = {b.name: [] for b in names}
    timings: dict[str, list[dict[str, Any]]] = {b.name: [] for b in names}
    drains: dict[str, list[RunResult]] = {b.name: [] for b in names}
    plans, functions = {}, {}
    wl = Workload(f"drain {cfg.drain_workers} x poll+ack x{POLL_BATCH}", poll_ack_step, POLL_BATCH,
                  cfg.target_drain)
    for rep in range(cfg.repeat):
        for b in rotated(names, rep):
            load = load_backlog(admin, b, cfg.rows)
            loads[b.name].append(load)
            t = time_polls(dsn, b.side, cfg.poll_samples)
            timings[b.name].append(t)
            console().log(f"backlog {b.name}, run {rep + 1}: {cfg.rows:,} rows loaded in {load['load_s']:.1f} s;"
                          f" poll x{POLL_BATCH} p50 {statistics.median(t['poll_s']) * 1e3:.2f} ms, ack p50"
                          f" {statistics.median(t['ack_s']) * 1e3:.2f} ms, mean size"
                          f" {statistics.fmean(t['sizes']):.0f}, other CPU {t['other_cpu']:.0%}")
            if rep == 0:
                plans[b.name] = explain_poll(dsn, b.side)
                functions[b.name] = function_times(admin, dsn, b.side, cfg.poll_samples)
            res = run_clients(admin, dsn, wl, b.side, cfg.drain_workers, cfg.drain_warmup_s, cfg.drain_s)
            _log_run(f"drain {b.name}, run {rep + 1}", res)
            drains[b.name].append(res)
    plain = statistics.median(r.rows_per_s for r in drains["plain"])
    rows = []
    for b in names:
        polls = [s for t in timings[b.name] for s in t["poll_s"]]
        acks = [s for t in timings[b.name] for s in t["ack_s"]]
        rates = [r.rows_per_s for r in drains[b.name]]
        p50 = percentile(polls, 50) * 1e3
        rows.append({
            "backlog": b.name, "levels": b.levels, "groups": b.groups, "rows": cfg.rows,
            "loader": loads[b.name][0]["loader"], "load_s": spread([x["load_s"] for x in loads[b.name]]),
            "poll_p50_ms": p50, "poll_p95_ms": percentile(polls, 95) * 1e3,
            "poll_p50_ms_per_run": [statistics.median(t["poll_s"]) * 1e3 for t in timings[b.name]],
            "ack_p50_ms": percentile(acks, 50) * 1e3, "ack_p95_ms": percentile(acks, 95) * 1e3,
            "poll_sizes_mean": statistics.fmean(s for t in timings[b.name] for s in t["sizes"]),
            "poll_other_cpu_max": max(t["other_cpu"] for t in timings[b.name]),
            "drain_rows_per_s": spread(rates),
            "drain_server_us_per_row": spread([r.server_us_per_row for r in drains[b.name]]),
            "drain_other_cpu_max": max(r.other_cpu for r in drains[b.name]),
            "drain_exhausted": any(r.exhausted for r in drains[b.name]),
            "drain_vs_plain": statistics.median(rates) / plain if plain else None,
            "plan": plans[b.name],
            "functions_ms_per_call": functions[b.name],
            "drain_runs": [asdict(r) for r in drains[b.name]],
        })
        if b.side is BACKLOG:
            rows[-1]["pass_poll"] = p50 < cfg.target_poll_p50_ms
            rows[-1]["pass_drain"] = (rows[-1]["drain_vs_plain"] or 0) >= cfg.target_drain
    return {"rows": cfg.rows, "drain_workload": wl.name, "backlogs": rows}


# --------------------------------------------------------------------------- 3. rate limit


def _rate_worker_main(dsn: str, worker: int, seconds: float, ready: Any, results: Any) -> None:
    """Poll POLL_BATCH and ack, again at once, for `seconds`; report every delivery's claimed_at."""
    try:
        with connect(dsn) as conn:
            cur = conn.cursor()
            claimed: list[int] = []
            polls = empty = 0
            ready.wait(BARRIER_TIMEOUT_S)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                cur.execute(POLL_CLAIMED, (QUEUE, POLL_BATCH))
                rows = cur.fetchall()
                polls += 1
                if not rows:
                    empty += 1
                    continue
                cur.execute(DQ.ack, ([r[0] for r in rows],))
                claimed.extend(r[1] for r in rows)
        results.put(("rate", worker, {"claimed_us": claimed, "polls": polls, "empty_polls": empty}))
    except BaseException:
        ready.abort()
        results.put(("error", worker, traceback.format_exc()))


def max_in_window(sorted_us: list[int], window_us: int) -> tuple[int, int]:
    """The most timestamps in any window [t, t + window_us) (one starting at a timestamp holds
    the most), and where the first such window starts."""
    best, at, j = 0, sorted_us[0] if sorted_us else 0, 0
    for i, t in enumerate(sorted_us):
        while j < len(sorted_us) and sorted_us[j] < t + window_us:
            j += 1
        if j - i > best:
            best, at = j - i, t
    return best, at


def rate_analysis(claimed_us: list[int], cfg: Config) -> dict[str, Any]:
    ts = sorted(claimed_us)
    if not ts:
        raise RuntimeError("rate limit: nothing was delivered")
    period = round(cfg.rate_period_s * 1e6)
    start = ts[0] + round(cfg.rate_warmup_s * 1e6)
    end = start + round(cfg.rate_s * 1e6)
    measured = [t for t in ts if start <= t < end]
    bins = [0] * max(int(cfg.rate_s / cfg.rate_period_s), 1)
    for t in measured:
        bins[min((t - start) // period, len(bins) - 1)] += 1
    worst, worst_at = max_in_window(ts, period)
    limit_per_s = cfg.rate_limit / cfg.rate_period_s
    rate = len(measured) / cfg.rate_s
    error = rate / limit_per_s - 1
    return {
        "deliveries": len(ts), "measured_deliveries": len(measured), "rate_per_s": rate, "error": error,
        "per_period": spread([float(b) for b in bins]),
        "max_in_any_period": worst, "max_window_start_s": (worst_at - ts[0]) / 1e6,
        "pass_rate": abs(error) <= cfg.target_rate_error, "pass_window": worst <= cfg.rate_limit,
    }


def rate_part(admin: psycopg.Connection[Any], dsn: str, cfg: Config) -> dict[str, Any]:
    prepare_table(admin, NEW, due_rows=cfg.rate_backlog)
    settings = admin.execute(
        "SELECT max_in_flight, rate_limit, rate_period FROM dq_configure_queue(%s::text, rate_limit => %s::int,"
        " rate_period => make_interval(secs => %s::float8))", (QUEUE, cfg.rate_limit, cfg.rate_period_s)).fetchone()
    console().log(f"rate limit: {settings}; {cfg.rate_backlog:,} due messages; {cfg.rate_workers} workers for"
                  f" {cfg.rate_warmup_s + cfg.rate_s:.0f} s")
    ctx = mp.get_context("spawn")
    ready, results = ctx.Barrier(cfg.rate_workers + 1), ctx.Queue()
    seconds = cfg.rate_warmup_s + cfg.rate_s + 0.5
    procs = [ctx.Process(target=_rate_worker_main, daemon=True, args=(dsn, i, seconds, ready, results))
             for i in range(cfg.rate_workers)]
    for p in procs:
        p.start()
    reports: list[dict[str, Any]] = []
    try:
        ready.wait(BARRIER_TIMEOUT_S)
        snap, t0 = CpuSnapshot.take(os.getpid(), admin.info.dbname), time.perf_counter()
        while len(reports) < cfg.rate_workers:
            kind, _, payload = results.get(timeout=seconds + 60)
            if kind == "error":
                raise RuntimeError(f"rate limit worker failed:\n{payload}")
            reports.append(payload)
        cpu = snap.until(CpuSnapshot.take(os.getpid(), admin.info.dbname), time.perf_counter() - t0)
    except queue_mod.Empty:
        raise RuntimeError("rate limit: a worker did not report") from None
    finally:
        join_or_terminate(procs)
    left = value(admin, "SELECT count(*) FROM dq_messages WHERE queue = %s", (QUEUE,))
    claimed = [t for r in reports for t in r["claimed_us"]]
    polls = sum(r["polls"] for r in reports)
    result = {
        "rate_limit": cfg.rate_limit, "rate_period_s": cfg.rate_period_s, "workers": cfg.rate_workers,
        "warmup_s": cfg.rate_warmup_s, "measured_s": cfg.rate_s, "backlog": cfg.rate_backlog, "left": left,
        **rate_analysis(claimed, cfg),
        "polls": polls, "empty_polls": sum(r["empty_polls"] for r in reports),
        "polls_per_s": polls / seconds, "per_worker_deliveries": [len(r["claimed_us"]) for r in reports],
        "server_cpu_s": cpu["server_cpu_s"], "other_cpu": cpu["other_cpu"],
    }
    console().log(f"rate limit: {result['rate_per_s']:,.1f} deliveries/s ({result['error']:+.2%}), at most"
                  f" {result['max_in_any_period']} in any {cfg.rate_period_s:g} s window, {polls:,} polls"
                  f" ({result['empty_polls']:,} empty), {left:,} messages left")
    if left == 0:
        console().log("[red]rate limit: the backlog ran out, so the rate is not the limiter's[/]")
    return result


# --------------------------------------------------------------------------- 4. priority levels

LAYOUTS = ("ungrouped", "grouped", "baseline")

# n messages due in a day at priorities n / 2 - 1 down to -n / 2, one each (%(n)s, %(t)s: their due time).
LEVELS_OFFER = """
    SELECT count(*) FROM dq_offer_many(%(queue)s::text,
        ARRAY(SELECT 'level-' || g FROM generate_series(0, %(n)s::int - 1) g),
        array_fill(%(payload)s::bytea, ARRAY[%(n)s::int]), array_fill(%(t)s::timestamptz, ARRAY[%(n)s::int]),
        priorities => ARRAY(SELECT g - %(n)s::int / 2 FROM generate_series(0, %(n)s::int - 1) g))"""
# The same messages each heading a FIFO group of its own, written as dq_offer_many leaves them.
LEVELS_GROUPED = ("""
    INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, priority,
                             message_group)
    SELECT %(queue)s::text, 'level-' || g, %(payload)s::bytea, 'bytes', %(t)s::timestamptz, %(t)s::timestamptz,
           g - %(n)s::int / 2, 'group-' || g
      FROM generate_series(0, %(n)s::int - 1) g""", """
    INSERT INTO dq_groups (queue, message_group, head_id, priority, due_at)
    SELECT m.queue, m.message_group, m.id, m.priority, m.scheduled_at FROM dq_messages m WHERE m.queue = %(queue)s""")
LEVELS_BASELINE = """
    INSERT INTO bench_baseline (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, priority)
    SELECT %(queue)s::text, 'level-' || g, %(payload)s::bytea, 'bytes', %(t)s::timestamptz, %(t)s::timestamptz,
           g - %(n)s::int / 2
      FROM generate_series(0, %(n)s::int - 1) g"""
# One due message at the lowest priority (%(t)s: a second ago).
LEVELS_DUE = {
    "ungrouped": "SELECT dq_offer(%(queue)s::text, 'due', %(payload)s::bytea, %(t)s::timestamptz, priority => -32768)",
    "grouped": "SELECT dq_offer(%(queue)s::text, 'due', %(payload)s::bytea, %(t)s::timestamptz, priority => -32768,"
               " message_group => 'group-due')",
    "baseline": "INSERT INTO bench_baseline (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially,"
                " priority) VALUES (%(queue)s::text, 'due', %(payload)s::bytea, 'bytes', %(t)s::timestamptz,"
                " %(t)s::timestamptz, -32768)",
}
# The plain-SQL poll over every level: the due rows by priority, then due time, from the copy of
# dq_messages_ready_idx (queue, priority DESC, scheduled_at), the due time checked in the index.
LEVELS_BASELINE_POLL = """
    WITH c AS (SELECT id FROM bench_baseline
                WHERE queue = %s AND (message_group IS NULL OR dead_from IS NOT NULL) AND scheduled_at <= now()
                ORDER BY priority DESC, scheduled_at LIMIT %s::int FOR UPDATE SKIP LOCKED)
    UPDATE bench_baseline t
       SET scheduled_at = now() + interval '5 min', lock_token = gen_random_uuid(),
           delivery_count = t.delivery_count + 1
      FROM c WHERE t.id = c.id
    RETURNING t.id, t.key, t.payload, t.lock_token"""
LEVELS_WAIT = "SELECT dq_wait(%s::text, interval '1 second')"


def load_levels(admin: psycopg.Connection[Any], layout: str, levels: int, due: bool) -> None:
    """Empty every queue table and drop the queue's controls (part 3 sets a rate limit); write
    `levels` future messages at distinct priorities in `layout`, and with `due` one due message at
    the lowest priority; VACUUM ANALYZE."""
    admin.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
        sql.SQL(", ").join(sql.Identifier(t) for t in EVERY_TABLE)))
    admin.execute("DELETE FROM dq_queues WHERE queue = %s", (QUEUE,))
    params = {"queue": QUEUE, "payload": PAYLOAD, "n": levels,
              "t": value(admin, "SELECT now() + interval '1 day'")}
    for stmt in {"ungrouped": (LEVELS_OFFER,), "grouped": LEVELS_GROUPED, "baseline": (LEVELS_BASELINE,)}[layout]:
        admin.execute(stmt, params)
    if due:
        admin.execute(LEVELS_DUE[layout], {**params, "t": value(admin, "SELECT now() - interval '1 second'")})
    table = "bench_baseline" if layout == "baseline" else "dq_messages"
    admin.execute(sql.SQL("VACUUM ANALYZE {}, dq_groups").format(sql.Identifier(table)))


def time_statement(dsn: str, statement: str, params: tuple[Any, ...], samples: int,
                   expect_rows: int) -> dict[str, Any]:
    """`samples` executions of `statement` from one session, each in a transaction that is rolled
    back (a poll leaves its due message due), timed per call; the first (it prepares and plans the
    statement and the function's) is left out. Every call must return `expect_rows` rows. Then the
    shared buffers of one more execution (EXPLAIN (ANALYZE, BUFFERS): a function scan counts its
    nested statements)."""
    times = []
    with connect(dsn) as conn:
        cur = conn.cursor()
        for i in range(samples + 1):
            with conn.transaction(force_rollback=True):
                t0 = time.perf_counter()
                cur.execute(statement, params)
                rows = cur.fetchall()
                t1 = time.perf_counter()
            if len(rows) != expect_rows:
                raise RuntimeError(f"{statement.split()[:4]}: {len(rows)} rows, expected {expect_rows}")
            if i:
                times.append(t1 - t0)
        with conn.transaction(force_rollback=True):
            row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}").format(sql.SQL(statement)),
                               params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    return {"p50_ms": percentile(times, 50) * 1e3, "p95_ms": percentile(times, 95) * 1e3, "buffers": buffers,
            "samples": len(times)}


def levels_part(admin: psycopg.Connection[Any], dsn: str, cfg: Config) -> dict[str, Any]:
    """Per level count and layout: the empty poll (and dq_wait), then the poll of one due message."""
    cells = []
    for levels in cfg.level_counts:
        for layout in LAYOUTS:
            poll = LEVELS_BASELINE_POLL if layout == "baseline" else DQ.poll
            cell: dict[str, Any] = {"levels": levels, "layout": layout}
            snap, t0 = CpuSnapshot.take(os.getpid(), admin.info.dbname), time.perf_counter()
            load_levels(admin, layout, levels, due=False)
            cell["empty"] = time_statement(dsn, poll, (QUEUE, 1), cfg.level_samples, 0)
            if layout != "baseline":
                cell["wait"] = time_statement(dsn, LEVELS_WAIT, (QUEUE,), cfg.level_samples, 1)
            load_levels(admin, layout, levels, due=True)
            cell["one_due"] = time_statement(dsn, poll, (QUEUE, 1), cfg.level_samples, 1)
            cell["other_cpu"] = snap.until(CpuSnapshot.take(os.getpid(), admin.info.dbname),
                                           time.perf_counter() - t0)["other_cpu"]
            cell["pass"] = cell["empty"]["p50_ms"] < cfg.target_empty_poll_ms
            console().log(f"levels {levels:,} {layout}: empty poll p50 {cell['empty']['p50_ms']:.2f} ms"
                          f" ({cell['empty']['buffers']:,} buffers), one due p50 {cell['one_due']['p50_ms']:.2f} ms"
                          f" ({cell['one_due']['buffers']:,} buffers)"
                          + (f", dq_wait p50 {cell['wait']['p50_ms']:.2f} ms" if "wait" in cell else ""))
            cells.append(cell)
    return {"samples": cfg.level_samples, "cells": cells}


# --------------------------------------------------------------------------- report


def _n(v: float) -> str:
    return f"{v / 1000:.1f}k" if v >= 10_000 else f"{v:,.0f}"


def _range(s: dict[str, Any]) -> str:
    """median (min–max)"""
    return f"{_n(s['median'])} ({_n(s['min'])}–{_n(s['max'])})"


def regression_table(cells: list[dict[str, Any]], cfg: Config) -> Table:
    rows = []
    for c in cells:
        r, per_run = c["rows_per_s"], c["new_vs_old_per_run"]
        rows.append((c["workload"], str(c["clients"]), _range(r["new"]), _range(r["old"]), _range(r["baseline"]),
                     f"{c['new_vs_old']:.0%} ({per_run['min']:.0%}–{per_run['max']:.0%})",
                     status(c["pass"]) + (" (drained)" if c["exhausted"] else ""),
                     f"{c['server_us_per_row']['new']['median']:.1f} | {c['server_us_per_row']['old']['median']:.1f}",
                     f"{c['new_vs_baseline']:.0%}", f"{c['other_cpu_max']:.0%}"))
    return rich_table(
        f"1. No controls used: this checkout (new) vs the release before (old), rows/s, median (min–max) of"
        f" {cfg.repeat} runs",
        ("workload", "clients", "new", "old", "baseline", "new/old (per run)", f"≥ {cfg.target_regression:.0%}",
         "server µs/row new | old", "new/base", "other CPU"),
        rows, left={"workload"},
        caption="new/old: ratio of the medians (per run: its range within one repetition). (drained): a run"
        " emptied the backlog before its end. other CPU: the most CPU (share of all cores) processes"
        " outside the benchmark took during any run",
    )


def backlog_table(part: dict[str, Any], cfg: Config) -> Table:
    rows = []
    for b in part["backlogs"]:
        vs_plain = f"{b['drain_vs_plain']:.0%}" if b["drain_vs_plain"] is not None else "-"
        rows.append((b["backlog"], f"{b['load_s']['median']:.0f}", f"{b['poll_p50_ms']:.2f}",
                     f"{b['poll_p95_ms']:.2f}", f"{b['ack_p50_ms']:.2f}", f"{b['poll_sizes_mean']:.0f}",
                     status(b["pass_poll"]) if "pass_poll" in b else "",
                     _range(b["drain_rows_per_s"]) + (" (drained)" if b["drain_exhausted"] else ""), vs_plain,
                     status(b["pass_drain"]) if "pass_drain" in b else "",
                     f"{b['drain_server_us_per_row']['median']:.0f}",
                     f"{max(b['poll_other_cpu_max'], b['drain_other_cpu_max']):.0%}"))
    return rich_table(
        f"2. Due backlogs of {part['rows']:,} messages: dq_poll_many(q, {POLL_BATCH}) from one session, and"
        f" {part['drain_workload']}",
        ("backlog", "load s", "poll p50 ms", "poll p95", "ack p50", "rows/poll", f"< {cfg.target_poll_p50_ms:g} ms",
         "drain rows/s", "vs plain", f"≥ {cfg.target_drain:.0%}", "server µs/row", "other CPU"),
        rows, left={"backlog"},
        caption=f"priorities: {cfg.priority_levels} levels; groups: {cfg.groups:,} FIFO groups of"
        f" {cfg.group_size}. Loaded with dq_offer_many in batches of {FILL_BATCH:,} (baseline: plain"
        " INSERT), afresh before each repetition. rows/poll: mean size of the timed polls. poll"
        f" and ack: {cfg.repeat} x {cfg.poll_samples} calls; drain: median (min–max) of {cfg.repeat}"
        f" runs of {cfg.drain_s:g} s after {cfg.drain_warmup_s:g} s of warm-up",
    )


def rate_table(r: dict[str, Any]) -> Table:
    return rich_table(
        f"3. Rate limit {r['rate_limit']:,} per {r['rate_period_s']:g} s, {r['workers']} greedy workers,"
        f" {r['measured_s']:g} s measured",
        ("deliveries/s", "error", "≤ 5 %", "per period (min–max)", "max in any window", "≤ limit", "polls/s",
         "empty polls", "other CPU"),
        [(f"{r['rate_per_s']:,.1f}", f"{r['error']:+.2%}", status(r["pass_rate"]), _range(r["per_period"]),
          f"{r['max_in_any_period']:,}", status(r["pass_window"]), f"{r['polls_per_s']:,.0f}",
          f"{r['empty_polls'] / max(r['polls'], 1):.0%}", f"{r['other_cpu']:.0%}")],
        caption=f"claimed_at of every delivery; windows [t, t + period) over all {r['deliveries']:,} deliveries"
        f" (warm-up of {r['warmup_s']:g} s included); the rate over the measured part only",
    )


def levels_table(part: dict[str, Any], cfg: Config) -> Table:
    rows = []
    for c in part["cells"]:
        empty, due = c["empty"], c["one_due"]
        rows.append((f"{c['levels']:,}", c["layout"], f"{empty['p50_ms']:.2f}", f"{empty['p95_ms']:.2f}",
                     f"{empty['buffers']:,}", status(c["pass"]), f"{due['p50_ms']:.2f}", f"{due['p95_ms']:.2f}",
                     f"{due['buffers']:,}", f"{c['wait']['p50_ms']:.2f}" if "wait" in c else "-",
                     f"{c['other_cpu']:.0%}"))
    return rich_table(
        "4. Priority levels of future messages (one per level): dq_poll_many(q, 1) from one session, ms",
        ("levels", "layout", "empty p50", "p95", "buffers", f"< {cfg.target_empty_poll_ms:g} ms", "1 due p50",
         "p95", "buffers", "dq_wait p50", "other CPU"),
        rows, left={"layout"},
        caption=f"{part['samples']} polls per cell, each in a rolled-back transaction. 1 due: one more message,"
        " due, at the lowest priority. buffers: shared buffers of one poll, nested statements included."
        " baseline: one plain SQL statement over the due rows, by priority then due time. dq_wait:"
        " on the empty queue",
    )


def tables(report: dict[str, Any], cfg: Config | None = None) -> list[Table]:
    """The tables of the parts the report holds (`cfg`: by default the report's configuration)."""
    if cfg is None:
        cfg = Config(**{f.name: report["config"][f.name] for f in fields(Config) if f.name in report["config"]})
    out = []
    if "regression" in report:
        out.append(regression_table(report["regression"], cfg))
    if "backlog" in report:
        out.append(backlog_table(report["backlog"], cfg))
    if "rate" in report:
        out.append(rate_table(report["rate"]))
    if "levels" in report:
        out.append(levels_table(report["levels"], cfg))
    return out


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the tables show, with the configuration, machine, server and commits measured, and the
    server time per dq_* function of poll + ack: without the runs of each regression cell and drain
    and the plans of the polls (auto_explain)."""
    out = dict(report)
    if "regression" in report:
        out["regression"] = [without(c, "runs") for c in report["regression"]]
    if "backlog" in report:
        out["backlog"] = {**report["backlog"],
                          "backlogs": [without(b, "plan", "drain_runs") for b in report["backlog"]["backlogs"]]}
    return out


# --------------------------------------------------------------------------- main

PARTS = ("regression", "backlog", "rate", "levels")


def run(admin_dsn: str, cfg: Config, out: Path | None, prefix: str, old_ref: str | None,
        parts: tuple[str, ...]) -> dict[str, Any]:
    started = time.perf_counter()
    timestamp = datetime.now(UTC)
    machine = machine_info()
    report: dict[str, Any] = {"timestamp": timestamp.isoformat(timespec="seconds"), "mode": cfg.mode,
                              "machine": machine, "config": {**asdict(cfg), "poll_batch": POLL_BATCH,
                                                             "groups": cfg.groups, "rate_backlog": cfg.rate_backlog,
                                                             "parts": list(parts)}}
    console().log(f"[bold]bench.controls[/] ({cfg.mode}, {cfg.rows:,} rows): creating database {prefix}")
    dsn = create_database(admin_dsn, prefix)
    with psycopg.connect(dsn, autocommit=True) as admin:
        report["server"], report["source"] = server_info(admin), provenance(admin)
        if "regression" in parts:
            ref = old_ref or default_old_ref()
            old_dsn, commit = install_old(admin_dsn, f"{prefix}_old", ref)
            console().log(f"old: {ref} = {commit} installed into {prefix}_old")
            with psycopg.connect(old_dsn, autocommit=True) as old:
                report["old_source"] = {"ref": ref, "commit": commit, **provenance(old)}
                report["regression"] = regression_part(cfg, {"new": (admin, dsn), "baseline": (admin, dsn),
                                                             "old": (old, old_dsn)})
        if "backlog" in parts:
            report["backlog"] = backlog_part(admin, dsn, cfg)
        if "rate" in parts:
            report["rate"] = rate_part(admin, dsn, cfg)
        if "levels" in parts:
            report["levels"] = levels_part(admin, dsn, cfg)
    report["wall_time_s"] = round(time.perf_counter() - started, 1)
    report["load_average_after"] = os.getloadavg()
    publish("controls", report, summary(report), tables(report, cfg), out, quick=cfg.mode == "quick", at=timestamp)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.controls", __doc__,
                       quick="backlogs of 100,000 and shorter runs (default: 1,000,000, as the targets state)")
    parser.add_argument("--rows", type=int, default=None, help="messages per backlog of part 2")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions of every cell (default 3)")
    parser.add_argument("--clients", default=None, help="client counts of part 1, comma-separated (default 1,4)")
    parser.add_argument("--rate-seconds", type=float, default=None, help="measured seconds of part 3 (default 30)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--levels", default=None,
                        help="priority level counts of part 4, comma-separated (default 1,100,20000,65536)")
    parser.add_argument("--level-samples", type=int, default=None,
                        help="timed polls per cell of part 4 (default 30, 10 with --quick)")
    parser.add_argument("--old-ref", default=None,
                        help=f"git revision of the old functions (default: the parent of the commit adding"
                             f" {CONTROLS_MIGRATION})")
    parser.add_argument("--db-prefix", default="dq_bench_controls", help="database names (dropped and recreated)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.rows is not None:
        overrides["rows"] = args.rows
    if args.repeat is not None:
        overrides["repeat"] = args.repeat
    if args.clients is not None:
        overrides["clients"] = tuple(int(c) for c in args.clients.split(","))
    if args.rate_seconds is not None:
        overrides["rate_s"] = args.rate_seconds
    if args.levels is not None:
        overrides["level_counts"] = tuple(int(n) for n in args.levels.split(","))
        if not all(1 <= n <= 65_536 for n in overrides["level_counts"]):
            parser.error("--levels: each count is 1 to 65536 (the priorities of a smallint)")
    if args.level_samples is not None:
        overrides["level_samples"] = args.level_samples
    parts = tuple(p for p in args.parts.split(",") if p)
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    run(args.dsn, replace(cfg, **overrides), args.out, args.db_prefix, args.old_ref, parts)


if __name__ == "__main__":
    # Run through the imported module, so spawned processes find every function as bench.controls.*.
    from bench.controls import main as _main

    _main()
