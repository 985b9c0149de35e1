"""The database's metrics (pyqueue.metrics.QueueMetricsCollector and ``pyqueue metrics``), against
the real server, read as Prometheus reads them (prometheus_client's parser): after a known workload
the queue gauges say what dq_stats says; the exporter works as a login role holding only dq_viewer;
a snapshot held open in another session shows as a growing xmin horizon age; a database that does
not answer within the statement timeout, or refuses the login, gives ``pgdelayq_up 0`` rather than
a failed scrape; and the number of series does not grow with the number of keys."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import make_conninfo
from workerhandlers import HANG_S, SUPPORT

from pyqueue import DelayedQueue
from pyqueue.metrics import QueueMetricsCollector, queue_registry

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def scrape_registry(registry: CollectorRegistry) -> Samples:
    return parse(generate_latest(registry).decode())


def q(name: str) -> tuple[tuple[str, str], ...]:
    return (("queue", name),)


@pytest.fixture
def registry_of() -> Iterator[Callable[..., CollectorRegistry]]:
    """``registry_of(conninfo, **options)``: a registry holding a QueueMetricsCollector, whose
    connection is closed after the test."""
    made: list[QueueMetricsCollector] = []

    def make(conninfo: str, **options: Any) -> CollectorRegistry:
        collector = QueueMetricsCollector(conninfo, **options)
        made.append(collector)
        registry = CollectorRegistry()
        registry.register(collector)
        return registry

    yield make
    for collector in made:
        collector.close()


@pytest.fixture
def workload(dsn: str) -> Iterator[str]:
    """Queue 'jobs': 5 ready, 3 scheduled, 2 in flight (one redelivered), 1 dead letter in 'jobs_dlq',
    2 blocked (waiting for a scheduled one); queue 'slow' paused with a rate limit and an in-flight limit."""
    with DelayedQueue(dsn, "jobs") as jobs, DelayedQueue(dsn, "slow") as slow:
        jobs.configure(max_deliveries=1, dead_letter_queue="jobs_dlq")
        jobs.offer_many([(f"dead-{i}", "x") for i in range(1)])
        [m] = jobs.poll(1)
        m.nack(0)  # its one delivery: dead-lettered
        jobs.offer_many([(f"fly-{i}", "x") for i in range(2)])
        jobs.poll(2)
        jobs.offer_many([(f"ready-{i}", "x") for i in range(5)])
        for i in range(3):
            jobs.offer(f"later-{i}", "x", delay=3600)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for key in ("then-0", "then-1"):
                conn.execute("""SELECT dq_offer('jobs', %s, 'x'::text, after => '["later-0"]')""", (key,))
        slow.configure(max_in_flight=4, rate_limit=10, rate_period=60)
        slow.offer("s", "x")
        slow.pause()
    yield dsn


def test_queue_gauges_say_what_dq_stats_says(workload: str, registry_of: Callable[..., CollectorRegistry]) -> None:
    registry = registry_of(workload)
    found = scrape_registry(registry)
    assert found[("pgdelayq_up", ())] == 1
    assert found[("pgdelayq_queue_ready_messages", q("jobs"))] == 5
    assert found[("pgdelayq_queue_scheduled_messages", q("jobs"))] == 3
    assert found[("pgdelayq_queue_in_flight_messages", q("jobs"))] == 2
    assert found[("pgdelayq_queue_blocked_messages", q("jobs"))] == 2
    assert found[("pgdelayq_queue_dead_messages", q("jobs"))] == 1
    assert found[("pgdelayq_queue_is_dead_letter_queue", q("jobs_dlq"))] == 1
    assert found[("pgdelayq_queue_is_dead_letter_queue", q("jobs"))] == 0
    assert found[("pgdelayq_queue_paused", q("slow"))] == 1
    assert found[("pgdelayq_queue_paused", q("jobs"))] == 0
    assert found[("pgdelayq_queue_max_in_flight", q("slow"))] == 4
    assert found[("pgdelayq_queue_rate_limit_messages", q("slow"))] == 10
    assert found[("pgdelayq_queue_rate_limit_period_seconds", q("slow"))] == 60
    assert ("pgdelayq_queue_max_in_flight", q("jobs")) not in found  # no limit: no sample
    assert found[("pgdelayq_queue_oldest_ready_age_seconds", q("jobs"))] >= 0
    assert found[("pgdelayq_queue_next_due_timestamp_seconds", q("jobs"))] > time.time() + 3000
    with psycopg.connect(workload, autocommit=True) as conn:
        stats = {r[0]: r[1:] for r in conn.execute(
            "SELECT queue, ready, scheduled, in_flight, dead, blocked FROM dq_stats")}
    for name, (ready, scheduled, in_flight, dead, blocked) in stats.items():
        assert found[("pgdelayq_queue_blocked_messages", q(name))] == blocked
        assert found[("pgdelayq_queue_ready_messages", q(name))] == ready
        assert found[("pgdelayq_queue_scheduled_messages", q(name))] == scheduled
        assert found[("pgdelayq_queue_in_flight_messages", q(name))] == in_flight
        assert found[("pgdelayq_queue_dead_messages", q(name))] == dead
    # Table health: the queue table's figures are there, labelled by table.
    assert found[("pgdelayq_table_live_tuples", (("table", "dq_messages"),))] >= 0
    assert found[("pgdelayq_xmin_horizon_age_seconds", ())] >= 0


def test_the_exporter_needs_only_dq_viewer(workload: str, login: Callable[[str], str],
                                           registry_of: Callable[..., CollectorRegistry]) -> None:
    viewer = login("dq_viewer")
    found = scrape_registry(registry_of(viewer))
    assert found[("pgdelayq_up", ())] == 1
    assert found[("pgdelayq_queue_ready_messages", q("jobs"))] == 5
    assert ("pgdelayq_table_dead_tuples", (("table", "dq_messages"),)) in found
    with psycopg.connect(viewer, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT dq_offer('jobs', 'nope', 'x'::bytea)")


def test_a_held_snapshot_shows_as_a_growing_xmin_horizon_age(
        dsn: str, registry_of: Callable[..., CollectorRegistry]) -> None:
    registry = registry_of(dsn)
    before = scrape_registry(registry)[("pgdelayq_xmin_horizon_age_seconds", ())]
    with psycopg.connect(dsn) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM dq_messages")  # the snapshot is taken and held
        time.sleep(2.5)
        held = scrape_registry(registry)[("pgdelayq_xmin_horizon_age_seconds", ())]
        holder.rollback()
    assert held >= 2.0 > before
    after = scrape_registry(registry)[("pgdelayq_xmin_horizon_age_seconds", ())]
    assert after < held


def test_a_database_slower_than_the_statement_timeout_reports_down(
        dsn: str, registry_of: Callable[..., CollectorRegistry]) -> None:
    registry = registry_of(dsn, statement_timeout=0.5)
    assert scrape_registry(registry)[("pgdelayq_up", ())] == 1
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE dq_messages IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        found = scrape_registry(registry)
        took = time.monotonic() - started
        locker.rollback()
    assert found[("pgdelayq_up", ())] == 0
    assert not any(name.startswith("pgdelayq_queue_") for name, _ in found)
    assert took < 5, took
    assert scrape_registry(registry)[("pgdelayq_up", ())] == 1  # reconnected after the failure


def test_a_refused_login_reports_down(dsn: str) -> None:
    found = scrape_registry(queue_registry(make_conninfo(dsn, password="wrong", user="nobody_here")))  # no connection
    assert found[("pgdelayq_up", ())] == 0


def test_series_do_not_grow_with_keys(dsn: str, registry_of: Callable[..., CollectorRegistry]) -> None:
    registry = registry_of(dsn)
    with DelayedQueue(dsn, "jobs") as jobs:
        jobs.offer("one", "x")
        few = {k for k in scrape_registry(registry) if k[0].startswith("pgdelayq_queue_")}
        jobs.offer_many([(f"key-{i}", "x") for i in range(1000)])
        many = {k for k in scrape_registry(registry) if k[0].startswith("pgdelayq_queue_")}
    assert few == many


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pyqueue_metrics_serves_over_http(workload: str) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pyqueue", "metrics", "--dsn", workload, "--port", str(port)],
                            cwd=SUPPORT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + HANG_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    text = r.read().decode()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        found = parse(text)
        assert found[("pgdelayq_queue_ready_messages", q("jobs"))] == 5
        assert found[("pgdelayq_up", ())] == 1
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, out


def test_concurrent_scrapes_share_one_connection(dsn: str, registry_of: Callable[..., CollectorRegistry]) -> None:
    registry = registry_of(dsn)
    results: list[float] = []

    def one() -> None:
        results.append(scrape_registry(registry)[("pgdelayq_up", ())])

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
    assert results == [1.0] * 8
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pyqueue metrics'"
                            ).fetchone() == (1,)
