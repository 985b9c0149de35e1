"""What the parts of bench.controls share: the configuration (:class:`Config`, ``FULL``, ``QUICK``),
the sides they run (this checkout's functions, the release before the controls, the backlogs of
part 2) and the helpers of repeated runs (:func:`spread`, :func:`rotated`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from bench import core
from bench.lib.sides import BASELINE, DQ, Workload

CONTROLS_MIGRATION = "migrations/0011_delivery_controls.sql"
POLL_BATCH = 100  # dq_poll_many(q, 100) in parts 2 and 3

# This checkout's functions; the controls' tables are emptied with the messages.
NEW = replace(DQ, name="new", truncate=(*DQ.truncate, "dq_groups", "dq_rate_tokens"))
# The release before the controls, in a database of its own (same statements).
OLD = replace(DQ, name="old")

# The backlogs of part 2: bench.core's fill with priorities (g mod levels, centred on 0) and
# groups (g mod groups); levels 1 / groups 0 pass NULL arrays (every message at the defaults).
BACKLOG_FILL = """
    SELECT count(*)
      FROM (SELECT array_agg(%(prefix)s || lpad(g::text, 9, '0') ORDER BY g) AS k,
                   array_agg(%(payload)s::bytea ORDER BY g) AS p,
                   array_agg(%(t0)s::timestamptz + g * interval '1 millisecond' ORDER BY g) AS s,
                   array_agg(g %% %(levels)s::int - %(levels)s::int / 2 ORDER BY g) AS pr,
                   array_agg('group-' || lpad((g %% greatest(%(groups)s::int, 1))::text, 7, '0') ORDER BY g) AS mg
              FROM generate_series(%(lo)s::int, %(hi)s::int) AS g) AS a,
           LATERAL dq_offer_many(queue => %(queue)s::text, keys => a.k, payloads => a.p, scheduled_ats => a.s,
                                 priorities => CASE WHEN %(levels)s::int > 1 THEN a.pr END,
                                 message_groups => CASE WHEN %(groups)s::int > 0 THEN a.mg END)"""
# Each backlog is loaded alone: its load empties the tables of every side.
EVERY_TABLE = (*NEW.truncate, *BASELINE.truncate)
BACKLOG = replace(NEW, fill=BACKLOG_FILL, truncate=EVERY_TABLE)
BASELINE_BACKLOG = replace(BASELINE, truncate=EVERY_TABLE)


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    mode: str
    rows: int  # messages per backlog of part 2
    clients: tuple[int, ...]  # client processes per regression cell
    repeat: int  # repetitions of every regression cell, poll sample and drain
    warmup_s: float  # regression cells (bench.core's harness)
    duration_s: float
    poll_samples: int  # timed dq_poll_many(q, 100) calls per backlog and repetition
    drain_workers: int
    drain_warmup_s: float
    drain_s: float
    priority_levels: int = 5
    group_size: int = 10
    rate_workers: int = 8
    rate_limit: int = 1000
    rate_period_s: float = 1.0
    rate_warmup_s: float = 2.0
    rate_s: float = 30.0
    target_regression: float = 0.95
    target_poll_p50_ms: float = 5.0
    target_drain: float = 0.5
    target_rate_error: float = 0.05
    level_counts: tuple[int, ...] = (1, 100, 20_000, 65_536)
    level_samples: int = 30  # timed polls per cell of part 4
    target_empty_poll_ms: float = 5.0

    @property
    def groups(self) -> int:
        return max(self.rows // self.group_size, 1)

    @property
    def rate_backlog(self) -> int:
        """Due messages for part 3: half as many again as the limit lets through in the run."""
        return int(self.rate_limit * (self.rate_warmup_s + self.rate_s + 2) / self.rate_period_s * 1.5)

    def regression_workloads(self) -> list[Workload]:
        """bench.core's batched offers and polls, with their batches and backlogs."""
        base = core.FULL if self.mode == "full" else core.QUICK
        names = ("offer_many x100", "offer_many x1000", "poll+ack x1", "poll+ack x100")
        return [replace(w, target=self.target_regression) for w in base.workloads() if w.name in names]


FULL = Config("full", rows=1_000_000, clients=(1, 4), repeat=3, warmup_s=1.0, duration_s=3.0, poll_samples=100,
              drain_workers=4, drain_warmup_s=1.0, drain_s=5.0)
QUICK = Config("quick", rows=100_000, clients=(1, 4), repeat=3, warmup_s=0.5, duration_s=1.5, poll_samples=30,
               drain_workers=4, drain_warmup_s=0.3, drain_s=1.0, level_samples=10)


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def rotated(items: tuple[Any, ...], rep: int) -> tuple[Any, ...]:
    """`items` starting at index rep (mod len): every item goes first once in len(items) repetitions."""
    k = rep % len(items)
    return items[k:] + items[:k]
