"""The delivery-controls benchmark (bench.controls, `make bench-controls`) at a tiny size, on the
test server: every part runs end to end and reports what the rules guarantee."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from bench import controls_config, controls_parts

PROJECT = Path(__file__).resolve().parents[2]


def test_max_in_window_counts_half_open_windows() -> None:
    assert controls_parts.max_in_window([], 1_000_000) == (0, 0)
    assert controls_parts.max_in_window([0, 500_000, 999_999, 1_000_000], 1_000_000) == (3, 0)
    assert controls_parts.max_in_window([0, 1_000_000, 1_200_000, 1_999_999, 2_000_000], 1_000_000) == (3, 1_000_000)


def test_rate_analysis_counts_the_measured_part_and_every_window() -> None:
    cfg = replace(controls_config.QUICK, rate_limit=10, rate_period_s=1.0, rate_warmup_s=1.0, rate_s=2.0)
    # A burst of 10 at the start of every second, for 4 seconds: 10 per second, never 11 in a window.
    claimed = [s * 1_000_000 + i for s in range(4) for i in range(10)]
    r = controls_parts.rate_analysis(claimed, cfg)
    assert (r["deliveries"], r["measured_deliveries"], r["rate_per_s"]) == (40, 20, 10.0)
    assert r["per_period"]["values"] == [10.0, 10.0]
    assert (r["max_in_any_period"], r["pass_window"], r["pass_rate"]) == (10, True, True)
    r = controls_parts.rate_analysis([*claimed, 1_999_999], cfg)  # one more just before the third burst
    assert (r["max_in_any_period"], r["pass_window"]) == (11, False)


def test_condense_plans_keeps_long_plans_and_counts_short_ones() -> None:
    lines = ["duration: 0.500 ms  plan:\nQuery Text: SELECT 1\nResult",
             "duration: 0.010 ms  plan:\nQuery Text: SELECT  2\nResult",
             "duration: 0.020 ms  plan:\nQuery Text: SELECT 2\nResult"]
    out = controls_parts.condense_plans(lines)
    assert out["plans"] == lines[:1]
    assert out["shorter"] == [{"query": "Query Text: SELECT 2", "calls": 2, "total_ms": pytest.approx(0.03)}]


@pytest.mark.slow
def test_tiny_run_reports_every_part(admin_dsn: str, tmp_path: Path) -> None:
    prefix = f"dq_test_controls_{os.getpid()}"
    out = tmp_path / "controls.json"
    command = [sys.executable, "-m", "bench.controls", "--dsn", admin_dsn, "--quick", "--rows", "30000",
               "--repeat", "1", "--clients", "2", "--rate-seconds", "3", "--old-ref", "HEAD", "--db-prefix", prefix,
               "--levels", "1,300", "--level-samples", "3", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(PROJECT))
    try:
        done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            for name in (prefix, f"{prefix}_old"):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    head = subprocess.run(["git", "-C", str(PROJECT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert report["old_source"]["commit"] == head

    cells = report["regression"]
    assert [(c["workload"], c["clients"]) for c in cells] == [
        ("offer_many x100", 2), ("offer_many x1000", 2), ("poll+ack x1", 2), ("poll+ack x100", 2)]
    for c in cells:
        assert all(c["rows_per_s"][side]["median"] > 0 for side in ("new", "old", "baseline")), c["workload"]
        assert c["new_vs_old"] > 0

    backlogs = {b["backlog"]: b for b in report["backlog"]["backlogs"]}
    assert list(backlogs) == ["plain", "priorities", "groups", "baseline"]
    assert backlogs["groups"]["groups"] == 3000 and backlogs["priorities"]["levels"] == 5
    for name, b in backlogs.items():
        assert b["rows"] == 30000 and b["poll_p50_ms"] > 0 and b["drain_rows_per_s"]["median"] > 0, name
        assert 0 < b["poll_sizes_mean"] <= controls_config.POLL_BATCH, name
        assert any("Query Text" in plan for plan in b["plan"]["plans"]), name
    assert backlogs["plain"]["drain_vs_plain"] == 1.0

    rate = report["rate"]
    assert rate["rate_limit"] == 1000 and rate["workers"] == 8 and rate["left"] > 0
    assert rate["deliveries"] == sum(rate["per_worker_deliveries"]) > 0
    # The rule itself: never more than rate_limit deliveries in any window of rate_period.
    assert rate["max_in_any_period"] <= 1000
    assert rate["rate_per_s"] <= 1000

    # Part 4: every level count and layout, each poll checked to return what was due (none, then one).
    levels = report["levels"]["cells"]
    assert [(c["levels"], c["layout"]) for c in levels] == [
        (n, layout) for n in (1, 300) for layout in ("ungrouped", "grouped", "baseline")]
    for c in levels:
        assert c["empty"]["samples"] == c["one_due"]["samples"] == 3, c
        assert c["empty"]["p50_ms"] > 0 and c["one_due"]["p50_ms"] > 0 and c["one_due"]["buffers"] > 0, c
        assert ("wait" in c) == (c["layout"] != "baseline"), c
    # 300 levels of future messages: past the skip scan's 128 levels, one pass over the rest.
    by_cell = {(c["levels"], c["layout"]): c for c in levels}
    assert by_cell[(300, "ungrouped")]["empty"]["buffers"] < 300 * 6, by_cell[(300, "ungrouped")]
