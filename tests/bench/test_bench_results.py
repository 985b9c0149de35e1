"""The recorded benchmark results (bench/results): each file is its benchmark's summary, holds what the
benchmark's tables (and docs/performance.md, soak.md) show, and is written where bench/README.md says.
No server: the summaries are read as committed."""

from __future__ import annotations

import importlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench import summarize
from bench.lib import report

PROJECT = Path(__file__).resolve().parents[2]
RESULTS = PROJECT / "bench" / "results"
SUMMARIES = sorted(RESULTS.glob("*.json"))


def tables_of(benchmark: str) -> Callable[[dict[str, Any]], list[Any]]:
    module = importlib.import_module(f"bench.{benchmark}")
    if benchmark == "peers":
        return module.rich_tables
    if benchmark == "soak":
        chaos = importlib.import_module("bench.chaos")
        return lambda r: [*chaos.tables(r), *module.soak_tables(r)]
    return module.tables


def test_recorded_results_are_named_by_their_benchmark() -> None:
    assert SUMMARIES
    for path in SUMMARIES:
        data = json.loads(path.read_text())
        assert data["benchmark"] in summarize.BENCHMARKS, path
        assert path.stem == report.result_name(data["benchmark"], data.get("mode") == "quick"), path


@pytest.mark.parametrize("path", SUMMARIES, ids=lambda p: p.name)
def test_a_recorded_result_is_a_small_summary_its_tables_render_from(path: Path, tmp_path: Path) -> None:
    text = path.read_text()
    data = json.loads(text)
    assert len(text) < 40_000, "a summary, not a full report (those go to bench/results/raw/)"
    # Summarizing a summary changes nothing, and python -m bench.summarize names it as it is named.
    written = summarize.summarize(path, tmp_path)
    assert written[0].name == path.name and written[0].read_text() == text
    if data["benchmark"] == "soak":
        assert written[1].read_text() == (RESULTS / "soak.md").read_text()
    tables = tables_of(data["benchmark"])(data)
    console = Console(width=200, file=io.StringIO())
    for table in tables:
        console.print(table)
    assert tables


def test_performance_md_is_what_the_recorded_peers_summary_gives() -> None:
    """docs/performance.md says every figure in it comes from bench/results/peers.json."""
    from bench import peers_report

    md = (PROJECT / "docs" / "performance.md").read_text()
    assert "every figure below comes from `bench/results/peers.json`" in md
    assert peers_report.markdown_report(json.loads((RESULTS / "peers.json").read_text()), "peers.json", md) == md


def test_results_go_to_raw_and_summary_or_beside_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(report, "RAW", tmp_path / "results" / "raw")
    full_report, short = {"mode": "quick", "runs": [1, 2, 3]}, {"mode": "quick"}
    full, summary = report.write_results("core", full_report, short, None, quick=True)
    assert summary == tmp_path / "results" / "core-quick.json"
    assert full.parent == tmp_path / "results" / "raw" and full.name.startswith("core-quick-")
    assert json.loads(full.read_text()) == {"benchmark": "core", **full_report}
    assert json.loads(summary.read_text()) == {"benchmark": "core", **short}

    out = tmp_path / "trial" / "run.json"
    assert report.write_results("spark", full_report, short, out) == (out, out.with_name("run.summary.json"))
    assert sorted(p.name for p in (tmp_path / "trial").iterdir()) == ["run.json", "run.summary.json"]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["core-quick.json", "raw"]


def test_summarize_takes_the_benchmark_from_old_reports_file_names(tmp_path: Path) -> None:
    old = tmp_path / "spark-20261124T034728Z.json"
    old.write_text(json.dumps(report.without(json.loads((RESULTS / "spark.json").read_text()), "benchmark")))
    assert summarize.summarize(old, tmp_path / "out") == [tmp_path / "out" / "spark.json"]
    with pytest.raises(SystemExit, match="no benchmark named 'unknown'"):
        summarize.benchmark_of(tmp_path / "unknown-1.json", {})
