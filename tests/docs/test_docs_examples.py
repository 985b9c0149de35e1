"""Every Python example of docs/python.md runs as written, in a real interpreter, against a fresh
database, and prints what the comment above it says (``<!-- test: … -->``, see tests/support/docblocks.py).
Blocks marked ``worker`` run a worker until SIGTERM: the test waits for their expected output,
sends the signal, and the worker must then stop cleanly (exit status 0)."""

from __future__ import annotations

import pytest
from docblocks import ROOT, Block, code_blocks, run_python

PYTHON_MD = ROOT / "docs" / "python.md"
BLOCKS = code_blocks(PYTHON_MD, "python")


def test_python_md_has_its_examples_and_each_says_what_it_prints() -> None:
    assert len(BLOCKS) >= 10, [b.name for b in BLOCKS]
    unmarked = [b.name for b in BLOCKS if not b.expect]
    assert not unmarked, f"python blocks without <!-- test: expect \"…\" --> above them: {unmarked}"
    assert sum(b.worker for b in BLOCKS) >= 3  # the sync, exactly-once and async workers


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"line{b.line}")
def test_python_md_example_runs(block: Block, dsn: str) -> None:
    proc = run_python(block, dsn, timeout=120)
    assert proc.returncode == 0, f"{block.name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    missing = [e for e in block.expect if e not in proc.stdout]
    assert not missing, f"{block.name}: {missing} not in the output:\n{proc.stdout}\n{proc.stderr}"
