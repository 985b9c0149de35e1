"""The worker as real processes (`pyqueue worker …`): delivery, retries with backoff, heartbeats
for long handlers, graceful SIGTERM, and redelivery after SIGKILL. Every test runs twice: with
the thread-pool :class:`pyqueue.Worker` and with the asyncio :class:`pyqueue.aio.AsyncWorker`
(`pyqueue worker --async`).

Nothing here asserts on what happens within a real-time window: a test waits until what it needs
is seen on the server (a row, a worker waiting on LISTEN), at most ``HANG_S``, and asserts the
outcome. Where a test is about timing (a stop ends a 30 s wait, a notification beats the timer),
it compares with the server's own times: the worker's ``wake_at``, when its wait would have
ended by itself."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from datetime import datetime

import psycopg
import pytest
from workerhandlers import (
    HANG_S,
    STARTED,
    WORKER_ARGS,
    assert_idle_budget,
    idle_waiters,
    idle_worker_calls,
    read_until,
    start_worker,
    stop,
    wait_for,
    wait_until,
)

from pyqueue import Backoff, DelayedQueue, InvalidArgument, Message, OfferRequest, Worker, testing
from pyqueue.aio import AsyncDelayedQueue, AsyncMessage, AsyncWorker


@pytest.fixture(autouse=True, params=["sync", "async"])
def worker_mode(request):
    """Which worker `start_worker` runs for this test; a worker a failed test left running is killed."""
    WORKER_ARGS[:] = ["--async"] if request.param == "async" else []
    yield str(request.param)
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=HANG_S)


@pytest.fixture
def db(dsn: str):
    """The test's connection, with the table the handlers of workerhandlers record in (``at``: the
    server's time of the record)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE handled (key text, delivery_count int, phase text, pid int, "
                     "at timestamptz NOT NULL DEFAULT clock_timestamp())")
        yield conn


#: One sample of what a worker holds: messages locked but whose handler has not recorded 'done'
#: (running, or polled ahead), and handlers running (recorded 'started', not yet 'done').
HELD_AND_RUNNING = """
    SELECT (SELECT count(*) FROM dq_messages m WHERE m.lock_token IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM handled h WHERE h.key = m.key AND h.phase = 'done')),
           (SELECT count(*) FILTER (WHERE phase = 'started') - count(*) FILTER (WHERE phase = 'done') FROM handled),
           (SELECT count(*) FROM handled WHERE phase = 'done')"""


def sample_until_done(conn: psycopg.Connection, done: int) -> list[tuple[int, int]]:
    """(held, running) sampled continuously (one statement each: one snapshot) until ``done``
    handlers have finished, at most HANG_S."""
    samples: list[tuple[int, int]] = []
    deadline = time.monotonic() + HANG_S
    while True:
        held, running, finished = conn.execute(HELD_AND_RUNNING).fetchone()
        samples.append((held, running))
        if finished >= done:
            return samples
        assert time.monotonic() < deadline, f"{finished} of {done} handlers done after {HANG_S:.0f} s"
        time.sleep(0.02)


def test_worker_delivers_every_message_once_and_stops_cleanly(dsn: str, db, worker_mode: str) -> None:
    """Two workers, both started and waiting before anything is offered (a loaded host may take
    seconds to start one): both are woken and share the work; every message is handled once."""
    handler = "workerhandlers:record_async" if worker_mode == "async" else "workerhandlers:record"
    workers = [start_worker(dsn, handler, "--concurrency", "4", "--idle-check", "1") for _ in range(2)]
    idle_waiters(db, count=2)
    with DelayedQueue(dsn, "jobs") as q:
        q.offer_many([(f"now-{i}", {"i": i}) for i in range(200)])
        q.offer_many([OfferRequest(f"later-{i}", {"i": i}, delay=1 + i / 20) for i in range(20)])
    wait_for(db, "SELECT count(*) FROM handled WHERE phase = 'done'", 220)
    for proc in workers:
        code, out = stop(proc)
        assert code == 0, out
        assert "worker ready" in out and "worker stopped" in out
    rows = db.execute("SELECT key, count(*) FROM handled GROUP BY key HAVING count(*) > 1").fetchall()
    assert rows == []
    assert db.execute("SELECT count(DISTINCT key) FROM handled").fetchone()[0] == 220
    assert db.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0
    assert db.execute("SELECT count(DISTINCT pid) FROM handled").fetchone()[0] == 2


