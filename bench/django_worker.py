"""Django Tasks throughput: ``manage.py pyqueue_worker`` (pyqueue.contrib.django) against Django's
reference ``manage.py db_worker`` (django-tasks-db's ``DatabaseBackend``), same tasks, same database,
beside plain SQL.

    python -m bench.django_worker --dsn ADMIN_DSN [--tasks N] [--sleep-ms MS] [--quick] [--out PATH]
                                  [--pyqueue-concurrency 1,2,4] [--db-processes 1,2] [--conn-max-age 0]

The database ``--db-name`` is recreated with pyqueue installed and ``migrate``d for a Django project of
two Tasks backends (:mod:`bench.django_worker_settings`): ``default`` is ours, ``database`` is
``django_tasks_db.DatabaseBackend``. Two tasks (:mod:`bench.django_worker_tasks`): a no-op, and one
that sleeps ``--sleep-ms`` (default 10 ms, like a task waiting on I/O).

For each task and each runner, from the same empty state: ``--tasks`` tasks (default 2,000) are
enqueued one per ``enqueue()`` call from this process (the enqueue rate: each call its own
transaction), then the worker processes start and the clock runs from their start until every task
is SUCCESSFUL (counted in the backend's results table every 20 ms). Runners:

* ``pyqueue_worker``: one process ``manage.py pyqueue_worker --queue default --concurrency C`` (C
  threads), for each C of ``--pyqueue-concurrency``; stopped with SIGTERM once all succeeded;
* ``db_worker``: K processes ``manage.py db_worker --backend database --no-startup-delay --no-reload
  --verbosity 0`` (it runs one task at a time per process), for each K of ``--db-processes``; stopped
  with SIGTERM once all succeeded (not ``--batch``: a worker exiting before the clock stops would take
  its CPU time and its server session's along);
* ``plain SQL``: the same number of rows in a plain table, claimed by the same number of clients
  (threads of this process, each with its own connection, connected before the clock starts) with
  ``DELETE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED) RETURNING``, one per transaction, then
  sleeping the task's time: the most the server can do for the same claims.

Both workers are the ``python -m django`` command with the bench settings (what ``manage.py`` runs);
neither logs a line per task (``db_worker --verbosity 0``; no LOGGING for pyqueue_worker). With Django's
default ``CONN_MAX_AGE = 0`` both workers close their Django connection after each task (Django's
``close_old_connections``, as around a request), and so open one per task; ``--conn-max-age none``
keeps them.

It prints one table per task: tasks/s from the workers' start (and from the first success, i.e.
without the process start-up), the ratio to plain SQL at the same parallelism, the enqueue rate, the
transactions per task (the workers' round trips: all the database counted, less the driver's), the
CPU per task of the server (only with persistent connections: with ``CONN_MAX_AGE = 0`` the backend
of each task's connection exits and takes its CPU time along) and of the workers, the tasks that ran
more than once, and the share of the machine other processes used. The host has 2 cores shared by
the server, the workers and others: keep ``--pyqueue-concurrency`` at most 4 threads and
``--db-processes`` at most 2 processes. ``--quick``: 200 tasks, 1 and 2 of each. Writes
``bench/results/raw/django_worker-<UTC time>.json`` (and the workers' logs beside it) and the summary
``bench/results/django_worker.json``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from bench.lib.cpu import CpuSnapshot
from bench.lib.database import create_database, server_info, source_info, xacts
from bench.lib.report import PROJECT, RAW, arguments, console, machine_info, publish, rich_table, without
from bench.lib.workers import STATS_SETTLE_S, STOP_TIMEOUT_S, die_with_parent

if TYPE_CHECKING:
    from rich.table import Table

SETTINGS = "bench.django_worker_settings"
TASKS = ("noop", "sleep")
COUNT_EVERY_S = 0.02  # how often the driver counts the successful tasks
TIMEOUT_S = 600.0  # a run that has not finished by then fails
OURS_TABLE = "pyqueue_django_task_result"  # pyqueue.contrib.django's results
THEIRS_TABLE = "django_tasks_database_dbtaskresult"  # django-tasks-db's (app label django_tasks_database)
RESET = "TRUNCATE pyqueue_django_task_result, django_tasks_database_dbtaskresult, dq_messages"
COUNTS = {  # (SUCCESSFUL, FAILED, ran more than once) in each results table
    table: sql.SQL("SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), count(*) FILTER (WHERE status = 'FAILED'),"
                   " count(*) FILTER (WHERE jsonb_array_length(worker_ids) > 1) FROM {}").format(sql.Identifier(table))
    for table in (OURS_TABLE, THEIRS_TABLE)
}
PLAIN_CREATE = ("CREATE TABLE IF NOT EXISTS bench_django_plain"
                " (id bigserial PRIMARY KEY, task text NOT NULL, payload jsonb NOT NULL)")
PLAIN_FILL = ("INSERT INTO bench_django_plain (task, payload)"
              " SELECT %s, '{\"args\": [], \"kwargs\": {}}' FROM generate_series(1, %s)")
PLAIN_CLAIM = ("DELETE FROM bench_django_plain WHERE id = (SELECT id FROM bench_django_plain ORDER BY id LIMIT 1"
               " FOR UPDATE SKIP LOCKED) RETURNING id, task, payload")
MACHINE_NOTE = ("2 cores shared by the server, the workers and other processes: at most 4 threads and"
                " 2 worker processes")


@dataclass(frozen=True)
class Config:
    tasks: int = 2000
    sleep_ms: float = 10.0
    pyqueue_concurrency: tuple[int, ...] = (1, 2, 4)
    db_processes: tuple[int, ...] = (1, 2)
    conn_max_age: tuple[str, ...] = ("0", "none")  # Django's CONN_MAX_AGE of the workers, each in turn


QUICK = Config(tasks=200, pyqueue_concurrency=(1, 2), db_processes=(1, 2))


def versions() -> dict[str, str]:
    """The versions of the packages measured (PostgreSQL's is in the report's ``server``)."""
    out = {}
    for name in ("django", "django-tasks", "django-tasks-db", "psycopg", "pgdelayq"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


# --------------------------------------------------------------------------- the Django side


def setup_django(dsn: str, config: Config) -> None:
    """Point the bench settings at ``dsn``, set Django up in this process and migrate."""
    os.environ.update(PYQUEUE_DJANGO_DSN=dsn, DJANGO_SETTINGS_MODULE=SETTINGS,
                      BENCH_DJANGO_SLEEP_MS=str(config.sleep_ms))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def enqueue(task_name: str, alias: str, n: int) -> float:
    """Enqueue ``n`` tasks ``task_name`` with backend ``alias``, one ``enqueue()`` each (its own
    transaction); return the tasks enqueued per second."""
    from django.db import connections

    from bench import django_worker_tasks

    task = getattr(django_worker_tasks, task_name).using(backend=alias)
    started = time.perf_counter()
    for _ in range(n):
        task.enqueue()
    rate = n / (time.perf_counter() - started)
    connections.close_all()
    return rate


def command(runner: str, parallelism: int, worker: int) -> list[str]:
    """The worker process's command line (``python -m django`` is what ``manage.py`` runs)."""
    if runner == "pyqueue_worker":
        return [sys.executable, "-m", "django", "pyqueue_worker", "--queue", "default", "--backend", "default",
                "--concurrency", str(parallelism)]
    return [sys.executable, "-m", "django", "db_worker", "--backend", "database", "--queue-name", "default",
            "--no-startup-delay", "--no-reload", "--verbosity", "0", "--worker-id", f"bench-{worker}"]


