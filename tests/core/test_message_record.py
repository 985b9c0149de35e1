"""What a delivery leaves in its message row and in the archive: the due time and the claim time a
poll records, the archive's ``scheduled_at`` (the due time of the delivery that ended, not the poll
plus its lock), and a re-offer with a new payload clearing the last error.

Real server, no mocks. Times are compared on the server (the assertions show booleans, never a
value of now()); a fixed due time in the past (T) stands for "a message due at T".
"""

from __future__ import annotations

import pytest
from sqlhelpers import poll_token, value_of, wait_until_server_time

T = "2020-01-01 00:00:00+00"  # the due time of the messages below: long past, so they are due


@pytest.mark.parametrize("outcome", ["acked", "cancelled", "dead"])
def test_archive_scheduled_at_is_when_the_delivery_was_due(conn, outcome: str) -> None:
    """Due at T, polled with a 1-hour lock, finished at once: the archive says T, not poll + 1 hour."""
    if outcome == "dead":
        conn.execute("SELECT dq_configure_queue('jobs', 1, 'jobs.dead', archive => true)")
    else:
        conn.execute("SELECT dq_configure_queue('jobs', archive => true)")
    conn.execute("SELECT dq_offer('jobs', 'k', 'x'::text, %s::timestamptz)", (T,))
    token = poll_token(conn, "jobs", "1 hour")
    if outcome == "acked":
        assert value_of(conn, "SELECT dq_ack(%s)", (token,)) is True
    elif outcome == "cancelled":
        assert value_of(conn, "SELECT dq_cancel('jobs', 'k')") is True
    else:
        assert value_of(conn, "SELECT dq_nack(%s, interval '0', 'boom')", (token,)) is True
    got = conn.execute(
        "SELECT outcome, delivery_count, scheduled_at = %s::timestamptz FROM dq_archive WHERE queue = 'jobs'", (T,)
    ).fetchall()
    assert got == [(outcome, 1, True)]


def test_archive_scheduled_at_is_the_due_time_of_the_last_delivery(conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', archive => true)")
    conn.execute("SELECT dq_offer('jobs', 'k', 'x'::text, %s::timestamptz)", (T,))
    assert value_of(conn, "SELECT dq_nack(%s, interval '0')", (poll_token(conn, "jobs"),)) is True
    second_due = value_of(conn, "SELECT scheduled_at FROM dq_messages WHERE queue = 'jobs' AND key = 'k'")
    wait_until_server_time(conn, second_due)
    rows = conn.execute(
        "SELECT lock_token, scheduled_at = %s FROM dq_poll_many('jobs', 1, interval '1 hour')", (second_due,)
    ).fetchall()
    assert [r[1] for r in rows] == [True]
    assert value_of(conn, "SELECT dq_ack(%s)", (rows[0][0],)) is True
    got = conn.execute(
        "SELECT delivery_count, scheduled_at = %s, scheduled_at_initially = %s::timestamptz FROM dq_archive",
        (second_due, T),
    ).fetchall()
    assert got == [(2, True, True)]


def test_poll_records_due_at_and_claimed_at(conn) -> None:
    conn.execute("SELECT dq_offer('jobs', 'k', 'x'::text, %s::timestamptz)", (T,))
    before = value_of(conn, "SELECT clock_timestamp()")
    poll_token(conn, "jobs", "1 hour")
    after = value_of(conn, "SELECT clock_timestamp()")
    got = conn.execute(
        "SELECT due_at = %s::timestamptz, claimed_at BETWEEN %s AND %s FROM dq_messages WHERE key = 'k'",
        (T, before, after),
    ).fetchall()
    assert got == [(True, True)]


REOFFER = {
    "dq_offer": "SELECT dq_offer('jobs', 'k', %(p)s::text, %(t)s::timestamptz)",
    "dq_offer_many": "SELECT outcome FROM dq_offer_many('jobs', ARRAY['k'], ARRAY[convert_to(%(p)s, 'UTF8')],"
    " ARRAY[%(t)s::timestamptz], payload_types => ARRAY['text'])",
}


@pytest.mark.parametrize("function", list(REOFFER))
def test_reoffer_with_a_changed_payload_clears_last_error(conn, function: str) -> None:
    conn.execute("SELECT dq_offer('jobs', 'k', 'a'::text, %s::timestamptz)", (T,))
    assert value_of(conn, "SELECT dq_nack(%s, interval '0', 'boom')", (poll_token(conn, "jobs"),)) is True
    state = "SELECT last_error, last_error_at IS NULL FROM dq_messages WHERE queue = 'jobs' AND key = 'k'"
    assert conn.execute(state).fetchall() == [("boom", False)]
    assert value_of(conn, REOFFER[function], {"p": "a", "t": T}) == "ignored"  # unchanged: nothing happens
    assert conn.execute(state).fetchall() == [("boom", False)]
    assert value_of(conn, REOFFER[function], {"p": "b", "t": T}) == "updated"
    assert conn.execute(state).fetchall() == [(None, True)]