def test_failed_handler_is_retried_with_backoff(dsn: str, db) -> None:
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("flaky", {"x": 1})
    proc = start_worker(dsn, "workerhandlers:fail_first", "--idle-check", "1")
    wait_for(db, "SELECT count(*) FROM handled WHERE phase = 'done'", 1)
    code, out = stop(proc)
    assert code == 0, out
    phases = db.execute("SELECT phase, delivery_count FROM handled ORDER BY delivery_count").fetchall()
    assert phases == [("failed", 1), ("done", 2)]
    assert "handler failed for key 'flaky'" in out
    assert db.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_dead_lettered_message_is_logged_as_dead_lettered(dsn: str, db, worker_mode: str) -> None:
    """At the queue's max_deliveries the nack moves the message to its dead-letter queue: the log
    says so and names that queue, and promises no retry; the earlier failure says when it retries."""
    db.execute("SELECT dq_configure_queue('jobs', max_deliveries => 2, dead_letter_queue => 'jobs-dead')")
    db.execute("""SELECT dq_offer('jobs', 'doomed', '{"x": 1}'::jsonb)""")
    worker = start_worker(dsn, "workerhandlers:always_fail", "--idle-check", "0.5")
    wait_for(db, "SELECT count(*) FROM dq_messages WHERE queue = 'jobs-dead' AND key = 'doomed'", 1)
    returncode, out = stop(worker)
    assert (returncode, db.execute("SELECT count(*) FROM handled WHERE key = 'doomed'").fetchone()[0]) == (0, 2), out
    first = [line for line in out.splitlines() if "handler failed for key 'doomed' (delivery 1)" in line]
    second = [line for line in out.splitlines() if "handler failed for key 'doomed' (delivery 2)" in line]
    assert len(first) == 1 and len(second) == 1, out
    assert re.search(r"; retry in \d+(\.\d+)? s$", first[0]), first[0]
    assert second[0].endswith("; dead-lettered: moved to queue 'jobs-dead' (the queue's max_deliveries was "
                              "reached), not retried"), second[0]
    assert "retry in" not in second[0]


def test_a_failed_delivery_is_settled_by_one_statement(dsn: str, db, worker_mode: str) -> None:
    """The worker learns where a failed message went from its nack (dq_nack_outcome, retried or
    dead-lettered): it reads nothing back (no dq_get, no dq_export_messages) and calls no dq_nack.
    Counted with track_functions on the worker's own sessions, reported as they end."""
    db.execute("SELECT dq_configure_queue('jobs', max_deliveries => 2, dead_letter_queue => 'jobs-dead')")
    db.execute("""SELECT dq_offer('jobs', 'doomed', '{"x": 1}'::jsonb)""")
    worker = start_worker(f"{dsn} options='-c track_functions=all'", "workerhandlers:always_fail",
                          "--idle-check", "0.5")
    wait_for(db, "SELECT count(*) FROM dq_messages WHERE queue = 'jobs-dead' AND key = 'doomed'", 1)
    returncode, out = stop(worker)
    assert returncode == 0, out
    wait_until(db, "SELECT coalesce(sum(calls), 0) = 2 FROM pg_stat_user_functions WHERE funcname = 'dq_nack_outcome'")
    calls = dict(db.execute(
        "SELECT funcname, sum(calls)::int FROM pg_stat_user_functions "
        "WHERE funcname IN ('dq_nack_outcome', 'dq_nack', 'dq_get', 'dq_export_messages') GROUP BY funcname"
    ).fetchall())
    assert calls["dq_nack_outcome"] == 2, calls
    assert not {"dq_get", "dq_export_messages", "dq_nack"} & set(calls), calls


