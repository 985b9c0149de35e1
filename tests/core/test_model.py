"""Model test: random sequences of calls of the whole message API, on a real server, compared with a
model of the documented semantics (tests/support/queuemodel.py) after every step.

Covered: dq_offer and dq_offer_many (created / updated / ignored, can_update true and false, other
scheduled_at, priority, message_group, expires_at, headers, payload_type), dq_poll_many (varied
max_count and lock_timeout), dq_ack, dq_ack_many, dq_nack (with and without a delay and an error),
dq_extend (longer or shorter than the lock), dq_cancel, dq_pause_queue / dq_resume_queue, dq_redrive,
lock expiry and due times by moving the test clock (tests/support/clock.py), never by sleeping. Three queues:
``q1`` (max_deliveries 2) and ``q2`` (max_deliveries 1, max_in_flight 3) dead-letter into ``dead``,
which is offered to and polled as well; the same keys are used in all three. Every token a poll
returns is kept and used again, so double acks, acks after a nack, after a redelivery, a replacement
or a cancel, and extends of lost locks all happen, and must answer what docs/api.md says.

After every step the invariant compares every column of dq_messages (ids, times, tokens, errors,
dead-letter columns), the FIFO group heads, and what dq_get, dq_list_messages and dq_dead_letters
return, with the model.

Dependencies (the seeds of DEPENDENCY_SEEDS and the random seed): dq_offer with ``after`` names one to three
parents, keys of the child's queue or [queue, key] pairs of any queue, existing, dead-lettered, blocked
themselves (chains) or absent (never offered or acknowledged: satisfied), with each on_parent_failure; the
parents are then acknowledged, nacked into the dead-letter queue, cancelled, expired by a poll or
redriven by the other steps. Besides the columns of blocked rows (parents_pending, release_at,
release_group, has_children), the dependency rows and dq_dependencies against the model, every step
checks from the database alone (check_dependencies): a poll never returns a message the model holds
blocked; a blocked row is stored blocked (never due, in no group, not in flight) with one dependency
row per parent it waits for; no dependency row outlives its child; nothing waits for a parent that is
neither live nor a dead letter unless that parent left otherwise than acknowledged (a 'wait' or a
'dead_letter' without a dead-letter queue); no FIFO group's head is blocked.

CI runs the fixed seeds of SEEDS and one random seed (``DQ_MODEL_SEED`` chooses it); a failure names
the seed, the step and the last steps, and ``DQ_MODEL_SEED=<seed> pytest tests/core/test_model.py -k random``
replays it.
"""

from __future__ import annotations

import os
import random
import secrets
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from clock import TestClock
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb
from queuemodel import TOLERANCE, UNIT, Model, QueueConfig, Row, T

from pyqueue import testing

SEEDS = list(range(1, 11))
DEPENDENCY_SEEDS = [*range(101, 116), 3811007694, 2782919141, 3078810941]  # random seeds that failed once (a
# dead_letter at once; a child released into a group by an expiry in the poll that delivers its head; a plain
# offer of a key children wait for)
#: Set while a known defect makes dq_extend of a FIFO group's head wrong, so the generator skips it
#: (the defect it was for, dq_groups.due_at left at the old lock expiry, is fixed and tested below).
KNOWN_DEFECT_EXTEND_GROUP_HEAD = False
#: Due messages with the very same scheduled_at and priority, cut by the batch limit, come in no
#: particular order (docs/api.md, Priority): the model lets the database choose among them, and
#: checks everything else.
KNOWN_DEFECT_TIES = True
STEPS = 400
QUEUES = ["q1", "q2", "dead"]
KEYS = ["k0", "k1", "k2", "k3", "k4"]
PAYLOADS = [b"a", b"b", b"\xff\x00"]  # the last is not UTF-8: dq_list_messages shows it in hex
PAYLOAD_TYPES = [None, "bytes", "app/x"]
PRIORITIES = [0, 0, 0, 1, 5]
GROUPS = [None, None, "A", "B"]
HEADERS: list[dict[str, Any] | None] = [None, None, {"trace": "t1"}, {"trace": "t2", "n": 1}]
ERRORS = [None, "boom", "timeout"]
PARENT_FAILURES = ["wait", "proceed", "dead_letter"]
BLOCKED_TIME = datetime(9999, 12, 31, tzinfo=UTC)  # a blocked message's stored scheduled_at
COLUMNS = ("id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, "
           "delivery_count, lock_token, last_error, last_error_at, dead_from, dead_at, dead_from_id, "
           "dead_delivery_count, due_at, claimed_at, priority, message_group, expires_at, headers, cron_prefix, "
           "parents_pending, release_at, release_group, has_children")
DELIVERY = ("id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, delivery_count, "
            "lock_token, locked_until, claimed_at, priority, message_group, expires_at, headers")


