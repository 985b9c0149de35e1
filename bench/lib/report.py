"""What every benchmark prints and writes: the console, PASS/MISS, percentiles, the machine it ran on,
rich tables, the command line they share, and the results (the full report and its summary).

Results: a run writes its full report (every run, sample and plan) to ``bench/results/raw/`` (not
committed) and a summary (what its tables and verdicts show, with the configuration, machine, server
and commit measured) to ``bench/results/<benchmark>[-quick].json``, the recorded result that is
committed. With ``--out PATH`` the full report goes to PATH and the summary beside it, and
``bench/results`` is left alone. ``python -m bench.summarize`` writes the summary of a full report
again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

PROJECT = Path(__file__).resolve().parents[2]
RESULTS = PROJECT / "bench" / "results"  # the summaries, committed
RAW = RESULTS / "raw"  # the full reports, git-ignored


@cache
def console() -> Console:
    """The parent's console (client processes import neither rich nor yoyo: they start faster)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 140)


def status(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]MISS[/]"


def percentile(values: list[float], p: int) -> float:
    """The p-th percentile (1-99) of at least two values, linear between closest ranks."""
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
    }
    try:
        info["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                 if ln.startswith("model name"))
        info["mem_total_kb"] = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                                        if ln.startswith("MemTotal")))
    except (OSError, StopIteration):
        pass
    return info


def rich_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]] = (), *,
               caption: str | None = None, left: Collection[str] = ()) -> Table:
    """A table of `columns` (right-justified, but those named in `left`) holding `rows`."""
    from rich.table import Table

    table = Table(title=title, caption=caption)
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    for row in rows:
        table.add_row(*row)
    return table


# --------------------------------------------------------------------------- command line

OUT_HELP = ("write the full JSON report here and its summary beside it (x.json: x.summary.json) instead of "
            "bench/results/raw/ and bench/results/")


def arguments(module: str, doc: str | None, *, dsn: bool = True, quick: str | None = None,
              db_name: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``, described by the first line of `doc`: ``--dsn`` (unless
    `dsn` is false), ``--out``, ``--quick`` (when `quick` gives its help) and ``--db-name`` (when
    `db_name` gives its default)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n")[0])
    if dsn:
        parser.add_argument("--dsn", required=True, help="admin DSN of the server (a database to connect to)")
    parser.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    if db_name is not None:
        parser.add_argument("--db-name", default=db_name, help="benchmark database (dropped and recreated)")
    return parser


# --------------------------------------------------------------------------- results


def utc_stamp(at: datetime | None = None) -> str:
    """The time of a run in file names: 20261124T034812Z."""
    return (at or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def json_text(data: Any) -> str:
    return json.dumps(data, indent=2, default=str) + "\n"


def summary_path(full: Path) -> Path:
    """Where the summary of a full report written to `full` (with --out) goes."""
    return full.with_name(f"{full.stem}.summary.json")


def without(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`data` without `keys` (those it has)."""
    return {k: v for k, v in data.items() if k not in keys}


def result_name(benchmark: str, quick: bool = False) -> str:
    """``core``, or ``core-quick`` for a run in quick mode: the summary's file name in RESULTS."""
    return f"{benchmark}-quick" if quick else benchmark


def write_json(path: Path, benchmark: str, data: dict[str, Any]) -> None:
    """Write a report or a summary, named by its benchmark first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json_text({"benchmark": benchmark, **without(data, "benchmark")}))


def write_results(benchmark: str, report: dict[str, Any], summary: dict[str, Any], out: Path | None, *,
                  quick: bool = False, at: datetime | None = None) -> tuple[Path, Path]:
    """Write a run's full report and its summary; return their paths.

    :param benchmark: ``core``, ``latency``, …: the module's name in ``bench``.
    :param report: the full report.
    :param summary: what of it is committed (the benchmark's ``summary(report)``).
    :param out: ``--out``: the full report goes there and the summary beside it
        (:func:`summary_path`), leaving ``bench/results`` alone. `None`: the full report goes to
        ``RAW/<name>-<UTC time>.json`` and the summary to ``RESULTS/<name>.json``
        (:func:`result_name`).
    :param quick: the run was in quick mode.
    :param at: the time of the run, for the raw file's name (default: now).
    """
    name = result_name(benchmark, quick)
    full = out if out is not None else RAW / f"{name}-{utc_stamp(at)}.json"
    short = summary_path(out) if out is not None else RESULTS / f"{name}.json"
    write_json(full, benchmark, report)
    write_json(short, benchmark, summary)
    return full, short


def publish(benchmark: str, report: dict[str, Any], summary: dict[str, Any], tables: Iterable[Table],
            out: Path | None, *, quick: bool = False, at: datetime | None = None) -> tuple[Path, Path]:
    """The end of a run: print its tables, write the report and its summary (:func:`write_results`),
    say where (and the wall time, when the report has it); return the paths written."""
    for table in tables:
        console().print(table)
    paths = write_results(benchmark, report, summary, out, quick=quick, at=at)
    wall = report.get("wall_time_s")
    console().log(("" if wall is None else f"wall time {wall:.0f} s; ")
                  + f"results written to {', '.join(map(str, paths))}")
    return paths
