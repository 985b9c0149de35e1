"""dq_release: a consumer gives back deliveries whose handling never started (a stopping worker's
messages polled ahead). They are due again at once, at their place (the due time they were claimed
at), and the delivery is not counted: a message at its queue's max_deliveries is delivered again,
not dead-lettered for a delivery that never reached a handler. Through SQL, racing an ack of the
same token on real connections, and through both Python clients (the ``q`` fixture)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from sqlhelpers import wait_for_lock_wait

from pyqueue import DelayedQueue, InvalidArgument

RELEASE = "SELECT dq_release(%s::uuid[])"


def poll_tokens(conn: psycopg.Connection[Any], queue: str, count: int = 1) -> list[Any]:
    rows = conn.execute("SELECT lock_token FROM dq_poll_many(%s, %s, interval '1 hour')", (queue, count)).fetchall()
    return [r[0] for r in rows]


def release(conn: psycopg.Connection[Any], tokens: list[Any]) -> int:
    row = conn.execute(RELEASE, (tokens,)).fetchone()
    assert row is not None
    return int(row[0])


def test_released_messages_are_due_again_at_their_place_uncounted(conn) -> None:
    conn.execute("SELECT dq_offer('q', 'a', 'x'::text, now() - interval '2 minutes')")
    conn.execute("SELECT dq_offer('q', 'b', 'x'::text, now() - interval '1 minute')")
    before = conn.execute("SELECT key, scheduled_at FROM dq_messages ORDER BY key").fetchall()
    tokens = poll_tokens(conn, "q", 2)
    assert len(tokens) == 2
    assert release(conn, tokens) == 2
    after = conn.execute("SELECT key, scheduled_at FROM dq_messages ORDER BY key").fetchall()
    assert after == before  # due at the time they were claimed at: the same order as before the poll
    assert conn.execute("SELECT count(*) FROM dq_messages WHERE lock_token IS NULL AND delivery_count = 0"
                        ).fetchone() == (2,)
    # deliverable at once, in their order
    assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('q', 2, interval '1 hour')")] == ["a", "b"]


def test_a_stale_token_releases_nothing(conn) -> None:
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now())")
    (token,) = poll_tokens(conn, "q")
    assert conn.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)
    assert release(conn, [token]) == 0
    assert release(conn, []) == 0
    assert conn.execute("SELECT count(*) FROM dq_messages").fetchone() == (0,)


def test_a_message_at_max_deliveries_is_delivered_again_not_dead_lettered(conn) -> None:
    conn.execute("SELECT dq_configure_queue('q', max_deliveries => 1, dead_letter_queue => 'q.dead')")
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now())")
    assert release(conn, poll_tokens(conn, "q")) == 1
    (token,) = poll_tokens(conn, "q")  # a poll would dead-letter a message whose delivery count is spent
    assert conn.execute("SELECT queue, delivery_count FROM dq_messages WHERE lock_token = %s", (token,)
                        ).fetchone() == ("q", 1)


def test_a_redelivered_message_keeps_its_earlier_deliveries(conn) -> None:
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now())")
    (token,) = poll_tokens(conn, "q")
    conn.execute("SELECT dq_nack(%s, interval '0', 'boom')", (token,))
    assert release(conn, poll_tokens(conn, "q")) == 1
    assert conn.execute("SELECT delivery_count, last_error FROM dq_messages").fetchone() == (1, "boom")


def test_a_released_group_head_stays_first_and_its_group_is_due_again(conn) -> None:
    conn.execute("SELECT dq_offer('q', 'k1', 'x'::text, now() - interval '1 minute', message_group => 'g')")
    conn.execute("SELECT dq_offer('q', 'k2', 'x'::text, now() - interval '1 minute', message_group => 'g')")
    (token,) = poll_tokens(conn, "q", 5)  # one message of a group at a time
    assert release(conn, [token]) == 1
    assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('q', 5, interval '1 hour')")] == ["k1"]


def test_a_released_slot_of_a_limited_queue_is_free_again(conn) -> None:
    conn.execute("SELECT dq_configure_queue('q', max_in_flight => 1)")
    conn.execute("SELECT dq_offer('q', 'k1', 'x'::text, now() - interval '1 minute')")
    conn.execute("SELECT dq_offer('q', 'k2', 'x'::text, now())")
    (token,) = poll_tokens(conn, "q", 5)
    assert poll_tokens(conn, "q", 5) == []  # the one slot is taken
    assert release(conn, [token]) == 1
    assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('q', 5, interval '1 hour')")] == ["k1"]


def test_tokens_of_two_queues_in_one_call(conn) -> None:
    conn.execute("SELECT dq_offer('q1', 'k', 'x'::text, now())")
    conn.execute("SELECT dq_offer('q2', 'k', 'x'::text, now())")
    assert release(conn, poll_tokens(conn, "q1") + poll_tokens(conn, "q2")) == 2
    assert conn.execute("SELECT count(*) FROM dq_messages WHERE lock_token IS NULL").fetchone() == (2,)


def test_null_is_refused_and_changes_nothing(conn) -> None:
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="lock_tokens"):
        release(conn, None)  # type: ignore[arg-type]


def test_release_waits_for_a_concurrent_ack_and_then_finds_nothing(dsn: str, conn) -> None:
    """An ack holding the row (its transaction open) and a release of the same token: the release
    waits for the row lock, then finds the message gone (0); nothing is released twice or lost."""
    conn.execute("SELECT dq_offer('q', 'k', 'x'::text, now())")
    (token,) = poll_tokens(conn, "q")
    with psycopg.connect(dsn) as acker, psycopg.connect(dsn, autocommit=True) as releaser:
        assert acker.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(release(releaser, [token])))
        t.start()
        wait_for_lock_wait(conn, "dq_release")
        acker.commit()
        t.join(timeout=30)
    assert result == [0]
    assert conn.execute("SELECT count(*) FROM dq_messages").fetchone() == (0,)


def test_the_clients_release_messages_and_tokens(q: DelayedQueue) -> None:
    q.offer_many([("a", 1), ("b", 2), ("c", 3)])
    messages = q.poll(3)
    assert len(messages) == 3
    assert q.release_many(messages[:2]) == 2
    assert q.release_many([messages[2].lock_token]) == 1
    assert q.release_many(messages) == 0  # released already: stale tokens
    assert sorted(m.key for m in q.poll(3)) == ["a", "b", "c"]
    with pytest.raises(InvalidArgument):
        q.release_many(["not a token"])  # type: ignore[list-item]
