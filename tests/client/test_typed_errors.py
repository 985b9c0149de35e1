"""Errors reaching Python typed: a server error becomes the pyqueue exception of its SQLSTATE (also a
ValueError or a PermissionError), a call without the grant raises InsufficientPrivilege, and a
payload that cannot be decoded raises PayloadDecodeError (UnknownPayloadType for an unknown
payload_type) while the message stays acknowledgeable."""

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
