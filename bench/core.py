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
processes on the host took meanwhile (the host may be shared; see CpuSnapshot).

Poll latency: one client; the queue holds 0 / 100k / 1M messages scheduled a day ahead; each
sample offers one due message, times the poll of one message and its ack, then times a poll
that finds nothing due.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

QUEUE = "bench"
PAYLOAD = bytes(range(100))  # every message carries 100 bytes
MAX_WAIT_S = 5.0  # the waiters' dq_wait max_wait
ASLEEP_WAIT_S = 600.0  # ... of waiters that stay asleep during the whole run
WAITER_BATCH = 100  # what a woken waiter polls at once
PROJECT = Path(__file__).resolve().parent.parent
STOP = "__bench_stop__"  # notification payload that ends a waiter
BARRIER_TIMEOUT_S = 180.0
FILL_BATCH = 10_000  # rows per server-side fill statement
SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_sync_method",
    "full_page_writes",
    "max_wal_size",
    "checkpoint_timeout",
    "work_mem",
    "jit",
    "autovacuum",
    "max_connections",
)


@cache
def console() -> Console:
    """The parent's console (client processes import neither rich nor yoyo: they start faster)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 140)


# --------------------------------------------------------------------------- the two sides


@dataclass(frozen=True)
class Side:
    """The statements one side runs. Hot-path statements take positional parameters:
    offer (queue, key, payload); offer_many (queue, keys, payloads); poll (queue, n) returning
    (id, key, payload, lock_token); ack (lock_tokens). The others take named parameters."""

    name: str
    table: str
    truncate: tuple[str, ...]
    offer: str
    offer_many: str
    poll: str
    ack: str
    wait: str  # (queue, max_wait) -> seconds to sleep
    channel: str  # (queue) -> LISTEN channel
    fill: str  # (queue, prefix, payload, t0, lo, hi): messages lo..hi due at t0 + g ms


DQ = Side(
    name="dq",
    table="dq_messages",
    truncate=("dq_messages", "dq_waiters"),
    offer="SELECT dq_offer(%s::text, %s::text, %s::bytea)",
    offer_many="SELECT key, outcome FROM dq_offer_many(%s::text, %s::text[], %s::bytea[])",
    poll="SELECT id, key, payload, lock_token FROM dq_poll_many(%s::text, %s::int)",
    ack="SELECT dq_ack_many(%s::uuid[])",
    wait="SELECT extract(epoch FROM dq_wait(%(queue)s::text, make_interval(secs => %(max_wait)s::float8)))::float8",
    channel="SELECT dq_channel(%(queue)s::text)",
    fill="""
        SELECT count(*)
          FROM (SELECT array_agg(%(prefix)s || lpad(g::text, 9, '0')) AS k,
                       array_agg(%(payload)s::bytea) AS p,
                       array_agg(%(t0)s::timestamptz + g * interval '1 millisecond') AS s
                  FROM generate_series(%(lo)s::int, %(hi)s::int) AS g) AS a,
               LATERAL dq_offer_many(%(queue)s::text, a.k, a.p, a.s)""",
)

BASELINE = Side(
    name="baseline",
    table="bench_baseline",
    truncate=("bench_baseline",),
    offer="INSERT INTO bench_baseline (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially)"
    " VALUES (%s, %s, %s, 'bytes', now(), now()) ON CONFLICT DO NOTHING",
    offer_many="INSERT INTO bench_baseline"
    " (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially)"
    " SELECT %s, u.k, u.p, 'bytes', now(), now() FROM unnest(%s::text[], %s::bytea[]) AS u(k, p)"
    " ON CONFLICT DO NOTHING",
    # The due-time index of ungrouped messages (dq_messages_ready_idx, copied with the table) is
    # by (queue, priority, scheduled_at) and partial: the baseline's messages all have priority 0.
    poll="""
        WITH c AS (SELECT id FROM bench_baseline
                    WHERE queue = %s AND (message_group IS NULL OR dead_from IS NOT NULL) AND priority = 0
                      AND scheduled_at <= now()
                    ORDER BY scheduled_at LIMIT %s::int FOR UPDATE SKIP LOCKED)
        UPDATE bench_baseline t
           SET scheduled_at = now() + interval '5 min', lock_token = gen_random_uuid(),
               delivery_count = t.delivery_count + 1
          FROM c WHERE t.id = c.id
        RETURNING t.id, t.key, t.payload, t.lock_token""",
    ack="DELETE FROM bench_baseline WHERE lock_token = ANY(%s::uuid[])",
    # The baseline has no wake-up protocol: its waiters sleep max_wait and poll.
    wait="SELECT %(max_wait)s::float8",
    channel="SELECT 'bench_' || md5(%(queue)s::text)",
    fill="""
        INSERT INTO bench_baseline (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially)
        SELECT %(queue)s::text, %(prefix)s || lpad(g::text, 9, '0'), %(payload)s::bytea, 'bytes',
               %(t0)s::timestamptz + g * interval '1 millisecond',
               %(t0)s::timestamptz + g * interval '1 millisecond'
          FROM generate_series(%(lo)s::int, %(hi)s::int) AS g""",
)

SIDES = (DQ, BASELINE)


def connect(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection preparing every statement on its first execution."""
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0, application_name="bench.core")


