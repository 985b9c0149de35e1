"""The delivery controls through the Python binding, against a real server: each offer parameter
(priority, group, expires_at / ttl, headers) round-trips to the delivered Message and to get();
bad input raises the typed exception with its SQLSTATE and writes nothing; pause, resume and the
concurrency and rate limits of configure(); the ``pyqueue queue`` commands; and workers on a
paused queue, which must sleep (not poll) until resume() wakes them. Every test taking ``q`` runs
against the sync :class:`DelayedQueue` and against :class:`pyqueue.aio.AsyncDelayedQueue`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pyqueue
from pyqueue import DelayedQueue, OfferOutcome, OfferRequest, Worker, limits
from pyqueue.aio import AsyncDelayedQueue, AsyncMessage, AsyncWorker


def db_now(conn: psycopg.Connection) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]


def count(conn: psycopg.Connection, queue: str = "emails") -> int:
    return conn.execute("SELECT count(*) FROM dq_messages WHERE queue = %s", (queue,)).fetchone()[0]


def queue_settings(conn: psycopg.Connection, queue: str = "emails") -> tuple[Any, ...] | None:
    return conn.execute("SELECT max_in_flight, rate_limit, rate_period, paused FROM dq_queues WHERE queue = %s",
                        (queue,)).fetchone()


# -- each parameter round-trips ---------------------------------------------------------------------

def test_each_control_round_trips_to_the_delivery_and_get(q: DelayedQueue, conn) -> None:
    at = db_now(conn) - timedelta(seconds=1)
    expires = at + timedelta(hours=1)
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "n": [1, 2]}
    assert q.offer("hi", "x", at=at, priority=5, group="g1", expires_at=expires, headers=headers) \
        is OfferOutcome.CREATED
    assert q.offer("plain", "y", at=at) is OfferOutcome.CREATED
    # the same values again change nothing; a change of any control is a difference (replaced)
    assert q.offer("hi", "x", at=at, priority=5, group="g1", expires_at=expires, headers=headers) \
        is OfferOutcome.IGNORED
    for change in ({"priority": 6}, {"group": "g2"}, {"expires_at": expires + timedelta(seconds=1)},
                   {"headers": {"other": True}}):
        values = {"priority": 5, "group": "g1", "expires_at": expires, "headers": headers, **change}
        assert q.offer("hi", "x", at=at, **values) is OfferOutcome.UPDATED, change
        stored = q.get("hi")
        assert (stored.priority, stored.group, stored.expires_at, stored.headers) == (
            values["priority"], values["group"], values["expires_at"], values["headers"]), change
    assert q.offer("hi", "x", at=at, priority=5, group="g1", expires_at=expires, headers=headers) \
        is OfferOutcome.UPDATED

    plain = q.get("plain")
    assert (plain.priority, plain.group, plain.expires_at, plain.headers) == (0, None, None, None)

    before = db_now(conn)
    (hi,), (low,) = q.poll(1), q.poll(1)  # the higher priority first, both due at the same time
    assert (hi.key, low.key) == ("hi", "plain")
    assert (hi.priority, hi.group, hi.expires_at, hi.headers) == (5, "g1", expires, headers)
    assert (low.priority, low.group, low.expires_at, low.headers) == (0, None, None, None)
    for m in (hi, low):
        assert m.claimed_at is not None and before <= m.claimed_at < m.locked_until
    assert hi.ack() and low.ack()


def test_ttl_counts_from_the_delivery_time_on_the_database_clock(q: DelayedQueue, conn) -> None:
    """expires_at = the message's scheduled_at + ttl, whichever way the time was given (an instant,
    a delay, or none: the database's now), for offer and offer_many alike."""
    at = db_now(conn) + timedelta(hours=2)
    q.offer("at", "x", at=at, ttl=timedelta(minutes=5))
    q.offer("delay", "x", delay=timedelta(minutes=1), ttl=30)
    q.offer("now", "x", ttl=timedelta(seconds=10))
    q.offer_many([OfferRequest("m-at", "x", at=at, ttl=timedelta(minutes=5)),
                  OfferRequest("m-delay", "x", delay=60, ttl=timedelta(seconds=30)),
                  OfferRequest("m-now", "x", ttl=10),
                  OfferRequest("m-none", "x", at=at),
                  ("m-pair", "x")])
    expected = {"at": timedelta(minutes=5), "delay": timedelta(seconds=30), "now": timedelta(seconds=10)}
    for key, ttl in expected.items():
        for k in (key, f"m-{key}"):
            m = q.get(k)
            assert m.expires_at - m.scheduled_at == ttl, k
    assert q.get("at").expires_at == q.get("m-at").expires_at == at + timedelta(minutes=5)
    assert q.get("m-none").expires_at is None and q.get("m-pair").expires_at is None