def test_long_handler_keeps_its_lock_by_heartbeat(dsn: str, db) -> None:
    """lock_timeout 1.5 s, handler 4 s: without the heartbeat a second worker would get it. The
    workers are stopped once the message is acknowledged (gone): a second delivery would have
    started during the handler, and would hold the message until it ended."""
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("long", {"sleep": 4})
    workers = [start_worker(dsn, "workerhandlers:slow", "--lock-timeout", "1.5", "--idle-check", "0.5")
               for _ in range(2)]
    wait_for(db, "SELECT count(*) FROM handled WHERE phase = 'done'", 1)
    wait_until(db, "SELECT count(*) = 0 FROM dq_messages")
    for proc in workers:
        code, out = stop(proc)
        assert code == 0, out
    assert db.execute("SELECT phase, delivery_count FROM handled ORDER BY phase").fetchall() == [
        ("done", 1), ("started", 1)]
    assert db.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_prefetched_messages_wait_for_a_slot_with_their_locks_extended(dsn: str, db) -> None:
    """concurrency 1, batch 1: while the handler runs, the worker holds one more message polled ahead
    (prefetch, default one batch); it waits, its lock (1.5 s) extended, and is never delivered twice."""
    with DelayedQueue(dsn, "jobs") as q:
        q.offer_many([(f"m{i}", {"sleep": 2}) for i in range(3)])
    proc = start_worker(dsn, "workerhandlers:slow", "--concurrency", "1", "--batch-size", "1",
                        "--lock-timeout", "1.5", "--idle-check", "0.5")
    # Sampled on the server until the three are done (each sample one snapshot): the handler
    # records 'started' on its own connection, possibly after the poll ahead.
    samples = sample_until_done(db, 3)
    # one slot: exactly one handler running while another message is held (polled ahead) ...
    assert (2, 1) in samples, samples
    # ... and never more: one handler at a time, at most one message polled ahead
    assert max(running for _, running in samples) == 1 and max(held for held, _ in samples) == 2, samples
    code, out = stop(proc)
    assert code == 0, out
    assert db.execute("SELECT count(*), max(delivery_count) FROM handled WHERE phase = 'done'").fetchone() == (3, 1)
    assert db.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_worker_without_prefetch_holds_only_what_it_runs(dsn: str, db) -> None:
    """prefetch 0: while its one handler runs, the worker holds no other message (sampled on the
    server through both handlers, 1.5 s each)."""
    with DelayedQueue(dsn, "jobs") as q:
        q.offer_many([(f"m{i}", {"sleep": 1.5}) for i in range(2)])
    proc = start_worker(dsn, "workerhandlers:slow", "--concurrency", "1", "--prefetch", "0", "--idle-check", "0.5")
    samples = sample_until_done(db, 2)
    assert (1, 1) in samples, samples  # a handler seen running ...
    assert max(held for held, _ in samples) == 1, samples  # ... and nothing more held, ever
    code, out = stop(proc)
    assert code == 0, out


def test_sigterm_lets_the_running_handler_finish(dsn: str, db) -> None:
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("graceful", {"sleep": 2})
    proc = start_worker(dsn, "workerhandlers:slow", "--lock-timeout", "10")
    wait_for(db, "SELECT count(*) FROM handled WHERE phase = 'started'", 1)
    code, out = stop(proc)
    assert code == 0, out
    assert db.execute("SELECT count(*) FROM handled WHERE phase = 'done'").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0  # acknowledged before exit


