"""Soak: steady load with periodic faults, then exact accounting and stability checks: ``make soak``.

    python -m bench.soak [--duration 600] [--rate 300] [--fault-every 30] [--port N] [--out PATH]

The harness of bench.chaos (its private server, producers, consumers, faults and accounting; see
that module) runs for ``--duration`` seconds (default 10 minutes) at a steady ``--rate`` per mode
(default 300 messages per second per queue, both modes side by side: below what the consumers
deliver on a small machine, so that a growing backlog is not mistaken for bloat). After a warm-up
(a tenth of the run, at most 60 s) a fault is injected every ``--fault-every`` seconds, in the
rotation pinned xmin, SIGKILL of a consumer, ``pg_terminate_backend``, immediate server restart,
SIGKILL, ``pg_terminate_backend``; the last tenth has no faults (recovery). Immediate restarts
happen only in the first half of the fault window, at least ``--restart-every`` seconds apart
(default 300, PostgreSQL's default ``checkpoint_timeout``); a restart that would come later or
sooner is a SIGKILL instead. An immediate restart is a crash: recovery discards the cumulative
statistics autovacuum schedules by and the index free-space map not yet written (deleted index
pages recorded as reusable are forgotten until the next VACUUM finds them again), and autovacuum
resumes only about one ``autovacuum_naptime`` later (see "Routine Vacuuming" and "The Free Space
Map" in the PostgreSQL manual). Until then every page split extends the indexes: each crash adds
a step (reported as ``dq_messages_index_growth_per_restart_mib``), and a server that crashes
again before autovacuum recovers lets the indexes grow without bound (crashes every 3 minutes grew
those of ``dq_messages`` by 3.3 MiB a minute; one a minute, 3 to 52 MiB in 15 minutes). So the
sizes are judged from two naptimes after the last restart, over the pins, SIGKILLs and
terminations that follow. The pinned
transaction lasts 20 s, or 2.5 fault intervals when that is shorter, so it always ends before the
next restart. Two consumers are never SIGKILLed (a sync and an async ``pyqueue worker``), so that
their memory can be followed over the whole run; they take the other faults like the rest.
``--fault-kinds`` leaves kinds out of the rotation (e.g. ``pin,kill,terminate``: no restarts).

Every ``--sample-every`` seconds (default: the run / 60, 1 to 10 s) the soak samples

* each table of the queue (``dq_*``) and of the harness (``chaos_*``): ``pg_stat_user_tables``
  (n_live_tup, n_dead_tup, autovacuum_count, last_autovacuum), ``pg_relation_size``,
  ``pg_indexes_size``, ``pg_total_relation_size``, and an exact ``count(*)`` of ``dq_messages``
  and ``dq_archive`` (the statistics restart at zero after each crash restart of the server, see
  "The Cumulative Statistics System" in the PostgreSQL manual, so row counts for the judgement are
  counted, not read from them), and the size of each index of the queue tables
  (``pg_stat_user_indexes``; reported, the tables' totals are judged);
* the resident set size (RSS) and CPU time of every consumer and producer process (psutil).

Verdict (besides bench.chaos's accounting: nothing lost, every duplicate explained and counted,
the exactly-once ledger exact, recovery). Samples are taken from the end of the warm-up (for
table sizes: from two naptimes after the last crash restart) to the producers' stop, and split
into thirds by time. Table sizes are judged only when that window is
at least 3 × ``autovacuum_naptime`` (3 minutes by default; autovacuum visits a database once per
naptime, so a shorter run says nothing about whether it keeps up: ``--duration 60`` reports the
sizes without a verdict):

* queue tables (every ``dq_*`` table but the archive): the heap (``pg_total_relation_size``
  minus ``pg_indexes_size``: table, TOAST, free space and visibility maps) and the indexes
  (``pg_indexes_size``) are judged each on its own: stable when the median size of the last third
  is at most ``1.5 ×`` that of the first third plus 1 MiB (a few pages of slack for tiny tables).
  A table or index that autovacuum does not keep in check grows through the whole run and fails
  this; the growth per minute (least squares over the window) is reported beside it.
* the archive (``dq_archive``, insert-only, kept without retention here so that every
  acknowledgement can be counted): grows by design; stable when the median bytes per archived
  row of the last third are at most ``1.1 ×`` those of the first third (no bloat per row).
* workers' memory: each consumer process that ran from the end of the warm-up to the producers'
  stop (at least the two never killed) with at least 6 samples: the median RSS of the last third
  at most ``1.1 ×`` that of the first third plus 4 MiB. At least one sync and one async
  ``pyqueue worker`` must be judged.

Prints tables, writes the full JSON report to ``bench/results/raw/soak-<UTC time>.json``, its summary
to ``bench/results/soak.json`` and a markdown summary to ``bench/results/soak.md`` (with ``--out
x.json``: to x.json, x.summary.json and x.summary.md instead, so that a trial run leaves the
recorded result alone); the exit status is non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench import chaos
from bench.chaos import tables
from bench.chaos_harness import Chaos, add_arguments, execute, settings_from
from bench.chaos_plan import PIN_S, Fault, Settings, Timeline
from bench.lib.report import OUT_HELP, console, publish, without

if TYPE_CHECKING:
    from rich.table import Table

MIB = 1024 * 1024
QUEUE_TABLE_GROWTH = 1.5  # last-third median total size at most this times the first third's ...
QUEUE_TABLE_SLACK = 1 * MIB  # ... plus this
ARCHIVE_ROW_GROWTH = 1.1  # bytes per archived row, last third against first third
RSS_GROWTH = 1.1  # a worker's median RSS, last third against first third ...
RSS_SLACK = 4 * MIB  # ... plus this
MIN_RSS_SAMPLES = 6
NAPTIMES = 3  # sizes are judged only over a window of at least this many autovacuum_naptime
ROTATION = ("pin", "kill", "terminate", "restart", "kill", "terminate")

Q_INDEXES = r"""
SELECT indexrelname, relname, pg_relation_size(indexrelid)
  FROM pg_stat_user_indexes
 WHERE schemaname = current_schema() AND relname LIKE 'dq\_%'