def test_offer_many_takes_each_items_controls(q: DelayedQueue, conn) -> None:
    at = db_now(conn) - timedelta(seconds=1)
    expires = at + timedelta(days=1)
    got = q.offer_many([
        OfferRequest("a", 1, at=at, priority=-3, group="g", headers={"h": "a"}),
        ("b", 2),
        OfferRequest("c", 3, at=at, group="g", expires_at=expires),
        OfferRequest("d", 4, priority=limits.PRIORITY_MAX),
    ])
    assert got == dict.fromkeys("abcd", OfferOutcome.CREATED)
    rows = {k: q.get(k) for k in "abcd"}
    assert {k: (m.priority, m.group, m.expires_at, m.headers) for k, m in rows.items()} == {
        "a": (-3, "g", None, {"h": "a"}), "b": (0, None, None, None), "c": (0, "g", expires, None),
        "d": (limits.PRIORITY_MAX, None, None, None)}
    # an item with controls and one without, again: the controls decide the outcome
    again = q.offer_many([OfferRequest("a", 1, at=at, priority=-3, group="g", headers={"h": "a"}),
                          OfferRequest("c", 3, at=at, group="g", expires_at=expires, priority=1)])
    assert again == {"a": OfferOutcome.IGNORED, "c": OfferOutcome.UPDATED}
    # one message of group g at a time: a first, c waits behind it
    polled = {m.key: m for m in q.poll(10)}
    assert sorted(polled) == ["a", "b", "d"]
    assert polled["a"].headers == {"h": "a"} and polled["d"].priority == limits.PRIORITY_MAX
    assert q.poll(10) == []
    assert polled["a"].ack()
    (c,) = q.poll(10)
    assert (c.key, c.group, c.priority, c.expires_at) == ("c", "g", 1, expires)


# -- bad input: the typed exception with the SQLSTATE, nothing written -------------------------------