def value(conn: psycopg.Connection[Any] | psycopg.Cursor[Any], query: str, params: Any = None) -> Any:
    """The first column of the one row `query` returns."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row[0]


# --------------------------------------------------------------------------- CPU accounting
# Throughput on a shared host is noisy. Each run therefore also records, over its measurement
# window, the CPU time of the database's backends per row (server cost, a figure other load
# hardly moves) and the share of the machine's CPU used by processes outside the benchmark.

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSnapshot:
    busy_s: float  # the whole machine, all but idle and iowait
    clients_s: float  # the benchmark's processes (the parent and its children)
    server_s: float  # the processes of the benchmark database (backends, its autovacuum workers)

    @classmethod
    def take(cls, bench_pid: int, db_name: str) -> CpuSnapshot:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        clients = server = 0
        tag = f" {db_name} ".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ") + b" "
            except OSError:
                continue  # exited meanwhile
            used = int(stat[11]) + int(stat[12])  # utime + stime
            if bench_pid in (int(entry.name), int(stat[1])):
                clients += used
            elif tag in cmd:
                server += used
        return cls((sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK, clients / CLK_TCK, server / CLK_TCK)

    def until(self, later: CpuSnapshot, elapsed_s: float) -> dict[str, float]:
        """Server CPU seconds, and the share of all CPUs that other processes used, between the two."""
        server = later.server_s - self.server_s
        other = (later.busy_s - self.busy_s) - server - (later.clients_s - self.clients_s)
        return {"server_cpu_s": server, "other_cpu": max(other, 0.0) / (elapsed_s * (os.cpu_count() or 1))}


# --------------------------------------------------------------------------- workloads

Step = Callable[[], int | None]  # one unit of work: rows done, or None when nothing was left


def _keys(client: int) -> Iterator[str]:
    return (f"c{client:02d}-{i:09d}" for i in itertools.count())


def offer_step(conn: psycopg.Connection[Any], side: Side, client: int, batch: int) -> Step:
    """Offer one message per transaction."""
    cur, keys = conn.cursor(), _keys(client)

    def step() -> int:
        cur.execute(side.offer, (QUEUE, next(keys), PAYLOAD))
        return 1

    return step


def offer_many_step(conn: psycopg.Connection[Any], side: Side, client: int, batch: int) -> Step:
    """Offer `batch` messages in one statement."""
    cur, keys, payloads = conn.cursor(), _keys(client), [PAYLOAD] * batch

    def step() -> int:
        cur.execute(side.offer_many, (QUEUE, [next(keys) for _ in range(batch)], payloads))
        return batch

    return step


def poll_ack_step(conn: psycopg.Connection[Any], side: Side, client: int, batch: int) -> Step:
    """Poll up to `batch` due messages, then acknowledge them by their lock tokens."""
    cur = conn.cursor()

    def step() -> int | None:
        cur.execute(side.poll, (QUEUE, batch))
        tokens = [row[3] for row in cur.fetchall()]
        if not tokens:
            return None
        cur.execute(side.ack, (tokens,))
        return len(tokens)

    return step


@dataclass(frozen=True)
class Workload:
    name: str
    step: Callable[[psycopg.Connection[Any], Side, int, int], Step]
    batch: int
    target: float  # minimum dq / baseline ratio
    waiters: int = 0  # extra processes waiting on the queue (LISTEN + dq_wait; see _waiter_main)
    waiters_consume: bool = True  # they wake up and consume; False: they stay asleep
    backlog: int = 0  # due messages pre-filled per run (poll workloads)


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


# --------------------------------------------------------------------------- harness


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
    admin: psycopg.Connection[Any], dsn: str, workload: Workload, side: Side, clients: int, cfg: Config
) -> RunResult:
    """Run `clients` processes of `workload` (plus its waiters) against `side`; collect their counts."""
    ctx = mp.get_context("spawn")
    ready, go = ctx.Barrier(clients + workload.waiters), ctx.Barrier(clients)
    stop, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_client_main,
            daemon=True,
            args=(workload, side, dsn, i, cfg.warmup_s, cfg.duration_s, ready, go, results),
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
    timeout = BARRIER_TIMEOUT_S + cfg.warmup_s + cfg.duration_s + 60
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
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
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


# --------------------------------------------------------------------------- database setup


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def recreate_database(admin_dsn: str, name: str) -> str:
    """Drop database `name` if it exists (closing its sessions) and create it empty; return its DSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_dbname(admin_dsn, name)