def test_sigterm_releases_prefetched_messages_at_once(dsn: str, db) -> None:
    """A stopping worker starts nothing more: the messages it polled ahead and has not started are
    given back at once (due now, their delivery not counted), not left locked until their locks
    expire; the running handler finishes and is acknowledged. With max_deliveries 1 the released
    messages are still deliverable (not dead-lettered for a delivery that never reached a handler)."""
    with DelayedQueue(dsn, "jobs") as q:
        q.configure(max_deliveries=1, dead_letter_queue="jobs.dead")
        q.offer_many([(f"m{i}", {"sleep": 2}) for i in range(4)])
    proc = start_worker(dsn, "workerhandlers:slow", "--concurrency", "1", "--batch-size", "3",
                        "--lock-timeout", "60", "--idle-check", "0.5", "--shutdown-grace", "20")
    wait_for(db, "SELECT count(*) FROM handled WHERE phase = 'started'", 1)
    wait_for(db, "SELECT count(*) FROM dq_messages WHERE queue = 'jobs' AND lock_token IS NOT NULL", 3)
    code, out = stop(proc)
    assert code == 0, out
    assert db.execute("SELECT count(*) FROM handled WHERE phase = 'started'").fetchone()[0] == 1, out
    assert db.execute("SELECT count(*) FROM handled WHERE phase = 'done'").fetchone()[0] == 1, out
    left = db.execute("SELECT count(*), count(*) FILTER (WHERE lock_token IS NULL AND delivery_count = 0 "
                      "AND scheduled_at <= clock_timestamp()) FROM dq_messages WHERE queue = 'jobs'").fetchone()
    assert left == (3, 3), out
    assert db.execute("SELECT count(*) FROM dq_messages WHERE queue = 'jobs.dead'").fetchone()[0] == 0
    assert "released" in out


def test_killed_worker_message_is_redelivered(dsn: str, db) -> None:
    with DelayedQueue(dsn, "jobs") as q:
        q.offer("orphan", {"sleep": 30})
    victim = start_worker(dsn, "workerhandlers:slow", "--lock-timeout", "1")
    wait_for(db, "SELECT count(*) FROM handled WHERE phase = 'started'", 1)
    victim.kill()
    victim.communicate(timeout=HANG_S)
    with DelayedQueue(dsn, "jobs") as q:
        stored = q.get("orphan")
        assert stored is not None and stored.delivery_count == 1
    rescuer = start_worker(dsn, "workerhandlers:record", "--idle-check", "0.5")
    wait_for(db, "SELECT count(*) FROM handled WHERE phase = 'done'", 1)
    code, out = stop(rescuer)
    assert code == 0, out
    assert db.execute("SELECT delivery_count FROM handled WHERE phase = 'done'").fetchone()[0] == 2
    assert db.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_worker_in_process_stops_on_stop(dsn: str, conn, worker_mode: str) -> None:
    """Embedded in an application: Worker in a thread, AsyncWorker as a task with a coroutine
    handler; stop() ends an idle wait and run() returns, with the counters filled in. The async
    worker waits on LISTEN with idle_check 30 s (seen on the server) before and after its message;
    run() returns before that second wait would have ended by its timer (the server's wake_at)."""
    seen: list[str] = []
    if worker_mode == "sync":
        with DelayedQueue(dsn, "jobs") as q:
            worker = Worker(q, lambda m: seen.append(m.key), concurrency=2, idle_check=0.5)
            t = threading.Thread(target=worker.run)
            t.start()
            q.offer("threaded", "x")
            deadline = time.monotonic() + HANG_S
            while not seen and time.monotonic() < deadline:
                time.sleep(0.02)
            worker.stop()
            t.join(timeout=HANG_S)
            assert not t.is_alive()
            snap = worker.stats.snapshot()
    else:
        async def handler(message: AsyncMessage) -> None:
            await asyncio.sleep(0.01)
            seen.append(message.key)

        async def main() -> dict:
            async with AsyncDelayedQueue(dsn, "jobs") as q:
                worker = AsyncWorker(q, handler, concurrency=2, idle_check=30)
                task = asyncio.create_task(worker.run(install_signal_handlers=False))
                await asyncio.to_thread(idle_waiters, conn)  # idle, waiting on LISTEN (idle_check 30 s)
                await q.offer("threaded", "x")
                deadline = time.monotonic() + HANG_S
                while not seen and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                # idle again: a new wait (the first ended at the offer's notification)
                ((_, wake_at),) = await asyncio.to_thread(idle_waiters, conn)
                worker.stop()
                await asyncio.wait_for(task, HANG_S)
                # the stop ended the 30 s wait: run() returned before its timer would have
                assert conn.execute("SELECT clock_timestamp() < %s", (wake_at,)).fetchone() == (True,)
                return worker.stats.snapshot()

        snap = asyncio.run(main())
    assert seen == ["threaded"]
    assert snap["delivered"] == 1 and snap["acknowledged"] == 1 and snap["failed"] == 0
    assert sum(snap["lateness_ms"].values()) == 1