FAR = timedelta(hours=1)
#: (id, offer keyword arguments (the delivery time is now + 1 h unless given), exception, SQLSTATE,
#:  text the message must contain)
BAD_INPUT: list[tuple[str, dict[str, Any], type[pyqueue.PyQueueError], str, str]] = [
    ("priority above", {"priority": limits.PRIORITY_MAX + 1}, pyqueue.InvalidArgument, "22023", "priority"),
    ("priority below", {"priority": limits.PRIORITY_MIN - 1}, pyqueue.InvalidArgument, "22023", "priority"),
    ("priority beyond int4", {"priority": 2**40}, pyqueue.InvalidArgument, "22023", "priority"),
    ("priority not an int", {"priority": "1"}, pyqueue.InvalidArgument, "22023", "priority"),
    ("group too long", {"group": "g" * (limits.GROUP_CHARS + 1)}, pyqueue.ValueTooLong, "22001", "group"),
    ("group empty", {"group": ""}, pyqueue.InvalidArgument, "22023", "group"),
    ("headers a list", {"headers": [1, 2]}, pyqueue.InvalidArgument, "22023", "headers"),
    ("headers a string", {"headers": "trace"}, pyqueue.InvalidArgument, "22023", "headers"),
    ("headers too big", {"headers": {"a": "x" * limits.HEADERS_BYTES}}, pyqueue.LimitExceeded, "54000", "headers"),
    ("expires before due", {"expires_at": "due - 1s"}, pyqueue.InvalidArgument, "22023", "expires_at"),
    ("expires at due", {"expires_at": "due"}, pyqueue.InvalidArgument, "22023", "expires_at"),
    ("expires out of range", {"expires_at": datetime(9999, 12, 31, tzinfo=UTC)}, pyqueue.DatetimeOutOfRange,
     "22008", "expires_at"),
    ("expires naive", {"expires_at": datetime(2100, 1, 1)}, pyqueue.InvalidArgument, "22023", "expires_at"),
    ("ttl and expires_at", {"ttl": 60, "expires_at": "due + 1h"}, pyqueue.InvalidArgument, "22023",
     "expires_at or ttl"),
    ("ttl zero", {"ttl": 0}, pyqueue.InvalidArgument, "22023", "ttl"),
    ("ttl negative", {"ttl": timedelta(seconds=-1)}, pyqueue.InvalidArgument, "22023", "ttl"),
]


def resolve_times(kwargs: dict[str, Any], due: datetime) -> dict[str, Any]:
    """The case's arguments with the relative times ("due", "due - 1s", "due + 1h") made instants."""
    relative = {"due": due, "due - 1s": due - timedelta(seconds=1), "due + 1h": due + FAR}
    return {k: relative.get(v, v) if isinstance(v, str) and v.startswith("due") else v for k, v in kwargs.items()}


@pytest.mark.parametrize("how", ["offer", "offer_many"])
@pytest.mark.parametrize(("kwargs", "error", "sqlstate", "names"), [c[1:] for c in BAD_INPUT],
                         ids=[c[0] for c in BAD_INPUT])
def test_bad_controls_raise_the_typed_error_and_write_nothing(
    q: DelayedQueue, conn, how: str, kwargs: dict[str, Any], error: type[pyqueue.PyQueueError], sqlstate: str,
    names: str,
) -> None:
    due = db_now(conn) + FAR
    args = resolve_times(kwargs, due)
    with pytest.raises(error) as info:
        if how == "offer":
            q.offer("bad", "x", at=due, **args)
        else:  # after a good item: nothing of the call is written
            q.offer_many([OfferRequest("good", "x", at=due), OfferRequest("bad", "x", at=due, **args)])
    assert info.value.sqlstate == sqlstate
    assert isinstance(info.value, pyqueue.InvalidArgument)
    assert names in str(info.value), str(info.value)  # the parameter (offer_many: the array element)
    assert count(conn) == 0


# -- pause, resume, configure ----------------------------------------------------------------------

def test_pause_stops_deliveries_and_resume_restarts_them(q: DelayedQueue, conn) -> None:
    q.offer_many([("held", 1), ("other", 2)])
    (held,) = q.poll(1)
    assert q.pause() is True
    assert q.pause() is False  # already paused
    assert queue_settings(conn)[3] is True and q.stats().paused is True
    assert q.poll(10) == []
    assert q.poll(10, wait=0.3) == []
    # offers, extends, nacks and acks keep working while paused
    assert q.offer("new", 3) is OfferOutcome.CREATED
    assert held.extend(60) is not None
    assert held.nack(0)
    assert q.poll(10) == []
    assert q.stats().ready == 3
    assert q.resume() is True
    assert q.resume() is False  # not paused
    assert q.stats().paused is False and queue_settings(conn)[3] is False
    got = q.poll(10)
    assert sorted(m.key for m in got) == ["held", "new", "other"]
    assert q.ack_many(got) == 3


