"""Client-side mistakes raise :class:`pyqueue.InvalidArgument` naming the parameter and what was
expected, before any SQL is sent: every call below runs on a queue whose pool was never opened, so
any I/O would fail with ``PoolClosed`` instead. Each case runs against :class:`pyqueue.DelayedQueue`
and :class:`pyqueue.aio.AsyncDelayedQueue` (through the blocking view of ``tests/support/blocking.py``);
the checks are the shared ones of :mod:`pyqueue.core.checks`. Durations read as people write them."""

from __future__ import annotations

import re
import warnings
from datetime import timedelta
from uuid import uuid4

import pytest
from blocking import Blocking, EventLoopThread
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import pyqueue
from pyqueue import DelayedQueue, OfferRequest
from pyqueue.aio import AsyncDelayedQueue

DSN = "host=127.0.0.1 port=1 dbname=none connect_timeout=1"  # never connected to: the pools stay closed


@pytest.fixture(params=["sync", "async"])
def closed(request):
    """A queue over a pool that was never opened: any statement would raise PoolClosed."""
    if request.param == "sync":
        pool = ConnectionPool(DSN, open=False)
        yield DelayedQueue(pool, "emails")
        return
    runner = EventLoopThread()
    try:
        yield Blocking(AsyncDelayedQueue(AsyncConnectionPool(DSN, open=False), "emails"), runner)
    finally:
        runner.close()


TOKEN = uuid4()

# (call, the text the error must contain): the parameter's name and what was expected.
CASES = [
    (lambda q: q.offer(42, "x"), "key must be a str, got int 42"),
    (lambda q: q.offer(None, "x"), "key must be a str, got NoneType None"),
    (lambda q: q.offer("k", "x", delay="5"), "delay must be a timedelta or a number of seconds, got str '5'"),
    (lambda q: q.offer("k", "x", delay=-5), "delay is -5 s, it must be non-negative"),
    (lambda q: q.offer("k", "x", delay=timedelta(seconds=-5)), "delay is -5 s, it must be non-negative"),
    (lambda q: q.offer("k", "x", delay=float("nan")), "delay must be a timedelta or a number of seconds"),
    (lambda q: q.offer("k", "x", delay=True), "delay must be a timedelta or a number of seconds, got bool True"),
    (lambda q: q.offer("k", "x", at="2030-01-01"), "at must be a timezone-aware datetime or None, got str"),
    (lambda q: q.offer("k", "x", can_update="no"), "can_update must be True or False, got str 'no'"),
    (lambda q: q.offer("k", "x", priority="high"), "priority is 'high', it must be an int from -32768 to 32767"),
    (lambda q: q.offer("k", "x", ttl=0), "ttl is 0 s, it must be positive"),
    (lambda q: q.offer("k", "x", ttl=-1.5), "ttl is -1.5 s, it must be positive"),
    (lambda q: q.offer("k", "x", headers=["a"]), "headers must be a mapping (a JSON object) or None, got list"),
    (lambda q: q.offer("k", "x", group=7), "group must be a str or None, got int 7"),
    (lambda q: q.offer("k", "x", payload_type=3), "payload_type must be a str or None, got int 3"),
    (lambda q: q.offer_many("kx"), "items must be an iterable of OfferRequest or (key, payload) pairs, got str"),
    (lambda q: q.offer_many([("k",)]), "items[0] must be an OfferRequest or a (key, payload) pair"),
    (lambda q: q.offer_many([("a", 1), (2, "x")]), "items[1].key must be a str, got int 2"),
    (lambda q: q.offer_many([OfferRequest("a", 1, delay=-5)]), "delay is -5 s, it must be non-negative"),
    (lambda q: q.poll(max_count="3"), "max_count must be an int from 1 to 10000, got str '3'"),
    (lambda q: q.poll(max_count=0), "max_count must be an int from 1 to 10000, got int 0"),
    (lambda q: q.poll(lock_timeout=-5), "lock_timeout is -5 s, it must be positive"),
    (lambda q: q.poll(wait="1"), "wait must be a timedelta or a number of seconds, got str '1'"),
    (lambda q: q.poll(wait=1, max_count=0), "max_count must be an int from 1 to 10000, got int 0"),
    (lambda q: q.poll(wait=1, idle_check=timedelta(seconds=-5)), "idle_check is -5 s, it must be positive"),
    (lambda q: q.ack("not-a-uuid"), "lock_token must be a UUID (the lock_token of a delivery), got str 'not-a-uuid'"),
    (lambda q: q.ack(None), "lock_token must be a UUID (the lock_token of a delivery), got NoneType None"),
    (lambda q: q.ack_many(["nope"]), "messages[0] must be a UUID (the lock_token of a delivery), got str 'nope'"),
    (lambda q: q.ack_many(TOKEN), "messages must be an iterable of deliveries or lock tokens, got UUID"),
    (lambda q: q.nack(TOKEN, -5), "delay is -5 s, it must be non-negative"),
    (lambda q: q.nack(TOKEN, error=3), "error must be a str or None, got int 3"),
    (lambda q: q.nack("x", 1), "lock_token must be a UUID"),
    (lambda q: q.extend(TOKEN, timedelta(seconds=-5)), "timeout is -5 s, it must be positive"),
    (lambda q: q.extend(TOKEN, "30"), "timeout must be a timedelta or a number of seconds, got str '30'"),
    (lambda q: q.configure(max_deliveries="3"), "max_deliveries must be an int or None, got str '3'"),
    (lambda q: q.configure(dead_letter_queue=5), "dead_letter_queue must be a str of 1 to 100 characters, got int 5"),
    (lambda q: q.configure(retention=-1), "retention is -1 s, it must be positive"),
    (lambda q: q.configure(archive="yes"), "archive must be True or False or None, got str 'yes'"),
    (lambda q: q.configure(rate_period="1m"), "rate_period must be a timedelta or a number of seconds, got str"),
    (lambda q: q.purge(confirm="yes"), "confirm must be True or False, got str 'yes'"),
    (lambda q: q.redrive(0), "max_count must be an int from 1 to 100000, got int 0"),
    (lambda q: q.cancel(5), "key must be a str, got int 5"),
    (lambda q: q.get(b"k"), "key must be a str, got bytes b'k'"),
    (lambda q: q.contains(5), "key must be a str, got int 5"),
    (lambda q: q.cron.install("n", schedule=5, payload="x"), "schedule must be a str, got int 5"),
    (lambda q: q.cron.install("n", schedule="@daily", payload="x", lookahead=-60), "lookahead is -60 s"),
]


