"""Property test: random sequences of offer / offer_many / poll / ack / nack / cancel / pause /
resume against a model of the queue's semantics, on a real server (hypothesis rule-based state
machine), with the delivery controls: priorities, FIFO message groups, pause and expiry.

Offers use one of two past times (T0 - 1 minute, T0), so every fresh message is due; a polled
message is locked for an hour; a nack(0) makes it due again at the server's now (after every
offered time).
A message offered with an expiry gets T0 + 1 second: it is expired from the start, so no poll may
deliver it, and the poll that reaches it removes it (which of several expired messages a poll
reaches depends on how many candidates it locked, so the model lets expired messages vanish at
any poll, and only then).

The model of FIFO groups: a group's head is its message with the smallest (due time, id), except
that a head that was delivered keeps its place until it leaves; only heads are delivered, one at a time per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

T0 = datetime(2020, 1, 1, tzinfo=UTC)
EXPIRED = T0 + timedelta(seconds=1)
KEYS = st.sampled_from([f"k{i}" for i in range(6)])
PAYLOADS = st.sampled_from([b"a", b"b", b"c"])
PRIORITIES = st.sampled_from([0, 0, 1, 5])
GROUPS = st.sampled_from([None, None, "A", "B"])
EXPIRES = st.sampled_from([False, False, False, True])
WHENS = st.sampled_from([0, 0, -60])  # seconds from T0


@dataclass
class Entry:
    payload: bytes
    seq: tuple[int, int]  # group order: (due time offset, id order)
    priority: int = 0
    group: str | None = None
    expired: bool = False
    token: Any = None  # lock token while in flight
    deliveries: int = 0
    rank: int = 0  # order of due time: the offset for a fresh message, 10**6 + n after the n-th nack

    def same(self, payload: bytes, when: int, priority: int, group: str | None, expired: bool) -> bool:
        return (self.payload, self.seq[0], self.priority, self.group, self.expired) == (
            payload, when, priority, group, expired)


class QueueModel(RuleBasedStateMachine):
    dsn: str = ""
    tokens = Bundle("tokens")

    @initialize()
    def connect(self) -> None:
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute("DELETE FROM dq_messages")
        self.conn.execute("DELETE FROM dq_groups")
        self.conn.execute("DELETE FROM dq_queues")
        self.model: dict[str, Entry] = {}
        self.heads: dict[str, str] = {}  # group -> key of its head
        self.nacks = 0
        self.offers = 0
        self.paused = False

    def teardown(self) -> None:
        if hasattr(self, "conn"):
            self.conn.close()

    def _settle(self) -> None:
        """The head rule, for every group."""
        heads: dict[str, str] = {}
        for group in {e.group for e in self.model.values() if e.group is not None}:
            members = {k: e for k, e in self.model.items() if e.group == group}
            kept = self.heads.get(group)
            if kept in members and (members[kept].deliveries > 0 or members[kept].token is not None):
                heads[group] = kept
            else:
                heads[group] = min(members, key=lambda k: members[k].seq)
        self.heads = heads

    def _expected_outcome(self, key: str, payload: bytes, when: int, can_update: bool, priority: int,
                          group: str | None, expired: bool) -> str:
        entry = self.model.get(key)
        if entry is None:
            self.offers += 1
            self.model[key] = Entry(payload, (when, self.offers), priority, group, expired, rank=when)
            return "created"
        # An update clears the lock, resets the delivery count and makes it due at its new time,
        # keeping its id
        if can_update and not entry.same(payload, when, priority, group, expired):
            self.model[key] = Entry(payload, (when, entry.seq[1]), priority, group, expired, rank=when)
            return "updated"
        return "ignored"

    @rule(key=KEYS, payload=PAYLOADS, when=WHENS, can_update=st.booleans(), priority=PRIORITIES, group=GROUPS,
          expired=EXPIRES)
    def offer(self, key: str, payload: bytes, when: int, can_update: bool, priority: int, group: str | None,
              expired: bool) -> None:
        expected = self._expected_outcome(key, payload, when, can_update, priority, group, expired)
        got = self.conn.execute(
            "SELECT dq_offer('m', %s, %s::bytea, %s, %s, NULL, %s, %s, %s)",
            (key, payload, T0 + timedelta(seconds=when), can_update, priority, group, EXPIRED if expired else None),
        ).fetchone()[0]
        assert got == expected
        self._settle()

    @rule(items=st.dictionaries(KEYS, st.tuples(PAYLOADS, WHENS, PRIORITIES, GROUPS, EXPIRES), min_size=1,
                                max_size=4),
          can_update=st.booleans())
    def offer_many(self, items: dict[str, tuple[bytes, int, int, str | None, bool]], can_update: bool) -> None:
        # Rows are inserted in key order: new keys get their ids (their order) in that order.
        outcomes = {k: self._expected_outcome(k, *items[k][:2], can_update, *items[k][2:]) for k in sorted(items)}
        expected = [(k, outcomes[k]) for k in items]
        got = self.conn.execute(
            "SELECT key, outcome FROM dq_offer_many('m', %s, %s::bytea[], %s::timestamptz[], %s, NULL, "
            "%s::integer[], %s::text[], %s::timestamptz[])",
            (list(items), [v[0] for v in items.values()], [T0 + timedelta(seconds=v[1]) for v in items.values()],
             can_update,
             [v[2] for v in items.values()], [v[3] for v in items.values()],
             [EXPIRED if v[4] else None for v in items.values()]),
        ).fetchall()
        assert got == expected
        self._settle()

    def _candidates(self) -> dict[str, Entry]:
        return {k: e for k, e in self.model.items()
                if e.token is None and (e.group is None or self.heads.get(e.group) == k)}

    @rule(target=tokens, n=st.integers(1, 4))
    def poll(self, n: int) -> Any:
        candidates = self._candidates()
        live = {k: e for k, e in candidates.items() if not e.expired}
        rows = self.conn.execute(
            "SELECT key, payload, delivery_count, lock_token, priority, message_group "
            "FROM dq_poll_many('m', %s, interval '1 hour')", (n,)
        ).fetchall()
        if self.paused:
            assert rows == []
            return None
        got_keys = {r[0] for r in rows}
        assert got_keys <= set(live), (got_keys, set(live))
        # The poll locks up to n candidates in delivery order and removes the expired ones among them.
        reached_expired = len(candidates) - len(live)
        assert min(n, len(live)) - reached_expired <= len(rows) <= min(n, len(live))

        def order(k: str) -> tuple[int, int]:
            return (-candidates[k].priority, candidates[k].rank)
        if rows:  # highest priority, then earliest due: nothing left behind comes strictly before
            assert max(order(k) for k in got_keys) <= min(
                (order(k) for k in live if k not in got_keys), default=(10**9, 10**9))
        for key, payload, count, token, priority, group in rows:
            entry = self.model[key]
            entry.deliveries += 1
            entry.token = token
            assert bytes(payload) == entry.payload and count == entry.deliveries
            assert (priority, group) == (entry.priority, entry.group)
        # Expired candidates this poll reached are gone.
        present = {r[0] for r in self.conn.execute("SELECT key FROM dq_messages WHERE queue = 'm'")}
        for key in [k for k, e in self.model.items() if k not in present]:
            assert self.model[key].expired and key in candidates, key
            del self.model[key]
        self._settle()
        return rows[0][3] if rows else None

    def _holder(self, token: Any) -> str | None:
        return next((k for k, e in self.model.items() if token is not None and e.token == token), None)

    @rule(token=consumes(tokens))
    def ack(self, token: Any) -> None:
        key = self._holder(token)
        if token is None:
            return
        assert self.conn.execute("SELECT dq_ack(%s::uuid)", (token,)).fetchone()[0] is (key is not None)
        if key is not None:
            del self.model[key]
        self._settle()

    @rule(token=consumes(tokens))
    def nack(self, token: Any) -> None:
        key = self._holder(token)
        if token is None:
            return
        assert self.conn.execute("SELECT dq_nack(%s::uuid)", (token,)).fetchone()[0] is (key is not None)
        if key is not None:
            self.nacks += 1
            self.model[key].token = None
            self.model[key].rank = 10**6 + self.nacks
        self._settle()

    @rule(key=KEYS)
    def cancel(self, key: str) -> None:
        assert self.conn.execute("SELECT dq_cancel('m', %s)", (key,)).fetchone()[0] is (key in self.model)
        self.model.pop(key, None)
        self._settle()

    @rule()
    def pause_or_resume(self) -> None:
        function = "dq_resume_queue" if self.paused else "dq_pause_queue"
        assert self.conn.execute(f"SELECT {function}('m')").fetchone()[0] is True  # noqa: S608 - ours
        self.paused = not self.paused

    @invariant()
    def table_matches_model(self) -> None:
        if not hasattr(self, "conn"):
            return
        rows = self.conn.execute(
            "SELECT key, payload, delivery_count, lock_token, priority, message_group "
            "FROM dq_messages WHERE queue = 'm'"
        ).fetchall()
        assert {r[0]: (bytes(r[1]), r[2], r[4], r[5]) for r in rows} == {
            k: (e.payload, e.deliveries, e.priority, e.group) for k, e in self.model.items()
        }
        for key, _, _, token, _, _ in rows:
            if self.model[key].token is not None:
                assert token == self.model[key].token
        heads = dict(self.conn.execute(
            "SELECT g.message_group, m.key FROM dq_groups g JOIN dq_messages m ON m.id = g.head_id "
            "WHERE g.queue = 'm'").fetchall())
        assert heads == self.heads
        in_flight = [e.group for e in self.model.values() if e.group is not None and e.token is not None]
        assert len(in_flight) == len(set(in_flight)), "two messages of one group in flight"


@pytest.mark.slow
def test_queue_matches_model(dsn: str) -> None:
    QueueModel.dsn = dsn
    run = QueueModel.TestCase
    run.settings = settings(
        max_examples=40, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None,
    )
    run().runTest()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_delivery_from_row_builds_the_same_message_as_the_dataclass(kind: str) -> None:
    """The worker's fast path (pyqueue.model.delivery_from_row) skips the frozen dataclass __init__:
    it must give an equal object with every field set, and stay so when a field is added."""
    import dataclasses
    import uuid

    from pyqueue import model
    from pyqueue.aio import AsyncMessage
    from pyqueue.client import Message

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