def test_configure_sets_and_clears_the_concurrency_and_rate_limits(q: DelayedQueue, conn) -> None:
    q.offer_many([(f"k{i}", i) for i in range(6)])
    q.configure(max_in_flight=2, archive=True)  # a new parameter next to an existing one
    assert queue_settings(conn)[:3] == (2, None, None)
    assert conn.execute("SELECT archive FROM dq_queues WHERE queue = 'emails'").fetchone() == (True,)
    first = q.poll(10)
    assert len(first) == 2 and q.poll(10) == []  # at the limit: nothing more until one leaves
    assert first[0].ack()
    assert len(q.poll(10)) == 1
    q.configure(max_in_flight=0)  # 0 clears it
    assert queue_settings(conn)[0] is None
    assert len(q.poll(10)) == 3

    q.release_locks()
    q.configure(rate_limit=2, rate_period=timedelta(minutes=10))
    assert queue_settings(conn)[1:3] == (2, timedelta(minutes=10))
    assert len(q.poll(10)) == 2 and q.poll(10) == []  # the window's two deliveries are spent
    q.configure(rate_limit=3)  # the period set before stays
    assert queue_settings(conn)[1:3] == (3, timedelta(minutes=10))
    assert len(q.poll(10)) == 1 and q.poll(10) == []
    q.configure(rate_limit=0)  # 0 clears it
    assert queue_settings(conn)[1] is None
    q.release_locks()
    assert len(q.poll(10)) == 5


BAD_CONFIGURE: list[tuple[str, dict[str, Any], str]] = [
    # (id, configure keyword arguments, the parameter the error names); all InvalidArgument 22023
    ("max_in_flight negative", {"max_in_flight": -1}, "max_in_flight"),
    ("max_in_flight above", {"max_in_flight": limits.MAX_IN_FLIGHT_MAX + 1}, "max_in_flight"),
    ("rate_limit negative", {"rate_limit": -1, "rate_period": 1}, "rate_limit"),
    ("rate_limit above", {"rate_limit": limits.RATE_LIMIT_MAX + 1, "rate_period": 1}, "rate_limit"),
    ("rate_limit without a period", {"rate_limit": 5}, "rate_period"),
    ("rate_period over a day", {"rate_limit": 5, "rate_period": limits.RATE_PERIOD_MAX + timedelta(seconds=1)},
     "rate_period"),
    ("rate_period zero", {"rate_limit": 5, "rate_period": 0}, "rate_period"),
]


@pytest.mark.parametrize(("kwargs", "names"), [c[1:] for c in BAD_CONFIGURE], ids=[c[0] for c in BAD_CONFIGURE])
def test_bad_limits_raise_invalid_argument_and_change_nothing(q: DelayedQueue, conn, kwargs: dict[str, Any],
                                                              names: str) -> None:
    q.configure(max_payload_bytes=limits.PAYLOAD_BYTES_MIN)  # the queue exists, no limit set
    with pytest.raises(pyqueue.InvalidArgument) as info:
        q.configure(**kwargs)
    assert info.value.sqlstate == "22023" and names in str(info.value), str(info.value)
    assert queue_settings(conn) == (None, None, None, False)


# -- the command line -------------------------------------------------------------------------------

def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyqueue", *args, "--dsn", dsn], capture_output=True, text=True,
                          timeout=60)


