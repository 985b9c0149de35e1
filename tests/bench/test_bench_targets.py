"""bench.targets' report from a small synthetic result: the medians, spreads and verdicts, its
tables and summary, and the table docs/performance.md quotes from the recorded summary. No server."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from bench import targets

PROJECT = Path(__file__).resolve().parents[2]


def run(dq: float, baseline: float, other: float = 0.05) -> dict[str, Any]:
    return {"dq": {"rows_per_s": dq, "other_cpu": other, "details": {"rows_per_s": dq}},
            "baseline": {"rows_per_s": baseline, "other_cpu": other, "details": {"rows_per_s": baseline}},
            "ratio": dq / baseline}


def figure(key: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What targets.measure returns for these runs (its aggregation, repeated on purpose)."""
    f = targets.BY_KEY[key]
    ratios = sorted(r["ratio"] for r in runs)
    median = ratios[len(ratios) // 2]
    return {**asdict(f), "ratio": median, "ratio_min": ratios[0], "ratio_max": ratios[-1],
            "dq_rows_per_s": sorted(r["dq"]["rows_per_s"] for r in runs)[1],
            "baseline_rows_per_s": sorted(r["baseline"]["rows_per_s"] for r in runs)[1],
            "other_cpu_max": 0.05, "pass": None if f.target is None else median >= f.target, "runs": runs}


def synthetic() -> dict[str, Any]:
    return {
        "timestamp": "2026-01-01T00:00:00+00:00", "mode": "full", "wall_time_s": 300.0,
        "server": {"version": "PostgreSQL 15"}, "source": {"git_head": "0123456789abcdef"},
        "config": asdict(targets.FULL),
        "figures": [
            figure("offer", [run(700, 1000), run(720, 1000), run(690, 1000)]),
            figure("offer_many", [run(95, 100), run(85, 100), run(91, 100)]),  # median 0.91: PASS
            figure("workers16", [run(80, 100), run(95, 100), run(70, 100)]),  # median 0.80: MISS
        ],
    }


def test_verdicts_follow_the_median_ratio_and_rows_without_a_target_have_none() -> None:
    report = synthetic()
    text = targets.markdown(targets.summary(report))
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| ")}
    assert rows["dq_offer_many x100, 4 clients"].endswith("| 0.91 | 0.85–0.95 | 5% | ≥ 0.90 | PASS |")
    assert rows["16 sync workers"].endswith("| 0.80 | 0.70–0.95 | 5% | ≥ 0.90 | MISS |")
    assert rows["dq_offer, 4 clients"].endswith("| 0.70 | 0.69–0.72 | 5% |  |  |")
    assert "commit 0123456" in text and "median of 3 runs" in text


def test_summary_keeps_each_runs_ratio_and_rates_without_details_and_tables_render() -> None:
    summary = targets.summary(synthetic())
    run0 = summary["figures"][1]["runs"][0]
    assert run0 == {"ratio": 0.95, "dq": {"rows_per_s": 95, "other_cpu": 0.05},
                    "baseline": {"rows_per_s": 100, "other_cpu": 0.05}}
    console = Console(width=200, file=io.StringIO())
    for table in targets.tables(summary):
        console.print(table)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "PASS" in out and "MISS" in out


def test_performance_md_quotes_the_recorded_targets_summary() -> None:
    recorded = json.loads((PROJECT / "bench" / "results" / "targets.json").read_text())
    assert recorded["mode"] == "full" and recorded["config"]["repeat"] >= 3
    assert targets.markdown(recorded) in (PROJECT / "docs" / "performance.md").read_text()