def create_database(admin_dsn: str, name: str) -> str:
    """(Re)create database `name` with the queue schema and the baseline table; return its DSN."""
    from pyqueue.migrate import migrate

    dsn = recreate_database(admin_dsn, name)
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_baseline (LIKE dq_messages INCLUDING ALL)")
        # LIKE copies no storage parameters: give the baseline dq_messages' fillfactor and autovacuum.
        options = value(conn, "SELECT reloptions FROM pg_class WHERE oid = 'dq_messages'::regclass")
        if options:
            conn.execute(
                sql.SQL("ALTER TABLE bench_baseline SET ({})").format(sql.SQL(", ").join(sql.SQL(o) for o in options))
            )
    return dsn


def prepare_table(
    conn: psycopg.Connection[Any],
    side: Side,
    due_rows: int = 0,
    future_rows: int = 0,
    fill_params: dict[str, Any] | None = None,
) -> None:
    """Empty the side's tables, load messages (due ones an hour ago, future ones a day ahead),
    VACUUM ANALYZE, CHECKPOINT: every run starts from the same state. `fill_params`: more named
    parameters for a side whose fill statement takes them."""
    conn.execute(
        sql.SQL("TRUNCATE {} RESTART IDENTITY").format(sql.SQL(", ").join(sql.Identifier(t) for t in side.truncate))
    )
    for prefix, n, offset in (("due-", due_rows, "-1 hour"), ("future-", future_rows, "1 day")):
        t0 = value(conn, "SELECT now() + %s::interval", (offset,))
        for lo in range(0, n, FILL_BATCH):
            conn.execute(
                side.fill,
                {
                    "queue": QUEUE,
                    "prefix": prefix,
                    "payload": PAYLOAD,
                    "t0": t0,
                    "lo": lo,
                    "hi": min(lo + FILL_BATCH, n) - 1,
                    **(fill_params or {}),
                },
            )
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(side.table)))
    conn.execute("CHECKPOINT")


