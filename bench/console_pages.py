"""What each page of the web console costs at 10^6 messages: its database queries (count and time,
from the page's ``Server-Timing`` header) and its whole time in the app, beside plain SQL.

    python -m bench.console_pages --dsn ADMIN_DSN [--rows 1e6] [--repeat 5] [--quick] [--db-name dq_console_pages]

The database ``--db-name`` is recreated, installed and loaded as ``bench.console_queries`` loads it
(queue ``big`` of ``--rows`` messages in every state, 10^4 dead letters in ``big.dead``, 10^5 archive
rows, the worst case ``flat``). The console (``pyqueue.console.create_app``, read-only, its default
statement timeout of 5 s) runs in this process and each page is fetched through Starlette's
TestClient: no network, so the time is the app's (queries, template) and nothing else. Each page is
fetched ``--repeat`` times (default 5) after one unmeasured warm-up, round-robin, on one connection
pool. Plain SQL on the same server, in the same run, for comparison: a keyset page of 51 rows of
``big`` by key (what the message browser's first page reads, without the state) and a count of the
queue.

It prints, per page: the HTTP status, the queries, the median database time and the median page
time (ms), and the page time's ratio to the plain keyset page. ``--quick``: 10^5 rows, 3 repeats.
Writes ``bench/results/raw/console_pages-<UTC time>.json`` and the summary
``bench/results/console_pages.json``. Uses one client connection besides the console's pool.
"""

from __future__ import annotations

import re
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import psycopg

from bench.console_queries import load
from bench.lib.database import create_database, server_info, source_info
from bench.lib.report import arguments, console, machine_info, publish, rich_table, without

if TYPE_CHECKING:
    from rich.table import Table

BASELINES = {
    "plain keyset page": "SELECT id, key FROM dq_messages WHERE queue = 'big' AND key > %(key)s ORDER BY key LIMIT 51",
    "plain count": "SELECT count(*) FROM dq_messages WHERE queue = 'big'",
}