def test_cli_queue_pause_resume_configure(dsn: str, conn) -> None:
    conn.execute("SELECT dq_offer('emails', 'k', 'x')")
    out = cli(dsn, "queue", "pause", "emails")
    assert (out.returncode, out.stdout.strip()) == (0, "paused"), out.stderr
    assert cli(dsn, "queue", "pause", "emails").stdout.strip() == "already paused"
    assert queue_settings(conn)[3] is True
    stats = subprocess.run([sys.executable, "-m", "pyqueue", "stats", "--dsn", dsn, "--queue", "emails"],
                           capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert stats.returncode == 0, stats.stderr
    header, row = stats.stdout.splitlines()[2], stats.stdout.splitlines()[4]
    assert "held" in header and "expired" in header and "paused" in header, stats.stdout
    assert row.split("│")[-2].strip() == "yes", stats.stdout
    out = cli(dsn, "queue", "resume", "emails")
    assert (out.returncode, out.stdout.strip()) == (0, "resumed"), out.stderr
    assert cli(dsn, "queue", "resume", "emails").stdout.strip() == "was not paused"
    assert queue_settings(conn)[3] is False

    out = cli(dsn, "queue", "configure", "emails", "--max-in-flight", "3", "--rate-limit", "10", "--rate-period", "2")
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr
    assert queue_settings(conn) == (3, 10, timedelta(seconds=2), False)
    out = cli(dsn, "queue", "configure", "emails", "--rate-period", "1m")
    assert out.returncode == 0 and queue_settings(conn) == (3, 10, timedelta(minutes=1), False), out.stderr
    out = cli(dsn, "queue", "configure", "emails", "--max-in-flight", "0", "--rate-limit", "0")
    assert out.returncode == 0 and queue_settings(conn)[:2] == (None, None), out.stderr

    bad = cli(dsn, "queue", "configure", "emails", "--max-in-flight", "-1")
    assert bad.returncode == 2 and "SQLSTATE 22023" in bad.stderr and "max_in_flight" in bad.stderr, bad.stderr
    nothing = cli(dsn, "queue", "configure", "emails")
    assert nothing.returncode == 2 and "--max-in-flight" in nothing.stderr
    assert cli(dsn, "queue", "configure", "emails", "--rate-period", "0").returncode == 2  # refused by the parser


# -- workers on a blocked queue ----------------------------------------------------------------------

#: A worker waits up to this long between checks (its idle_check, the dq_poll_or_wait max_wait):
#: only a notification can wake it sooner.
IDLE_CHECK_S = 30.0
BLOCKED_S = 4.0


def offer_a_and_b(conn: psycopg.Connection, group: str | None = None) -> None:
    for key in ("a", "b"):  # one statement each: a is due (and first in its group) before b
        conn.execute("SELECT dq_offer('emails', %s, 'x', message_group => %s)", (key, group))


def hold_one(conn: psycopg.Connection) -> Any:
    """Another consumer takes the one due message for an hour; returns its lock token."""
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('emails', 1, interval '1 hour')").fetchone()
    return token


def block(state: str, conn: psycopg.Connection) -> Any:
    """Make "a" and "b" due in the queue "emails" but not deliverable, for the reason ``state``;
    returns what :func:`unblock` needs."""
    if state == "paused":
        conn.execute("SELECT dq_pause_queue('emails')")
        offer_a_and_b(conn)
        return None
    if state == "at max_in_flight":
        conn.execute("SELECT dq_configure_queue('emails', max_in_flight => 1)")
        conn.execute("SELECT dq_offer('emails', 'h', 'x')")
        token = hold_one(conn)
        offer_a_and_b(conn)
        return token
    if state == "group held":
        conn.execute("SELECT dq_offer('emails', 'h', 'x', message_group => 'g')")
        token = hold_one(conn)
        offer_a_and_b(conn, "g")
        return token
    assert state == "no rate token"
    conn.execute("SELECT dq_configure_queue('emails', rate_limit => 1, rate_period => '1 hour')")
    conn.execute("SELECT dq_offer('emails', 'h', 'x')")
    assert conn.execute("SELECT dq_ack(%s)", (hold_one(conn),)).fetchone() == (True,)
    offer_a_and_b(conn)
    return None


def unblock(state: str, conn: psycopg.Connection, token: Any) -> None:
    """Lift the block: resume, end the delivery that holds the slot or the group, clear the rate limit."""
    if state == "paused":
        assert conn.execute("SELECT dq_resume_queue('emails')").fetchone() == (True,)
    elif state == "no rate token":
        conn.execute("SELECT dq_configure_queue('emails', rate_limit => 0)")
    else:
        assert conn.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)


