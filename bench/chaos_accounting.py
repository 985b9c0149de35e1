"""The accounting of a chaos run (bench.chaos, bench.soak): every key the producers offered is found
acknowledged, still live or a dead letter, every extra handler run is matched to a fault, and the
throughput before, during and after the faults and the recovery are measured (the rules are in
bench.chaos's docstring).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.chaos_plan import MODES, Fault
from bench.lib.report import console

EPS_S = 0.05  # slack when comparing times of the database clock, the logs and this harness (one host)


@dataclass(frozen=True)
class Delivery:
    key: str
    delivery_count: int
    pid: int
    locked_until: float
    at: float


def explain(prev: Delivery, nxt: Delivery, faults: list[Fault],
            errors_by_pid: dict[int, list[float]]) -> tuple[str | None, float | None]:
    """Why the key was handled again after ``prev``: a fault that hit prev's worker between the two
    handler runs. Returns (cause, lag of a stale connection) or (None, None)."""
    lo, hi, pid = prev.at - EPS_S, nxt.at + EPS_S, prev.pid
    faults = [f for f in faults if f.error is None]
    for f in faults:
        if f.kind == "kill" and pid in f.victims and lo <= f.t <= hi:
            return "worker killed", None
    for f in faults:
        if f.kind == "terminate" and pid in f.victims and lo <= f.t <= hi:
            return "connection terminated", None
    for f in faults:
        if f.kind == "restart" and f.t <= hi and (f.t_end or f.t) >= lo:
            return "server restart", None
    # A connection broken by an earlier fault and used (and failing) between the two runs.
    hits = [f.t for f in faults if (f.kind == "terminate" and pid in f.victims) or f.kind == "restart"]
    for err in errors_by_pid.get(pid, []):
        if lo <= err <= hi:
            earlier = [t for t in hits if t <= err + EPS_S]
            if earlier:
                return "connection broken by an earlier fault", err - max(earlier)
    return None, None


def account_mode(conn: psycopg.Connection[Any], mode: str, *, queue: str, logs: Path, faults: list[Fault],
                 names_by_pid: dict[int, str], errors_by_pid: dict[int, list[float]],
                 phases: tuple[float, float, float, float], drained_at: float | None, drain_timeout: float,
                 survivors: dict[str, int], crashed: bool, failures: list[str]) -> dict[str, Any]:
    """Account for every key the producers of `mode` offered to `queue`, from their records in
    `logs` and from the database (`conn`); match each extra handler run to a fault; measure the
    throughput in each phase and the recovery. Appends what fails to `failures`.

    :param faults: the faults tried, by time (a fault with an ``error`` did not happen).
    :param names_by_pid: the run's processes by OS pid, for the examples of unexplained re-runs.
    :param errors_by_pid: the times of each process's database errors (its log's WARNING lines).
    :param phases: epoch seconds: the start, the first fault, the end of the last fault, the
        producers' stop.
    :param drained_at: when the queue was empty after the producers stopped (`None`: never,
        within `drain_timeout` seconds).
    :param survivors: the consumers that ran through the last fault, name: pid.
    :param crashed: a consumer of this mode exited by itself.
    """
    q = queue
    short = MODES[mode]
    # What the producers attempted, and what they were told.
    attempts: dict[str, tuple[str, str, float]] = {}  # key -> (producer kind, status, time)
    statuses: Counter[str] = Counter()
    for path in sorted(logs.glob(f"{short}-*.jsonl")):
        kind = "outbox" if path.name.startswith(f"{short}-outbox") else "plain"
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            for k in rec["keys"]:
                attempts[k] = (kind, rec["status"], rec["t_done"])
            statuses[f"{kind} {rec['status']}"] += len(rec["keys"])
            if rec["status"] == "ok" and rec["outcomes"] != ["created"]:
                failures.append(f"{mode}: offer of {rec['keys'][0]}… was {rec['outcomes']}, not created")

    def keyset(query: str, *params: Any) -> Counter[str]:
        return Counter(r[0] for r in conn.execute(query, params).fetchall())

    offered_rows = keyset("SELECT key FROM chaos_offered WHERE queue = %s", q)
    live = keyset("SELECT key FROM dq_messages WHERE queue = %s", q)
    dead = keyset("SELECT key FROM dq_messages WHERE queue = %s AND dead_from = %s", q + ".dead", q)
    acked = keyset("SELECT key FROM dq_archive WHERE queue = %s AND outcome = 'acked'", q)
    archived_dead = keyset("SELECT key FROM dq_archive WHERE queue = %s AND outcome <> 'acked'", q)
    ledger = keyset("SELECT key FROM chaos_ledger WHERE queue = %s", q)
    deliveries = [
        Delivery(*row) for row in conn.execute(
            "SELECT key, delivery_count, pid, extract(epoch FROM locked_until)::float8, "
            "extract(epoch FROM at)::float8 FROM chaos_deliveries WHERE queue = %s ORDER BY key, at", (q,))
    ]
    delivered = Counter(d.key for d in deliveries)
    # Resolve the unknown outcomes from the database.
    committed: set[str] = set()
    unknown = {"committed": 0, "not committed": 0}
    told_but_missing: list[str] = []
    for k, (kind, status, _) in attempts.items():
        if kind == "outbox":
            found = k in offered_rows
        else:
            found = k in live or k in dead or k in acked or k in delivered or k in archived_dead
        if status == "ok":
            committed.add(k)
            if kind == "outbox" and not found:
                told_but_missing.append(k)
        elif found:
            committed.add(k)
            unknown["committed"] += 1
        else:
            unknown["not committed"] += 1
    phantom = sorted((set(live) | set(dead) | set(acked) | set(offered_rows)) - set(attempts))
    lost = sorted(k for k in committed if not acked[k] and not live[k] and not dead[k])
    acked_twice = sorted(k for k, n in acked.items() if n > 1)
    r: dict[str, Any] = {
        "queue": q,
        "attempted": len(attempts),
        "producer_statuses": dict(statuses),
        "unknown_resolved": unknown,
        "offered": len(committed),
        "acknowledged": sum(1 for k in committed if acked[k]),
        "live_at_end": sum(live.values()),
        "dead_letters": sum(dead.values()),
        "lost": len(lost),
        "lost_keys": lost[:50],
        "told_committed_but_not_in_database": told_but_missing[:50],
        "phantom_keys": phantom[:50],
        "acknowledged_twice": acked_twice[:50],
        "deliveries": len(deliveries),
        "drained_s": None if drained_at is None else round(drained_at - phases[3], 2),
    }
    for name, bad in (("lost", lost), ("told committed but not in the database", told_but_missing),
                      ("phantom (in the database, never offered)", phantom), ("acknowledged twice", acked_twice)):
        if bad:
            failures.append(f"{mode}: {len(bad)} keys {name}: {bad[:5]}")
    # Extra deliveries, each matched to a fault.
    by_key: dict[str, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_key[d.key].append(d)
    causes: Counter[str] = Counter()
    unexplained: list[dict[str, Any]] = []
    lags: list[float] = []
    for k, ds in by_key.items():
        for prev, nxt in zip(ds, ds[1:], strict=False):
            cause, lag = explain(prev, nxt, faults, errors_by_pid)
            if cause is None:
                unexplained.append({"key": k, "previous": asdict(prev), "next": asdict(nxt),
                                    "previous_process": names_by_pid.get(prev.pid),
                                    "before_lock_expired": nxt.at < prev.locked_until - EPS_S})
                causes["unexplained"] += 1
            else:
                causes[cause] += 1
                if lag is not None:
                    lags.append(lag)
    extra = sum(causes.values())
    r["extra_deliveries"] = extra
    r["extra_delivery_causes"] = dict(causes)
    r["stale_connection_lag_s"] = {"max": round(max(lags), 2), "n": len(lags)} if lags else None
    r["unexplained_examples"] = unexplained[:10]
    r["acked_without_delivery_logged"] = sum(1 for k in committed if acked[k] and not delivered[k])
    if mode == "exactly-once":
        twice = sorted(k for k, n in ledger.items() if n > 1)
        missing = sorted(k for k in committed if acked[k] and not ledger[k])
        orphan = sorted(k for k in ledger if not acked[k])
        r["ledger_rows"] = sum(ledger.values())
        r["duplicates"] = sum(n - 1 for n in ledger.values() if n > 1)
        r["ledger_twice"], r["ledger_missing"], r["ledger_without_ack"] = twice[:50], missing[:50], orphan[:50]
        r["ledger_exactly_once"] = not (twice or missing or orphan)
        for name, bad in (("with a ledger row more than once", twice), ("acknowledged without a ledger row",
                          missing), ("with a ledger row but not acknowledged", orphan)):
            if bad:
                failures.append(f"{mode}: {len(bad)} keys {name}: {bad[:5]}")
        if causes["unexplained"]:
            console().log(f"[yellow]{mode}: {causes['unexplained']} handler re-runs not matched to a fault "
                          "(rolled back, no duplicate effect)[/]")
    else:
        r["duplicates"] = extra
        r["unexplained_duplicates"] = causes["unexplained"]
        if causes["unexplained"]:
            failures.append(f"{mode}: {causes['unexplained']} duplicates not explained by a fault, e.g. "
                            f"{unexplained[:2]}")
    if r["acked_without_delivery_logged"]:
        failures.append(f"{mode}: {r['acked_without_delivery_logged']} keys acknowledged without a handler run")
    # Throughput and recovery.
    t0, first_fault, last_fault_end, t_prod_end = phases
    ack_times = [float(r_[0]) for r_ in conn.execute(
        "SELECT extract(epoch FROM acked_at)::float8 FROM dq_archive WHERE queue = %s AND outcome = 'acked'",
        (q,)).fetchall()]
    offer_times = [t for k, (_, _, t) in attempts.items() if k in committed]

    def rate(times: list[float], a: float, b: float) -> float:
        return sum(1 for t in times if a <= t < b) / (b - a) if b > a else 0.0

    # Offered: committed offers by the time the producer's call returned; delivered: acknowledged
    # (archived as acked) messages by the time of the acknowledgement.
    r["throughput"] = {
        phase: {"seconds": round(b - a, 1), "offered_per_s": round(rate(offer_times, a, b), 1),
                "delivered_per_s": round(rate(ack_times, a, b), 1)}
        for phase, a, b in (("before", t0, first_fault), ("during", first_fault, last_fault_end),
                            ("after", last_fault_end, t_prod_end), ("whole run", t0, t_prod_end))
    }
    r["acked_per_second"] = [sum(1 for t in ack_times if t0 + i <= t < t0 + i + 1)
                             for i in range(int(max(ack_times, default=t0) - t0) + 1)]
    # Recovery: how long after each server restart and each cut of all connections the queue
    # acknowledged again; and the handler runs after the last fault of every consumer that lived
    # through it (a consumer started after the last fault has nothing to recover from).
    def first_ack(after: float) -> float | None:
        later = [t for t in ack_times if t > after]
        return round(min(later) - after, 2) if later else None

    r["first_ack_after_fault_s"] = [
        {"kind": f.kind, "at_s": round(f.t - t0, 2), "first_ack_s": first_ack(max(f.t, f.t_end))}
        for f in faults
        if f.error is None and (f.kind == "restart" or (f.kind == "terminate" and f.target == "all"))]
    progress = {name: sum(1 for d in deliveries if d.pid == pid and d.at > last_fault_end)
                for name, pid in survivors.items()}
    r["deliveries_after_last_fault_by_consumer"] = progress
    stuck = [name for name, n in progress.items() if n == 0]
    r["recovered"] = drained_at is not None and not stuck and not crashed
    if drained_at is None:
        failures.append(f"{mode}: {r['live_at_end']} messages still in the queue {drain_timeout:.0f} s "
                        "after the producers stopped")
    if stuck:
        failures.append(f"{mode}: consumers {stuck} handled nothing after the last fault")
    return r


def account_graph(conn: psycopg.Connection[Any], mode: str, *, queue: str, logs: Path, faults: list[Fault],
                  names_by_pid: dict[int, str], errors_by_pid: dict[int, list[float]],
                  phases: tuple[float, float, float, float], drained_at: float | None, drain_timeout: float,
                  survivors: dict[str, int], crashed: bool, failures: list[str]) -> dict[str, Any]:
    """Account for the graph mode (the parameters of :func:`account_mode`; ``queue`` is the first of the
    graph's queues, GRAPH_QUEUES): every node of every committed graph acknowledged once (or still live
    or a dead letter: counted, and a failure: nothing should be stuck), every extra handler run matched
    to a fault (at least once), no child's first handler run before the acknowledgement of every one of
    its parents (archive acked_at, the database's clock, as the handler's log row), and at the end no
    blocked message and no dependency row left."""
    from bench.chaos_plan import GRAPH_QUEUES

    qs = list(GRAPH_QUEUES)
    short = MODES[mode]
    attempts: dict[str, tuple[str, float]] = {}  # key -> (status, time)
    parents_of: dict[str, list[str]] = {}
    statuses: Counter[str] = Counter()
    for path in sorted(logs.glob(f"{short}-*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            for _q, k, after in rec["nodes"]:
                attempts[k] = (rec["status"], rec["t_done"])
                parents_of[k] = [pk for _pq, pk in after]
            statuses[f"graph {rec['status']}"] += len(rec["keys"])
            if rec["status"] == "ok" and rec["outcomes"] != ["created"]:
                failures.append(f"{mode}: offer of {rec['keys'][0]}… was {rec['outcomes']}, not created")

    def keyset(query: str, *params: Any) -> Counter[str]:
        return Counter(r[0] for r in conn.execute(query, params).fetchall())

    offered_rows = keyset("SELECT key FROM chaos_offered WHERE queue = %s", queue)
    live = keyset("SELECT key FROM dq_messages WHERE queue = ANY (%s)", qs)
    dead = keyset("SELECT key FROM dq_messages WHERE queue = ANY (%s) AND dead_from IS NOT NULL",
                  [q + ".dead" for q in qs])
    acked_at: dict[str, float] = {}
    acked: Counter[str] = Counter()
    for k, t in conn.execute("SELECT key, extract(epoch FROM acked_at)::float8 FROM dq_archive "
                             "WHERE queue = ANY (%s) AND outcome = 'acked'", (qs,)).fetchall():
        acked[k] += 1
        acked_at[k] = float(t)
    other = keyset("SELECT key FROM dq_archive WHERE queue = ANY (%s) AND outcome <> 'acked'", qs)
    deliveries = [Delivery(*row) for row in conn.execute(
        "SELECT key, delivery_count, pid, extract(epoch FROM locked_until)::float8, extract(epoch FROM at)::float8 "
        "FROM chaos_deliveries WHERE queue = ANY (%s) ORDER BY key, at", (qs,)).fetchall()]
    first_run: dict[str, float] = {}
    for d in deliveries:
        first_run.setdefault(d.key, d.at)
    committed: set[str] = set()
    unknown = {"committed": 0, "not committed": 0}
    told_but_missing = []
    for k, (status, _) in attempts.items():
        if status == "ok":
            committed.add(k)
            if k not in offered_rows:
                told_but_missing.append(k)
        elif k in offered_rows:
            committed.add(k)
            unknown["committed"] += 1
        else:
            unknown["not committed"] += 1
    phantom = sorted((set(live) | set(dead) | set(acked) | set(other)) - committed)
    lost = sorted(k for k in committed if not acked[k] and not live[k] and not dead[k])
    acked_twice = sorted(k for k, n in acked.items() if n > 1)
    children = [k for k in committed if parents_of[k]]
    early, margins = [], []
    for k in children:
        if k not in first_run:
            continue
        last_parent = max((acked_at.get(p, float("inf")) for p in parents_of[k]), default=0.0)
        margin = first_run[k] - last_parent
        if margin < 0:
            early.append({"key": k, "first_run": first_run[k], "parents_acked": {p: acked_at.get(p)
                                                                                   for p in parents_of[k]}})
        else:
            margins.append(margin * 1000)
    blocked_at_end = value_of(conn, "SELECT count(*) FROM dq_messages WHERE parents_pending > 0")
    blocked_ready = value_of(
        conn, "SELECT count(*) FROM dq_messages c WHERE c.parents_pending > 0 AND NOT EXISTS (SELECT 1 FROM "
              "dq_dependencies d JOIN dq_messages p ON p.key = d.parent_key AND (p.queue = d.parent_queue "
              "OR p.dead_from = d.parent_queue) WHERE d.child_id = c.id)")
    dependency_rows = value_of(conn, "SELECT count(*) FROM dq_dependencies")
    by_key: dict[str, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_key[d.key].append(d)
    causes: Counter[str] = Counter()
    unexplained: list[dict[str, Any]] = []
    for k, ds in by_key.items():
        for prev, nxt in zip(ds, ds[1:], strict=False):
            cause, _lag = explain(prev, nxt, faults, errors_by_pid)
            causes[cause or "unexplained"] += 1
            if cause is None:
                unexplained.append({"key": k, "previous": asdict(prev), "next": asdict(nxt),
                                    "previous_process": names_by_pid.get(prev.pid)})
    margins.sort()

    def pct(p: float) -> float | None:
        return round(margins[min(len(margins) - 1, int(p * len(margins)))], 1) if margins else None

    t0, first_fault, last_fault_end, t_prod_end = phases
    ack_times = sorted(acked_at.values())
    offer_times = [t for k, (_, t) in attempts.items() if k in committed]

    def rate(times: list[float], a: float, b: float) -> float:
        return sum(1 for t in times if a <= t < b) / (b - a) if b > a else 0.0

    progress = {name: sum(1 for d in deliveries if d.pid == pid and d.at > last_fault_end)
                for name, pid in survivors.items()}
    stuck = [name for name, n in progress.items() if n == 0]
    r: dict[str, Any] = {
        "queue": ", ".join(qs), "attempted": len(attempts), "producer_statuses": dict(statuses),
        "unknown_resolved": unknown, "offered": len(committed),
        "graphs": len({k.rsplit("-", 1)[0] for k in committed}), "children": len(children),
        "acknowledged": sum(1 for k in committed if acked[k]), "live_at_end": sum(live.values()),
        "dead_letters": sum(dead.values()), "archived_otherwise": sum(other.values()),
        "lost": len(lost), "lost_keys": lost[:50], "told_committed_but_not_in_database": told_but_missing[:50],
        "phantom_keys": phantom[:50], "acknowledged_twice": acked_twice[:50], "deliveries": len(deliveries),
        "extra_deliveries": sum(causes.values()), "duplicates": sum(causes.values()),
        "extra_delivery_causes": dict(causes), "unexplained_duplicates": causes["unexplained"],
        "unexplained_examples": unexplained[:10],
        "delivered_before_parents_acked": len(early), "delivered_before_parents_acked_examples": early[:10],
        "release_after_last_parent_ack_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0), "n": len(margins)},
        "blocked_at_end": blocked_at_end, "blocked_with_every_parent_gone_at_end": blocked_ready,
        "dependency_rows_at_end": dependency_rows,
        "drained_s": None if drained_at is None else round(drained_at - t_prod_end, 2),
        "throughput": {phase: {"seconds": round(b - a, 1), "offered_per_s": round(rate(offer_times, a, b), 1),
                               "delivered_per_s": round(rate(ack_times, a, b), 1)}
                       for phase, a, b in (("before", t0, first_fault), ("during", first_fault, last_fault_end),
                                           ("after", last_fault_end, t_prod_end), ("whole run", t0, t_prod_end))},
        "first_ack_after_fault_s": [
            {"kind": f.kind, "at_s": round(f.t - t0, 2),
             "first_ack_s": next((round(t - max(f.t, f.t_end), 2) for t in ack_times if t > max(f.t, f.t_end)),
                                 None)}
            for f in faults if f.error is None and (f.kind == "restart" or (f.kind == "terminate"
                                                                             and f.target == "all"))],
        "deliveries_after_last_fault_by_consumer": progress,
        "recovered": drained_at is not None and not stuck and not crashed,
    }
    for name, bad in (("lost", lost), ("told committed but not in the database", told_but_missing),
                      ("phantom (in the database, never offered)", phantom), ("acknowledged twice", acked_twice),
                      ("delivered before every parent was acknowledged", early)):
        if bad:
            failures.append(f"{mode}: {len(bad)} keys {name}: {bad[:3]}")
    if causes["unexplained"]:
        failures.append(f"{mode}: {causes['unexplained']} duplicates not explained by a fault, e.g. {unexplained[:2]}")
    for name, n in (("blocked messages left", blocked_at_end), ("dependency rows left", dependency_rows),
                    ("nodes still live or dead letters", r["live_at_end"] + r["dead_letters"]),
                    ("nodes archived other than acknowledged", r["archived_otherwise"])):
        if n:
            failures.append(f"{mode}: {n} {name} at the end")
    if drained_at is None:
        failures.append(f"{mode}: {r['live_at_end']} messages still in the queues {drain_timeout:.0f} s "
                        "after the producers stopped")
    if stuck:
        failures.append(f"{mode}: consumers {stuck} handled nothing after the last fault")
    return r


def value_of(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])
