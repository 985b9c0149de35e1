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
COLUMNS = ("id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, "
           "delivery_count, lock_token, last_error, last_error_at, dead_from, dead_at, dead_from_id, "
           "dead_delivery_count, due_at, claimed_at, priority, message_group, expires_at, headers, cron_prefix")
DELIVERY = ("id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, delivery_count, "
            "lock_token, locked_until, claimed_at, priority, message_group, expires_at, headers")


class Run:
    """One random sequence: the database and the model side by side."""

    def __init__(self, conn: psycopg.Connection[Any], clock: TestClock, seed: int) -> None:
        self.conn, self.clock, self.rnd = conn, clock, random.Random(seed)
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
        expected = self.model_offer(queue, key, args, can_update, self.model.instant())
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
        due = [r for r in model.in_queue(queue) if model.due(r.scheduled_at)]
        rows = self.conn.execute(f"SELECT {DELIVERY} FROM dq_poll_many(%s, %s, %s)",  # noqa: S608 - constant
                                 (queue, n, lock * UNIT)).fetchall()
        returned = {r[0] for r in rows}
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
        for r in gone:
            self.model.rows.remove(r)
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
        expected = model.redrive("dead", n)
        got = self.one("SELECT dq_redrive('dead', %s)", n)
        assert got == expected
        left = [r for r in letters if r in model.rows]
        self.seen.update(["redrive moves"] * (got > 0) + ["redrive skips one in flight"] * any(
            model.in_flight(r) for r in left) + ["redrive skips a key live in its queue"] * any(
            model.ordinary(r.dead_from, r.key) is not None and not model.in_flight(r) for r in left if r.dead_from))
        return f"redrive {n} -> {got}"

    def advance(self) -> str:
        units = self.rnd.choice([1, 1, 2])
        self.clock.advance(units * UNIT)
        self.model.m += units
        return f"advance {units} -> m={self.model.m}"

    STEPS: list[tuple[Callable[[Run], str], int]] = [
        (offer, 14), (offer_many, 4), (poll, 14), (ack, 7), (ack_many, 4), (nack, 8), (extend, 5), (cancel, 3),
        (pause_or_resume, 2), (redrive, 4), (advance, 8)]

    # -- the invariant -------------------------------------------------------------------------
    def check(self) -> None:
        model = self.model
        rows = self.conn.execute(f"SELECT {COLUMNS} FROM dq_messages ORDER BY id").fetchall()  # noqa: S608
        by_identity = {(r[1], r[2], r[14]): r for r in rows}
        assert len(by_identity) == len(rows)
        expected = {r.identity: r for r in model.rows}
        assert set(by_identity) == set(expected), (sorted(by_identity, key=str), sorted(expected, key=str))
        new = sorted((r for r in model.rows if r.id is None), key=lambda r: (r.queue, r.key))
        for r in new:  # rows inserted by this step: new ids, in bytewise key order
            r.id = by_identity[r.identity][0]
            assert r.id > self.max_id, (r.key, r.id, self.max_id)
            self.max_id = r.id
        for ident, row in expected.items():
            (id_, _, _, payload, ptype, scheduled_at, initially, created, count, token, last_error, last_error_at,
             dead_from, dead_at, dead_from_id, dead_count, due_at, claimed_at, priority, group, expires, headers,
             cron_prefix) = by_identity[ident]
            assert (id_, bytes(payload), ptype, count, token, last_error, dead_from, dead_from_id, dead_count,
                    priority, group, headers, cron_prefix) == (
                row.id, row.payload, row.payload_type, row.delivery_count, row.lock_token, row.last_error,
                row.dead_from, row.dead_from_id, row.dead_delivery_count, row.priority, row.group, row.headers, None
            ), ident
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
        self.check_reads()

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
        got = self.conn.execute(
            "SELECT p.q, p.k, g.* FROM unnest(%s::text[], %s::text[]) AS p(q, k) CROSS JOIN LATERAL dq_get(p.q, p.k) g",
            ([q for q, _ in pairs], [k for _, k in pairs])).fetchall()
        expected = []
        for q, k in pairs:
            rows = sorted((r for r in model.in_queue(q) if r.key == k),
                          key=lambda r: (r.dead_at is not None, r.dead_at.exact if r.dead_at else None, r.id))
            expected += [(q, k, r.id, q, k, r.payload, r.payload_type, r.scheduled_at.exact,
                          r.scheduled_at_initially.exact, r.created_at.exact, r.delivery_count, locked_until(r),
                          r.priority, r.group, r.expires_at.exact if r.expires_at else None, r.headers) for r in rows]
        assert [(*g[:5], bytes(g[5]), *g[6:]) for g in got] == expected
        for q in QUEUES:
            listed = self.conn.execute("SELECT * FROM dq_list_messages(%s, NULL, 10000)", (q,)).fetchall()
            rows = sorted(model.in_queue(q), key=lambda r: (r.scheduled_at.exact, r.id))
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

    def run(self, seed: int, steps: int) -> Counter[str]:
        functions, weights = zip(*self.STEPS, strict=True)
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
        return self.seen


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


@pytest.mark.slow
def test_queue_matches_model_fixed_seeds(admin_dsn: str, template_dsn: str) -> None:
    """The fixed seeds, each on a fresh database, and together they reach every case of REQUIRED."""
    template = str(conninfo_to_dict(template_dsn)["dbname"])
    seen: Counter[str] = Counter()
    for seed in SEEDS:
        dsn = testing.clone_database(admin_dsn, template)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                clock = TestClock(dsn)
                try:
                    seen += Run(conn, clock, seed).run(seed, STEPS)
                finally:
                    clock.close()
        finally:
            testing.drop_database(admin_dsn, str(conninfo_to_dict(dsn)["dbname"]))
    print(dict(sorted(seen.items())))
    assert REQUIRED - set(seen) == set()


@pytest.mark.slow
def test_queue_matches_model_random_seed(conn: psycopg.Connection[Any], clock: TestClock) -> None:
    """One random seed per run (printed; DQ_MODEL_SEED replays it, or any fixed seed)."""
    seed = random_seed()
    print(f"model test seed {seed}")
    seen = Run(conn, clock, seed).run(seed, STEPS)
    print(dict(sorted(seen.items())))


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