"""
Q_TABLES = r"""
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, extract(epoch FROM last_autovacuum)::float8,
       pg_relation_size(relid), pg_indexes_size(relid), pg_total_relation_size(relid)
  FROM pg_stat_user_tables
 WHERE schemaname = current_schema() AND (relname LIKE 'dq\_%' OR relname LIKE 'chaos\_%')
"""


@dataclass(frozen=True)
class SoakSettings(Settings):
    fault_every: float = 30.0
    sample_every: float = 10.0
    fault_kinds: tuple[str, ...] = ("pin", "kill", "terminate", "restart")
    restart_every: float = 300.0


def thirds(samples: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Medians of the values of the first and the last third (by time) of ``(t, value)`` samples;
    None with fewer than 3."""
    if len(samples) < 3:
        return None
    samples = sorted(samples)
    t0, t1 = samples[0][0], samples[-1][0]
    span = (t1 - t0) / 3
    first = [v for t, v in samples if t <= t0 + span]
    last = [v for t, v in samples if t >= t1 - span]
    return statistics.median(first), statistics.median(last)


class Soak(Chaos):
    program = "bench.soak"
    s: SoakSettings

    def __init__(self, s: SoakSettings, workdir: Path) -> None:
        super().__init__(s, workdir)
        self.samples: list[dict[str, Any]] = []  # {"t", "tables": {name: {...}}, "rows": {...}}
        self.procs: dict[int, dict[str, Any]] = {}  # pid -> {"name", "kind", "gen", "rss": [(t, bytes)], "cpu_s"}
        self.cpu: list[tuple[float, float]] = []  # (t, machine CPU busy %)
        self.sampling = threading.Event()
        self.sampler: threading.Thread | None = None
        self.naptime_s = 60.0

    # -- plan ------------------------------------------------------------------------------------
    def plan_timeline(self) -> Timeline:
        edge = min(60.0, 0.1 * self.s.duration)
        return Timeline(before_end=edge, window_end=self.s.duration - edge, end=self.s.duration)

    def keepers(self) -> set[str]:
        """Consumer slots never SIGKILLed: a sync and an async ``pyqueue worker``."""
        first, last = self.s.modes[0], self.s.modes[-1]
        short = {"exactly-once": "eo", "at-least-once": "alo"}
        return {f"{short[first]}/worker0", f"{short[last]}/worker-async1"}

    def plan(self) -> list[Fault]:
        tl, every = self.timeline, self.s.fault_every
        slots = [slot for slot, _, _ in self.slots()]
        killable = [slot for slot in slots if slot not in self.keepers()]
        faults: list[Fault] = []
        t, i = tl.before_end, 0
        last_restart = float("-inf")
        while t < tl.window_end:
            kind = ROTATION[i % len(ROTATION)]
            i += 1
            if kind == "pin" and t + self.s.pin_s > tl.window_end:
                kind = "kill"
            # Crash restarts: only in the first half of the fault window (the sizes are judged after
            # the last one, see judge), at least restart_every apart; otherwise a SIGKILL.
            late = t >= tl.before_end + (tl.window_end - tl.before_end) / 2
            if kind == "restart" and (late or t - last_restart < self.s.restart_every):
                if "kill" not in self.s.fault_kinds:
                    t += every
                    continue
                kind = "kill"
            if kind == "restart" and kind in self.s.fault_kinds:
                last_restart = t
            if kind not in self.s.fault_kinds:
                continue
            if kind == "kill":
                faults.append(Fault("kill", t, self.rng.choice(killable)))
            elif kind == "terminate":
                faults.append(Fault("terminate", t, self.rng.choice(["all", self.rng.choice(slots)])))
            else:
                faults.append(Fault(kind, t))
            t += every
        return faults

    # -- sampling ----------------------------------------------------------------------------------
    def started(self) -> None:
        import psutil

        with self._admin() as conn:
            row = conn.execute("SELECT setting::float8 FROM pg_settings WHERE name = 'autovacuum_naptime'").fetchone()
            assert row is not None
            self.naptime_s = float(row[0])

        psutil.cpu_percent()  # the first call only starts the measurement
        self.sampler = threading.Thread(target=self.sample_loop, name="soak-sampler", daemon=True)
        self.sampler.start()

    def sample_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self.sampling.is_set():
            t = time.time()
            self.sample_processes(t)
            try:
                if conn is None or conn.closed:
                    conn = self._admin()
                self.sample_tables(conn, t)
            except psycopg.Error:
                conn = None  # a restart or a cut: the next sample reconnects
            self.sampling.wait(max(self.s.sample_every - (time.time() - t), 0.1))
        if conn is not None:
            conn.close()

    def sample_tables(self, conn: psycopg.Connection[Any], t: float) -> None:
        rows = conn.execute(Q_TABLES).fetchall()
        counts = conn.execute("SELECT (SELECT count(*) FROM dq_messages), (SELECT count(*) FROM dq_archive)").fetchone()
        assert counts is not None
        indexes = conn.execute(Q_INDEXES).fetchall()
        self.samples.append({
            "indexes": {name: {"table": table, "bytes": size} for name, table, size in indexes},
            "t": t,
            "tables": {r[0]: {"n_live_tup": r[1], "n_dead_tup": r[2], "autovacuum_count": r[3],
                              "last_autovacuum": r[4], "table_bytes": r[5], "index_bytes": r[6],
                              "total_bytes": r[7]} for r in rows},
            "rows": {"dq_messages": counts[0], "dq_archive": counts[1]},
        })

    def sample_processes(self, t: float) -> None:
        import psutil

        self.cpu.append((t, psutil.cpu_percent()))
        with self.lock:
            procs = [p for p in self.all_procs if p.ended is None and p.popen is not None and p.popen.poll() is None]
        for p in procs:
            try:
                ps = psutil.Process(p.pid)
                rss, cpu = ps.memory_info().rss, ps.cpu_times()
            except psutil.Error:
                continue
            rec = self.procs.setdefault(p.pid, {"name": p.name, "kind": p.kind, "gen": p.gen, "rss": [], "cpu_s": 0.0})
            rec["rss"].append((t, rss))
            rec["cpu_s"] = cpu.user + cpu.system

    # -- verdict -----------------------------------------------------------------------------------
    def account(self, t_prod_end: float, plan: list[Fault]) -> dict[str, Any]:
        self.sampling.set()
        if self.sampler is not None:
            self.sampler.join(timeout=30)
        report = super().account(t_prod_end, plan)
        report["soak"] = self.judge(t_prod_end, report["failures"])
        report["passed"] = not report["failures"]
        return report

    def judge(self, t_prod_end: float, failures: list[str]) -> dict[str, Any]:
        t0 = self.t0
        lo, hi = t0 + self.timeline.before_end, t_prod_end
        # Sizes are judged from two autovacuum naptimes after the last crash restart: a crash drops
        # the statistics autovacuum schedules by and the index free-space map not yet checkpointed,
        # so until autovacuum has run again the indexes grow by what the traffic splits meanwhile (a
        # step per crash, reported below); after that a table autovacuum keeps in check is flat.
        restarts = sorted(f.t_end for f in self.faults if f.kind == "restart" and f.error is None and f.t_end)
        lo_sizes = max(lo, restarts[-1] + 2 * self.naptime_s) if restarts else lo
        steady = [x for x in self.samples if lo_sizes <= x["t"] <= hi]
        names = sorted({name for x in self.samples for name in x["tables"]})
        # Autovacuum visits the database once per autovacuum_naptime: over a shorter window it may not
        # have run at all, and the sizes say nothing about whether it keeps up.
        judge_sizes = hi - lo_sizes >= NAPTIMES * self.naptime_s
        steps = []
        for r in restarts:
            before = [x["tables"]["dq_messages"]["index_bytes"] for x in self.samples
                      if x["t"] < r and "dq_messages" in x["tables"]]
            after = [x["tables"]["dq_messages"]["index_bytes"] for x in self.samples
                     if r <= x["t"] <= r + 2 * self.naptime_s and "dq_messages" in x["tables"]]
            if before and after:
                steps.append(round((max(after) - before[-1]) / MIB, 2))
        judged: dict[str, Any] = {}
        for name in names:
            series = [(x["t"], x["tables"][name]) for x in steady if name in x["tables"]]
            av_seen = {v["last_autovacuum"] for _, v in series if v["last_autovacuum"] is not None}
            row: dict[str, Any] = {
                "samples": len(series),
                "max_dead_tuples": max((v["n_dead_tup"] for _, v in series), default=None),
                "autovacuums_seen": len(av_seen),
                "first": series[0][1] if series else None,
                "last": series[-1][1] if series else None,
            }
            m = thirds([(t, v["total_bytes"]) for t, v in series])
            if m is not None:
                row["total_bytes_median_first_third"], row["total_bytes_median_last_third"] = m
            if name == "dq_archive":
                per_row = [(x["t"], x["tables"][name]["total_bytes"] / x["rows"]["dq_archive"])
                           for x in steady if name in x["tables"] and x["rows"]["dq_archive"] > 0]
                pm = thirds(per_row)
                if pm is not None:
                    row["bytes_per_row_first_third"], row["bytes_per_row_last_third"] = pm
                    row["criterion"] = f"bytes per row, last third <= {ARCHIVE_ROW_GROWTH:g} x first third"
                    row["stable"] = pm[1] <= ARCHIVE_ROW_GROWTH * pm[0]
            elif name.startswith("dq_") and m is not None:
                # The table (heap, TOAST, free space and visibility maps) and its indexes, each on its own:
                # a stable heap must not hide growing indexes.
                parts = {"heap": [(t, v["total_bytes"] - v["index_bytes"]) for t, v in series],
                         "index": [(t, v["index_bytes"]) for t, v in series]}
                row["criterion"] = (f"heap and indexes each: last third <= {QUEUE_TABLE_GROWTH:g} x first third + "
                                    f"{QUEUE_TABLE_SLACK // MIB} MiB")
                row["stable"] = True
                for part, values in parts.items():
                    pm = thirds(values)
                    assert pm is not None
                    row[f"{part}_bytes_median_first_third"], row[f"{part}_bytes_median_last_third"] = pm
                    row[f"{part}_growth_mib_per_min"] = round(
                        statistics.linear_regression([t for t, _ in values], [v for _, v in values]).slope * 60 / MIB,
                        3)
                    row["stable"] = row["stable"] and pm[1] <= QUEUE_TABLE_GROWTH * pm[0] + QUEUE_TABLE_SLACK
            if not judge_sizes and "stable" in row:
                row["criterion"] = (f"not judged: window {hi - lo:.0f} s, shorter than {NAPTIMES} x "
                                    f"autovacuum_naptime ({self.naptime_s:g} s)")
                del row["stable"]
            elif name.startswith("dq_"):
                if "stable" not in row:
                    failures.append(f"soak: too few samples of {name} to judge its size")
                elif not row["stable"]:
                    failures.append(f"soak: {name} grew: {row['criterion']} does not hold ("
                                    f"{size_text(row)})")
            judged[name] = row
        index_names = sorted({name for x in steady for name in x["indexes"]})
        indexes: dict[str, Any] = {}
        for name in index_names:
            seen = [x for x in steady if name in x["indexes"]]
            im = thirds([(x["t"], x["indexes"][name]["bytes"]) for x in seen])
            indexes[name] = {"table": seen[0]["indexes"][name]["table"],
                             "bytes_median_first_third": im[0] if im else None,
                             "bytes_median_last_third": im[1] if im else None}
        rows_series = {k: [(round(x["t"] - t0, 1), x["rows"][k]) for x in self.samples]
                       for k in ("dq_messages", "dq_archive")}
        # Workers' memory.
        memory: dict[str, Any] = {}
        kinds_judged: set[str] = set()
        for pid, rec in sorted(self.procs.items(), key=lambda kv: kv[1]["name"]):
            if rec["kind"] == "producer":
                continue
            rss = [(t, v) for t, v in rec["rss"] if lo <= t <= hi]
            whole = bool(rss) and rss[0][0] <= lo + 2 * self.s.sample_every and rss[-1][0] >= hi - 2 * \
                self.s.sample_every
            m = thirds(rss)
            entry: dict[str, Any] = {"pid": pid, "kind": rec["kind"], "gen": rec["gen"], "samples": len(rss),
                                     "whole_run": whole}
            if m is not None:
                entry["rss_mib_first_third"], entry["rss_mib_last_third"] = round(m[0] / MIB, 1), round(m[1] / MIB, 1)
            if whole and m is not None and len(rss) >= MIN_RSS_SAMPLES:
                entry["stable"] = m[1] <= RSS_GROWTH * m[0] + RSS_SLACK
                kinds_judged.add(rec["kind"])
                if not entry["stable"]:
                    failures.append(f"soak: {rec['name']} (pid {pid}) memory grew from {m[0] / MIB:.1f} to "
                                    f"{m[1] / MIB:.1f} MiB (median RSS, first and last third)")
            memory[f"{rec['name']} g{rec['gen']}"] = entry
        for kind in ("worker", "worker-async"):
            if kind not in kinds_judged:
                failures.append(f"soak: no {kind} consumer ran through the whole run with {MIN_RSS_SAMPLES} samples "
                                "to judge its memory")
        cpu_by_kind: dict[str, float] = {}
        for rec in self.procs.values():
            cpu_by_kind[rec["kind"]] = round(cpu_by_kind.get(rec["kind"], 0.0) + rec["cpu_s"], 1)
        busy = [c for t, c in self.cpu if lo <= t <= hi]
        return {
            "criteria": {
                "window": "samples from the end of the warm-up (table sizes: from two autovacuum_naptime after the "
                          "last crash restart) to the producers' stop, split in thirds by time; sizes judged only "
                          f"when that window is at least {NAPTIMES} x autovacuum_naptime",
                "queue_tables": f"heap (total - indexes) and indexes (pg_indexes_size) each: median size of the "
                                f"last third <= {QUEUE_TABLE_GROWTH:g} x the first third's + "
                                f"{QUEUE_TABLE_SLACK // MIB} MiB",
                "archive": f"median bytes per archived row of the last third <= {ARCHIVE_ROW_GROWTH:g} x the first "
                           "third's (the archive grows by design: no retention, every acknowledgement counted)",
                "worker_memory": f"each consumer process that ran through the window, >= {MIN_RSS_SAMPLES} samples: "
                                 f"median RSS of the last third <= {RSS_GROWTH:g} x the first third's + "
                                 f"{RSS_SLACK // MIB} MiB; at least one sync and one async worker judged",
            },
            "warmup_s": round(self.timeline.before_end, 1),
            "sizes_judged_from_s": round(lo_sizes - t0, 1),
            "dq_messages_index_growth_per_restart_mib": steps,
            "sample_every_s": self.s.sample_every,
            "samples": len(self.samples),
            "tables": judged,
            "rows_over_time": rows_series,
            "sizes_over_time": {
                "columns": ["t_s", "total_bytes", "index_bytes", "n_dead_tup"],
                **{name: [(round(x["t"] - t0, 1), x["tables"][name]["total_bytes"], x["tables"][name]["index_bytes"],
                           x["tables"][name]["n_dead_tup"]) for x in self.samples if name in x["tables"]]
                   for name in names}},
            "indexes": indexes,
            "worker_memory": memory,
            "rss_over_time_mib": {f"{rec['name']} g{rec['gen']}": [(round(t - t0, 1), round(v / MIB, 1))
                                                                    for t, v in rec["rss"]]
                                  for rec in self.procs.values() if rec["kind"] != "producer"},
            "cpu_seconds_by_process_kind": cpu_by_kind,
            "machine_cpu_busy_percent_median": round(statistics.median(busy), 1) if busy else None,
        }


