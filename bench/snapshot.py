"""Recovery after a held snapshot: claim latency and table growth while a transaction pins the xmin
horizon, and after it ends: ``make bench-snapshot``.

    python -m bench.snapshot [--quick] [--rate 200] [--batch 10] [--workers 16] [--clean 60] [--hold 120]
                             [--recovery 120] [--naptime SECONDS] [--port N] [--out PATH]

On a private server of its own (bench.lib.server: a new data directory with pg_cron, removed at the
end; the queue installed by ``pyqueue.migrate``), ``--workers`` idle ``pyqueue worker`` processes
(default flags, the handler ``bench.handlers:lateness``) consume one queue while one producer offers
``--rate`` messages per second (default 200), due at once, ``--batch`` at a time (default 10, one
``dq_offer_many`` every 50 ms: single offers from one client fell behind on a busy 2-core host).
Phases:

1. *clean* (``--clean``, default 60 s);
2. *held* (``--hold``, default 120 s): one session runs ``BEGIN ISOLATION LEVEL REPEATABLE READ;
   SELECT count(*) FROM dq_messages`` and stays idle in transaction: its snapshot holds the xmin
   horizon, so no row deleted or updated meanwhile can be removed, by autovacuum or anyone;
3. *recovery* (``--recovery``, default 120 s): the transaction commits; the rows it kept are
   removable from now on.

Every ``SAMPLE_S`` seconds the run samples ``dq_messages``: ``pg_relation_size`` (the heap),
``pg_indexes_size``, ``n_dead_tup``, and ``autovacuum_count`` and ``vacuum_count`` (the queue's
pg_cron vacuum job, where installed) from ``pg_stat_user_tables``; and the machine's CPU not used
by the run (``other CPU``, bench.lib.cpu). The claim latency of a message is its handler's start
minus its ``scheduled_at`` (the offer's time): from due to claimed and handed to the handler.
Both are reported per 10-s window (messages by their offer's time), with what a poll walks before
its first due message: the buffers and time of ``EXPLAIN (ANALYZE, BUFFERS)`` of dq_poll_many's
candidate scan without its row lock (the largest of the window's samples).

Verdicts (printed PASS/MISS, never failing the run), within the first minute after the release:

* *latency*: from at most 60 s after the release on, every window's claim p99 is within 2x the
  clean p99 (the clean phase's messages after its first window);
* *heap*: from at most 60 s after the release on, the heap of ``dq_messages`` no longer grows (no
  later sample more than 64 KiB above the size at that moment).

``--naptime`` sets the server's ``autovacuum_naptime`` for the run (``ALTER SYSTEM``; default: the
server's, 1 min), to measure what an operator's setting does. ``--quick``: 20 s clean, 30 s held,
70 s recovery (about 2.5 minutes in all). Writes the full report to
``bench/results/raw/snapshot-<UTC time>.json`` and its summary to ``bench/results/snapshot.json``
(``snapshot-quick.json``; with ``--out x.json``: x.json and x.summary.json).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench.handlers import LATENESS_FILE_ENV
from bench.lib.cpu import CpuSnapshot
from bench.lib.database import source_info
from bench.lib.report import arguments, console, machine_info, percentile, publish, rich_table, status, without
from bench.lib.server import PrivateServer
from bench.lib.sides import PAYLOAD, QUEUE, value
from bench.lib.workers import Workers, interrupt_on_sigterm

if TYPE_CHECKING:
    from rich.table import Table

DB = "dq_snapshot"
HOLDER = "snapshot-holder"  # application_name of the session holding the snapshot
WINDOW_S = 10.0
SAMPLE_S = 2.0
RECOVERY_BUDGET_S = 60.0  # the verdicts: back to normal within this long after the release
P99_FACTOR = 2.0  # claim p99 within this times the clean p99
HEAP_SLACK = 64 * 1024  # bytes of heap growth not counted as growing
DRAIN_TIMEOUT_S = 60.0
MIB = 1024 * 1024

Q_SAMPLE = """
SELECT pg_relation_size(relid), pg_indexes_size(relid), n_live_tup, n_dead_tup, autovacuum_count, vacuum_count
  FROM pg_stat_user_tables WHERE relid = 'dq_messages'::regclass
