"""Property test: random sequences of offer / offer_many / poll / ack / nack / cancel against a
model of seed 003's semantics, on a real server (hypothesis rule-based state machine).

All offers use one fixed past time T0, so every fresh message is due; a polled message is
locked for an hour; a nack(0) makes it due again at the server's now (after every T0 message).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

T0 = datetime(2020, 1, 1, tzinfo=UTC)
KEYS = st.sampled_from([f"k{i}" for i in range(6)])
PAYLOADS = st.sampled_from([b"a", b"b", b"c"])


@dataclass
class Entry:
    payload: bytes
    token: Any = None  # lock token while in flight
    deliveries: int = 0
    rank: int = 0  # order of due time: 0 = T0, n = the n-th nack


class QueueModel(RuleBasedStateMachine):
    dsn: str = ""
    tokens = Bundle("tokens")

    @initialize()
    def connect(self) -> None:
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute("DELETE FROM dq_messages")
        self.model: dict[str, Entry] = {}
        self.nacks = 0

    def teardown(self) -> None:
        if hasattr(self, "conn"):
            self.conn.close()

    def _expected_outcome(self, key: str, payload: bytes, can_update: bool) -> str:
        entry = self.model.get(key)
        if entry is None:
            self.model[key] = Entry(payload)
            return "created"
        # scheduled_at_initially is T0 for every message here, so only the payload can differ;
        # an update also clears the lock, resets the delivery count and makes it due at T0 again
        if can_update and entry.payload != payload:
            self.model[key] = Entry(payload)
            return "updated"
        return "ignored"

    @rule(key=KEYS, payload=PAYLOADS, can_update=st.booleans())
    def offer(self, key: str, payload: bytes, can_update: bool) -> None:
        expected = self._expected_outcome(key, payload, can_update)
        got = self.conn.execute(
            "SELECT dq_offer('m', %s, %s::bytea, %s, %s)", (key, payload, T0, can_update)
        ).fetchone()[0]
        assert got == expected

    @rule(items=st.dictionaries(KEYS, PAYLOADS, min_size=1, max_size=4), can_update=st.booleans())
    def offer_many(self, items: dict[str, bytes], can_update: bool) -> None:
        expected = [(k, self._expected_outcome(k, p, can_update)) for k, p in items.items()]
        got = self.conn.execute(
            "SELECT key, outcome FROM dq_offer_many('m', %s, %s::bytea[], %s::timestamptz[], %s)",
            (list(items), list(items.values()), [T0] * len(items), can_update),
        ).fetchall()
        assert got == expected

    @rule(target=tokens, n=st.integers(1, 4))
    def poll(self, n: int) -> Any:
        due = {k: e for k, e in self.model.items() if e.token is None}
        rows = self.conn.execute(
            "SELECT key, payload, delivery_count, lock_token FROM dq_poll_many('m', %s, interval '1 hour')", (n,)
        ).fetchall()
        assert len(rows) == min(n, len(due))
        got_keys = {r[0] for r in rows}
        assert got_keys <= set(due)
        if rows:  # earliest first: nothing left behind is due earlier than what was taken
            assert max(due[k].rank for k in got_keys) <= min(
                (e.rank for k, e in due.items() if k not in got_keys), default=10**9
            )
        for key, payload, count, token in rows:
            entry = self.model[key]
            entry.deliveries += 1
            entry.token = token
            assert bytes(payload) == entry.payload and count == entry.deliveries
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

    @rule(token=consumes(tokens))
    def nack(self, token: Any) -> None:
        key = self._holder(token)
        if token is None:
            return
        assert self.conn.execute("SELECT dq_nack(%s::uuid)", (token,)).fetchone()[0] is (key is not None)
        if key is not None:
            self.nacks += 1
            self.model[key].token = None
            self.model[key].rank = self.nacks

    @rule(key=KEYS)
    def cancel(self, key: str) -> None:
        assert self.conn.execute("SELECT dq_cancel('m', %s)", (key,)).fetchone()[0] is (key in self.model)
        self.model.pop(key, None)

    @invariant()
    def table_matches_model(self) -> None:
        if not hasattr(self, "conn"):
            return
        rows = self.conn.execute(
            "SELECT key, payload, delivery_count, lock_token FROM dq_messages WHERE queue = 'm'"
        ).fetchall()
        assert {r[0]: (bytes(r[1]), r[2]) for r in rows} == {
            k: (e.payload, e.deliveries) for k, e in self.model.items()
        }
        for key, _, _, token in rows:
            if self.model[key].token is not None:
                assert token == self.model[key].token


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
