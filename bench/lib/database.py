"""The benchmark's database: created afresh with the queue schema (and the baseline table), each
run's table prepared from the same state, what was measured (server settings, the functions' digest,
the git commit), and the server's statistics a benchmark reads (function calls, transactions,
autovacuum runs, rows left).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.lib.report import PROJECT
from bench.lib.sides import FILL_BATCH, PAYLOAD, QUEUE, Side, value

DRAIN_POLL_S = 0.05  # how often a driver counts what is left
SETTINGS = (  # the server settings every report records
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


def create_database(admin_dsn: str, name: str, *, baseline: bool = True) -> str:
    """(Re)create database `name` with the queue schema and (unless `baseline` is false) the
    baseline table; return its DSN."""
    from pyqueue.migrate import migrate

    dsn = recreate_database(admin_dsn, name)
    migrate(dsn)
    if not baseline:
        return dsn
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


def source_info(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """provenance, plus local changes to the Python package and the benchmarks."""
    import pyqueue

    info = provenance(conn)
    out = subprocess.run(["git", "--no-optional-locks", "-C", str(PROJECT), "status", "--porcelain", "--", "pyqueue",
                          "bench"], capture_output=True, text=True)
    info["uncommitted_python_changes"] = out.stdout.splitlines() if out.returncode == 0 else out.stderr.strip()
    info["pyqueue_version"] = pyqueue.__version__
    return info


# --------------------------------------------------------------------------- statistics


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

