"""What a chaos run is (bench.chaos, bench.soak): its settings, its timeline (before, during and after
the faults) and the faults planned on it, at random moments of the middle of the run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

MODES = {"exactly-once": "eo", "at-least-once": "alo", "graph": "g"}
#: What --mode both runs (graph runs with --mode graph or --mode all).
BOTH = ("exactly-once", "at-least-once")
#: The graph mode's two queues (small DAGs across both: bench.chaos_clients.GRAPHS).
GRAPH_QUEUES = ("chaos-g1", "chaos-g2")
PIN_S = 20.0  # the REPEATABLE READ transaction's length


@dataclass(frozen=True)
class Settings:
    duration: float = 60.0
    modes: tuple[str, ...] = ("exactly-once", "at-least-once")
    seed: int = 0
    rate: float = 1000.0  # messages offered per second per mode: outbox batches and single offers
    graph_rate: float = 200.0  # graph mode: nodes offered per second (in graphs of 4 and 6)
    single_share: float = 0.2  # the part of the rate offered one message per call
    batch: int = 50  # keys per outbox transaction (offer_many) and per consume-tx transaction
    lock_timeout: float = 5.0
    idle_check: float = 1.0
    concurrency: int = 16
    work_ms: float = 2.0
    pin_s: float = PIN_S
    drain_timeout: float = 60.0
    pgdata: str | None = None
    port: int | None = None  # of the private server; None: a free one
    keep_logs: bool = False
    hand_over: str | None = None  # before the server is removed: write its DSN here, wait until removed


@dataclass
class Timeline:
    """Seconds from t0 (producers started), planned."""

    before_end: float
    window_end: float
    end: float

    @classmethod
    def plan(cls, s: Settings) -> Timeline:
        window = max(s.pin_s + 3, 0.5 * s.duration)
        rest = s.duration - window
        if rest < 4:
            raise SystemExit(f"bench.chaos: --duration {s.duration:g} is too short: the faults need {window:.0f} s "
                             f"(a {s.pin_s:.0f} s pinned xmin and a restart) and 4 s more")
        return cls(before_end=rest * 0.4, window_end=rest * 0.4 + window, end=s.duration)


@dataclass
class Fault:
    kind: str  # kill | terminate | restart | pin
    at: float  # planned, seconds from t0
    target: str = ""  # kill: slot name; terminate: "all" or a slot name
    t: float = 0.0  # epoch when it happened
    t_end: float = 0.0  # restart: server ready again; pin: transaction ended
    victims: list[int] = field(default_factory=list)  # OS pids of the consumer processes hit
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def plan_faults(s: Settings, tl: Timeline, slots: list[str], rng: random.Random) -> list[Fault]:
    w0, w1 = tl.before_end, tl.window_end
    window = w1 - w0
    pin_at = rng.uniform(w0, w1 - s.pin_s)
    faults = [Fault("pin", pin_at)]
    # Restarts outside the pinned transaction (it would end with the server), at least 5 s apart.
    n_restart = max(1, round(window / 20))
    free = [(w0, pin_at - 1.0), (pin_at + s.pin_s + 0.5, w1 - 1.0)]
    free = [(a, b) for a, b in free if b > a]
    restarts: list[float] = []
    for _ in range(200):
        if len(restarts) == n_restart or not free:
            break
        a, b = rng.choices(free, weights=[b - a for a, b in free])[0]
        t = rng.uniform(a, b)
        if all(abs(t - r) >= 5 for r in restarts):
            restarts.append(t)
    faults += [Fault("restart", t) for t in restarts]
    n_kill = max(2, round(window / 7))
    n_term = max(2, round(window / 7))
    faults += [Fault("kill", rng.uniform(w0, w1), rng.choice(slots)) for _ in range(n_kill)]
    faults += [Fault("terminate", rng.uniform(w0, w1), rng.choice(["all", rng.choice(slots)])) for _ in range(n_term)]
    return sorted(faults, key=lambda f: f.at)