"""
# What a poll walks before its first due message: the candidate scan of dq_poll_many (sql/110_poll.sql)
# without its row lock, so the probe takes nothing from the workers.
Q_PROBE = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT d.id FROM dq_messages d
 WHERE d.queue = %s AND (d.message_group IS NULL OR d.dead_from IS NOT NULL) AND d.priority = 0
   AND d.scheduled_at <= now()
 ORDER BY d.scheduled_at LIMIT 1
"""
Q_SETTINGS = """
SELECT (SELECT setting FROM pg_settings WHERE name = 'autovacuum_naptime'),
       (SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'),
       (SELECT reloptions::text FROM pg_class WHERE oid = 'dq_messages'::regclass),
       (SELECT version())
"""
Q_JOBS = r"SELECT jobname, schedule, command FROM cron.job WHERE jobname LIKE 'dq-%' ORDER BY jobname"


@dataclass(frozen=True)
class Config:
    mode: str
    clean_s: float
    hold_s: float
    recovery_s: float
    rate: float = 200.0
    batch: int = 10  # messages per offer transaction (dq_offer_many)
    workers: int = 16
    naptime_s: float | None = None  # the server's autovacuum_naptime for the run; None: the server's


FULL = Config("full", clean_s=60.0, hold_s=120.0, recovery_s=120.0)
QUICK = Config("quick", clean_s=20.0, hold_s=30.0, recovery_s=70.0)


# --------------------------------------------------------------------------- the run


