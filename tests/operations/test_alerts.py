"""docs/prometheus/alerts.yml, the alert rules operators load into Prometheus: ``promtool check rules``
accepts them; ``promtool test rules`` runs tests/operations/prometheus/alerts_test.yml, where each alert
fires for some synthetic series and stays quiet for others (a dead-letter queue full of old messages
does not fire the age alert); a real Prometheus loads them, and each rule reads only metrics pgdelayq
serves, has a ``for``, a severity, and a summary and description that point to pages and headings that
exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docblocks import ROOT, heading_anchors
from prometheus import LABELS, SERIES_NAMES, Prometheus, promql_names, running_prometheus

RULES = ROOT / "docs" / "prometheus" / "alerts.yml"
UNIT_TESTS = Path(__file__).parent / "prometheus" / "alerts_test.yml"
OBSERVABILITY = ROOT / "docs" / "observability.md"
SEVERITIES = {"critical", "warning", "info"}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "no promtool on PATH: run scripts/install-os-deps.sh (Debian's prometheus package)"
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_promtool_accepts_the_rules() -> None:
    checked = promtool("check", "rules", RULES)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def test_each_alert_fires_and_stays_quiet_as_its_unit_tests_say() -> None:
    tested = promtool("test", "rules", UNIT_TESTS)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, list[dict[str, Any]]]]:
    """A real Prometheus with the rules loaded, and the rules as its API lists them."""
    with running_prometheus({}, tmp_path_factory.mktemp("rules"), rule_files=[RULES]) as prometheus:
        yield prometheus, prometheus.rules()


def test_every_alert_has_a_case_that_fires_and_one_that_does_not(
        loaded: tuple[Prometheus, list[dict[str, Any]]]) -> None:
    _, rules = loaded
    cases = re.findall(r"alertname: (\w+)\n\s+exp_alerts:( \[\])?", UNIT_TESTS.read_text(encoding="utf-8"))
    fires = {name for name, quiet in cases if not quiet}
    quiet = {name for name, quiet in cases if quiet}
    names = {rule["name"] for rule in rules}
    assert len(names) == len(rules) >= 7, "an alert name is repeated, or rules are missing"
    assert names - fires == set(), "alerts no unit test makes fire"
    assert names - quiet == set(), "alerts no unit test sees quiet"
    assert fires | quiet <= names, "unit tests of alerts that do not exist"


def test_every_rule_reads_our_metrics_and_prometheus_accepts_it(
        loaded: tuple[Prometheus, list[dict[str, Any]]]) -> None:
    prometheus, rules = loaded
    for rule in rules:
        metrics, labels = promql_names(rule["query"])
        assert metrics and metrics <= SERIES_NAMES, f"{rule['name']}: not ours: {metrics - SERIES_NAMES}"
        assert labels <= LABELS, f"{rule['name']}: unknown labels {labels - LABELS}"
        prometheus.query(rule["query"])  # PromQLError if refused


def test_every_alert_waits_has_a_severity_and_says_what_to_do(loaded: tuple[Prometheus, list[dict[str, Any]]]) -> None:
    _, rules = loaded
    documented = heading_anchors(OBSERVABILITY)
    for rule in rules:
        name = rule["name"]
        assert rule["type"] == "alerting" and rule["duration"] > 0, f"{name}: no for:"
        assert rule["labels"].get("severity") in SEVERITIES, name
        summary, description = rule["annotations"].get("summary"), rule["annotations"].get("description")
        assert summary and description, f"{name}: summary and description"
        references = re.findall(r"docs/([\w/]+\.md)#([\w-]+)", description)
        assert references, f"{name}: the description points to no section of the docs"
        for page, anchor in references:
            assert anchor in heading_anchors(ROOT / "docs" / page), f"{name}: docs/{page}#{anchor} does not exist"
        assert name.lower() in documented, f"{name}: no heading in docs/observability.md"
