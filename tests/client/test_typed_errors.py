"""Surfaces a green run did not prove before: SQLSTATEs reaching Python as typed errors, a payload
that cannot be decoded, ``notify => false`` stopping wake-ups, ``dq_redrive``'s ``max_count`` cap,
and ``dq_cron_config_hash`` with a NULL argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pyqueue
from pyqueue import DelayedQueue
from pyqueue.errors import translating


@pytest.mark.parametrize(("statement", "cls", "sqlstate", "base"), [
    ("SELECT dq_offer(NULL, 'k', 'x')", pyqueue.NullValueNotAllowed, "22004", ValueError),
    ("SELECT dq_offer('q', 'k', repeat('x', 1048577))", pyqueue.LimitExceeded, "54000", ValueError),
    ("SELECT dq_offer('q', repeat('k', 201), 'x')", pyqueue.ValueTooLong, "22001", ValueError),
    ("SELECT dq_offer('q', 'k', 'x', '-infinity')", pyqueue.DatetimeOutOfRange, "22008", ValueError),
])
def test_a_server_error_becomes_its_typed_pyqueue_error(conn: psycopg.Connection[Any], statement: str,
                                                        cls: type[Exception], sqlstate: str,
                                                        base: type[Exception]) -> None:
    with pytest.raises(cls) as info, translating():
        conn.execute(statement)
    assert isinstance(info.value, base) and info.value.sqlstate == sqlstate
    assert str(info.value).startswith("dq_offer:")
    assert conn.execute("SELECT count(*) FROM dq_messages").fetchone() == (0,)  # nothing changed


def test_a_role_without_the_grant_gets_insufficient_privilege(login: Callable[[str], str]) -> None:
    with DelayedQueue(login("dq_producer"), "jobs") as q:
        q.offer("k", "x")  # granted
        with pytest.raises(pyqueue.InsufficientPrivilege) as info:
            q.poll()  # dq_consumer's
    assert info.value.sqlstate == "42501" and isinstance(info.value, PermissionError)


def test_a_payload_that_cannot_be_decoded_raises_payload_decode_error(conn: psycopg.Connection[Any], dsn: str) -> None:
    conn.execute("SELECT dq_offer('jobs', 'bad-json', convert_to('{not json', 'UTF8'), now() - interval '2 s', "
                 "true, 'json'), dq_offer('jobs', 'avro', '\\x00'::bytea, now() - interval '1 s', true, 'avro')")
    with DelayedQueue(dsn, "jobs") as q:
        bad, unknown = sorted(q.poll(max_count=2), key=lambda m: m.key)[::-1]
        assert (bad.key, unknown.key) == ("bad-json", "avro")
        with pytest.raises(pyqueue.PayloadDecodeError) as info:
            _ = bad.payload
        assert "'json'" in str(info.value) and bad.raw_payload == b"{not json"
        with pytest.raises(pyqueue.UnknownPayloadType) as unknown_info:
            _ = unknown.payload
        assert "'avro'" in str(unknown_info.value) and isinstance(unknown_info.value, pyqueue.PayloadDecodeError)
        assert unknown.raw_payload == b"\x00"
        assert q.ack(bad.lock_token) and q.ack(unknown.lock_token)  # still acknowledgeable


def _offer_wakes_a_waiter(dsn: str, conn: psycopg.Connection[Any], queue: str) -> bool:
    """A session waits on ``queue`` (``dq_wait`` registers it, LISTEN on its channel); another
    offers a message due now. Whether a notification reached the waiting session (within 3 s)."""
    with psycopg.connect(dsn, autocommit=True) as waiter:
        (channel,) = waiter.execute("SELECT dq_channel(%s)", (queue,)).fetchone()
        waiter.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        (wake_in,) = waiter.execute("SELECT dq_wait(%s, '1 minute')", (queue,)).fetchone()
        assert wake_in.total_seconds() > 30  # nothing due: it would sleep
        assert conn.execute("SELECT dq_offer(%s, 'k', 'x')", (queue,)).fetchone() == ("created",)
        return any(True for _ in waiter.notifies(timeout=3, stop_after=1))


def test_notify_false_stops_the_wake_up_of_waiting_consumers(conn: psycopg.Connection[Any], dsn: str) -> None:
    assert _offer_wakes_a_waiter(dsn, conn, "loud")  # the default: notifications on
    conn.execute("SELECT * FROM dq_configure_queue('quiet', notify => false)")
    assert not _offer_wakes_a_waiter(dsn, conn, "quiet")
    conn.execute("SELECT * FROM dq_configure_queue('quiet', notify => true)")
    conn.execute("SELECT dq_cancel('quiet', 'k')")
    assert _offer_wakes_a_waiter(dsn, conn, "quiet")


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


@pytest.mark.parametrize("null_at", range(5))
def test_cron_config_hash_is_null_when_an_argument_is_null(conn: psycopg.Connection[Any], null_at: int) -> None:
    args: list[Any] = ["q", "@daily", "UTC", b"x", "bytes"]
    (full,) = conn.execute("SELECT dq_cron_config_hash(%s, %s, %s, %s, %s)", args).fetchone()
    assert full is not None and len(full) == 16
    args[null_at] = None
    assert conn.execute("SELECT dq_cron_config_hash(%s::text, %s::text, %s::text, %s::bytea, %s::text)",
                        args).fetchone() == (None,)