class Run:
    def __init__(self, cfg: Config, workdir: Path, port: int | None) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.server = PrivateServer(None, workdir, port, db=DB)
        self.stop = threading.Event()
        self.offered: list[tuple[str, float]] = []  # (key, time.time() of the offer)
        self.offer_errors: list[str] = []
        self.samples: list[dict[str, Any]] = []
        self.t0 = 0.0

    def produce(self, dsn: str, until: float) -> None:
        """``batch`` messages every batch/rate s, due at once, by one dq_offer_many (one transaction,
        one notification); a late batch is sent at once, so the rate holds on a busy host."""
        n, step = self.cfg.batch, self.cfg.batch / self.cfg.rate
        with psycopg.connect(dsn, autocommit=True, application_name="snapshot-producer") as conn:
            j = 0
            while not self.stop.is_set():
                at = self.t0 + j * step
                if at >= until:
                    break
                delay = at - time.time()
                if delay > 0:
                    self.stop.wait(delay)
                keys = [f"s{j * n + i:07d}" for i in range(n)]
                t = time.time()
                try:
                    conn.execute("SELECT count(*) FROM dq_offer_many(%s, %s, %s)", (QUEUE, keys, [PAYLOAD] * n),
                                 prepare=True)
                    self.offered += [(key, t) for key in keys]
                except psycopg.Error as exc:
                    self.offer_errors.append(f"{keys[0]}: {exc}"[:200])
                j += 1

    def sample(self, dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True, application_name="snapshot-sampler") as conn:
            conn.execute("SET enable_seqscan = off")  # as dq_poll_many
            while True:
                t = time.time()
                row = conn.execute(Q_SAMPLE).fetchone()
                assert row is not None
                plan = value(conn, Q_PROBE, (QUEUE,))[0]
                conn.execute("SELECT pg_stat_clear_snapshot()")
                self.samples.append({"t": t, "heap": row[0], "indexes": row[1], "live": row[2], "dead": row[3],
                                     "autovacuums": row[4], "vacuums": row[5],
                                 "probe_buffers": plan["Plan"].get("Shared Hit Blocks", 0)
                                 + plan["Plan"].get("Shared Read Blocks", 0),
                                 "probe_ms": plan["Execution Time"],
                                     "cpu": asdict(CpuSnapshot.take(os.getpid(), DB))})
                if self.stop.wait(max(SAMPLE_S - (time.time() - t), 0.05)):
                    return

    def hold(self, dsn: str, admin: psycopg.Connection[Any]) -> dict[str, Any]:
        """The held phase: a REPEATABLE READ transaction idle for hold_s after its first query."""
        with psycopg.connect(dsn, application_name=HOLDER) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            t_held = time.time()
            rows = value(conn, "SELECT count(*) FROM dq_messages")  # takes the snapshot
            xmin = value(admin, "SELECT backend_xmin::text FROM pg_stat_activity WHERE application_name = %s",
                         (HOLDER,))
            console().log(f"t={t_held - self.t0:5.1f} s  snapshot held (backend_xmin {xmin}, {rows} rows seen)")
            time.sleep(max(t_held + self.cfg.hold_s - time.time(), 0))
            conn.commit()
        t_released = time.time()
        console().log(f"t={t_released - self.t0:5.1f} s  snapshot released")
        return {"held_at_s": round(t_held - self.t0, 2), "released_at_s": round(t_released - self.t0, 2),
                "backend_xmin": xmin}

    def execute(self) -> dict[str, Any]:
        cfg = self.cfg
        from pyqueue.migrate import migrate

        console().log(f"[bold]bench.snapshot[/] ({cfg.mode}): private server on port {self.server.port}")
        dsn = self.server.up()
        migrate(dsn)
        files = self.workdir / "lateness"
        files.mkdir()
        with interrupt_on_sigterm(), psycopg.connect(dsn, autocommit=True) as admin:
            if cfg.naptime_s is not None:
                admin.execute(f"ALTER SYSTEM SET autovacuum_naptime = {float(cfg.naptime_s)!r}")
                admin.execute("SELECT pg_reload_conf()")
                time.sleep(0.5)
            naptime, pg_cron, reloptions, version = admin.execute(Q_SETTINGS).fetchone() or (None,) * 4
            jobs = admin.execute(Q_JOBS).fetchall() if pg_cron else []
            source = source_info(admin)
            workers = Workers(dsn, "bench.handlers:lateness", cfg.workers, (), self.workdir, "snapshot",
                              env={LATENESS_FILE_ENV: str(files / "worker{i}.tsv")})
            with workers:
                workers.wait_ready(admin)
                self.t0 = time.time()
                end = self.t0 + cfg.clean_s + cfg.hold_s + cfg.recovery_s
                threads = [threading.Thread(target=self.produce, args=(dsn, end), name="snapshot-producer"),
                           threading.Thread(target=self.sample, args=(dsn,), name="snapshot-sampler")]
                for th in threads:
                    th.start()
                try:
                    time.sleep(max(self.t0 + cfg.clean_s - time.time(), 0))
                    held = self.hold(dsn, admin)
                    time.sleep(max(end - time.time(), 0))
                    threads[0].join(timeout=30)
                    t_end = time.time()
                    left = -1
                    while time.time() < t_end + DRAIN_TIMEOUT_S:
                        left = value(admin, "SELECT count(*) FROM dq_messages WHERE queue = %s", (QUEUE,))
                        if left == 0:
                            break
                        time.sleep(0.2)
                finally:
                    self.stop.set()
                    for th in threads:
                        th.join(timeout=30)
                # A worker that exited before it was stopped is a failure of the run, not a figure.
                early = [(w.proc.pid, w.proc.returncode, w.text()[-1500:]) for w in workers.procs
                         if w.proc.poll() is not None]
                workers.stop()
            warnings = workers.warnings()[:20]
            for pid, code, tail in early:
                console().log(f"[red]worker {pid} exited early with {code}:[/]\n{tail}")
        lateness: dict[str, float] = {}
        deliveries = 0
        for path in sorted(files.glob("worker*.tsv")):
            for line in path.read_text().splitlines():
                key, ms = line.split("\t")
                lateness.setdefault(key, float(ms))  # the first delivery's
                deliveries += 1
        return {
            "config": asdict(cfg),
            "server": {"version": version, "autovacuum_naptime_s": float(naptime) if naptime else None,
                       "pg_cron": pg_cron, "dq_messages_reloptions": reloptions,
                       "jobs": [list(j) for j in jobs]},
            "source": source,
            "phases": {"clean_until_s": held["held_at_s"], **held,
                       "producers_stopped_s": round(t_end - self.t0, 2)},
            "offered": len(self.offered),
            "offer_errors": self.offer_errors[:20],
            "handled": len(lateness),
            "deliveries": deliveries,
            "lost": sum(1 for key, _ in self.offered if key not in lateness),
            "left_in_queue": left,
            "worker_warnings": warnings,
            "workers_exited_early": [{"pid": pid, "exit_code": code, "log_tail": tail} for pid, code, tail in early],
            "samples": [{**s, "t": round(s["t"] - self.t0, 2)} for s in self.samples],
            "latency": [(round(t - self.t0, 3), lateness[key]) for key, t in self.offered if key in lateness],
        }


