"""Dependencies in SQL: dq_offer(after => ...), release on acknowledgement, the other fates of a parent,
dq_dependencies.

Single-session SQL tests sharing one installed database per module, its queue tables emptied before
each test (``module_conn``, autocommit). Messages are offered due in the past (a fixed time long ago),
so whatever is deliverable is delivered by the next poll; a blocked message never is.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlhelpers import table_rows

Q = "q"
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
LOCK = timedelta(minutes=5)


def offer(
    conn: psycopg.Connection[Any],
    key: str,
    *,
    after: list[Any] | None = None,
    queue: str = Q,
    on_parent_failure: str = "wait",
    at: datetime = LONG_AGO,
    group: str | None = None,
    expires_at: datetime | None = None,
    can_update: bool = True,
    payload: str = "p",
) -> str:
    row = conn.execute(
        "SELECT dq_offer(%s, %s, %s::text, %s, can_update => %s, message_group => %s, expires_at => %s,"
        " after => %s::jsonb, on_parent_failure => %s)",
        (queue, key, payload, at, can_update, group, expires_at,
         None if after is None else json.dumps(after), on_parent_failure),
    ).fetchone()
    assert row is not None
    return str(row[0])


def poll(conn: psycopg.Connection[Any], queue: str = Q) -> dict[str, uuid.UUID]:
    """Poll everything deliverable now: {key: lock_token}."""
    rows = conn.execute("SELECT key, lock_token FROM dq_poll_many(%s, 100, %s)", (queue, LOCK)).fetchall()
    return {r[0]: r[1] for r in rows}


def ack(conn: psycopg.Connection[Any], token: uuid.UUID) -> None:
    row = conn.execute("SELECT dq_ack(%s)", (token,)).fetchone()
    assert row == (True,)


def deliver(conn: psycopg.Connection[Any], key: str, queue: str = Q) -> uuid.UUID:
    """Poll the queue and return the token of key, which must be among the deliveries."""
    got = poll(conn, queue)
    assert key in got, f"{key} not delivered: {sorted(got)}"
    return got[key]


def blocked(conn: psycopg.Connection[Any], queue: str = Q) -> dict[str, int]:
    """{key: parents_pending} of the queue's blocked messages."""
    rows = conn.execute(
        "SELECT key, parents_pending FROM dq_messages WHERE queue = %s AND parents_pending > 0", (queue,)).fetchall()
    return {r[0]: r[1] for r in rows}


def dependency_rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT d.parent_queue, d.parent_key, m.queue, m.key, d.on_parent_failure FROM dq_dependencies d"
        " LEFT JOIN dq_messages m ON m.id = d.child_id ORDER BY 1, 2, 3, 4").fetchall()


def deps(conn: psycopg.Connection[Any], key: str, queue: str = Q) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM dq_dependencies(%s, %s)", (queue, key)).fetchall()


# --------------------------------------------------------------------------- shapes


