"""The main job, small: real producer, the psql program, real consumer processes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_delivers_everything_once(dsn: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pyqueue.demo", "--dsn", dsn, "--messages", "600", "--spread", "2",
         "--consumers", "2", "--psql-batch", "50"],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # exit status 0 already means lost == 0 and duplicates == 0; check the summary says so too
    assert re.search(r"offered \(python / psql\)\s*│\s*600 / 50", out), out
    assert re.search(r"delivered \(distinct keys\)\s*│\s*650\b", out), out
    assert re.search(r"duplicates \(keys received more than once\)\s*│\s*0\b", out), out
    assert re.search(r"lost \(offered, never received\)\s*│\s*0\b", out), out
