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