class Run:
    """One random sequence: the database and the model side by side."""

    def __init__(self, conn: psycopg.Connection[Any], clock: TestClock, seed: int, dependencies: bool = False) -> None:
        self.conn, self.clock, self.rnd = conn, clock, random.Random(seed)
        self.dependencies = dependencies
        conn.execute("SELECT dq_configure_queue('q1', 2, 'dead')")
        conn.execute("SELECT dq_configure_queue('q2', 1, 'dead', max_in_flight => 3)")
        configs = {"q1": QueueConfig(2, "dead"), "q2": QueueConfig(1, "dead", max_in_flight=3), "dead": QueueConfig()}
        self.model = Model(clock.now(), configs)
        self.tokens: list[uuid.UUID] = []
        self.last_offer: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.max_id = 0
        self.log: list[str] = []
        self.seen: Counter[str] = Counter()  # the cases a run reached (REQUIRED)

    # -- helpers -------------------------------------------------------------------------------
    def one(self, query: str, *params: Any) -> Any:
        row = self.conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]

    def check_time(self, t: T | None, value: datetime | None, what: str) -> None:
        if t is None:
            assert value is None, what
        elif t.exact is None:
            assert value is not None, what
            low = self.model.base + t.grid * UNIT
            assert low <= value < low + TOLERANCE, (what, value, low)
            t.exact = value
        else:
            assert value == t.exact, (what, value, t.exact)

    def token_case(self, call: str, token: uuid.UUID, row: Row | None) -> str:
        if row is None:
            return f"{call}: stale token" if token in self.tokens else f"{call}: unknown token"
        return f"{call}: lock expired, not re-acquired" if not self.model.in_flight(row) else f"{call}: held"

    def token(self) -> uuid.UUID:
        """A token polls returned (recent ones more often), sometimes one no poll ever returned."""
        r = self.rnd.random()
        if not self.tokens or r < 0.05:
            return uuid.uuid4()
        if r < 0.75:
            return self.rnd.choice(self.tokens[-8:])
        return self.rnd.choice(self.tokens)

    def offer_args(self, queue: str, key: str) -> tuple[Any, ...]:
        """Values for one offer: often the previous offer of the key again, or with one thing changed."""
        last = self.last_offer.get((queue, key))
        rnd = self.rnd
        if last is not None and rnd.random() < 0.5:
            args = list(last)
            if rnd.random() < 0.5:  # change one thing (or, for the schedule, pick it anew)
                i = rnd.randrange(7)
                args[i] = self.offer_args_fresh()[i]
                if args[5] is not None and args[5][0] <= args[1][0]:
                    args[5] = None  # the expiry must stay after the schedule
            return tuple(args)
        return self.offer_args_fresh()

    def offer_args_fresh(self) -> tuple[Any, ...]:
        rnd, m = self.rnd, self.model.m
        when = (rnd.choice([m - 1, m, m, m + 1, m + 2]), timedelta(minutes=rnd.choice([1, 8, 15])))
        expiry = None if rnd.random() < 0.75 else (when[0] + rnd.choice([1, 2]), timedelta(minutes=5))
        return (rnd.choice(PAYLOADS), when, rnd.choice(PAYLOAD_TYPES), rnd.choice(PRIORITIES), rnd.choice(GROUPS),
                expiry, rnd.choice(HEADERS))

    def model_offer(self, queue: str, key: str, args: tuple[Any, ...], can_update: bool, created: T) -> str:
        payload, when, ptype, priority, group, expiry, headers = args
        return self.model.offer(queue, key, payload, ptype or "bytes", self.model.given(*when), can_update, priority,
                                group, self.model.given(*expiry) if expiry else None, headers, created)

    def sql_time(self, when: tuple[int, timedelta] | None) -> datetime | None:
        return None if when is None else self.model.given(*when).exact

    # -- steps ---------------------------------------------------------------------------------
    def offer(self) -> str:
        queue, key = self.rnd.choice(QUEUES), self.rnd.choice(KEYS)
        args, can_update = self.offer_args(queue, key), self.rnd.random() < 0.7
        self.last_offer[(queue, key)] = args
        payload, when, ptype, priority, group, expiry, headers = args
        before = self.model.ordinary(queue, key)
        blocked = before is not None and before.blocked
        expected = self.model_offer(queue, key, args, can_update, self.model.instant())
        self.seen.update(["a blocked message updated"] * (blocked and expected == "updated"))
        got = self.one("SELECT dq_offer(%s, %s, %s::bytea, %s, %s, %s, %s, %s, %s, %s)",
                       queue, key, payload, self.sql_time(when), can_update, ptype, priority, group,
                       self.sql_time(expiry), Jsonb(headers) if headers is not None else None)
        assert got == expected, (got, expected)
        self.seen[f"offer {got}" + ("" if can_update else " (can_update false)")] += 1
        return f"offer {queue} {key} {args} can_update={can_update} -> {got}"

    def offer_many(self) -> str:
        queue, can_update = self.rnd.choice(QUEUES), self.rnd.random() < 0.7
        keys = self.rnd.sample(KEYS, self.rnd.randint(1, 4))
        items = {k: self.offer_args(queue, k) for k in keys}
        for k in keys:
            self.last_offer[(queue, k)] = items[k]
        created = self.model.instant()  # one transaction: one created_at
        outcomes = {k: self.model_offer(queue, k, items[k], can_update, created) for k in sorted(keys)}
        col = list(zip(*items.values(), strict=True))
        got = self.conn.execute(
            "SELECT key, outcome FROM dq_offer_many(%s, %s, %s::bytea[], %s::timestamptz[], %s, %s::text[], "
            "%s::integer[], %s::text[], %s::timestamptz[], %s::jsonb[])",
            (queue, keys, list(col[0]), [self.sql_time(w) for w in col[1]], can_update, list(col[2]), list(col[3]),
             list(col[4]), [self.sql_time(e) for e in col[5]],
             [Jsonb(h) if h is not None else None for h in col[6]])).fetchall()
        assert got == [(k, outcomes[k]) for k in keys]
        self.seen.update(f"offer_many {o}" for o in outcomes.values())
        return f"offer_many {queue} {items} can_update={can_update} -> {got}"

    def poll(self) -> str:
        queue, n, lock = self.rnd.choice(QUEUES), self.rnd.randint(1, 4), self.rnd.choice([1, 1, 2, 3])
        model = self.model
        cfg = model.configs[queue]
        due = [r for r in model.in_queue(queue) if model.due(r.scheduled_at) and not r.blocked]
        blocked = {r.id for r in model.in_queue(queue) if r.blocked}
        rows = self.conn.execute(f"SELECT {DELIVERY} FROM dq_poll_many(%s, %s, %s)",  # noqa: S608 - constant
                                 (queue, n, lock * UNIT)).fetchall()
        returned = {r[0] for r in rows}
        assert not returned & blocked, ("a blocked message was polled", sorted(returned & blocked))
        present = {r[0] for r in self.conn.execute("SELECT id FROM dq_messages WHERE queue = %s", (queue,))}
        strict = model.poll_plan(queue, n)
        expired, dead, delivered = model.poll_plan(
            queue, n, (lambda r: r.id in returned or r.id not in present) if KNOWN_DEFECT_TIES else None)
        if (expired, dead, delivered) != strict:
            self.seen["poll: equal due times at the batch limit, not taken by id"] += 1
        self.seen.update(
            ["poll of a paused queue"] * (cfg.paused and bool(due))
            + ["poll held by max_in_flight"] * (not cfg.paused and bool(due) and not (expired or dead or delivered))
            + ["poll: a message held behind its group's head"] * any(
                r.group is not None and r.dead_from is None and model.heads.get((queue, r.group)) is not r
                for r in due)
            + ["poll removes an expired message"] * bool(expired) + ["poll dead-letters (lock expired)"] * bool(dead)
            + ["poll redelivers after lock expiry"] * any(r.lock_token is not None for r in delivered)
            + ["poll delivers a dead letter"] * any(r.dead_from is not None for r in delivered))
        assert [r[0] for r in rows] == [d.id for d in delivered], (
            "poll", [(r[0], r[2]) for r in rows], [(d.id, d.key) for d in delivered])
        for r in expired:
            model.rows.remove(r)
        model.gone(expired, "expired", model.instant())
        if dead:
            model.dead_letter(dead, queue, model.instant())
        until, claimed = model.instant(lock), model.instant()
        for got, row in zip(rows, delivered, strict=True):
            (id_, q, key, payload, ptype, due, initially, created, count, token, locked_until, claimed_at, priority,
             group, expires, headers) = got
            assert (id_, q, key, bytes(payload), ptype, priority, group, headers) == (
                row.id, row.queue, row.key, row.payload, row.payload_type, row.priority, row.group, row.headers)
            assert (due, initially, created) == (row.scheduled_at.exact, row.scheduled_at_initially.exact,
                                                 row.created_at.exact)
            self.check_time(row.expires_at, expires, "expires_at")
            row.due_at, row.scheduled_at, row.claimed_at = row.scheduled_at, until, claimed
            self.check_time(until, locked_until, "locked_until")
            self.check_time(claimed, claimed_at, "claimed_at")
            row.delivery_count += 1
            assert count == row.delivery_count
            if row.released:
                self.seen["a released child delivered"] += 1
            assert token not in self.tokens
            row.lock_token = token
            self.tokens.append(token)
        return (f"poll {queue} {n} lock={lock} -> {[r[2] for r in rows]} expired={[r.key for r in expired]} "
                f"dead={[r.key for r in dead]}")

    def ack(self) -> str:
        token = self.token()
        row = self.model.holder(token)
        got = self.one("SELECT dq_ack(%s::uuid)", token)
        assert got is (row is not None)
        self.seen[self.token_case("ack", token, row)] += 1
        if row is not None:
            self.model.rows.remove(row)
            self.model.gone([row], "acked", self.model.instant())
        return f"ack {token} -> {got}"

    def ack_many(self) -> str:
        tokens: list[uuid.UUID | None] = [self.token() for _ in range(self.rnd.randint(0, 4))]
        if tokens and self.rnd.random() < 0.3:
            tokens.append(tokens[0])  # the same token twice counts once
        if self.rnd.random() < 0.2:
            tokens.append(None)  # NULL elements match nothing
        held = {id(r): r for r in map(self.model.holder, tokens) if r is not None}
        got = self.one("SELECT dq_ack_many(%s::uuid[])", tokens)
        assert got == len(held)
        if 0 < got < len({t for t in tokens if t is not None}):
            self.seen["ack_many: some tokens stale"] += 1
        for row in held.values():
            self.model.rows.remove(row)
        self.model.gone(list(held.values()), "acked", self.model.instant())
        return f"ack_many {tokens} -> {got}"

    def nack(self) -> str:
        token, delay, error = self.token(), self.rnd.choice([0, 0, 1, 2]), self.rnd.choice(ERRORS)
        row = self.model.holder(token)
        got = self.one("SELECT dq_nack(%s::uuid, %s, %s)", token, delay * UNIT, error)
        assert got is (row is not None)
        self.seen[self.token_case("nack", token, row)] += 1
        if row is not None:
            cfg = self.model.configs[row.queue]
            self.seen.update(["nack with a delay"] * (delay > 0) + ["nack with an error"] * (error is not None)
                             + ["nack dead-letters"] * (cfg.max_deliveries is not None
                                                        and row.delivery_count >= cfg.max_deliveries))
            self.model.nack(row, delay, error)
        return f"nack {token} delay={delay} error={error} -> {got}"

    def extend(self) -> str:
        token, lock = self.token(), self.rnd.choice([1, 2, 3])
        row = self.model.holder(token)
        if row is not None and row.group is not None and row.dead_from is None and KNOWN_DEFECT_EXTEND_GROUP_HEAD:
            # Extending the lock of a FIFO group's head leaves its group's due time behind (a known
            # defect, test_extend_of_a_group_heads_lock_*): not generated while it stands.
            return f"extend {token}: skipped, a group's head"
        got = self.one("SELECT dq_extend(%s::uuid, %s)", token, lock * UNIT)
        self.seen[self.token_case("extend", token, row)] += 1
        if row is None:
            assert got is None
        else:
            row.scheduled_at = self.model.instant(lock)
            self.check_time(row.scheduled_at, got, "dq_extend")
        return f"extend {token} lock={lock} -> {got}"

    def cancel(self) -> str:
        queue, key = self.rnd.choice(QUEUES), self.rnd.choice(KEYS)
        gone = [r for r in self.model.in_queue(queue) if r.key == key]
        got = self.one("SELECT dq_cancel(%s, %s)", queue, key)
        assert got is bool(gone)
        self.seen.update(["cancel"] * bool(gone) + ["cancel of a dead letter"] * any(r.dead_from for r in gone))
        self.seen.update(["cancel of a blocked message"] * any(r.blocked for r in gone))
        for r in gone:
            self.model.rows.remove(r)
        self.model.gone(gone, "cancelled", self.model.instant())
        return f"cancel {queue} {key} -> {got}"

    def pause_or_resume(self) -> str:
        queue = self.rnd.choice(QUEUES)
        cfg = self.model.configs[queue]
        pause = (not cfg.paused) if self.rnd.random() < 0.8 else cfg.paused  # sometimes the same again
        got = self.one("SELECT dq_pause_queue(%s)" if pause else "SELECT dq_resume_queue(%s)", queue)
        assert got is (pause != cfg.paused)
        self.seen[f"{'pause' if pause else 'resume'} -> {got}"] += 1
        cfg.paused = pause
        return f"{'pause' if pause else 'resume'} {queue} -> {got}"

    def redrive(self) -> str:
        n = self.rnd.choice([1, 2, 1000])
        model = self.model
        letters = [r for r in model.in_queue("dead") if r.dead_from is not None]
        waited = {(r.dead_from, r.key) for r in letters if any((r.dead_from, r.key) in c.parents for c in model.rows)}
        expected = model.redrive("dead", n)
        self.seen.update(["redrive of a parent some child waits for"] * any(
            model.ordinary(q, k) is not None and model.ordinary(q, k).has_children  # type: ignore[union-attr]
            for q, k in waited))
        got = self.one("SELECT dq_redrive('dead', %s)", n)
        assert got == expected
        left = [r for r in letters if r in model.rows]
        self.seen.update(["redrive moves"] * (got > 0) + ["redrive skips one in flight"] * any(
            model.in_flight(r) for r in left) + ["redrive skips a key live in its queue"] * any(
            model.ordinary(r.dead_from, r.key) is not None and not model.in_flight(r) for r in left if r.dead_from))
        return f"redrive {n} -> {got}"

    def after_list(self, queue: str, key: str) -> list[Any]:
        """One to three parents for an offer with after: messages that exist (often: blocked ones make
        chains), dead-lettered ones, or any (queue, key) (absent ones are satisfied); a key of the
        child's own queue is sometimes given as a plain string. Rarely the child itself or a parent twice."""
        rnd, model = self.rnd, self.model
        live = [(r.queue, r.key) for r in model.rows if r.dead_from is None]
        dead = [(r.dead_from, r.key) for r in model.rows if r.dead_from is not None]
        after: list[Any] = []
        for _ in range(rnd.choice([1, 1, 2, 2, 3])):
            r = rnd.random()
            if r < 0.6 and live:
                q, k = rnd.choice(live)
            elif r < 0.75 and dead:
                q, k = rnd.choice(dead)
            else:
                q, k = rnd.choice(QUEUES), rnd.choice(KEYS)
            if (q, k) == (queue, key) and rnd.random() < 0.8:
                continue
            after.append(k if q == queue and rnd.random() < 0.5 else [q, k])
        if after and rnd.random() < 0.05:
            after.append(after[0])  # named twice: one parent
        return after or [rnd.choice(KEYS)]

    def model_offer_after(self, queue: str, key: str, args: tuple[Any, ...], can_update: bool, after: list[Any],
                          on_parent_failure: str) -> tuple[str | None, str | None]:
        """(outcome, None) or (None, the error's text) as docs/api.md "Dependencies" says; the model is
        changed only when there is no error."""
        model = self.model
        pairs = sorted({(queue, e) if isinstance(e, str) else (e[0], e[1]) for e in after})
        if (queue, key) in pairs:
            return None, "names the message itself"
        if model.ordinary(queue, key) is not None:
            return (None, "after applies to a new message") if can_update else ("ignored", None)
        orphans = any((queue, key) in r.parents for r in model.rows)
        if orphans:  # children still wait for an earlier message of this key: its parents may not descend from it
            descendants, todo = set(), [(queue, key)]
            while todo:
                p = todo.pop()
                for c in model.rows:
                    if p in c.parents and (c.queue, c.key) not in descendants:
                        descendants.add((c.queue, c.key))
                        todo.append((c.queue, c.key))
            if descendants & set(pairs):
                return None, "a cycle"
        rows = [r for r in model.rows if (r.queue if r.dead_from is None else r.dead_from, r.key) in pairs]
        for r in rows:  # each parent that exists, live or a dead letter, is marked
            r.has_children = True
        existing = {(r.queue if r.dead_from is None else r.dead_from, r.key) for r in rows}
        # A parent that is only a dead letter failed already: the child's choice applies at once.
        failed = {p for p in existing if model.ordinary(*p) is None}
        if failed and on_parent_failure == "proceed":
            existing -= failed
            self.seen["offer after: a dead-lettered parent, proceed (satisfied)"] += 1
        outcome = self.model_offer(queue, key, args, can_update, model.instant())
        assert outcome == "created"
        if existing:
            child = model.ordinary(queue, key)
            assert child is not None
            child.parents, child.on_parent_failure, child.has_children = existing, on_parent_failure, orphans
            if failed and on_parent_failure == "dead_letter" and model.configs[queue].dead_letter_queue is not None:
                self.seen["offer after: a dead-lettered parent, dead_letter (moved at once)"] += 1
                model.dead_letter([child], queue, model.instant())
        self.seen.update(["offer after: blocked" if existing else "offer after: every parent absent (satisfied)"]
                         + ["offer after: a parent in another queue"] * any(q != queue for q, _ in existing)
                         + ["offer after: a blocked parent (a chain)"] * any(
                             (p := model.ordinary(q, k)) is not None and p.blocked for q, k in existing)
                         + ["offer after: a dead-lettered parent"] * any(
                             model.ordinary(q, k) is None for q, k in existing)
                         + ["offer after: some parents absent"] * (0 < len(existing) < len(pairs))
                         + ["offer after: children wait for the key already"] * orphans)
        return outcome, None

    def offer_after(self) -> str:
        rnd, model = self.rnd, self.model
        queue = rnd.choice(QUEUES)
        free = [k for k in KEYS if model.ordinary(queue, k) is None]
        key = rnd.choice(free) if free and rnd.random() < 0.85 else rnd.choice(KEYS)
        args, can_update = self.offer_args(queue, key), rnd.random() < 0.7
        failure, after = rnd.choice(PARENT_FAILURES), self.after_list(queue, key)
        self.last_offer[(queue, key)] = args
        payload, when, ptype, priority, group, expiry, headers = args
        expected, problem = self.model_offer_after(queue, key, args, can_update, after, failure)
        try:
            got = self.one("SELECT dq_offer(%s, %s, %s::bytea, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                           queue, key, payload, self.sql_time(when), can_update, ptype, priority, group,
                           self.sql_time(expiry), Jsonb(headers) if headers is not None else None, Jsonb(after),
                           failure)
        except psycopg.errors.InvalidParameterValue as exc:
            assert problem is not None and problem in str(exc), (problem, str(exc))
            self.seen[f"offer after refused: {problem}"] += 1
            return f"offer {queue} {key} after={after} {failure} -> 22023 {problem}"
        assert problem is None, problem
        assert got == expected, (got, expected)
        self.seen[f"offer after {got}"] += 1
        return f"offer {queue} {key} {args} after={after} {failure} can_update={can_update} -> {got}"

    def advance(self) -> str:
        units = self.rnd.choice([1, 1, 2])
        self.clock.advance(units * UNIT)
        self.model.m += units
        return f"advance {units} -> m={self.model.m}"

    STEPS: list[tuple[Callable[[Run], str], int]] = [
        (offer, 14), (offer_many, 4), (poll, 14), (ack, 7), (ack_many, 4), (nack, 8), (extend, 5), (cancel, 3),
        (pause_or_resume, 2), (redrive, 4), (advance, 8)]
    DEPENDENCY_STEPS: list[tuple[Callable[[Run], str], int]] = [(offer_after, 12)]

    # -- the invariant -------------------------------------------------------------------------
    def check(self) -> None:
        model = self.model
        rows = self.conn.execute(f"SELECT {COLUMNS} FROM dq_messages ORDER BY id").fetchall()  # noqa: S608
        by_identity = {(r[1], r[2], r[14]): r for r in rows}
        assert len(by_identity) == len(rows)
        for r in model.rows:
            if r.id is None and r.dead_from is not None and r.dead_from_id is None:
                # A child its offer dead-lettered at once (a parent was a dead letter): the row it left
                # was inserted by this step, so its id (the dead letter's dead_from_id) is new: learned here.
                ids = [i for q, k, i in by_identity if (q, k) == (r.queue, r.key) and i is not None and i > self.max_id]
                assert len(ids) == 1, (r.queue, r.key, ids, self.max_id)
                r.dead_from_id = ids[0]
        expected = {r.identity: r for r in model.rows}
        assert set(by_identity) == set(expected), (sorted(by_identity, key=str), sorted(expected, key=str))
        new = sorted((r for r in model.rows if r.id is None), key=lambda r: r.seq)
        for r in new:  # rows inserted by this step: new ids, in the order of the inserts (Model.add)
            r.id = by_identity[r.identity][0]
            assert r.id > self.max_id, (r.key, r.id, self.max_id)
            self.max_id = r.id
        for ident, row in expected.items():
            (id_, _, _, payload, ptype, scheduled_at, initially, created, count, token, last_error, last_error_at,
             dead_from, dead_at, dead_from_id, dead_count, due_at, claimed_at, priority, group, expires, headers,
             cron_prefix, parents_pending, release_at, release_group, has_children) = by_identity[ident]
            blocked = row.blocked
            assert (id_, bytes(payload), ptype, count, token, last_error, dead_from, dead_from_id, dead_count,
                    priority, group, headers, cron_prefix, parents_pending, release_group, has_children) == (
                row.id, row.payload, row.payload_type, row.delivery_count, row.lock_token, row.last_error,
                row.dead_from, row.dead_from_id, row.dead_delivery_count, row.priority,
                None if blocked else row.group, row.headers, None, len(row.parents), row.group if blocked else None,
                row.has_children
            ), ident
            if blocked:  # stored never due; its due time is kept for its release
                assert scheduled_at == BLOCKED_TIME, (ident, scheduled_at)
                scheduled_at, release_at = release_at, None
            assert release_at is None, (ident, release_at)
            for t, value, what in ((row.scheduled_at, scheduled_at, "scheduled_at"),
                                   (row.scheduled_at_initially, initially, "scheduled_at_initially"),
                                   (row.created_at, created, "created_at"), (row.last_error_at, last_error_at,
                                                                             "last_error_at"),
                                   (row.dead_at, dead_at, "dead_at"), (row.due_at, due_at, "due_at"),
                                   (row.claimed_at, claimed_at, "claimed_at"), (row.expires_at, expires, "expires_at")):
                self.check_time(t, value, f"{ident} {what}")
        model.settle()
        letters = [(r.key, r.dead_from) for r in model.in_queue("dead") if r.dead_from is not None]
        self.seen.update(["dead letters sharing a key"] * (len({k for k, _ in letters}) < len(letters))
                         + ["the same key live in q1 and q2"] * any(model.ordinary("q2", r.key) for r in
                                                                    model.in_queue("q1") if r.dead_from is None))
        heads = {(q, g): (h, p) for q, g, h, p in self.conn.execute(
            "SELECT queue, message_group, head_id, priority FROM dq_groups").fetchall()}
        assert heads == {g: (r.id, r.priority) for g, r in model.heads.items()}
        in_flight = [(r.queue, r.group) for r in model.rows
                     if r.group is not None and r.dead_from is None and model.in_flight(r)]
        assert len(in_flight) == len(set(in_flight)), "two messages of one group in flight"
        deps = set(self.conn.execute(
            "SELECT parent_queue, parent_key, child_id, on_parent_failure FROM dq_dependencies").fetchall())
        assert deps == {(q, k, r.id, r.on_parent_failure) for r in model.rows for q, k in r.parents}
        self.check_dependencies()
        self.check_reads()

    def check_dependencies(self) -> None:
        """What holds of dependencies from the database alone (the model only says which parents failed)."""
        malformed = self.conn.execute(
            "SELECT m.queue, m.key, m.scheduled_at, m.message_group, m.lock_token, m.dead_from, m.parents_pending, "
            "(SELECT count(*) FROM dq_dependencies d WHERE d.child_id = m.id) FROM dq_messages m "
            "WHERE m.parents_pending > 0 AND (m.scheduled_at <> %s OR m.message_group IS NOT NULL "
            "OR m.lock_token IS NOT NULL OR m.dead_from IS NOT NULL OR m.delivery_count > 0 "
            "OR m.parents_pending <> (SELECT count(*) FROM dq_dependencies d WHERE d.child_id = m.id))",
            (BLOCKED_TIME,)).fetchall()
        assert malformed == [], ("blocked rows not stored blocked, or not one dependency row per parent", malformed)
        orphans = self.conn.execute(
            "SELECT d.* FROM dq_dependencies d WHERE NOT EXISTS (SELECT 1 FROM dq_messages m "
            "WHERE m.id = d.child_id AND m.parents_pending > 0)").fetchall()
        assert orphans == [], ("dependency rows of a child that left or is not blocked", orphans)
        waiting = self.conn.execute(
            "SELECT d.parent_queue, d.parent_key, d.on_parent_failure, c.queue FROM dq_dependencies d "
            "JOIN dq_messages c ON c.id = d.child_id "
            "WHERE NOT EXISTS (SELECT 1 FROM dq_messages p WHERE p.key = d.parent_key "
            "                  AND (p.queue = d.parent_queue AND p.dead_from IS NULL OR p.dead_from = d.parent_queue))"
            ).fetchall()
        for q, k, failure, child_queue in waiting:  # the parent is gone: it must have failed, and not 'proceed'
            assert (q, k) in self.model.failed and (failure == "wait" or (
                failure == "dead_letter" and self.model.configs[child_queue].dead_letter_queue is None)), (
                "blocked by a parent that is neither live nor a dead letter", (q, k, failure, child_queue))
        heads = self.conn.execute("SELECT g.queue, g.message_group FROM dq_groups g JOIN dq_messages m "
                                  "ON m.id = g.head_id WHERE m.parents_pending > 0").fetchall()
        assert heads == [], ("a blocked message heads a group", heads)

    def expected_dependencies(self, q: str, k: str) -> list[tuple[Any, ...]]:
        """What dq_dependencies(q, k) returns, by the model (sorted)."""
        model = self.model

        def state(pq: str, pk: str) -> str:
            p = model.ordinary(pq, pk)
            if p is None:
                return "dead" if any(r.dead_from == pq and r.key == pk for r in model.rows) else "absent"
            if p.blocked or model.in_flight(p):
                return model.state(p)
            if p.expires_at is not None and model.due(p.expires_at):
                return "expired"
            if p.group is not None and model.heads.get((pq, p.group)) is not p:
                return "held"
            return model.state(p)

        child = model.ordinary(q, k)
        parents = [("parent", pq, pk, state(pq, pk), child.on_parent_failure)
                   for pq, pk in sorted(child.parents)] if child is not None else []
        return sorted(parents + [("child", c.queue, c.key, "blocked", c.on_parent_failure) for c in model.rows
                                 if (q, k) in c.parents])

    def check_reads(self) -> None:
        """What the reading functions return: dq_get, dq_list_messages, dq_dead_letters."""
        model = self.model

        def locked_until(r: Row) -> datetime | None:
            return r.scheduled_at.exact if model.in_flight(r) else None

        def text(payload: bytes) -> str:
            try:
                return payload.decode()
            except UnicodeDecodeError:
                return "\\x" + payload.hex()

        pairs = sorted({(q, k) for q in QUEUES for k in KEYS})
        # A blocked message: the reading functions' columns for it are checked by the visibility tests;
        # here only that they list it (the model checks its stored columns above).
        blocked = {r.id: r for r in model.rows if r.blocked}
        got = self.conn.execute(
            "SELECT p.q, p.k, g.* FROM unnest(%s::text[], %s::text[]) AS p(q, k) CROSS JOIN LATERAL dq_get(p.q, p.k) g",
            ([q for q, _ in pairs], [k for _, k in pairs])).fetchall()
        assert {g[2] for g in got if g[2] in blocked} == set(blocked)
        got = [g for g in got if g[2] not in blocked]
        expected = []
        for q, k in pairs:
            rows = sorted((r for r in model.in_queue(q) if r.key == k and not r.blocked),
                          key=lambda r: (r.dead_at is not None, r.dead_at.exact if r.dead_at else None, r.id))
            expected += [(q, k, r.id, q, k, r.payload, r.payload_type, r.scheduled_at.exact,
                          r.scheduled_at_initially.exact, r.created_at.exact, r.delivery_count, locked_until(r),
                          r.priority, r.group, r.expires_at.exact if r.expires_at else None, r.headers) for r in rows]
        # The last column, released_at (the release time of a child), is checked by
        # tests/workflows/test_release_time.py; the model does not keep times of releases.
        assert [(*g[:5], bytes(g[5]), *g[6:-1]) for g in got] == expected
        for q in QUEUES:
            listed = self.conn.execute("SELECT * FROM dq_list_messages(%s, NULL, 10000)", (q,)).fetchall()
            held = {r.key for r in blocked.values() if r.queue == q}
            assert sorted((m[0], m[1] in ("blocked", "scheduled")) for m in listed if m[0] in held and m[10] is None
                          ) == [(key, True) for key in sorted(held)], q
            listed = [m[:-1] for m in listed if not (m[0] in held and m[10] is None)]  # without released_at
            rows = sorted((r for r in model.in_queue(q) if not r.blocked), key=lambda r: (r.scheduled_at.exact, r.id))
            assert listed == [
                (r.key, model.state(r), r.scheduled_at.exact, r.delivery_count, locked_until(r), r.last_error,
                 r.last_error_at.exact if r.last_error_at else None, r.created_at.exact, r.priority, r.group,
                 r.dead_from, r.payload_type, text(r.payload), 0) for r in rows], q  # 0: parents_pending
        dead = sorted((r for r in model.in_queue("dead") if r.dead_from is not None),
                      key=lambda r: (r.dead_at.exact, r.id))  # type: ignore[union-attr]
        assert self.conn.execute("SELECT * FROM dq_dead_letters('dead', 10000)").fetchall() == [
            (r.key, r.dead_from, r.dead_from_id, r.dead_at.exact, r.dead_delivery_count,  # type: ignore[union-attr]
             r.delivery_count, r.last_error, r.last_error_at.exact if r.last_error_at else None, r.payload_type,
             text(r.payload), r.headers, locked_until(r)) for r in dead]
        if self.dependencies:
            got = self.conn.execute(
                "SELECT p.q, p.k, d.* FROM unnest(%s::text[], %s::text[]) AS p(q, k) "
                "CROSS JOIN LATERAL dq_dependencies(p.q, p.k) d",
                ([q for q, _ in pairs], [k for _, k in pairs])).fetchall()
            for q, k in pairs:
                assert sorted(g[2:] for g in got if g[:2] == (q, k)) == self.expected_dependencies(q, k), (q, k)

    def run(self, seed: int, steps: int) -> Counter[str]:
        functions, weights = zip(*(self.STEPS + self.DEPENDENCY_STEPS * self.dependencies), strict=True)
        for n in range(1, steps + 1):
            self.model.step = n
            step = self.rnd.choices(functions, weights)[0]
            try:
                self.log.append(f"{n}: {step(self)}")
                self.check()
            except Exception as exc:
                recent = "\n".join(self.log[-15:])
                raise AssertionError(
                    f"model test: seed {seed} failed at step {n} ({step.__name__}): {exc!r}\nlast steps:\n{recent}\n"
                    f"the model at the failure (m={self.model.m}):\n{self.model.describe()}\n"
                    f"replay: DQ_MODEL_SEED={seed} pytest tests/core/test_model.py -k random") from exc
        return self.seen + self.model.events


