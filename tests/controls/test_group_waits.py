"""FIFO message groups never make a producer wait for a consumer's transaction.

A consumer that polls inside a transaction (``q.transaction()``: poll, handle, ack, one commit) holds
its group's ``dq_groups`` row until it commits. Offers, cancels and batches of offers to that group
from other sessions must return at once all the same (sql/020_groups.sql: a change that finds the
group's row held is queued in ``dq_group_settles`` and applied by the next poll that can lock the
group), and the group must still deliver one message at a time, in order.

"Returns at once" is checked on the server, not with a stopwatch: the producers' sessions run with
``lock_timeout`` set, so a call that waited for any lock fails with SQLSTATE 55P03 instead of
hanging; a call that takes no lock wait can never reach the timeout, however loaded the host.
The interleavings at the SQL level are the isolation specs ``tests/isolation/group_*.spec``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from controlworkers import group_race
from psycopg.conninfo import make_conninfo
from sqlhelpers import RemoteSession, run_workers

from pyqueue import DelayedQueue, OfferOutcome, OfferRequest

#: A lock wait longer than this fails the waiting call with 55P03 (lock_not_available).
LOCK_TIMEOUT = "2s"


def no_wait_dsn(dsn: str) -> str:
    """``dsn`` for sessions whose every lock wait ends in 55P03 after :data:`LOCK_TIMEOUT`."""
    return make_conninfo(dsn, options=f"-c lock_timeout={LOCK_TIMEOUT}")


@pytest.fixture
def producer(dsn: str) -> Iterator[DelayedQueue]:
    """Another client of the queue "emails", whose calls fail rather than wait for a lock."""
    with DelayedQueue(no_wait_dsn(dsn), "emails") as queue:
        yield queue


def db_now(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def test_producers_do_not_wait_for_a_transactional_consumer_of_the_group(
        q: DelayedQueue, producer: DelayedQueue, conn: psycopg.Connection[Any]) -> None:
    """The consumer's transaction holds group G's head 'first'; another client
    offers to G (one message earlier than 'first', one later), cancels a message of G and offers a
    batch to G, all before the consumer commits. Each call returns without waiting; afterwards G
    delivers its messages one at a time, in order: 'first' kept its place (it was delivered), then
    'zero' (earliest), then the rest by their times ('second' was cancelled)."""
    t = db_now(conn) - timedelta(minutes=10)
    assert q.offer("first", "x", at=t + timedelta(seconds=2), group="G") is OfferOutcome.CREATED
    assert q.offer("second", "x", at=t + timedelta(seconds=3), group="G") is OfferOutcome.CREATED
    with q.transaction() as batch:
        assert batch.message is not None and batch.message.key == "first"
        assert producer.offer("zero", "x", at=t + timedelta(seconds=1), group="G") is OfferOutcome.CREATED
        assert producer.offer("third", "x", at=t + timedelta(seconds=4), group="G") is OfferOutcome.CREATED
        assert producer.cancel("second") is True
        assert producer.offer_many([OfferRequest("fifth", "x", at=t + timedelta(seconds=6), group="G"),
                                    OfferRequest("fourth", "x", at=t + timedelta(seconds=5), group="G")]) == {
            "fifth": OfferOutcome.CREATED, "fourth": OfferOutcome.CREATED}
        # Still in the consumer's transaction: its group is held, nothing of G is deliverable.
        assert producer.poll(10) == []
    delivered = []
    for _ in range(4):
        got = q.poll(10)
        assert len(got) == 1, [m.key for m in got]  # one message of the group at a time
        delivered.append(got[0].key)
        assert got[0].ack()
    assert delivered == ["zero", "third", "fourth", "fifth"]
    assert q.poll(10) == []


def test_two_transactional_consumers_offering_into_each_others_groups(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """The deadlock that waiting would cause: consumer A holds group GA's head in its transaction,
    consumer B holds GB's; A offers into GB and B into GA before either commits. Neither offer waits
    (so there is no cycle to deadlock on); after both commit each group delivers the offered message
    after its acknowledged head, one at a time."""
    conn.execute("SELECT dq_offer('emails', 'a1', 'x'::text, now() - interval '2 minutes', message_group => 'GA'),"
                 "       dq_offer('emails', 'b1', 'x'::text, now() - interval '1 minute', message_group => 'GB')")
    with RemoteSession(no_wait_dsn(dsn), autocommit=False) as a, RemoteSession(no_wait_dsn(dsn), autocommit=False) as b:
        got_a = a.one("SELECT key, lock_token FROM dq_poll_many('emails', 1, interval '1 minute')")
        got_b = b.one("SELECT key, lock_token FROM dq_poll_many('emails', 1, interval '1 minute')")
        assert (got_a["key"], got_b["key"]) == ("a1", "b1")
        assert a.one("SELECT dq_offer('emails', 'b2', 'x'::text, message_group => 'GB') AS o")["o"] == "created"
        assert b.one("SELECT dq_offer('emails', 'a2', 'x'::text, message_group => 'GA') AS o")["o"] == "created"
        assert a.one("SELECT dq_ack(%s) AS ok", (got_a["lock_token"],))["ok"] is True
        assert b.one("SELECT dq_ack(%s) AS ok", (got_b["lock_token"],))["ok"] is True
        a.execute("COMMIT")
        b.execute("COMMIT")
    rows = conn.execute("SELECT key FROM dq_poll_many('emails', 10, interval '1 minute') ORDER BY key").fetchall()
    assert [r[0] for r in rows] == ["a2", "b2"]
    assert conn.execute("SELECT count(*) FROM dq_poll_many('emails', 10, interval '1 minute')").fetchone() == (0,)


def test_transactional_consumers_and_producers_keep_every_group_in_order(dsn: str) -> None:
    """Ledger: four consumers poll inside transactions (rolling back or nacking some), two producers
    offer to their own groups meanwhile (some offers two to a transaction), so settles are queued
    whenever a producer meets a group held by a consumer. Each group's messages must be handled for
    good exactly once each and in sequence order (the ledger, written in the consumer's transaction,
    is ordered by commit since a group has one message in flight at a time); at the end nothing is
    left: no message, no group row, no queued settle."""
    groups = [f"g{i}" for i in range(6)]
    count = 30
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE ledger (n bigserial PRIMARY KEY, message_group text NOT NULL, seq integer NOT NULL)")
    results = run_workers(
        group_race,
        [("consume", dsn, "race", 8.0, seed) for seed in range(4)]
        + [("produce", dsn, "race", groups[i::2], count, 100 + i) for i in range(2)],
        timeout=120)
    assert sum(results[4:]) == len(groups) * count
    assert sum(results[:4]) > 20, "the consumers made too little progress to prove anything"
    with psycopg.connect(dsn) as c:  # what is left, handled in order by one more transactional consumer
        while True:
            rows = c.execute("SELECT message_group, key, lock_token FROM dq_poll_many('race', 10, interval '1 minute')"
                             ).fetchall()
            if not rows:
                c.commit()
                break
            for group, key, token in rows:
                seq = int(key.rsplit("-", 1)[1])
                c.execute("INSERT INTO ledger (message_group, seq) VALUES (%s, %s)", (group, seq))
                assert c.execute("SELECT dq_ack(%s::uuid)", (token,)).fetchone() == (True,)
            c.commit()
        ledger: dict[str, list[int]] = {}
        for group, seq in c.execute("SELECT message_group, seq FROM ledger ORDER BY n").fetchall():
            ledger.setdefault(group, []).append(seq)
        assert ledger == {g: list(range(count)) for g in groups}
        left = c.execute("SELECT (SELECT count(*) FROM dq_messages), (SELECT count(*) FROM dq_groups), "
                         "(SELECT count(*) FROM dq_group_settles)").fetchone()
        assert left == (0, 0, 0)
        # The race went through queued settles (the workers' statistics are flushed when they exit).
        queued = c.execute("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'dq_group_settles'").fetchone()
        assert queued is not None and queued[0] > 0, "no settle was queued: the race did not test what it is for"


def test_a_poll_never_delivers_the_head_of_a_group_with_a_queued_settle(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    """The check inside dq__poll_level, in the window no interleaving of whole statements reaches: a
    settle queued after the poll applied the due ones (it committed between the poll's lock of the
    group and its read of the head). The window is simulated by moving the queued settle's due time
    past the poll's clock, so the poll's first step leaves it; the poll must still not deliver the
    group's stale head 'second' (the queued settle makes the earlier 'zero' the head): it applies the
    settle instead, and the next poll delivers 'zero'."""
    conn.execute("SELECT dq_offer('emails', 'first', 'x'::text, now() - interval '3 minutes', message_group => 'G'),"
                 "       dq_offer('emails', 'second', 'x'::text, now() - interval '1 minute', message_group => 'G')")
    with psycopg.connect(dsn) as holder:
        token = holder.execute("SELECT lock_token FROM dq_poll_many('emails', 1, interval '1 minute')").fetchone()
        assert token is not None
        assert holder.execute("SELECT dq_ack(%s)", (token[0],)).fetchone() == (True,)
        conn.execute("SELECT dq_offer('emails', 'zero', 'x'::text, now() - interval '2 minutes', message_group => 'G')")
        holder.commit()
    assert conn.execute("SELECT count(*) FROM dq_group_settles").fetchone() == (1,)
    conn.execute("UPDATE dq_group_settles SET due_at = now() + interval '1 day'")
    assert conn.execute("SELECT key FROM dq_poll_many('emails', 10, interval '1 minute')").fetchall() == []
    assert conn.execute("SELECT count(*) FROM dq_group_settles").fetchone() == (0,)
    assert conn.execute("SELECT key FROM dq_poll_many('emails', 10, interval '1 minute')").fetchall() == [("zero",)]
