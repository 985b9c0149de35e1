"""What one metrics scrape costs the database: ``dq_metrics()`` and ``dq_health`` on a queue of 10^6
and 10^7 messages, beside a plain count of that queue.

    python -m bench.scrape --dsn ADMIN_DSN [--rows 1e6,1e7] [--repeat 7] [--quick] [--db-name dq_scrape]

For each size the database ``--db-name`` is recreated and installed (``pyqueue.migrate``); the rows
are loaded as the owner by one set-based ``INSERT … SELECT generate_series`` straight into
``dq_messages`` (queue ``big``: half due, half due within a day; one message in ten in a FIFO group,
one in 10,000 in flight: a thousand at 10^7, as many as a large deployment's workers hold), with a
tenth as many archive rows of ``big`` (the queue archives), a dead-letter queue and a small second
queue; then ``VACUUM ANALYZE`` (so the statistics the estimates
use exist, as autovacuum would give them). Then each statement runs ``--repeat`` times (default 7),
round-robin, each on the same connection after one unmeasured warm-up run:

* ``baseline``: ``SELECT count(*) FROM dq_messages WHERE queue = 'big'`` (what counting the queue
  exactly costs: an index-only scan of its entries);
* ``dq_metrics``: ``SELECT * FROM dq_metrics()`` (every queue; counts past 20,000 rows estimated);
* ``dq_health``: ``SELECT * FROM dq_health`` (statistics and catalogs only);
* ``dq_stats``: ``SELECT * FROM dq_stats`` (what dq_metrics builds on).

It prints, per size, the median and the fastest time of each statement (client wall time: execute
and fetch) and the median's ratio to the baseline's in the same run, with the share of the machine
other processes used meanwhile (``other CPU``). ``--quick``: 10^5 rows and 3 repeats (about a
minute). Writes the full report to ``bench/results/raw/scrape-<UTC time>.json`` and its summary to
``bench/results/scrape.json`` (``scrape-quick.json``; ``--out x.json``: x.json and x.summary.json).
Nothing here is a timed test: the bound in docs/performance.md is checked by reading this output.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.lib.cpu import CpuSnapshot
from bench.lib.database import create_database, server_info, source_info
from bench.lib.report import arguments, console, machine_info, publish, rich_table, without

if TYPE_CHECKING:
    from rich.table import Table

STATEMENTS = {
    "baseline": "SELECT count(*) FROM dq_messages WHERE queue = 'big'",
    "dq_metrics": "SELECT * FROM dq_metrics()",
    "dq_health": "SELECT * FROM dq_health",
    "dq_stats": "SELECT * FROM dq_stats",
}

LOAD = """
INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, message_group,
                         lock_token, delivery_count)
SELECT 'big', 'k' || g, '\\x7b7d'::bytea, 'bytes',
       now() + CASE WHEN g %% 2 = 0 THEN -1 ELSE 1 END * (g %% 86400) * interval '1 second', now(),
       CASE WHEN g %% 10 = 0 THEN 'group-' || (g %% 1000) END,
       CASE WHEN g %% %(every)s = 1 THEN gen_random_uuid() END, CASE WHEN g %% %(every)s = 1 THEN 1 ELSE 0 END
  FROM generate_series(%(first)s, %(last)s) g
"""

ARCHIVE = """
INSERT INTO dq_archive (id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
                        delivery_count, outcome, acked_at)
SELECT g, 'big', 'a' || g, '\\x7b7d'::bytea, 'bytes', now(), now(), now(), 1,
       CASE WHEN g %% 50 = 0 THEN 'dead' WHEN g %% 20 = 0 THEN 'cancelled' ELSE 'acked' END,
       now() - (%(rows)s - g) * interval '10 ms'
  FROM generate_series(1, %(rows)s) g
