"""The worker's core, written once for :class:`pyqueue.Worker` and :class:`pyqueue.aio.AsyncWorker`.

Two parts, neither doing any I/O:

* :class:`Deliveries`, the bookkeeping: one :class:`Delivery` record per lock token, in an
  explicit :class:`State` (running → done | failed | lost | settled by the handler; the
  transitions of docs/state_machine.md, "The worker's deliveries"), and the :class:`WorkerStats`
  counters, all under one lock. An illegal transition raises :class:`DeliveryStateError`.
* :class:`WorkerCore`, every decision of a worker (when to poll and how many messages, when to wait
  idle, flushing acknowledgements, the grace period, what the heartbeat extends, the nack after a
  failure, the backoff after failed polls) as *step generators*: each yields the I/O it needs as a
  worker step of :mod:`pyqueue.core.steps` (:class:`~pyqueue.core.steps.PollMessages`,
  :class:`~pyqueue.core.steps.StartHandlers`, :class:`~pyqueue.core.steps.AckMany` …), and its
  driver (threads in ``Worker``, tasks in ``AsyncWorker``) performs it and sends back the result,
  or throws in what the I/O raised. Threads, signals and the cron ticker belong to the drivers.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar
from uuid import UUID

from ..durations import Seconds, as_timedelta, format_duration
from ..errors import ConnectionFailed, InvalidArgument, PyQueueError
from ..limits import POLL_MAX_COUNT
from ..model import NackOutcome, NackResult
from .middleware import HandlerCall, chain, check_middleware, notified, wraps
from .steps import (
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
    WaitForHandlers,
    WorkerSteps,
)

__all__ = [
    "Backoff", "Delivery", "DeliveryStateError", "Deliveries", "Runners", "State", "WorkerCore", "WorkerStats",
    "error_text",
]

LATENESS_BUCKETS_MS = (1, 5, 10, 50, 100, 500, 1000, 5000, float("inf"))

#: Waits after consecutive failed polls (the database unreachable): 0.5 s doubling up to 30 s.
RECONNECT_BASE_S = 0.5
RECONNECT_CAP_S = 30.0

#: How long a worker with every handler slot busy, or with nothing new to poll while handlers
#: run, waits for one of them to finish before it looks again (seconds).
HANDLER_WAIT_S = 0.5

#: Most characters of the error text a worker stores with a nack (``dq_nack`` takes up to
#: :data:`pyqueue.limits.ERROR_CHARS`; a traceback-sized text is not useful in the queue).
ERROR_TEXT_CHARS = 2000


def error_text(exc: BaseException) -> str:
    """What a worker stores as a failed message's last error and logs: ``TypeName: str(exc)``, or
    ``TypeName`` alone when ``str(exc)`` is empty, at most :data:`ERROR_TEXT_CHARS` characters.

    Never raises, whatever ``exc`` is: when ``str(exc)`` raises (or returns something else than a
    str) the text says so (``TypeName: <str() raised RuntimeError>``); NUL characters and lone
    surrogates, which PostgreSQL's text cannot hold, are written as backslash escapes (``\\x00``,
    ``\\udc80``), so the ``dq_nack`` that stores the text cannot fail because of it.

    :param exc: what a handler raised (any :class:`BaseException`).
    :returns: the text (str).
    """
    try:
        name = type(exc).__name__
        try:
            detail = str(exc)
            if type(detail) is not str:  # a str subclass whose own methods could raise
                detail = str.__str__(detail)
        except BaseException as str_exc:  # formatting an error must never fail
            detail = f"<str() raised {type(str_exc).__name__}>"
        text = f"{name}: {detail}" if detail else name
        text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    except BaseException:  # e.g. a __name__ that is not a str
        text = "<an exception that cannot be described>"
    return text[:ERROR_TEXT_CHARS]


@dataclass(frozen=True)
class Backoff:
    """Delay before a failed message is delivered again: ``base * factor**(delivery_count - 1)``,
    capped at ``cap``, then multiplied by a random factor in ``[1 - jitter, 1 + jitter]``.

    :param base: first retry delay (timedelta, > 0).
    :param factor: growth per delivery (≥ 1).
    :param cap: longest delay (timedelta, ≥ ``base``).
    :param jitter: relative spread, 0 ≤ jitter < 1 (spreads retries of messages that failed together).
    :raises InvalidArgument: any of these out of range.
    """

    base: timedelta = timedelta(seconds=1)
    factor: float = 2.0
    cap: timedelta = timedelta(minutes=10)
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.factor < 1 or not 0 <= self.jitter < 1 or self.base <= timedelta(0) or self.cap < self.base:
            raise InvalidArgument("Backoff needs base > 0, cap >= base, factor >= 1 and 0 <= jitter < 1")

    def delay(self, delivery_count: int) -> timedelta:
        """The nack delay after the ``delivery_count``-th delivery failed; the cap for any count
        whose ``base * factor**(delivery_count - 1)`` exceeds it, however large."""
        try:
            raw = self.base.total_seconds() * self.factor ** max(delivery_count - 1, 0)
        except OverflowError:  # factor ** n beyond a float (n > 1023 with factor 2): far past the cap
            raw = float("inf")
        capped = min(raw, self.cap.total_seconds())
        return timedelta(seconds=capped * random.uniform(1 - self.jitter, 1 + self.jitter))


@dataclass
class WorkerStats:
    """Counters a caller can read or export; updated under a lock, read with :meth:`snapshot`.

    ``delivered``: messages received from polls; ``acknowledged``: by the worker's ``dq_ack`` or by
    the handler itself; ``released``: polled ahead and given back unstarted when the worker stopped
    (``dq_release``); ``failed``: handlers that raised; ``retried`` and ``dead_lettered``: failed
    deliveries whose nack gave the message back to its queue, or moved it to its dead-letter queue
    (the queue's ``max_deliveries`` reached); ``lock_lost``: deliveries whose lock was
    gone when the heartbeat extended it, when the worker acknowledged it or when it nacked it. ``lateness_ms`` counts
    deliveries by (claim time − due time) on the database clock, in the buckets of
    ``LATENESS_BUCKETS_MS`` (upper bounds, milliseconds).
    """

    delivered: int = 0
    acknowledged: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lock_lost: int = 0
    released: int = 0
    lateness_ms: list[int] = field(default_factory=lambda: [0] * len(LATENESS_BUCKETS_MS))
    lateness_sum_ms: float = 0.0  #: the sum of every delivery's lateness counted in ``lateness_ms``
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def snapshot(self) -> dict[str, Any]:
        """The counters as a dict (``lateness_ms`` keyed by the bucket's upper bound as text)."""
        with self._lock:
            return {
                "delivered": self.delivered,
                "acknowledged": self.acknowledged,
                "failed": self.failed,
                "retried": self.retried,
                "dead_lettered": self.dead_lettered,
                "lock_lost": self.lock_lost,
                "released": self.released,
                "lateness_ms": dict(zip((str(b) for b in LATENESS_BUCKETS_MS), self.lateness_ms, strict=True)),
                "lateness_sum_ms": self.lateness_sum_ms,
            }


class State(enum.Enum):
    """Where one delivery stands in a worker (docs/state_machine.md, "The worker's deliveries")."""

    RUNNING = "running"  #: its handler runs; the heartbeat extends its lock
    LOST = "lost"  #: the heartbeat found its lock gone while the handler ran: nothing will be sent for it
    DONE = "done"  #: the handler returned: acknowledged with the next dq_ack_many(uuid[])
    FAILED = "failed"  #: the handler raised: nacked with the backoff
    SETTLED = "settled"  #: the handler acknowledged or nacked it itself: nothing more is sent
    RELEASED = "released"  #: the worker stopped before its handler started: given back with dq_release


#: The legal transitions. RUNNING and LOST are the states of a running handler; every handler
#: ends in DONE, FAILED, SETTLED or (its lock lost) LOST, and the record leaves the book then
#: (DONE: when its acknowledgement is sent).
TRANSITIONS: dict[State, frozenset[State]] = {
    State.RUNNING: frozenset({State.LOST, State.DONE, State.FAILED, State.SETTLED, State.RELEASED}),
    State.LOST: frozenset({State.SETTLED, State.RELEASED}),
    State.DONE: frozenset(),
    State.FAILED: frozenset(),
    State.SETTLED: frozenset(),
    State.RELEASED: frozenset(),
}


# TRANSITIONS by the state's value, as tuples: on the worker's hot path an Enum member's hash (a
# Python-level method) costs more than the whole check (measured: 1 us a delivery).
_ALLOWED: dict[str, tuple[State, ...]] = {state.value: tuple(to) for state, to in TRANSITIONS.items()}


class DeliveryStateError(RuntimeError):
    """A transition that docs/state_machine.md does not allow (a bug in the worker, not in the handler)."""


@dataclass(eq=False, slots=True)
class Delivery:
    """One delivery a worker holds: the message (a :class:`pyqueue.Message` or
    :class:`pyqueue.aio.AsyncMessage`), its lock token and its :class:`State`. ``message.settled``
    tells whether the handler acknowledged or nacked it itself."""

    message: Any
    lock_token: UUID = field(init=False)
    state: State = State.RUNNING
    running: bool = True  #: False once the handler ended

    def __post_init__(self) -> None:
        self.lock_token = self.message.lock_token


class Deliveries:
    """The deliveries of one worker, by lock token, and its counters; thread-safe (one lock, the
    counters' own), no I/O.

    :param stats: the counters to keep up to date (their lock guards the records too).
    """

    def __init__(self, stats: WorkerStats) -> None:
        self.stats = stats
        self._lock = stats._lock
        self._running: dict[UUID, Delivery] = {}  # handler still running: RUNNING or LOST
        self._to_ack: list[UUID] = []  # DONE, to acknowledge with the next dq_ack_many(uuid[])

    def __len__(self) -> int:
        """Deliveries still held: handlers running, and finished ones not yet acknowledged."""
        with self._lock:
            return len(self._running) + len(self._to_ack)

    @staticmethod
    def _move(delivery: Delivery, to: State) -> None:
        if to not in _ALLOWED[delivery.state._value_]:
            raise DeliveryStateError(f"delivery {delivery.lock_token}: {delivery.state.value} -> {to.value}")
        delivery.state = to

    def received(self, message: Any, lateness_bucket: int, lateness_ms: float = 0.0) -> Delivery:
        """A polled message whose handler is about to start: a RUNNING record.

        :param lateness_bucket: index into ``LATENESS_BUCKETS_MS`` of its claim time − due time.
        :param lateness_ms: that time, in milliseconds (≥ 0).
        :raises DeliveryStateError: the worker already holds this lock token.
        """
        delivery = Delivery(message)
        with self._lock:
            if delivery.lock_token in self._running:
                raise DeliveryStateError(f"delivery {delivery.lock_token} received twice")
            self._running[delivery.lock_token] = delivery
            self.stats.delivered += 1
            self.stats.lateness_ms[lateness_bucket] += 1
            self.stats.lateness_sum_ms += lateness_ms
        return delivery

    def _end(self, delivery: Delivery) -> None:
        if not delivery.running or self._running.pop(delivery.lock_token, None) is not delivery:
            raise DeliveryStateError(f"delivery {delivery.lock_token}: its handler ended twice")
        delivery.running = False

    def returned(self, delivery: Delivery) -> State:
        """The handler returned: SETTLED when it settled the message itself (counted acknowledged if
        it acked), else DONE (queued for :meth:`take_acks`), or LOST when the lock was lost first.

        :raises DeliveryStateError: the handler of this delivery ended before.
        """
        with self._lock:
            self._end(delivery)
            if delivery.message.settled is not None:
                # Settled by the handler (e.g. acknowledged in its own transaction): nothing left to
                # send, and a lock the heartbeat reported lost meanwhile was released by that ack/nack.
                self._move(delivery, State.SETTLED)
                if delivery.message.settled == "acked":
                    self.stats.acknowledged += 1
            elif delivery.state is State.RUNNING:
                self._move(delivery, State.DONE)
                self._to_ack.append(delivery.lock_token)
        return delivery.state

    def raised(self, delivery: Delivery) -> State:
        """The handler raised: FAILED (to be nacked), or LOST when its lock was lost (nothing to nack).

        :raises DeliveryStateError: the handler of this delivery ended before.
        """
        with self._lock:
            self._end(delivery)
            self.stats.failed += 1
            if delivery.state is State.RUNNING:
                self._move(delivery, State.FAILED)
        return delivery.state

    def released(self, deliveries: Sequence[Delivery]) -> list[UUID]:
        """The worker stops before these deliveries' handlers started: each RELEASED (its record
        ends, the heartbeat leaves it alone); returns the lock tokens to give back with
        ``dq_release``, those that were RUNNING (a LOST one holds nothing any more).

        :raises DeliveryStateError: the handler of one of them ran.
        """
        tokens: list[UUID] = []
        with self._lock:
            for delivery in deliveries:
                self._end(delivery)
                if delivery.state is State.RUNNING:
                    tokens.append(delivery.lock_token)
                self._move(delivery, State.RELEASED)
        return tokens

    def counted_released(self, released: int) -> None:
        """``dq_release`` gave back this many (the others had lost their locks)."""
        with self._lock:
            self.stats.released += released

    def to_extend(self) -> list[Delivery]:
        """The RUNNING deliveries whose handlers have not settled them: what the heartbeat extends."""
        with self._lock:
            return [d for d in self._running.values() if d.state is State.RUNNING and d.message.settled is None]

    def lock_lost(self, delivery: Delivery) -> bool:
        """The heartbeat's extend found no lock: RUNNING → LOST, counted; True.

        False, and nothing changes, when the handler has ended or settled the message since the
        heartbeat listed it (its own ack or nack removed the lock; a worker's acknowledgement counts
        a lost lock itself, :meth:`acked`), or when the delivery is already LOST.
        """
        with self._lock:
            if not delivery.running or delivery.state is not State.RUNNING or delivery.message.settled is not None:
                return False
            self._move(delivery, State.LOST)
            self.stats.lock_lost += 1
        return True

    def acks_pending(self) -> bool:
        """Whether some DONE delivery waits for its acknowledgement (read without the lock: a list's
        length is read atomically, and a token recorded just after is sent with the next one)."""
        return bool(self._to_ack)

    def take_acks(self) -> list[UUID]:
        """The lock tokens of the DONE deliveries, removed from the book: send them in one dq_ack."""
        with self._lock:
            tokens, self._to_ack = self._to_ack, []
        return tokens

    def nacked(self, outcome: NackOutcome) -> None:
        """The nack of a FAILED delivery answered ``outcome``: counted retried or dead-lettered (a
        STALE one, whose lock was lost, counted lost)."""
        with self._lock:
            if outcome is NackOutcome.RETRIED:
                self.stats.retried += 1
            elif outcome is NackOutcome.DEAD_LETTERED:
                self.stats.dead_lettered += 1
            else:
                self.stats.lock_lost += 1

    def acked(self, tokens: list[UUID], acknowledged: int) -> None:
        """``dq_ack(tokens)`` acknowledged this many: the others had lost their locks."""
        with self._lock:
            self.stats.acknowledged += acknowledged
            self.stats.lock_lost += len(tokens) - acknowledged


class Runners:
    """The handler slots of a worker: deliveries wait here for a *runner* (a pool job or a task that
    runs handlers one after the other until none waits), at most ``concurrency`` runners at once.
    A batch of fast handlers then costs one runner rather than one job or task per message, and
    slow ones ramp up to ``concurrency`` runners: a runner adds one more as it starts a handler
    while deliveries still wait and no other runner is starting. Thread-safe (one lock), no I/O.

    Invariant: while a delivery waits, a runner is starting, or ``concurrency`` runners run (each
    takes the next delivery when its handler ends), or one running runner has yet to look again.
    """

    def __init__(self, concurrency: int, on_end: Callable[[], object] = lambda: None) -> None:
        self.concurrency = concurrency
        self._on_end = on_end  # called after each handler's end is counted (wakes the run loop)
        self._lock = threading.Lock()
        self._waiting: deque[Delivery] = deque()
        self._held = 0  # deliveries added whose handlers have not ended
        self._runners = 0  # runners counted, started or starting
        self._starting = 0  # runners counted but not started

    @property
    def held(self) -> int:
        """Deliveries added whose handlers have not ended (running or waiting)."""
        return self._held

    def counts(self) -> tuple[int, int]:
        """(handlers running, deliveries waiting for a runner) now, read together."""
        with self._lock:
            return self._held - len(self._waiting), len(self._waiting)

    def _one_more(self) -> bool:
        if self._starting or self._runners >= self.concurrency:
            return False
        self._starting += 1
        self._runners += 1
        return True

    def add(self, delivery: Delivery) -> bool:
        """``delivery`` waits for a runner; True: start one (counted from now)."""
        with self._lock:
            self._waiting.append(delivery)
            self._held += 1
            return self._one_more()

    def started(self) -> None:
        """A runner counted by :meth:`add` or :meth:`take` began."""
        with self._lock:
            self._starting -= 1

    def not_started(self) -> None:
        """A runner counted by :meth:`add` or :meth:`take` could not be started (the worker ended)."""
        with self._lock:
            self._starting -= 1
            self._runners -= 1

    def withdraw(self) -> list[Delivery]:
        """The deliveries waiting for a runner, removed (the worker stops: they will not start);
        a runner looking for the next one finds none and ends."""
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
            self._held -= len(waiting)
        if waiting:
            self._on_end()
        return waiting

    def take(self) -> tuple[Delivery | None, bool]:
        """For a runner: the next delivery (None: none waits, the runner ends now, uncounted) and
        whether to start one more runner (counted from now)."""
        with self._lock:
            if not self._waiting:
                self._runners -= 1
                return None, False
            delivery = self._waiting.popleft()
            return delivery, bool(self._waiting) and self._one_more()

    def ended(self) -> None:
        """The handler of a taken delivery ended."""
        with self._lock:
            self._held -= 1
        self._on_end()

    def run(self) -> Iterator[tuple[Delivery, bool]]:
        """A runner's life, started by :meth:`add` or by the previous runner: the deliveries to
        handle one after the other, each with whether to start one more runner (counted from now);
        a delivery's end is counted when the iteration goes on (or is closed)."""
        self.started()
        while True:
            delivery, one_more = self.take()
            if delivery is None:
                return
            try:
                yield delivery, one_more
            finally:
                self.ended()


#: The queue (:class:`pyqueue.DelayedQueue` or :class:`pyqueue.aio.AsyncDelayedQueue`) and the
#: handler type of a worker.
Q = TypeVar("Q")
H = TypeVar("H")


class WorkerCore(Generic[Q, H]):
    """Settings, counters, deliveries and the decisions of a worker; :class:`pyqueue.Worker` and
    :class:`pyqueue.aio.AsyncWorker` add only their I/O (a driver for the :class:`Op` steps, set up
    in :meth:`_setup`). The parameters are those documented on :class:`pyqueue.Worker`."""

    #: The driver's logger (``pyqueue.worker`` or ``pyqueue.aio``).
    _log: logging.Logger
    #: The class of the middleware the driver takes (:class:`~pyqueue.core.middleware.Middleware`
    #: for threads, :class:`~pyqueue.core.middleware.AsyncMiddleware` for asyncio; the core alone,
    #: which calls no handler, takes any).
    _middleware_kind: type = object

    def __init__(
        self,
        queue: Q,
        handler: H,
        *,
        concurrency: int = 4,
        batch_size: int | None = None,
        prefetch: int | None = None,
        lock_timeout: Seconds = timedelta(seconds=30),
        idle_check: Seconds = timedelta(seconds=5),
        backoff: Backoff | None = None,
        shutdown_grace: Seconds = timedelta(seconds=30),
        cron_tick: Seconds | None = None,
        middleware: Sequence[Any] | None = None,
        metrics: Any = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgument(f"concurrency is {concurrency}, it must be at least 1")
        if batch_size is not None and not 1 <= batch_size <= POLL_MAX_COUNT:
            raise InvalidArgument(f"batch_size is {batch_size}, it must be between 1 and {POLL_MAX_COUNT}")
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.batch_size = batch_size or concurrency
        if prefetch is not None and not 0 <= prefetch <= POLL_MAX_COUNT:
            raise InvalidArgument(f"prefetch is {prefetch}, it must be between 0 and {POLL_MAX_COUNT}")
        self.prefetch = self.batch_size if prefetch is None else prefetch
        self.lock_timeout = as_timedelta(lock_timeout, "lock_timeout")
        self.idle_check = as_timedelta(idle_check, "idle_check")
        self.backoff = backoff or Backoff()
        self.shutdown_grace = as_timedelta(shutdown_grace, "shutdown_grace").total_seconds()
        self.cron_tick = None if cron_tick is None else as_timedelta(cron_tick, "cron_tick")
        #: The middleware around each handler call (:mod:`pyqueue.core.middleware`): by default the queue's.
        self.middleware = check_middleware(getattr(queue, "middleware", ()) if middleware is None else middleware,
                                           self._middleware_kind)
        #: What counts this worker's deliveries for export (``pyqueue.metrics.WorkerMetrics``), or None.
        self.metrics = metrics
        self.stats = WorkerStats()
        if metrics is not None:
            # Its middleware is the innermost layer: it times the handler alone.
            self.middleware = (*self.middleware, *check_middleware([metrics.attach(self)], self._middleware_kind))
        #: The ``ended`` and ``nacked`` notifications of the middleware (:func:`~pyqueue.core.middleware.notified`).
        self._on_ended = notified(self.middleware, "ended")
        self._nacked = notified(self.middleware, "nacked")
        #: The handler wrapped in the middleware that wrap handler calls, or None without any (nor
        #: any notification, which needs the call).
        self._through = chain(self.middleware, "handle", self._call_handler) if wraps(
            self.middleware, "handle") or self._on_ended or self._nacked else None
        self._deliveries = Deliveries(self.stats)
        self._stopping = False
        self._signals = 0
        self._poll_failures = 0
        self._backlog = False  # the last poll came back full: more is probably due
        self._acking = False  # an acknowledgement runs beside the run loop (its steps: _ack_steps)
        self._setup()

    def _setup(self) -> None:
        """The driver's own state (threads or tasks), set up at the end of ``__init__``: at least
        ``self._runners``, its handler slots (:class:`Runners`)."""

    _runners: Runners

    def handler_counts(self) -> tuple[int, int]:
        """(handlers running, messages polled and waiting for a free handler slot) now."""
        return self._runners.counts()

    # -- control -------------------------------------------------------------------------------
    def _request_stop(self) -> None:
        """Stop polling (the flag every step checks); the driver then wakes what waits."""
        self._stopping = True

    def _on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT while :meth:`run` handles them: stop (every signal; the process is not exited)."""
        self._signals += 1
        if self._signals == 1:
            self._log.info("signal %s: stopping (grace %.0f s)", signum, self.shutdown_grace)
        else:
            self._log.info("signal %s: already stopping", signum)
        self.stop()

    def stop(self) -> None:  # pragma: no cover - every driver defines it
        raise NotImplementedError

    def _call_handler(self, call: HandlerCall[Any]) -> Any:  # pragma: no cover - every driver defines it
        """The innermost step of the middleware chain: the handler on ``call.message``, with
        ``call.started()`` before and ``call.ended(…)`` after (a coroutine in the asyncio driver)."""
        raise NotImplementedError

    # -- the run loop --------------------------------------------------------------------------
    def run_steps(self, queue_name: str) -> WorkerSteps:
        """The whole life of a worker after start-up: poll, start handlers and acknowledge until
        stopped, then the grace period and the last acknowledgements."""
        self._log.info("worker ready: queue %r, concurrency %d, batch %d, lock_timeout %s",
                       queue_name, self.concurrency, self.batch_size, self.lock_timeout)
        try:
            while not self._stopping:
                # Prune first: a handler records its token before it counts as finished, so every
                # pruned handler's acknowledgement goes out now, not after the next (idle) wait.
                held = yield CountHeld()
                if not self._acking and self._deliveries.acks_pending():
                    # Acknowledge beside the run loop: the next poll does not wait for it. One
                    # acknowledgement at a time; tokens of handlers finishing meanwhile go with the next.
                    self._acking = True
                    yield Spawn(self._ack_steps())
                want = self._poll_size(held)
                if want == 0:
                    yield WaitForHandlers(HANDLER_WAIT_S)
                    continue
                # Wait (dq_poll_or_wait, registering as a waiter) only when nothing is held and the
                # last poll did not come back full: while draining a backlog, polls stay plain. The
                # acknowledgements go out before such a wait, which may last idle_check.
                idle = held == 0 and not self._backlog
                if idle:
                    yield from self._acknowledged_steps()
                messages = yield from self._poll_steps(want, idle=idle)
                self._backlog = len(messages) == want
                if messages:
                    received = [self._received(message) for message in messages]
                    if self._stopping:  # stopped while the poll ran: start none of them
                        yield from self._release_steps(received)
                    else:
                        yield StartHandlers(received)
                if not messages and held:
                    yield WaitForHandlers(HANDLER_WAIT_S)
        finally:
            self._stopping = True
            # What waits for a handler slot will not start: given back now, not left locked.
            yield from self._release_steps(self._runners.withdraw())
            still_running = yield Drain(self.shutdown_grace)
            if still_running:
                self._log.warning("%d messages still held after the grace period (handlers running, or waiting "
                                  "for a slot); they will be redelivered when their locks expire", still_running)
            yield HandlersFinished()
            yield from self._acknowledged_steps()
            self._log.info("worker stopped: %s", self.stats.snapshot())

    def _poll_size(self, held: int) -> int:
        """How many messages to poll for now, with ``held`` deliveries whose handlers have not ended
        (running, or waiting for a handler slot): while handler slots are free, as many as fit
        (at most ``batch_size``); while every slot is busy, a whole batch ahead (at most
        ``prefetch`` messages waiting), else none."""
        room = min(self.batch_size, self.concurrency + self.prefetch - held)
        if held < self.concurrency:
            return max(room, 0)
        return room if room > 0 and room >= min(self.batch_size, self.prefetch) else 0

    def _release_steps(self, deliveries: list[Delivery]) -> WorkerSteps:
        """Give back ``deliveries``, whose handlers never started, in one ``dq_release(uuid[])``: due
        again at once for any consumer, their delivery not counted. A failure is logged: their locks
        then expire as after a crash."""
        tokens = self._deliveries.released(deliveries)
        if not tokens:
            return
        try:
            released = yield ReleaseMany(tokens)
        except PyQueueError as exc:
            self._log.warning("releasing %d messages polled ahead failed (%s); they will be delivered again "
                              "when their locks expire", len(tokens), exc)
            return
        self._deliveries.counted_released(released)
        self._log.info("released %d messages polled ahead and not started: due again at once", released)

    def _ack_steps(self) -> WorkerSteps:
        """Spawned by the run loop: acknowledge the DONE deliveries until none is left."""
        try:
            while self._deliveries.acks_pending():
                yield from self._flush_steps()
        finally:
            self._acking = False

    def _acknowledged_steps(self) -> WorkerSteps:
        """Until every finished handler's message is acknowledged: the spawned acknowledgement
        ended, and the tokens recorded since sent."""
        if self._acking:
            yield JoinSpawned()
        yield from self._flush_steps()

    def _poll_steps(self, want: int, *, idle: bool) -> WorkerSteps:
        try:
            messages = yield PollMessages(want, idle)
        except PyQueueError as exc:
            if isinstance(exc, ConnectionFailed) and exc.permanent:
                raise  # the queue's first connection refused for good (a wrong password, role or database)
            self._poll_failures += 1
            delay = min(RECONNECT_BASE_S * 2.0 ** (self._poll_failures - 1), RECONNECT_CAP_S)
            delay *= random.uniform(0.8, 1.2)
            self._log.warning("poll failed (attempt %d: %s); retrying in %.1f s", self._poll_failures, exc, delay)
            yield SleepUnlessStopped(delay)
            return []
        if self._poll_failures:
            self._log.info("database reachable again after %d failed polls", self._poll_failures)
            self._poll_failures = 0
        return messages

    def _received(self, message: Any) -> Delivery:
        claim_to_due = message.locked_until - self.lock_timeout - message.scheduled_at
        lateness_ms = max(claim_to_due.total_seconds() * 1000, 0.0)
        # The first bucket >= lateness_ms.
        return self._deliveries.received(message, bisect_left(LATENESS_BUCKETS_MS, lateness_ms), lateness_ms)

    def _flush_steps(self) -> WorkerSteps:
        """Acknowledge the DONE deliveries in one ``dq_ack_many(uuid[])``."""
        tokens = self._deliveries.take_acks()
        if not tokens:
            return
        # A connection cut under us (server restart, pg_terminate_backend) fails the first attempt; the
        # tokens are still valid, so one retry on a fresh pooled connection avoids a redelivery.
        for attempt in (1, 2):
            try:
                acknowledged = yield AckMany(tokens)
                break
            except PyQueueError as exc:
                if attempt == 2:
                    self._log.warning("acknowledging %d messages failed (%s); they will be redelivered",
                                      len(tokens), exc)
                    return
                self._log.info("acknowledging %d messages failed (%s); retrying", len(tokens), exc)
        self._deliveries.acked(tokens, acknowledged)

    # -- one handler ---------------------------------------------------------------------------
    # The driver calls the handler itself (the hot path stays free of steps), then
    # handler_returned, or drives failed_steps with whatever it raised (any BaseException but the
    # cancellation of the driver's own task): every outcome of a handler settles its delivery.
    def handler_returned(self, delivery: Delivery) -> None:
        """The handler returned: DONE (acknowledged with the next batch), SETTLED, or it stays LOST."""
        if self._deliveries.returned(delivery) is State.LOST:
            self._log.warning("key %r finished after its lock was lost: not acknowledged", delivery.message.key)

    def middleware_failure(self, call: HandlerCall[Any], exc: BaseException) -> BaseException | None:
        """The middleware chain around ``call`` raised ``exc``: what the delivery fails with, or
        None when it succeeded after all. The handler's own exception passes through; a
        middleware's own exception is logged with its traceback and never loses the delivery:
        after the handler returned, the delivery succeeded (None); after it raised, it fails with
        the handler's exception; before the handler ran, with the middleware's."""
        if exc is call.error:
            return exc
        key = call.message.key
        if call.outcome is None:
            self._log.error("middleware raised before the handler of key %r ran: %s; the message is nacked",
                            key, error_text(exc), exc_info=exc)
            return exc
        self._log.error("middleware raised after the handler of key %r %s: %s; the handler's outcome stands",
                        key, call.outcome, error_text(exc), exc_info=exc)
        return call.error

    def failed_steps(self, delivery: Delivery, exc: BaseException, call: HandlerCall[Any] | None = None
                     ) -> WorkerSteps:
        """The handler raised ``exc``, whatever it is (an :class:`Exception`, ``SystemExit`` from
        ``sys.exit()``, an application's own :class:`BaseException`, the ``CancelledError`` of a
        task it awaited, ``KeyboardInterrupt``): FAILED, and nacked with the backoff, its
        :func:`error_text` stored as the message's last error and logged (nothing is sent for a
        LOST one). ``KeyboardInterrupt`` also stops the worker, as :meth:`stop` does.

        The steps raise nothing of their own: a nack that fails (whatever it raises as an
        :class:`Exception`) is logged and the lock left to expire. What the driver throws in that
        is not an Exception (the cancellation of its own task) propagates. Then the middleware's
        ``nacked`` notifications hear of ``call`` (the handler call as the middleware saw it) and
        of where the message went."""
        nacked: NackResult | None = None
        try:
            nacked = yield from self._nack_steps(delivery, exc)
        finally:
            if call is not None:
                self._notify(self._nacked, "nacked", call, nacked)

    def handler_ended(self, call: HandlerCall[Any], error: BaseException | None) -> None:
        """The handler of ``call`` returned (``error`` None) or raised ``error``: recorded on the
        call, then the middleware's ``ended`` notifications (what they raise is logged)."""
        call.ended(error)
        self._notify(self._on_ended, "ended", call)

    def _notify(self, notifications: Sequence[Callable[..., None]], name: str, call: HandlerCall[Any],
                *args: Any) -> None:
        """Each of ``notifications`` (the middleware's ``name`` methods) with ``call`` and ``args``;
        what one raises is logged and never changes what happened to the delivery."""
        for notify in notifications:
            try:
                notify(call, *args)
            except Exception as exc:
                self._log.error("middleware %s() raised for key %r: %s", name, call.message.key, error_text(exc),
                                exc_info=exc)

    def _nack_steps(self, delivery: Delivery, exc: BaseException) -> WorkerSteps:
        """:meth:`failed_steps` without the notification: the nack's result, or None when none was sent."""
        message = delivery.message
        state = self._deliveries.raised(delivery)
        text = error_text(exc)
        failed = "handler failed for key %r (delivery %d): %s"
        if isinstance(exc, KeyboardInterrupt):
            self._log.warning("handler for key %r raised KeyboardInterrupt: stopping the worker (grace %.0f s)",
                              message.key, self.shutdown_grace)
            self.stop()
        if state is not State.FAILED:
            self._log.warning(failed + "; its lock was lost: not nacked", message.key, message.delivery_count, text)
            return None
        delay = self.backoff.delay(message.delivery_count)
        try:
            nacked: NackResult = yield Nack(message, delay, text)
        except Exception as nack_exc:  # the delivery's lock then expires: logged
            self._log.warning(failed + "; nack failed: %s (the lock will expire)", message.key,
                              message.delivery_count, text, error_text(nack_exc))
            return None
        self._deliveries.nacked(nacked.outcome)
        # At the queue's max_deliveries the nack moved the message to its dead-letter queue.
        if nacked.outcome is NackOutcome.DEAD_LETTERED:
            self._log.warning(failed + "; dead-lettered: moved to queue %r (the queue's max_deliveries was "
                              "reached), not retried", message.key, message.delivery_count, text,
                              nacked.dead_letter_queue)
        elif nacked.nacked:
            self._log.warning(failed + "; retry in %s", message.key, message.delivery_count, text,
                              format_duration(delay))
        else:
            self._log.warning(failed + "; its lock was lost before the nack: not retried by this worker",
                              message.key, message.delivery_count, text)
        return nacked

    # -- the heartbeat -------------------------------------------------------------------------
    def _to_extend(self) -> list[Delivery]:
        """The deliveries the heartbeat extends now (RUNNING, not settled by their handlers)."""
        return self._deliveries.to_extend()

    def heartbeat_steps(self) -> WorkerSteps:
        """Every lock_timeout / 3, extend the lock of every delivery whose handler still runs."""
        period = self.lock_timeout.total_seconds() / 3
        while not (yield HeartbeatWait(period)):
            for delivery in self._to_extend():
                message = delivery.message
                try:
                    until = yield ExtendLock(message, self.lock_timeout)
                except PyQueueError as exc:
                    self._log.warning("extending the lock of key %r failed: %s", message.key, exc)
                    continue
                if until is None and self._deliveries.lock_lost(delivery):
                    self._log.warning("lock of key %r was lost; its result will not be acknowledged", message.key)
