"""The order in which acknowledgements and offers after parents lock several messages.

``dq_ack_many`` deletes its rows in the order its scan gives them (not id order). An offer after several parents
(sql/095_dependencies.sql) takes their locks NOWAIT in a subtransaction and, when one is held,
rolls back and waits for the rows one at a time, holding none: so a batch acknowledgement and an
offer that share two parents never each hold one and wait for the other (40P01, which an offer
that waited for its parents' locks in id order met). Real connections, and a third that holds a
lock, put the steps in the order that deadlocked: the batch holds the parent with the higher id
and waits for the lower one, which the offer could lock first. Each step waits for the previous
session to be seen waiting for a lock (pg_stat_activity), so the interleaving is the same on every
run.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg
from sqlhelpers import wait_for_lock_wait

LONG_AGO = "2020-01-01 00:00:00+00"


def two_polled_parents(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, uuid.UUID]]:
    """P1 and P2 offered (P1 has the lower id) and polled, P2 before P1 in every order a delete by
    lock tokens may follow: P2's token is the lower (an index scan of the tokens) and P2's row
    version comes first in the table (a bitmap scan), P1's row having been rewritten by dq_extend.
    Polls again until the tokens fall that way (dq_release gives the deliveries back, uncounted)."""
    for key in ("P1", "P2"):
        conn.execute("SELECT dq_offer('q', %s, 'x'::text, %s)", (key, LONG_AGO))
    for _ in range(100):
        got = {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT key, id, lock_token FROM dq_poll_many('q', 10, interval '1 hour')")}
        assert sorted(got) == ["P1", "P2"], got
        assert got["P1"][0] < got["P2"][0]
        if got["P2"][1] < got["P1"][1]:
            conn.execute("SELECT dq_extend(%s, interval '1 hour')", (got["P1"][1],))
            assert conn.execute("SELECT (SELECT ctid FROM dq_messages WHERE key = 'P2') "
                                "< (SELECT ctid FROM dq_messages WHERE key = 'P1')").fetchone() == (True,)
            return got
        conn.execute("SELECT dq_release(%s)", ([got["P1"][1], got["P2"][1]],))
    raise AssertionError("the tokens never fell in the wanted order")


def row_is_locked(conn: psycopg.Connection[Any], row_id: int) -> bool:
    """Whether some other session holds a lock on row ``row_id`` of dq_messages: a FOR UPDATE
    NOWAIT of it from ``conn`` (given back at once) fails."""
    try:
        with conn.transaction():
            conn.execute("SELECT 1 FROM dq_messages WHERE id = %s FOR UPDATE NOWAIT", (row_id,))
    except psycopg.errors.LockNotAvailable:
        return True
    return False


def wait_for_blocked_or_idle(conn: psycopg.Connection[Any], pid: int) -> str:
    """Until backend ``pid`` waits for a lock in a dq_offer or has finished one (idle in transaction;
    not the BEGIN psycopg sends before it); returns which."""
    deadline = time.monotonic() + 60
    while True:
        row = conn.execute("SELECT wait_event_type, state, strpos(query, 'dq_offer') > 0 FROM pg_stat_activity "
                           "WHERE pid = %s", (pid,)).fetchone()
        assert row is not None
        if row[2] and row[0] == "Lock":
            return "waiting"
        if row[2] and row[1] == "idle in transaction":
            return "done"
        assert time.monotonic() < deadline, row
        time.sleep(0.02)


def offer_child(producer: psycopg.Connection[Any], outcome: dict[str, Any]) -> None:
    """Offer C after P1 and P2 on ``producer`` (its transaction left open): outcome["offer"] is the
    row or the error."""
    try:
        outcome["offer"] = producer.execute("SELECT dq_offer('q', 'C', 'c'::text, %s, after => %s::jsonb)",
                                            (LONG_AGO, json.dumps(["P1", "P2"]))).fetchone()
    except psycopg.Error as exc:
        outcome["offer"] = exc


def test_ack_many_and_an_offer_after_the_same_parents_do_not_deadlock(dsn: str, conn) -> None:
    parents = two_polled_parents(conn)
    outcome: dict[str, Any] = {}
    with (psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as consumer,
          psycopg.connect(dsn) as producer):
        # A third session holds P1 (the lower id) with the lock an offer takes: a second offer can
        # share it, an acknowledgement (a delete) must wait.
        holder.execute("SELECT 1 FROM dq_messages WHERE id = %s FOR KEY SHARE", (parents["P1"][0],))

        def ack_many() -> None:
            try:
                # P2 first in every order the delete may take (see two_polled_parents): it deletes P2,
                # then waits for P1.
                outcome["ack"] = consumer.execute("SELECT dq_ack_many(%s)",
                                                  ([parents["P2"][1], parents["P1"][1]],)).fetchone()
            except psycopg.Error as exc:
                outcome["ack"] = exc

        acking = threading.Thread(target=ack_many)
        acking.start()
        wait_for_lock_wait(conn, "dq_ack_many")  # blocked at P1, holding P2
        offering = threading.Thread(target=offer_child, args=(producer, outcome))
        offering.start()
        # The offer can share P1 with the holder, not P2, which the batch deleted: it gives P1 back
        # and waits for P2, holding no parent's lock.
        assert wait_for_blocked_or_idle(conn, producer.info.backend_pid) == "waiting"
        holder.commit()  # the batch deletes P1 and commits; the offer finds both parents gone
        offering.join(60)
        assert not offering.is_alive()
        if isinstance(outcome["offer"], psycopg.Error):
            producer.rollback()
        else:
            producer.commit()
        acking.join(60)
        assert not acking.is_alive()
    assert outcome == {"ack": (2,), "offer": ("created",)}, outcome
    # The batch committed first: both parents were acknowledged before the child was stored, so it
    # was offered as an ordinary message.
    rows = conn.execute("SELECT key, parents_pending, lock_token IS NULL FROM dq_messages ORDER BY key").fetchall()
    assert rows == [("C", 0, True)]
    assert conn.execute("SELECT count(*) FROM dq_dependencies").fetchone() == (0,)
    assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('q', 10, interval '1 hour')")] == ["C"]


def test_an_offer_that_meets_a_held_parent_waits_holding_none_of_its_parents(dsn: str, conn) -> None:
    """P2 is held (FOR UPDATE, which an offer's FOR KEY SHARE waits for). The offer after P1 and
    P2 waits for P2 without keeping P1: P1 can be acknowledged meanwhile without waiting. When P2
    is given back, the offer looks again: P1 is gone (satisfied), P2 is locked, and the child waits
    for P2 alone."""
    for key in ("P1", "P2"):
        conn.execute("SELECT dq_offer('q', %s, 'x'::text, %s)", (key, LONG_AGO))
    ids = dict(conn.execute("SELECT key, id FROM dq_messages").fetchall())
    outcome: dict[str, Any] = {}
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn) as producer:
        holder.execute("SELECT 1 FROM dq_messages WHERE id = %s FOR UPDATE", (ids["P2"],))

        offering = threading.Thread(target=offer_child, args=(producer, outcome))
        offering.start()
        assert wait_for_blocked_or_idle(conn, producer.info.backend_pid) == "waiting"
        assert not row_is_locked(conn, ids["P1"])  # the offer took P1 and gave it back
        token = conn.execute("SELECT lock_token FROM dq_poll_many('q', 10, interval '1 hour')").fetchone()
        assert token is not None  # P1 (P2 is locked: the poll skips it)
        assert conn.execute("SELECT dq_ack(%s)", (token[0],)).fetchone() == (True,)  # did not wait
        holder.rollback()
        offering.join(60)
        assert not offering.is_alive()
        producer.commit()
    assert outcome == {"offer": ("created",)}, outcome
    assert conn.execute("SELECT parents_pending FROM dq_messages WHERE key = 'C'").fetchone() == (1,)
    assert conn.execute("SELECT parent_key FROM dq_dependencies").fetchall() == [("P2",)]
