"""docs/grafana/pgdelayq.json, the Grafana dashboard: it parses, imports with one Prometheus data source
(``${DS_PROMETHEUS}``), its panels fit the grid, every query reads only metrics and labels pgdelayq
serves, the metrics left off the dashboard are the listed ones, and a real Prometheus accepts every
query once Grafana's variables are replaced as Grafana does."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from docblocks import ROOT
from prometheus import (
    LABELS,
    METRIC_NAMES,
    SERIES_NAMES,
    WORKER_HISTOGRAMS,
    Prometheus,
    promql_names,
    running_prometheus,
)

DASHBOARD = ROOT / "docs" / "grafana" / "pgdelayq.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

#: Metrics the dashboard does not draw, and why: a timestamp and settings read better in dq_stats and
#: dq_configure_queue, and the health figures below have a closer figure on the dashboard.
NOT_DRAWN = {
    "pgdelayq_queue_next_due_timestamp_seconds",  # a point in time; dq_stats shows it
    "pgdelayq_queue_rate_limit_period_seconds",  # a setting; the rate-limit use is drawn
    "pgdelayq_table_live_tuples",  # the dead tuple ratio is drawn
    "pgdelayq_table_last_autovacuum_timestamp_seconds",  # last_vacuum is the latest of both
    "pgdelayq_table_last_autoanalyze_timestamp_seconds",
    "pgdelayq_xmin_horizon_age_transactions",  # the age in seconds is drawn
    "pgdelayq_cron_job_last_start_timestamp_seconds",  # failures are drawn
}


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


def as_grafana_sends(expr: str) -> str:
    """``expr`` as Grafana sends it: interval variables as durations, ``$queue`` (all selected) as ``.*``."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def test_the_dashboard_imports_with_one_prometheus_data_source() -> None:
    board = dashboard()
    assert len(expressions()) >= 20
    assert board["schemaVersion"] >= 36 and board["uid"] and board["title"]
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    assert board["__inputs"][0]["pluginId"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"] and all(t["datasource"] == DATASOURCE for t in panel["targets"]), panel["title"]
        assert panel["title"] and panel["description"], panel["id"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
    for variable in board["templating"]["list"]:
        assert variable["datasource"] == DATASOURCE, variable["name"]


def test_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_query_reads_our_metrics_and_labels() -> None:
    drawn: set[str] = set()
    for title, expr in expressions():
        metrics, labels = promql_names(as_grafana_sends(expr))
        assert metrics and metrics <= SERIES_NAMES, f"{title}: not ours: {metrics - SERIES_NAMES}"
        assert labels <= LABELS, f"{title}: unknown labels {labels - LABELS}"
        drawn |= metrics
    for variable in dashboard()["templating"]["list"]:
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"])
        assert m and m.group(1) in SERIES_NAMES and m.group(2) in LABELS, variable["name"]
    drawn |= {name for name in WORKER_HISTOGRAMS if any(s.startswith(name) for s in drawn)}
    assert METRIC_NAMES - drawn == NOT_DRAWN, "update NOT_DRAWN, or draw the metric"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with running_prometheus({}, tmp_path_factory.mktemp("dashboard")) as server:
        yield server


@pytest.mark.parametrize(("title", "expr"), expressions())
def test_prometheus_accepts_every_query(prometheus: Prometheus, title: str, expr: str) -> None:
    prometheus.query(as_grafana_sends(expr))  # PromQLError (HTTP 400) if it cannot parse it
