"""dq_offer_many with parents: the afters and on_parent_failures columns, a graph offered in one call
(an element names elements before it), the errors naming the element, and the batch without
parents left on its set-based path.

Single-session SQL tests sharing one installed database per module (``module_conn``, autocommit,
queue tables emptied before each test); messages are due long ago, so whatever is deliverable is
delivered by the next poll.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlhelpers import table_rows

Q = "q"
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
LOCK = timedelta(minutes=5)


def offer_many(
    conn: psycopg.Connection[Any],
    keys: list[str],
    afters: list[Any] | None,
    on_parent_failures: list[str | None] | None = None,
    *,
    queue: str = Q,
    can_update: bool = True,
    counts: bool = False,
) -> dict[str, str] | tuple[int, int, int]:
    """dq_offer_many (or dq_offer_many_counts) of ``keys`` with payload "p", due long ago."""
    rows = conn.execute(
        sql.SQL("SELECT * FROM {}(%s, %s::text[], array_fill('p'::bytea, ARRAY[%s]), array_fill(%s::timestamptz, "
                "ARRAY[%s]), %s, afters => %s::jsonb[], on_parent_failures => %s::text[])").format(
            sql.Identifier("dq_offer_many_counts" if counts else "dq_offer_many")),
        (queue, keys, len(keys), LONG_AGO, len(keys), can_update,
         None if afters is None else [None if a is None else json.dumps(a) for a in afters], on_parent_failures),
    ).fetchall()
    if counts:
        return tuple(rows[0])  # type: ignore[return-value]
    return {r[0]: r[1] for r in rows}


def poll(conn: psycopg.Connection[Any], queue: str = Q) -> dict[str, uuid.UUID]:
    rows = conn.execute("SELECT key, lock_token FROM dq_poll_many(%s, 100, %s)", (queue, LOCK)).fetchall()
    return {r[0]: r[1] for r in rows}


def ack_all(conn: psycopg.Connection[Any], got: dict[str, uuid.UUID]) -> None:
    for token in got.values():
        assert conn.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)


def blocked(conn: psycopg.Connection[Any], queue: str = Q) -> dict[str, int]:
    rows = conn.execute(
        "SELECT key, parents_pending FROM dq_messages WHERE queue = %s AND parents_pending > 0", (queue,)).fetchall()
    return {r[0]: r[1] for r in rows}


def test_a_graph_in_one_call_is_delivered_in_its_order(module_conn: psycopg.Connection[Any]) -> None:
    """extract -> three transforms -> load after all three -> report after load, in one call."""
    c = module_conn
    keys = ["extract", "t1", "t2", "t3", "load", "report"]
    afters = [None, ["extract"], ["extract"], [[Q, "extract"]], ["t1", "t2", "t3"], ["load"]]
    assert offer_many(c, keys, afters) == dict.fromkeys(keys, "created")
    assert blocked(c) == {"t1": 1, "t2": 1, "t3": 1, "load": 3, "report": 1}
    order = []
    for expected in (["extract"], ["t1", "t2", "t3"], ["load"], ["report"]):
        got = poll(c)
        assert sorted(got) == expected
        assert poll(c) == {}  # nothing more is due while these are in flight
        order.append(sorted(got))
        ack_all(c, got)
    assert blocked(c) == {}
    assert poll(c) == {}


def test_a_batch_mixes_elements_with_and_without_parents(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer_many(c, ["old"], None)
    out = offer_many(c, ["a", "b", "c", "d"], [None, ["old"], [], ["never-offered"]], [None, "proceed", None, None])
    assert out == {"a": "created", "b": "created", "c": "created", "d": "created"}
    assert blocked(c) == {"b": 1}
    assert sorted(poll(c)) == ["a", "c", "d", "old"]
    rows = c.execute("SELECT on_parent_failure FROM dq_dependencies").fetchall()
    assert rows == [("proceed",)]


def test_outcomes_and_counts_of_existing_keys(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer_many(c, ["p", "x"], None)
    # x exists: with parents and without can_update it is ignored; y is new, z ordinary
    assert offer_many(c, ["x", "y", "z"], [["p"], ["p"], None], can_update=False) == {
        "x": "ignored", "y": "created", "z": "created"}
    assert offer_many(c, ["x2", "y2", "x"], [["p"], ["p"], None], can_update=False, counts=True) == (2, 0, 1)


def test_parents_in_other_queues_and_existing_messages(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer_many(c, ["A"], None, queue="other")
    offer_many(c, ["B", "C"], [[["other", "A"]], ["B"]])
    assert blocked(c) == {"B": 1, "C": 1}
    ack_all(c, poll(c, "other"))
    assert list(poll(c)) == ["B"]


BAD = [
    # (what, keys, afters, on_parent_failures, sqlstate, words)
    ("a later element", ["a", "b"], [["b"], None], None, "22023", "afters[1] names b (keys[2]), which comes later"),
    ("a later element as a pair", ["a", "b"], [[[Q, "b"]], None], None, "22023", "afters[1] names b (keys[2])"),
    ("a cycle", ["a", "b"], [["b"], ["a"]], None, "22023", "afters[1] names b (keys[2]), which comes later"),
    ("itself", ["a", "b"], [None, ["b"]], None, "22023", "afters[2]: after[1] names the message itself"),
    ("not an array", ["a"], [{"k": 1}], None, "22023", "afters[1]: after must be a JSON array"),
    ("a bad element", ["a", "b"], [None, [1]], None, "22023", "afters[2]: after[1] must be a key"),
    ("a key too long", ["a"], [["k" * 201]], None, "22001", "afters[1]: after[1] key"),
    ("too many parents", ["a"], [[f"k{i}" for i in range(10001)]], None, "54000", "afters[1]: after names 10001"),
    ("an unknown failure", ["a", "b"], None, [None, "retry"], "22023", "on_parent_failures[2] must be wait"),
    ("afters too short", ["a", "b"], [None], None, "22023", "afters has 1 elements, keys has 2"),
    ("on_parent_failures too long", ["a"], None, ["wait", "wait"], "22023", "on_parent_failures has 2 elements"),
]


@pytest.mark.parametrize(("what", "keys", "afters", "failures", "sqlstate", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_element_and_changes_nothing(
    module_conn: psycopg.Connection[Any], what: str, keys: list[str], afters: Any, failures: Any, sqlstate: str,
    words: str,
) -> None:
    c = module_conn
    offer_many(c, ["b0"], None)
    before = table_rows(c)
    for counts in (False, True):
        with pytest.raises(psycopg.Error) as e:
            offer_many(c, keys, afters, failures, counts=counts)
        assert e.value.sqlstate == sqlstate
        assert words in str(e.value), str(e.value)
        assert str(e.value).startswith("dq_offer_many_counts: " if counts else "dq_offer_many: ")
    assert table_rows(c) == before


def test_after_on_an_existing_key_names_the_element(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer_many(c, ["p", "x"], None)
    before = table_rows(c)
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match=r"^dq_offer_many: keys\[2\]: after applies to a new message; x of queue q exists"):
        offer_many(c, ["n", "x"], [None, ["p"]])
    assert table_rows(c) == before


def test_a_cycle_through_stored_messages_is_refused(module_conn: psycopg.Connection[Any]) -> None:
    """A waits for B; A is dead-lettered, its child B keeps waiting for A's key (wait); a new A
    offered after B would close the cycle."""
    c = module_conn
    c.execute("SELECT dq_configure_queue(%s, dead_letter_queue => 'dlq')", (Q,))
    offer_many(c, ["A", "B"], [None, ["A"]])
    (token,) = poll(c).values()
    c.execute("SELECT dq_dead_letter(%s)", (token,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^dq_offer_many: keys\[1\]: .*a cycle"):
        offer_many(c, ["A"], [["B"]])


def test_a_batch_without_parents_takes_the_set_based_path(module_conn: psycopg.Connection[Any]) -> None:
    """afters NULL, or all its elements NULL or empty: no row-by-row offer (dq__offer_after is never
    called), as pg_stat_user_functions counts."""
    c = module_conn
    c.execute("SET track_functions = 'all'")
    calls = ("SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE funcname = 'dq__offer_after'")
    with c.transaction():
        offer_many(c, [f"k{i}" for i in range(50)], [None] * 25 + [[]] * 25)
        assert c.execute(calls).fetchone() == (0,)
        offer_many(c, ["m1", "m2"], [None, ["k1"]])
        assert c.execute(calls).fetchone() == (1,)
