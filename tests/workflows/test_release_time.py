"""A released child's release time: ``released_at`` of dq_messages, kept by the archive.

Set by the transaction that releases the child (its last parent acknowledged inline, the release
backlog, a parent's other fate with on_parent_failure proceed), on the queue's clock of the moment
(dq__clock(), the clock of the acknowledgements); NULL for a message that never waited. Kept by a
dead-lettering and a redrive, cleared by an update. Read by dq_get (the clients' ``get``),
dq_list_messages, dq_message_detail and the exports (``dq_export_messages``, ``dq_export_archive``).

Single-session SQL tests sharing one database per module (``module_conn``), whose inline release
limit is 3 (as ``small`` in test_release_backlog.py), so a parent of 5 children leaves 2 to the
backlog. Times are compared with each other and with the server's clock read around the step,
never printed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from clock import TestClock
from sqlhelpers import value_of

from pyqueue import DelayedQueue

Q = "kids"
P = "parents"
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
LOCK = timedelta(minutes=5)
LIMIT = 3


@pytest.fixture(scope="module", autouse=True)
def small_limit(module_dsn: str) -> None:
    """The module's database releases at most 3 children inline (the rest: the backlog)."""
    with psycopg.connect(module_dsn, autocommit=True) as c:
        c.execute("CREATE OR REPLACE FUNCTION public_internal.dq__limit_release_inline() RETURNS integer"
                  f" LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT {LIMIT} $$")