@pytest.mark.parametrize(("call", "expected"), CASES, ids=[c[1][:40] for c in CASES])
def test_mistake_raises_invalid_argument_before_any_sql(closed, call, expected):
    with pytest.raises(pyqueue.InvalidArgument, match=re.escape(expected)) as info:
        call(closed)
    assert info.value.sqlstate == "22023"
    assert info.value.__cause__ is None  # raised by the binding, not translated from the server


def test_transaction_checks_before_any_sql(closed):
    with pytest.raises(pyqueue.InvalidArgument, match=re.escape("max_count must be an int from 1 to 10000")):
        with closed.transaction(max_count=0):
            pass


def test_a_queue_name_of_the_wrong_type_is_named():
    expected = "queue must be a str of 1 to 100 characters, got int 3"
    with pytest.raises(pyqueue.InvalidArgument, match=re.escape(expected)):
        DelayedQueue(ConnectionPool(DSN, open=False), 3)  # type: ignore[arg-type]


def test_a_lock_token_as_text_is_accepted(dsn):
    """The text form of a token (as ``pyqueue poll`` prints it) acknowledges the delivery."""
    with DelayedQueue(dsn, "emails") as q:
        q.offer("k", "x")
        (m,) = q.poll()
        assert q.ack(str(m.lock_token)) is True
        assert q.get("k") is None


def test_cron_install_tz_is_deprecated_but_works(dsn):
    """``tz=`` is the former name of ``timezone=``: it still installs, with a DeprecationWarning
    (sync and async); the hash is the one ``timezone=`` gives."""
    import asyncio

    with DelayedQueue(dsn, "emails") as q:
        with pytest.warns(DeprecationWarning, match=re.escape("install(tz=...) is deprecated, use timezone=...")):
            old = q.cron.install("a", schedule="@daily", payload="x", tz="Europe/Berlin")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            new = q.cron.install("b", schedule="@daily", payload="x", timezone="Europe/Berlin")
        assert {s.name: s.timezone for s in q.cron.list()} == {"a": "Europe/Berlin", "b": "Europe/Berlin"}
        assert old == new  # the hash covers queue, schedule, zone and payload: the same definition
        with pytest.raises(pyqueue.InvalidArgument, match="either timezone or the deprecated tz"):
            with pytest.warns(DeprecationWarning):
                q.cron.install("c", schedule="@daily", payload="x", timezone="UTC+1", tz="Europe/Berlin")

    async def run_async() -> str:
        async with AsyncDelayedQueue(dsn, "emails") as aq:
            with pytest.warns(DeprecationWarning, match=re.escape("install(tz=...) is deprecated")):
                return await aq.cron.install("d", schedule="@daily", payload="x", tz="Europe/Berlin")

    assert asyncio.run(run_async()) == new
