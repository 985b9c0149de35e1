"""A run-loop that consumes one queue: :class:`Worker` (issue 3, first part).

The worker sleeps on LISTEN/NOTIFY while the queue is idle (``DelayedQueue.poll(wait=…)``: at
most one query per ``idle_check`` besides wake-ups), polls in batches of at most the free
handler slots (so it never holds more messages than it is running), runs the handler in a
thread pool, acknowledges finished messages together with one ``dq_ack(uuid[])``, extends the
locks of running handlers every ``lock_timeout / 3`` (seed 004's heartbeat), and negatively
acknowledges a message whose handler raised with an exponential backoff with jitter.

Delivery is at-least-once: a handler that outlives its lock (the heartbeat found it lost) or a
worker killed mid-handler means the message is delivered again; handlers must be idempotent.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
from bisect import bisect_left
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any
from uuid import UUID

from .client import DelayedQueue, Message
from .errors import InvalidArgument, PyQueueError

__all__ = ["Worker", "Backoff", "WorkerStats"]

log = logging.getLogger("pyqueue.worker")

Handler = Callable[[Message], Any]


def _seconds(value: float | timedelta, name: str) -> float:
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if s <= 0:
        raise InvalidArgument(f"{name} is {s} s, it must be positive")
    return s


@dataclass(frozen=True)
class Backoff:
    """Delay before a failed message is delivered again: ``base * factor**(delivery_count - 1)``,
    capped at ``cap``, then multiplied by a random factor in ``[1 - jitter, 1 + jitter]``.

    :param base: first retry delay (timedelta or seconds, > 0).
    :param factor: growth per delivery (≥ 1).
    :param cap: longest delay.
    :param jitter: relative spread, 0 ≤ jitter < 1 (spreads retries of messages that failed together).
    """

    base: timedelta = timedelta(seconds=1)
    factor: float = 2.0
    cap: timedelta = timedelta(minutes=10)
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.factor < 1 or not 0 <= self.jitter < 1 or self.base <= timedelta(0) or self.cap < self.base:
            raise InvalidArgument("Backoff needs base > 0, cap >= base, factor >= 1 and 0 <= jitter < 1")

    def delay(self, delivery_count: int) -> timedelta:
        """The nack delay after the ``delivery_count``-th delivery failed."""
        raw = self.base.total_seconds() * self.factor ** max(delivery_count - 1, 0)
        capped = min(raw, self.cap.total_seconds())
        return timedelta(seconds=capped * random.uniform(1 - self.jitter, 1 + self.jitter))


LATENESS_BUCKETS_MS = (1, 5, 10, 50, 100, 500, 1000, 5000, float("inf"))


@dataclass
class WorkerStats:
    """Counters a caller can read or export; updated under a lock, read with :meth:`snapshot`.

    ``lateness_ms`` counts deliveries by (claim time − due time) on the database clock, in the
    buckets of ``LATENESS_BUCKETS_MS`` (upper bounds, milliseconds).
    """

    delivered: int = 0
    acknowledged: int = 0
    failed: int = 0
    lock_lost: int = 0
    lateness_ms: list[int] = field(default_factory=lambda: [0] * len(LATENESS_BUCKETS_MS))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "delivered": self.delivered,
                "acknowledged": self.acknowledged,
                "failed": self.failed,
                "lock_lost": self.lock_lost,
                "lateness_ms": dict(zip((str(b) for b in LATENESS_BUCKETS_MS), self.lateness_ms, strict=True)),
            }


class _Shutdown(KeyboardInterrupt):
    """Raised by the signal handler to end an idle wait at once (psycopg cancels like on Ctrl-C)."""


#: Waits after consecutive failed polls (the database unreachable): 0.5 s doubling up to 30 s.
RECONNECT_BASE_S = 0.5
RECONNECT_CAP_S = 30.0


class _WorkerCore:
    """Settings, counters and the bookkeeping of deliveries, shared by :class:`Worker` and
    :class:`pyqueue.aio.AsyncWorker` (which differ only in how they wait and run handlers)."""

    def __init__(
        self,
        handler: Callable[[Any], Any],
        *,
        concurrency: int,
        batch_size: int | None,
        lock_timeout: float | timedelta,
        idle_check: float | timedelta,
        backoff: Backoff | None,
        shutdown_grace: float | timedelta,
        cron_tick: float | timedelta | None = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgument(f"concurrency is {concurrency}, it must be at least 1")
        if batch_size is not None and not 1 <= batch_size <= 10000:
            raise InvalidArgument(f"batch_size is {batch_size}, it must be between 1 and 10000")
        self.handler = handler
        self.concurrency = concurrency
        self.batch_size = batch_size or concurrency
        self.lock_timeout = timedelta(seconds=_seconds(lock_timeout, "lock_timeout"))
        self.idle_check = timedelta(seconds=_seconds(idle_check, "idle_check"))
        self.backoff = backoff or Backoff()
        self.shutdown_grace = _seconds(shutdown_grace, "shutdown_grace")
        self.cron_tick = None if cron_tick is None else timedelta(seconds=_seconds(cron_tick, "cron_tick"))
        self.stats = WorkerStats()
        self._signals = 0
        self._poll_failures = 0
        self._backlog = False  # the last poll came back full: more is probably due
        self._running: dict[UUID, Any] = {}  # lock token -> message, while its handler runs
        self._lost: set[UUID] = set()
        self._done: list[UUID] = []  # finished, to acknowledge in the next batch
        self._lock = threading.Lock()

    def _start_cron_ticker(self, conninfo: Any) -> Any:
        """With ``cron_tick``: a :class:`pyqueue.cron.CronTicker` thread driving ``dq_cron_tick()``
        (one ticker per database works at a time, by an advisory lock; the others stand by)."""
        if self.cron_tick is None:
            return None
        from .cron import CronTicker

        ticker = CronTicker(conninfo() if callable(conninfo) else conninfo, every=self.cron_tick)
        ticker.start()
        log.info("cron ticker started: dq_cron_tick() every %s while this worker holds the tick lock", self.cron_tick)
        return ticker

    def _ready_line(self, queue: str) -> None:
        log.info(
            "worker ready: queue %r, concurrency %d, batch %d, lock_timeout %s",
            queue, self.concurrency, self.batch_size, self.lock_timeout,
        )

    def _poll_failed(self, exc: Exception) -> float:
        """Log a failed poll; returns how long to wait before the next (growing, with jitter)."""
        self._poll_failures += 1
        delay = min(RECONNECT_BASE_S * 2.0 ** (self._poll_failures - 1), RECONNECT_CAP_S) * random.uniform(0.8, 1.2)
        log.warning("poll failed (attempt %d: %s); retrying in %.1f s", self._poll_failures, exc, delay)
        return delay

    def _poll_succeeded(self) -> None:
        if self._poll_failures:
            log.info("database reachable again after %d failed polls", self._poll_failures)
            self._poll_failures = 0

    def _received(self, message: Any) -> None:
        claim_to_due = message.locked_until - self.lock_timeout - message.scheduled_at
        lateness_ms = max(claim_to_due.total_seconds() * 1000, 0.0)
        bucket = bisect_left(LATENESS_BUCKETS_MS, lateness_ms)  # the first bucket >= lateness_ms
        with self.stats._lock:
            self.stats.delivered += 1
            self.stats.lateness_ms[bucket] += 1
        with self._lock:
            self._running[message.lock_token] = message

    def _failed(self, message: Any, exc: BaseException) -> tuple[timedelta, str] | None:
        """Bookkeeping of a raising handler: the nack delay and error text, or None when the lock
        was lost meanwhile (nothing to nack)."""
        delay = self.backoff.delay(message.delivery_count)
        log.warning("handler failed for key %r (delivery %d): %r; retry in %.1f s",
                    message.key, message.delivery_count, exc, delay.total_seconds())
        with self._lock:
            self._running.pop(message.lock_token, None)
            lost = message.lock_token in self._lost
            self._lost.discard(message.lock_token)
        with self.stats._lock:
            self.stats.failed += 1
        return None if lost else (delay, f"{type(exc).__name__}: {exc}"[:2000])

    def _succeeded(self, message: Any) -> None:
        with self._lock:
            self._running.pop(message.lock_token, None)
            if message.settled is not None:
                # The handler acknowledged (e.g. in its own transaction, with its writes) or nacked
                # the delivery itself: nothing left to send, and no lock was lost.
                self._lost.discard(message.lock_token)
                if message.settled == "acked":
                    with self.stats._lock:
                        self.stats.acknowledged += 1
                return
            if message.lock_token in self._lost:
                self._lost.discard(message.lock_token)
                log.warning("key %r finished after its lock was lost: not acknowledged", message.key)
            else:
                self._done.append(message.lock_token)

    def _take_done(self) -> list[UUID]:
        with self._lock:
            tokens, self._done = self._done, []
        return tokens

    def _acked(self, tokens: list[UUID], acked: int) -> None:
        with self.stats._lock:
            self.stats.acknowledged += acked
            self.stats.lock_lost += len(tokens) - acked

    def _running_now(self) -> list[Any]:
        """Messages whose handlers run and have not settled them themselves (what the heartbeat extends)."""
        with self._lock:
            return [m for m in self._running.values() if m.settled is None]

    def _lock_lost(self, message: Any) -> None:
        with self._lock:
            if message.lock_token not in self._running or message.settled is not None:
                # Its handler finished since the heartbeat listed it, and the extend found it acknowledged
                # (had the lock been lost, the acknowledgement counts it: _acked), or the handler
                # settled it itself (its ack or nack deleted or released the lock).
                return
            self._lost.add(message.lock_token)
        log.warning("lock of key %r was lost; its result will not be acknowledged", message.key)
        with self.stats._lock:
            self.stats.lock_lost += 1

    def _second_signal(self, signum: int) -> bool:
        """Count a signal; on the second, exit at once (running messages are redelivered when
        their locks expire). Returns True for the first."""
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal %s: exiting now; locks of running messages will expire", signum)
            os._exit(1)
        log.info("signal %s: stopping (grace %.0f s)", signum, self.shutdown_grace)
        return True


class Worker(_WorkerCore):
    """Consume ``queue`` with ``handler`` until stopped.

    :param queue: the :class:`DelayedQueue` to consume (its pool should allow ``concurrency + 2``
        connections; the worker's own heartbeat and acknowledgements use it).
    :param handler: called with each :class:`Message`; returning acknowledges it, raising
        negatively acknowledges it with ``backoff``. A handler may settle the message itself, e.g.
        ``message.ack(conn=conn)`` inside the transaction that holds its own writes (exactly-once
        effects; docs/api.md); the worker then sends nothing more for it and counts it acknowledged.
    :param concurrency: handler threads; also the most messages held at once.
    :param batch_size: most messages per poll (default: ``concurrency``).
    :param lock_timeout: visibility timeout of each delivery (timedelta or seconds); the worker
        extends it every third of it while the handler runs.
    :param idle_check: while idle, re-check the queue at least this often (timedelta or seconds).
    :param backoff: retry delays after a failure.
    :param shutdown_grace: on stop, how long running handlers may finish (timedelta or seconds).
    :param cron_tick: also drive the database's recurring schedules: call ``dq_cron_tick()`` this
        often (timedelta or seconds) while this worker holds the tick lock (docs/cron.md); None: off.

    When the database is unreachable, polls are retried after 0.5 s, 1 s, 2 s … up to 30 s; the
    connections are re-opened by the pool. When LISTEN/NOTIFY does not work on the connection (a
    transaction-pooling PgBouncer), the queue falls back to timed polls and logs it once.
    """

    def __init__(
        self,
        queue: DelayedQueue,
        handler: Handler,
        *,
        concurrency: int = 4,
        batch_size: int | None = None,
        lock_timeout: float | timedelta = timedelta(seconds=30),
        idle_check: float | timedelta = timedelta(seconds=5),
        backoff: Backoff | None = None,
        shutdown_grace: float | timedelta = timedelta(seconds=30),
        cron_tick: float | timedelta | None = None,
    ) -> None:
        super().__init__(
            handler, concurrency=concurrency, batch_size=batch_size, lock_timeout=lock_timeout,
            idle_check=idle_check, backoff=backoff, shutdown_grace=shutdown_grace, cron_tick=cron_tick,
        )
        self.queue = queue
        self._stop = threading.Event()
        self._finished = threading.Event()  # set once no handler runs any more: ends the heartbeat
        self._idle_waiting = False

    # -- control -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop polling; running handlers get ``shutdown_grace`` to finish. Thread-safe."""
        self._stop.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._second_signal(signum)
        self._stop.set()
        if self._idle_waiting:
            raise _Shutdown

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        """Run until :meth:`stop` or SIGTERM/SIGINT (handled when called from the main thread;
        a second signal, also during the grace period, exits the process at once)."""
        in_main = threading.current_thread() is threading.main_thread()
        previous = {}
        if in_main:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        heartbeat = threading.Thread(target=self._heartbeat, name="pyqueue-heartbeat", daemon=True)
        heartbeat.start()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="pyqueue-handler")
        futures: set[Future[None]] = set()
        ticker = self._start_cron_ticker(self.queue.pool.conninfo)
        self._ready_line(self.queue.queue)
        try:
            while not self._stop.is_set():
                # Prune first: a handler records its token before its future is done, so every
                # pruned future's acknowledgement goes out now, not after the next (idle) wait.
                futures = {f for f in futures if not f.done()}
                self._flush_acks()
                free = self.concurrency - len(futures)
                if free == 0:
                    wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
                    continue
                want = min(free, self.batch_size)
                # Wait (dq_poll_or_wait, registering as a waiter) only when nothing runs and the last
                # poll did not come back full: while draining a backlog, polls stay plain.
                messages = self._poll(want, idle=not futures and not self._backlog)
                self._backlog = len(messages) == want
                for message in messages:
                    self._received(message)
                    futures.add(pool.submit(self._handle, message))
                if not messages and futures:
                    wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
        finally:
            try:
                _, pending = wait(futures, timeout=self.shutdown_grace)
                if pending:
                    log.warning("%d handlers still running after the grace period; their messages will be "
                                "redelivered when their locks expire", len(pending))
                self._stop.set()
                self._finished.set()
                self._flush_acks()
                pool.shutdown(wait=False, cancel_futures=True)
                if ticker is not None:
                    ticker.stop(timeout=10)
                log.info("worker stopped: %s", self.stats.snapshot())
            finally:
                if in_main:  # only now: a second signal during the grace period must still exit at once
                    for sig, handler in previous.items():
                        signal.signal(sig, handler)

    def _poll(self, max_count: int, *, idle: bool) -> list[Message]:
        try:
            if not idle:
                messages = self.queue.poll(max_count, lock_timeout=self.lock_timeout)
            else:
                self._idle_waiting = True
                try:
                    if self._stop.is_set():
                        return []
                    messages = self.queue.poll(
                        max_count, lock_timeout=self.lock_timeout, wait=self.idle_check, idle_check=self.idle_check
                    )
                finally:
                    self._idle_waiting = False
        except _Shutdown:
            return []
        except PyQueueError as exc:
            self._stop.wait(self._poll_failed(exc))
            return []
        self._poll_succeeded()
        return messages

    def _handle(self, message: Message) -> None:
        try:
            self.handler(message)
        except Exception as exc:  # the handler's failure: nack with backoff
            nack = self._failed(message, exc)
            if nack is not None:
                try:
                    message.nack(nack[0], error=nack[1])
                except PyQueueError as nack_exc:
                    log.warning("nack failed for key %r: %s (the lock will expire)", message.key, nack_exc)
            return
        self._succeeded(message)

    def _flush_acks(self) -> None:
        tokens = self._take_done()
        if not tokens:
            return
        # A connection cut under us (server restart, pg_terminate_backend) fails the first attempt; the
        # tokens are still valid, so one retry on a fresh pooled connection avoids a redelivery.
        for attempt in (1, 2):
            try:
                acked = self.queue.ack_many(tokens)
                break
            except PyQueueError as exc:
                if attempt == 2:
                    log.warning("acknowledging %d messages failed (%s); they will be redelivered", len(tokens), exc)
                    return
                log.info("acknowledging %d messages failed (%s); retrying", len(tokens), exc)
        self._acked(tokens, acked)

    def _heartbeat(self) -> None:
        """Every lock_timeout / 3, extend the lock of every message whose handler still runs."""
        period = self.lock_timeout.total_seconds() / 3
        while not self._finished.wait(period):
            for message in self._running_now():
                try:
                    until = message.extend(self.lock_timeout)
                except PyQueueError as exc:
                    log.warning("extending the lock of key %r failed: %s", message.key, exc)
                    continue
                if until is None:
                    self._lock_lost(message)
