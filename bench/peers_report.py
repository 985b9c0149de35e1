"""bench.peers' verdicts and report: the targets, the terminal tables, the summary committed in
``bench/results/peers.json``, and ``docs/performance.md`` with its chart, all from a result (the full
report or its summary: they print the same).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.lib.report import PROJECT, rich_table, without
from bench.peers_adapters import BASELINE_CONTENDER

if TYPE_CHECKING:
    from rich.table import Table

DOCS = PROJECT / "docs"
NOTES_START = "<!-- notes: kept when bench.peers regenerates this file -->"
NOTES_END = "<!-- end of notes -->"


# --------------------------------------------------------------------------- verdicts


#: Processing targets against the plain-SQL baseline at the same process count: one --async worker
#: process ≥ 70% of one baseline client, more processes ≥ 90%; the sync worker ≥ 80% of the async one.
BASELINE_TARGET_ONE = 0.70
BASELINE_TARGET_MANY = 0.90
SYNC_VS_ASYNC_TARGET = 0.80


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The targets: processed throughput ≥ 2× the best peer (ours: the faster of our
    configurations, per worker count) and against the baseline (BASELINE_TARGET_ONE / _MANY, the
    --async worker at 1 process, the faster of ours beyond), the sync worker against the async one
    (SYNC_VS_ASYNC_TARGET), batched enqueue ≥ 70% of the baseline."""
    by_key = {c["key"]: c for c in result["contenders"]}
    out: dict[str, Any] = {"throughput": [], "baseline": [], "sync": [], "enqueue": None}
    for n in sorted({cell["workers"] for cell in result["throughput"]}):
        cells = [cell for cell in result["throughput"] if cell["workers"] == n]
        by_contender = {x["contender"]: x for x in cells}
        base = next((x for x in cells if by_key[x["contender"]]["library"] == "baseline"), None)
        sync, aio = by_contender.get("dq-sync"), by_contender.get("dq-async")
        ours = max((x for x in cells if by_key[x["contender"]]["library"] == "pgdelayq"),
                   key=lambda x: x["rows_per_s"], default=None)
        if base is not None and ours is not None:
            measured = aio if n == 1 and aio is not None else ours
            target = BASELINE_TARGET_ONE if n == 1 else BASELINE_TARGET_MANY
            ratio = measured["rows_per_s"] / base["rows_per_s"]
            out["baseline"].append({"workers": n, "ours": measured["contender"],
                                    "ours_rows_per_s": measured["rows_per_s"],
                                    "baseline_rows_per_s": base["rows_per_s"],
                                    "ratio": ratio, "target": target, "pass": ratio >= target})
        if sync is not None and aio is not None:
            ratio = sync["rows_per_s"] / aio["rows_per_s"]
            out["sync"].append({"workers": n, "sync_rows_per_s": sync["rows_per_s"],
                                "async_rows_per_s": aio["rows_per_s"], "ratio": ratio,
                                "target": SYNC_VS_ASYNC_TARGET, "pass": ratio >= SYNC_VS_ASYNC_TARGET})
        peers = [x for x in cells if by_key[x["contender"]]["library"] in ("procrastinate", "pgqueuer")]
        best = max(peers, key=lambda x: x["rows_per_s"], default=None)
        if ours is None or best is None:
            continue
        ratio = ours["rows_per_s"] / best["rows_per_s"]
        out["throughput"].append({"workers": n, "ours": ours["contender"], "ours_rows_per_s": ours["rows_per_s"],
                                  "best_peer": best["contender"], "best_peer_rows_per_s": best["rows_per_s"],
                                  "ratio": ratio, "target": 2.0, "pass": ratio >= 2.0})
    enq = {r["library"]: r for r in result["enqueue"]}
    if "pgdelayq" in enq and "baseline" in enq:
        ratio = enq["pgdelayq"]["batched"]["rows_per_s"] / enq["baseline"]["batched"]["rows_per_s"]
        out["enqueue"] = {"ratio": ratio, "target": 0.70, "pass": ratio >= 0.70}
    return out


def faster_ours(result: dict[str, Any]) -> str | None:
    """Which of our worker configurations processed more in all (sum of jobs/s over worker counts)."""
    totals: dict[str, float] = {}
    for cell in result["throughput"]:
        if cell["contender"].startswith("dq-"):
            totals[cell["contender"]] = totals.get(cell["contender"], 0.0) + cell["rows_per_s"]
    return max(totals, key=lambda k: totals[k]) if totals else None


# --------------------------------------------------------------------------- report: terminal


def _rate(r: dict[str, Any]) -> str:
    return f"{r['rows_per_s']:,.0f}" + ("†" if r.get("capped") else "")


def _ms(r: dict[str, Any], key: str) -> str:
    return f"{r[key]:,.1f}" if key in r else "–"


