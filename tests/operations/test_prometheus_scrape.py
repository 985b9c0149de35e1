"""A real Prometheus (Debian's package, tests/support/prometheus.py) scrapes ``pyqueue metrics`` and a
``pyqueue worker --metrics-port``, both real processes, after a known workload: its HTTP API then
answers the queue's ready count, the worker's acknowledged total, the table health and the xmin
horizon, with the labels the alert rules and the dashboard use, and the alert rules load and
evaluate against those series."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
from prometheus import free_port, running_prometheus
from workerhandlers import HANG_S, SUPPORT, start_worker, stop

ROOT = Path(__file__).resolve().parents[2]


def values(result: list[dict]) -> dict[str, float]:  # type: ignore[type-arg]
    """``{queue (or table, or ""): value}`` of an instant query's result."""
    return {r["metric"].get("queue") or r["metric"].get("table") or "": float(r["value"][1]) for r in result}


def test_prometheus_scrapes_the_exporter_and_a_worker(dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # 7 messages for the worker on 'jobs', 4 left ready on 'reports' (no consumer).
        conn.execute("SELECT dq_offer_many('jobs', ARRAY(SELECT 'j' || g FROM generate_series(1, 7) g), "
                     "ARRAY(SELECT 'x'::bytea FROM generate_series(1, 7)))")
        conn.execute("SELECT dq_offer_many('reports', ARRAY(SELECT 'r' || g FROM generate_series(1, 4) g), "
                     "ARRAY(SELECT 'x'::bytea FROM generate_series(1, 4)))")
    exporter_port, worker_port = free_port(), free_port()
    exporter = subprocess.Popen([sys.executable, "-m", "pyqueue", "metrics", "--dsn", dsn,
                                 "--port", str(exporter_port)],
                                cwd=SUPPORT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    worker = start_worker(dsn, "workerhandlers:noop", "--idle-check", "0.5", "--metrics-port", str(worker_port))
    try:
        targets = {"pgdelayq": [f"127.0.0.1:{exporter_port}"], "pgdelayq-workers": [f"127.0.0.1:{worker_port}"]}
        with running_prometheus(targets, tmp_path, rule_files=[ROOT / "docs" / "prometheus" / "alerts.yml"]) as prom:
            ready = prom.wait_for('pgdelayq_queue_ready_messages{queue="reports"}',
                                  lambda r: values(r).get("reports") == 4, timeout=HANG_S)
            assert ready[0]["metric"]["job"] == "pgdelayq"
            acked = prom.wait_for('pgdelayq_worker_acknowledged_messages_total{queue="jobs"}',
                                  lambda r: values(r).get("jobs") == 7, timeout=HANG_S)
            assert acked[0]["metric"]["job"] == "pgdelayq-workers"
            # 'jobs' drained: it has no messages and no settings, so it is no longer a queue of dq_stats.
            prom.wait_for('pgdelayq_queue_ready_messages{queue="jobs"}', lambda r: not r, timeout=HANG_S)
            assert values(prom.query("pgdelayq_up")) == {"": 1.0}
            assert "dq_messages" in values(prom.query("pgdelayq_table_dead_tuples"))
            assert len(prom.query("pgdelayq_xmin_horizon_age_seconds")) == 1
            durations = prom.query('pgdelayq_worker_handler_duration_seconds_count{queue="jobs"}')
            assert values(durations) == {"jobs": 7.0}
            # The rules loaded and are evaluated against these series without error.
            deadline = time.monotonic() + HANG_S
            while not ((rules := prom.rules()) and all(rule["health"] == "ok" for rule in rules)):
                assert time.monotonic() < deadline and not any(r["health"] == "err" for r in rules), rules
                time.sleep(0.5)
    finally:
        code, out = stop(worker)
        exporter.terminate()
        exporter_out, _ = exporter.communicate(timeout=HANG_S)
    assert code == 0, out
    assert exporter.returncode == 0, exporter_out