"""

CHUNK = 1_000_000


def load(dsn: str, rows: int, every: int = 10_000) -> dict[str, Any]:
    """Fill the database: the big queue in chunks of a million rows (one in ``every`` in flight), its
    archive, the small queues."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SELECT dq_configure_queue('big', 5, 'big.dead', archive => true, max_in_flight => 1000, "
                     "rate_limit => 1000, rate_period => '1 second')")
        for first in range(1, rows + 1, CHUNK):
            conn.execute(LOAD, {"first": first, "last": min(first + CHUNK - 1, rows), "every": every})  # type: ignore[arg-type]
        conn.execute(ARCHIVE, {"rows": rows // 10})  # type: ignore[arg-type]
        conn.execute("SELECT dq_offer('small', 'k' || g, 'x') FROM generate_series(1, 10) g")
        conn.execute("VACUUM ANALYZE dq_messages")
        conn.execute("VACUUM ANALYZE dq_archive")
        sizes = conn.execute("SELECT pg_table_size('dq_messages'), pg_indexes_size('dq_messages')").fetchone()
    assert sizes is not None
    return {"load_s": round(time.perf_counter() - started, 1), "heap_bytes": sizes[0], "index_bytes": sizes[1]}


def measure(dsn: str, db_name: str, repeat: int) -> dict[str, Any]:
    """Each statement ``repeat`` times, round-robin, after one warm-up run each: times in ms."""
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = {name: len(conn.execute(text).fetchall()) for name, text in STATEMENTS.items()}  # type: ignore[arg-type]
        approximate = conn.execute("SELECT approximate FROM dq_metrics() WHERE queue = 'big'").fetchone()
        snap, t0 = CpuSnapshot.take(os.getpid(), db_name), time.perf_counter()
        for _ in range(repeat):
            for name, text in STATEMENTS.items():
                start = time.perf_counter()
                conn.execute(text).fetchall()  # type: ignore[arg-type]
                times[name].append((time.perf_counter() - start) * 1000)
        cpu = snap.until(CpuSnapshot.take(os.getpid(), db_name), time.perf_counter() - t0)
    return {"times_ms": times, "rows_returned": rows, "approximate": bool(approximate and approximate[0]),
            "other_cpu": round(cpu["other_cpu"], 3)}


def figures(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Median and fastest ms of each statement, and the median's ratio to the baseline's."""
    base = statistics.median(run["times_ms"]["baseline"])
    return {name: {"median_ms": round(statistics.median(t), 2), "min_ms": round(min(t), 2),
                   "ratio_to_baseline": round(statistics.median(t) / base, 3)}
            for name, t in run["times_ms"].items()}


def tables(report: dict[str, Any]) -> list[Table]:
    rows = []
    for run in report["runs"]:
        for name, f in run["figures"].items():
            rows.append([f"{run['rows']:,}", name, f"{f['median_ms']:.1f}", f"{f['min_ms']:.1f}",
                         f"{f['ratio_to_baseline']:.3f}", f"{run['other_cpu']:.0%}"])
    caption = "; ".join(
        f"{run['rows']:,} rows: heap {run['heap_bytes'] / 2**20:.0f} MiB, "
        f"indexes {run['index_bytes'] / 2**20:.0f} MiB, dq_metrics estimated: {run['approximate']}"
        for run in report["runs"])
    return [rich_table(f"One scrape against a plain count of the queue ({report['repeat']} runs each, round-robin)",
                       ["rows in the queue", "statement", "median ms", "fastest ms", "median / baseline",
                        "other CPU"], rows, left=("statement",), caption=caption)]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Everything but the individual times (the figures hold their median and minimum)."""
    return {**without(report, "runs"), "runs": [without(run, "times_ms") for run in report["runs"]]}


def run(admin_dsn: str, sizes: list[int], repeat: int, db_name: str, out: Path | None, quick: bool,
        every: int = 10_000) -> dict[str, Any]:
    started, timestamp = time.perf_counter(), datetime.now(UTC)
    runs = []
    for rows in sizes:
        console().log(f"{rows:,} rows: installing and loading {db_name}")
        dsn = create_database(admin_dsn, db_name, baseline=False)
        loaded = load(dsn, rows, every)
        console().log(f"{rows:,} rows loaded in {loaded['load_s']} s; measuring")
        measured = measure(dsn, db_name, repeat)
        runs.append({"rows": rows, **loaded, **measured})
        runs[-1]["figures"] = figures(runs[-1])
    with psycopg.connect(dsn) as conn:
        server, source = server_info(conn), source_info(conn)
    report = {"timestamp": timestamp.isoformat(timespec="seconds"), "mode": "quick" if quick else "full",
              "wall_time_s": round(time.perf_counter() - started, 1), "repeat": repeat, "in_flight_every": every,
              "statements": STATEMENTS, "machine": machine_info(), "server": server, "source": source, "runs": runs}
    publish("scrape", report, summary(report), tables(report), out, quick=quick, at=timestamp)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.scrape", __doc__, quick="development: 10^5 rows, 3 repeats", db_name="dq_scrape")
    parser.add_argument("--rows", default=None, help="queue sizes, comma-separated (default 1e6,1e7)")
    parser.add_argument("--repeat", type=int, default=None, help="runs of each statement per size (default 7)")
    parser.add_argument("--in-flight-every", type=int, default=10_000,
                        help="one message in this many is in flight (default 10000; 100: 1 %%)")
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in (args.rows or ("1e5" if args.quick else "1e6,1e7")).split(",")]
    repeat = args.repeat or (3 if args.quick else 7)
    if repeat < 1 or args.in_flight_every < 1 or any(s < 1 for s in sizes):
        raise SystemExit("bench.scrape: --rows, --repeat and --in-flight-every must be positive")
    run(args.dsn, sizes, repeat, args.db_name, args.out, args.quick, args.in_flight_every)


if __name__ == "__main__":
    main()