def _labels(result: dict[str, Any]) -> dict[str, str]:
    return {c["key"]: c["label"] for c in result["contenders"]}


def enqueue_rows(result: dict[str, Any]) -> list[list[str]]:
    base = next((r for r in result["enqueue"] if r["library"] == "baseline"), None)
    rows = []
    for r in result["enqueue"]:
        s, b = r["single"], r["batched"]
        vs = "–"
        if base:
            vs = (f"{s['rows_per_s'] / base['single']['rows_per_s']:.0%} | "
                  f"{b['rows_per_s'] / base['batched']['rows_per_s']:.0%}")
        rows.append([r["library"], _rate(s), _rate(b), vs,
                     f"{s['client_us_per_row']:.0f} | {s['server_us_per_row']:.0f}",
                     f"{b['client_us_per_row']:.1f} | {b['server_us_per_row']:.1f}"])
    return rows


ENQUEUE_HEADER = ["library", "single jobs/s", "batched jobs/s", "vs baseline single | batched",
                  "single µs/job producer | server", "batched µs/job producer | server"]


def throughput_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    counts = sorted({c["workers"] for c in result["throughput"]})
    labels = _labels(result)
    header = ["configuration", *(f"{n} worker{'s' * (n > 1)} jobs/s" for n in counts)]
    rows = []
    for key, label in labels.items():
        cells = {c["workers"]: c for c in result["throughput"] if c["contender"] == key}
        if cells:
            rows.append([label, *(_rate(cells[n]) if n in cells else "–" for n in counts)])
    return header, rows


def cpu_rows(result: dict[str, Any]) -> list[list[str]]:
    labels = _labels(result)
    rows = []
    for c in sorted(result["throughput"], key=lambda c: (list(labels).index(c["contender"]), c["workers"])):
        rows.append([labels[c["contender"]], str(c["workers"]), _rate(c), f"{c['processed']:,}",
                     f"{c['elapsed_s']:.1f}", f"{c['consumer_us_per_row']:.0f}", f"{c['server_us_per_row']:.0f}",
                     f"{c['xacts_per_row']:.3f}", f"{c['other_cpu']:.0%}"])
    return rows


CPU_HEADER = ["configuration", "workers", "jobs/s", "processed", "seconds", "worker µs/job", "server µs/job",
              "xacts/job", "other CPU"]


def latency_rows(result: dict[str, Any]) -> list[list[str]]:
    labels = _labels(result)
    rows = []
    for r in result["latency"]:
        now, dl = r["now"], r["delayed"]
        rows.append([labels[r["contender"]], _ms(now, "p50_ms"), _ms(now, "p99_ms"), _ms(now, "max_ms"),
                     _ms(dl, "p50_ms"), _ms(dl, "p99_ms"), _ms(dl, "max_ms"),
                     f"{now['lost'] + dl['lost']} | {now['duplicates'] + dl['duplicates']}"])
    return rows


def latency_header(result: dict[str, Any]) -> list[str]:
    c = result["config"]
    span = f"{c['delayed_from_s']:g}–{c['delayed_to_s']:g} s"
    return ["configuration", "due now p50 ms", "p99", "max", f"due in {span} p50 ms", "p99", "max", "lost | dup"]


def target_rows(result: dict[str, Any]) -> list[list[str]]:
    labels, t = _labels(result), result["targets"]
    rows = []
    for x in t["throughput"]:
        rows.append([f"processing, {x['workers']} worker{'s' * (x['workers'] > 1)}: ours ≥ 2× the best peer",
                     f"{labels[x['ours']]} {x['ours_rows_per_s']:,.0f} / {labels[x['best_peer']]} "
                     f"{x['best_peer_rows_per_s']:,.0f} = {x['ratio']:.2f}×", "PASS" if x["pass"] else "MISS"])
    for x in t.get("baseline", []):
        rows.append([f"processing, {x['workers']} worker{'s' * (x['workers'] > 1)}: ours ≥ {x['target']:.0%} of the "
                     "baseline", f"{labels[x['ours']]} {x['ours_rows_per_s']:,.0f} / baseline "
                     f"{x['baseline_rows_per_s']:,.0f} = {x['ratio']:.0%}", "PASS" if x["pass"] else "MISS"])
    for x in t.get("sync", []):
        rows.append([f"processing, {x['workers']} worker{'s' * (x['workers'] > 1)}: sync ≥ {x['target']:.0%} of async",
                     f"{x['sync_rows_per_s']:,.0f} / {x['async_rows_per_s']:,.0f} = {x['ratio']:.0%}",
                     "PASS" if x["pass"] else "MISS"])
    if t["enqueue"]:
        e = t["enqueue"]
        rows.append(["batched enqueue ≥ 70% of the baseline", f"{e['ratio']:.0%}", "PASS" if e["pass"] else "MISS"])
    return rows