def test_handler_that_acknowledges_in_its_own_transaction(dsn: str, conn, worker_mode: str) -> None:
    """Exactly-once effects: the handler writes a ledger row and acknowledges with
    ``message.ack(conn=…)`` in one transaction. The worker sends nothing more for those messages,
    counts them acknowledged (not as lost locks), and its heartbeat leaves them alone; a handler
    that nacks itself is not acknowledged by the worker either."""
    conn.execute("CREATE TABLE ledger (key text PRIMARY KEY)")
    n = 12

    if worker_mode == "sync":
        with DelayedQueue(dsn, "jobs") as q:
            def handler(m: Message) -> None:
                if m.key == "nack-me":
                    m.nack(3600)
                    return
                with q.pool.connection() as c, c.transaction():
                    c.execute("INSERT INTO ledger VALUES (%s)", (m.key,))
                    assert m.ack(conn=c)
                    time.sleep(0.4)  # inside the transaction: the heartbeat (every 0.33 s) must skip it

            worker = Worker(q, handler, concurrency=3, idle_check=0.5, lock_timeout=1)
            t = threading.Thread(target=worker.run)
            t.start()
            q.offer_many([(f"k{i}", i) for i in range(n)] + [("nack-me", 0)])
            deadline = time.monotonic() + HANG_S
            while (worker.stats.acknowledged < n or worker.stats.delivered < n + 1) and time.monotonic() < deadline:
                time.sleep(0.05)
            worker.stop()
            t.join(timeout=HANG_S)
            assert not t.is_alive()
            snap = worker.stats.snapshot()
    else:
        async def main() -> dict:
            async with AsyncDelayedQueue(dsn, "jobs") as q:
                async def handler(m: AsyncMessage) -> None:
                    if m.key == "nack-me":
                        await m.nack(3600)
                        return
                    async with q.pool.connection() as c, c.transaction():
                        await c.execute("INSERT INTO ledger VALUES (%s)", (m.key,))
                        assert await m.ack(conn=c)
                        await asyncio.sleep(0.4)

                worker = AsyncWorker(q, handler, concurrency=3, idle_check=0.5, lock_timeout=1)
                task = asyncio.create_task(worker.run(install_signal_handlers=False))
                await q.offer_many([(f"k{i}", i) for i in range(n)] + [("nack-me", 0)])
                deadline = time.monotonic() + HANG_S
                while ((worker.stats.acknowledged < n or worker.stats.delivered < n + 1)
                       and time.monotonic() < deadline):
                    await asyncio.sleep(0.05)
                worker.stop()
                await asyncio.wait_for(task, HANG_S)
                return worker.stats.snapshot()

        snap = asyncio.run(main())
    assert snap["delivered"] == n + 1 and snap["acknowledged"] == n
    assert snap["lock_lost"] == 0 and snap["failed"] == 0
    assert conn.execute("SELECT count(*) FROM ledger").fetchone() == (n,)
    left = conn.execute("SELECT key, lock_token IS NULL FROM dq_messages WHERE queue = 'jobs'").fetchall()
    assert left == [("nack-me", True)]  # nacked by its handler, an hour away, not acknowledged


def test_backoff_and_bad_settings() -> None:
    b = Backoff(base=__import__("datetime").timedelta(seconds=1), factor=2, jitter=0)
    assert [b.delay(n).total_seconds() for n in (1, 2, 3)] == [1, 2, 4]
    assert Backoff(jitter=0).delay(100).total_seconds() == 600  # capped at 10 minutes
    with pytest.raises(InvalidArgument):
        Backoff(factor=0.5)
    with pytest.raises(InvalidArgument):
        Worker(None, print, concurrency=0)  # type: ignore[arg-type]


