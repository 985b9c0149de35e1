"""What the web console's queries cost at 10^6 messages in one queue: EXPLAIN (ANALYZE, BUFFERS) of
each read the console makes (sql/168_console.sql and the existing dq_metrics).

    python -m bench.console_queries --dsn ADMIN_DSN [--rows 1e6] [--repeat 5] [--quick] [--db-name dq_console]

The database ``--db-name`` is recreated and installed (``pyqueue.migrate``); as the owner, one
set-based ``INSERT … SELECT generate_series`` loads queue ``big`` straight into ``dq_messages`` (keys
``t<g mod 100>/<g>``, so a prefix ``t42/`` holds 1 %; half due, half due within a day; one message in
ten in one of 1,000 FIFO groups, whose heads are written into ``dq_groups``; one in 10,000 in flight,
one in 10,000 expired, one in 1,000 delivered three times), 10^4 dead letters of ``big`` in
``big.dead`` (20 different errors), 10^5 archive rows of ``big`` that left in the last hour, and, for
the worst case of a state filter, queue ``flat`` with as many messages, all scheduled but the one
whose key sorts last, which is ready; then ``VACUUM ANALYZE``. Each statement then runs
``--repeat`` times (default 5) under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` after one unmeasured
warm-up, on one connection: the median execution time, the fastest, the buffers of the median run
(shared hit + read: 8 kB pages touched) and the rows returned. The plans of the statements inside
the function (auto_explain) are kept in the full report, and the indexes they read are printed.

``--quick``: 10^5 rows (10^3 dead letters, 10^4 archive rows) and 3 repeats. Writes the full report to
``bench/results/raw/console_queries-<UTC time>.json`` and its summary to
``bench/results/console_queries.json`` (``console_queries-quick.json``; ``--out x.json``: x.json and
x.summary.json). Uses one client connection.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from bench.lib.database import create_database, server_info, source_info
from bench.lib.report import arguments, console, machine_info, publish, rich_table, without

if TYPE_CHECKING:
    from rich.table import Table

LOAD = """
INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, message_group,
                         lock_token, delivery_count, expires_at, last_error)
SELECT 'big', 't' || (g %% 100) || '/' || g, '\\x7b7d'::bytea, 'json',
       CASE WHEN g %% 10000 = 1 THEN now() + interval '10 minutes'
            ELSE now() + CASE WHEN g %% 2 = 0 THEN -1 ELSE 1 END * (g %% 86400) * interval '1 second' END,
       now() - interval '1 day' + g * interval '1 ms',
       CASE WHEN g %% 10 = 0 THEN 'group-' || (g %% 1000) END,
       CASE WHEN g %% 10000 = 1 THEN gen_random_uuid() END,
       CASE WHEN g %% 10000 = 1 THEN 1 WHEN g %% 1000 = 3 THEN 3 ELSE 0 END,
       CASE WHEN g %% 10000 = 5 THEN now() - interval '1 second' END,
       CASE WHEN g %% 1000 = 3 THEN 'retry' END
  FROM generate_series(1, %(rows)s) g
"""

# Each group's head: its first message by first due time, then id (sql/020_groups.sql).
GROUPS = """
INSERT INTO dq_groups (queue, message_group, head_id, priority, due_at)
SELECT DISTINCT ON (m.queue, m.message_group) m.queue, m.message_group, m.id, m.priority, m.scheduled_at
  FROM dq_messages m
 WHERE m.message_group IS NOT NULL AND m.dead_from IS NULL
 ORDER BY m.queue, m.message_group, m.scheduled_at_initially, m.id
"""

DEAD = """
INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, delivery_count,
                         dead_delivery_count, last_error, last_error_at, dead_from, dead_at, dead_from_id)
SELECT 'big.dead', 'd' || g, '\\x7b7d'::bytea, 'json', now() - g * interval '1 s', now() - g * interval '1 s', 0, 5,
       'error ' || (g %% 20), now() - g * interval '1 s', 'big', now() - g * interval '1 s', 10000000000 + g
  FROM generate_series(1, %(rows)s) g
"""

# The worst case of a state filter: queue 'flat', as many messages, all scheduled and ungrouped but
# one ready message whose key sorts last, so that a filter for ready (or held: none) walks every key.
FLAT = """
INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially)
SELECT 'flat', 'f' || lpad(g::text, 8, '0'), '\\x7b7d'::bytea, 'json',
       now() + CASE WHEN g = %(rows)s THEN interval '-1 minute' ELSE interval '1 hour' END, now()
  FROM generate_series(1, %(rows)s) g
"""

ARCHIVE = """
INSERT INTO dq_archive (id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
                        delivery_count, outcome, acked_at)