def _rich(title: str, header: list[str], rows: list[list[str]], caption: str | None = None) -> Table:
    return rich_table(title, header, ([r.replace("PASS", "[green]PASS[/]").replace("MISS", "[red]MISS[/]") for r in row]
                                      for row in rows), caption=caption, left={header[0]})


def rich_tables(result: dict[str, Any]) -> list[Table]:
    c = result["config"]
    header, rows = throughput_rows(result)
    return [
        _rich(f"Enqueue {c['jobs']:,} jobs, one producer (single: one job per call; batched: "
              f"{c['enqueue_batch']:,} per call)",
              ENQUEUE_HEADER, enqueue_rows(result), "†: stopped by the time cap; the rate is what was done"),
        _rich(f"Processing a backlog of {c['jobs']:,} no-op jobs (jobs/s)", header, rows),
        _rich("Processing: CPU per job", CPU_HEADER, cpu_rows(result)),
        _rich(f"Latency with {c['latency_workers']} idle worker processes (handler start − due time)",
              latency_header(result), latency_rows(result)),
        _rich("Targets", ["target", "figure", ""], target_rows(result)),
    ]


PER_PROCESS = ("functions", "worker_warnings", "exit_codes", "per_worker_delivered", "per_client_rows")


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """What the tables, docs/performance.md and its chart show, with the configuration, machine,
    server and versions measured: without each run's per-function statistics, per-process counts,
    exit codes and log warnings."""
    return {**result, "throughput": [without(c, *PER_PROCESS) for c in result["throughput"]],
            "latency": [without(r, *PER_PROCESS) for r in result["latency"]]}


# --------------------------------------------------------------------------- report: docs


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in header) + " |", rule]
    lines += ["| " + " | ".join(r.replace("|", "\\|") for r in row) + " |" for row in rows]
    return "\n".join(lines)


def _keep_notes(previous: str | None) -> str:
    if previous and NOTES_START in previous and NOTES_END in previous:
        return previous[previous.index(NOTES_START):previous.index(NOTES_END) + len(NOTES_END)]
    return f"{NOTES_START}\n\n(No notes yet.)\n\n{NOTES_END}"


def markdown_report(result: dict[str, Any], json_name: str, previous: str | None = None) -> str:
    """docs/performance.md from a result; the notes section of `previous` (the file's former text) is kept."""
    c, m, s, v = result["config"], result["machine"], result["server"], result["versions"]
    labels = _labels(result)
    header, rows = throughput_rows(result)
    faster = result.get("faster_ours")
    mem = f"{m['mem_total_kb'] / 1024 ** 2:.1f} GiB RAM" if "mem_total_kb" in m else "RAM unknown"
    other = [x["other_cpu"] for x in result["throughput"]] + [
        r[k]["other_cpu"] for r in result["enqueue"] for k in ("single", "batched")]
    settings = ", ".join(f"`{k} = {s[k]}`" for k in s if k != "version")
    setups = "\n".join(f"- **{x['label']}**: " + (x["setting"] if x["library"] == "baseline" else f"`{x['setting']}`")
                       for x in result["contenders"])
    parts = [
        "# Performance: pgdelayq beside procrastinate, pgqueuer and plain SQL",
        "",
        f"Generated by `make bench-peers` (`python -m bench.peers`, mode **{result['mode']}**) on "
        f"{result['timestamp']} in {result['wall_time_s'] / 60:.0f} min; every figure below comes from "
        f"`bench/results/{json_name}`. Do not edit by hand, except the notes section at the end "
        "(kept when the file is regenerated).",
        "",
        "## What was measured",
        "",
        f"One PostgreSQL server, one run; each library in its own database, dropped and recreated per run, "
        f"installed as its documentation says. Payloads of about 100 bytes. Every timed run stops after "
        f"{c['cap_s']:.0f} s even if work is left; its rate is then what it did in that time (marked †).",
        "",
        f"- **Enqueue** {c['jobs']:,} jobs from one producer process: one job per call (and transaction), then "
        f"batches of {c['enqueue_batch']:,} with the library's batch call.",
        f"- **Processing**: a backlog of {c['jobs']:,} due no-op jobs is committed in one transaction while the "
        f"worker processes wait idle; jobs/s from the commit until the queue table is empty (counted every 50 ms).",
        f"- **Latency**: {c['latency_workers']} idle worker processes; {c['now_jobs']:,} jobs due now, offered "
        f"one by one at {c['now_rate']:g}/s (handler start − the producer's clock just before the call), then "
        f"{c['delayed_jobs']:,} jobs due {c['delayed_from_s']:g}–{c['delayed_to_s']:g} s ahead, offered at once "
        "(handler start − due time).",
        "- **Baseline**: bench.core's plain-SQL statements on `bench_baseline` (a copy of `dq_messages`): the most "
        "this server can do for this work (no wake-up protocol, so no latency row).",
        "",
        "Worker configurations (N processes of each, with the library's recommended in-process concurrency):",
        "",
        setups,
        "",
        "![throughput, enqueue and latency](performance.png)",
        "",
        "## Enqueue",
        "",
        markdown_table(ENQUEUE_HEADER, enqueue_rows(result)),
        "",
        "Calls: " + "; ".join(f"{r['library']}: `{r['api']['single']}`, `{r['api']['batched']}`"
                              for r in result["enqueue"]) + ".",
        "",
        "## Processing a backlog",
        "",
        markdown_table(header, rows),
        "",
        "Where the CPU went (worker: the worker processes or baseline clients, and the driver; server: the "
        "database's backends; xacts/job: transactions committed in the database per job, i.e. round trips; "
        "other CPU: share of all cores that processes outside the benchmark took meanwhile):",
        "",
        markdown_table(CPU_HEADER, cpu_rows(result)),
        "",
        "## Latency",
        "",
        markdown_table(latency_header(result), latency_rows(result)),
        "",
        "## Targets",
        "",
        markdown_table(["target", "figure", "verdict"], target_rows(result)),
        "",
        f"Ours counts as the faster of our two worker configurations at each worker count; over all counts the "
        f"faster was **{labels.get(faster or '', 'n/a')}**.",
        "",
        "## Environment",
        "",
        f"- Machine: {m.get('cpu_count')} cores ({m.get('cpu_model', 'model unknown')}), {mem}, {m.get('platform')}.",
        f"- Host load: load average {_loadavg(m.get('load_average'))} before the run, "
        f"{_loadavg(result.get('load_average_after'))} after; other processes took on average "
        f"{statistics.fmean(other) if other else 0:.0%} (at most {max(other, default=0):.0%}) of all cores during "
        "the timed runs.",
        f"- PostgreSQL: {s['version']}",
        f"- Server settings: {settings}.",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        "",
        "## Notes",
        "",
        _keep_notes(previous),
        "",
    ]
    return "\n".join(parts)


