"""Summaries of benchmarks' full reports, written again from the reports.

For a report written with ``--out``, or after changing what a benchmark's summary keeps:

    python -m bench.summarize bench/results/raw/controls-quick-20261124T034812Z.json [...] [--to DIR]

The benchmark is the report's ``benchmark`` field or, in reports written before it had one, the
first word of the file's name (``controls`` above); each benchmark module's ``summary(report)``
says what is kept. The summary goes to ``bench/results/<benchmark>.json`` (``<benchmark>-quick.json``
for a run in quick mode), or into ``--to DIR``; bench.soak's markdown summary goes beside it.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

from bench.lib.report import RESULTS, console, result_name, write_json

BENCHMARKS = ("core", "latency", "controls", "peers", "spark", "chaos", "soak", "snapshot", "targets", "scrape",
              "middleware_overhead", "console_queries", "console_pages", "django_worker",
              "workflows")


def benchmark_of(path: Path, report: dict[str, Any]) -> str:
    name = report.get("benchmark") or path.stem.split("-", 1)[0]
    if name not in BENCHMARKS:
        raise SystemExit(f"bench.summarize: {path}: no benchmark named {name!r} (one of {', '.join(BENCHMARKS)})")
    return str(name)


def summarize(path: Path, to: Path) -> list[Path]:
    """Write the summary of the full report at `path` into `to`; return the files written."""
    report = json.loads(path.read_text())
    benchmark = benchmark_of(path, report)
    module = importlib.import_module(f"bench.{benchmark}")
    target = to / f"{result_name(benchmark, report.get('mode') == 'quick')}.json"
    write_json(target, benchmark, module.summary(report))
    written = [target]
    if hasattr(module, "markdown"):
        written.append(target.with_suffix(".md"))
        written[-1].write_text(module.markdown(report))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.summarize", description=__doc__.split("\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="full JSON reports")
    parser.add_argument("--to", type=Path, default=RESULTS, help="where the summaries go (default bench/results)")
    args = parser.parse_args(argv)
    for path in args.reports:
        console().log(f"{path}: summary written to {', '.join(map(str, summarize(path, args.to)))}")


if __name__ == "__main__":
    main()
