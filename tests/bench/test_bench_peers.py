"""bench.peers' report (bench.peers_report: docs/performance.md, the terminal tables, the verdicts)
from a small synthetic result: no server, no peer library, no timing."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import peers, peers_report


def _enqueue(library: str, single: float, batched: float) -> dict[str, Any]:
    def run(rate: float, batch: int) -> dict[str, Any]:
        return {"batch": batch, "jobs": 5000, "elapsed_s": 5000 / rate, "rows_per_s": rate, "capped": rate < 1000,
                "client_us_per_row": 100.0, "server_us_per_row": 50.0, "other_cpu": 0.1}

    return {"library": library, "api": {"single": f"{library}.one", "batched": f"{library}.many"},
            "single": run(single, 1), "batched": run(batched, 1000)}


def _cell(key: str, workers: int, rate: float, capped: bool = False) -> dict[str, Any]:
    return {"contender": key, "workers": workers, "rows_per_s": rate, "processed": 5000, "capped": capped,
            "elapsed_s": 5000 / rate, "consumer_us_per_row": 80.0, "server_us_per_row": 60.0,
            "xacts_per_row": 0.03, "other_cpu": 0.05}


def _lateness(p50: float) -> dict[str, Any]:
    return {"jobs": 100, "handled": 100, "lost": 0, "duplicates": 0, "p50_ms": p50, "p99_ms": p50 * 3,
            "max_ms": p50 * 4, "min_ms": 1.0, "mean_ms": p50}


def synthetic_result() -> dict[str, Any]:
    cfg = peers.QUICK
    result: dict[str, Any] = {
        "timestamp": "2026-01-01T00:00:00+00:00", "mode": "quick", "wall_time_s": 100.0, "config": asdict(cfg),
        "server": {"version": "PostgreSQL 15.0 on x86_64", "shared_buffers": "512MB", "max_connections": "300"},
        "versions": {"pgdelayq": "0.0", "procrastinate": "3.10.0", "pgqueuer": "1.6.0"},
        "machine": {"cpu_count": 2, "cpu_model": "test CPU", "mem_total_kb": 8 * 1024 ** 2, "platform": "Linux",
                    "load_average": (0.5, 0.4, 0.3)},
        "load_average_after": (1.0, 0.6, 0.4),
        "contenders": [asdict(c) for c in [*peers.contenders(cfg), peers.BASELINE_CONTENDER]],
        "enqueue": [_enqueue("pgdelayq", 2000, 20000), _enqueue("procrastinate", 300, 4000),
                    _enqueue("pgqueuer", 1500, 9000), _enqueue("baseline", 2500, 25000)],
        "throughput": [
            _cell("dq-sync", 1, 2000), _cell("dq-async", 1, 5000), _cell("procrastinate", 1, 150, capped=True),
            _cell("pgqueuer-b100", 1, 2000), _cell("baseline", 1, 9000),
            _cell("dq-sync", 4, 3000), _cell("dq-async", 4, 7000), _cell("procrastinate", 4, 250, capped=True),
            _cell("pgqueuer-b100", 4, 4000), _cell("baseline", 4, 12000),
        ],
        "latency": [{"contender": c.key, "workers": 4, "now": _lateness(10.0), "delayed": _lateness(5.0)}
                    for c in peers.contenders(cfg)],
    }
    result["targets"] = peers_report.targets(result)
    result["faster_ours"] = peers_report.faster_ours(result)
    return result


def test_targets_compare_our_faster_configuration_with_the_best_peer() -> None:
    result = synthetic_result()
    t = result["targets"]
    assert [(x["workers"], x["ours"], x["best_peer"]) for x in t["throughput"]] == [
        (1, "dq-async", "pgqueuer-b100"), (4, "dq-async", "pgqueuer-b100")]
    assert [x["pass"] for x in t["throughput"]] == [True, False]  # 5000/2000 = 2.5, 7000/4000 = 1.75
    assert t["enqueue"] == {"ratio": 0.8, "target": 0.7, "pass": True}
    assert result["faster_ours"] == "dq-async"


def test_targets_against_the_baseline_and_of_the_sync_worker() -> None:
    t = synthetic_result()["targets"]
    # 1 process: the --async worker ≥ 70% of one baseline client (5000 / 9000); 4: ≥ 90% (7000 / 12000).
    assert [(x["workers"], x["ours"], round(x["ratio"], 3), x["target"], x["pass"]) for x in t["baseline"]] == [
        (1, "dq-async", 0.556, 0.70, False), (4, "dq-async", 0.583, 0.90, False)]
    assert [(x["workers"], round(x["ratio"], 3), x["pass"]) for x in t["sync"]] == [(1, 0.4, False), (4, 0.429, False)]
    rows = peers_report.target_rows(synthetic_result())
    assert ["processing, 1 worker: ours ≥ 70% of the baseline",
            "pgdelayq (--async worker) 5,000 / baseline 9,000 = 56%", "MISS"] in rows
    assert ["processing, 4 workers: sync ≥ 80% of async", "3,000 / 7,000 = 43%", "MISS"] in rows


def test_markdown_report_has_a_table_per_workload_and_keeps_the_notes() -> None:
    result = synthetic_result()
    first = peers_report.markdown_report(result, "peers.json")
    for heading in ("## Enqueue", "## Processing a backlog", "## Latency", "## Targets", "## Environment"):
        assert heading in first
    assert "| pgqueuer (batch 100) | 2,000 | 4,000 |" in first
    assert "| procrastinate | 150† | 250† |" in first
    assert "| batched enqueue ≥ 70% of the baseline | 80% | PASS |" in first
    assert "2 cores (test CPU), 8.0 GiB RAM" in first
    assert "`shared_buffers = 512MB`" in first and "procrastinate 3.10.0" in first
    # Every table row has as many cells as its header (escaped pipes inside cells do not count).
    for block in first.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        widths = {ln.replace("\\|", "").count("|") for ln in lines}
        assert len(widths) <= 1, block
    edited = first.replace("(No notes yet.)", "Where the time goes: measured by hand.")
    second = peers_report.markdown_report(result, "peers.json", previous=edited)
    assert "Where the time goes: measured by hand." in second
    assert "(No notes yet.)" not in second


def test_terminal_tables_render() -> None:
    from rich.console import Console

    console = Console(width=200, record=True)
    for table in peers_report.rich_tables(synthetic_result()):
        console.print(table)
    text = console.export_text()
    assert "pgdelayq (--async worker)" in text and "MISS" in text and "PASS" in text


def test_chart_is_written(tmp_path: Path) -> None:
    path = tmp_path / "performance.png"
    peers_report.chart(synthetic_result(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_keeps_what_the_report_shows() -> None:
    result = synthetic_result()
    for cell in result["throughput"]:
        cell.update(functions={"dq_poll_many": {"calls": 50, "total_ms": 80.0}}, worker_warnings=["WARNING x"],
                    exit_codes=[0], per_worker_delivered=[5000])
    short = peers_report.summary(result)
    assert not any({"functions", "worker_warnings", "exit_codes"} & set(c) for c in short["throughput"])
    assert peers_report.markdown_report(short, "peers.json") == peers_report.markdown_report(result, "peers.json")