# --------------------------------------------------------------------------- report


def size_text(row: dict[str, Any]) -> str:
    """A judged table's size, first → last third: bytes per row (the archive) or MiB."""
    if "bytes_per_row_first_third" in row:
        return f"{row['bytes_per_row_first_third']:.0f} → {row['bytes_per_row_last_third']:.0f} bytes/row"
    if "heap_bytes_median_first_third" in row:
        return (f"heap {row['heap_bytes_median_first_third'] / MIB:.2f} → "
                f"{row['heap_bytes_median_last_third'] / MIB:.2f}, indexes "
                f"{row['index_bytes_median_first_third'] / MIB:.2f} → "
                f"{row['index_bytes_median_last_third'] / MIB:.2f} MiB")
    if "total_bytes_median_first_third" in row:
        return (f"{row['total_bytes_median_first_third'] / MIB:.2f} → "
                f"{row['total_bytes_median_last_third'] / MIB:.2f} MiB")
    return "-"


def soak_tables(report: dict[str, Any]) -> list[Table]:
    from rich.table import Table

    soak = report["soak"]
    sizes = Table(title=f"Tables over the soak ({soak['samples']} samples every {soak['sample_every_s']:g} s, "
                        f"sizes judged from {soak.get('sizes_judged_from_s', soak['warmup_s']):g} s: "
                        "two naptimes after the last crash restart)")
    for col in ("table", "rows first → last", "dead tuples max", "autovacuums", "size, first → last third",
                "criterion", "verdict"):
        sizes.add_column(col, justify="left" if col in ("table", "criterion") else "right")
    for name, row in soak["tables"].items():
        first, last = row["first"] or {}, row["last"] or {}
        verdict = {True: "[green]stable[/]", False: "[red]GREW[/]"}.get(row.get("stable"), "-")
        sizes.add_row(name, f"{first.get('n_live_tup', '-')} → {last.get('n_live_tup', '-')}",
                      str(row["max_dead_tuples"]), str(row["autovacuums_seen"]), size_text(row),
                      row.get("criterion", "reported, not judged"), verdict)
    sizes.caption = ("rows: pg_stat_user_tables.n_live_tup (reset by each crash restart); autovacuums: distinct "
                     "last_autovacuum times seen; dq_messages indexes grew by "
                     f"{soak.get('dq_messages_index_growth_per_restart_mib', [])} MiB at the crash restarts")
    idx = Table(title="Indexes of the queue tables (median size of the first and last third, MiB)")
    for col in ("index", "table", "first third", "last third"):
        idx.add_column(col, justify="left" if col in ("index", "table") else "right")
    for name, e in soak["indexes"].items():
        if e["bytes_median_first_third"] is not None:
            idx.add_row(name, e["table"], f"{e['bytes_median_first_third'] / MIB:.2f}",
                        f"{e['bytes_median_last_third'] / MIB:.2f}")
    memory = Table(title="Consumer processes' memory (RSS, median of the first and last third)")
    for col in ("process", "samples", "whole run", "first third MiB", "last third MiB", "verdict"):
        memory.add_column(col, justify="left" if col == "process" else "right")
    for name, e in soak["worker_memory"].items():
        if e["samples"] == 0:
            continue
        verdict = {True: "[green]no growth[/]", False: "[red]GREW[/]"}.get(e.get("stable"), "not judged")
        memory.add_row(name, str(e["samples"]), "yes" if e["whole_run"] else "no",
                       str(e.get("rss_mib_first_third", "-")), str(e.get("rss_mib_last_third", "-")), verdict)
    memory.caption = (f"CPU seconds by process kind: {soak['cpu_seconds_by_process_kind']}; machine CPU busy "
                      f"(median): {soak['machine_cpu_busy_percent_median']} %")
    return [sizes, idx, memory]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """bench.chaos' summary, and of the soak's own figures what its tables and markdown show: without
    the samples over time."""
    return {**chaos.summary(report),
            "soak": without(report["soak"], "rows_over_time", "sizes_over_time", "rss_over_time_mib")}