#: The cases the fixed seeds must reach, together (Run.seen): a change of the generator or of the
#: weights that stopped exercising one would make the model test prove less without failing.
REQUIRED = {
    "offer created", "offer updated", "offer ignored", "offer created (can_update false)",
    "offer ignored (can_update false)", "offer_many created", "offer_many updated", "offer_many ignored",
    "poll of a paused queue", "poll held by max_in_flight", "poll: a message held behind its group's head",
    "poll removes an expired message", "poll dead-letters (lock expired)", "poll redelivers after lock expiry",
    "poll delivers a dead letter",
    "ack: held", "ack: lock expired, not re-acquired", "ack: stale token", "ack: unknown token",
    "ack_many: some tokens stale",
    "nack: held", "nack: lock expired, not re-acquired", "nack: stale token", "nack: unknown token",
    "nack with a delay", "nack with an error", "nack dead-letters",
    "extend: held", "extend: lock expired, not re-acquired", "extend: stale token", "extend: unknown token",
    "cancel", "cancel of a dead letter", "pause -> True", "pause -> False", "resume -> True", "resume -> False",
    "redrive moves", "redrive skips one in flight", "redrive skips a key live in its queue",
    "dead letters sharing a key", "the same key live in q1 and q2",
}


def random_seed() -> int:
    return int(os.environ.get("DQ_MODEL_SEED") or secrets.randbelow(2**32))


