"""A model of the queue's documented semantics (docs/api.md, docs/state_machine.md), driven step by
step beside a real database by tests/core/test_model.py, which compares the two after every step.

Time. The model's clock is a whole number of units ``m`` (``UNIT``, one hour) since ``base``; the test
moves the queue's clock (tests/support/clock.py) by whole units and never sleeps. A time the caller gives
(an offered ``scheduled_at`` or ``expires_at``) is ``base + g * UNIT - delta`` with a small ``delta``;
a time the database reads from its clock (a lock expiry, a nack's due time, ``created_at``,
``dead_at``) is ``base + g * UNIT + creep``, where the creep is the real time elapsed since ``base``
(milliseconds to seconds, always under ``TOLERANCE``). So "due at model time m" is exactly
``g <= m``, whatever the creep. The first time the invariant reads such a value it checks that it
lies in ``[base + g * UNIT, base + g * UNIT + TOLERANCE)`` and learns it exactly; from then on it is
compared for equality, and the model orders deliveries by the exact values, as the database does.

Dependencies (dq_offer's ``after``). A blocked row keeps its release due time in ``scheduled_at`` and its
release group in ``group`` (the database stores them in release_at and release_group, with scheduled_at
9999-12-31 and no group, until it is released); ``parents`` is the set of (queue, key) it still waits for
(its dependency rows). ``gone`` applies what docs/api.md says follows from rows leaving: an acknowledged
parent releases its children, another outcome applies each child's on_parent_failure.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

UNIT = timedelta(hours=1)
TOLERANCE = timedelta(minutes=10)


@dataclass(eq=False)
class T:
    """A time: its grid point (whole units since base) and, once known, its exact value."""

    grid: int
    exact: datetime | None = None


@dataclass(eq=False)
class Row:
    """One row of dq_messages as the model expects it."""

    queue: str
    key: str
    payload: bytes
    payload_type: str
    scheduled_at: T
    scheduled_at_initially: T
    created_at: T
    priority: int = 0
    group: str | None = None
    expires_at: T | None = None
    headers: dict[str, Any] | None = None
    id: int | None = None
    delivery_count: int = 0
    lock_token: uuid.UUID | None = None
    last_error: str | None = None
    last_error_at: T | None = None
    dead_from: str | None = None
    dead_at: T | None = None
    dead_from_id: int | None = None
    dead_delivery_count: int | None = None
    due_at: T | None = None
    claimed_at: T | None = None
    born: int = 0  # the step that inserted it
    seq: int = 0  # the order of the inserts (ids grow with it: Model.add)
    parents: set[tuple[str, str]] = field(default_factory=set)  # (queue, key) it waits for: blocked when any
    on_parent_failure: str = "wait"
    has_children: bool = False  # some offer named it as a parent (its leaving resolves the children)
    released: bool = False  # was blocked, is no longer

    @property
    def identity(self) -> tuple[str, str, int | None]:
        return (self.queue, self.key, self.dead_from_id)

    @property
    def blocked(self) -> bool:
        return bool(self.parents)

    def order(self) -> tuple[int, datetime, int]:
        """Delivery order: priority (highest first), due time, id."""
        assert self.scheduled_at.exact is not None and self.id is not None
        return (-self.priority, self.scheduled_at.exact, self.id)


@dataclass
class QueueConfig:
    max_deliveries: int | None = None
    dead_letter_queue: str | None = None
    max_in_flight: int | None = None
    paused: bool = False


@dataclass
class Model:
    """The queues' rows, configurations and FIFO group heads, and the model clock ``m``."""

    base: datetime
    configs: dict[str, QueueConfig]
    m: int = 0
    step: int = 0
    rows: list[Row] = field(default_factory=list)
    heads: dict[tuple[str, str], Row] = field(default_factory=dict)
    seq: int = 0
    #: (queue, key) of parents that left otherwise than acknowledged while children waited for them.
    failed: set[tuple[str, str]] = field(default_factory=set)
    #: (queue, key) of parents whose dead letter left (acknowledged, cancelled, expired) while children waited.
    events: Counter[str] = field(default_factory=Counter)  # the dependency cases reached (the test's REQUIRED)

    def add(self, row: Row) -> Row:
        """Insert a row: in the database's insert order (its id is learned at the next check)."""
        self.seq += 1
        row.seq = self.seq
        self.rows.append(row)
        return row

    # -- times ---------------------------------------------------------------------------------
    def given(self, grid: int, delta: timedelta) -> T:
        """A time the caller passes: exact from the start."""
        return T(grid, self.base + grid * UNIT - delta)

    def instant(self, units: int = 0) -> T:
        """A reading of the database's clock now (plus whole units), learned at the next check."""
        return T(self.m + units)

    def due(self, t: T) -> bool:
        return t.grid <= self.m

    def in_flight(self, row: Row) -> bool:
        return row.lock_token is not None and not self.due(row.scheduled_at)

    def state(self, row: Row) -> str:
        if row.blocked:
            return "blocked"
        if self.in_flight(row):
            return "in_flight"
        return "ready" if self.due(row.scheduled_at) else "scheduled"

    # -- lookups -------------------------------------------------------------------------------
    def ordinary(self, queue: str, key: str) -> Row | None:
        return next((r for r in self.rows if r.queue == queue and r.key == key and r.dead_from is None), None)

    def holder(self, token: uuid.UUID | None) -> Row | None:
        return next((r for r in self.rows if token is not None and r.lock_token == token), None)

    def in_queue(self, queue: str) -> list[Row]:
        return [r for r in self.rows if r.queue == queue]

    def describe(self) -> str:
        """The rows, one a line, for a failure message."""
        lines = []
        for r in sorted(self.rows, key=lambda r: (r.queue, r.key, r.id or 0)):
            head = " head" if r.group is not None and self.heads.get((r.queue, r.group)) is r else ""
            lines.append(
                f"  {r.queue}/{r.key} id={r.id} {self.state(r)} due@{r.scheduled_at.grid} ({r.scheduled_at.exact}) "
                f"initially={r.scheduled_at_initially.exact} priority={r.priority} group={r.group}{head} "
                f"deliveries={r.delivery_count} token={r.lock_token} dead_from={r.dead_from} "
                f"expires@{r.expires_at.grid if r.expires_at else None}"
                + (f" parents={sorted(r.parents)} on_parent_failure={r.on_parent_failure}" if r.blocked else "")
                + (" has_children" if r.has_children else ""))
        paused = [q for q, c in self.configs.items() if c.paused]
        return "\n".join([*lines, f"  paused: {paused}"])

    # -- offers --------------------------------------------------------------------------------
    def offer(self, queue: str, key: str, payload: bytes, payload_type: str, scheduled_at: T, can_update: bool,
              priority: int, group: str | None, expires_at: T | None, headers: dict[str, Any] | None,
              created_at: T) -> str:
        row = self.ordinary(queue, key)
        if row is None:
            # Children still waiting for a message of this name (a dependency row names it): the new
            # message is their parent (sql/095_dependencies.sql, dq__waited_for).
            self.add(Row(queue, key, payload, payload_type, scheduled_at, scheduled_at, created_at, priority, group,
                         expires_at, headers, born=self.step,
                         has_children=any((queue, key) in r.parents for r in self.rows)))
            return "created"
        old_expiry = row.expires_at.exact if row.expires_at else None
        new_expiry = expires_at.exact if expires_at else None
        differs = (row.payload, row.payload_type, row.scheduled_at_initially.exact, row.priority, row.group,
                   old_expiry, row.headers) != (payload, payload_type, scheduled_at.exact, priority, group,
                                                new_expiry, headers)
        if not (can_update and differs):
            return "ignored"
        row.payload, row.payload_type, row.priority, row.group = payload, payload_type, priority, group
        row.scheduled_at = row.scheduled_at_initially = scheduled_at
        row.expires_at, row.headers, row.created_at = expires_at, headers, created_at
        row.delivery_count, row.lock_token = 0, None
        row.last_error = row.last_error_at = row.due_at = row.claimed_at = None
        return "updated"

    # -- polls ---------------------------------------------------------------------------------
    def poll_plan(self, queue: str, max_count: int, taken: Callable[[Row], bool] | None = None
                  ) -> tuple[list[Row], list[Row], list[Row]]:
        """What a poll does (docs/concepts.md, "Delivery controls"): the candidates it takes, in delivery
        order, split into (expired, dead-lettered, delivered).

        With ``taken`` (what the database's poll did to a row: took it as a candidate or not), messages
        due at the very same instant and priority as the last one the batch can take are chosen as
        the database chose them, not by id (a known defect: see tests/core/test_model.py)."""
        cfg = self.configs.get(queue, QueueConfig())
        if cfg.paused:
            return [], [], []
        want = max_count
        if cfg.max_in_flight is not None:
            want = min(want, cfg.max_in_flight - sum(self.in_flight(r) for r in self.in_queue(queue)))
            if want <= 0:
                return [], [], []
        eligible = [r for r in self.in_queue(queue) if self.due(r.scheduled_at) and not r.blocked
                    and (r.group is None or r.dead_from is not None or self.heads.get((queue, r.group)) is r)]
        ordered = sorted(eligible, key=Row.order)
        candidates = ordered[:want]
        if taken is not None and len(ordered) > want:
            edge = ordered[want - 1].order()[:2]
            ties = [r for r in ordered if r.order()[:2] == edge]
            chosen = [r for r in ties if taken(r)]
            before = [r for r in ordered if r.order()[:2] < edge]
            if len(chosen) == want - len(before):
                candidates = before + chosen
        expired = [r for r in candidates if r.expires_at is not None and self.due(r.expires_at)]
        dead = [r for r in candidates if r not in expired
                and cfg.max_deliveries is not None and r.delivery_count >= cfg.max_deliveries]
        return expired, dead, [r for r in candidates if r not in expired and r not in dead]

    def dead_letter(self, rows: list[Row], queue: str, at: T) -> None:
        """Move rows to queue's dead-letter queue (sql/140_dead_letters.sql, as documented)."""
        cfg = self.configs[queue]
        assert cfg.dead_letter_queue is not None
        rows = sorted((r for r in rows if r in self.rows), key=lambda r: r.key)  # inserted in key order
        for row in rows:
            if row.lock_token is not None:  # died of lock expiry, when the lock expired
                row.last_error = f"lock expired: delivery {row.delivery_count} was not acknowledged"
                row.last_error_at = row.scheduled_at
            self.rows.remove(row)
            self.add(Row(
                cfg.dead_letter_queue, row.key, row.payload, row.payload_type, at, at, row.created_at, row.priority,
                row.group, row.expires_at, row.headers, last_error=row.last_error, last_error_at=row.last_error_at,
                dead_from=row.queue, dead_at=at, dead_from_id=row.id, dead_delivery_count=row.delivery_count,
                born=self.step, has_children=row.has_children))
        self.gone(rows, "dead", at)

    def gone(self, rows: list[Row], outcome: str, at: T) -> None:
        """What follows for dependencies from rows that left (removed already) with outcome acked,
        dead, cancelled or expired (sql/095_dependencies.sql, docs/api.md "Dependencies"): a leaving
        child's dependencies go with it (its row is gone); an ordinary row some offer named as a parent
        (has_children) releases its children when acknowledged, and otherwise applies each child's
        on_parent_failure: proceed (as acknowledged), dead_letter (to the child's queue's dead-letter
        queue, when it has one) or wait. A row that was never named a parent (has_children false)
        releases nothing, even when children wait for its key (they wait for an earlier message of it)."""
        self.events.update(f"a blocked child left: {outcome}" for r in rows if r.blocked)
        letters = {(r.dead_from, r.key) for r in rows if r.has_children and r.dead_from is not None}
        if any(p in c.parents for p in letters for c in self.rows):  # its 'wait' children keep waiting
            self.events["a dead-lettered parent's dead letter left"] += 1
        parents = {(r.queue, r.key) for r in rows if r.has_children and r.dead_from is None}
        children = [c for c in self.rows if c.parents & parents]
        if not children:
            return
        self.events[f"a parent with children left: {outcome}"] += 1
        if outcome == "acked":
            for c in children:
                c.parents -= parents
                c.released = not c.parents
                self.events["a child released (acknowledged parents)" if not c.parents
                            else "a child's parent acknowledged, others pending"] += 1
            return
        self.failed |= parents
        dead = []
        for c in children:
            if c.on_parent_failure == "proceed":
                c.parents -= parents
                c.released = not c.parents
                self.events["a child released (proceed)" if not c.parents else "proceed, others pending"] += 1
            elif c.on_parent_failure == "dead_letter" and self.configs[c.queue].dead_letter_queue is not None:
                dead.append(c)
                self.events["a child dead-lettered (dead_letter)"] += 1
            else:
                self.events[f"a child waits for a failed parent ({c.on_parent_failure})"] += 1
        for queue in sorted({c.queue for c in dead}):  # one dead-lettering per queue, in queue order
            self.dead_letter([c for c in dead if c.queue == queue], queue, at)

    def nack(self, row: Row, delay: int, error: str | None) -> None:
        now = self.instant()
        row.scheduled_at = now if delay == 0 else self.instant(delay)
        row.lock_token = None
        if error is not None:
            row.last_error, row.last_error_at = error, now
        cfg = self.configs.get(row.queue, QueueConfig())
        if cfg.max_deliveries is not None and row.delivery_count >= cfg.max_deliveries:
            self.dead_letter([row], row.queue, self.instant())

    def redrive(self, dead_letter_queue: str, max_count: int) -> int:
        cand = sorted((r for r in self.in_queue(dead_letter_queue) if r.dead_from is not None
                       and (r.lock_token is None or self.due(r.scheduled_at))),
                      key=lambda r: (r.dead_at.exact, r.id))[:max_count]  # type: ignore[union-attr]
        picked: dict[tuple[str, str], Row] = {}
        for r in cand:
            assert r.dead_from is not None
            picked.setdefault((r.dead_from, r.key), r)
        now = self.instant()
        moved = 0
        for (source, key), r in sorted(picked.items()):
            if self.ordinary(source, key) is not None:
                continue  # live again in its queue: stays a dead letter
            self.rows.remove(r)
            self.add(Row(source, key, r.payload, r.payload_type, now, now, r.created_at, r.priority, r.group,
                         r.expires_at, r.headers, last_error=r.last_error, last_error_at=r.last_error_at,
                         born=self.step, has_children=r.has_children))
            moved += 1
        return moved

    # -- groups --------------------------------------------------------------------------------
    def settle(self) -> None:
        """The head rule (docs/concepts.md, "FIFO message groups"), for every group; needs the ids."""
        heads: dict[tuple[str, str], Row] = {}
        members: dict[tuple[str, str], list[Row]] = {}
        for r in self.rows:
            if r.group is not None and r.dead_from is None and not r.blocked:
                members.setdefault((r.queue, r.group), []).append(r)
        for g, rows in members.items():
            kept = self.heads.get(g)
            if kept is not None and any(kept is r for r in rows) and (kept.delivery_count > 0
                                                                        or kept.lock_token is not None):
                heads[g] = kept
            else:
                heads[g] = min(rows, key=lambda r: (r.scheduled_at_initially.exact, r.id))
        self.heads = heads
