"""bench.controls' tables and summary, from a report (the full one or its summary: they print the same)."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from bench.controls_config import POLL_BATCH, Config
from bench.lib.report import rich_table, status, without
from bench.lib.sides import FILL_BATCH

if TYPE_CHECKING:
    from rich.table import Table


# --------------------------------------------------------------------------- report


def _n(v: float) -> str:
    return f"{v / 1000:.1f}k" if v >= 10_000 else f"{v:,.0f}"


def _range(s: dict[str, Any]) -> str:
    """median (min–max)"""
    return f"{_n(s['median'])} ({_n(s['min'])}–{_n(s['max'])})"


def regression_table(cells: list[dict[str, Any]], cfg: Config) -> Table:
    rows = []
    for c in cells:
        r, per_run = c["rows_per_s"], c["new_vs_old_per_run"]
        rows.append((c["workload"], str(c["clients"]), _range(r["new"]), _range(r["old"]), _range(r["baseline"]),
                     f"{c['new_vs_old']:.0%} ({per_run['min']:.0%}–{per_run['max']:.0%})",
                     status(c["pass"]) + (" (drained)" if c["exhausted"] else ""),
                     f"{c['server_us_per_row']['new']['median']:.1f} | {c['server_us_per_row']['old']['median']:.1f}",
                     f"{c['new_vs_baseline']:.0%}", f"{c['other_cpu_max']:.0%}"))
    return rich_table(
        f"1. No controls used: this checkout (new) vs the release before (old), rows/s, median (min–max) of"
        f" {cfg.repeat} runs",
        ("workload", "clients", "new", "old", "baseline", "new/old (per run)", f"≥ {cfg.target_regression:.0%}",
         "server µs/row new | old", "new/base", "other CPU"),
        rows, left={"workload"},
        caption="new/old: ratio of the medians (per run: its range within one repetition). (drained): a run"
        " emptied the backlog before its end. other CPU: the most CPU (share of all cores) processes"
        " outside the benchmark took during any run",
    )


def backlog_table(part: dict[str, Any], cfg: Config) -> Table:
    rows = []
    for b in part["backlogs"]:
        vs_plain = f"{b['drain_vs_plain']:.0%}" if b["drain_vs_plain"] is not None else "-"
        rows.append((b["backlog"], f"{b['load_s']['median']:.0f}", f"{b['poll_p50_ms']:.2f}",
                     f"{b['poll_p95_ms']:.2f}", f"{b['ack_p50_ms']:.2f}", f"{b['poll_sizes_mean']:.0f}",
                     status(b["pass_poll"]) if "pass_poll" in b else "",
                     _range(b["drain_rows_per_s"]) + (" (drained)" if b["drain_exhausted"] else ""), vs_plain,
                     status(b["pass_drain"]) if "pass_drain" in b else "",
                     f"{b['drain_server_us_per_row']['median']:.0f}",
                     f"{max(b['poll_other_cpu_max'], b['drain_other_cpu_max']):.0%}"))
    return rich_table(
        f"2. Due backlogs of {part['rows']:,} messages: dq_poll_many(q, {POLL_BATCH}) from one session, and"
        f" {part['drain_workload']}",
        ("backlog", "load s", "poll p50 ms", "poll p95", "ack p50", "rows/poll", f"< {cfg.target_poll_p50_ms:g} ms",
         "drain rows/s", "vs plain", f"≥ {cfg.target_drain:.0%}", "server µs/row", "other CPU"),
        rows, left={"backlog"},
        caption=f"priorities: {cfg.priority_levels} levels; groups: {cfg.groups:,} FIFO groups of"
        f" {cfg.group_size}. Loaded with dq_offer_many in batches of {FILL_BATCH:,} (baseline: plain"
        " INSERT), afresh before each repetition. rows/poll: mean size of the timed polls. poll"
        f" and ack: {cfg.repeat} x {cfg.poll_samples} calls; drain: median (min–max) of {cfg.repeat}"
        f" runs of {cfg.drain_s:g} s after {cfg.drain_warmup_s:g} s of warm-up",
    )


def rate_table(r: dict[str, Any]) -> Table:
    return rich_table(
        f"3. Rate limit {r['rate_limit']:,} per {r['rate_period_s']:g} s, {r['workers']} greedy workers,"
        f" {r['measured_s']:g} s measured",
        ("deliveries/s", "error", "≤ 5 %", "per period (min–max)", "max in any window", "≤ limit", "polls/s",
         "empty polls", "other CPU"),
        [(f"{r['rate_per_s']:,.1f}", f"{r['error']:+.2%}", status(r["pass_rate"]), _range(r["per_period"]),
          f"{r['max_in_any_period']:,}", status(r["pass_window"]), f"{r['polls_per_s']:,.0f}",
          f"{r['empty_polls'] / max(r['polls'], 1):.0%}", f"{r['other_cpu']:.0%}")],
        caption=f"claimed_at of every delivery; windows [t, t + period) over all {r['deliveries']:,} deliveries"
        f" (warm-up of {r['warmup_s']:g} s included); the rate over the measured part only",
    )


def levels_table(part: dict[str, Any], cfg: Config) -> Table:
    rows = []
    for c in part["cells"]:
        empty, due = c["empty"], c["one_due"]
        rows.append((f"{c['levels']:,}", c["layout"], f"{empty['p50_ms']:.2f}", f"{empty['p95_ms']:.2f}",
                     f"{empty['buffers']:,}", status(c["pass"]), f"{due['p50_ms']:.2f}", f"{due['p95_ms']:.2f}",
                     f"{due['buffers']:,}", f"{c['wait']['p50_ms']:.2f}" if "wait" in c else "-",
                     f"{c['other_cpu']:.0%}"))
    return rich_table(
        "4. Priority levels of future messages (one per level): dq_poll_many(q, 1) from one session, ms",
        ("levels", "layout", "empty p50", "p95", "buffers", f"< {cfg.target_empty_poll_ms:g} ms", "1 due p50",
         "p95", "buffers", "dq_wait p50", "other CPU"),
        rows, left={"layout"},
        caption=f"{part['samples']} polls per cell, each in a rolled-back transaction. 1 due: one more message,"
        " due, at the lowest priority. buffers: shared buffers of one poll, nested statements included."
        " baseline: one plain SQL statement over the due rows, by priority then due time. dq_wait:"
        " on the empty queue",
    )


def tables(report: dict[str, Any], cfg: Config | None = None) -> list[Table]:
    """The tables of the parts the report holds (`cfg`: by default the report's configuration)."""
    if cfg is None:
        cfg = Config(**{f.name: report["config"][f.name] for f in fields(Config) if f.name in report["config"]})
    out = []
    if "regression" in report:
        out.append(regression_table(report["regression"], cfg))
    if "backlog" in report:
        out.append(backlog_table(report["backlog"], cfg))
    if "rate" in report:
        out.append(rate_table(report["rate"]))
    if "levels" in report:
        out.append(levels_table(report["levels"], cfg))
    return out


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the tables show, with the configuration, machine, server and commits measured, and the
    server time per dq_* function of poll + ack: without the runs of each regression cell and drain
    and the plans of the polls (auto_explain)."""
    out = dict(report)
    if "regression" in report:
        out["regression"] = [without(c, "runs") for c in report["regression"]]
    if "backlog" in report:
        out["backlog"] = {**report["backlog"],
                          "backlogs": [without(b, "plan", "drain_runs") for b in report["backlog"]["backlogs"]]}
    return out
