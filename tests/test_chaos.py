"""The fault-injection run (bench.chaos, `make chaos`) in short: both modes side by side for 28 s
on a private server of its own, under SIGKILLed consumers, terminated connections, an immediate
server restart and a 20 s pinned xmin. Nothing may be lost, the exactly-once ledger must hold one
row per acknowledged key, every at-least-once duplicate must be matched to a fault, the consumers
must recover by themselves, and every kind of fault must actually have been injected."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_short_chaos_run_loses_nothing_and_recovers(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--duration", "28", "--mode", "both", "--seed", "7", "--out", str(out)],
        cwd=PROJECT, env=dict(os.environ, COLUMNS="160"), capture_output=True, text=True, timeout=300,
    )
    assert out.exists(), proc.stdout[-5000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    assert report["failures"] == [], proc.stdout[-5000:]
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]

    assert all(report["faults_injected"][kind] >= 1 for kind in ("kill", "terminate", "restart", "pin")), \
        report["faults_injected"]
    pin = next(f for f in report["faults"] if f["kind"] == "pin")
    assert pin["error"] is None and pin["detail"]["seconds"] >= 19.5, pin
    restart = next(f for f in report["faults"] if f["kind"] == "restart")
    assert restart["error"] is None, restart

    eo, alo = report["modes"]["exactly-once"], report["modes"]["at-least-once"]
    for mode in (eo, alo):
        assert mode["offered"] > 1000, mode
        assert mode["lost"] == 0 and mode["told_committed_but_not_in_database"] == [] and mode["phantom_keys"] == []
        assert mode["acknowledged"] + mode["live_at_end"] + mode["dead_letters"] == mode["offered"]
        assert mode["recovered"], mode["deliveries_after_last_fault_by_consumer"]
        assert mode["unknown_resolved"]["committed"] + mode["unknown_resolved"]["not committed"] + \
            sum(n for k, n in mode["producer_statuses"].items() if k.endswith(" ok")) == mode["attempted"]
    assert eo["ledger_exactly_once"] and eo["duplicates"] == 0 and eo["ledger_rows"] == eo["acknowledged"]
    assert alo["unexplained_duplicates"] == 0, alo["unexplained_examples"]

    # The private server is gone: its data directory removed, its port closed.
    assert not Path(report["server"]["datadir"]).exists()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", report["server"]["port"])) != 0