# --------------------------------------------------------------------------- analysis


def windows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per WINDOW_S window from the start: messages offered in it and their claim latency, the last
    sample's sizes, dead tuples and vacuum counters in it, and the machine's other CPU."""
    ph, samples = report["phases"], report["samples"]
    end = ph["producers_stopped_s"]
    out: list[dict[str, Any]] = []
    prev = samples[0] if samples else None
    start = 0.0
    while start < end - 0.5:
        stop = min(start + WINDOW_S, end)
        lat = sorted(ms for t, ms in report["latency"] if start <= t < stop)
        ins = [s for s in samples if start <= s["t"] < stop]
        row: dict[str, Any] = {
            "start_s": start, "end_s": stop,
            "phase": "clean" if start < ph["held_at_s"] - 0.5 else "held" if start < ph["released_at_s"] - 0.5
            else "recovery",
            "messages": len(lat),
            "p50_ms": round(percentile(lat, 50), 2) if len(lat) >= 2 else None,
            "p99_ms": round(percentile(lat, 99), 2) if len(lat) >= 2 else None,
            "max_ms": round(lat[-1], 2) if lat else None,
        }
        if ins and prev is not None:
            last = ins[-1]
            busy = last["cpu"]["busy_s"] - prev["cpu"]["busy_s"]
            ours = (last["cpu"]["clients_s"] - prev["cpu"]["clients_s"]) + (last["cpu"]["server_s"]
                                                                            - prev["cpu"]["server_s"])
            elapsed = max(last["t"] - prev["t"], 1e-3)
            row.update({"heap_bytes": last["heap"], "index_bytes": last["indexes"],
                        "dead_tuples_max": max(s["dead"] for s in ins),
                        "probe_buffers_max": max(s.get("probe_buffers", 0) for s in ins),
                        "probe_ms_max": round(max(s.get("probe_ms", 0.0) for s in ins), 2),
                        "autovacuums": last["autovacuums"] - prev["autovacuums"],
                        "vacuums": last["vacuums"] - prev["vacuums"],
                        "other_cpu": round(max(busy - ours, 0.0) / (elapsed * (os.cpu_count() or 1)), 3)})
            prev = last
        out.append(row)
        start = stop
    return out


def verdicts(report: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The clean and held figures, and the two verdicts of the module docstring."""
    ph = report["phases"]
    release = ph["released_at_s"]
    clean = sorted(ms for t, ms in report["latency"] if WINDOW_S <= t < ph["held_at_s"])
    held = sorted(ms for t, ms in report["latency"] if ph["held_at_s"] <= t < release)
    clean_p99 = percentile(clean, 99) if len(clean) >= 2 else None
    # Latency: the end of the last window after the release whose p99 is over P99_FACTOR x clean.
    late = [r for r in rows if r["phase"] == "recovery" and r["p99_ms"] is not None and clean_p99 is not None
            and r["p99_ms"] > P99_FACTOR * clean_p99]
    p99_back_s = max((r["end_s"] - release for r in late), default=0.0)
    # Heap: the first sample after the release with no later sample more than HEAP_SLACK above it.
    after = [s for s in report["samples"] if s["t"] >= release and s["t"] <= ph["producers_stopped_s"]]
    heap_flat_s = None
    for i, s in enumerate(after):
        if all(x["heap"] <= s["heap"] + HEAP_SLACK for x in after[i + 1:]):
            heap_flat_s = s["t"] - release
            break
    at_release = after[0]["heap"] if after else None
    return {
        "clean_p50_ms": round(percentile(clean, 50), 2) if len(clean) >= 2 else None,
        "clean_p99_ms": round(clean_p99, 2) if clean_p99 is not None else None,
        "held_p50_ms": round(percentile(held, 50), 2) if len(held) >= 2 else None,
        "held_p99_ms": round(percentile(held, 99), 2) if len(held) >= 2 else None,
        "held_p99_over_clean": round(percentile(held, 99) / clean_p99, 1) if len(held) >= 2 and clean_p99 else None,
        "recovery_worst_window_p99_ms": max((r["p99_ms"] for r in rows if r["phase"] == "recovery"
                                             and r["p99_ms"] is not None), default=None),
        "p99_back_within_2x_after_s": round(p99_back_s, 1),
        "pass_latency": clean_p99 is not None and p99_back_s <= RECOVERY_BUDGET_S,
        "heap_bytes_before_hold": next((s["heap"] for s in reversed(report["samples"])
                                        if s["t"] < ph["held_at_s"]), None),
        "heap_bytes_at_release": at_release,
        "heap_bytes_max": max((s["heap"] for s in report["samples"]), default=None),
        "heap_bytes_end": after[-1]["heap"] if after else None,
        "heap_flat_after_s": round(heap_flat_s, 1) if heap_flat_s is not None else None,
        "pass_heap": heap_flat_s is not None and heap_flat_s <= RECOVERY_BUDGET_S,
    }