def test_chain_a_then_b_then_c(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    assert offer(c, "A") == "created"
    assert offer(c, "B", after=["A"]) == "created"
    assert offer(c, "C", after=["B"]) == "created"
    assert blocked(c) == {"B": 1, "C": 1}
    got = poll(c)
    assert list(got) == ["A"]
    ack(c, got["A"])
    got = poll(c)
    assert list(got) == ["B"]
    ack(c, got["B"])
    got = poll(c)
    assert list(got) == ["C"]
    ack(c, got["C"])
    assert dependency_rows(c) == []
    assert c.execute("SELECT count(*) FROM dq_messages").fetchone() == (0,)


def test_fan_in_waits_for_every_parent(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "B")
    offer(c, "C", after=["A", "B", "A"])  # a parent named twice counts once
    assert blocked(c) == {"C": 2}
    got = poll(c)
    assert set(got) == {"A", "B"}
    ack(c, got["A"])
    assert blocked(c) == {"C": 1}
    assert poll(c) == {}
    ack(c, got["B"])
    assert blocked(c) == {}
    assert list(poll(c)) == ["C"]


def test_fan_out_releases_every_child(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    for k in ("B", "C", "D"):
        offer(c, k, after=["A"])
    ack(c, deliver(c, "A"))
    assert set(poll(c)) == {"B", "C", "D"}


def test_across_queues(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A", queue="extract")
    offer(c, "B", queue="load", after=[["extract", "A"]])
    assert poll(c, "load") == {}
    ack(c, deliver(c, "A", "extract"))
    assert list(poll(c, "load")) == ["B"]


def test_a_missing_parent_is_satisfied(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    ack(c, deliver(c, "A"))
    # A is acknowledged, N never existed: B is an ordinary message
    assert offer(c, "B", after=["A", ["elsewhere", "N"]]) == "created"
    assert blocked(c) == {}
    assert dependency_rows(c) == []
    assert list(poll(c)) == ["B"]


def test_empty_after_is_an_ordinary_offer(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    assert offer(c, "B", after=[]) == "created"
    assert list(poll(c)) == ["B"]


# --------------------------------------------------------------------------- blocked messages


def test_a_blocked_child_is_never_polled_nor_due(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A", at=datetime(2999, 1, 1, tzinfo=UTC))
    offer(c, "B", after=["A"], at=LONG_AGO)
    assert poll(c) == {}
    assert c.execute("SELECT dq_next_due(%s)", (Q,)).fetchone() == (datetime(2999, 1, 1, tzinfo=UTC),)
    stats = c.execute("SELECT ready, next_due FROM dq_queue_stats(%s)", (Q,)).fetchone()
    assert stats == (0, datetime(2999, 1, 1, tzinfo=UTC))
    c.execute("SELECT dq_cancel(%s, 'A')", (Q,))  # a cancelled parent: B waits (on_parent_failure wait)
    assert c.execute("SELECT dq_next_due(%s)", (Q,)).fetchone() == (None,)
    assert c.execute("SELECT dq_make_due(%s, 'B')", (Q,)).fetchone() == (False,)
    assert poll(c) == {}
    assert blocked(c) == {"B": 1}


def test_release_sets_the_due_time_and_group(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    later = datetime(2999, 1, 1, tzinfo=UTC)
    offer(c, "A")
    offer(c, "G1", group="g")
    offer(c, "B", after=["A"], at=LONG_AGO + timedelta(seconds=1), group="g")
    offer(c, "L", after=["A"], at=later)
    row = c.execute("SELECT scheduled_at = '9999-12-31 00:00+00', message_group, release_at, release_group"
                    " FROM dq_messages WHERE key = 'B'").fetchone()
    assert row == (True, None, LONG_AGO + timedelta(seconds=1), "g")
    got = poll(c)
    assert set(got) == {"A", "G1"}
    ack(c, got["A"])
    assert c.execute("SELECT key, scheduled_at, message_group, release_at, release_group FROM dq_messages"
                     " WHERE key IN ('B', 'L') ORDER BY key").fetchall() == [
        ("B", LONG_AGO + timedelta(seconds=1), "g", None, None),
        ("L", later, None, None, None),
    ]
    assert poll(c) == {}  # B is behind G1 in its group; L is not due
    ack(c, got["G1"])
    assert list(poll(c)) == ["B"]


# --------------------------------------------------------------------------- updates, cycles, bad input


def test_after_on_an_existing_key_is_refused(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "B")
    before = table_rows(c)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="after applies to a new message"):
        offer(c, "B", after=["A"], payload="new")
    assert table_rows(c) == before
    # an offer that would not update (can_update false) is ignored as usual
    assert offer(c, "B", after=["A"], can_update=False) == "ignored"
    assert table_rows(c) == before


def test_an_update_keeps_a_blocked_child_blocked(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "B", after=["A"])
    later = LONG_AGO + timedelta(days=1)
    assert offer(c, "B", payload="v2", at=later, group="g") == "updated"
    assert offer(c, "B", payload="v2", at=later, group="g") == "ignored"
    assert blocked(c) == {"B": 1}
    assert c.execute("SELECT count(*) FROM dq_groups").fetchone() == (0,)
    assert list(poll(c)) == ["A"]
    c.execute("SELECT dq_offer_many(%s, ARRAY['B'], ARRAY['v3'::bytea], ARRAY[%s::timestamptz])", (Q, later))
    assert blocked(c) == {"B": 1}
    assert poll(c) == {}
    ack(c, c.execute("SELECT lock_token FROM dq_messages WHERE key = 'A'").fetchone()[0])  # type: ignore[index]
    assert c.execute("SELECT scheduled_at, message_group, payload FROM dq_messages WHERE key = 'B'").fetchone() == (
        later, None, b"v3")
    assert list(poll(c)) == ["B"]


def test_cycles_cannot_form(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="names the message itself"):
        offer(c, "A", after=["A"])
    offer(c, "A")
    offer(c, "B", after=["A"])
    offer(c, "C", after=["B"])
    # A is cancelled: B still waits for (q, A) (wait); a new A after C would close a cycle
    c.execute("SELECT dq_cancel(%s, 'A')", (Q,))
    before = table_rows(c)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="a cycle"):
        offer(c, "A", after=["C"])
    assert table_rows(c) == before
    # a new A after something else is B's parent again: its acknowledgement releases B
    offer(c, "X")
    assert offer(c, "A", after=["X"]) == "created"
    ack(c, deliver(c, "X"))
    ack(c, deliver(c, "A"))
    assert list(poll(c)) == ["B"]


BAD: list[tuple[str, Any, str, str]] = [
    ("not an array", {"a": 1}, "wait", "22023"),
    ("a number", [1], "wait", "22023"),
    ("a one-element pair", [["q"]], "wait", "22023"),
    ("a pair of numbers", [[1, 2]], "wait", "22023"),
    ("an empty key", [""], "wait", "22023"),
    ("an empty queue", [["", "k"]], "wait", "22023"),
    ("a key too long", ["k" * 201], "wait", "22001"),
    ("a queue too long", [["q" * 101, "k"]], "wait", "22001"),
    ("itself", ["child"], "wait", "22023"),
    ("itself as a pair", [[Q, "child"]], "wait", "22023"),
    ("too many parents", [f"k{i}" for i in range(10001)], "wait", "54000"),
    ("an unknown failure", ["P"], "retry", "22023"),
]


@pytest.mark.parametrize(("what", "after", "failure", "sqlstate"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_parameter_and_changes_nothing(
    module_conn: psycopg.Connection[Any], what: str, after: Any, failure: str, sqlstate: str
) -> None:
    c = module_conn
    offer(c, "P")
    before = table_rows(c)
    with pytest.raises(psycopg.Error) as e:
        offer(c, "child", after=after, on_parent_failure=failure)
    assert e.value.sqlstate == sqlstate
    assert ("on_parent_failure" if failure != "wait" else "after") in str(e.value)
    assert table_rows(c) == before
    assert dependency_rows(c) == []


def test_null_on_parent_failure(module_conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="on_parent_failure"):
        module_conn.execute("SELECT dq_offer('q', 'k', 'p'::text, after => '[\"x\"]', on_parent_failure => NULL)")


# --------------------------------------------------------------------------- other fates of a parent

FATES = ["dead", "cancelled", "expired", "purged"]


def fail_parent(c: psycopg.Connection[Any], fate: str, queue: str = "parents") -> None:
    """Make the parent A of queue `queue` leave otherwise than acknowledged."""
    if fate == "dead":
        c.execute("SELECT dq_configure_queue(%s, dead_letter_queue => %s)", (queue, queue + "_dlq"))
        token = deliver(c, "A", queue)
        assert c.execute("SELECT outcome FROM dq_dead_letter(%s)", (token,)).fetchone() == ("dead_lettered",)
    elif fate == "cancelled":
        assert c.execute("SELECT dq_cancel(%s, 'A')", (queue,)).fetchone() == (True,)
    elif fate == "expired":
        c.execute("UPDATE dq_messages SET expires_at = %s WHERE queue = %s AND key = 'A'",
                  (LONG_AGO + timedelta(seconds=1), queue))
        assert poll(c, queue) == {}  # the poll that reaches it removes it
    else:
        c.execute("SELECT dq_purge(%s, confirm => true)", (queue,))
    assert c.execute("SELECT count(*) FROM dq_messages WHERE queue = %s AND key = 'A'", (queue,)).fetchone() == (0,)


@pytest.mark.parametrize("fate", FATES)
def test_wait_keeps_the_child_blocked(module_conn: psycopg.Connection[Any], fate: str) -> None:
    c = module_conn
    offer(c, "A", queue="parents")
    offer(c, "B", after=[["parents", "A"]], on_parent_failure="wait")
    fail_parent(c, fate)
    assert blocked(c) == {"B": 1}
    assert poll(c) == {}
    assert deps(c, "B") == [("parent", "parents", "A", "dead" if fate == "dead" else "absent", "wait")]


@pytest.mark.parametrize("fate", FATES)
def test_proceed_releases_the_child(module_conn: psycopg.Connection[Any], fate: str) -> None:
    c = module_conn
    offer(c, "A", queue="parents")
    offer(c, "Z", queue="others")
    offer(c, "B", after=[["parents", "A"], ["others", "Z"]], on_parent_failure="proceed")
    fail_parent(c, fate)
    assert blocked(c) == {"B": 1}
    assert deps(c, "B") == [("parent", "others", "Z", "ready", "proceed")]
    ack(c, deliver(c, "Z", "others"))
    assert list(poll(c)) == ["B"]
    assert dependency_rows(c) == []


@pytest.mark.parametrize("fate", FATES)
def test_dead_letter_moves_the_child_to_its_dead_letter_queue(module_conn: psycopg.Connection[Any], fate: str) -> None:
    c = module_conn
    c.execute("SELECT dq_configure_queue(%s, dead_letter_queue => 'q_dlq')", (Q,))
    offer(c, "A", queue="parents")
    offer(c, "Z", queue="others")
    offer(c, "B", after=[["parents", "A"], ["others", "Z"]], on_parent_failure="dead_letter", group="g")
    offer(c, "W", after=[["parents", "A"]], on_parent_failure="wait")
    fail_parent(c, fate)
    assert c.execute("SELECT queue, dead_from, message_group, parents_pending FROM dq_messages WHERE key = 'B'"
                     ).fetchall() == [("q_dlq", Q, "g", 0)]
    assert blocked(c) == {"W": 1}
    # B's other dependency went with it
    assert [r[3] for r in dependency_rows(c)] == ["W"]


def test_dead_letter_without_a_dead_letter_queue_waits(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A", queue="parents")
    offer(c, "B", after=[["parents", "A"]], on_parent_failure="dead_letter")
    fail_parent(c, "cancelled")
    assert blocked(c) == {"B": 1}
    assert deps(c, "B") == [("parent", "parents", "A", "absent", "dead_letter")]


def test_a_redriven_parent_is_the_same_parent(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A", queue="parents")
    offer(c, "B", after=[["parents", "A"]])
    fail_parent(c, "dead")
    # a child offered while its parent is a dead letter waits for it too
    offer(c, "C", after=[["parents", "A"]])
    assert blocked(c) == {"B": 1, "C": 1}
    assert c.execute("SELECT dq_redrive('parents_dlq')").fetchone() == (1,)
    assert deps(c, "A", "parents") == [("child", Q, "B", "blocked", "wait"), ("child", Q, "C", "blocked", "wait")]
    assert poll(c) == {}
    ack(c, deliver(c, "A", "parents"))
    assert set(poll(c)) == {"B", "C"}


def test_a_re_offered_parent_is_the_same_parent(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "B", after=["A"])
    assert offer(c, "A", payload="v2") == "updated"
    ack(c, deliver(c, "A"))
    assert list(poll(c)) == ["B"]


# --------------------------------------------------------------------------- a child that leaves


@pytest.mark.parametrize("how", ["cancelled", "expired", "purged"])
def test_a_child_that_leaves_takes_its_dependencies(module_conn: psycopg.Connection[Any], how: str) -> None:
    c = module_conn
    offer(c, "A", queue="parents")
    offer(c, "B", after=[["parents", "A"]], expires_at=LONG_AGO + timedelta(days=1))
    if how == "cancelled":
        assert c.execute("SELECT dq_cancel(%s, 'B')", (Q,)).fetchone() == (True,)
    elif how == "expired":
        # a blocked child is never polled: it expires when released past its expiry
        ack(c, deliver(c, "A", "parents"))
        assert poll(c) == {}
    else:
        c.execute("SELECT dq_purge(%s, confirm => true)", (Q,))
    assert c.execute("SELECT count(*) FROM dq_messages WHERE queue = %s", (Q,)).fetchone() == (0,)
    assert dependency_rows(c) == []


def test_dependencies_lists_parents_and_children(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "P", queue="other", at=datetime(2999, 1, 1, tzinfo=UTC))
    offer(c, "B", after=["A", ["other", "P"]], on_parent_failure="proceed")
    offer(c, "C", after=["B"])
    poll(c)
    assert deps(c, "B") == [
        ("parent", "other", "P", "scheduled", "proceed"),
        ("parent", Q, "A", "in_flight", "proceed"),
        ("child", Q, "C", "blocked", "wait"),
    ]
    assert deps(c, "C") == [("parent", Q, "B", "blocked", "wait")]
    assert deps(c, "nothing") == []
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        c.execute("SELECT * FROM dq_dependencies(NULL, 'k')")


# --------------------------------------------------------------------------- the acknowledgement path


def functions_called_by(c: psycopg.Connection[Any], query: str, *params: Any) -> set[str]:
    """The PL/pgSQL functions `query` called (track_functions, in one transaction)."""
    with c.transaction():
        c.execute("SET LOCAL track_functions = 'pl'")
        c.execute(query, params)
        rows = c.execute("SELECT funcname FROM pg_stat_xact_user_functions").fetchall()
    return {r[0] for r in rows}


def test_an_ack_without_children_keeps_the_plain_delete(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "A")
    offer(c, "B", after=["A"])  # another queue's messages have children: no matter
    offer(c, "plain", queue="other")
    called = functions_called_by(c, "SELECT dq_ack(%s)", deliver(c, "plain", "other"))
    assert "dq_ack" in called
    assert not called & {"dq__gone", "dq__resolve", "dq__release_children"}
    called = functions_called_by(c, "SELECT dq_ack(%s)", deliver(c, "A"))
    assert {"dq__gone", "dq__resolve", "dq__release_children"} <= called


def test_ack_many_releases_the_children_of_the_parents_among_its_tokens(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    for k in ("A", "B", "plain"):
        offer(c, k)
    offer(c, "C", after=["A", "B"])
    offer(c, "D", after=["A"])
    got = poll(c)
    assert c.execute("SELECT dq_ack_many(%s)", ([got["A"], got["plain"]],)).fetchone() == (2,)
    assert blocked(c) == {"C": 1}
    assert list(poll(c)) == ["D"]
    assert c.execute("SELECT dq_ack_many(%s)", ([got["B"]],)).fetchone() == (1,)
    assert list(poll(c)) == ["C"]


def test_wide_fan_in_and_fan_out(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    n = 2000
    keys = [f"p{i}" for i in range(n)]
    c.execute("SELECT dq_offer_many(%s, %s, %s, %s)", (Q, keys, [b"x"] * n, [LONG_AGO] * n))
    offer(c, "in", after=keys)
    for i in range(n):
        offer(c, f"out{i}", after=["p0"])
    assert blocked(c) == {"in": n, **{f"out{i}": 1 for i in range(n)}}
    tokens = poll_all(c)
    assert set(tokens) == set(keys)
    assert c.execute("SELECT dq_ack_many(%s)", ([tokens[k] for k in keys[: n // 2]],)).fetchone() == (n // 2,)
    # one acknowledgement releases 500 children (over its parents, by id), the backlog the rest
    assert len(blocked(c)) > 1 + n - 500
    assert c.execute("SELECT dq_release_backlog()").fetchone() >= (n - 500,)
    assert blocked(c) == {"in": n // 2}
    assert c.execute("SELECT dq_ack_many(%s)", ([tokens[k] for k in keys[n // 2:]],)).fetchone() == (n // 2,)
    # 500 of in's dependency rows inline, the other 500 parents' through the backlog, which releases in
    assert c.execute("SELECT dq_release_backlog()").fetchone() == (1,)
    assert blocked(c) == {}
    assert dependency_rows(c) == []
    assert len(poll_all(c)) == n + 1


def poll_all(c: psycopg.Connection[Any], queue: str = Q) -> dict[str, uuid.UUID]:
    rows = c.execute("SELECT key, lock_token FROM dq_poll_many(%s, 10000, %s)", (queue, LOCK)).fetchall()
    return {r[0]: r[1] for r in rows}


@pytest.mark.parametrize("plain", ["dq_offer", "dq_offer_many"])
def test_a_new_message_of_a_key_children_wait_for_is_their_parent(module_conn: psycopg.Connection[Any],
                                                                    plain: str) -> None:
    """A cancelled parent with a 'wait' child; a later message of its key, offered without ``after``
    (either offer), is their parent: its acknowledgement releases the child, even by the plain
    delete an acknowledgement of a message without children takes."""
    c = module_conn
    offer(c, "P")
    offer(c, "C", after=["P"])
    assert c.execute("SELECT dq_cancel(%s, 'P')", (Q,)).fetchone() == (True,)
    assert blocked(c) == {"C": 1}
    if plain == "dq_offer":
        assert offer(c, "P") == "created"
    else:
        assert c.execute("SELECT outcome FROM dq_offer_many(%s, ARRAY['P'], ARRAY['x'::bytea], ARRAY[%s::timestamptz])",
                         (Q, LONG_AGO)).fetchall() == [("created",)]
    assert c.execute("SELECT has_children FROM dq_messages WHERE queue = %s AND key = 'P'", (Q,)).fetchone() == (True,)
    ack(c, deliver(c, "P"))
    assert blocked(c) == {}
    ack(c, deliver(c, "C"))
    assert dependency_rows(c) == []


def test_a_plain_offer_without_waiting_children_is_no_parent(module_conn: psycopg.Connection[Any]) -> None:
    c = module_conn
    offer(c, "X")
    assert c.execute("SELECT count(*) FROM dq_offer_many(%s, ARRAY['Y'], ARRAY['y'::bytea])", (Q,)).fetchone() == (1,)
    assert c.execute("SELECT key, has_children FROM dq_messages WHERE queue = %s ORDER BY key", (Q,)).fetchall() == [
        ("X", False), ("Y", False)]
