"""Dead-letter queues: dead letters that never replace each other (one key dying in two queues, or
twice in one), each sent back to its own source; a dead letter starts with a fresh delivery count
and keeps its old one; no cycle of dead-letter queues can be configured, not even by two concurrent
configurations; and offers, dead letters and redrives keep one order in an ICU database.

Real server, no mocks: races use separate connections."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlhelpers import row_of

from pyqueue import testing
from pyqueue.migrate import migrate


def poll_tokens(conn: psycopg.Connection[Any], queue: str, n: int = 1, lock: str = "1 hour") -> list[uuid.UUID]:
    return [r[0] for r in conn.execute("SELECT lock_token FROM dq_poll_many(%s, %s, %s::interval)", (queue, n, lock))]


def offer_and_kill(conn: psycopg.Connection[Any], queue: str, key: str, payload: str, error: str) -> None:
    """Offer (queue, key) due now and nack it once: with max_deliveries 1 it is dead at once."""
    conn.execute("SELECT dq_offer(%s, %s, %s::text::bytea)", (queue, key, payload))
    (token,) = poll_tokens(conn, queue)
    assert row_of(conn, "SELECT dq_nack(%s, '0', %s)", (token, error)) == (True,)


def dead_letters(conn: psycopg.Connection[Any], queue: str, key: str) -> list[tuple[Any, ...]]:
    """(dead_from, payload, last_error) of every row with this key in queue, oldest death first."""
    return [
        (r[0], bytes(r[1]), r[2])
        for r in conn.execute(
            "SELECT dead_from, payload, last_error FROM dq_messages WHERE queue = %s AND key = %s "
            "ORDER BY dead_at, id", (queue, key))
    ]


# --------------------------------------------------------------------------- dead letters never replace each other


def test_dead_letters_from_two_queues_with_one_key_are_both_kept(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    conn.execute("SELECT dq_configure_queue('b', 1, 'dlq')")
    offer_and_kill(conn, "a", "order-8", "from a", "a failed")
    offer_and_kill(conn, "b", "order-8", "from b", "b failed")
    assert dead_letters(conn, "dlq", "order-8") == [
        ("a", b"from a", "a failed"), ("b", b"from b", "b failed")]
    assert row_of(conn, "SELECT count(*) FROM dq_messages WHERE queue IN ('a', 'b')") == (0,)


def test_a_consumer_holding_a_dead_letter_can_ack_it_after_another_one_with_its_key_died(dsn, conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    conn.execute("SELECT dq_configure_queue('b', 1, 'dlq')")
    offer_and_kill(conn, "a", "order-8", "from a", "a failed")
    with psycopg.connect(dsn, autocommit=True) as consumer:
        rows = consumer.execute("SELECT key, payload, lock_token FROM dq_poll_many('dlq', 10, '1 hour')").fetchall()
        assert [(k, bytes(p)) for k, p, _ in rows] == [("order-8", b"from a")]
        token = rows[0][2]
        offer_and_kill(conn, "b", "order-8", "from b", "b failed")  # while the consumer handles A's
        assert row_of(consumer, "SELECT dq_ack(%s::uuid)", (token,)) == (True,), "A's dead letter was replaced"
    assert dead_letters(conn, "dlq", "order-8") == [("b", b"from b", "b failed")]


def test_redrive_sends_each_dead_letter_back_to_its_own_source(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    conn.execute("SELECT dq_configure_queue('b', 1, 'dlq')")
    offer_and_kill(conn, "a", "order-8", "from a", "a failed")
    offer_and_kill(conn, "b", "order-8", "from b", "b failed")
    assert row_of(conn, "SELECT dq_redrive('dlq')") == (2,)
    got = conn.execute(
        "SELECT queue, key, payload, delivery_count, dead_from FROM dq_messages ORDER BY queue").fetchall()
    assert [(q, k, bytes(p), n, d) for q, k, p, n, d in got] == [
        ("a", "order-8", b"from a", 0, None), ("b", "order-8", b"from b", 0, None)]


def test_dying_twice_from_the_same_queue_with_the_same_key_keeps_both(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    offer_and_kill(conn, "a", "order-8", "first", "failed first")
    offer_and_kill(conn, "a", "order-8", "second", "failed second")
    assert dead_letters(conn, "dlq", "order-8") == [
        ("a", b"first", "failed first"), ("a", b"second", "failed second")]


# --------------------------------------------------------------------------- delivery count, cycles


def test_a_dead_letter_starts_with_delivery_count_0_and_keeps_its_old_count(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 3, 'dlq')")
    conn.execute("SELECT dq_offer('a', 'k', 'x')")
    for i in range(3):
        (token,) = poll_tokens(conn, "a")
        conn.execute("SELECT dq_nack(%s, '0', %s)", (token, f"failure {i + 1}"))
    assert row_of(conn, "SELECT count(*) FROM dq_messages WHERE queue = 'a'") == (0,)
    assert row_of(conn, "SELECT delivery_count FROM dq_messages WHERE queue = 'dlq' AND key = 'k'") == (0,)
    assert row_of(conn, "SELECT dead_delivery_count, dead_from, last_error FROM dq_messages "
                        "WHERE queue = 'dlq' AND key = 'k'") == (3, "a", "failure 3")


def test_a_dead_letter_queue_with_max_deliveries_2_delivers_twice_before_moving_it_on(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 3, 'dlq')")
    conn.execute("SELECT dq_configure_queue('dlq', 2, 'dlq2')")
    conn.execute("SELECT dq_offer('a', 'k', 'x')")
    for _ in range(3):  # dies in a after 3 deliveries, more than the dead-letter queue's limit
        (token,) = poll_tokens(conn, "a")
        conn.execute("SELECT dq_nack(%s, '0', 'failed in a')", (token,))
    for expected in (1, 2):
        got = conn.execute("SELECT lock_token, delivery_count FROM dq_poll_many('dlq', 10, '1 hour')").fetchall()
        assert [n for _, n in got] == [expected], "the dead letter was not delivered in its dead-letter queue"
        conn.execute("SELECT dq_nack(%s, '0', 'failed in dlq')", (got[0][0],))
    assert conn.execute("SELECT * FROM dq_poll_many('dlq', 10)").fetchall() == []
    assert row_of(conn, "SELECT dead_from, delivery_count, dead_delivery_count, last_error FROM dq_messages "
                        "WHERE queue = 'dlq2' AND key = 'k'") == ("dlq", 0, 2, "failed in dlq")


def test_configuring_a_dead_letter_cycle_is_rejected_naming_it(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 2, 'b')")
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT dq_configure_queue('b', 2, 'a')")
    assert info.value.sqlstate == "22023"
    assert "a -> b -> a" in str(info.value) or "b -> a -> b" in str(info.value), str(info.value)
    # nothing written: b has no configuration, a's is unchanged
    assert conn.execute("SELECT queue, max_deliveries, dead_letter_queue FROM dq_queues ORDER BY queue").fetchall() == [
        ("a", 2, "b")]


def test_a_longer_dead_letter_cycle_is_rejected_too(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 2, 'b')")
    conn.execute("SELECT dq_configure_queue('b', 2, 'c')")
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT dq_configure_queue('c', 2, 'a')")
    assert info.value.sqlstate == "22023"
    text = str(info.value)
    assert " -> " in text and all(f"{q} -> " in text for q in ("a", "b", "c")), text
    assert row_of(conn, "SELECT count(*) FROM dq_queues WHERE queue = 'c'") == (0,)
    conn.execute("SELECT dq_configure_queue('c', 2, 'd')")  # a chain that ends is fine


def test_two_concurrent_configurations_that_together_form_a_cycle_one_fails(dsn, conn) -> None:
    """conn1 configures a -> b in an open transaction; conn2 configures b -> a in its own
    transaction (it may block) before conn1 commits; once conn1 commits, conn2 must fail with
    22023: the two must not both commit and leave a -> b -> a."""
    first = psycopg.connect(dsn)  # explicit transactions (autocommit off)
    second = psycopg.connect(dsn)
    second_pid = second.info.backend_pid
    outcome: dict[str, Any] = {}

    def configure_b_to_a() -> None:
        try:
            second.execute("SELECT dq_configure_queue('b', 2, 'a')")
            outcome["result"] = "accepted"
        except psycopg.Error as exc:
            outcome["result"] = exc

    try:
        first.execute("SELECT dq_configure_queue('a', 2, 'b')")  # not committed yet
        thread = threading.Thread(target=configure_b_to_a, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while thread.is_alive():  # until the second statement has finished or waits on a lock
            waiting = row_of(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                             (second_pid,))
            if waiting == (1,):
                break
            assert time.monotonic() < deadline, "the second configuration neither finished nor waited on a lock"
            time.sleep(0.02)
        first.commit()
        thread.join(30)
        assert not thread.is_alive(), "the second configuration still hangs after the first committed"
        result = outcome["result"]
        if result == "accepted":
            second.commit()
        else:
            second.rollback()
        configured = conn.execute(
            "SELECT queue, dead_letter_queue FROM dq_queues ORDER BY queue").fetchall()
        assert isinstance(result, psycopg.Error), f"both configurations committed: {configured}"
        assert result.sqlstate == "22023", str(result)
        assert "a -> b -> a" in str(result) or "b -> a -> b" in str(result), str(result)
        assert configured == [("a", "b")]
    finally:
        first.close()
        second.close()


# --------------------------------------------------------------------------- an ICU database


@pytest.fixture
def icu_dsn(admin_dsn: str) -> Iterator[str]:
    """A database with an ICU (non-C) collation, installed by pyqueue.migrate; dropped after."""
    with psycopg.connect(admin_dsn, autocommit=True) as a:
        if row_of(a, "SELECT count(*) FROM pg_collation WHERE collprovider = 'i'") == (0,):
            pytest.skip("this PostgreSQL server was built without ICU (no ICU collation in pg_collation)")
        name = f"dq_icu_{uuid.uuid4().hex[:12]}"
        a.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
                          "LOCALE 'C.UTF-8'").format(sql.Identifier(name)))
    try:
        dsn = testing.with_dbname(admin_dsn, name)
        migrate(dsn)
        yield dsn
    finally:
        testing.drop_database(admin_dsn, name)


def test_icu_database_inserts_offers_dead_letters_and_redrives_in_c_order(icu_dsn: str) -> None:
    with psycopg.connect(icu_dsn, autocommit=True) as c:
        assert row_of(c, "SELECT 'a' < 'B', 'a' COLLATE \"C\" > 'B' COLLATE \"C\"") == (True, True)  # really not C
        c.execute("SELECT dq_configure_queue('q', 1, 'q.dead')")
        c.execute("SELECT * FROM dq_offer_many('q', ARRAY['a', 'B'], ARRAY['x', 'y']::bytea[])")

        def ids(queue: str) -> dict[str, int]:
            return dict(c.execute("SELECT key, id FROM dq_messages WHERE queue = %s", (queue,)).fetchall())

        assert ids("q")["B"] < ids("q")["a"], "dq_offer_many inserted in the database collation's order"
        # both delivered once in one batch, both locks expire: one poll dead-letters both together
        assert len(poll_tokens(c, "q", 2, "10 ms")) == 2
        c.execute("SELECT pg_sleep(0.05)")
        assert poll_tokens(c, "q", 10) == []
        dead = ids("q.dead")
        assert sorted(dead) == ["B", "a"] and dead["B"] < dead["a"]
        assert row_of(c, "SELECT dq_redrive('q.dead')") == (2,)
        back = ids("q")
        assert sorted(back) == ["B", "a"] and back["B"] < back["a"]
