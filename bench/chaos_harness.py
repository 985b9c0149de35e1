"""Fault injection with exact accounting: ``make chaos``.

    python -m bench.chaos [--duration 60] [--mode exactly-once|at-least-once|both] [--rate 1000]
                          [--out PATH] [--seed N] [--port N]

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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from glob import glob
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import make_conninfo

from bench.chaos_clients import DSN_ENV, SCHEMA
from bench.lib.database import source_info
from bench.lib.report import OUT_HELP, PROJECT, console, machine_info, publish, without
from bench.lib.sides import value
from bench.lib.workers import die_with_parent, interrupt_on_sigterm

if TYPE_CHECKING:
    from rich.table import Table

MODES = {"exactly-once": "eo", "at-least-once": "alo"}
PIN_S = 20.0  # the REPEATABLE READ transaction's length
RESTART_DELAY_S = 0.5  # a killed consumer is started again this long after the kill
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
SINGLE_RATE_PER_PROCESS = 50.0  # single offers per second one producer process is asked for, at most
EPS_S = 0.05  # slack when comparing times of the database clock, the logs and this harness (one host)
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # asctime of the workers' log lines


@dataclass(frozen=True)
class Settings:
    duration: float = 60.0
    modes: tuple[str, ...] = ("exactly-once", "at-least-once")
    seed: int = 0
    rate: float = 1000.0  # messages offered per second per mode: outbox batches and single offers
    single_share: float = 0.2  # the part of the rate offered one message per call
    batch: int = 50  # keys per outbox transaction (offer_many) and per consume-tx transaction
    lock_timeout: float = 5.0
    idle_check: float = 1.0
    concurrency: int = 16
    work_ms: float = 2.0
    pin_s: float = PIN_S
    drain_timeout: float = 60.0
    pgdata: str | None = None
    port: int | None = None  # of the private server; None: a free one
    keep_logs: bool = False
    hand_over: str | None = None  # before the server is removed: write its DSN here, wait until removed


@dataclass
class Timeline:
    """Seconds from t0 (producers started), planned."""

    before_end: float
    window_end: float
    end: float

    @classmethod
    def plan(cls, s: Settings) -> Timeline:
        window = max(s.pin_s + 3, 0.5 * s.duration)
        rest = s.duration - window
        if rest < 4:
            raise SystemExit(f"bench.chaos: --duration {s.duration:g} is too short: the faults need {window:.0f} s "
                             f"(a {s.pin_s:.0f} s pinned xmin and a restart) and 4 s more")
        return cls(before_end=rest * 0.4, window_end=rest * 0.4 + window, end=s.duration)


@dataclass
class Fault:
    kind: str  # kill | terminate | restart | pin
    at: float  # planned, seconds from t0
    target: str = ""  # kill: slot name; terminate: "all" or a slot name
    t: float = 0.0  # epoch when it happened
    t_end: float = 0.0  # restart: server ready again; pin: transaction ended
    victims: list[int] = field(default_factory=list)  # OS pids of the consumer processes hit
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def plan_faults(s: Settings, tl: Timeline, slots: list[str], rng: random.Random) -> list[Fault]:
    w0, w1 = tl.before_end, tl.window_end
    window = w1 - w0
    pin_at = rng.uniform(w0, w1 - s.pin_s)
    faults = [Fault("pin", pin_at)]
    # Restarts outside the pinned transaction (it would end with the server), at least 5 s apart.
    n_restart = max(1, round(window / 20))
    free = [(w0, pin_at - 1.0), (pin_at + s.pin_s + 0.5, w1 - 1.0)]
    free = [(a, b) for a, b in free if b > a]
    restarts: list[float] = []
    for _ in range(200):
        if len(restarts) == n_restart or not free:
            break
        a, b = rng.choices(free, weights=[b - a for a, b in free])[0]
        t = rng.uniform(a, b)
        if all(abs(t - r) >= 5 for r in restarts):
            restarts.append(t)
    faults += [Fault("restart", t) for t in restarts]
    n_kill = max(2, round(window / 7))
    n_term = max(2, round(window / 7))
    faults += [Fault("kill", rng.uniform(w0, w1), rng.choice(slots)) for _ in range(n_kill)]
    faults += [Fault("terminate", rng.uniform(w0, w1), rng.choice(["all", rng.choice(slots)])) for _ in range(n_term)]
    return sorted(faults, key=lambda f: f.at)


# --------------------------------------------------------------------------- the private server


def _pg_bindir() -> Path:
    found = sorted(glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]), reverse=True)
    if found:
        return Path(found[0]).parent
    which = shutil.which("pg_ctl")
    if which:
        return Path(which).parent
    raise SystemExit("bench.chaos: no PostgreSQL server binaries; run scripts/install-os-deps.sh")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """A PostgreSQL server of this run only: ``scripts/localpg.sh`` with its own data directory
    and port (as the postgres user when run as root); :meth:`destroy` stops it and removes the
    data directory."""

    def __init__(self, pgdata: str | None, workdir: Path, port: int | None = None) -> None:
        self.port = port if port is not None else _free_port()
        if pgdata is not None and Path(pgdata).exists() and any(Path(pgdata).iterdir()):
            raise SystemExit(f"bench.chaos: --pgdata {pgdata} is not empty; give a new or empty directory")
        self.workdir = workdir
        self.parent = Path(pgdata).parent if pgdata else workdir
        self.intended = Path(pgdata) if pgdata else workdir / "pgdata"
        self.bindir = _pg_bindir()
        self.env = dict(os.environ, DQ_PGDATA=str(self.intended), DQ_PGPORT=str(self.port), DQ_PGDB="chaos")
        self.datadir: Path | None = None
        self.dsn = ""

    def _as_pg(self, *cmd: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)

    def _localpg(self, action: str) -> str:
        out = subprocess.run([str(PROJECT / "scripts" / "localpg.sh"), action], env=self.env, capture_output=True,
                             text=True, timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/localpg.sh {action} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout.strip()

    def up(self) -> str:
        if os.geteuid() == 0 and self.parent == self.workdir:  # the postgres user must reach the data directory
            os.chmod(self.parent, 0o711)
        self.datadir = Path(self._localpg("datadir"))
        self.dsn = self._localpg("up").splitlines()[-1]
        return self.dsn

    def restart_immediate(self) -> None:
        assert self.datadir is not None
        subprocess.run(self._as_pg(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w",
                                   "-t", "60", "-l", str(self.datadir / "server.log"), "-o", f"-p {self.port}",
                                   "restart"), check=True, capture_output=True, timeout=90)

    def log_tail(self, n: int = 40) -> str:
        try:
            out = subprocess.run(self._as_pg("tail", "-n", str(n), str(self.datadir) + "/server.log"),
                                 capture_output=True, text=True, timeout=10)
            return out.stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    def destroy(self) -> None:
        if self.datadir is None:
            return
        try:
            self._localpg("destroy")
        except (RuntimeError, subprocess.SubprocessError) as exc:
            console().log(f"[red]stopping the private server failed ({exc}); stopping it immediately[/]")
            subprocess.run(self._as_pg(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                                       "stop"), capture_output=True, timeout=60)
            shutil.rmtree(self.datadir, ignore_errors=True)
        self.datadir = None


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
        return f"chaos-{MODES[mode]}"

    def app_dsn(self, app: str) -> str:
        return make_conninfo(self.dsn, application_name=app)

    def install(self) -> None:
        from pyqueue.migrate import migrate

        migrate(self.dsn)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            for mode in self.s.modes:
                q = self.queue(mode)
                conn.execute("SELECT dq_configure_queue(%s, max_deliveries => 20, dead_letter_queue => %s, "
                             "archive => true)", (q, q + ".dead"))

    def slots(self) -> list[tuple[str, str, str]]:
        """(slot name, mode, kind) of every consumer."""
        kinds = {"exactly-once": ("worker", "worker-async", "tx"),
                 "at-least-once": ("worker", "worker-async", "worker")}
        return [(f"{MODES[m]}/{k}{i}", m, k) for m in self.s.modes for i, k in enumerate(kinds[m])]

    def consumer_cmd(self, mode: str, kind: str, dsn: str) -> list[str]:
        q = self.queue(mode)
        if kind == "tx":
            return [sys.executable, "-m", "bench.chaos_clients", "consume-tx", "--queue", q,
                    "--lock-timeout", str(self.s.lock_timeout), "--batch", str(self.s.batch)]
        handler = {"exactly-once": "ledger", "at-least-once": "record"}[mode] + ("_async" if kind == "worker-async"
                                                                                 else "")
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
            for i, (kind, rate) in enumerate(self.producers_plan()):
                prefix = f"{MODES[mode]}-{kind}{i}"
                app = f"chaos-producer-{prefix}"
                p = Proc(f"{MODES[mode]}/producer-{kind}{i}", mode, "producer", 0,
                         [sys.executable, "-m", "bench.chaos_clients", "produce", "--queue", self.queue(mode),
                          "--kind", kind, "--prefix", prefix, "--rate", str(rate), "--batch", str(self.s.batch),
                          "--until", str(until), "--records", str(self.logs / f"{prefix}.jsonl"),
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
        console().log(f"[bold]{type(self).__module__}[/]: modes {', '.join(s.modes)}, {s.duration:g} s, seed {s.seed}; "
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
        return int(value(conn, "SELECT count(*) FROM dq_messages WHERE queue = %s", (self.queue(mode),)))

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
        procs_by_pid = {p.pid: p for p in self.all_procs}
        errors_by_pid = {p.pid: p.db_errors() for p in self.all_procs}
        failures: list[str] = []
        modes: dict[str, Any] = {}
        with self._admin() as conn:
            for mode in self.s.modes:
                modes[mode] = self.account_mode(conn, mode, faults, procs_by_pid, errors_by_pid,
                                                (t0, first_fault, last_fault_end, t_prod_end), failures)
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

    def account_mode(self, conn: psycopg.Connection[Any], mode: str, faults: list[Fault],
                     procs_by_pid: dict[int, Proc], errors_by_pid: dict[int, list[float]],
                     phases: tuple[float, float, float, float], failures: list[str]) -> dict[str, Any]:
        q = self.queue(mode)
        short = MODES[mode]
        # What the producers attempted, and what they were told.
        attempts: dict[str, tuple[str, str, float]] = {}  # key -> (producer kind, status, time)
        statuses: Counter[str] = Counter()
        for path in sorted(self.logs.glob(f"{short}-*.jsonl")):
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
        drained = self.drained_at.get(mode)
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
            "drained_s": None if drained is None else round(drained - phases[3], 2),
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
                                        "previous_process": procs_by_pid[prev.pid].name
                                        if prev.pid in procs_by_pid else None,
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
        progress = {}
        with self.lock:
            alive = [p for p in self.consumers.values() if p.mode == mode and p.started < last_fault_end]
        for p in alive:
            progress[p.name] = sum(1 for d in deliveries if d.pid == p.pid and d.at > last_fault_end)
        r["deliveries_after_last_fault_by_consumer"] = progress
        stuck = [name for name, n in progress.items() if n == 0]
        r["recovered"] = self.drained_at.get(mode) is not None and not stuck and not any(
            p.mode == mode for p in self.crashed)
        if self.drained_at.get(mode) is None:
            failures.append(f"{mode}: {r['live_at_end']} messages still in the queue {self.s.drain_timeout:.0f} s "
                            "after the producers stopped")
        if stuck:
            failures.append(f"{mode}: consumers {stuck} handled nothing after the last fault")
        return r


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
    acc.caption = ("extra handler runs: in exactly-once mode rolled back, no duplicate effect; duplicates there are "
                   "ledger rows beyond one per key. " + ("[green]PASS[/]" if report["passed"] else
                                                         "[red]FAIL: " + "; ".join(report["failures"]) + "[/]"))
    return [faults, acc]


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
    name = harness.__module__
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


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the tables show, with the settings, machine, server and commit measured: without the
    list of processes and each mode's acknowledgements per second."""
    return {**without(report, "processes"),
            "modes": {name: without(m, "acked_per_second") for name, m in report["modes"].items()}}


