"""The four parts of bench.controls (its docstring describes them): each measures and returns its
section of the report. Part 1 installs the release before the controls with :func:`install_old`.
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
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench.controls_config import (
    BACKLOG,
    BASELINE_BACKLOG,
    CONTROLS_MIGRATION,
    EVERY_TABLE,
    NEW,
    OLD,
    POLL_BATCH,
    Config,
    rotated,
    spread,
)
from bench.lib.clients import BARRIER_TIMEOUT_S, RunResult, join_or_terminate, run_clients
from bench.lib.cpu import CpuSnapshot
from bench.lib.database import function_stats, prepare_table, recreate_database, stats_since, tracked
from bench.lib.report import PROJECT, console, percentile
from bench.lib.sides import BASELINE, DQ, PAYLOAD, QUEUE, Side, Workload, connect, poll_ack_step, value
from bench.lib.workers import STATS_SETTLE_S

# Part 3: each delivery's claim time, in microseconds since the epoch (exact: numeric).
POLL_CLAIMED = (
    "SELECT lock_token, (extract(epoch FROM claimed_at) * 1000000)::bigint FROM dq_poll_many(%s::text, %s::int)"
)


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
