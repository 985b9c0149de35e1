"""The order in which acknowledgements and offers after parents lock several messages.

An offer after several parents locks the parents that exist FOR KEY SHARE in id order
(sql/095_dependencies.sql); ``dq_ack_many`` must take its rows in the same order, or a batch
acknowledgement and an offer that share two parents can each hold one and wait for the other
(40P01). Two real connections and a third that holds a lock put the steps in the order that
deadlocked: the batch holds the parent with the higher id and waits for the lower one, the offer
locks the lower one and then needs the higher one. Each step waits for the previous session to be
seen waiting for a lock (pg_stat_activity), so the interleaving is the same on every run.
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


def wait_for_blocked_or_idle(conn: psycopg.Connection[Any], pid: int) -> str:
    """Until backend ``pid`` waits for a lock or has finished its statement (idle in transaction);
    returns which."""
    deadline = time.monotonic() + 60
    while True:
        row = conn.execute("SELECT wait_event_type, state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        assert row is not None
        if row[0] == "Lock":
            return "waiting"
        if row[1] == "idle in transaction":
            return "done"
        assert time.monotonic() < deadline, row
        time.sleep(0.02)


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
                outcome["ack"] = consumer.execute("SELECT dq_ack_many(%s)",
                                                  ([parents["P1"][1], parents["P2"][1]],)).fetchone()
            except psycopg.Error as exc:
                outcome["ack"] = exc

        def offer_child() -> None:
            try:
                outcome["offer"] = producer.execute(
                    "SELECT dq_offer('q', 'C', 'c'::text, %s, after => %s::jsonb)",
                    (LONG_AGO, json.dumps(["P1", "P2"]))).fetchone()
            except psycopg.Error as exc:
                outcome["offer"] = exc

        acking = threading.Thread(target=ack_many)
        acking.start()
        wait_for_lock_wait(conn, "dq_ack_many")  # blocked at P1 (holding P2, when it deletes in token order)
        offering = threading.Thread(target=offer_child)
        offering.start()
        # The offer shares P1 with the holder; then it either has both parents (done, its transaction
        # open) or waits for P2 (when the batch took P2 first).
        wait_for_blocked_or_idle(conn, producer.info.backend_pid)
        holder.commit()  # the batch now waits for the offer's lock on P1
        offering.join(60)
        assert not offering.is_alive()
        if isinstance(outcome["offer"], psycopg.Error):
            producer.rollback()
        else:
            producer.commit()
        acking.join(60)
        assert not acking.is_alive()
    assert outcome == {"ack": (2,), "offer": ("created",)}, outcome
    # The offer committed first: the acknowledgement of both parents released the child.
    rows = conn.execute("SELECT key, parents_pending, lock_token IS NULL FROM dq_messages ORDER BY key").fetchall()
    assert rows == [("C", 0, True)]
    assert conn.execute("SELECT count(*) FROM dq_dependencies").fetchone() == (0,)
    assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('q', 10, interval '1 hour')")] == ["C"]
