"""docs/workflows.md shows what it says: its psql example prints the dependency it describes, and its
daily ETL example, run as written by a real worker process, runs each step only after its parents
were acknowledged (the order of the ``done`` lines) and reports the right figures.

The ETL block also runs with the other examples in tests/docs/test_docs_examples.py; here its output
is read line by line."""

from __future__ import annotations

import pytest
from docblocks import ROOT, block_after, run_psql, run_python

WORKFLOWS_MD = ROOT / "docs" / "workflows.md"


def test_the_sql_example_prints_the_parent_it_waits_for(dsn: str) -> None:
    block = block_after(WORKFLOWS_MD, "## In SQL", "sql")
    proc = run_psql(block, dsn)
    assert proc.returncode == 0, proc.stderr
    rows = [[c.strip() for c in line.split("|")] for line in proc.stdout.splitlines() if line.count("|") == 4]
    assert ["parent", "etl", "clean/2026-11-27", "blocked", "wait"] in rows, proc.stdout


@pytest.mark.slow
def test_the_etl_example_runs_each_step_after_its_parents(dsn: str) -> None:
    block = block_after(WORKFLOWS_MD, "### Example: a daily ETL", "python")
    proc = run_python(block, dsn, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    assert lines[0] == "OfferOutcome.CREATED", proc.stdout
    done = [line.split()[1].rsplit("/", 1)[0] for line in lines if line.startswith("done ")]  # key minus day
    assert done[0] == "extract", done
    assert sorted(done[1:4]) == ["transform/revenue_by_country", "transform/revenue_total",
                                 "transform/units_by_product"], done
    assert done[4:] == ["load", "report"], done
    report = [line for line in lines if line.startswith("report ")]
    assert report == ["report 2026-11-27: 5 orders, revenue 96.00"], proc.stdout