#: The dependency cases DEPENDENCY_SEEDS must reach, together.
REQUIRED_DEPENDENCIES = {
    "offer after created", "offer after ignored", "offer after: blocked",
    "offer after: every parent absent (satisfied)",
    "offer after: a parent in another queue", "offer after: a blocked parent (a chain)",
    "offer after: a dead-lettered parent", "offer after: some parents absent",
    "offer after: a dead-lettered parent, proceed (satisfied)",
    "offer after: a dead-lettered parent, dead_letter (moved at once)",
    "offer after: children wait for the key already",
    "offer after refused: names the message itself", "offer after refused: after applies to a new message",
    "offer after refused: a cycle",
    "a parent with children left: acked", "a parent with children left: dead", "a parent with children left: cancelled",
    "a parent with children left: expired",
    "a child released (acknowledged parents)", "a child's parent acknowledged, others pending",
    "a child released (proceed)", "a child dead-lettered (dead_letter)", "a child waits for a failed parent (wait)",
    "a child waits for a failed parent (dead_letter)", "a blocked child left: cancelled", "a blocked child left: dead",
    "cancel of a blocked message", "a blocked message updated", "redrive of a parent some child waits for",
    "a released child delivered",
}


def run_seeds(admin_dsn: str, template_dsn: str, seeds: list[int], dependencies: bool) -> Counter[str]:
    """Each seed on a fresh database; the cases reached, together."""
    template = str(conninfo_to_dict(template_dsn)["dbname"])
    seen: Counter[str] = Counter()
    for seed in seeds:
        dsn = testing.clone_database(admin_dsn, template)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                clock = TestClock(dsn)
                try:
                    seen += Run(conn, clock, seed, dependencies).run(seed, STEPS)
                finally:
                    clock.close()
        finally:
            testing.drop_database(admin_dsn, str(conninfo_to_dict(dsn)["dbname"]))
    print(dict(sorted(seen.items())))
    return seen


