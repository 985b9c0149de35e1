"""Every Python example of docs/python.md, docs/cron.md and docs/workflows.md runs as written, in a real interpreter,
against a fresh database, and prints what the comment above it says (``<!-- test: … -->``, see
tests/support/docblocks.py). Blocks marked ``worker`` run a worker until SIGTERM: the test waits for their
expected output, sends the signal, and the worker must then stop cleanly (exit status 0).

Each page's examples also run all in order in one interpreter against one database, as a reader
pastes them one after the other (each worker stopped with Ctrl-C): each example works on a queue
of its own and leaves nothing behind that the next one trips over."""

from __future__ import annotations

import pytest
from docblocks import ROOT, Block, code_blocks, run_python, run_python_in_order

PYTHON_MD = ROOT / "docs" / "python.md"
BLOCKS = code_blocks(PYTHON_MD, "python")
PAGES = [PYTHON_MD, ROOT / "docs" / "cron.md", ROOT / "docs" / "workflows.md"]
ALL_BLOCKS = [block for page in PAGES for block in code_blocks(page, "python")]
#: At most this many python blocks of these pages may be marked ``skip "REASON"`` (not run).
MOST_SKIPPED = 1


def test_python_md_has_its_examples_and_each_says_what_it_prints() -> None:
    assert len(BLOCKS) >= 10, [b.name for b in BLOCKS]
    unmarked = [b.name for b in BLOCKS if not b.expect]
    assert not unmarked, f"python blocks without <!-- test: expect \"…\" --> above them: {unmarked}"
    assert sum(b.worker for b in BLOCKS) >= 3  # the sync, exactly-once and async workers


def test_every_python_block_of_the_pages_runs_or_says_why_not() -> None:
    assert {b.path for b in ALL_BLOCKS} == set(PAGES), "each page has python examples"
    unmarked = [b.name for b in ALL_BLOCKS if not b.expect and not b.skip]
    assert not unmarked, f"python blocks with neither an expect nor a skip \"reason\": {unmarked}"
    skipped = [f"{b.name}: {b.skip}" for b in ALL_BLOCKS if b.skip is not None]
    assert len(skipped) <= MOST_SKIPPED, f"too many examples are not run: {skipped}"


def as_params(blocks: list[Block]) -> list[object]:
    return [pytest.param(b, id=f"{b.path.stem}-line{b.line}",
                         marks=[pytest.mark.skip(reason=b.skip)] if b.skip is not None else [])
            for b in blocks]


@pytest.mark.slow
@pytest.mark.parametrize("block", as_params(ALL_BLOCKS))
def test_example_runs(block: Block, dsn: str) -> None:
    proc = run_python(block, dsn, timeout=120)
    assert proc.returncode == 0, f"{block.name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    missing = [e for e in block.expect if e not in proc.stdout]
    assert not missing, f"{block.name}: {missing} not in the output:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_pages_examples_run_one_after_the_other_in_one_interpreter(page: object, dsn: str) -> None:
    blocks = [b for b in ALL_BLOCKS if b.path == page and b.skip is None]
    outputs = run_python_in_order(blocks, dsn, timeout=120)
    assert list(outputs) == [b.name for b in blocks]
    missing = {b.name: [e for e in b.expect if e not in outputs[b.name]] for b in blocks}
    assert not any(missing.values()), f"{missing} not in the outputs:\n{outputs}"