def server_info(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    info: dict[str, Any] = {"version": value(conn, "SELECT version()")}
    for name in SETTINGS:
        info[name] = value(conn, "SELECT current_setting(%s)", (name,))
    return info


def provenance(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """What was measured: a digest of the installed dq_* function definitions, and the git commit
    and local changes."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", "--no-optional-locks", "-C", str(PROJECT), *args], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else f"unavailable: {out.stderr.strip()}"

    return {
        "functions_md5": value(
            conn,
            "SELECT md5(string_agg(pg_get_functiondef(p.oid), '' ORDER BY p.oid::regprocedure::text)) "
            "FROM pg_proc p WHERE p.proname LIKE 'dq\\_%' AND p.prokind IN ('f', 'p') "
            "AND p.pronamespace = current_schema()::regnamespace",
        ),
        "git_head": git("rev-parse", "HEAD"),
        "uncommitted_changes": git("status", "--porcelain", "--", "sql", "migrations").splitlines(),
    }


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


def _status(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]MISS[/]"


def throughput_table(cells: list[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(title="Throughput (rows/s; dq_* functions vs plain SQL on the same table shape)")
    for col in (
        "workload",
        "clients",
        "dq_* rows/s",
        "baseline rows/s",
        "ratio",
        "target",
        "",
        "server µs/row dq | base",
        "other CPU",
    ):
        table.add_column(col, justify="left" if col == "workload" else "right")
    for c in cells:
        note = " (drained)" if c["dq"]["exhausted"] or c["baseline"]["exhausted"] else ""
        other = max(r["other_cpu"] for side in SIDES for r in c["runs"][side.name])
        table.add_row(
            c["workload"],
            str(c["clients"]),
            f"{c['dq']['rows_per_s']:,.0f}",
            f"{c['baseline']['rows_per_s']:,.0f}",
            f"{c['ratio']:.0%}",
            f"≥ {c['target']:.0%}",
            _status(c["pass"]) + note,
            f"{c['dq']['server_us_per_row']:,.1f} | {c['baseline']['server_us_per_row']:,.1f}",
            f"{other:.0%}",
        )
    table.caption = (
        "best of the runs of each side. server µs/row: CPU time of the database's backends per row "
        "(the waiters' included). other CPU: the most CPU (share of all cores) that processes "
        "outside the benchmark used during any run of the cell"
    )
    return table


def latency_table(lat: list[dict[str, Any]], verdict: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(
        title="Poll latency, ms (one client; median / p99)",
        caption=f"dq poll+ack median at {verdict['future_messages']:,} future messages = "
        f"{verdict['factor']:.2f}× the empty table (target ≤ 2×): {_status(verdict['pass'])}",
    )
    table.add_column("future msgs", justify="right")
    table.add_column("operation")
    for side in SIDES:
        table.add_column(f"{side.name} median", justify="right")
        table.add_column(f"{side.name} p99", justify="right")
    sizes = sorted({r["future_messages"] for r in lat})
    for size in sizes:
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
            table.add_row(f"{size:,}", label, *cells)
    return table


# --------------------------------------------------------------------------- main


def measure_cell(admin: psycopg.Connection[Any], dsn: str, wl: Workload, clients: int, cfg: Config) -> dict[str, Any]:
    """Run both sides of one (workload, clients) cell `cfg.repeat` times, alternating which side
    goes first; the best run of each side counts (the least disturbed on a shared host)."""
    runs: dict[str, list[RunResult]] = {side.name: [] for side in SIDES}
    for rep in range(cfg.repeat):
        for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
            prepare_table(admin, side, due_rows=wl.backlog)
            res = run_clients(admin, dsn, wl, side, clients, cfg)
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


def run(admin_dsn: str, cfg: Config, out: Path, db_name: str) -> dict[str, Any]:
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
    console().print(throughput_table(cells))
    console().print(latency_table(latency, verdict))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    console().log(f"wall time {wall:.0f} s; results written to {out}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True, help="admin DSN of the server (a database to connect to)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 and 4 clients, short runs, 100k")
    parser.add_argument("--out", type=Path, default=PROJECT / "bench" / "results" / "core.json")
    parser.add_argument("--db-name", default="dq_bench", help="benchmark database (dropped and recreated)")
    args = parser.parse_args(argv)
    run(args.dsn, QUICK if args.quick else FULL, args.out, args.db_name)


if __name__ == "__main__":
    # Run through the imported module, so spawned processes find every function as bench.core.*.
    from bench.core import main as _main

    _main()
