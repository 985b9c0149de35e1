"""bench.workflows at a tiny size: every shape runs against a real server, the fan-out goes through the
release backlog, every child reaches the idle consumer, and the tables print from the summary."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from bench import workflows


def test_a_small_run_measures_every_shape(admin_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "workflows.json"
    workflows.main(["--dsn", admin_dsn, "--size", "700", "--repeat", "1", "--out", str(out),
                    "--db-name", "dq_bench_workflows_test"])
    report = json.loads(out.read_text())
    assert report["size"] == 700 and report["release_inline"] == 500  # 200 children went through the backlog
    (run,) = report["fan_out"]
    assert 0 < run["first_child_ms"] <= run["all_children_ms"]
    assert report["fan_in"][0]["offer_ms"] > 0 and report["fan_in"][0]["ack"]["p50"] > 0
    assert report["plain"][0]["baseline_delete"]["p99"] > 0
    summary = json.loads(out.with_name("workflows.summary.json").read_text())
    assert set(summary) >= {"fan_out", "fan_in", "plain", "size", "release_inline"}
    console = Console(width=200, file=io.StringIO())
    for table in workflows.tables(summary):
        console.print(table)
    assert "first child delivered" in console.file.getvalue()  # type: ignore[attr-defined]
