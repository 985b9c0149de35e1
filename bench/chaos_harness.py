"""The harness of a chaos run (bench.chaos, and bench.soak, which extends it): a private server
(bench.lib.server), producer and consumer processes, faults injected into them at the planned
moments (bench.chaos_plan), killed consumers started again, the queues drained, every process
stopped, then the accounting (bench.chaos_accounting) assembled into the run's report. The
command-line options bench.chaos and bench.soak share are here too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from bench.chaos_accounting import account_graph, account_mode
from bench.chaos_clients import DSN_ENV, SCHEMA
from bench.chaos_plan import BOTH, GRAPH_QUEUES, MODES, Fault, Settings, Timeline, plan_faults
from bench.lib.database import source_info
from bench.lib.report import OUT_HELP, PROJECT, console, machine_info
from bench.lib.server import PrivateServer
from bench.lib.sides import value
from bench.lib.workers import die_with_parent, interrupt_on_sigterm

RESTART_DELAY_S = 0.5  # a killed consumer is started again this long after the kill
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
SINGLE_RATE_PER_PROCESS = 50.0  # single offers per second one producer process is asked for, at most
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # asctime of the workers' log lines


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """One process of the run (a consumer generation or a producer)."""

    name: str  # e.g. eo/worker0
    mode: str
    kind: str  # worker | worker-async | tx | producer
    gen: int
    cmd: list[str]
    app: str  # application_name of its connections
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    pid: int = 0
    started: float = 0.0
    ended: float | None = None
    exit_code: int | None = None
    killed_at: float | None = None  # SIGKILLed by the harness

    def start(self, env: dict[str, str]) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(self.cmd, cwd=PROJECT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=die_with_parent)
        self.pid = self.popen.pid
        self.started = time.time()

    def poll(self) -> int | None:
        assert self.popen is not None
        code = self.popen.poll()
        if code is not None and self.ended is None:
            self.ended, self.exit_code = time.time(), code
        return code

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def db_errors(self) -> list[float]:
        """Times of the WARNING lines (failed polls, acknowledgements, extends, handlers) in its log."""
        times = []
        for line in self.text().splitlines():
            if " WARNING " in line:
                try:
                    times.append(datetime.strptime(line[:23], LOG_TIME).timestamp())
                except ValueError:
                    continue
        return times

    def summary(self, t0: float) -> dict[str, Any]:
        return {"name": self.name, "gen": self.gen, "pid": self.pid, "kind": self.kind,
                "started_s": round(self.started - t0, 2),
                "ended_s": None if self.ended is None else round(self.ended - t0, 2), "exit_code": self.exit_code,
                "killed": self.killed_at is not None}


class Chaos:
    program = "bench.chaos"  # the program running this harness: its log lines, its work folder's name

    def __init__(self, s: Settings, workdir: Path) -> None:
        self.s = s
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir()
        self.rng = random.Random(s.seed)
        self.server = PrivateServer(s.pgdata, workdir, s.port)
        self.dsn = ""
        self.lock = threading.Lock()
        self.consumers: dict[str, Proc] = {}  # slot -> current generation
        self.all_procs: list[Proc] = []
        self.producers: list[Proc] = []
        self.crashed: list[Proc] = []
        self.restart_at: dict[str, float] = {}
        self.faults: list[Fault] = []
        self.stop = threading.Event()
        self.t0 = 0.0
        self.timeline = self.plan_timeline()
        self.drained_at: dict[str, float | None] = {}

    # -- what a subclass (bench.soak) changes ---------------------------------------------------
    def plan_timeline(self) -> Timeline:
        return Timeline.plan(self.s)

    def plan(self) -> list[Fault]:
        """The faults of the run, at planned times (seconds from t0)."""
        return plan_faults(self.s, self.timeline, [slot for slot, _, _ in self.slots()], self.rng)

    def started(self) -> None:
        """Called once the producers run (``t0`` is set)."""

    # -- setup ---------------------------------------------------------------------------------
    def queue(self, mode: str) -> str:
        return GRAPH_QUEUES[0] if mode == "graph" else f"chaos-{MODES[mode]}"

    def queues(self, mode: str) -> tuple[str, ...]:
        return GRAPH_QUEUES if mode == "graph" else (self.queue(mode),)

    def app_dsn(self, app: str) -> str:
        return make_conninfo(self.dsn, application_name=app)

    def install(self) -> None:
        from pyqueue.migrate import migrate

        migrate(self.dsn)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            for mode in self.s.modes:
                for q in self.queues(mode):
                    conn.execute("SELECT dq_configure_queue(%s, max_deliveries => 20, dead_letter_queue => %s, "
                                 "archive => true)", (q, q + ".dead"))

    def slots(self) -> list[tuple[str, str, str]]:
        """(slot name, mode, kind) of every consumer."""
        kinds = {"exactly-once": ("worker", "worker-async", "tx"),
                 "at-least-once": ("worker", "worker-async", "worker"),
                 "graph": ("worker", "worker-async")}  # one consumer per graph queue (consumer_cmd)
        return [(f"{MODES[m]}/{k}{i}", m, k) for m in self.s.modes for i, k in enumerate(kinds[m])]

    def consumer_cmd(self, mode: str, kind: str, dsn: str) -> list[str]:
        q = self.queue(mode) if mode != "graph" else GRAPH_QUEUES[kind == "worker-async"]
        if kind == "tx":
            return [sys.executable, "-m", "bench.chaos_clients", "consume-tx", "--queue", q,
                    "--lock-timeout", str(self.s.lock_timeout), "--batch", str(self.s.batch)]
        handler = ({"exactly-once": "ledger", "at-least-once": "record", "graph": "record"}[mode]
                   + ("_async" if kind == "worker-async" else ""))
        return [sys.executable, "-m", "pyqueue", "worker", "--dsn", dsn, "--queue", q,
                "--concurrency", str(self.s.concurrency), "--lock-timeout", str(self.s.lock_timeout),
                "--idle-check", str(self.s.idle_check), "--shutdown-grace", "10",
                *(["--async"] if kind == "worker-async" else []), f"bench.chaos_clients:{handler}"]

    def start_consumer(self, slot: str, mode: str, kind: str, gen: int) -> Proc:
        app = f"chaos-consumer-{slot.replace('/', '-')}-g{gen}"
        dsn = self.app_dsn(app)
        p = Proc(slot, mode, kind, gen, self.consumer_cmd(mode, kind, dsn), app,
                 self.logs / f"{slot.replace('/', '-')}-g{gen}.log")
        p.start(dict(os.environ, **{DSN_ENV: dsn, "CHAOS_WORK_MS": str(self.s.work_ms)}))
        with self.lock:
            self.consumers[slot] = p
            self.all_procs.append(p)
        return p

    def wait_ready(self, procs: list[Proc]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all("ready" in p.text() for p in procs):
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.exit_code} at start:\n{p.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("consumers not ready after 60 s")
            time.sleep(0.1)

    def producers_plan(self) -> list[tuple[str, float]]:
        """(kind, messages per second) of each producer process of a mode: one outbox producer
        (batches of ``batch`` by ``offer_many`` in a transaction) and as many single-offer
        producers as ``SINGLE_RATE_PER_PROCESS`` needs for their share."""
        single = self.s.rate * self.s.single_share
        n = max(1, math.ceil(single / SINGLE_RATE_PER_PROCESS)) if single > 0 else 0
        plan = [("outbox", self.s.rate - single)] if single < self.s.rate else []
        return plan + [("plain", single / n)] * n

    def start_producers(self) -> None:
        until = self.t0 + self.s.duration
        for mode in self.s.modes:
            plan = [("graph", self.s.graph_rate)] if mode == "graph" else self.producers_plan()
            for i, (kind, rate) in enumerate(plan):
                prefix = f"{MODES[mode]}-{kind}{i}"
                app = f"chaos-producer-{prefix}"
                p = Proc(f"{MODES[mode]}/producer-{kind}{i}", mode, "producer", 0,
                         [sys.executable, "-m", "bench.chaos_clients", "produce", "--queue", self.queue(mode),
                          "--kind", kind, "--prefix", prefix, "--rate", str(rate), "--batch", str(self.s.batch),
                          "--until", str(until), "--records", str(self.logs / f"{prefix}.jsonl"),
                          *(["--queue2", GRAPH_QUEUES[1]] if kind == "graph" else []),
                          "--seed", str(self.s.seed * 10 + i)],
                         app, self.logs / f"producer-{prefix}.log")
                p.start(dict(os.environ, **{DSN_ENV: self.app_dsn(app)}))
                self.producers.append(p)
                self.all_procs.append(p)

    # -- faults ----------------------------------------------------------------------------------
    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.app_dsn("chaos-harness"), autocommit=True, connect_timeout=5)

    def inject(self, f: Fault) -> None:
        f.t = time.time()
        if f.kind == "kill":
            with self.lock:
                p = self.consumers[f.target]
                if p.poll() is not None:
                    f.error = "no process in the slot (not yet restarted)"
                    return
                p.killed_at = f.t
                os.kill(p.pid, signal.SIGKILL)
                f.victims = [p.pid]
                self.restart_at[f.target] = f.t + RESTART_DELAY_S
        elif f.kind == "terminate":
            pattern = "chaos-consumer-%" if f.target == "all" else f"chaos-consumer-{f.target.replace('/', '-')}-g%"
            with self._admin() as conn:
                rows = conn.execute("SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE application_name LIKE %s", (pattern,)).fetchall()
            apps = Counter(app for app, ok in rows if ok)
            with self.lock:
                f.victims = sorted({p.pid for p in self.all_procs if p.app in apps})
            f.detail = {"backends": sum(apps.values()), "by_process": dict(apps)}
        elif f.kind == "restart":
            self.server.restart_immediate()
            f.t_end = time.time()
            f.detail = {"seconds": round(f.t_end - f.t, 2)}
        else:
            threading.Thread(target=self.pin, args=(f,), name="chaos-pin", daemon=True).start()

    def pin(self, f: Fault) -> None:
        """A REPEATABLE READ transaction open for pin_s: its snapshot pins the xmin horizon."""
        try:
            with psycopg.connect(self.app_dsn("chaos-pin")) as conn, self._admin() as admin:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                first = value(conn, "SELECT count(*) FROM dq_messages")  # takes the snapshot
                xmin = value(admin, "SELECT backend_xmin::text FROM pg_stat_activity WHERE application_name = "
                                    "'chaos-pin'")
                self.stop.wait(self.s.pin_s - (time.time() - f.t))
                again = value(conn, "SELECT count(*) FROM dq_messages")
                admin.execute("SELECT pg_stat_clear_snapshot()")
                dead = value(admin, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'dq_messages'")
                conn.commit()
            f.t_end = time.time()
            f.detail = {"seconds": round(f.t_end - f.t, 2), "backend_xmin": xmin, "rows_seen_at_start": first,
                        "rows_seen_at_end": again, "dq_messages_dead_tuples_at_end": dead}
        except psycopg.Error as exc:
            f.t_end = time.time()
            f.error = f"{type(exc).__name__}: {exc}"[:300]
            f.detail = {"seconds": round(f.t_end - f.t, 2)}

    def injector(self, plan: list[Fault]) -> None:
        for f in plan:
            if self.stop.wait(max(self.t0 + f.at - time.time(), 0)):
                return
            try:
                self.inject(f)
            except Exception as exc:  # recorded; the run goes on
                f.error = f"{type(exc).__name__}: {exc}"[:300]
            with self.lock:
                self.faults.append(f)
            console().log(f"t={time.time() - self.t0:5.1f} s  fault {f.kind} {f.target} "
                          f"{f.detail or ''}{' ERROR ' + f.error if f.error else ''}")

    def supervise(self) -> None:
        """Start killed consumers again; a consumer that exits by itself is recorded, not restarted."""
        now = time.time()
        with self.lock:
            current = list(self.consumers.items())
        for slot, p in current:
            if p.poll() is None:
                continue
            if p.killed_at is None:
                if p not in self.crashed:
                    self.crashed.append(p)
                    console().log(f"[red]{p.name} exited by itself with {p.exit_code}[/]")
                continue
            if now >= self.restart_at.get(slot, 0):
                self.start_consumer(slot, p.mode, p.kind, p.gen + 1)

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        s = self.s
        console().log(f"[bold]{self.program}[/]: modes {', '.join(s.modes)}, {s.duration:g} s, seed {s.seed}; "
                      f"starting a private server on port {self.server.port}")
        self.dsn = self.server.up()
        self.install()
        for slot, mode, kind in self.slots():
            self.start_consumer(slot, mode, kind, 0)
        self.wait_ready(list(self.consumers.values()))
        plan = self.plan()
        self.t0 = time.time()
        self.start_producers()
        self.started()
        tl = self.timeline
        console().log(f"producers started: before the faults until {tl.before_end:.1f} s, faults until "
                      f"{tl.window_end:.1f} s, producers stop at {tl.end:.1f} s; {len(plan)} faults planned")
        inj = threading.Thread(target=self.injector, args=(plan,), name="chaos-injector", daemon=True)
        inj.start()
        while time.time() < self.t0 + s.duration:
            self.supervise()
            time.sleep(0.2)
        inj.join(timeout=120)
        for p in self.producers:
            assert p.popen is not None
            try:
                p.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(10)
            p.poll()
        t_prod_end = time.time()
        console().log(f"t={t_prod_end - self.t0:5.1f} s  producers stopped; draining")
        self.drain(t_prod_end)
        self.stop_consumers()
        return self.account(t_prod_end, plan)

    def live(self, conn: psycopg.Connection[Any], mode: str) -> int:
        return int(value(conn, "SELECT count(*) FROM dq_messages WHERE queue = ANY (%s)",
                         (list(self.queues(mode)),)))

    def drain(self, since: float) -> None:
        pending = set(self.s.modes)
        deadline = since + self.s.drain_timeout
        conn: psycopg.Connection[Any] | None = None
        while pending and time.time() < deadline:
            self.supervise()
            try:
                if conn is None or conn.closed:
                    conn = self._admin()
                for mode in sorted(pending):
                    if self.live(conn, mode) == 0:
                        self.drained_at[mode] = time.time()
                        pending.discard(mode)
            except psycopg.Error:
                conn = None
            time.sleep(0.2)
        for mode in pending:
            self.drained_at[mode] = None
        if conn is not None:
            conn.close()

    def stop_consumers(self) -> None:
        with self.lock:
            procs = list(self.consumers.values())
        for p in procs:
            if p.poll() is None:
                assert p.popen is not None
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in procs:
            assert p.popen is not None
            try:
                p.popen.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                console().log(f"[red]{p.name} still running {STOP_TIMEOUT_S:.0f} s after SIGTERM; killing it[/]")
                p.popen.kill()
                p.popen.wait(10)
            p.poll()

    def kill_everything(self) -> None:
        self.stop.set()
        for p in self.all_procs:
            if p.popen is not None and p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        for p in self.all_procs:
            if p.popen is not None:
                try:
                    p.popen.wait(10)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait(10)

    # -- accounting ------------------------------------------------------------------------------
    def account(self, t_prod_end: float, plan: list[Fault]) -> dict[str, Any]:
        t0, tl = self.t0, self.timeline
        faults = sorted(self.faults, key=lambda f: f.t)
        injected = [f for f in faults if f.error is None or f.kind == "pin"]
        first_fault = min((f.t for f in injected), default=t0 + tl.before_end)
        last_fault_end = max((max(f.t, f.t_end) for f in injected), default=t0 + tl.window_end)
        names_by_pid = {p.pid: p.name for p in self.all_procs}
        errors_by_pid = {p.pid: p.db_errors() for p in self.all_procs}
        failures: list[str] = []
        modes: dict[str, Any] = {}
        with self._admin() as conn:
            for mode in self.s.modes:
                with self.lock:
                    survivors = {p.name: p.pid for p in self.consumers.values()
                                 if p.mode == mode and p.started < last_fault_end}
                account = account_graph if mode == "graph" else account_mode
                modes[mode] = account(
                    conn, mode, queue=self.queue(mode), logs=self.logs, faults=faults, names_by_pid=names_by_pid,
                    errors_by_pid=errors_by_pid, phases=(t0, first_fault, last_fault_end, t_prod_end),
                    drained_at=self.drained_at.get(mode), drain_timeout=self.s.drain_timeout, survivors=survivors,
                    crashed=any(p.mode == mode for p in self.crashed), failures=failures)
            server_version = value(conn, "SELECT version()")
            source = source_info(conn)
        counts = {k: sum(1 for f in injected if f.kind == k) for k in ("kill", "terminate", "restart", "pin")}
        for kind, n in counts.items():
            if n == 0 and any(f.kind == kind for f in plan):
                failures.append(f"no {kind} fault was injected")
        for p in self.crashed:
            failures.append(f"{p.name} (pid {p.pid}) exited by itself with {p.exit_code}: it did not recover")
        bad_exit = [p for p in self.all_procs if p.killed_at is None and p not in self.crashed
                    and p.exit_code not in (0, None)]
        for p in bad_exit:
            failures.append(f"{p.name} (pid {p.pid}) exited with {p.exit_code}")
        return {
            "timestamp": datetime.fromtimestamp(t0, UTC).isoformat(timespec="seconds"),
            "settings": asdict(self.s),
            "timeline_s": {"before_faults_until": round(first_fault - t0, 2),
                           "faults_until": round(last_fault_end - t0, 2),
                           "producers_stopped": round(t_prod_end - t0, 2),
                           "planned": asdict(tl)},
            "server": {"port": self.server.port, "datadir": str(self.server.datadir), "version": server_version},
            "source": source,
            "machine": machine_info(),
            "faults_injected": counts,
            "faults": [{**asdict(f), "t_s": round(f.t - t0, 2),
                        "t_end_s": round(f.t_end - t0, 2) if f.t_end else None} for f in faults],
            "faults_planned_not_run": len(plan) - len(faults),
            "modes": modes,
            "processes": [p.summary(t0) for p in self.all_procs],
            "failures": failures,
            "passed": not failures,
        }


# --------------------------------------------------------------------------- a run, and its options


def hand_over(path: Path, dsn: str, logs: Path, timeout_s: float = 600.0) -> None:
    """Write ``{"dsn": …, "logs": …}`` to ``path`` (atomically) and wait until the caller removes it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"dsn": dsn, "logs": str(logs)}) + "\n")
    tmp.rename(path)
    console().log(f"private server handed over: {path} holds its DSN; waiting until it is removed")
    deadline = time.monotonic() + timeout_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def execute(harness: type[Chaos], s: Settings) -> dict[str, Any]:
    """Run ``harness`` on its private server and return its report; the processes are stopped and
    the server removed on the way out, also on errors and Ctrl-C/SIGTERM."""
    name = harness.program
    workdir = Path(tempfile.mkdtemp(prefix=f"dq-{name.rsplit('.', 1)[-1]}-"))
    chaos = harness(s, workdir)
    report: dict[str, Any] | None = None
    try:
        with interrupt_on_sigterm():
            report = chaos.run()
    except KeyboardInterrupt:
        console().log(f"[red]{name} interrupted: stopping the processes and the private server[/]")
        raise
    except BaseException:
        console().log(f"[red]{name} failed:[/] {traceback.format_exc(limit=3)}")
        console().log(f"server log tail:\n{chaos.server.log_tail()}")
        raise
    finally:
        chaos.kill_everything()
        if report is not None and s.hand_over:
            hand_over(Path(s.hand_over), chaos.dsn, chaos.logs)
        chaos.server.destroy()
        if report is None or not report["passed"] or s.keep_logs:
            shutil.rmtree(workdir / "pgdata", ignore_errors=True)
            console().log(f"process logs kept in {workdir / 'logs'}")
            if report is not None:
                report["logs"] = str(workdir / "logs")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return report