def counts(conn: psycopg.Connection[Any], table: str) -> tuple[int, int, int]:
    """(SUCCESSFUL, FAILED, ran more than once) tasks in a results table."""
    row = conn.execute(COUNTS[table]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def run_workers(dsn: str, db_name: str, task_name: str, runner: str, parallelism: int, n: int, conn_max_age: str,
                workdir: Path) -> dict[str, Any]:
    """Enqueue ``n`` tasks with the runner's backend, start its worker process(es) with Django's
    ``CONN_MAX_AGE`` ``conn_max_age``, time until all are SUCCESSFUL."""
    ours = runner == "pyqueue_worker"
    table = OURS_TABLE if ours else THEIRS_TABLE
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RESET)
    rate = enqueue(task_name, "default" if ours else "database", n)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
        if ours:
            conn.execute("VACUUM ANALYZE dq_messages")
        conn.execute("CHECKPOINT")
    time.sleep(STATS_SETTLE_S)  # the enqueue's session reported its transactions
    x0, polls = xacts(dsn), 0
    env = dict(os.environ, PYTHONPATH=str(PROJECT), PYTHONUNBUFFERED="1", BENCH_DJANGO_CONN_MAX_AGE=conn_max_age)
    processes = 1 if ours else parallelism
    procs: list[subprocess.Popen[bytes]] = []
    logs = [workdir / f"{task_name}-{runner}-{parallelism}-age{conn_max_age}-{i}.log" for i in range(processes)]
    with psycopg.connect(dsn, autocommit=True) as counter:
        before = CpuSnapshot.take(os.getpid(), db_name)
        started = time.perf_counter()
        first = None
        try:
            for i, log in enumerate(logs):
                with log.open("wb") as out:
                    procs.append(subprocess.Popen(command(runner, parallelism, i), cwd=PROJECT, env=env,
                                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                  preexec_fn=die_with_parent))
            while True:
                done, failed, _ = counts(counter, table)
                polls += 1
                now = time.perf_counter()
                if done and first is None:
                    first = now
                if done + failed >= n:
                    break
                if now - started > TIMEOUT_S or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"{runner} x{parallelism}: {done}/{n} successful after {now - started:.0f} s"
                                       f"\n{logs[0].read_text(errors='replace')[-3000:]}")
                time.sleep(COUNT_EVERY_S)
            elapsed = now - started
            after = CpuSnapshot.take(os.getpid(), db_name)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        retried = counts(counter, table)[2]
    time.sleep(STATS_SETTLE_S)  # the workers' sessions, closed, reported theirs
    # The workers' transactions: all since x0, less this driver's (x0's reading, the counts).
    per_task = (xacts(dsn) - x0 - 1 - polls - 1) / n
    cpu = before.until(after, elapsed)
    if failed:
        raise RuntimeError(f"{runner} x{parallelism}: {failed} tasks FAILED\n{logs[0].read_text(errors='replace')}")
    assert first is not None
    return {"task": task_name, "conn_max_age": conn_max_age, "runner": runner, "parallelism": parallelism,
            "processes": processes,
            "threads_per_process": parallelism if ours else 1, "tasks": n, "enqueue_per_s": round(rate, 1),
            "elapsed_s": round(elapsed, 3), "tasks_per_s": round(n / elapsed, 1),
            "startup_s": round(first - started, 3),
            "tasks_per_s_after_first": round((n - 1) / (elapsed - (first - started)), 1) if n > 1 else None,
            # With CONN_MAX_AGE 0 each task's backend exits before the end, taking its CPU time along.
            "server_us_per_task": round(cpu["server_cpu_s"] * 1e6 / n) if conn_max_age != "0" else None,
            "workers_us_per_task": round((after.clients_s - before.clients_s) * 1e6 / n),
            "xacts_per_task": round(per_task, 2), "other_cpu": round(cpu["other_cpu"], 3),
            "ran_more_than_once": retried, "exit_codes": [p.returncode for p in procs]}


