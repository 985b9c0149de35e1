"""dq_cancel_waiting: deletes a message with its key unless a consumer holds it, against the real server;
the race with a poll in an open transaction on a second connection; dq_cancel (its twin through
dq__cancel) still deletes a held message."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import errors


def one(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def count(conn: psycopg.Connection[Any], key: str) -> int:
    return int(one(conn, "SELECT count(*) FROM dq_messages WHERE queue = 'q' AND key = %s", key))


def test_waiting_absent_held_and_expired(conn: psycopg.Connection[Any]) -> None:
    assert one(conn, "SELECT dq_cancel_waiting('q', 'never')") == "absent"
    conn.execute("SELECT dq_offer('q', 'later', 'x'::bytea, now() + interval '1 hour')")
    assert one(conn, "SELECT dq_cancel_waiting('q', 'later')") == "cancelled"
    assert count(conn, "later") == 0
    conn.execute("SELECT dq_offer('q', 'held', 'x'::bytea, now())")
    token = one(conn, "SELECT lock_token FROM dq_poll_many('q', 1, interval '1 hour')")
    assert one(conn, "SELECT dq_cancel_waiting('q', 'held')") == "in_flight"
    assert count(conn, "held") == 1
    assert one(conn, "SELECT dq_ack(%s)", token) is True  # its holder still settles it
    conn.execute("SELECT dq_offer('q', 'expired', 'x'::bytea, now())")
    one(conn, "SELECT lock_token FROM dq_poll_many('q', 1, interval '20 milliseconds')")
    time.sleep(0.1)  # the lock expires on the database clock: its consumer is taken for dead
    assert one(conn, "SELECT dq_cancel_waiting('q', 'expired')") == "cancelled"


def test_dq_cancel_still_deletes_a_held_message(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_offer('q', 'held', 'x'::bytea, now())")
    token = one(conn, "SELECT lock_token FROM dq_poll_many('q', 1, interval '1 hour')")
    assert one(conn, "SELECT dq_cancel('q', 'held')") is True
    assert one(conn, "SELECT dq_ack(%s)", token) is False
    assert one(conn, "SELECT dq_cancel('q', 'held')") is False


def test_a_poll_in_an_open_transaction_is_waited_for_and_wins(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_offer('q', 'k', 'x'::bytea, now())")
    outcome: list[str] = []
    with psycopg.connect(dsn) as poller:
        assert poller.execute("SELECT key FROM dq_poll_many('q', 1, interval '1 hour')").fetchall() == [("k",)]

        def cancel() -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                outcome.append(one(c, "SELECT dq_cancel_waiting('q', 'k')"))

        thread = threading.Thread(target=cancel)
        thread.start()
        deadline = time.monotonic() + 10
        while not one(conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND query LIKE '%%dq_cancel_waiting%%'"):
            assert time.monotonic() < deadline, "the cancel did not wait for the poll's transaction"
            time.sleep(0.02)
        assert outcome == []
        poller.commit()  # the poll's lock is now visible: the cancel sees a held message
        thread.join(10)
    assert outcome == ["in_flight"] and count(conn, "k") == 1


def test_a_cancel_in_an_open_transaction_keeps_polls_off(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_offer('q', 'k', 'x'::bytea, now())")
    with psycopg.connect(dsn) as canceller:
        assert one(canceller, "SELECT dq_cancel_waiting('q', 'k')") == "cancelled"
        assert conn.execute("SELECT key FROM dq_poll_many('q', 1, interval '1 hour')").fetchall() == []
        canceller.rollback()
    assert conn.execute("SELECT key FROM dq_poll_many('q', 1, interval '1 hour')").fetchall() == [("k",)]


@pytest.mark.parametrize(("call", "sqlstate", "text"), [
    ("SELECT dq_cancel_waiting(NULL, 'k')", "22004", "dq_cancel_waiting: queue must not be NULL"),
    ("SELECT dq_cancel_waiting('q', '')", "22023", "dq_cancel_waiting: key must not be empty"),
    ("SELECT dq_cancel_waiting('q', repeat('k', 201))", "22001",
     "dq_cancel_waiting: key is 201 characters, the limit is 200"),
])
def test_bad_input(conn: psycopg.Connection[Any], call: str, sqlstate: str, text: str) -> None:
    with pytest.raises(errors.Error) as caught:
        conn.execute(call)  # type: ignore[arg-type]
    assert caught.value.sqlstate == sqlstate and text in str(caught.value)