def add_arguments(parser: argparse.ArgumentParser, duration: float) -> None:
    """The options bench.chaos and bench.soak share."""
    parser.add_argument("--duration", type=float, default=duration, help=f"seconds of traffic (default {duration:g})")
    parser.add_argument("--mode", choices=["exactly-once", "at-least-once", "graph", "both", "all"], default="both",
                        help="both (default): exactly-once and at-least-once side by side on two queues under the "
                             "same faults; graph: small DAGs of messages offered after others (--rate: nodes per "
                             "second, --graph-rate); all: the three")
    parser.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    parser.add_argument("--seed", type=int, default=None, help="random seed of the fault schedule (default: random)")
    parser.add_argument("--rate", type=float, default=Settings.rate,
                        help=f"messages offered per second per mode (default {Settings.rate:g})")
    parser.add_argument("--graph-rate", type=float, default=Settings.graph_rate,
                        help=f"graph mode: nodes offered per second, in graphs of 4 and 6 (default "
                             f"{Settings.graph_rate:g})")
    parser.add_argument("--single-share", type=float, default=Settings.single_share,
                        help=f"the part of the rate offered one message per call, the rest in outbox batches "
                             f"(default {Settings.single_share:g})")
    parser.add_argument("--batch", type=int, default=Settings.batch,
                        help=f"keys per outbox transaction (offer_many) and at most per transaction of the "
                             f"DelayedQueue.transaction consumer (default {Settings.batch})")
    parser.add_argument("--concurrency", type=int, default=Settings.concurrency,
                        help=f"handler slots per consumer process (default {Settings.concurrency})")
    parser.add_argument("--work-ms", type=float, default=Settings.work_ms,
                        help=f"each handler also sleeps up to this long, milliseconds (default {Settings.work_ms:g})")
    parser.add_argument("--lock-timeout", type=float, default=Settings.lock_timeout, help="consumers' lock timeout")
    parser.add_argument("--drain-timeout", type=float, default=Settings.drain_timeout,
                        help="after the producers stop, how long the queues may take to drain")
    parser.add_argument("--pgdata", default=None, help="data directory of the private server (new or empty; "
                                                       "default: under a temporary folder); removed at the end")
    parser.add_argument("--port", type=int, default=None, help="port of the private server (default: a free one)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs also when the run passed")
    parser.add_argument("--hand-over", default=None, metavar="PATH",
                        help="before removing the private server, write its DSN and the folder of the "
                             "producers' records to PATH (JSON) and wait (at most 10 minutes) until PATH is "
                             "removed: lets a caller check the database itself")


def settings_from(args: argparse.Namespace) -> Settings:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    if (args.rate <= 0 or args.graph_rate <= 0 or not 0 <= args.single_share <= 1 or args.batch < 1
            or args.concurrency < 1):
        raise SystemExit("bench.chaos: --rate and --graph-rate must be > 0, --single-share within 0..1, --batch "
                         "and --concurrency >= 1")
    modes = {"both": BOTH, "all": tuple(MODES)}.get(args.mode, (args.mode,))
    return Settings(duration=args.duration, modes=modes, seed=seed,
                    rate=args.rate, graph_rate=args.graph_rate, single_share=args.single_share, batch=args.batch,
                    concurrency=args.concurrency,
                    work_ms=args.work_ms, lock_timeout=args.lock_timeout, drain_timeout=args.drain_timeout,
                    pgdata=args.pgdata, port=args.port, keep_logs=args.keep_logs, hand_over=args.hand_over)