def test_worker_survives_its_connections_being_cut(dsn: str, db) -> None:
    """pg_terminate_backend on every connection of a running worker: it reconnects by itself and
    handles what comes after; nothing is lost."""
    with DelayedQueue(dsn, "jobs") as q:
        q.offer_many([(f"before-{i}", {"i": i}) for i in range(20)])
        ours = [r[0] for r in db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]
        proc = start_worker(dsn, "workerhandlers:record", "--idle-check", "1", "--lock-timeout", "3")
        wait_for(db, "SELECT count(*) FROM handled WHERE key LIKE 'before-%'", 20)
        idle_waiters(db)  # idle: waiting on LISTEN
        killed = db.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> ALL(%s)",
            (ours,),
        ).fetchone()[0]
        assert killed >= 1
        q.offer_many([(f"after-{i}", {"i": i}) for i in range(20)])
        wait_for(db, "SELECT count(*) FROM handled WHERE key LIKE 'after-%'", 20)
    code, out = stop(proc)
    assert code == 0, out
    assert db.execute("SELECT count(DISTINCT key) FROM handled").fetchone()[0] == 40
    assert db.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_idle_worker_stays_within_its_query_budget(dsn: str, worker_mode: str) -> None:
    """An idle worker (idle_check 2 s) does not busy-poll. Counted on the server (track_functions on
    the worker's own sessions, reported as they end) over a window its own timer measures (until it
    has re-checked the empty queue three times): it calls dq_poll_or_wait once per wake-up of its
    timer, which is the documented budget (at most one query per idle_check besides wake-ups, plus
    the first poll), and nothing else but its start-up dq_channel."""
    idle_check = 2.0
    calls, out, registrations, lifetime = idle_worker_calls(dsn, *WORKER_ARGS, idle_check=idle_check,
                                                            timer_checks=3)
    assert "worker stopped" in out, out
    assert registrations >= 4  # the first poll and three by the timer
    assert_idle_budget(calls, registrations, lifetime, idle_check)
    polls = calls["dq_poll_or_wait"]
    # nested calls only: every dq_poll_many / dq_wait came from a dq_poll_or_wait
    assert calls.get("dq_poll_many", 0) == polls, calls


@pytest.mark.parametrize("pool_mode", ["transaction", "session"])
def test_worker_behind_pgbouncer(dsn: str, db, pool_mode: str) -> None:
    """Behind a real PgBouncer. Transaction pooling: notifications cannot reach the worker; it says
    so once and falls back to timed polls (every idle_check), and still handles everything. Session
    pooling: LISTEN works, so a message offered while the worker sleeps (idle_check 30 s) is
    handled at once, and nothing is logged about it."""
    idle_check = "1" if pool_mode == "transaction" else "30"
    with testing.pgbouncer(dsn, pool_mode) as through:
        proc = start_worker(through, "workerhandlers:record", "--idle-check", idle_check, "--lock-timeout", "5")
        try:
            with DelayedQueue(through, "jobs") as q:  # the producer goes through PgBouncer too
                q.offer_many([(f"first-{i}", {"i": i}) for i in range(10)])
                wait_for(db, "SELECT count(*) FROM handled", 10)
                # idle: waiting (session pooling: on LISTEN, until wake_at, 30 s ahead)
                wake_at = min(at for _, at in idle_waiters(db))
                q.offer_many([(f"second-{i}", {"i": i}) for i in range(10)])
                wait_for(db, "SELECT count(*) FROM handled", 20)
        finally:
            code, out = stop(proc)
    if pool_mode == "session":  # handled at the notification, before the worker's timer would have woken it
        assert db.execute("SELECT max(at) < %s FROM handled", (wake_at,)).fetchone() == (True,)
    assert code == 0, out
    fallback = "notifications do not reach this connection" in out
    assert fallback is (pool_mode == "transaction"), out
    assert out.count("notifications do not reach") <= 1
    assert "prepared statement" not in out, out
    assert db.execute("SELECT count(DISTINCT key), count(*) FROM handled").fetchone() == (20, 20)
    assert db.execute("SELECT count(*) FROM dq_messages").fetchone()[0] == 0