def tables(report: dict[str, Any]) -> list[Table]:
    v, cfg = report["verdicts"], report["config"]
    rows = []
    for r in report["windows"]:
        def mib(k: str, r: dict[str, Any] = r) -> str:
            return f"{r[k] / MIB:.2f}" if r.get(k) is not None else "-"

        rows.append([f"{r['start_s']:.0f}-{r['end_s']:.0f}", r["phase"], str(r["messages"]),
                     *(f"{r[k]:.1f}" if r[k] is not None else "-" for k in ("p50_ms", "p99_ms")),
                     mib("heap_bytes"), mib("index_bytes"), str(r.get("dead_tuples_max", "-")),
                     f"{r.get('probe_buffers_max', '-')} / {r.get('probe_ms_max', '-')}",
                     str(r.get("autovacuums", "-")), str(r.get("vacuums", "-")),
                     f"{r['other_cpu']:.0%}" if r.get("other_cpu") is not None else "-"])
    srv = report["server"]
    per_window = rich_table(
        f"dq_messages through a held snapshot: {cfg['rate']:g} msg/s, {cfg['workers']} workers, "
        f"{cfg['clean_s']:g} s clean, {cfg['hold_s']:g} s held, {cfg['recovery_s']:g} s recovery",
        ["window s", "phase", "messages", "claim p50 ms", "claim p99 ms", "heap MiB", "indexes MiB",
         "dead tuples", "poll walk buffers / ms", "autovacuums", "vacuums", "other CPU"], rows, left=("phase",),
        caption=f"autovacuum_naptime {srv['autovacuum_naptime_s']} s; pg_cron {srv['pg_cron'] or 'absent'}; "
                f"dq jobs: {', '.join(f'{j[0]} ({j[1]})' for j in srv['jobs']) or 'none'}; "
                f"lost {report['lost']}, offer errors {len(report['offer_errors'])}")
    mb = {k: (f"{v[k] / MIB:.2f}" if v.get(k) is not None else "-")
          for k in ("heap_bytes_before_hold", "heap_bytes_at_release", "heap_bytes_max", "heap_bytes_end")}
    verdict = rich_table("Recovery after the release (PASS/MISS, never failing the run)",
                         ["figure", "value", "target", "verdict"], [
        ["claim p50 / p99, clean (ms)", f"{v['clean_p50_ms']} / {v['clean_p99_ms']}", "", ""],
        ["claim p50 / p99, held (ms)", f"{v['held_p50_ms']} / {v['held_p99_ms']} ({v['held_p99_over_clean']}x)",
         "reported (nothing is removable while held)", ""],
        ["claim p99 back within 2x clean after", f"{v['p99_back_within_2x_after_s']:g} s",
         f"<= {RECOVERY_BUDGET_S:g} s", status(v["pass_latency"])],
        ["heap MiB: before hold, at release, max, end",
         f"{mb['heap_bytes_before_hold']}, {mb['heap_bytes_at_release']}, {mb['heap_bytes_max']}, "
         f"{mb['heap_bytes_end']}", "", ""],
        ["heap no longer growing after", f"{v['heap_flat_after_s']} s", f"<= {RECOVERY_BUDGET_S:g} s",
         status(v["pass_heap"])],
    ])
    return [per_window, verdict]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Everything but the samples and the per-message latencies (the windows and verdicts hold them)."""
    return without(report, "samples", "latency", "worker_warnings")


# --------------------------------------------------------------------------- command line


def run(cfg: Config, port: int | None, out: Path | None) -> dict[str, Any]:
    started, timestamp = time.perf_counter(), datetime.now(UTC)
    workdir = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    r = Run(cfg, workdir, port)
    machine = machine_info()
    try:
        raw = r.execute()
    except BaseException:
        console().log(f"[red]failed; logs kept in {workdir}[/]\n{r.server.log_tail()}")
        r.server.destroy()
        raise
    r.server.destroy()
    shutil.rmtree(workdir, ignore_errors=True)
    report = {"timestamp": timestamp.isoformat(timespec="seconds"), "mode": cfg.mode,
              "wall_time_s": round(time.perf_counter() - started, 1), "machine": machine, **raw}
    report["windows"] = windows(report)
    report["verdicts"] = verdicts(report, report["windows"])
    publish("snapshot", report, summary(report), tables(report), out, quick=cfg.mode == "quick", at=timestamp)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.snapshot", __doc__, dsn=False,
                       quick="development: 20 s clean, 30 s held, 70 s recovery")
    parser.add_argument("--rate", type=float, default=None, help="messages offered per second (default 200)")
    parser.add_argument("--batch", type=int, default=None,
                        help="messages per offer, one dq_offer_many every batch/rate s (default 10)")
    parser.add_argument("--workers", type=int, default=None, help="pyqueue worker processes (default 16)")
    parser.add_argument("--clean", type=float, default=None, help="seconds before the snapshot (default 60)")
    parser.add_argument("--hold", type=float, default=None, help="seconds the snapshot is held (default 120)")
    parser.add_argument("--recovery", type=float, default=None, help="seconds after the release (default 120)")
    parser.add_argument("--naptime", type=float, default=None,
                        help="the server's autovacuum_naptime for the run, seconds (default: the server's, 60)")
    parser.add_argument("--port", type=int, default=None, help="port of the private server (default: a free one)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    for name, field in (("rate", "rate"), ("batch", "batch"), ("workers", "workers"), ("clean", "clean_s"),
                        ("hold", "hold_s"), ("recovery", "recovery_s"), ("naptime", "naptime_s")):
        if getattr(args, name) is not None:
            cfg = replace(cfg, **{field: getattr(args, name)})
    if (cfg.clean_s < 2 * WINDOW_S or cfg.hold_s <= 0 or cfg.recovery_s < RECOVERY_BUDGET_S or cfg.rate <= 0
            or cfg.batch < 1):
        raise SystemExit(f"bench.snapshot: --clean must be at least {2 * WINDOW_S:g} s, --recovery at least "
                         f"{RECOVERY_BUDGET_S:g} s, --hold, --rate and --batch positive")
    try:
        run(cfg, args.port, args.out)
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
