"""Redrive and re-offers in a dead-letter queue: an offer with a dead letter's key is a separate
ordinary message and stays behind; a redrive skips the dead letters a consumer holds, takes those
whose lock expired, and moves at most ``max_count``, oldest first."""

from __future__ import annotations

from typing import Any

import psycopg
from sqlhelpers import message_count, poll_token, value_of, wait_until_server_time


def kill_jobs(conn: psycopg.Connection[Any], *keys: str) -> None:
    """Queue 'jobs' (max_deliveries 1 -> 'jobs.dead'): offer ``keys``, deliver each once, nack: dead."""
    conn.execute("SELECT dq_configure_queue('jobs', 1, 'jobs.dead')")
    for key in keys:
        conn.execute("SELECT dq_offer('jobs', %s, %s::text)", (key, f"payload of {key}"))
        assert value_of(conn, "SELECT dq_nack(%s, interval '0', 'boom')", (poll_token(conn, "jobs"),)) is True
    assert message_count(conn, "jobs") == 0 and message_count(conn, "jobs.dead") == len(keys)


def test_offer_into_the_dlq_with_a_dead_letters_key_is_a_separate_ordinary_message(conn) -> None:
    kill_jobs(conn, "k")
    assert value_of(conn, "SELECT dq_offer('jobs.dead', 'k', 'fresh'::text)") == "created"
    assert value_of(conn, "SELECT dq_offer('jobs.dead', 'k', 'fresher'::text)") == "updated"
    rows = conn.execute(
        "SELECT convert_from(payload, 'UTF8'), dead_from, last_error, last_error_at IS NULL FROM dq_messages"
        " WHERE queue = 'jobs.dead' AND key = 'k' ORDER BY dead_from NULLS FIRST"
    ).fetchall()
    assert rows == [("fresher", None, None, True), ("payload of k", "jobs", "boom", False)]
    assert value_of(conn, "SELECT dq_redrive('jobs.dead')") == 1  # only the dead letter goes back
    back = conn.execute("SELECT convert_from(payload, 'UTF8'), dead_from FROM dq_messages WHERE queue = 'jobs'")
    assert back.fetchall() == [("payload of k", None)]
    left = conn.execute("SELECT convert_from(payload, 'UTF8'), dead_from FROM dq_messages WHERE queue = 'jobs.dead'")
    assert left.fetchall() == [("fresher", None)]


def test_redrive_skips_dead_letters_in_flight(dsn: str, conn) -> None:
    kill_jobs(conn, "a", "b")
    with psycopg.connect(dsn, autocommit=True) as consumer:
        held, token = consumer.execute(
            "SELECT key, lock_token FROM dq_poll_many('jobs.dead', 1, interval '1 hour')"
        ).fetchone()
        other = "b" if held == "a" else "a"
        assert value_of(conn, "SELECT dq_redrive('jobs.dead')") == 1
        assert conn.execute("SELECT key FROM dq_messages WHERE queue = 'jobs'").fetchall() == [(other,)]
        assert value_of(consumer, "SELECT dq_ack(%s)", (token,)) is True
    assert message_count(conn, "jobs", held) == 0 and message_count(conn, "jobs.dead") == 0
    assert value_of(conn, "SELECT dq_redrive('jobs.dead')") == 0


def test_redrive_takes_a_dead_letter_whose_lock_expired(conn) -> None:
    kill_jobs(conn, "a", "b")
    held = conn.execute("SELECT key, locked_until FROM dq_poll_many('jobs.dead', 1, interval '1 hour')").fetchone()
    expired = conn.execute("SELECT key, locked_until FROM dq_poll_many('jobs.dead', 1, interval '50 ms')").fetchone()
    wait_until_server_time(conn, expired[1])
    assert value_of(conn, "SELECT dq_redrive('jobs.dead')") == 1
    assert conn.execute("SELECT key FROM dq_messages WHERE queue = 'jobs'").fetchall() == [(expired[0],)]
    assert conn.execute("SELECT key FROM dq_messages WHERE queue = 'jobs.dead'").fetchall() == [(held[0],)]


def test_redrive_moves_at_most_max_count_oldest_first(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT * FROM dq_configure_queue('src', max_deliveries => 1, dead_letter_queue => 'dlq')")
    for i in range(5):
        conn.execute("SELECT dq_offer('src', %s, 'x')", (f"m{i}",))
        (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('src', 1, '1 minute')").fetchone()
        conn.execute("SELECT dq_nack(%s)", (token,))  # dead at once: max_deliveries 1
    dead = [r[0] for r in conn.execute("SELECT key FROM dq_dead_letters('dlq')")]
    assert dead == [f"m{i}" for i in range(5)]
    assert conn.execute("SELECT dq_redrive('dlq', 2)").fetchone() == (2,)
    assert [r[0] for r in conn.execute("SELECT key FROM dq_dead_letters('dlq')")] == dead[2:]
    assert sorted(r[0] for r in conn.execute("SELECT key FROM dq_messages WHERE queue = 'src'")) == dead[:2]
    assert conn.execute("SELECT dq_redrive('dlq', 100000)").fetchone() == (3,)
    assert conn.execute("SELECT count(*) FROM dq_dead_letters('dlq')").fetchone() == (0,)
