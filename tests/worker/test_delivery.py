"""The worker's delivery state machine and its decisions on their own, without a database.

:class:`pyqueue.core.delivery.Deliveries` is pure bookkeeping, and :class:`pyqueue.core.delivery.WorkerCore`'s
step generators only yield the I/O they want: these tests play the driver by hand, sending each
step the result a database would give. The end-to-end behaviour is in test_worker.py.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pyqueue import DatabaseError, Message, NackOutcome, NackResult
from pyqueue.core.delivery import (
    ERROR_TEXT_CHARS,
    HANDLER_WAIT_S,
    LATENESS_BUCKETS_MS,
    TRANSITIONS,
    Backoff,
    Deliveries,
    Delivery,
    DeliveryStateError,
    Runners,
    State,
    WorkerCore,
    WorkerStats,
    error_text,
)
from pyqueue.core.steps import (
    AckMany,
    CountHeld,
    Drain,
    ExtendLock,
    HandlersFinished,
    HeartbeatWait,
    JoinSpawned,
    Nack,
    PollMessages,
    ReleaseMany,
    SleepUnlessStopped,
    Spawn,
    StartHandlers,
    Stepper,
    WaitForHandlers,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LOCK = timedelta(seconds=30)


def message(key: str = "k", *, delivery_count: int = 1, late_ms: float = 0) -> Message:
    """A delivery as dq_poll_many returns it: claimed ``late_ms`` after it was due, lock of 30 s."""
    due = T0
    return Message(id=1, queue="jobs", key=key, raw_payload=b"x", payload_type="text", scheduled_at=due,
                   scheduled_at_initially=due, created_at=due, delivery_count=delivery_count,
                   lock_token=uuid.uuid4(), locked_until=due + timedelta(milliseconds=late_ms) + LOCK)


def settle(m: Message, how: str) -> None:
    """What ``Message.ack``/``nack`` record once the database answered true (possibly in the
    handler's own transaction)."""
    object.__setattr__(m, "settled", how)


def book() -> Deliveries:
    return Deliveries(WorkerStats())


# -- the transitions --------------------------------------------------------------------------------

def test_transitions_are_those_of_the_documented_machine() -> None:
    assert TRANSITIONS == {
        State.RUNNING: {State.LOST, State.DONE, State.FAILED, State.SETTLED, State.RELEASED},
        State.LOST: {State.SETTLED, State.RELEASED},
        State.DONE: set(), State.FAILED: set(), State.SETTLED: set(), State.RELEASED: set(),
    }


def test_returned_is_done_and_acknowledged_in_one_batch() -> None:
    b = book()
    ds = [b.received(message(f"k{i}"), 0) for i in range(3)]
    assert [d.state for d in ds] == [State.RUNNING] * 3
    assert b.to_extend() == ds
    assert [b.returned(d) for d in ds[:2]] == [State.DONE, State.DONE]
    assert b.to_extend() == ds[2:]
    tokens = b.take_acks()
    assert tokens == [d.lock_token for d in ds[:2]]
    assert b.take_acks() == []
    b.acked(tokens, 1)  # one of them had lost its lock meanwhile
    snap = b.stats.snapshot()
    assert (snap["delivered"], snap["acknowledged"], snap["lock_lost"], snap["failed"]) == (3, 1, 1, 0)
    assert len(b) == 1


def test_raised_is_failed_unless_the_lock_was_lost() -> None:
    b = book()
    failing, lost = b.received(message("a"), 0), b.received(message("b"), 0)
    assert b.lock_lost(lost) is True
    assert lost.state is State.LOST and b.to_extend() == [failing]
    assert b.raised(failing) is State.FAILED
    assert b.raised(lost) is State.LOST  # nothing to nack: the token is stale
    assert b.take_acks() == [] and len(b) == 0
    snap = b.stats.snapshot()
    assert (snap["failed"], snap["lock_lost"], snap["acknowledged"]) == (2, 1, 0)


def test_lost_then_returned_is_not_acknowledged_nor_counted_twice() -> None:
    b = book()
    d = b.received(message(), 0)
    assert b.lock_lost(d) is True
    assert b.lock_lost(d) is False  # the heartbeat does not extend (nor count) a lost one again
    assert b.to_extend() == []
    assert b.returned(d) is State.LOST
    assert b.take_acks() == []
    assert b.stats.snapshot()["lock_lost"] == 1


@pytest.mark.parametrize("how", ["acked", "nacked"])
def test_settled_by_the_handler(how: str) -> None:
    b = book()
    d = b.received(message(), 0)
    settle(d.message, how)
    assert b.to_extend() == []  # the heartbeat leaves it alone while the handler still runs
    assert b.lock_lost(d) is False  # its own ack/nack removed the lock: not a lost lock
    assert b.returned(d) is State.SETTLED
    assert b.take_acks() == []
    snap = b.stats.snapshot()
    assert (snap["acknowledged"], snap["lock_lost"]) == ((1 if how == "acked" else 0), 0)


def test_settled_after_the_heartbeat_reported_it_lost_counts_as_settled() -> None:
    """The handler's own ack deleted the row just before the heartbeat's extend: LOST → SETTLED."""
    b = book()
    d = b.received(message(), 0)
    assert b.lock_lost(d) is True
    settle(d.message, "acked")
    assert b.returned(d) is State.SETTLED
    assert b.stats.snapshot()["acknowledged"] == 1


def test_a_heartbeat_racing_a_finished_handler_changes_nothing() -> None:
    b = book()
    d = b.received(message(), 0)
    listed = b.to_extend()
    assert b.returned(d) is State.DONE
    assert listed == [d] and b.lock_lost(d) is False  # its extend found the acknowledged row gone
    assert d.state is State.DONE and b.stats.snapshot()["lock_lost"] == 0


def test_illegal_transitions_raise() -> None:
    b = book()
    d = b.received(message(), 0)
    b.returned(d)
    with pytest.raises(DeliveryStateError):
        b.returned(d)
    with pytest.raises(DeliveryStateError):
        b.raised(d)
    twice = message()
    b.received(twice, 0)
    with pytest.raises(DeliveryStateError):
        b.received(twice, 0)
    for state, allowed in TRANSITIONS.items():
        for to in set(State) - allowed:
            with pytest.raises(DeliveryStateError):
                Deliveries._move(Delivery(message(), state), to)


# -- the decisions ----------------------------------------------------------------------------------

class Core(WorkerCore[None, Any]):
    _log = logging.getLogger("test")

    def _setup(self) -> None:
        self._runners = Runners(self.concurrency)

    def stop(self) -> None:
        self._request_stop()


def core(**settings: Any) -> Core:
    options: dict[str, Any] = {"concurrency": 4, "batch_size": None, "lock_timeout": LOCK, "idle_check": 5,
                               "backoff": Backoff(jitter=0), "shutdown_grace": 1, "cron_tick": None}
    options.update(settings)
    return Core(None, print, **options)


def test_settings_are_checked_as_durations() -> None:
    from pyqueue import InvalidArgument

    c = core(lock_timeout=1.5, idle_check=timedelta(seconds=2), shutdown_grace=3)
    assert (c.lock_timeout, c.idle_check, c.shutdown_grace) == (timedelta(seconds=1.5), timedelta(seconds=2), 3.0)
    for bad in ({"lock_timeout": 0}, {"idle_check": -1}, {"shutdown_grace": timedelta(0)}, {"cron_tick": 0},
                {"concurrency": 0}, {"batch_size": 10001}, {"prefetch": -1}, {"prefetch": 10001}):
        with pytest.raises(InvalidArgument):
            core(**bad)


def test_run_loop_polls_free_slots_waits_idle_only_when_nothing_runs_and_acks_beside() -> None:
    c = core(concurrency=2, prefetch=0)
    steps = Stepper(c.run_steps("jobs"))
    assert steps.step(None) == CountHeld()
    assert steps.step(0) == PollMessages(2, True)  # nothing runs: an idle wait for 2
    a, b = message("a", late_ms=7), message("b")
    op = steps.step([a, b])
    assert isinstance(op, StartHandlers) and [d.message for d in op.deliveries] == [a, b]
    assert steps.step(None) == CountHeld()
    assert steps.step(2) == WaitForHandlers(HANDLER_WAIT_S)  # every slot busy, no prefetch
    c._deliveries.returned(c._deliveries.to_extend()[0])
    assert steps.step(None) == CountHeld()
    op = steps.step(1)
    assert op is not None and isinstance(op, Spawn)  # the finished one's ack goes out beside the run loop
    acking = Stepper(op.steps)
    assert acking.step(None) == AckMany([a.lock_token])
    # The last poll came back full (2 of 2): the next is a plain poll even though only 1 slot is free,
    # and it does not wait for the acknowledgement.
    assert steps.step(None) == PollMessages(1, False)
    assert steps.step([]) == WaitForHandlers(HANDLER_WAIT_S)  # nothing new while one handler runs
    assert steps.step(None) == CountHeld()
    assert steps.step(1) == PollMessages(1, False)  # one acknowledgement at a time: none spawned meanwhile
    assert steps.step([]) == WaitForHandlers(HANDLER_WAIT_S)
    c.stop()
    assert steps.step(None) == Drain(1.0)  # the grace period
    assert steps.step(0) == HandlersFinished()
    assert steps.step(None) == JoinSpawned()  # the acknowledgement beside the run loop ends first
    assert acking.step(1) is None
    assert not c._acking
    assert steps.step(None) is None
    snap = c.stats.snapshot()
    assert snap["delivered"] == 2 and snap["acknowledged"] == 1
    assert snap["lateness_ms"][str(LATENESS_BUCKETS_MS[2])] == 1  # 7 ms: the 10 ms bucket


def test_run_loop_prefetches_one_batch_while_every_slot_is_busy() -> None:
    c = core(concurrency=2, batch_size=2)  # prefetch: one batch (2) by default
    assert c.prefetch == 2
    steps = Stepper(c.run_steps("jobs"))
    steps.step(None)
    assert steps.step(0) == PollMessages(2, True)
    op = steps.step([message("a"), message("b")])
    assert isinstance(op, StartHandlers) and len(op.deliveries) == 2
    assert steps.step(None) == CountHeld()
    assert steps.step(2) == PollMessages(2, False)  # both slots busy: the next batch, to wait for a slot
    op = steps.step([message("c"), message("d")])
    assert isinstance(op, StartHandlers) and len(op.deliveries) == 2
    assert steps.step(None) == CountHeld()
    assert steps.step(4) == WaitForHandlers(HANDLER_WAIT_S)  # 2 running, 2 waiting: nothing more is polled
    assert steps.step(None) == CountHeld()
    assert steps.step(3) == WaitForHandlers(HANDLER_WAIT_S)  # room for 1, not for a batch: no poll of 1
    assert steps.step(None) == CountHeld()
    assert steps.step(1) == PollMessages(2, False)  # a slot is free: poll what fits (at most a batch)
    c.stop()
    assert steps.step([]) == WaitForHandlers(HANDLER_WAIT_S)
    assert steps.step(None) == Drain(1.0)
    assert steps.step(0) == HandlersFinished()
    assert steps.step(None) is None


def test_stop_releases_what_waits_for_a_slot_and_starts_nothing_more() -> None:
    """Stopped with one handler running and two messages polled ahead waiting for the slot: the two
    are released in one dq_release (not started, not left locked), then the grace period for the
    running one; a waiting one whose lock the heartbeat found lost is not sent."""
    c = core(concurrency=1, batch_size=3)
    steps = Stepper(c.run_steps("jobs"))
    assert steps.step(None) == CountHeld()
    assert steps.step(0) == PollMessages(3, True)
    a, b, d = message("a"), message("b"), message("d")
    op = steps.step([a, b, d])
    assert isinstance(op, StartHandlers)
    for delivery in op.deliveries:
        c._runners.add(delivery)  # what the driver does: the first is taken by a runner, two wait
    first, _ = c._runners.take()
    assert first is not None and first.message is a
    lost = op.deliveries[2]
    assert c._deliveries.lock_lost(lost)  # the heartbeat found d's lock gone while it waited
    c.stop()
    assert steps.step(None) == ReleaseMany([b.lock_token])
    assert steps.step(1) == Drain(1.0)
    assert [x.state for x in op.deliveries] == [State.RUNNING, State.RELEASED, State.RELEASED]
    assert c._deliveries.to_extend() == [first]  # the heartbeat extends the running one only
    assert c._runners.held == 1
    c._deliveries.returned(first)
    assert steps.step(0) == HandlersFinished()
    assert steps.step(None) == AckMany([a.lock_token])
    assert steps.step(1) is None
    snap = c.stats.snapshot()
    assert (snap["delivered"], snap["acknowledged"], snap["released"], snap["lock_lost"]) == (3, 1, 1, 1)


def test_a_poll_that_returns_after_the_stop_releases_its_messages() -> None:
    c = core(concurrency=2)
    steps = Stepper(c.run_steps("jobs"))
    steps.step(None)
    assert steps.step(0) == PollMessages(2, True)
    a, b = message("a"), message("b")
    c.stop()  # while the poll runs
    assert steps.step([a, b]) == ReleaseMany([a.lock_token, b.lock_token])
    assert steps.step(2) == Drain(1.0)
    assert steps.step(0) == HandlersFinished()
    assert steps.step(None) is None
    assert c.stats.snapshot()["released"] == 2


def test_a_failed_release_is_logged_and_the_worker_still_stops(caplog: pytest.LogCaptureFixture) -> None:
    c = core(concurrency=2)
    steps = Stepper(c.run_steps("jobs"))
    steps.step(None)
    steps.step(0)
    c.stop()
    assert isinstance(steps.step([message("a")]), ReleaseMany)
    assert steps.step(error=DatabaseError("gone")) == Drain(1.0)
    assert "releasing 1 messages polled ahead failed" in caplog.text
    assert c.stats.snapshot()["released"] == 0


@pytest.mark.parametrize(("concurrency", "batch_size", "prefetch", "held", "want"), [
    (4, 4, 0, 0, 4), (4, 4, 0, 3, 1), (4, 4, 0, 4, 0),  # no prefetch: the free slots
    (4, 4, 4, 4, 4), (4, 4, 4, 5, 0), (4, 4, 4, 7, 0),  # a whole batch ahead, or nothing
    (4, 2, 4, 4, 2), (4, 2, 4, 6, 2), (4, 2, 4, 7, 0),  # batches of 2, up to 4 waiting
    (4, 4, 1, 4, 1), (4, 4, 1, 5, 0),  # a prefetch smaller than a batch
    (100, 100, 100, 99, 100), (100, 100, 100, 150, 0),
])
def test_poll_size(concurrency: int, batch_size: int, prefetch: int, held: int, want: int) -> None:
    assert core(concurrency=concurrency, batch_size=batch_size, prefetch=prefetch)._poll_size(held) == want


def test_failed_poll_backs_off_and_stop_ends_it() -> None:
    c = core()
    steps = Stepper(c.run_steps("jobs"))
    steps.step(None)
    assert steps.step(0) == PollMessages(4, True)
    op = steps.step(None, DatabaseError("server closed the connection"))
    assert op is not None and isinstance(op, SleepUnlessStopped) and 0.4 <= op.seconds <= 0.6
    assert steps.step(None) == CountHeld()
    assert steps.step(0) == PollMessages(4, True)
    op = steps.step(None, DatabaseError("still down"))
    assert op is not None and isinstance(op, SleepUnlessStopped) and 0.8 <= op.seconds <= 1.2  # doubled
    c.stop()
    assert steps.step(None) == Drain(1.0)


def test_ack_is_retried_once() -> None:
    c = core()
    d = c._received(message())
    c._deliveries.returned(d)
    steps = Stepper(c._flush_steps())
    assert steps.step(None) == AckMany([d.lock_token])
    assert steps.step(None, DatabaseError("cut")) == AckMany([d.lock_token])
    assert steps.step(1) is None
    assert c.stats.snapshot()["acknowledged"] == 1


def test_handler_failure_is_nacked_with_the_backoff() -> None:
    c = core()
    d = c._received(message(delivery_count=3))
    steps = Stepper(c.failed_steps(d, ValueError("bad")))
    assert steps.step(None) == Nack(d.message, timedelta(seconds=4), "ValueError: bad")
    assert d.state is State.FAILED
    # The nack says where the message went (its queue, or the dead-letter queue at max_deliveries):
    # nothing more is asked for the log.
    assert steps.step(NackResult(NackOutcome.RETRIED, T0)) is None
    lost = c._received(message())
    c._deliveries.lock_lost(lost)
    assert Stepper(c.failed_steps(lost, ValueError("late"))).step(None) is None  # nothing to nack
    assert lost.state is State.LOST


def test_backoff_is_the_cap_however_many_deliveries_failed() -> None:
    """factor ** (delivery_count - 1) leaves the floats past 1024 deliveries with factor 2 (a week
    of 10-minute retries): the delay is then the cap, not an OverflowError out of the nack."""
    backoff = Backoff(jitter=0)
    assert backoff.delay(1) == timedelta(seconds=1)
    for count in (11, 1025, 10**6):
        assert backoff.delay(count) == timedelta(minutes=10)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() fails")

    def __repr__(self) -> str:
        raise RuntimeError("repr() fails")


class NotAString(Exception):
    def __str__(self) -> Any:
        return 42


class Halt(BaseException):
    pass


@pytest.mark.parametrize(("exc", "text"), [
    (ValueError("bad"), "ValueError: bad"),
    (RuntimeError(), "RuntimeError"),
    (SystemExit(3), "SystemExit: 3"),
    (KeyboardInterrupt(), "KeyboardInterrupt"),
    (Halt("own"), "Halt: own"),
    (Unprintable(), "Unprintable: <str() raised RuntimeError>"),
    (NotAString(), "NotAString: <str() raised TypeError>"),
    (ValueError("nul \x00 lone surrogate \udc80"), "ValueError: nul \\x00 lone surrogate \\udc80"),
    (ValueError("x" * 5000), "ValueError: " + "x" * (ERROR_TEXT_CHARS - len("ValueError: "))),
])
def test_error_text_describes_any_exception_in_text_the_database_stores(exc: BaseException, text: str) -> None:
    assert error_text(exc) == text
    error_text(exc).encode("utf-8")  # no lone surrogate: psycopg sends it
    assert "\x00" not in error_text(exc)


def test_a_failure_whatever_it_raised_is_nacked_and_a_failing_nack_is_only_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """failed_steps takes any BaseException; the nack's own failure, whatever its kind, ends the
    steps with a log line (the lock expires) instead of leaving them by an exception."""
    c = core()
    d = c._received(message())
    steps = Stepper(c.failed_steps(d, Unprintable()))
    assert steps.step(None) == Nack(d.message, timedelta(seconds=1), "Unprintable: <str() raised RuntimeError>")
    assert steps.step(None, UnicodeEncodeError("utf-8", "\udc80", 0, 1, "surrogates not allowed")) is None
    assert d.state is State.FAILED and len(c._deliveries) == 0
    assert any("nack failed: UnicodeEncodeError" in r.getMessage() for r in caplog.records)
    assert not c._stopping


def test_keyboard_interrupt_from_a_handler_is_nacked_and_stops_the_worker() -> None:
    c = core()
    d = c._received(message())
    steps = Stepper(c.failed_steps(d, KeyboardInterrupt()))
    assert steps.step(None) == Nack(d.message, timedelta(seconds=1), "KeyboardInterrupt")
    assert c._stopping  # stop() was called: the run loop polls no more
    assert steps.step(NackResult(NackOutcome.DEAD_LETTERED, dead_letter_queue="dlq")) is None


def test_heartbeat_extends_running_ones_and_marks_lost_locks() -> None:
    c = core()
    keep, lose, own = (c._received(message(k)) for k in "abc")
    settle(own.message, "acked")
    steps = Stepper(c.heartbeat_steps())
    assert steps.step(None) == HeartbeatWait(10.0)
    assert steps.step(False) == ExtendLock(keep.message, LOCK)
    assert steps.step(T0) == ExtendLock(lose.message, LOCK)
    assert steps.step(None) == HeartbeatWait(10.0)
    assert (keep.state, lose.state, own.state) == (State.RUNNING, State.LOST, State.RUNNING)
    assert steps.step(True) is None  # finished


# -- the handler slots ------------------------------------------------------------------------------

def test_runners_ramp_up_one_at_a_time_up_to_concurrency() -> None:
    r = Runners(2)
    d = [Delivery(message(f"k{i}")) for i in range(4)]
    assert r.add(d[0]) is True  # a first runner
    assert r.add(d[1]) is False  # one is starting: it takes what waits
    r.started()
    assert r.take() == (d[0], True)  # d1 still waits and none is starting: one more
    r.started()
    assert r.take() == (d[1], False)  # nothing else waits
    assert r.add(d[2]) is False and r.add(d[3]) is False  # 2 runners, the concurrency
    assert r.held == 4
    r.ended()
    assert r.take() == (d[2], False)  # the first runner goes on with the next one
    r.ended()
    assert r.take() == (d[3], False)
    r.ended()
    r.ended()
    assert r.take() == (None, False) and r.take() == (None, False)  # both runners end
    assert r.held == 0
    assert r.add(Delivery(message("again"))) is True  # and a new one starts for the next delivery
    r.not_started()
    assert r.add(Delivery(message("after"))) is True


def test_runners_never_strand_a_delivery_nor_exceed_concurrency_under_threads() -> None:
    """Real threads: a producer adds 5,000 deliveries in bursts while runners (pool jobs, as in the
    thread worker) take them; every delivery runs exactly once and at most 4 run at once."""
    import random
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    ends: list[int] = []
    r = Runners(4, lambda: ends.append(1))
    pool = ThreadPoolExecutor(4)
    ran: list[Delivery] = []
    lock = threading.Lock()
    running = peak = 0

    def runner() -> None:
        nonlocal running, peak
        for delivery, one_more in r.run():
            if one_more:
                pool.submit(runner)
            with lock:
                running += 1
                peak = max(peak, running)
            if random.random() < 0.01:
                time.sleep(0.001)
            with lock:
                running -= 1
                ran.append(delivery)

    added = [Delivery(message(f"k{i}")) for i in range(5000)]
    for i, delivery in enumerate(added):
        if r.add(delivery):
            pool.submit(runner)
        if i % 100 == 99:
            time.sleep(0.002)
    deadline = time.monotonic() + 30
    while r.held and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.shutdown(wait=True)
    assert r.held == 0
    assert sorted(map(id, ran)) == sorted(map(id, added))
    assert 1 <= peak <= 4
    assert len(ends) == 5000  # on_end after every handler


def test_a_runner_closed_mid_handler_still_counts_the_end() -> None:
    """A runner task cancelled while its handler runs (after the grace period) leaves its loop."""
    r = Runners(1)
    assert r.add(Delivery(message("a")))
    life = r.run()
    delivery, one_more = next(life)
    assert r.held == 1
    life.close()  # what unwinding the runner does
    assert r.held == 0
