"""Workers do not busy-poll a queue whose due messages they may not take: paused, at its
concurrency limit, out of rate tokens, or with every FIFO group held by a message in flight.

A real worker process (`pyqueue worker`, threads or asyncio) with idle_check 2 s runs on a queue
that has due messages in one of those states, until its own timer has re-checked the queue three
times (seen on the server: its waiter row registered anew); the server counts its calls
(track_functions on the worker's own sessions, reported when they end). It must stay within the
idle budget of an empty queue (one dq_poll_or_wait per wake-up of its timer, at most one per
idle_check besides the first) and deliver nothing.
"""

from __future__ import annotations

import psycopg
import pytest
from workerhandlers import assert_idle_budget, idle_worker_calls

# What makes each queue's due messages undeliverable, run after ten due messages were offered.
STATES = {
    "paused": ["SELECT dq_pause_queue('jobs')"],
    "at-max_in_flight": [
        "SELECT dq_configure_queue('jobs', max_in_flight => 2)",
        "SELECT count(*) FROM dq_poll_many('jobs', 2, interval '1 hour')",
    ],
    "out-of-rate-tokens": [
        "SELECT dq_configure_queue('jobs', rate_limit => 2, rate_period => interval '1 hour')",
        "SELECT count(*) FROM dq_poll_many('jobs', 2, interval '1 hour')",
    ],
    "groups-all-held": ["SELECT count(*) FROM dq_poll_many('jobs', 10, interval '1 hour')"],  # the 3 heads
}
# The groups state offers its ten messages in three FIFO groups.
GROUPED = {"groups-all-held"}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("state", list(STATES))
def test_a_held_back_queue_costs_an_idle_worker_no_more_than_an_empty_one(dsn: str, state: str, mode: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE handled (key text, delivery_count int, phase text, pid int)")
        conn.execute("SELECT count(*) FROM dq_offer_many('jobs', ARRAY(SELECT 'k' || i FROM generate_series(0, 9) i), "
                     "array_fill('{}'::bytea, ARRAY[10]), array_fill(now() - interval '1 minute', ARRAY[10]), "
                     "message_groups => CASE WHEN %s THEN ARRAY(SELECT 'g' || (i %% 3) FROM generate_series(0, 9) i) "
                     "END)",
                     (state in GROUPED,))
        for statement in STATES[state]:
            conn.execute(statement)
        (held,) = conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'jobs' "
                               "AND scheduled_at <= now()").fetchone()
        assert held >= 7, "the queue must hold due messages the worker may not take"
        (in_flight,) = conn.execute("SELECT count(*) FROM dq_messages WHERE lock_token IS NOT NULL").fetchone()

    idle_check = 2.0
    calls, out, registrations, lifetime = idle_worker_calls(
        dsn, *(["--async"] if mode == "async" else []), idle_check=idle_check, timer_checks=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM handled").fetchone() == (0,), "a held-back message was delivered"
        assert conn.execute("SELECT count(*) FROM dq_messages WHERE lock_token IS NOT NULL").fetchone() == (in_flight,)
    # Calls made by the worker's sessions only: the setup above ran without track_functions.
    assert registrations >= 4  # the first poll and three by the timer
    assert_idle_budget(calls, registrations, lifetime, idle_check)