@pytest.fixture
def c(module_conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """The module's connection (tables emptied), both queues archiving, P with a dead-letter queue."""
    module_conn.execute("SELECT dq_configure_queue(%s, archive => true)", (Q,))
    module_conn.execute("SELECT dq_configure_queue(%s, 1, %s, archive => true)", (P, P + ".dead"))
    module_conn.execute("SELECT dq_configure_queue(%s, 1, %s, archive => true)", (Q + "2", Q + ".dead"))
    yield module_conn


def offer(c: psycopg.Connection[Any], queue: str, key: str, *, after: list[Any] | None = None,
          on_parent_failure: str = "wait", payload: str = "p") -> str:
    row = c.execute(
        "SELECT dq_offer(%s, %s, %s::text, %s, after => %s::jsonb, on_parent_failure => %s)",
        (queue, key, payload, LONG_AGO, None if after is None else json.dumps(after), on_parent_failure),
    ).fetchone()
    assert row is not None
    return str(row[0])


def children(c: psycopg.Connection[Any], n: int, parent: str = "A", queue: str = Q) -> None:
    for i in range(1, n + 1):
        assert offer(c, queue, f"c{i}", after=[[P, parent]]) == "created"


def poll(c: psycopg.Connection[Any], queue: str) -> dict[str, uuid.UUID]:
    rows = c.execute("SELECT key, lock_token FROM dq_poll_many(%s, 100, %s)", (queue, LOCK)).fetchall()
    return {r[0]: r[1] for r in rows}


def ack_all(c: psycopg.Connection[Any], queue: str) -> set[str]:
    got = poll(c, queue)
    for token in got.values():
        assert value_of(c, "SELECT dq_ack(%s)", (token,)) is True
    return set(got)


def released_at(c: psycopg.Connection[Any], queue: str = Q) -> dict[str, datetime | None]:
    rows = c.execute("SELECT key, released_at FROM dq_messages WHERE queue = %s", (queue,)).fetchall()
    return {r[0]: r[1] for r in rows}


def archived(c: psycopg.Connection[Any], queue: str, outcome: str = "acked") -> dict[str, datetime | None]:
    rows = c.execute("SELECT key, released_at FROM dq_archive WHERE queue = %s AND outcome = %s",
                     (queue, outcome)).fetchall()
    return {r[0]: r[1] for r in rows}


def acked_at(c: psycopg.Connection[Any], queue: str, key: str, outcome: str = "acked") -> datetime:
    return value_of(c, "SELECT acked_at FROM dq_archive WHERE queue = %s AND key = %s AND outcome = %s",
                    (queue, key, outcome))  # type: ignore[no-any-return]


def server_time(c: psycopg.Connection[Any]) -> datetime:
    return value_of(c, "SELECT clock_timestamp()")  # type: ignore[no-any-return]


def test_fan_out_children_are_released_at_their_parents_acknowledgement(c: psycopg.Connection[Any]) -> None:
    """A parent's acknowledgement releases its children in its own transaction: their release time
    is in that transaction, not before the parent's acked_at; the archive keeps it when they are
    acknowledged; the parent itself never waited (NULL)."""
    offer(c, P, "A")
    children(c, 2)
    assert released_at(c) == {"c1": None, "c2": None}
    token = poll(c, P)["A"]
    with c.transaction():
        before = server_time(c)
        assert value_of(c, "SELECT dq_ack(%s)", (token,)) is True
        after = server_time(c)
    parent_acked = acked_at(c, P, "A")
    live = released_at(c)
    assert set(live) == {"c1", "c2"}
    for key, at in live.items():
        assert at is not None, key
        assert before <= parent_acked <= at <= after, key
    assert ack_all(c, Q) == {"c1", "c2"}
    assert archived(c, Q) == live
    for key, at in live.items():
        assert at is not None and at < acked_at(c, Q, key)
    assert archived(c, P) == {"A": None}


def test_a_child_is_released_when_its_last_parent_is_acknowledged(c: psycopg.Connection[Any]) -> None:
    offer(c, P, "A")
    offer(c, P, "B")
    assert offer(c, Q, "fan-in", after=[[P, "A"], [P, "B"]]) == "created"
    tokens = poll(c, P)
    assert value_of(c, "SELECT dq_ack(%s)", (tokens["A"],)) is True
    assert released_at(c) == {"fan-in": None}
    assert value_of(c, "SELECT dq_ack(%s)", (tokens["B"],)) is True
    at = released_at(c)["fan-in"]
    assert at is not None and at >= acked_at(c, P, "B") >= acked_at(c, P, "A")


def test_children_of_the_backlog_are_released_at_the_backlog_run(
    c: psycopg.Connection[Any], module_clock: TestClock
) -> None:
    """5 children, limit 3: three are released by the acknowledgement, two by dq_release_backlog an
    hour later (the queue's clock moved): their release time is the run's, not the acknowledgement's."""
    offer(c, P, "A")
    children(c, 5)
    assert value_of(c, "SELECT dq_ack(%s)", (poll(c, P)["A"],)) is True
    parent_acked = acked_at(c, P, "A")
    inline = released_at(c)
    assert sorted(k for k, at in inline.items() if at is not None) == ["c1", "c2", "c3"]
    assert value_of(c, "SELECT count(*) FROM dq_release_backlog") == 1
    module_clock.advance(timedelta(hours=1))
    with c.transaction():
        run_started = value_of(c, "SELECT public_internal.dq__clock()")
        assert value_of(c, "SELECT dq_release_backlog()") == 2
        run_ended = value_of(c, "SELECT public_internal.dq__clock()")
    live = released_at(c)
    for key in ("c1", "c2", "c3"):
        assert live[key] == inline[key]
        at = live[key]
        assert at is not None and parent_acked <= at < parent_acked + timedelta(minutes=5), key
    for key in ("c4", "c5"):
        at = live[key]
        assert at is not None and run_started <= at <= run_ended, key
        assert at >= parent_acked + timedelta(hours=1), key
    assert ack_all(c, Q) == {"c1", "c2", "c3", "c4", "c5"}
    assert archived(c, Q) == live


def test_a_poll_releasing_the_backlog_records_the_time_of_that_poll(c: psycopg.Connection[Any]) -> None:
    offer(c, P, "A")
    children(c, 4)
    assert value_of(c, "SELECT dq_ack(%s)", (poll(c, P)["A"],)) is True
    assert released_at(c)["c4"] is None
    before = server_time(c)
    poll(c, "another queue")  # a poll of any queue releases a chunk of the backlog
    after = server_time(c)
    at = released_at(c)["c4"]
    assert at is not None and before <= at <= after


def test_a_proceed_child_is_released_when_its_parent_is_cancelled(c: psycopg.Connection[Any]) -> None:
    """on_parent_failure proceed: a parent's other fate releases the child as an acknowledgement
    would, recorded the same way; a waiting child (wait) is not released and keeps NULL."""
    offer(c, P, "A")
    assert offer(c, Q, "goes-on", after=[[P, "A"]], on_parent_failure="proceed") == "created"
    assert offer(c, Q, "waits", after=[[P, "A"]]) == "created"
    assert value_of(c, "SELECT dq_cancel(%s, 'A')", (P,)) is True
    cancelled = acked_at(c, P, "A", "cancelled")
    live = released_at(c)
    assert live["waits"] is None
    at = live["goes-on"]
    assert at is not None and at >= cancelled
    assert ack_all(c, Q) == {"goes-on"}
    assert archived(c, Q) == {"goes-on": at}


def test_messages_that_never_waited_have_no_release_time(c: psycopg.Connection[Any]) -> None:
    """An ordinary message, and a child whose parents no longer exist when it is offered (satisfied
    at once: it never waits), are archived with released_at NULL."""
    offer(c, Q, "plain")
    assert offer(c, Q, "orphan", after=[[P, "never-offered"]]) == "created"
    assert released_at(c) == {"plain": None, "orphan": None}
    assert ack_all(c, Q) == {"plain", "orphan"}
    assert archived(c, Q) == {"plain": None, "orphan": None}
    assert value_of(c, "SELECT count(*) FROM dq_archive WHERE released_at IS NOT NULL") == 0


def test_an_update_clears_the_release_time_and_an_unchanged_offer_keeps_it(c: psycopg.Connection[Any]) -> None:
    """A re-offer of a released child with a new payload makes it a new message (created_at too):
    it waited for nothing, so NULL; the same offer again changes nothing and keeps it."""
    offer(c, P, "A")
    children(c, 2)
    assert value_of(c, "SELECT dq_ack(%s)", (poll(c, P)["A"],)) is True
    before = released_at(c)
    assert offer(c, Q, "c1", payload="p") == "ignored"
    assert offer(c, Q, "c2", payload="new") == "updated"
    after = released_at(c)
    assert after["c1"] == before["c1"] is not None
    assert after["c2"] is None
    # dq_offer_many's update, likewise.
    offer(c, P, "B")
    assert offer(c, Q, "d1", after=[[P, "B"]]) == "created"
    assert value_of(c, "SELECT dq_ack(%s)", (poll(c, P)["B"],)) is True
    assert released_at(c)["d1"] is not None
    c.execute("SELECT dq_offer_many(%s, ARRAY['d1'], ARRAY['new'::bytea], ARRAY[%s::timestamptz])", (Q, LONG_AGO))
    assert released_at(c)["d1"] is None


def test_dead_letter_and_redrive_keep_the_release_time(c: psycopg.Connection[Any]) -> None:
    """A released child that dies keeps its release time in its dead letter and in its archive row
    (outcome dead); a redrive brings it back with it (its parents released it once); its final
    acknowledgement archives it too."""
    q2 = Q + "2"
    offer(c, P, "A")
    assert offer(c, q2, "k", after=[[P, "A"]]) == "created"
    assert value_of(c, "SELECT dq_ack(%s)", (poll(c, P)["A"],)) is True
    at = released_at(c, q2)["k"]
    assert at is not None
    token = poll(c, q2)["k"]
    assert value_of(c, "SELECT dq_nack(%s, interval '0', 'boom')", (token,)) is True
    assert poll(c, q2) == {}  # max_deliveries 1: the due message goes to the dead-letter queue
    assert released_at(c, Q + ".dead") == {"k": at}
    assert archived(c, q2, "dead") == {"k": at}
    assert value_of(c, "SELECT dq_redrive(%s)", (Q + ".dead",)) == 1
    assert released_at(c, q2) == {"k": at}
    assert ack_all(c, q2) == {"k"}
    assert archived(c, q2) == {"k": at}


def test_a_child_dead_lettered_by_its_parent_was_never_released(c: psycopg.Connection[Any]) -> None:
    """on_parent_failure dead_letter: the child goes to its dead-letter queue without being released."""
    q2 = Q + "2"
    offer(c, P, "A")
    assert offer(c, q2, "k", after=[[P, "A"]], on_parent_failure="dead_letter") == "created"
    assert value_of(c, "SELECT dq_cancel(%s, 'A')", (P,)) is True
    assert released_at(c, Q + ".dead") == {"k": None}
    assert archived(c, q2, "dead") == {"k": None}


def test_the_reads_show_the_release_time(c: psycopg.Connection[Any]) -> None:
    """dq_get, dq_list_messages and dq_message_detail return released_at."""
    offer(c, P, "A")
    children(c, 1)
    offer(c, Q, "plain")
    assert value_of(c, "SELECT dq_ack(%s)", (poll(c, P)["A"],)) is True
    at = released_at(c)["c1"]
    assert at is not None
    assert c.execute("SELECT key, released_at FROM dq_get(%s, 'c1')", (Q,)).fetchall() == [("c1", at)]
    listed = c.execute("SELECT key, released_at FROM dq_list_messages(%s) ORDER BY key", (Q,)).fetchall()
    assert listed == [("c1", at), ("plain", None)]
    cid = value_of(c, "SELECT id FROM dq_messages WHERE queue = %s AND key = 'c1'", (Q,))
    assert c.execute("SELECT released_at FROM dq_message_detail(%s, %s)", (Q, cid)).fetchall() == [(at,)]


def test_both_clients_get_the_release_time(q: DelayedQueue, dsn: str) -> None:
    """StoredMessage.released_at, from the sync and the asyncio client (``q`` runs the test with each)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        offer(c, q.queue, "parent")
        offer(c, q.queue, "plain")
        assert offer(c, q.queue, "child", after=["parent"]) == "created"
        assert q.get("child").released_at is None  # type: ignore[union-attr]
        assert value_of(c, "SELECT dq_ack(%s)", (poll(c, q.queue)["parent"],)) is True
        at = value_of(c, "SELECT released_at FROM dq_messages WHERE key = 'child'")
    child, plain = q.get("child"), q.get("plain")
    assert at is not None and child is not None and child.released_at == at
    assert plain is not None and plain.released_at is None


def test_the_exports_have_the_release_time(c: psycopg.Connection[Any]) -> None:
    """dq_export_archive and dq_export_messages return released_at as their last column, and it can
    be filtered on."""
    offer(c, P, "A")
    children(c, 2)
    offer(c, Q, "plain")
    assert value_of(c, "SELECT dq_ack(%s)", (poll(c, P)["A"],)) is True
    live = released_at(c)

    def export(fn: str, filters: list[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
        with c.transaction():
            cursor = value_of(c, f"SELECT {fn}(NULL, NULL, %s::jsonb)", (json.dumps(filters),))  # noqa: S608
            cur = c.execute(f'FETCH ALL FROM "{cursor}"')  # noqa: S608
            assert cur.description is not None
            return [d.name for d in cur.description], cur.fetchall()

    names, rows = export("dq_export_messages", [["queue", "=", Q], ["released_at", "IS NOT NULL"]])
    assert names[-1] == "released_at"
    assert sorted((r[names.index("key")], r[-1]) for r in rows) == [("c1", live["c1"]), ("c2", live["c2"])]
    assert ack_all(c, Q) == {"c1", "c2", "plain"}
    names, rows = export("dq_export_archive", [["queue", "=", Q]])
    assert names[-1] == "released_at"
    assert {r[names.index("key")]: r[-1] for r in rows} == {**live, "plain": None}
    at = live["c1"]
    assert at is not None
    names, rows = export("dq_export_archive", [["released_at", ">=", at.isoformat()]])
    assert sorted(r[names.index("key")] for r in rows) == sorted(k for k, v in live.items() if v and v >= at)
