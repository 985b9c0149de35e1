"""The Python binding against a real server: outcomes, payload types, waiting, outbox,
exactly-once, typed errors. Every test taking ``q`` runs twice: against the sync
:class:`DelayedQueue` and against :class:`pyqueue.aio.AsyncDelayedQueue` (through the blocking
view of ``tests/support/blocking.py``, on an event loop in its own thread)."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from blocking import Blocking
from sqlhelpers import wait_for_lock_wait

import pyqueue
from pyqueue import DelayedQueue, OfferOutcome, OfferRequest, Worker
from pyqueue.aio import AsyncDelayedQueue, AsyncWorker
from pyqueue.serializers import SerializerRegistry


def app_connection(q: DelayedQueue, dsn: str):
    """The application's own connection (not autocommit), of the kind ``q`` takes as ``conn=``: a
    ``psycopg.Connection`` for the sync queue, a ``psycopg.AsyncConnection`` (blocking view, on the
    queue's event loop) for the async one."""
    if isinstance(q, Blocking):
        return Blocking(q._runner.run(psycopg.AsyncConnection.connect(dsn)), q._runner)
    return psycopg.connect(dsn)


def deliver_with_worker(q: DelayedQueue, count: int) -> list[tuple[str, object]]:
    """Run the queue's worker (:class:`pyqueue.Worker`, or :class:`pyqueue.aio.AsyncWorker` on the
    queue's event loop) until its handler has seen ``count`` messages (at most 60 s), stop it and
    wait for it to end; returns ``(key, payload)`` of every message handled."""
    got: list[tuple[str, object]] = []
    enough = threading.Event()

    def record(message) -> None:
        got.append((message.key, message.payload))
        if len(got) >= count:
            enough.set()

    if isinstance(q, Blocking):
        async def handler(message) -> None:
            record(message)

        runner = q._runner
        worker = AsyncWorker(q._obj, handler, concurrency=2, idle_check=1)
        done = asyncio.run_coroutine_threadsafe(worker.run(install_signal_handlers=False), runner.loop)
        try:
            assert enough.wait(60), got
        finally:
            runner.loop.call_soon_threadsafe(worker.stop)
            done.result(timeout=60)
    else:
        sync_worker = Worker(q, record, concurrency=2, idle_check=1)
        thread = threading.Thread(target=sync_worker.run, kwargs={"install_signal_handlers": False})
        thread.start()
        try:
            assert enough.wait(60), got
        finally:
            sync_worker.stop()
            thread.join(timeout=60)
        assert not thread.is_alive()
    return got


def count(conn: psycopg.Connection, queue: str = "emails") -> int:
    return conn.execute("SELECT count(*) FROM dq_messages WHERE queue = %s", (queue,)).fetchone()[0]


def test_offer_outcomes_and_payload_types(q: DelayedQueue, conn) -> None:
    at = conn.execute("SELECT now() - interval '1 second'").fetchone()[0]
    assert q.offer("j", {"to": "a@example.com"}, at=at) is OfferOutcome.CREATED
    assert q.offer("j", {"to": "a@example.com"}, at=at) is OfferOutcome.IGNORED
    assert q.offer("j", {"to": "b@example.com"}, at=at) is OfferOutcome.UPDATED
    assert q.offer("j", {"to": "c@example.com"}, at=at, can_update=False) is OfferOutcome.IGNORED
    assert q.offer("t", "hello", at=at) is OfferOutcome.CREATED
    assert q.offer("b", b"\x00\xff", at=at) is OfferOutcome.CREATED
    got = {m.key: m for m in q.poll(10)}
    assert got["j"].payload == {"to": "b@example.com"} and got["j"].payload_type == "json"
    assert got["t"].payload == "hello" and got["t"].payload_type == "text"
    assert got["b"].payload == b"\x00\xff" and got["b"].payload_type == "bytes"
    assert all(m.delivery_count == 1 and not m.is_redelivery for m in got.values())
    assert all(m.scheduled_at == at and m.locked_until > at for m in got.values())
    assert q.ack_many(got.values()) == 3
    assert count(conn) == 0


def test_offer_delay_uses_database_clock(q: DelayedQueue, conn) -> None:
    before = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    q.offer("later", "x", delay=timedelta(hours=1))
    stored = q.get("later")
    assert stored is not None
    assert before + timedelta(hours=1) <= stored.scheduled_at
    assert stored.locked_until is None
    assert q.next_due() == stored.scheduled_at
    assert q.poll(1) == []


def test_custom_and_unknown_payload_types(dsn: str) -> None:
    reg = SerializerRegistry.default()
    reg.register("Contact", encode=lambda c: f"{c[0]}|{c[1]}".encode(), decode=lambda b: tuple(b.decode().split("|")))
    with DelayedQueue(dsn, "contacts", serializers=reg) as q:
        q.offer("c1", ("Alex", "a@example.com"), payload_type="Contact")
        q.offer("c2", b"raw", payload_type="Mystery")
        got = {m.key: m for m in q.poll(2)}
        assert got["c1"].payload == ("Alex", "a@example.com")
        with pytest.raises(pyqueue.UnknownPayloadType, match="Mystery"):
            _ = got["c2"].payload
        assert got["c2"].raw_payload == b"raw"
        assert got["c2"].nack() is True
    with pytest.raises(pyqueue.InvalidArgument, match="no encoder"):
        with DelayedQueue(dsn, "contacts") as q2:
            q2.offer("c3", object(), payload_type="Nope")


def test_offer_many_outcomes_in_order(q: DelayedQueue, conn) -> None:
    q.offer("a", 1)
    result = q.offer_many([("b", 2), OfferRequest("a", 1), OfferRequest("c", "x", delay=3600), ("a2", b"z")],
                          can_update=False)
    assert list(result) == ["b", "a", "c", "a2"]
    assert result == {"b": OfferOutcome.CREATED, "a": OfferOutcome.IGNORED,
                      "c": OfferOutcome.CREATED, "a2": OfferOutcome.CREATED}
    assert q.get("c").scheduled_at > conn.execute("SELECT now() + interval '59 minutes'").fetchone()[0]
    assert q.offer_many([]) == {}


@pytest.mark.parametrize(
    ("call", "exc", "sqlstate", "text"),
    [
        (lambda q: q.offer("", 1), pyqueue.InvalidArgument, "22023", "key"),
        (lambda q: q.offer("k" * 201, 1), pyqueue.ValueTooLong, "22001", "limit is 200"),
        (lambda q: q.offer_many([("d", 1), ("d", 2)]), pyqueue.InvalidArgument, "22023", "more than once"),
        (lambda q: q.offer_many([("e", 1), ("k" * 201, 2)]), pyqueue.ValueTooLong, "22001", "keys[2]"),
        (lambda q: q.poll(0), pyqueue.InvalidArgument, "22023", "max_count"),
        (lambda q: q.poll(10001), pyqueue.InvalidArgument, "22023", "10000"),
        (lambda q: q.poll(1, lock_timeout=0), pyqueue.InvalidArgument, "22023", "lock_timeout"),
        (lambda q: q.nack(__import__("uuid").uuid4(), -1), pyqueue.InvalidArgument, "22023", "delay"),
        (lambda q: q.offer("x", 1, at=datetime(2030, 1, 1)), pyqueue.InvalidArgument, "22023", "timezone"),
        (lambda q: q.offer("x", 1, at=datetime.now(UTC), delay=1), pyqueue.InvalidArgument, "22023", "either"),
    ],
)
def test_bad_input_raises_typed_error_and_writes_nothing(q, conn, call, exc, sqlstate, text) -> None:
    with pytest.raises(exc) as info:
        call(q)
    assert info.value.sqlstate == sqlstate
    assert text in str(info.value)
    assert count(conn) == 0


def test_queue_name_checked_by_constructor(dsn: str) -> None:
    with pytest.raises(pyqueue.InvalidArgument):
        DelayedQueue(dsn, "q" * 101)
    with pytest.raises(pyqueue.InvalidArgument):
        AsyncDelayedQueue(dsn, "q" * 101)


def test_message_ack_nack_extend(q: DelayedQueue, conn) -> None:
    q.offer("m", "x")
    (m,) = q.poll(1, lock_timeout=timedelta(seconds=30))
    until = m.extend(timedelta(minutes=10))
    assert until is not None and until > m.locked_until
    assert m.nack(0) is True
    assert m.ack() is False  # the nack released the lock: the token is stale
    (m2,) = q.poll(1)
    assert m2.delivery_count == 2 and m2.is_redelivery
    assert m2.ack() is True
    assert m2.extend(10) is None
    assert count(conn) == 0


def test_outbox_rollback_leaves_no_message(dsn: str, q: DelayedQueue, conn) -> None:
    """The transactional outbox, sync and async (``conn=`` the application's connection): the
    messages appear when its transaction commits, never before, and vanish with a rollback; a
    repeated key gives the documented outcomes, in the transaction and from another session, which
    waits for the outbox's commit; a worker then delivers each committed message once."""
    with app_connection(q, dsn) as app:
        app.execute("CREATE TABLE orders (id int)")
        app.commit()
        app.execute("INSERT INTO orders VALUES (1)")
        assert q.offer("order-1", {"id": 1}, conn=app) is OfferOutcome.CREATED
        assert count(conn) == 0 and q.get("order-1") is None  # not before the commit
        app.rollback()
        assert count(conn) == 0
        app.execute("INSERT INTO orders VALUES (2)")
        q.offer_many([("order-2", {"id": 2})], conn=app)
        assert count(conn) == 0
        app.commit()
        assert q.get("order-2") is not None and q.get("order-1") is None

        # A repeated key inside the transaction: the usual rules, on the transaction's own row.
        at = conn.execute("SELECT now() - interval '1 second'").fetchone()[0]
        app.execute("INSERT INTO orders VALUES (3)")
        assert q.offer("order-3", {"id": 3}, at=at, conn=app) is OfferOutcome.CREATED
        assert q.offer("order-3", {"id": 3}, at=at, conn=app) is OfferOutcome.IGNORED
        assert q.offer("order-3", {"id": 33}, at=at, can_update=False, conn=app) is OfferOutcome.IGNORED
        assert q.offer("order-3", {"id": 30}, at=at, conn=app) is OfferOutcome.UPDATED
        assert q.offer_many([OfferRequest("order-2", {"id": 2}), ("order-4", {"id": 4})], can_update=False,
                            conn=app) == {"order-2": OfferOutcome.IGNORED, "order-4": OfferOutcome.CREATED}
        # ... and from another session: its offer of the uncommitted key waits for the outbox's
        # transaction, then meets the committed row (an equal offer at an explicit time: ignored).
        outcomes: dict[str, OfferOutcome] = {}
        other = threading.Thread(target=lambda: outcomes.update(late=q.offer("order-3", {"id": 30}, at=at)))
        other.start()
        wait_for_lock_wait(conn, "dq_offer")
        assert count(conn) == 1  # still only order-2
        app.commit()
        other.join(timeout=60)
        assert outcomes == {"late": OfferOutcome.IGNORED}

        # After a rollback the waiting offer creates the key itself.
        app.execute("INSERT INTO orders VALUES (5)")
        assert q.offer("order-5", {"id": 5}, at=at, conn=app) is OfferOutcome.CREATED
        other = threading.Thread(target=lambda: outcomes.update(alone=q.offer("order-5", {"id": 50}, at=at)))
        other.start()
        wait_for_lock_wait(conn, "dq_offer")
        app.rollback()
        other.join(timeout=60)
        assert outcomes["alone"] is OfferOutcome.CREATED
    assert conn.execute("SELECT array_agg(id ORDER BY id) FROM orders").fetchone()[0] == [2, 3]

    delivered = deliver_with_worker(q, 4)
    assert sorted(delivered) == [("order-2", {"id": 2}), ("order-3", {"id": 30}), ("order-4", {"id": 4}),
                                 ("order-5", {"id": 50})]
    assert count(conn) == 0


def test_exactly_once_transaction_rolls_back_on_error(q: DelayedQueue, conn) -> None:
    conn.execute("CREATE TABLE ledger (key text PRIMARY KEY)")
    q.offer("pay-1", {"amount": 5})

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with q.transaction() as batch:
            assert batch.message is not None
            batch.connection.execute("INSERT INTO ledger VALUES (%s)", (batch.message.key,))
            raise Boom
    stored = q.get("pay-1")
    assert stored is not None and stored.delivery_count == 0 and stored.locked_until is None
    assert conn.execute("SELECT count(*) FROM ledger").fetchone()[0] == 0

    with q.transaction() as batch:
        assert batch.message is not None and batch.message.key == "pay-1"
        batch.connection.execute("INSERT INTO ledger VALUES (%s)", (batch.message.key,))
    assert q.get("pay-1") is None
    assert conn.execute("SELECT count(*) FROM ledger").fetchone()[0] == 1

    with q.transaction() as batch:
        assert batch.messages == [] and batch.message is None


def test_exactly_once_rows_are_invisible_to_other_pollers_meanwhile(q: DelayedQueue) -> None:
    q.offer("only", 1)
    with q.transaction() as batch:
        assert batch.message is not None
        assert q.poll(1) == []  # locked FOR UPDATE by the open transaction: skipped
    assert q.poll(1) == []  # acknowledged at commit


def test_poll_wait_returns_empty_after_wait(q: DelayedQueue) -> None:
    t0 = time.monotonic()
    assert q.poll(1, wait=0.3) == []
    assert time.monotonic() - t0 >= 0.3


def test_poll_wait_wakes_on_notification(q: DelayedQueue, dsn: str, conn) -> None:
    """An idle waiter (idle_check 30 s, so only a notification can wake it early) gets a message
    offered by another session while it sleeps."""
    result: list = []
    waiter = threading.Thread(target=lambda: result.extend(q.poll(1, wait=20, idle_check=30)))
    waiter.start()
    deadline = time.monotonic() + 10
    while count_waiters(conn) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert count_waiters(conn) == 1
    with DelayedQueue(dsn, "emails") as producer:
        producer.offer("wake", "now")
    waiter.join(timeout=15)
    assert not waiter.is_alive()
    assert [m.key for m in result] == ["wake"]
    assert count_waiters(conn) == 0  # unregistered when it woke


def test_poll_wait_wakes_on_own_timer_for_a_later_message(q: DelayedQueue, conn) -> None:
    q.offer("soon", "x", delay=0.5)
    due = q.next_due()
    (m,) = q.poll(1, wait=10, idle_check=30)
    assert m.key == "soon"
    assert conn.execute("SELECT clock_timestamp()").fetchone()[0] >= due


def count_waiters(conn) -> int:
    return conn.execute("SELECT count(*) FROM dq_waiters WHERE queue = 'emails'").fetchone()[0]


def test_notification_horizon(dsn: str, conn) -> None:
    """No waiter: no NOTIFY. A waiter: NOTIFY for a message due before its wake-up, none for a
    far-future one, one per transaction however many messages."""
    channel = conn.execute("SELECT dq_channel('emails')").fetchone()[0]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        conn.execute("SELECT dq_offer('emails', 'n0', 'x')")
        assert list(listener.notifies(timeout=0.3)) == []
        conn.execute("SELECT dq_cancel('emails', 'n0')")  # empty queue: the waiter sleeps the full 30 s

        assert listener.execute("SELECT dq_wait('emails', '30 seconds')").fetchone()[0] > timedelta(0)
        conn.execute("SELECT dq_offer('emails', 'far', 'x', now() + interval '1 hour')")
        assert list(listener.notifies(timeout=0.3)) == []

        with conn.transaction():
            for i in range(50):
                conn.execute("SELECT dq_offer('emails', %s, 'x')", (f"n{i + 1}",))
        got = list(listener.notifies(timeout=0.5))
        assert [(n.channel, n.payload) for n in got] == [(channel, "emails")]

        conn.execute("SELECT * FROM dq_offer_many('emails', ARRAY['n1', 'n2'], ARRAY['x', 'x']::bytea[], NULL, false)")
        assert list(listener.notifies(timeout=0.3)) == []  # every element ignored: nothing to wake for

        listener.execute("SELECT dq_wait_done('emails')")
        conn.execute("SELECT dq_offer('emails', 'n99', 'x')")
        assert list(listener.notifies(timeout=0.3)) == []


def test_cancel_get_contains(q: DelayedQueue) -> None:
    q.offer("c", "x", delay=60)
    assert q.contains("c")
    assert q.cancel("c") is True
    assert q.cancel("c") is False
    assert q.get("c") is None and q.next_due() is None


def test_poll_wait_reuses_its_listening_connection_and_survives_its_loss(q: DelayedQueue, conn) -> None:
    """The waiting connection stays open (and LISTENing) between waits; if the server drops it
    meanwhile, the next wait opens a new one by itself."""
    assert q.poll(1, wait=0.1) == []
    pids = [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND query LIKE '%dq_poll_or_wait%'")]
    assert len(pids) == 1
    assert q.poll(1, wait=0.1) == []
    again = [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND query LIKE '%dq_poll_or_wait%'")]
    assert again == pids  # the same session served the second wait

    conn.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
    q.offer("after-loss", "x")
    (m,) = q.poll(1, wait=5)
    assert m.key == "after-loss" and m.ack()


def test_poll_wait_bad_argument_is_typed(q: DelayedQueue) -> None:
    with pytest.raises(pyqueue.InvalidArgument) as info:
        q.poll(0, wait=1)
    assert info.value.sqlstate == "22023"


def test_configure_stats_purge_and_release(q: DelayedQueue, conn) -> None:
    q.configure(archive=True, retention=timedelta(days=7), notify=False)
    assert conn.execute("SELECT archive, retention, notify FROM dq_queues WHERE queue = 'emails'").fetchone() == (
        True, timedelta(days=7), False)
    q.offer_many([("a", 1), ("b", 2)])
    q.offer("c", 3, delay=3600)
    (m,) = q.poll(1)
    stats = q.stats()
    assert (stats.queue, stats.ready, stats.scheduled, stats.in_flight, stats.approximate) == (
        "emails", 1, 1, 1, False)
    assert m.ack() is True
    assert q.stats().acked_last_minute == 1
    assert conn.execute("SELECT outcome FROM dq_archive").fetchall() == [("acked",)]
    q.poll(1)
    assert q.release_locks() == 1
    with pytest.raises(pyqueue.InvalidArgument) as info:
        q.purge()
    assert info.value.sqlstate == "22023" and count(conn) == 2
    assert q.purge(confirm=True) == 2 and count(conn) == 0
    with pytest.raises(pyqueue.InvalidArgument):
        q.configure(retention=timedelta(seconds=-1))
    assert [s.queue for s in pyqueue.all_stats(conn)] == ["emails"]


def test_queue_cron_accessor_installs_lists_pauses_and_uninstalls(q, conn):
    """``q.cron``: schedules of this queue (sync and asyncio), one call each."""
    h = q.cron.install("digest", schedule="*/10 * * * *", payload={"kind": "digest"}, timezone="Europe/Bucharest",
                       lookahead=timedelta(hours=1))
    assert len(h) == 16
    # The same definition again changes nothing.
    assert q.cron.install("digest", schedule="*/10 * * * *", payload={"kind": "digest"}, timezone="Europe/Bucharest",
                          lookahead=timedelta(hours=1)) == h
    conn.execute("SELECT dq_cron_install('elsewhere', 'other', '@daily', 'x'::text)")
    listed = q.cron.list()
    assert [s.name for s in listed] == ["digest"]  # this queue's schedules only
    (s,) = listed
    assert (s.queue, s.timezone, s.payload_type, s.config_hash, s.paused) == ("emails", "Europe/Bucharest", "json", h,
                                                                             False)
    assert len(s.next_occurrences) == 5
    keys = [r[0] for r in conn.execute("SELECT key FROM dq_messages WHERE queue = 'emails' ORDER BY scheduled_at")]
    assert 5 <= len(keys) <= 7 and all(k.startswith(f"digest/{h}/") for k in keys)
    first = q.get(keys[0])
    assert first is not None and first.payload == {"kind": "digest"}
    # The tick offers exactly what it counts: nothing, unless an occurrence entered a lookahead
    # window since the install (a statement of its own, a moment earlier); such an occurrence comes
    # after every message its schedule's queue had.
    listing = "SELECT key, queue, scheduled_at FROM dq_messages"
    before = {key: (queue, at) for key, queue, at in conn.execute(listing)}
    ticked = q.cron.tick()
    after = {key: (queue, at) for key, queue, at in conn.execute(listing)}
    added = {key: row for key, row in after.items() if key not in before}
    assert {key: row for key, row in after.items() if key in before} == before
    assert ticked == len(added)
    for queue, at in added.values():
        assert at > max(t for qu, t in before.values() if qu == queue)
    assert q.cron.pause("digest") is True
    assert count(conn) == 0
    assert q.cron.list()[0].paused is True
    assert q.cron.resume("digest") is True
    assert count(conn) == len(keys)
    assert q.cron.uninstall("digest") is True
    assert q.cron.uninstall("digest") is False
    assert q.cron.list() == [] and count(conn) == 0
    with pytest.raises(pyqueue.InvalidArgument) as info:
        q.cron.install("bad", schedule="61 * * * *", payload="x")
    assert info.value.sqlstate == "22023" and "minute" in str(info.value)
    with pytest.raises(pyqueue.InvalidArgument) as info:
        q.cron.install("bad", schedule="@daily", payload="x", timezone="Mars/Olympus")
    assert info.value.sqlstate == "22023" and "timezone" in str(info.value)
    assert conn.execute("SELECT count(*) FROM dq_cron WHERE name = 'bad'").fetchone() == (0,)
