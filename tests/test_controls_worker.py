"""Workers do not busy-poll a queue whose due messages they may not take: paused, at its
concurrency limit, out of rate tokens, or with every FIFO group held by a message in flight.

A real worker process (`pyqueue worker`, threads or asyncio) runs for 10 s with idle_check 5 s on
a queue that has due messages in one of those states; the server counts its calls
(track_functions on the worker's own sessions, reported when they end). It must stay within the
idle budget of an empty queue (dq_poll_or_wait about once per idle_check, at most 8 statements
per 10 s) and deliver nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

TESTS = Path(__file__).resolve().parent

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

    worker_dsn = dsn + " options='-c track_functions=all'"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyqueue", "worker", "--dsn", worker_dsn, "--queue", "jobs",
         *(["--async"] if mode == "async" else []), "--idle-check", "5", "workerhandlers:record"],
        cwd=TESTS, env=dict(os.environ, DQ_DSN=dsn), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    time.sleep(10)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    time.sleep(1.5)  # the sessions' statistics are reported as they close
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        calls = dict(conn.execute(
            "SELECT funcname, calls FROM pg_stat_user_functions WHERE funcname LIKE 'dq%'").fetchall())
        assert conn.execute("SELECT count(*) FROM handled").fetchone() == (0,), "a held-back message was delivered"
        assert conn.execute("SELECT count(*) FROM dq_messages WHERE lock_token IS NOT NULL").fetchone() == (in_flight,)
    # Calls made by the worker's sessions only: the setup above ran without track_functions.
    assert 2 <= calls.get("dq_poll_or_wait", 0) <= 3, calls  # at 0 s and 5 s (and at 10 s if the timer won)
    assert calls.get("dq_channel") == 1, calls
    top_level = {"dq_ack", "dq_nack", "dq_extend", "dq_offer", "dq_get", "dq_next_due", "dq_wait_done"}
    assert not top_level & set(calls), calls
