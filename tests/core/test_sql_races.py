"""Races between real clients: separate processes (``spawn``), each with its own connection.

* Concurrent tests start N worker processes (:func:`sqlhelpers.run_workers`) lined up on a
  Barrier right before the racing statement, and assert on what every process got back.
* Sequenced scenarios (expired lock, re-offer in flight, nack, extend) drive two or three
  :class:`sqlhelpers.RemoteSession` clients (each a process with its own connection) in an order
  chosen by the test. Waits ask the server's clock (never the client's): a lock "has expired"
  when the server's clock_timestamp() has passed the locked_until it returned.

The deterministic interleavings of the same races (who blocks on whom) are in tests/isolation/.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlhelpers import (
    RemoteSession,
    drain_worker,
    message,
    offer_many_worker,
    offer_one_worker,
    run_workers,
)

T1 = datetime(2020, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("payloads", ["same", "different"])
def test_concurrent_offers_of_one_new_key(conn, dsn, payloads):
    n = 10
    args = [(dsn, "q", "the-key", b"same" if payloads == "same" else f"payload-{i}".encode(), T1) for i in range(n)]
    outcomes = run_workers(offer_one_worker, args)
    counts = Counter(outcomes)
    assert counts["created"] == 1, outcomes
    if payloads == "same":
        # Every later offer found an identical message.
        assert counts["ignored"] == n - 1, outcomes
    else:
        # Every later offer found another process's payload: all replaced it.
        assert counts["updated"] == n - 1, outcomes
    rows = conn.execute("SELECT key, payload FROM dq_messages").fetchall()
    assert len(rows) == 1
    assert rows[0][0] == "the-key"
    assert bytes(rows[0][1]) in {a[3] for a in args}


def test_eight_consumers_drain_20000_messages_exactly_once(conn, dsn):
    total, batch = 20_000, 5_000
    for start in range(0, total, batch):
        keys = [f"m{i:05d}" for i in range(start, start + batch)]
        conn.execute(
            "SELECT count(*) FROM dq_offer_many('q', %s::text[], array_fill('\\x00'::bytea, ARRAY[%s]), "
            "array_fill(%s::timestamptz, ARRAY[%s]))",
            (keys, batch, T1, batch),
        )
    assert conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == total

    per_consumer = run_workers(drain_worker, [(dsn, "q", 100)] * 8)

    delivered = [k for keys in per_consumer for k in keys]
    duplicates = [k for k, c in Counter(delivered).items() if c > 1]
    assert duplicates == []
    missing = {f"m{i:05d}" for i in range(total)} - set(delivered)
    assert missing == set()
    assert len(delivered) == total
    assert conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_expired_lock_is_redelivered_and_the_first_holders_ack_is_stale(conn, dsn, clock):
    conn.execute("SELECT dq_offer('q', 'k', 'v'::text, %s)", (T1,))
    with RemoteSession(dsn) as first, RemoteSession(dsn) as second:
        [d1] = first.execute("SELECT * FROM dq_poll_many('q', 1, interval '30 seconds')")
        assert d1["delivery_count"] == 1
        assert second.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')") == []
        clock.advance(29)  # the queue's clock: the lock still holds...
        assert second.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')") == []
        clock.advance(2)  # ...and now it has expired

        [d2] = second.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')")
        assert d2["key"] == "k" and d2["id"] == d1["id"]
        assert d2["delivery_count"] == 2
        assert d2["lock_token"] != d1["lock_token"]
        assert d2["scheduled_at"] == d1["locked_until"]  # due when the first lock expired
        assert d2["scheduled_at_initially"] == T1

        assert first.one("SELECT dq_ack(%s::uuid) AS ok", (d1["lock_token"],))["ok"] is False
        row = message(conn, "q", "k")
        assert row is not None and row["lock_token"] == d2["lock_token"] and row["delivery_count"] == 2
        assert first.one("SELECT dq_nack(%s::uuid) AS ok", (d1["lock_token"],))["ok"] is False
        assert first.one("SELECT dq_extend(%s::uuid, interval '1 hour') AS until", (d1["lock_token"],))["until"] is None
        assert message(conn, "q", "k") == row

        assert second.one("SELECT dq_ack(%s::uuid) AS ok", (d2["lock_token"],))["ok"] is True
    assert message(conn, "q", "k") is None


def test_reoffer_while_in_flight_makes_the_old_token_stale(conn, dsn):
    with RemoteSession(dsn) as producer, RemoteSession(dsn) as consumer:
        assert producer.one("SELECT dq_offer('q', 'k', 'v1'::text, %s) AS o", (T1,))["o"] == "created"
        [d1] = consumer.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')")
        assert bytes(d1["payload"]) == b"v1"

        assert producer.one("SELECT dq_offer('q', 'k', 'v2'::text) AS o")["o"] == "updated"

        before = conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0]
        assert consumer.one("SELECT dq_ack(%s::uuid) AS ok", (d1["lock_token"],))["ok"] is False
        assert conn.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == before == 1
        row = message(conn, "q", "k")
        assert row is not None and bytes(row["payload"]) == b"v2" and row["delivery_count"] == 0

        [d2] = consumer.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')")
        assert bytes(d2["payload"]) == b"v2"
        assert d2["delivery_count"] == 1
        assert d2["id"] == d1["id"]
        assert consumer.one("SELECT dq_ack(%s::uuid) AS ok", (d2["lock_token"],))["ok"] is True


def test_nack_with_delay_hides_the_message_until_the_delay_passes(conn, dsn, clock):
    conn.execute("SELECT dq_offer('q', 'k', 'v'::text, %s)", (T1,))
    with RemoteSession(dsn) as a, RemoteSession(dsn) as b:
        [d1] = a.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')")
        before = clock.now()
        assert a.one("SELECT dq_nack(%s::uuid, interval '5 minutes') AS ok", (d1["lock_token"],))["ok"] is True
        after = clock.now()
        row = message(conn, "q", "k")
        assert row is not None
        visible_at = row["scheduled_at"]
        assert before + timedelta(minutes=5) <= visible_at <= after + timedelta(minutes=5)
        assert row["lock_token"] is None and row["delivery_count"] == 1
        assert b.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')") == []
        clock.advance(timedelta(minutes=4, seconds=50))
        assert b.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')") == []
        clock.advance(timedelta(seconds=10) + (after - before))  # past visible_at on the queue's clock

        [d2] = b.execute("SELECT * FROM dq_poll_many('q', 1, interval '1 minute')")
        assert d2["key"] == "k" and d2["delivery_count"] == 2
        assert d2["scheduled_at"] == visible_at
        # The first token was given back: it is stale now, and so is nothing else.
        assert a.one("SELECT dq_nack(%s::uuid) AS ok", (d1["lock_token"],))["ok"] is False
        row = message(conn, "q", "k")
        assert row is not None and row["lock_token"] == d2["lock_token"]
        assert b.one("SELECT dq_ack(%s::uuid) AS ok", (d2["lock_token"],))["ok"] is True


def test_extend_keeps_the_message_invisible_past_its_first_timeout(conn, dsn, clock):
    conn.execute("SELECT dq_offer('q', 'k', 'v'::text, %s)", (T1,))
    conn.execute("SELECT dq_offer('q', 'other', 'v'::text, %s)", (T1 + timedelta(seconds=1),))
    with RemoteSession(dsn) as a, RemoteSession(dsn) as b:
        [d1] = a.execute("SELECT * FROM dq_poll_many('q', 1, interval '30 seconds')")
        assert d1["key"] == "k"
        extended = a.one("SELECT dq_extend(%s::uuid, interval '5 minutes') AS until", (d1["lock_token"],))["until"]
        assert extended >= d1["locked_until"] + timedelta(minutes=4, seconds=30)
        row = message(conn, "q", "k")
        assert row is not None and row["scheduled_at"] == extended and row["lock_token"] == d1["lock_token"]

        # A minute after the poll (on the queue's clock), the first timeout has passed; the message
        # is still invisible.
        clock.advance(60)
        [other] = b.execute("SELECT * FROM dq_poll_many('q', 10, interval '1 minute')")
        assert other["key"] == "other"
        assert b.execute("SELECT * FROM dq_poll_many('q', 10, interval '1 minute')") == []

        # A token that no longer holds its message: NULL, and nothing changes.
        assert b.one("SELECT dq_ack(%s::uuid) AS ok", (other["lock_token"],))["ok"] is True
        stale = b.one("SELECT dq_extend(%s::uuid, interval '1 hour') AS until", (other["lock_token"],))
        assert stale["until"] is None
        assert message(conn, "q", "other") is None

        assert a.one("SELECT dq_ack(%s::uuid) AS ok", (d1["lock_token"],))["ok"] is True


def test_concurrent_offer_many_with_overlapping_keys_does_not_deadlock(conn, dsn):
    keys = [f"k{i:04d}" for i in range(2000)]
    args = []
    for worker in range(4):
        rnd = random.Random(worker)
        # Each process offers an overlapping 3/4 of the keys, in its own random order, with its
        # own payload (so that a key offered by two processes is an update: row locks collide).
        mine = [k for i, k in enumerate(keys) if i % 4 != worker]
        rnd.shuffle(mine)
        args.append((dsn, "q", mine, [f"w{worker}".encode()] * len(mine), T1))
    results = run_workers(offer_many_worker, args)

    created: Counter[str] = Counter()
    for (_, _, mine, _, _), result in zip(args, results, strict=True):
        assert [k for k, _ in result] == mine, "outcomes come back in input order"
        assert {o for _, o in result} <= {"created", "updated"}
        created.update(k for k, o in result if o == "created")
    assert set(created) == set(keys)
    assert set(created.values()) == {1}, "exactly one 'created' per key"

    rows = conn.execute("SELECT key, count(*) FROM dq_messages GROUP BY key").fetchall()
    assert sorted(k for k, _ in rows) == keys
    assert {c for _, c in rows} == {1}