# --------------------------------------------------------------------------- plain SQL


def run_plain(dsn: str, db_name: str, task_name: str, clients: int, n: int, sleep_s: float) -> dict[str, Any]:
    """``n`` rows claimed and deleted one per transaction by ``clients`` threads, each sleeping
    ``sleep_s`` after each claim (the task's time)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PLAIN_CREATE)
        conn.execute("TRUNCATE bench_django_plain RESTART IDENTITY")
        conn.execute(PLAIN_FILL, (task_name, n))
        conn.execute("VACUUM ANALYZE bench_django_plain")
        conn.execute("CHECKPOINT")
    conns = [psycopg.connect(dsn, autocommit=True, prepare_threshold=0) for _ in range(clients)]
    claimed = [0] * clients
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            conn = conns[i]
            while True:
                with conn.transaction():
                    row = conn.execute(PLAIN_CLAIM).fetchone()
                if row is None:
                    return
                claimed[i] += 1
                if sleep_s:
                    time.sleep(sleep_s)
        except BaseException as exc:  # reported by the driver
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    try:
        before = CpuSnapshot.take(os.getpid(), db_name)
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        elapsed = time.perf_counter() - started
        after = CpuSnapshot.take(os.getpid(), db_name)
    finally:
        for c in conns:
            c.close()
    if errors:
        raise errors[0]
    if sum(claimed) != n:
        raise RuntimeError(f"plain SQL x{clients}: {sum(claimed)} of {n} rows claimed")
    cpu = before.until(after, elapsed)
    return {"task": task_name, "conn_max_age": None, "runner": "plain SQL", "parallelism": clients, "processes": 1,
            "threads_per_process": clients, "tasks": n, "enqueue_per_s": None, "elapsed_s": round(elapsed, 3),
            "tasks_per_s": round(n / elapsed, 1), "startup_s": None, "tasks_per_s_after_first": None,
            "server_us_per_task": round(cpu["server_cpu_s"] * 1e6 / n),
            "workers_us_per_task": round((after.clients_s - before.clients_s) * 1e6 / n),
            "xacts_per_task": 1.0, "other_cpu": round(cpu["other_cpu"], 3), "ran_more_than_once": 0,
            "per_client": claimed}


# --------------------------------------------------------------------------- report


def with_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run with ``vs_plain``: its tasks/s over plain SQL's for the same task and parallelism."""
    plain = {(r["task"], r["parallelism"]): r["tasks_per_s"] for r in runs if r["runner"] == "plain SQL"}
    for r in runs:
        base = plain.get((r["task"], r["parallelism"]))
        r["vs_plain"] = round(r["tasks_per_s"] / base, 3) if base else None
    return runs


