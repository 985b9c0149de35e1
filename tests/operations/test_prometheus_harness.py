"""The real-Prometheus harness (tests/support/prometheus.py) finds what it scrapes: a prometheus_client
HTTP server started here exposes a counter and a gauge, and the values come back through Prometheus'
HTTP API; an expression Prometheus cannot parse is refused with HTTP 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus import PromQLError, free_port, running_prometheus
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


@pytest.fixture
def exposed() -> Iterator[tuple[str, CollectorRegistry]]:
    """A prometheus_client HTTP server on a free port of 127.0.0.1 serving its own registry."""
    registry = CollectorRegistry()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"127.0.0.1:{port}", registry
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_prometheus_scrapes_a_counter_and_answers_queries(
        exposed: tuple[str, CollectorRegistry], tmp_path: Path) -> None:
    address, registry = exposed
    handled = Counter("harness_handled_messages", "Messages handled", ["queue"], registry=registry)
    handled.labels(queue="emails").inc(7)
    with running_prometheus({"harness": [address]}, tmp_path) as prometheus:
        result = prometheus.wait_for('harness_handled_messages_total{queue="emails"}', lambda r: len(r) == 1)
        assert result[0]["metric"] == {"__name__": "harness_handled_messages_total", "queue": "emails",
                                       "job": "harness", "instance": address}
        assert float(result[0]["value"][1]) == 7.0

        handled.labels(queue="emails").inc(5)
        prometheus.wait_for('sum(harness_handled_messages_total{queue="emails"})',
                            lambda r: bool(r) and float(r[0]["value"][1]) == 12.0)
        assert prometheus.query("1 + 1")[0]["value"][1] == "2"
        assert prometheus.query("absent_metric_name") == []

        with pytest.raises(PromQLError) as refused:
            prometheus.query("sum(harness_handled_messages_total")
        assert refused.value.status == 400 and refused.value.error_type == "bad_data", refused.value
        up = prometheus.query('up{job="harness"}')
        assert [float(r["value"][1]) for r in up] == [1.0], prometheus.targets_health()
    assert prometheus.process.poll() is not None, "prometheus still runs after the block"


def test_the_cron_job_label_survives_a_scrape(exposed: tuple[str, CollectorRegistry], tmp_path: Path) -> None:
    """The pg_cron job of the pgdelayq_cron_job_* metrics is labelled ``cron_job``, which a scrape keeps
    as it is; a target's ``job`` label would be renamed ``exported_job`` (``honor_labels: false``, the
    default), since Prometheus keeps ``job`` for the scrape job."""
    address, registry = exposed
    failed = Gauge("pgdelayq_cron_job_last_run_failed", "Last run failed", ["cron_job"], registry=registry)
    failed.labels(cron_job="dq-vacuum").set(1)
    clash = Gauge("clash_example", "A target label named job", ["job"], registry=registry)
    clash.labels(job="dq-vacuum").set(1)
    with running_prometheus({"pgdelayq": [address]}, tmp_path) as prometheus:
        result = prometheus.wait_for("pgdelayq_cron_job_last_run_failed", lambda r: len(r) == 1)
        renamed = prometheus.wait_for("clash_example", lambda r: len(r) == 1)
    assert result[0]["metric"]["job"] == "pgdelayq"
    assert result[0]["metric"]["cron_job"] == "dq-vacuum"
    assert renamed[0]["metric"]["job"] == "pgdelayq" and renamed[0]["metric"]["exported_job"] == "dq-vacuum"
