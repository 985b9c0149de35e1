"""dq_offer / dq_offer_many outcomes and the result shapes of dq_get, dq_next_due, dq_cancel, dq_poll_many.

Single-session SQL tests sharing one installed database per module, its queue tables emptied
before each test (``conn``, autocommit). Timestamps are fixed constants, or values read back
from the server in the same statement (``now()`` bound next to the call): no assertion depends
on the client's clock, none prints now().
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from sqlhelpers import message, table_rows

Q = "q"
T0 = datetime(2020, 1, 1, 0, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(seconds=1)
T2 = T0 + timedelta(seconds=2)
T3 = T0 + timedelta(seconds=3)
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)

DELIVERY_COLUMNS = [
    "id",
    "queue",
    "key",
    "payload",
    "payload_type",
    "scheduled_at",
    "scheduled_at_initially",
    "created_at",
    "delivery_count",
    "lock_token",
    "locked_until",
    "claimed_at",
    "priority",
    "message_group",
    "expires_at",
    "headers",
]
#: dq_get's row (dq_message): the delivery's columns without the lock, and the release time of a child
#: offered after others (NULL for a message that never waited).
GET_COLUMNS = [c for c in DELIVERY_COLUMNS if c not in ("lock_token", "claimed_at")] + ["released_at"]


def offer(
    conn: psycopg.Connection[Any],
    key: str,
    payload: bytes = b"\x01",
    *,
    scheduled_at: datetime = T1,
    can_update: bool = True,
    payload_type: str | None = None,
    queue: str = Q,
) -> tuple[str, datetime]:
    """dq_offer (bytea form); returns (outcome, now() of the offering statement)."""
    row = conn.execute(
        "SELECT dq_offer(%s, %s, %s::bytea, %s, %s, %s::text), now()",
        (queue, key, payload, scheduled_at, can_update, payload_type),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def poll(
    conn: psycopg.Connection[Any], max_count: int = 1, lock_timeout: str = "1 minute", queue: str = Q
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM dq_poll_many(%s, %s, %s::interval)", (queue, max_count, lock_timeout))
        return cur.fetchall()


def get(conn: psycopg.Connection[Any], key: str, queue: str = Q) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM dq_get(%s, %s)", (queue, key))
        return cur.fetchall()


# --------------------------------------------------------------------------- dq_offer outcomes


def test_offer_new_key_is_created(module_conn):
    outcome, now = offer(module_conn, "k", b"\x01\x02", scheduled_at=T1)
    assert outcome == "created"
    row = message(module_conn, Q, "k")
    assert row is not None
    assert bytes(row["payload"]) == b"\x01\x02"
    assert row["payload_type"] == "bytes"
    assert row["scheduled_at"] == T1
    assert row["scheduled_at_initially"] == T1
    assert row["created_at"] == now
    assert row["delivery_count"] == 0
    assert row["lock_token"] is None


def test_offer_identical_reoffer_is_ignored_and_changes_nothing(module_conn):
    assert offer(module_conn, "k", b"\x01", scheduled_at=T1)[0] == "created"
    before = table_rows(module_conn)
    assert offer(module_conn, "k", b"\x01", scheduled_at=T1)[0] == "ignored"
    assert offer(module_conn, "k", b"\x01", scheduled_at=T1, payload_type="bytes")[0] == "ignored"
    assert table_rows(module_conn) == before


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"payload": b"\x02"}, id="payload-differs"),
        pytest.param({"payload_type": "image/png"}, id="payload_type-differs"),
        pytest.param({"scheduled_at": T2}, id="scheduled_at-differs"),
    ],
)
def test_offer_existing_key_with_a_difference_is_updated(module_conn, change):
    offer(module_conn, "k", b"\x01", scheduled_at=T1)
    args: dict[str, Any] = {"payload": b"\x01", "scheduled_at": T1, "payload_type": None} | change
    outcome, now = offer(
        module_conn, "k", args["payload"], scheduled_at=args["scheduled_at"], payload_type=args["payload_type"]
    )
    assert outcome == "updated"
    row = message(module_conn, Q, "k")
    assert row is not None
    assert bytes(row["payload"]) == args["payload"]
    assert row["payload_type"] == (args["payload_type"] or "bytes")
    assert row["scheduled_at"] == row["scheduled_at_initially"] == args["scheduled_at"]
    assert row["created_at"] == now
    assert module_conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 1


def test_offer_can_update_false_ignores_an_existing_key(module_conn):
    offer(module_conn, "k", b"\x01", scheduled_at=T1)
    before = table_rows(module_conn)
    assert offer(module_conn, "k", b"\x02", scheduled_at=T2, can_update=False, payload_type="other")[0] == "ignored"
    assert table_rows(module_conn) == before
    # ... and still creates a new one.
    assert offer(module_conn, "k2", b"\x02", can_update=False)[0] == "created"


def test_offer_update_resets_the_delivery_state(module_conn):
    offer(module_conn, "k", b"\x01", scheduled_at=T1)
    first = message(module_conn, Q, "k")
    [delivery] = poll(module_conn)
    polled = message(module_conn, Q, "k")
    assert polled is not None and first is not None
    assert polled["delivery_count"] == 1 and polled["lock_token"] == delivery["lock_token"]

    outcome, now = offer(module_conn, "k", b"\x02", scheduled_at=T2)
    assert outcome == "updated"
    row = message(module_conn, Q, "k")
    assert row is not None
    assert row["id"] == first["id"]
    assert bytes(row["payload"]) == b"\x02"
    assert row["delivery_count"] == 0
    assert row["lock_token"] is None
    assert row["scheduled_at"] == T2
    assert row["scheduled_at_initially"] == T2
    assert row["created_at"] == now
    assert row["created_at"] > first["created_at"]


def test_offer_identical_reoffer_while_in_flight_is_ignored_and_keeps_the_lock(module_conn):
    offer(module_conn, "k", b"\x01", scheduled_at=T1)
    [delivery] = poll(module_conn)
    before = table_rows(module_conn)
    assert offer(module_conn, "k", b"\x01", scheduled_at=T1)[0] == "ignored"
    assert table_rows(module_conn) == before
    assert module_conn.execute("SELECT dq_ack(%s::uuid)", (delivery["lock_token"],)).fetchone()[0] is True


@pytest.mark.parametrize(
    ("call", "payload", "payload_type"),
    [
        pytest.param(r"dq_offer('q', 'k', '\x00ff'::bytea)", b"\x00\xff", "bytes", id="bytea"),
        pytest.param(
            """dq_offer('q', 'k', '{"b": 1, "a": [1, 2]}'::jsonb)""", b'{"a": [1, 2], "b": 1}', "json", id="jsonb"
        ),
        pytest.param("dq_offer('q', 'k', 'h\u00e9llo'::text)", "h\u00e9llo".encode(), "text", id="text"),
        pytest.param("dq_offer('q', 'k', 'untyped')", b"untyped", "text", id="untyped-literal-is-text"),
        pytest.param(
            r"dq_offer('q', 'k', '\x89'::bytea, payload_type => 'image/png')", b"\x89", "image/png", id="bytea-typed"
        ),
        pytest.param(
            """dq_offer('q', 'k', '[1]'::jsonb, payload_type => 'application/vnd.x+json')""",
            b"[1]",
            "application/vnd.x+json",
            id="jsonb-typed",
        ),
        pytest.param("dq_offer('q', 'k', 'a,b'::text, payload_type => 'csv')", b"a,b", "csv", id="text-typed"),
        pytest.param("dq_offer('q', 'k', 'x'::text, now(), true, NULL)", b"x", "text", id="text-explicit-null-type"),
    ],
)
def test_offer_payload_overloads(module_conn, call, payload, payload_type):
    row = module_conn.execute(f"SELECT {call}, now()").fetchone()  # noqa: S608 - constant test SQL
    assert row is not None
    assert row[0] == "created"
    stored = message(module_conn, "q", "k")
    assert stored is not None
    assert bytes(stored["payload"]) == payload
    assert stored["payload_type"] == payload_type
    assert stored["scheduled_at"] == stored["scheduled_at_initially"] == stored["created_at"] == row[1]


def test_offer_named_notation(module_conn):
    row = module_conn.execute(r"SELECT dq_offer(queue => 'q', key => 'k', payload => '\x01'::bytea), now()").fetchone()
    assert row is not None and row[0] == "created"
    stored = message(module_conn, "q", "k")
    assert stored is not None
    assert bytes(stored["payload"]) == b"\x01" and stored["payload_type"] == "bytes"
    assert stored["scheduled_at"] == row[1]

    outcome = module_conn.execute(
        "SELECT dq_offer(payload_type => 'x', can_update => false, scheduled_at => %s, "
        "payload => '{}'::jsonb, key => 'k2', queue => 'q')",
        (T1,),
    ).fetchone()
    assert outcome is not None and outcome[0] == "created"
    stored = message(module_conn, "q", "k2")
    assert stored is not None
    assert (bytes(stored["payload"]), stored["payload_type"], stored["scheduled_at"]) == (b"{}", "x", T1)


def test_same_key_in_two_queues_is_two_messages(module_conn):
    assert offer(module_conn, "k", queue="a")[0] == "created"
    assert offer(module_conn, "k", queue="b")[0] == "created"
    assert module_conn.execute("SELECT count(*) FROM dq_messages WHERE key = 'k'").fetchone()[0] == 2


# --------------------------------------------------------------------------- dq_offer_many


def offer_many(
    conn: psycopg.Connection[Any], keys: list[str], payloads: list[bytes], **named: Any
) -> list[tuple[str, str]]:
    """dq_offer_many on queue Q; named arguments are passed in named notation."""
    extra = "".join(f", {name} => %({name})s" for name in named)
    return [
        tuple(r)  # type: ignore[misc]
        for r in conn.execute(
            f"SELECT key, outcome FROM dq_offer_many(%(queue)s, %(keys)s::text[], %(payloads)s::bytea[]{extra})",  # noqa: S608
            {"queue": Q, "keys": keys, "payloads": payloads, **named},
        )
    ]


def test_offer_many_outcomes_per_element_in_input_order(module_conn):
    offer(module_conn, "b", b"old", scheduled_at=T1)
    offer(module_conn, "c", b"same", scheduled_at=T1)
    offer(module_conn, "d", b"same", scheduled_at=T1)
    offer(module_conn, "e", b"same", scheduled_at=T1)
    result = offer_many(
        module_conn,
        ["z", "c", "a", "b", "d", "e"],
        [b"z", b"same", b"a", b"new", b"same", b"same"],
        scheduled_ats=[T1, T1, T1, T1, T2, T1],
        payload_types=[None, None, None, None, None, "text"],
    )
    assert result == [
        ("z", "created"),
        ("c", "ignored"),
        ("a", "created"),
        ("b", "updated"),  # payload differs
        ("d", "updated"),  # scheduled_at differs
        ("e", "updated"),  # payload_type differs
    ]
    got = {
        r[0]: (bytes(r[1]), r[2], r[3])
        for r in module_conn.execute("SELECT key, payload, payload_type, scheduled_at FROM dq_messages")
    }
    assert got == {
        "a": (b"a", "bytes", T1),
        "b": (b"new", "bytes", T1),
        "c": (b"same", "bytes", T1),
        "d": (b"same", "bytes", T2),
        "e": (b"same", "text", T1),
        "z": (b"z", "bytes", T1),
    }
    # The same batch again changes nothing.
    before = table_rows(module_conn)
    again = offer_many(
        module_conn,
        ["z", "c", "a", "b", "d", "e"],
        [b"z", b"same", b"a", b"new", b"same", b"same"],
        scheduled_ats=[T1, T1, T1, T1, T2, T1],
        payload_types=[None, None, None, None, None, "text"],
    )
    assert [o for _, o in again] == ["ignored"] * 6
    assert table_rows(module_conn) == before


@pytest.mark.parametrize("how", ["omitted", "explicit-null"])
def test_offer_many_null_scheduled_ats_means_now_for_all(module_conn, how):
    extra = "" if how == "omitted" else ", scheduled_ats => NULL"
    rows = module_conn.execute(
        "SELECT o.key, o.outcome, now() FROM dq_offer_many('q', ARRAY['a', 'b', 'c'], "  # noqa: S608
        rf"ARRAY['\x01', '\x02', '\x03']::bytea[]{extra}) o"
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [("a", "created"), ("b", "created"), ("c", "created")]
    now = rows[0][2]
    stored = module_conn.execute(
        "SELECT scheduled_at, scheduled_at_initially, created_at, payload_type FROM dq_messages"
    ).fetchall()
    assert len(stored) == 3
    assert all(r == (now, now, now, "bytes") for r in stored)


def test_offer_many_payload_types(module_conn):
    assert offer_many(module_conn, ["a", "b", "c"], [b"1", b"2", b"3"], payload_types=["json", None, "x/y"]) == [
        ("a", "created"),
        ("b", "created"),
        ("c", "created"),
    ]
    got = dict(module_conn.execute("SELECT key, payload_type FROM dq_messages").fetchall())
    assert got == {"a": "json", "b": "bytes", "c": "x/y"}


def test_offer_many_can_update_false(module_conn):
    offer(module_conn, "a", b"old", scheduled_at=T1)
    before = message(module_conn, Q, "a")
    assert offer_many(module_conn, ["n", "a"], [b"new", b"new"], scheduled_ats=[T2, T2], can_update=False) == [
        ("n", "created"),
        ("a", "ignored"),
    ]
    assert message(module_conn, Q, "a") == before
    n = message(module_conn, Q, "n")
    assert n is not None and bytes(n["payload"]) == b"new" and n["scheduled_at"] == T2


def test_offer_many_update_resets_the_delivery_state(module_conn):
    offer(module_conn, "a", b"old", scheduled_at=T1)
    [delivery] = poll(module_conn)
    assert delivery["delivery_count"] == 1
    rows = module_conn.execute(
        "SELECT o.key, o.outcome, now() "
        "FROM dq_offer_many('q', ARRAY['a'], ARRAY['new'::bytea], ARRAY[%s::timestamptz]) o",
        (T2,),
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [("a", "updated")]
    row = message(module_conn, Q, "a")
    assert row is not None
    assert row["delivery_count"] == 0 and row["lock_token"] is None
    assert row["scheduled_at"] == row["scheduled_at_initially"] == T2
    assert row["created_at"] == rows[0][2]
    assert module_conn.execute("SELECT dq_ack(%s::uuid)", (delivery["lock_token"],)).fetchone()[0] is False


@pytest.mark.parametrize(
    "call",
    [
        "dq_offer_many('q', '{}'::text[], '{}'::bytea[])",
        "dq_offer_many('q', '{}'::text[], '{}'::bytea[], '{}'::timestamptz[], true, '{}'::text[])",
        "dq_offer_many('q', '{}'::text[], '{}'::bytea[], can_update => false)",
    ],
)
def test_offer_many_empty_arrays_return_no_rows(module_conn, call):
    offer(module_conn, "existing")
    before = table_rows(module_conn)
    assert module_conn.execute(f"SELECT * FROM {call}").fetchall() == []  # noqa: S608
    assert table_rows(module_conn) == before


# --------------------------------------------------------------------------- dq_get, dq_next_due, dq_cancel


def test_get_returns_the_row_without_lock_token(module_conn):
    offer(module_conn, "k", b"\x07", scheduled_at=T1, payload_type="t")
    stored = message(module_conn, Q, "k")
    with module_conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM dq_get('q', 'k')")
        assert [d.name for d in cur.description] == GET_COLUMNS
        rows = cur.fetchall()
    assert stored is not None
    assert rows == [
        {
            "id": stored["id"],
            "queue": "q",
            "key": "k",
            "payload": b"\x07",
            "payload_type": "t",
            "scheduled_at": T1,
            "scheduled_at_initially": T1,
            "created_at": stored["created_at"],
            "delivery_count": 0,
            "locked_until": None,
            "priority": 0,
            "message_group": None,
            "expires_at": None,
            "headers": None,
            "released_at": None,
        }
    ]
    assert get(module_conn, "absent") == []
    assert get(module_conn, "k", queue="other") == []


def test_get_shows_locked_until_only_while_in_flight(module_conn):
    offer(module_conn, "k", scheduled_at=T1)
    assert get(module_conn, "k")[0]["locked_until"] is None
    [delivery] = poll(module_conn, lock_timeout="1 hour")
    [row] = get(module_conn, "k")
    assert row["locked_until"] == delivery["locked_until"]
    assert row["scheduled_at"] == delivery["locked_until"]
    assert row["delivery_count"] == 1
    # Given back (nack): no longer in flight.
    assert module_conn.execute("SELECT dq_nack(%s::uuid, interval '1 hour')", (delivery["lock_token"],)).fetchone()[0]
    [row] = get(module_conn, "k")
    assert row["locked_until"] is None and row["delivery_count"] == 1


def test_next_due_is_null_when_the_queue_is_empty(module_conn):
    assert module_conn.execute("SELECT dq_next_due('q')").fetchone()[0] is None
    offer(module_conn, "k", scheduled_at=T0, queue="other")
    assert module_conn.execute("SELECT dq_next_due('q')").fetchone()[0] is None


def test_next_due_is_the_earliest_scheduled_at(module_conn):
    offer(module_conn, "c", scheduled_at=T3)
    offer(module_conn, "f", scheduled_at=FAR_FUTURE)
    offer(module_conn, "a", scheduled_at=T1)
    offer(module_conn, "b", scheduled_at=T2)
    offer(module_conn, "x", scheduled_at=T0, queue="other")
    assert module_conn.execute("SELECT dq_next_due('q')").fetchone()[0] == T1
    # In flight: the earliest is now the first lock's expiry.
    deliveries = poll(module_conn, max_count=10, lock_timeout="1 hour")
    assert len(deliveries) == 3
    assert module_conn.execute("SELECT dq_next_due('q')").fetchone()[0] == min(d["locked_until"] for d in deliveries)
    for d in deliveries:
        module_conn.execute("SELECT dq_ack(%s::uuid)", (d["lock_token"],))
    assert module_conn.execute("SELECT dq_next_due('q')").fetchone()[0] == FAR_FUTURE


def test_cancel_true_then_false(module_conn):
    offer(module_conn, "k")
    offer(module_conn, "k", queue="other")
    assert module_conn.execute("SELECT dq_cancel('q', 'k')").fetchone()[0] is True
    assert message(module_conn, Q, "k") is None
    assert module_conn.execute("SELECT dq_cancel('q', 'k')").fetchone()[0] is False
    assert message(module_conn, "other", "k") is not None
    assert module_conn.execute("SELECT dq_cancel('q', 'never')").fetchone()[0] is False


def test_cancel_in_flight_message_makes_the_holders_ack_false(module_conn):
    offer(module_conn, "k", scheduled_at=T1)
    [delivery] = poll(module_conn)
    assert module_conn.execute("SELECT dq_cancel('q', 'k')").fetchone()[0] is True
    assert module_conn.execute("SELECT dq_ack(%s::uuid)", (delivery["lock_token"],)).fetchone()[0] is False


# --------------------------------------------------------------------------- dq_poll_many


def test_poll_result_columns(module_conn):
    with module_conn.cursor() as cur:
        cur.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')")
        assert [d.name for d in cur.description] == DELIVERY_COLUMNS
        assert cur.fetchall() == []
    offer(module_conn, "k", scheduled_at=T1)
    with module_conn.cursor() as cur:
        cur.execute("SELECT * FROM dq_poll_many('q')")
        assert [d.name for d in cur.description] == DELIVERY_COLUMNS
        assert len(cur.fetchall()) == 1


def test_poll_result_values(module_conn):
    offer(module_conn, "k", b"\x42", scheduled_at=T1, payload_type="t")
    stored = message(module_conn, Q, "k")
    assert stored is not None
    before = module_conn.execute("SELECT clock_timestamp()").fetchone()[0]
    [d] = poll(module_conn, 5, "90 seconds")
    after = module_conn.execute("SELECT clock_timestamp()").fetchone()[0]
    assert d["id"] == stored["id"]
    assert (d["queue"], d["key"], bytes(d["payload"]), d["payload_type"]) == ("q", "k", b"\x42", "t")
    assert d["scheduled_at"] == T1  # the due time of this delivery
    assert d["scheduled_at_initially"] == T1
    assert d["created_at"] == stored["created_at"]
    assert d["delivery_count"] == 1
    assert isinstance(d["lock_token"], uuid.UUID)
    # locked_until = poll time + lock_timeout, the poll time being between the two server readings.
    assert before + timedelta(seconds=90) <= d["locked_until"] <= after + timedelta(seconds=90)
    now_stored = message(module_conn, Q, "k")
    assert now_stored is not None
    assert now_stored["scheduled_at"] == d["locked_until"]
    assert now_stored["lock_token"] == d["lock_token"]
    assert now_stored["scheduled_at_initially"] == T1


def test_poll_earliest_first_and_not_the_future(module_conn):
    offer(module_conn, "c", b"c", scheduled_at=T3)
    offer(module_conn, "f", b"f", scheduled_at=FAR_FUTURE)
    offer(module_conn, "a", b"a", scheduled_at=T1)
    offer(module_conn, "b", b"b", scheduled_at=T2)
    offer(module_conn, "x", b"x", scheduled_at=T0, queue="other")
    future_before = message(module_conn, Q, "f")

    first = poll(module_conn, 2)
    assert [(d["key"], d["scheduled_at"]) for d in first] == [("a", T1), ("b", T2)]
    rest = poll(module_conn, 10)
    assert [(d["key"], d["scheduled_at"]) for d in rest] == [("c", T3)]
    assert poll(module_conn, 10) == []
    assert message(module_conn, Q, "f") == future_before
    tokens = [d["lock_token"] for d in first + rest]
    assert len(set(tokens)) == 3, "each message of a batch gets its own lock token"
    # The other queue was not touched.
    other = message(module_conn, "other", "x")
    assert other is not None and other["delivery_count"] == 0 and other["lock_token"] is None


def test_poll_then_ack_deletes_exactly_the_acked_messages(module_conn):
    for k in "abc":
        offer(module_conn, k, scheduled_at=T1)
    deliveries = poll(module_conn, 3)
    tokens = [d["lock_token"] for d in deliveries]
    assert module_conn.execute("SELECT dq_ack(%s::uuid)", (tokens[0],)).fetchone()[0] is True
    assert module_conn.execute("SELECT dq_ack(%s::uuid)", (tokens[0],)).fetchone()[0] is False
    assert module_conn.execute("SELECT dq_ack_many(%s::uuid[])", (tokens,)).fetchone()[0] == 2
    assert module_conn.execute("SELECT dq_ack_many(%s::uuid[])", (tokens,)).fetchone()[0] == 0
    assert module_conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0