def markdown(report: dict[str, Any]) -> str:
    """A summary to paste into docs/performance.md."""
    s, soak = report["settings"], report["soak"]
    lines = [
        f"Soak ({report['timestamp']}): `python -m bench.soak --duration {s['duration']:g} --rate {s['rate']:g}` "
        f"(both modes, {s['rate']:g} messages offered per second per mode, a fault every {s['fault_every']:g} s "
        f"after a {soak['warmup_s']:g} s warm-up, immediate restarts at least {s.get('restart_every', 0):g} s apart; "
        f"{report['machine'].get('cpu_count')} CPUs, "
        f"{report['server']['version'].split(',')[0]}). Result: **{'PASS' if report['passed'] else 'FAIL'}**.",
        "",
        "| | " + " | ".join(report["modes"]) + " |",
        "|---|" + "---:|" * len(report["modes"]),
    ]

    def row(label: str, fn: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(str(fn(m)) for m in report["modes"].values()) + " |")

    row("offered (committed)", lambda m: f"{m['offered']:,}")
    row("acknowledged", lambda m: f"{m['acknowledged']:,}")
    row("lost", lambda m: m["lost"])
    row("duplicates (all explained by faults)", lambda m: m["duplicates"])
    row("ledger exactly once", lambda m: {True: "yes", False: "NO"}.get(m.get("ledger_exactly_once"), "-"))
    for phase in ("whole run", "during"):
        row(f"offered/s, delivered/s ({phase if phase == 'whole run' else 'during faults'})",
            lambda m, ph=phase: f"{m['throughput'][ph]['offered_per_s']:,.0f}, "
                                f"{m['throughput'][ph]['delivered_per_s']:,.0f}")
    lines += ["", "Faults: " + ", ".join(f"{k} {v}" for k, v in report["faults_injected"].items()) + ". "
              f"Sizes judged from {soak.get('sizes_judged_from_s', soak['warmup_s']):g} s (two autovacuum naptimes "
              "after the last crash restart); the indexes of dq_messages grew by "
              f"{soak.get('dq_messages_index_growth_per_restart_mib', [])} MiB at the crash restarts.", "",
              "| table | size, first → last third | growth MiB/min (heap, indexes) | dead tuples max | autovacuums "
              "| verdict |",
              "|---|---:|---:|---:|---:|---|"]
    for name, r in soak["tables"].items():
        if not name.startswith("dq_"):
            continue
        growth = (f"{r['heap_growth_mib_per_min']:+.2f}, {r['index_growth_mib_per_min']:+.2f}"
                  if "heap_growth_mib_per_min" in r else "-")
        lines.append(f"| {name} | {size_text(r)} | {growth} | {r['max_dead_tuples']} | {r['autovacuums_seen']} | "
                     f"{ {True: 'stable', False: 'GREW'}.get(r.get('stable'), 'not judged (short run)') } |")
    lines += ["", "| index of dq_messages | size, first → last third (MiB) |", "|---|---:|"]
    for name, e in soak["indexes"].items():
        if e["table"] == "dq_messages" and e["bytes_median_first_third"] is not None:
            lines.append(f"| {name} | {e['bytes_median_first_third'] / MIB:.2f} → "
                         f"{e['bytes_median_last_third'] / MIB:.2f} |")
    lines += ["", "| worker (ran through the run) | RSS first → last third (MiB) | verdict |", "|---|---:|---|"]
    for name, e in soak["worker_memory"].items():
        if "stable" in e:
            lines.append(f"| {name} ({e['kind']}) | {e['rss_mib_first_third']} → {e['rss_mib_last_third']} | "
                         f"{'no growth' if e['stable'] else 'GREW'} |")
    lines += ["", "Criteria: " + "; ".join(f"{k}: {v}" for k, v in soak["criteria"].items()) + "."]
    if report["failures"]:
        lines += ["", "Failures: " + "; ".join(report["failures"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    add_arguments(parser, 600.0)
    parser.set_defaults(rate=300.0)
    for action in parser._actions:
        if "--out" in action.option_strings:
            action.help = OUT_HELP + " (and the markdown summary, x.summary.md)"
    parser.add_argument("--fault-every", type=float, default=30.0,
                        help="seconds between faults (default 30; shorter runs: a sixth of the fault window)")
    parser.add_argument("--fault-kinds", default="pin,kill,terminate,restart",
                        help="comma-separated kinds of fault to inject (default all: pin,kill,terminate,restart)")
    parser.add_argument("--restart-every", type=float, default=300.0,
                        help="at least this many seconds between immediate server restarts (default 300, "
                             "PostgreSQL's default checkpoint_timeout); a restart due sooner is a SIGKILL instead")
    parser.add_argument("--sample-every", type=float, default=None,
                        help="seconds between samples of tables and processes (default: the run / 60, 1 to 10 s)")
    args = parser.parse_args(argv)
    base = settings_from(args)
    if args.duration < 40:
        raise SystemExit("bench.soak: --duration must be at least 40 s")
    window = args.duration - 2 * min(60.0, 0.1 * args.duration)
    every = min(args.fault_every, window / len(ROTATION))
    sample = args.sample_every if args.sample_every is not None else min(max(args.duration / 60, 1.0), 10.0)
    kinds = tuple(k.strip() for k in args.fault_kinds.split(",") if k.strip())
    if not kinds or set(kinds) - set(ROTATION):
        raise SystemExit(f"bench.soak: --fault-kinds {args.fault_kinds!r}: give some of pin,kill,terminate,restart")
    s = SoakSettings(**{**asdict(base), "pin_s": min(PIN_S, 2.5 * every), "fault_every": round(every, 2),
                        "sample_every": sample, "fault_kinds": kinds, "restart_every": args.restart_every})
    try:
        report = execute(Soak, s)
    except KeyboardInterrupt:
        return 130
    _, short = publish("soak", report, summary(report), [*tables(report), *soak_tables(report)], args.out)
    md = short.with_suffix(".md")
    md.write_text(markdown(report))
    console().log(f"markdown summary written to {md}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    from bench.soak import main as _main

    raise SystemExit(_main())