def pages(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The pages measured, by name: path (the ids and keys read from the loaded database)."""
    middle = conn.execute("SELECT key FROM dq_messages WHERE queue = 'big' ORDER BY key "
                          "OFFSET (SELECT count(*) / 2 FROM dq_messages WHERE queue = 'big') LIMIT 1").fetchone()
    message = conn.execute("SELECT id FROM dq_messages WHERE queue = 'big' AND dead_from IS NULL LIMIT 1").fetchone()
    dead = conn.execute("SELECT id FROM dq_messages WHERE queue = 'big.dead' LIMIT 1").fetchone()
    assert middle and message and dead
    return {
        "overview": "/",
        "overview (live fragment)": "/fragments/overview",
        "queue, first page": "/queues/big",
        "queue, a page in the middle": f"/queues/big?after_key={quote(middle[0])}&after_id=0",
        "queue, key prefix (1 %)": "/queues/big?prefix=t42/",
        **{f"queue, state {s}": f"/queues/big?state={s}"
           for s in ("ready", "scheduled", "in_flight", "redelivered", "held", "expired")},
        "queue, state ready (worst: one, last key)": "/queues/flat?state=ready",
        "message": f"/queues/big/messages/{message[0]}",
        "dead-letter queues": "/dead-letters",
        "dead letters (10^4)": "/dead-letters/big.dead",
        "dead letter": f"/queues/big.dead/messages/{dead[0]}",
        "schedules": "/schedules",
        "health": "/health",
        "audit log": "/audit",
        "metrics": "/metrics",
    }


def measure(dsn: str, repeat: int) -> dict[str, Any]:
    from starlette.testclient import TestClient

    from pyqueue.console import create_app

    with psycopg.connect(dsn, autocommit=True) as conn:
        paths = pages(conn)
        first_key = conn.execute("SELECT key FROM dq_messages WHERE queue = 'big' ORDER BY key LIMIT 1").fetchone()
        base_ms: dict[str, list[float]] = {name: [] for name in BASELINES}
        for _ in range(repeat + 1):
            for name, text in BASELINES.items():
                started = time.perf_counter()
                conn.execute(text, {"key": first_key[0] if first_key else ""}).fetchall()  # type: ignore[arg-type]
                base_ms[name].append((time.perf_counter() - started) * 1000)
    for times in base_ms.values():
        del times[0]  # the warm-up
    results: dict[str, dict[str, Any]] = {name: {"path": path, "page_ms": [], "db_ms": [], "queries": []}
                                          for name, path in paths.items()}
    with TestClient(create_app(dsn)) as client:
        for round_ in range(repeat + 1):
            for name, path in paths.items():
                started = time.perf_counter()
                response = client.get(path)
                elapsed = (time.perf_counter() - started) * 1000
                timing = re.fullmatch(r'db;dur=([0-9.]+);desc="(\d+) queries"',
                                      response.headers.get("server-timing", ""))
                entry = results[name]
                entry["status"] = response.status_code
                if round_ == 0:
                    continue
                entry["page_ms"].append(elapsed)
                if timing:
                    entry["db_ms"].append(float(timing.group(1)))
                    entry["queries"].append(int(timing.group(2)))
    keyset = statistics.median(base_ms["plain keyset page"])
    figures = {}
    for name, entry in results.items():
        page = statistics.median(entry["page_ms"])
        figures[name] = {"path": entry["path"], "status": entry["status"],
                         "queries": max(entry["queries"], default=0),
                         "db_ms": round(statistics.median(entry["db_ms"]), 1) if entry["db_ms"] else None,
                         "page_ms": round(page, 1), "fastest_ms": round(min(entry["page_ms"]), 1),
                         "ratio_to_plain_keyset_page": round(page / keyset, 1)}
    return {"baselines_ms": {n: round(statistics.median(t), 2) for n, t in base_ms.items()},
            "figures": figures, "times": results}


def tables(report: dict[str, Any]) -> list[Table]:
    rows = [[name, str(f["status"]), str(f["queries"]), "—" if f["db_ms"] is None else f"{f['db_ms']:.1f}",
             f"{f['page_ms']:.1f}", f"{f['ratio_to_plain_keyset_page']:.1f}"]
            for name, f in report["figures"].items()]
    base = "; ".join(f"{n}: {ms:.2f} ms" for n, ms in report["baselines_ms"].items())
    return [rich_table(f"Console pages at {report['rows']:,} messages ({report['repeat']} fetches each, medians)",
                       ["page", "status", "queries", "database ms", "page ms", "page / plain keyset page"], rows,
                       left=("page",), caption=f"plain SQL in the same run: {base}")]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Everything but the individual times (the figures hold their medians)."""
    return without(report, "times")


def run(admin_dsn: str, rows: int, repeat: int, db_name: str, out: Path | None, quick: bool) -> dict[str, Any]:
    started, timestamp = time.perf_counter(), datetime.now(UTC)
    console().log(f"{rows:,} rows: installing and loading {db_name}")
    dsn = create_database(admin_dsn, db_name, baseline=False)
    loaded = load(dsn, rows)
    console().log(f"loaded in {loaded['load_s']} s; measuring")
    measured = measure(dsn, repeat)
    with psycopg.connect(dsn) as conn:
        server, source = server_info(conn), source_info(conn)
    report = {"timestamp": timestamp.isoformat(timespec="seconds"), "mode": "quick" if quick else "full",
              "wall_time_s": round(time.perf_counter() - started, 1), "rows": rows, "repeat": repeat,
              "machine": machine_info(), "server": server, "source": source, **loaded, **measured}
    publish("console_pages", report, summary(report), tables(report), out, quick=quick, at=timestamp)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.console_pages", __doc__, quick="development: 10^5 rows, 3 repeats",
                       db_name="dq_console_pages")
    parser.add_argument("--rows", default=None, help="messages in queue big (default 1e6)")
    parser.add_argument("--repeat", type=int, default=None, help="fetches of each page (default 5)")
    args = parser.parse_args(argv)
    rows = int(float(args.rows or ("1e5" if args.quick else "1e6")))
    repeat = args.repeat or (3 if args.quick else 5)
    if rows < 1000 or repeat < 1:
        raise SystemExit("bench.console_pages: --rows must be at least 1000 and --repeat positive")
    run(args.dsn, rows, repeat, args.db_name, args.out, args.quick)


if __name__ == "__main__":
    main()