@pytest.mark.slow
def test_queue_matches_model_fixed_seeds(admin_dsn: str, template_dsn: str) -> None:
    """The fixed seeds, each on a fresh database, and together they reach every case of REQUIRED."""
    seen = run_seeds(admin_dsn, template_dsn, SEEDS, dependencies=False)
    assert REQUIRED - set(seen) == set()


@pytest.mark.slow
def test_dependencies_match_model_fixed_seeds(admin_dsn: str, template_dsn: str) -> None:
    """The seeds with offers after parents: every case of REQUIRED_DEPENDENCIES (and of REQUIRED) reached."""
    seen = run_seeds(admin_dsn, template_dsn, DEPENDENCY_SEEDS, dependencies=True)
    assert (REQUIRED | REQUIRED_DEPENDENCIES) - set(seen) == set()


@pytest.mark.slow
def test_queue_matches_model_random_seed(conn: psycopg.Connection[Any], clock: TestClock) -> None:
    """One random seed per run, with dependencies (printed; DQ_MODEL_SEED replays it, or any fixed seed)."""
    seed = random_seed()
    print(f"model test seed {seed}")
    seen = Run(conn, clock, seed, dependencies=True).run(seed, STEPS)
    print(dict(sorted(seen.items())))


@pytest.mark.parametrize("failure", ["proceed", "dead_letter", "wait"])
def test_a_child_offered_after_a_dead_lettered_parent_gets_its_choice_at_once(
        conn: psycopg.Connection[Any], failure: str) -> None:
    """Found by the model test (fixed). docs/workflows.md: a parent that leaves otherwise than
    acknowledged applies the child's on_parent_failure. A child offered after its parent was
    dead-lettered used to wait for the dead letter whatever its choice, and stayed blocked for ever
    when the dead letter was acknowledged from the dead-letter queue instead of redriven. Now the
    choice applies at the offer: proceed is not blocked by it, dead_letter goes to its own queue's
    dead-letter queue at once, wait waits for a redrive (and for ever if the dead letter is discarded:
    listed with the parent absent)."""
    conn.execute("SELECT dq_configure_queue('p', 1, 'p.dead')")
    conn.execute("SELECT dq_configure_queue('c', 1, 'c.dead')")
    conn.execute("SELECT dq_offer('p', 'A', 'x'::bytea)")
    token = conn.execute("SELECT lock_token FROM dq_poll_many('p', 1)").fetchone()
    assert token is not None
    conn.execute("SELECT dq_nack(%s::uuid)", token)  # max_deliveries 1: a dead letter in p.dead
    assert conn.execute("SELECT dq_offer('c', 'B', 'y'::bytea, after => '[[\"p\", \"A\"]]', "
                        "on_parent_failure => %s)", (failure,)).fetchone() == ("created",)
    expected = {"proceed": [("c", 0)], "dead_letter": [("c.dead", 0)], "wait": [("c", 1)]}[failure]
    assert conn.execute("SELECT queue, parents_pending FROM dq_messages WHERE key = 'B'").fetchall() == expected
    letter = conn.execute("SELECT lock_token FROM dq_poll_many('p.dead', 1)").fetchone()
    assert letter is not None
    assert conn.execute("SELECT dq_ack(%s::uuid)", letter).fetchone() == (True,)
    assert conn.execute("SELECT queue, parents_pending FROM dq_messages WHERE key = 'B'").fetchall() == expected
    deps = conn.execute("SELECT state FROM dq_dependencies('c', 'B')").fetchall()
    assert deps == ([("absent",)] if failure == "wait" else [])
    assert conn.execute("SELECT count(*) FROM dq_dependencies").fetchone() == ((1,) if failure == "wait" else (0,))