def test_worker_drives_the_cron_schedules_with_cron_tick(dsn: str, db) -> None:
    """A schedule firing every 2 s whose lookahead is only 2 s: after dq_cron_install's first install,
    further occurrences exist only if something calls dq_cron_tick(). A worker with --cron-tick 1
    does, and handles them (the worker consumes the schedule's own queue)."""
    db.execute("SELECT dq_cron_install('beat', 'jobs', 'every 2 seconds', '{}'::jsonb, lookahead => '2 seconds')")
    proc = start_worker(dsn, "workerhandlers:record", "--idle-check", "0.5", "--cron-tick", "1")
    try:
        wait_for(db, "SELECT count(*) FROM handled", 4)
    finally:
        code, out = stop(proc)
    assert code == 0, out
    assert "cron ticker started" in out
    keys = [r[0] for r in db.execute("SELECT key FROM handled ORDER BY key")]
    assert len(keys) == len(set(keys)) >= 4
    assert all(k.startswith("beat/") for k in keys)


def test_stop_ends_an_idle_wait_at_once(dsn: str, conn, worker_mode: str) -> None:
    """stop() during an idle wait of 30 s (idle_check 30, the worker seen waiting on the server):
    run() returns at once, in a thread (Worker) as in a task (AsyncWorker), without any signal:
    before the wait's own timer would have ended it (the server's wake_at), and, as a real-time
    check with a generous bound, within 10 s."""
    if worker_mode == "sync":
        with DelayedQueue(dsn, "jobs") as q:
            worker = Worker(q, print, idle_check=30)
            t = threading.Thread(target=worker.run)
            t.start()
            ((_, wake_at),) = idle_waiters(conn)  # idle, waiting on LISTEN
            started = time.monotonic()
            worker.stop()
            t.join(timeout=HANG_S)
            elapsed = time.monotonic() - started
            assert not t.is_alive()
    else:
        async def main() -> tuple[float, datetime]:
            async with AsyncDelayedQueue(dsn, "jobs") as q:
                worker = AsyncWorker(q, print, idle_check=30)
                task = asyncio.create_task(worker.run(install_signal_handlers=False))
                ((_, wake_at),) = await asyncio.to_thread(idle_waiters, conn)
                started = time.monotonic()
                worker.stop()
                await asyncio.wait_for(task, HANG_S)
                return time.monotonic() - started, wake_at

        elapsed, wake_at = asyncio.run(main())
    assert conn.execute("SELECT clock_timestamp() < %s", (wake_at,)).fetchone() == (True,)
    assert elapsed < 10


def test_cli_sigterm_while_idle_exits_at_once_and_a_second_signal_ends_the_grace(dsn: str, db) -> None:
    """`pyqueue worker`: SIGTERM while idle (idle_check 30 s) exits 0 before the wait's own timer
    would have ended it (the server's wake_at). With a handler running (30 s) and a grace of 60 s,
    a second SIGTERM, sent once the worker said it is stopping, exits at once with status 1, saying
    so: the handler never finished."""
    idle = start_worker(dsn, "workerhandlers:record", "--idle-check", "30")
    # Started and waiting on LISTEN (its start-up may take seconds on a loaded machine).
    ((_, wake_at),) = idle_waiters(db)
    code, out = stop(idle)
    assert code == 0, out
    assert db.execute("SELECT clock_timestamp() < %s", (wake_at,)).fetchone() == (True,), out
    assert "worker stopped" in out

    with DelayedQueue(dsn, "jobs") as q:
        q.offer("long", {"sleep": 30})
    busy = start_worker(dsn, "workerhandlers:slow", "--shutdown-grace", "60", "--lock-timeout", "10")
    wait_for(db, "SELECT count(*) FROM handled WHERE phase = 'started'", 1)
    busy.send_signal(signal.SIGTERM)
    before = read_until(busy, "stopping (grace 60 s)")  # in the grace period now
    code, out = stop(busy)
    out = before + out
    assert code == 1, out
    assert "stopping (grace 60 s)" in out and "second signal" in out
    assert "worker stopped" not in out
    # exited at once: the handler (30 s) was still running, neither it nor the grace period was awaited
    assert db.execute("SELECT count(*) FROM handled WHERE phase = 'done'").fetchone() == (0,)
