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

This module is the program; the configuration and the sides are in bench.controls_config, the four
parts in bench.controls_parts, the tables and the summary in bench.controls_report.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.controls_config import CONTROLS_MIGRATION, FULL, POLL_BATCH, QUICK, Config
from bench.controls_parts import backlog_part, default_old_ref, install_old, levels_part, rate_part, regression_part
from bench.controls_report import summary, tables
from bench.lib.database import create_database, provenance, server_info
from bench.lib.report import arguments, console, machine_info, publish

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
