"""The held-snapshot benchmark (bench.snapshot, `make bench-snapshot`): its verdicts on made-up
samples, and a quick run end to end on a private server of its own."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench import snapshot

PROJECT = Path(__file__).resolve().parents[2]
CPU = {"busy_s": 0.0, "clients_s": 0.0, "server_s": 0.0}


def made_up(p99_ms: dict[str, float], heap: list[int]) -> dict[str, Any]:
    """A report of 20 s clean, 20 s held and 80 s recovery: 100 messages a second, each window's
    messages 1 ms late but the last 2 %, late by the window's p99 figure; a heap sample every 10 s."""
    latency = []
    for w in range(12):
        phase = "clean" if w < 2 else "held" if w < 4 else "recovery"
        late = p99_ms.get(f"{phase}{w}", p99_ms[phase])
        latency += [(w * 10 + i / 100, 1.0) for i in range(980)] + [(w * 10 + 9.8 + i / 1000, late) for i in range(20)]
    samples = [{"t": 10.0 * i + 5, "heap": h, "indexes": 0, "dead": 0, "autovacuums": 0, "vacuums": 0, "cpu": CPU}
               for i, h in enumerate(heap)]
    return {"phases": {"held_at_s": 20.0, "released_at_s": 40.0, "producers_stopped_s": 120.0},
            "samples": samples, "latency": latency}


def test_verdicts_count_from_the_release() -> None:
    steady = [10 * 8192] * 12
    report = made_up({"clean": 5.0, "held": 50.0, "recovery": 5.0}, steady)
    v = snapshot.verdicts(report, snapshot.windows(report))
    assert v["clean_p99_ms"] == pytest.approx(5.0, rel=0.05) and v["held_p99_over_clean"] == pytest.approx(10, rel=0.1)
    assert (v["p99_back_within_2x_after_s"], v["pass_latency"]) == (0.0, True)
    assert (v["heap_flat_after_s"], v["pass_heap"]) == (5.0, True)

    # Slow until the window 100-110 s (70 s after the release), the heap growing until 105 s.
    growing = [8192 * (10 + max(0, min(i, 10) - 3) * 20) for i in range(12)]
    report = made_up({"clean": 5.0, "held": 50.0, "recovery": 5.0, "recovery10": 11.0}, growing)
    v = snapshot.verdicts(report, snapshot.windows(report))
    assert (v["p99_back_within_2x_after_s"], v["pass_latency"]) == (70.0, False)
    assert (v["heap_flat_after_s"], v["pass_heap"]) == (65.0, False)


@pytest.mark.slow
def test_quick_run_reports_every_window_and_both_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "snapshot.json"
    proc = subprocess.run([sys.executable, "-m", "bench.snapshot", "--quick", "--workers", "4", "--out", str(out)],
                          cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["lost"] == 0 and not report["offer_errors"]
    assert [w["phase"] for w in report["windows"]] == ["clean"] * 2 + ["held"] * 3 + ["recovery"] * 7
    assert all(w["p99_ms"] is not None and "heap_bytes" in w for w in report["windows"])
    held = [w["probe_buffers_max"] for w in report["windows"] if w["phase"] == "held"]
    assert held[-1] > held[0], "a poll walks more while the snapshot is held"
    assert {"pass_latency", "pass_heap"} <= set(report["verdicts"])
    assert "PASS" in proc.stdout or "MISS" in proc.stdout
    summary = json.loads(out.with_name("snapshot.summary.json").read_text())
    assert "latency" not in summary and "samples" not in summary
    console = Console(width=200, file=io.StringIO())
    for table in snapshot.tables(summary):
        console.print(table)