def test_extend_of_a_group_heads_lock_shortened_redelivers_it_when_it_expires(
        conn: psycopg.Connection[Any], clock: TestClock) -> None:
    """Found by the model test (dq_extend left dq_groups.due_at at the old lock expiry; fixed).

    docs/api.md (dq_extend): "The new expiry replaces the old one ... A short lock_timeout can therefore
    shorten the lock, down to a moment later at which the message is due again", and docs/state_machine.md:
    a head whose lock expired is delivered again. For the head of a FIFO group, dq_extend updates the
    row but not the group's due time (dq_groups.due_at, which dq_poll_many filters on), so after a
    shortened lock expires the head is not redelivered until its old lock expiry; dq_next_due reports the
    old time too. An ungrouped message in the same situation is redelivered (checked first)."""
    def one(query: str, *params: Any) -> Any:
        row = conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]

    for key, group in (("plain", None), ("head", "g")):
        assert one("SELECT dq_offer('x', %s, 'p'::bytea, message_group => %s)", key, group) == "created"
        token = one("SELECT lock_token FROM dq_poll_many('x', 1, interval '3 hours')")
        assert one("SELECT dq_extend(%s::uuid, interval '1 hour') - dq_now() < interval '70 minutes'", token)
        clock.advance(timedelta(hours=2))  # the shortened lock has expired, the original one has not
        assert one("SELECT locked_until IS NULL FROM dq_get('x', %s)", key) is True  # lock expired
        next_due_passed = one("SELECT dq_next_due('x') <= dq_now()")
        polled = conn.execute("SELECT key, delivery_count FROM dq_poll_many('x', 1)").fetchall()
        assert (key, next_due_passed, polled) == (key, True, [(key, 2)])
        assert one("SELECT dq_ack_many(ARRAY(SELECT lock_token FROM dq_messages WHERE queue = 'x'))") == 1


