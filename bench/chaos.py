"""Fault injection with exact accounting: ``make chaos``.

    python -m bench.chaos [--duration 60] [--mode exactly-once|at-least-once|graph|both|all] [--rate 1000]
                          [--graph-rate 200] [--out PATH] [--seed N] [--port N]

It starts a PRIVATE PostgreSQL server of its own (a new data directory under a temporary folder,
or ``--pgdata``, on a free loopback port or ``--port``, with ``scripts/localpg.sh``; never the test
or demo server, because it restarts it), installs the queue, and for ``--duration`` seconds runs
producer and consumer processes while it injects faults at random moments of the middle of the
run. The producers offer ``--rate`` messages per second per mode (default 1,000): most in outbox
transactions of ``--batch`` keys (``offer_many``), ``--single-share`` of them (default a fifth)
one ``offer`` per call. The faults:

* SIGKILL of a consumer process (the harness starts a new one in its slot after 0.5 s);
* ``pg_terminate_backend`` of the consumers' connections (all of them, or one consumer's);
* ``pg_ctl restart -m immediate`` of the server (crash recovery on start);
* a transaction held open in REPEATABLE READ for 20 s (a pinned xmin); restarts are placed
  outside it so that it is held for its whole time.

Then it waits for the queues to drain, stops the consumers (SIGTERM) and accounts for every key
the producers offered. The modes (``both`` runs them side by side on two queues, under the
same faults):

* exactly-once (queue ``chaos-eo``): consumers are a ``pyqueue worker`` and a ``pyqueue worker
  --async`` whose handler writes a ledger row and acknowledges (``message.ack(conn=…)``) in one
  transaction, and a loop on ``DelayedQueue.transaction``. Every acknowledged key must have
  exactly one ledger row, and no other key any.
* at-least-once (queue ``chaos-alo``): two ``pyqueue worker`` and one ``--async``; the handler
  only logs the delivery. Every extra delivery of a key must be explained by a fault that hit the
  worker holding the previous delivery between that delivery and the next: its process was
  killed, its connections were terminated, the server restarted, or (a connection the fault left
  broken in a pool, used later) the worker logged a database error in that interval after such
  a fault. Anything else is an unexplained duplicate.
* graph (queues ``chaos-g1`` and ``chaos-g2``; ``--mode graph``, or ``all`` beside the other two): one
  producer offers small graphs at ``--graph-rate`` nodes per second, each in one transaction: the ETL
  shape (extract; three transforms after it; a load after all three; a report after the load) and
  chains of four, alternating between the two queues (``dq_offer(after => …)``). A ``pyqueue worker``
  on one queue and a ``--async`` one on the other log each delivery; the worker acknowledges. Besides
  the at-least-once rules: no child's first handler run before the acknowledgement of every one of
  its parents (the archive's acked_at, the same database clock as the delivery log), every node
  acknowledged, and at the end no blocked message and no dependency row left.

In both modes every handler run is logged in autocommit (``chaos_deliveries``: key,
delivery_count, worker pid, lock token, locked_until, time). Producers record each attempt with
``ok`` (committed) or ``unknown`` (the call raised: a restart may have cut it before or after the
commit); unknown ones are resolved afterwards from the database: the outbox producer's own
``chaos_offered`` row (written in the offer's transaction), or for plain autocommit offers the
key found in the queue, the archive or the delivery log. No key is counted lost or offered blindly.

Lost: a committed key neither acknowledged (the queues archive, so each acknowledgement is a
``dq_archive`` row) nor still live nor a dead letter. Recovery: the queues drained by themselves
after the last fault, no consumer process exited on its own, and every consumer running after the
last fault handled messages after it. Throughput is given before, during and after the faults, as
offered and delivered (acknowledged) messages per second.

The result is printed as tables and written as JSON: the full report to
``bench/results/raw/chaos-<UTC time>.json`` and its summary to ``bench/results/chaos.json`` (with
``--out x.json``, to x.json and x.summary.json instead); the exit status is non-zero on any loss,
unexplained duplicate, ledger row not exactly once, a fault kind not injected, or a failed
recovery. The server is stopped and its data directory removed at the end, also on errors and
Ctrl-C/SIGTERM; the processes' logs are kept (path printed) when the run failed. With
``--hand-over PATH`` the run writes the server's DSN (and the folder of the producers' records) to
PATH before removing it and waits until PATH is removed, so that a caller (tests/bench/test_chaos.py) can
count from the database itself.

bench.soak reuses this harness (processes, faults, accounting) for a long run with periodic faults.

This module is the program and its tables; the run's settings and fault plan are in
bench.chaos_plan, the harness (processes, fault injection, supervision, the report) in
bench.chaos_harness, the accounting in bench.chaos_accounting, the private server in bench.lib.server.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.chaos_harness import Chaos, add_arguments, execute, settings_from
from bench.chaos_plan import Settings, Timeline
from bench.lib.report import publish, without

if TYPE_CHECKING:
    from rich.table import Table


# --------------------------------------------------------------------------- report


def tables(report: dict[str, Any]) -> list[Table]:
    from rich.table import Table

    faults = Table(title="Faults injected")
    for col in ("kind", "count", "at (s from start)", "detail"):
        faults.add_column(col, justify="left" if col in ("kind", "detail") else "right")
    for kind in ("kill", "terminate", "restart", "pin"):
        fs = [f for f in report["faults"] if f["kind"] == kind]
        if kind == "kill":
            detail = ", ".join(f"{f['target']}" + (f" ({f['error']})" if f["error"] else "") for f in fs)
        elif kind == "terminate":
            detail = ", ".join(f"{f['target']}: {f['detail'].get('backends', 0)} backends" for f in fs)
        elif kind == "restart":
            detail = ", ".join(f"{f['detail'].get('seconds', '?')} s down" + (f" ({f['error']})" if f["error"] else "")
                               for f in fs)
        else:
            detail = ", ".join(f"held {f['detail'].get('seconds', '?')} s, xmin {f['detail'].get('backend_xmin')}"
                               + (f" ({f['error']})" if f["error"] else "") for f in fs)
        faults.add_row(kind, str(report["faults_injected"][kind]), ", ".join(f"{f['t_s']:.1f}" for f in fs), detail)
    modes = report["modes"]
    acc = Table(title=f"Accounting ({report['settings']['duration']:g} s run, seed {report['settings']['seed']})")
    acc.add_column("")
    for mode in modes:
        acc.add_column(mode, justify="right")

    def row(label: str, fn: Any) -> None:
        acc.add_row(label, *(str(fn(m)) for m in modes.values()))

    row("attempted offers", lambda m: f"{m['attempted']:,}")
    row("unknown outcome: committed / not", lambda m: f"{m['unknown_resolved']['committed']} / "
                                                       f"{m['unknown_resolved']['not committed']}")
    row("offered (committed)", lambda m: f"{m['offered']:,}")
    row("acknowledged", lambda m: f"{m['acknowledged']:,}")
    row("still in the queue", lambda m: m["live_at_end"])
    row("dead letters", lambda m: m["dead_letters"])
    row("lost", lambda m: m["lost"])
    row("handler runs", lambda m: f"{m['deliveries']:,}")
    row("duplicates", lambda m: m["duplicates"])
    row("extra handler runs by cause", lambda m: ", ".join(f"{k} {v}" for k, v in
                                                           sorted(m["extra_delivery_causes"].items())) or "-")
    row("ledger exactly once", lambda m: {True: "yes", False: "NO"}.get(m.get("ledger_exactly_once"), "-"))
    for phase in ("before", "during", "after", "whole run"):
        label = "offered/s, delivered/s " + (f"{phase} faults" if phase != "whole run" else "over the whole run")
        row(label, lambda m, ph=phase: f"{m['throughput'][ph]['offered_per_s']:,.0f}, "
                                       f"{m['throughput'][ph]['delivered_per_s']:,.0f}")
    row("first ack after restart / cut of all", lambda m: ", ".join(
        "-" if x["first_ack_s"] is None else f"{x['first_ack_s']:.2f} s" for x in m["first_ack_after_fault_s"]) or "-")
    row("drained after producers stopped", lambda m: "NO" if m["drained_s"] is None else f"{m['drained_s']:.1f} s")
    row("recovered by themselves", lambda m: "yes" if m["recovered"] else "NO")
    graph = modes.get("graph")
    if graph is not None:
        g = Table(title="Graph workload (DAGs of messages offered after others, across two queues)")
        g.add_column("")
        g.add_column("graph", justify="right")
        lat = graph["release_after_last_parent_ack_ms"]
        for label, v in (("graphs offered, nodes, children", f"{graph['graphs']:,}, {graph['offered']:,}, "
                                                              f"{graph['children']:,}"),
                         ("children run before every parent was acknowledged", graph["delivered_before_parents_acked"]),
                         ("first run after the last parent's ack, ms p50 / p99 / max",
                          f"{lat['p50']} / {lat['p99']} / {lat['max']}"),
                         ("blocked messages left at the end", graph["blocked_at_end"]),
                         ("dependency rows left at the end", graph["dependency_rows_at_end"])):
            g.add_row(label, str(v))
    acc.caption = ("extra handler runs: in exactly-once mode rolled back, no duplicate effect; duplicates there are "
                   "ledger rows beyond one per key. " + ("[green]PASS[/]" if report["passed"] else
                                                         "[red]FAIL: " + "; ".join(report["failures"]) + "[/]"))
    return [faults, acc] + ([g] if graph is not None else [])


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the tables show, with the settings, machine, server and commit measured: without the
    list of processes and each mode's acknowledgements per second."""
    return {**without(report, "processes"),
            "modes": {name: without(m, "acked_per_second") for name, m in report["modes"].items()}}


def run(s: Settings, out: Path | None) -> dict[str, Any]:
    report = execute(Chaos, s)
    publish("chaos", report, summary(report), tables(report), out)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    add_arguments(parser, 60.0)
    args = parser.parse_args(argv)
    s = settings_from(args)
    Timeline.plan(s)
    try:
        report = run(s, args.out)
    except KeyboardInterrupt:
        return 130
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    from bench.chaos import main as _main

    raise SystemExit(_main())