def run(s: Settings, out: Path | None) -> dict[str, Any]:
    report = execute(Chaos, s)
    publish("chaos", report, summary(report), tables(report), out)
    return report


def add_arguments(parser: argparse.ArgumentParser, duration: float) -> None:
    """The options bench.chaos and bench.soak share."""
    parser.add_argument("--duration", type=float, default=duration, help=f"seconds of traffic (default {duration:g})")
    parser.add_argument("--mode", choices=["exactly-once", "at-least-once", "both"], default="both",
                        help="both (default): the two modes side by side on two queues under the same faults")
    parser.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    parser.add_argument("--seed", type=int, default=None, help="random seed of the fault schedule (default: random)")
    parser.add_argument("--rate", type=float, default=Settings.rate,
                        help=f"messages offered per second per mode (default {Settings.rate:g})")
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
    if args.rate <= 0 or not 0 <= args.single_share <= 1 or args.batch < 1 or args.concurrency < 1:
        raise SystemExit("bench.chaos: --rate must be > 0, --single-share within 0..1, --batch and --concurrency >= 1")
    return Settings(duration=args.duration, modes=tuple(MODES) if args.mode == "both" else (args.mode,), seed=seed,
                    rate=args.rate, single_share=args.single_share, batch=args.batch, concurrency=args.concurrency,
                    work_ms=args.work_ms, lock_timeout=args.lock_timeout, drain_timeout=args.drain_timeout,
                    pgdata=args.pgdata, port=args.port, keep_logs=args.keep_logs, hand_over=args.hand_over)


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