def poll_calls(conn: psycopg.Connection) -> dict[str, int]:
    """Calls of the dq_* functions by sessions that have ended (track_functions)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return dict(conn.execute("SELECT funcname, calls FROM pg_stat_user_functions WHERE funcname LIKE 'dq%'"))


def run_worker_on_blocked_queue(kind: str, state: str, dsn: str, conn: psycopg.Connection) -> tuple[list[str], float]:
    """A worker of ``kind`` on a queue blocked by ``state`` for BLOCKED_S, then unblocked from
    another session; returns what it had handled before that and how long after it both "a" and
    "b" were handled (seconds; infinite if not within IDLE_CHECK_S). Its sessions track their
    function calls."""
    seen: list[str] = []
    delivered = threading.Event()

    def record(key: str) -> None:
        seen.append(key)
        if {"a", "b"} <= set(seen):
            delivered.set()

    def unblock_and_time(before: list[str]) -> float:
        before.extend(seen)
        started = time.monotonic()
        unblock(state, conn, token)
        return time.monotonic() - started if delivered.wait(IDLE_CHECK_S) else float("inf")

    token = block(state, conn)
    tracked = dsn + " options='-c track_functions=all'"
    before: list[str] = []
    if kind == "sync":
        with DelayedQueue(tracked, "emails") as q:
            worker = Worker(q, lambda m: record(m.key), concurrency=2, idle_check=IDLE_CHECK_S)
            t = threading.Thread(target=worker.run)
            t.start()
            try:
                time.sleep(BLOCKED_S)
                latency = unblock_and_time(before)
            finally:
                worker.stop()
                t.join(timeout=10)
            assert not t.is_alive()
    else:
        async def handler(message: AsyncMessage) -> None:
            record(message.key)

        async def main() -> float:
            async with AsyncDelayedQueue(tracked, "emails") as q:
                worker = AsyncWorker(q, handler, concurrency=2, idle_check=IDLE_CHECK_S)
                task = asyncio.create_task(worker.run(install_signal_handlers=False))
                try:
                    await asyncio.sleep(BLOCKED_S)
                    return await asyncio.to_thread(unblock_and_time, before)
                finally:
                    worker.stop()
                    await asyncio.wait_for(task, 10)

        latency = asyncio.run(main())
    return before, latency


@pytest.mark.parametrize("state", ["paused", "at max_in_flight", "group held", "no rate token"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_worker_on_a_blocked_queue_sleeps_and_lifting_the_block_wakes_it(kind: str, state: str, dsn: str,
                                                                        conn) -> None:
    """Due messages the queue may not deliver (paused, at its concurrency limit, its group's head
    in flight elsewhere, no rate token): the worker delivers nothing and does not poll in a loop
    (one dq_poll_or_wait, then a sleep of its full idle_check); what lifts the block (resume(),
    the other delivery's ack, clearing the rate limit) wakes it at once: both messages are handled
    within a second or two, against an idle_check of 30 s. Counted on the server as the idle
    budget test of tests/worker/test_worker.py counts: track_functions on the worker's own sessions,
    reported when they end."""
    before, latency = run_worker_on_blocked_queue(kind, state, dsn, conn)
    assert before == []
    assert latency < 2.0, latency
    time.sleep(1.5)  # the sessions' statistics are reported as they close
    calls = poll_calls(conn)
    # while blocked: one call, which slept its full max_wait; after: the call the notification
    # started, one per message made deliverable by the worker's own ack (a group, a limit of 1),
    # and the idle wait at the end; anything like a busy poll would be hundreds
    assert 2 <= calls.get("dq_poll_or_wait", 0) <= 5, calls
    assert calls.get("dq_poll_many", 0) <= 8, calls
    assert count(conn) == 0