def _f(value: float | None, spec: str = ",.0f") -> str:
    return "—" if value is None else format(value, spec)


def shape(r: dict[str, Any]) -> str:
    """How a run's parallelism is made: "1 × 4 thr" (threads of one process), "2 proc", "2 clients"."""
    if r["runner"] == "plain SQL":
        return f"{r['parallelism']} client{'s' if r['parallelism'] > 1 else ''}"
    if r["threads_per_process"] > 1:
        return f"1 × {r['threads_per_process']} thr"
    return f"{r['processes']} proc"


def tables(report: dict[str, Any]) -> list[Table]:
    v = report["versions"]
    caption = (f"Django {v['django']}, django-tasks {v['django-tasks']}, django-tasks-db {v['django-tasks-db']}, "
               f"{report['server']['version'].split(' on ')[0]}; {report['machine_note']}. age: the workers' "
               "CONN_MAX_AGE; vs plain: over plain SQL with as many clients; after 1st: without the start-up; "
               "xacts: transactions per task (plain SQL: 1 by construction); server µs: not with age 0 (each task's "
               "backend exits); other: CPU of other processes")
    twice = any(r["ran_more_than_once"] for r in report["runs"])  # a column only when some task did
    if not twice:
        caption += "; no task ran twice"
    out = []
    for task in TASKS:
        rows = [[r["runner"], "" if r["conn_max_age"] is None else r["conn_max_age"], shape(r), _f(r["tasks_per_s"]),
                 _f(r["tasks_per_s_after_first"]), _f(r["vs_plain"], ".2f"), _f(r["startup_s"], ".2f"),
                 _f(r["enqueue_per_s"]), f"{r['xacts_per_task']:.1f}", _f(r["server_us_per_task"]),
                 _f(r["workers_us_per_task"]), *([str(r["ran_more_than_once"])] if twice else []),
                 f"{r['other_cpu']:.0%}"]
                for r in report["runs"] if r["task"] == task]
        what = "no-op" if task == "noop" else f"sleep {report['config']['sleep_ms']:g} ms"
        out.append(rich_table(
            f"Django tasks, {what}: {report['config']['tasks']:,} tasks from the workers' start to all SUCCESSFUL",
            ["runner", "age", "as", "tasks/s", "after 1st", "vs plain", "start s", "enqueue/s", "xacts", "server µs",
             "workers µs", *(["twice"] if twice else []), "other"], rows, left=("runner", "age", "as"),
            caption=caption))
    return out


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Everything but the exit codes and the plain clients' shares."""
    return {**without(report, "runs"),
            "runs": [without(r, "exit_codes", "per_client") for r in report["runs"]]}


