"""What the pages show that needs more than a template: a payload in its readable form and the
geometry of a bar chart (drawn as SVG by the templates, so every text is escaped there)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

#: Bytes of a binary payload shown as hex on a message page (the rest is counted, not shown).
HEX_SHOWN_BYTES = 4096


def payload_view(row: dict[str, Any]) -> dict[str, Any]:
    """How a message page shows ``row``'s payload (``dq_message_detail``): ``kind`` is "json"
    (pretty-printed), "text" or "hex"; ``text`` the shown text; ``size`` the full size in bytes;
    ``truncated`` whether less than the whole payload is shown."""
    data = bytes(row.get("payload") or b"")
    size = int(row.get("payload_bytes") or len(data))
    truncated = len(data) < size
    ptype = row.get("payload_type")
    if ptype in ("json", "text"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            # Cut inside a character (truncated) or not UTF-8: show what decodes.
            text = data.decode("utf-8", errors="replace")
        if ptype == "json" and not truncated:
            try:
                text = json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=False)
            except ValueError:
                pass
            else:
                return {"kind": "json", "text": text, "size": size, "truncated": False}
        return {"kind": "text", "text": text, "size": size, "truncated": truncated}
    shown = data[:HEX_SHOWN_BYTES]
    lines = [f"{i:08x}  {shown[i:i + 16].hex(' ')}" for i in range(0, len(shown), 16)]
    return {"kind": "hex", "text": "\n".join(lines), "size": size, "truncated": truncated or len(data) > len(shown)}


def chart(series: Sequence[tuple[datetime, int]], label: str, *, element_id: str = "chart",
          width: int = 600, height: int = 120) -> dict[str, Any]:
    """The bars of a chart of ``series`` (time, count), scaled to ``width`` x ``height`` pixels,
    with its label, peak and total (for the template's ``<svg>``)."""
    peak = max((n for _, n in series), default=0)
    step = width / max(len(series), 1)
    bars = []
    for i, (at, n) in enumerate(series):
        h = 0.0 if peak == 0 else (height - 14) * n / peak
        bars.append({"x": round(i * step, 2), "y": round(height - h, 2), "w": round(max(step - 1, 1), 2),
                     "h": round(h, 2), "title": f"{at:%H:%M} UTC: {n:,}"})
    return {"id": element_id, "label": label, "bars": bars, "peak": peak, "total": sum(n for _, n in series),
            "width": width, "height": height,
            "first": series[0][0] if series else None, "last": series[-1][0] if series else None}


#: How the health page names the figures of ``dq_table_health()``.
FIGURE_LABELS = {
    "live_tuples": "live rows", "dead_tuples": "dead rows", "dead_tuple_ratio": "dead ratio",
    "last_vacuum_timestamp_seconds": "last vacuum", "last_autovacuum_timestamp_seconds": "last autovacuum",
    "last_autoanalyze_timestamp_seconds": "last autoanalyze", "size_bytes": "size",
    "estimated_minimum_bytes": "estimated minimum", "age_seconds": "age", "age_transactions": "age (transactions)",
    "last_start_timestamp_seconds": "last start", "last_run_failed": "last run",
    "failures_last_hour": "failures, last hour",
}
COMPONENT_TITLES = {"table": "Tables", "index": "Indexes", "xmin_horizon": "xmin horizon",
                    "cron_job": "pg_cron jobs"}
_RANK = {"ok": 0, "warning": 1, "critical": 2}


def health_view(rows: Sequence[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """The rows of ``dq_table_health()`` as the health page shows them: ``attention`` (every figure
    whose status is not ok, with its advice) and, per component, a table with one row per name and
    one column per figure (``sections``); a timestamp figure is shown as its age."""
    attention = [r for r in rows if r.get("status") != "ok"]
    sections: dict[str, dict[str, Any]] = {}
    for r in rows:
        component = str(r["component"])
        section = sections.setdefault(component, {"component": component,
                                                  "title": COMPONENT_TITLES.get(component, component),
                                                  "figures": [], "rows": {}})
        figure = str(r["figure"])
        if figure not in section["figures"]:
            section["figures"].append(figure)
        name = r.get("name") or "—"
        row = section["rows"].setdefault(name, {"name": name, "status": "ok", "values": {}, "advice": []})
        shown = r.get("shown") if r.get("shown") is not None else r.get("value")
        if figure.endswith("_timestamp_seconds") and r.get("value") is not None:
            seconds = now.timestamp() - float(r["value"])
            shown = f"{_age(seconds)} ago"
        row["values"][figure] = {"text": "—" if shown is None else str(shown), "status": r.get("status") or "ok"}
        if _RANK.get(str(r.get("status")), 1) > _RANK.get(row["status"], 1):
            row["status"] = r.get("status")
        if r.get("advice"):
            row["advice"].append(r["advice"])
    order = list(COMPONENT_TITLES)
    ranked = sorted(sections.values(), key=lambda s: order.index(s["component"]) if s["component"] in order else 99)
    return {"attention": attention, "labels": FIGURE_LABELS,
            "sections": [{**s, "rows": list(s["rows"].values())} for s in ranked]}


def _age(seconds: float) -> str:
    s = abs(seconds)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400 * 2:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"