SELECT g, 'big', 'a' || g, '\\x7b7d'::bytea, 'json', now(), now(), now(), 1,
       CASE WHEN g %% 50 = 0 THEN 'dead' WHEN g %% 20 = 0 THEN 'cancelled' WHEN g %% 30 = 0 THEN 'expired'
            ELSE 'acked' END,
       now() - (g %% 3599) * interval '1 s' - (g %% 1000) * interval '1 ms'
  FROM generate_series(1, %(rows)s) g
"""


def load(dsn: str, rows: int) -> dict[str, Any]:
    """Fill the database (see the module's docstring); returns the load time and the table's sizes."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SELECT dq_configure_queue('big', 5, 'big.dead', archive => true)")
        conn.execute(LOAD, {"rows": rows})  # type: ignore[arg-type]
        conn.execute(GROUPS)
        conn.execute(DEAD, {"rows": rows // 100})  # type: ignore[arg-type]
        conn.execute(FLAT, {"rows": rows})  # type: ignore[arg-type]
        conn.execute(ARCHIVE, {"rows": rows // 10})  # type: ignore[arg-type]
        conn.execute("VACUUM ANALYZE dq_messages")
        conn.execute("VACUUM ANALYZE dq_groups")
        conn.execute("VACUUM ANALYZE dq_archive")
        sizes = conn.execute("SELECT pg_table_size('dq_messages'), pg_indexes_size('dq_messages')").fetchone()
    assert sizes is not None
    return {"load_s": round(time.perf_counter() - started, 1), "heap_bytes": sizes[0], "index_bytes": sizes[1]}


def statements(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The statements measured, with the middle page's key and a message's id read from the data."""
    middle = conn.execute("SELECT key, id FROM dq_messages WHERE queue = 'big' ORDER BY key, id "
                          "OFFSET (SELECT count(*) / 2 FROM dq_messages WHERE queue = 'big') LIMIT 1").fetchone()
    some = conn.execute("SELECT id FROM dq_messages WHERE queue = 'big' AND key = 't42/4242'").fetchone()
    assert middle is not None and some is not None

    def browse(queue: str, state: str | None = None, *, after: bool = False, prefix: str | None = None) -> str:
        text = "SELECT * FROM dq_browse_messages({}, {}, key_prefix => {}, after_key => {}, after_id => {})"
        return sql.SQL(text).format(queue, state, prefix, middle[0] if after else None,
                                    middle[1] if after else None).as_string(conn)

    found = {
        "browse: first page": browse("big"),
        "browse: a page in the middle": browse("big", after=True),
        "browse: key_prefix 't42/'": browse("big", prefix="t42/"),
    }
    for state in ("ready", "scheduled", "in_flight", "redelivered", "held", "expired"):
        found[f"browse: {state}"] = browse("big", state)
    found["browse: dead (big.dead, all dead)"] = browse("big.dead", "dead")
    found["browse: dead (big: none, worst case)"] = browse("big", "dead")
    found["browse: ready (flat: 1, keyed last, walks all)"] = browse("flat", "ready")
    found["browse: held (flat: none, walks all)"] = browse("flat", "held")
    found["browse: in_flight, middle page"] = browse("big", "in_flight", after=True)
    found.update({
        "dq_message_detail": sql.SQL("SELECT * FROM dq_message_detail('big', {})").format(some[0]).as_string(conn),
        "dq_dead_letter_groups (10^4 dead)": "SELECT * FROM dq_dead_letter_groups('big.dead')",
        "dq_count_dead_letters (10^4 dead)": "SELECT dq_count_dead_letters('big.dead')",
        "dq_throughput (10^5 archive rows/h)": "SELECT * FROM dq_throughput('big')",
        "dq_metrics": "SELECT * FROM dq_metrics()",
        "dq_queue_config": "SELECT * FROM dq_queue_config('big')",
        "dq_audit_entries": "SELECT * FROM dq_audit_entries()",
    })
    return found


def explain(conn: psycopg.Connection[Any], statement: str) -> dict[str, Any]:
    """One EXPLAIN (ANALYZE, BUFFERS) run: execution and planning ms, buffers, rows."""
    row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}").format(sql.SQL(statement))).fetchone()  # type: ignore[arg-type]
    assert row is not None
    doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan = doc[0]["Plan"]
    return {"execution_ms": doc[0]["Execution Time"], "planning_ms": doc[0]["Planning Time"],
            "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
            "read": plan.get("Shared Read Blocks", 0), "rows": plan.get("Actual Rows", 0)}


def inner_plans(conn: psycopg.Connection[Any], statement: str) -> str:
    """The plans of the statements run inside the function, as auto_explain logs them."""
    logs: list[str] = []
    conn.add_notice_handler(lambda diag: logs.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_analyze = off")
    conn.execute("SET client_min_messages = log")
    try:
        conn.execute(statement)  # type: ignore[arg-type]
    finally:
        conn.execute("SET client_min_messages = notice")
        conn.execute("SET auto_explain.log_min_duration = -1")
    return "\n".join(logs)


def access(plans: str) -> str:
    """The scans of dq_messages / dq_archive in the plans, short: 'Index Scan dq_messages_queue_key_key'."""
    found = re.findall(r"((?:Index Only Scan|Index Scan)(?: Backward)? using (dq_(?:messages|archive)\w*)"
                       r"|Bitmap Index Scan on (dq_(?:messages|archive)\w*)|Seq Scan on (dq_messages|dq_archive)\b)",
                       plans)
    seen: list[str] = []
    for whole, *_ in found:
        text = whole.replace(" using ", " ").replace(" on ", " ")
        if text not in seen:
            seen.append(text)
    return ", ".join(seen)


def measure(dsn: str, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, statement in statements(conn).items():
            explain(conn, statement)  # warm-up
            runs = [explain(conn, statement) for _ in range(repeat)]
            median = statistics.median(r["execution_ms"] for r in runs)
            at_median = min(runs, key=lambda r: abs(r["execution_ms"] - median))
            plans = inner_plans(conn, statement)
            out[name] = {"statement": statement, "median_ms": round(median, 2),
                         "min_ms": round(min(r["execution_ms"] for r in runs), 2),
                         "planning_ms": round(at_median["planning_ms"], 2), "buffers": at_median["buffers"],
                         "rows": at_median["rows"], "access": access(plans), "inner_plans": plans}
            console().log(f"{name}: {median:.2f} ms, {at_median['buffers']} buffers ({out[name]['access']})")
    return out


def tables(report: dict[str, Any]) -> list[Table]:
    rows = [[name, f"{f['median_ms']:.2f}", f"{f['min_ms']:.2f}", f"{f['buffers']:,}", f"{f['rows']:,}", f["access"]]
            for name, f in report["figures"].items()]
    caption = (f"{report['rows']:,} messages in 'big' and in 'flat' (dq_messages: heap "
               f"{report['heap_bytes'] / 2**20:.0f} MiB, indexes "
               f"{report['index_bytes'] / 2**20:.0f} MiB), {report['rows'] // 100:,} dead letters, "
               f"{report['rows'] // 10:,} archive rows in the last hour; buffers: 8 kB pages hit or read")
    return [rich_table(f"The console's queries, EXPLAIN (ANALYZE, BUFFERS), median of {report['repeat']}",
                       ["statement", "median ms", "fastest ms", "buffers", "rows", "reads"], rows,
                       left=("statement", "reads"), caption=caption)]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Everything but the inner plans."""
    return {**without(report, "figures"),
            "figures": {k: without(v, "inner_plans") for k, v in report["figures"].items()}}


def run(admin_dsn: str, rows: int, repeat: int, db_name: str, out: Path | None, quick: bool) -> dict[str, Any]:
    started, timestamp = time.perf_counter(), datetime.now(UTC)
    console().log(f"{rows:,} rows: installing and loading {db_name}")
    dsn = create_database(admin_dsn, db_name, baseline=False)
    loaded = load(dsn, rows)
    console().log(f"loaded in {loaded['load_s']} s; measuring")
    figures = measure(dsn, repeat)
    with psycopg.connect(dsn) as conn:
        server, source = server_info(conn), source_info(conn)
    report = {"timestamp": timestamp.isoformat(timespec="seconds"), "mode": "quick" if quick else "full",
              "wall_time_s": round(time.perf_counter() - started, 1), "repeat": repeat, "rows": rows, **loaded,
              "machine": machine_info(), "server": server, "source": source, "figures": figures}
    publish("console_queries", report, summary(report), tables(report), out, quick=quick, at=timestamp)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.console_queries", __doc__, quick="development: 10^5 rows, 3 repeats",
                       db_name="dq_console")
    parser.add_argument("--rows", default=None, help="messages in the queue (default 1e6)")
    parser.add_argument("--repeat", type=int, default=None, help="runs of each statement (default 5)")
    args = parser.parse_args(argv)
    rows = int(float(args.rows or ("1e5" if args.quick else "1e6")))
    repeat = args.repeat or (3 if args.quick else 5)
    if repeat < 1 or rows < 10_000:
        raise SystemExit("bench.console_queries: --repeat must be positive and --rows at least 10000")
    run(args.dsn, rows, repeat, args.db_name, args.out, args.quick)


if __name__ == "__main__":
    main()
