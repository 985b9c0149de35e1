"""bench.django_worker at a tiny size on the test server: both workers (``manage.py pyqueue_worker`` and
django-tasks-db's ``db_worker``) drain every task of both kinds, beside plain SQL, and the report holds
what the docs quote (versions, rates, ratios); its summary renders and re-summarizes to itself."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from rich.console import Console

from bench import django_worker, summarize

PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_run_drains_every_task_with_both_workers(admin_dsn: str, tmp_path: Path) -> None:
    name = f"dq_test_django_worker_{os.getpid()}"
    out = tmp_path / "django_worker.json"
    command = [sys.executable, "-m", "bench.django_worker", "--dsn", admin_dsn, "--tasks", "40", "--sleep-ms", "2",
               "--pyqueue-concurrency", "2", "--db-processes", "1", "--conn-max-age", "0,none", "--db-name", name,
               "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(PROJECT))
    try:
        done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "django_worker"
    assert report["versions"]["django-tasks"].startswith("0.12.") and report["versions"]["django-tasks-db"]
    assert report["server"]["version"].startswith("PostgreSQL")
    runs = {(r["task"], r["runner"], r["conn_max_age"], r["parallelism"]): r for r in report["runs"]}
    expected = {(task, runner, age, n) for task in ("noop", "sleep")
                for runner, age, n in (("pyqueue_worker", "0", 2), ("pyqueue_worker", "none", 2),
                                       ("db_worker", "0", 1), ("db_worker", "none", 1),
                                       ("plain SQL", None, 1), ("plain SQL", None, 2))}
    assert set(runs) == expected
    for key, r in runs.items():
        assert r["tasks"] == 40 and r["tasks_per_s"] > 0 and r["vs_plain"] > 0, key
        assert r["ran_more_than_once"] == 0, key
        if r["runner"] != "plain SQL":
            assert r["enqueue_per_s"] > 0 and 0 < r["startup_s"] < r["elapsed_s"], key
            assert r["exit_codes"] == [0] * r["processes"], key
            # server CPU per task only where the workers keep their connections (see the module)
            assert (r["server_us_per_task"] is None) == (r["conn_max_age"] == "0"), key
        else:
            assert sum(r["per_client"]) == 40 and r["vs_plain"] == 1.0, key
    # two threads of one process against one db_worker process: the shape the tables print
    assert django_worker.shape(runs["noop", "pyqueue_worker", "0", 2]) == "1 × 2 thr"
    assert django_worker.shape(runs["noop", "db_worker", "0", 1]) == "1 proc"

    summary = json.loads(out.with_name("django_worker.summary.json").read_text())
    assert "exit_codes" not in summary["runs"][0]
    written = summarize.summarize(out.with_name("django_worker.summary.json"), tmp_path / "again")
    assert json.loads(written[0].read_text()) == summary
    console = Console(width=200, file=io.StringIO())
    for table in django_worker.tables(summary):
        console.print(table)
    assert "db_worker" in console.file.getvalue()  # type: ignore[attr-defined]