def _loadavg(la: Any) -> str:
    return " / ".join(f"{x:.2f}" for x in la) if la else "unknown"


def chart(result: dict[str, Any], path: Path) -> None:
    """docs/performance.png: processing jobs/s by worker count, enqueue jobs/s, latency p50/p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = _labels(result) | {"baseline": BASELINE_CONTENDER.label}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 5.2))
    counts = sorted({c["workers"] for c in result["throughput"]})
    keys = [k for k in labels if any(c["contender"] == k for c in result["throughput"])]
    width = 0.8 / max(len(keys), 1)
    for i, key in enumerate(keys):
        cells = {c["workers"]: c["rows_per_s"] for c in result["throughput"] if c["contender"] == key}
        ax1.bar([j + i * width for j in range(len(counts))], [cells.get(n, 0) for n in counts], width,
                label=labels[key])
    ax1.set_xticks([j + width * (len(keys) - 1) / 2 for j in range(len(counts))],
                   [f"{n} worker{'s' * (n > 1)}" for n in counts])
    ax1.set_ylabel("jobs/s")
    ax1.set_title(f"Processing a backlog of {result['config']['jobs']:,}")
    ax1.legend(fontsize=7)
    libs = [r["library"] for r in result["enqueue"]]
    for i, kind in enumerate(("single", "batched")):
        ax2.bar([j + i * 0.4 for j in range(len(libs))], [r[kind]["rows_per_s"] for r in result["enqueue"]], 0.4,
                label=kind)
    ax2.set_xticks([j + 0.2 for j in range(len(libs))], libs, fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("jobs/s (log)")
    ax2.set_title("Enqueue")
    ax2.legend(fontsize=7)
    lat = result["latency"]
    names = [labels[r["contender"]].replace(" (", "\n(") for r in lat]
    series = (("now", "p50_ms", "due now p50"), ("now", "p99_ms", "due now p99"),
              ("delayed", "p50_ms", "delayed p50"), ("delayed", "p99_ms", "delayed p99"))
    for i, (kind, stat, label) in enumerate(series):
        ax3.bar([j + i * 0.2 for j in range(len(lat))], [max(r[kind].get(stat, 0), 0.01) for r in lat], 0.2,
                label=label)
    ax3.set_xticks([j + 0.3 for j in range(len(lat))], names, fontsize=7)
    ax3.set_yscale("log")
    ax3.set_ylabel("ms (log)")
    ax3.set_title("Latency, idle workers")
    ax3.legend(fontsize=7)
    fig.suptitle(f"bench.peers {result['timestamp']} ({result['machine'].get('cpu_count')} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