def test_extend_of_a_group_heads_lock_lengthened_does_not_hide_another_group(
        conn: psycopg.Connection[Any], clock: TestClock) -> None:
    """Found by the model test (dq_extend left dq_groups.due_at at the old lock expiry; fixed).

    The head of group g1 is polled with a 1-hour lock and extended to 3 hours; group g2's head is due
    in 90 minutes. Two hours later g2's head is due and nothing holds it back, but dq_poll_many(1)
    returns nothing: g1's row in dq_groups still says "due at the old lock expiry", so the poll's one
    group is g1, whose head is in flight (the poll then repairs the row: the next poll delivers g2)."""
    assert conn.execute("SELECT dq_offer('x', 'a', 'p'::bytea, message_group => 'g1')").fetchone() == ("created",)
    token = conn.execute("SELECT lock_token FROM dq_poll_many('x', 1, interval '1 hour')").fetchone()
    assert token is not None
    assert conn.execute("SELECT dq_offer('x', 'b', 'p'::bytea, dq_now() + interval '90 minutes', "
                        "message_group => 'g2')").fetchone() == ("created",)
    assert conn.execute("SELECT dq_extend(%s::uuid, interval '3 hours') IS NOT NULL", token).fetchone() == (True,)
    clock.advance(timedelta(hours=2))
    assert conn.execute("SELECT key FROM dq_poll_many('x', 1)").fetchall() == [("b",)]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_delivery_from_row_builds_the_same_message_as_the_dataclass(kind: str) -> None:
    """The worker's fast path (pyqueue.model.delivery_from_row) skips the frozen dataclass __init__:
    it must give an equal object with every field set, and stay so when a field is added."""
    import dataclasses
    import uuid

    from pyqueue import Message, model
    from pyqueue.aio import AsyncMessage

    cls: Any = Message if kind == "sync" else AsyncMessage
    now = datetime.now(UTC)
    values = {"id": 7, "queue": "q", "key": "k", "raw_payload": memoryview(b"\x01\x02"), "payload_type": "bytes",
              "scheduled_at": now, "scheduled_at_initially": now, "created_at": now, "delivery_count": 2,
              "priority": -3, "group": "g", "expires_at": now, "headers": {"trace": "t"},
              "lock_token": uuid.uuid4(), "locked_until": now, "claimed_at": now}
    assert set(values) == set(model.DELIVERY_COLUMNS)  # a field added to Message must be added here
    row = tuple(values[c] for c in model.DELIVERY_COLUMNS)
    fast = model.delivery_from_row(cls, row, None)
    common = [values[c] for c in model.column_names(model.MessageBase)]
    slow = cls(**model.common_fields(common), lock_token=values["lock_token"], locked_until=now, claimed_at=now,
               _client=None)
    assert fast == slow and type(fast) is cls
    assert {f.name for f in dataclasses.fields(cls)} == set(vars(fast))
    assert {f.name: getattr(fast, f.name) for f in dataclasses.fields(cls)} == {
        f.name: getattr(slow, f.name) for f in dataclasses.fields(cls)}
    assert fast.raw_payload == b"\x01\x02" and isinstance(fast.raw_payload, bytes)