def run(admin_dsn: str, config: Config, db_name: str, out: Path | None, quick: bool) -> dict[str, Any]:
    started, timestamp = time.perf_counter(), datetime.now(UTC)
    dsn = create_database(admin_dsn, db_name, baseline=False)
    setup_django(dsn, config)
    stamp = timestamp.strftime("%Y%m%dT%H%M%SZ")
    workdir = (out.parent if out is not None else RAW) / f"django_worker-{stamp}-logs"
    workdir.mkdir(parents=True, exist_ok=True)
    console().log(f"{config.tasks:,} tasks per run; {MACHINE_NOTE}; worker logs in {workdir}")
    runs: list[dict[str, Any]] = []
    for task in TASKS:
        for age in config.conn_max_age:
            for runner, counts_ in (("pyqueue_worker", config.pyqueue_concurrency), ("db_worker", config.db_processes)):
                for c in counts_:
                    runs.append(run_workers(dsn, db_name, task, runner, c, config.tasks, age, workdir))
                    console().log(f"{task}: {runner} x{c}, CONN_MAX_AGE {age}: {runs[-1]['tasks_per_s']:,.0f} tasks/s")
        sleep_s = config.sleep_ms / 1000 if task == "sleep" else 0.0
        for c in sorted({*config.pyqueue_concurrency, *config.db_processes}):
            runs.append(run_plain(dsn, db_name, task, c, config.tasks, sleep_s))
            console().log(f"{task}: plain SQL x{c}: {runs[-1]['tasks_per_s']:,.0f} tasks/s")
    with psycopg.connect(dsn) as conn:
        server, source = server_info(conn), source_info(conn)
    report = {"timestamp": timestamp.isoformat(timespec="seconds"), "mode": "quick" if quick else "full",
              "wall_time_s": round(time.perf_counter() - started, 1), "config": asdict(config),
              "versions": versions(), "machine_note": MACHINE_NOTE, "machine": machine_info(), "server": server,
              "source": source, "runs": with_ratios(runs)}
    publish("django_worker", report, summary(report), tables(report), out, quick=quick, at=timestamp)
    return report


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> None:
    parser = arguments("bench.django_worker", __doc__, quick="development: 200 tasks, 1 and 2 of each",
                       db_name="dq_bench_django")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per run (default 2000)")
    parser.add_argument("--sleep-ms", type=float, default=10.0, help="the sleeping task's time (default 10)")
    parser.add_argument("--pyqueue-concurrency", type=_counts, default=None,
                        help="pyqueue_worker --concurrency values, comma-separated (default 1,2,4)")
    parser.add_argument("--db-processes", type=_counts, default=None,
                        help="db_worker process counts, comma-separated (default 1,2)")
    parser.add_argument("--conn-max-age", type=lambda t: tuple(t.split(",")), default=Config.conn_max_age,
                        help="the workers' CONN_MAX_AGE values (seconds, or none), each in turn (default 0,none)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else Config()
    config = Config(tasks=args.tasks or base.tasks, sleep_ms=args.sleep_ms,
                    pyqueue_concurrency=args.pyqueue_concurrency or base.pyqueue_concurrency,
                    db_processes=args.db_processes or base.db_processes, conn_max_age=args.conn_max_age)
    if config.tasks < 1 or config.sleep_ms < 0 or not all(x >= 1 for x in (*config.pyqueue_concurrency,
                                                                             *config.db_processes)):
        raise SystemExit("bench.django_worker: --tasks and the counts must be positive, --sleep-ms not negative")
    if max(config.pyqueue_concurrency) > 4 or max(config.db_processes) > 2:
        console().log(f"[yellow]beyond this host's rule: {MACHINE_NOTE}[/]")
    run(args.dsn, config, args.db_name, args.out, args.quick)


if __name__ == "__main__":
    main()
