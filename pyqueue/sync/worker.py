"""A run-loop that consumes one queue with threads: :class:`Worker`.

The worker sleeps on LISTEN/NOTIFY while the queue is idle (``DelayedQueue.poll(wait=…)``: at
most one query per ``idle_check`` besides wake-ups), polls in batches of at most the free
handler slots plus ``prefetch`` messages polled ahead while every slot is busy (so the next batch
is fetched while the current one runs), runs the handler in a thread pool, acknowledges finished
messages together with one ``dq_ack_many(uuid[])`` sent beside the polls (the next poll does not wait
for it), extends the
locks of running handlers every ``lock_timeout / 3`` (a heartbeat, as SQS's
ChangeMessageVisibility), and negatively acknowledges a message whose handler raised with an
exponential backoff with jitter. Its decisions are those of :mod:`pyqueue.core.delivery`, shared with
:class:`pyqueue.aio.AsyncWorker`; this module only performs their I/O with threads.

Delivery is at-least-once: a handler that outlives its lock (the heartbeat found it lost) or a
worker killed mid-handler means the message is delivered again; handlers must be idempotent.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, assert_never

from ..core import steps
from ..core.delivery import Backoff, Delivery, Runners, WorkerCore, WorkerStats
from ..core.middleware import HandlerCall, Middleware
from ..core.steps import Stepper, WorkerStep, WorkerSteps
from ..drivers.signals import stop_signals
from ..drivers.sync import resolve
from ..errors import PyQueueError
from .client import DelayedQueue, Message
from .cron import start_ticker

__all__ = ["Worker", "Backoff", "WorkerStats"]

log = logging.getLogger("pyqueue.worker")

Handler = Callable[[Message], Any]


class _Waker:
    """What a waiting run loop sleeps on: a socket pair. :meth:`wake` is one non-blocking send, safe
    from any thread and from a signal handler (it takes no lock)."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def wake(self) -> None:
        try:
            self._w.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed (the worker ended)
            pass

    def wait(self, timeout: float | None, done: Callable[[], bool]) -> None:
        """Sleep until woken or ``timeout`` seconds (None: no limit), unless ``done()`` already."""
        try:
            while self._r.recv(4096):
                pass
        except OSError:
            pass
        if not done():
            select.select([self._r], [], [], timeout)

    def close(self) -> None:
        self._r.close()
        self._w.close()


class Worker(WorkerCore[DelayedQueue, Handler]):
    """Consume ``queue`` with ``handler`` until stopped.

    :param queue: the :class:`DelayedQueue` to consume (its pool should allow ``concurrency + 3``
        connections; the worker's own polls, heartbeat and acknowledgements use it).
    :param handler: called with each :class:`Message` in a thread of the worker's pool; returning
        acknowledges it, raising anything (any :class:`BaseException`: ``SystemExit`` from
        ``sys.exit()`` too) negatively acknowledges it with ``backoff``, the error's text stored
        as its last error and logged, and the handler thread goes on with the next message;
        ``KeyboardInterrupt`` also stops the worker, as :meth:`stop`.
        A handler may settle the message itself, e.g. ``message.ack(conn=conn)`` inside the
        transaction that holds its own writes (exactly-once effects; docs/api.md); the worker then
        sends nothing more for it and counts it acknowledged.
    :param concurrency: handler threads (≥ 1): the most handlers running at once.
    :param batch_size: most messages per poll, 1–10,000 (default: ``concurrency``).
    :param prefetch: most messages held beyond the handler slots, 0–10,000 (default:
        ``batch_size``): while every slot is busy the worker polls one batch ahead (up to this
        many), whose messages wait in the worker for a free slot, their locks extended like those
        of running handlers. 0: poll only for free slots (a message is never held while another
        worker could run it now; slower with short handlers).
    :param lock_timeout: visibility timeout of each delivery (timedelta or seconds, > 0; default
        30 s); the worker extends it every third of it while the handler runs. A handler that
        blocks the heartbeat longer than this (or a paused process) means a second delivery.
    :param idle_check: while idle, re-check the queue at least this often (timedelta or seconds,
        > 0; default 5 s).
    :param backoff: retry delays after a failure (default :class:`Backoff()`).
    :param shutdown_grace: on stop, how long running handlers may finish (timedelta or seconds,
        > 0; default 30 s); the messages of those still running then are redelivered when their
        locks expire.
    :param cron_tick: also drive the database's recurring schedules: call ``dq_cron_tick()`` this
        often (timedelta or seconds, > 0) while this worker holds the tick lock (docs/cron.md);
        None: off.
    :param middleware: :class:`pyqueue.Middleware` objects around each handler call, the first
        outermost (:mod:`pyqueue.core.middleware`); None (the default): the queue's
        ``middleware``; ``[]``: none.
    :param metrics: a :class:`pyqueue.metrics.WorkerMetrics` (extra ``pgdelayq[metrics]``) that
        exports this worker's counters, handler durations and lateness to Prometheus; it adds its
        middleware as the innermost layer. None (the default): no metrics.
    :raises InvalidArgument: a setting out of range, middleware that is not a list of
        :class:`pyqueue.Middleware`.

    When the queue's first connection is refused for good (:attr:`pyqueue.ConnectionFailed.permanent`:
    a wrong password, role or database), :meth:`run` raises it at once. When the database is
    unreachable (no server answers yet, or any more), polls are retried after 0.5 s, 1 s, 2 s … up
    to 30 s, each failure logged with its reason; the connections are re-opened by the pool. When
    LISTEN/NOTIFY does not work on the connection (a transaction-pooling PgBouncer), the queue
    falls back to timed polls and logs it once.
    """

    _log = log
    _middleware_kind = Middleware

    def _setup(self) -> None:
        self._waker: _Waker | None = None  # while run() runs
        self._finished = threading.Event()  # set once no handler runs any more: ends the heartbeat
        self._pool: ThreadPoolExecutor | None = None
        self._ended = threading.Event()  # a handler ended since the run loop last counted
        self._runners = Runners(self.concurrency, self._ended.set)  # the handler slots: deliveries and their runners
        self._spawned: set[Future[Any]] = set()  # steps driven beside the run loop (acknowledgements)
        self._beside: ThreadPoolExecutor | None = None  # their thread

    # -- control -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop polling and end an idle wait at once; running handlers get ``shutdown_grace`` to
        finish, then :meth:`run` returns. Safe from any thread and from a signal handler."""
        self._request_stop()
        waker = self._waker
        if waker is not None:
            waker.wake()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Run until :meth:`stop`. With ``install_signal_handlers`` and in the main thread, SIGTERM
        and SIGINT call :meth:`stop` meanwhile (every one of them: the process is never exited here;
        ``pyqueue worker`` exits at once on a second signal)."""
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="pyqueue-handler")
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="pyqueue-ack")
        self._waker = waker = _Waker()
        heartbeat = threading.Thread(target=self._drive, args=(self.heartbeat_steps(),), name="pyqueue-heartbeat",
                                     daemon=True)
        heartbeat.start()
        ticker = None
        try:
            with stop_signals(self._on_signal) if install_signal_handlers else nullcontext():
                ticker = start_ticker(resolve(self.queue.pool.conninfo), self.cron_tick, self.queue.schema, log)
                self._drive(self.run_steps(self.queue.queue))
        finally:
            self._finished.set()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._beside.shutdown(wait=True)
            waker.close()
            if ticker is not None:
                ticker.stop(10)

    # -- the driver ----------------------------------------------------------------------------
    def _drive(self, generator: WorkerSteps) -> Any:
        """Perform the steps of ``generator`` in this thread until it ends; returns its value."""
        stepper: Stepper[None] = Stepper(generator)
        step = stepper.step()
        while step is not None:
            try:
                result = self._perform(step)
            except BaseException as exc:
                step = stepper.step(error=exc)
            else:
                step = stepper.step(result)
        return stepper.result

    def _perform(self, step: WorkerStep) -> Any:
        """What each worker step of :mod:`pyqueue.core.steps` does with threads (most frequent first)."""
        match step:
            case steps.CountHeld():
                return self._running()
            case steps.PollMessages(max_count, idle):
                return self._poll(max_count, idle)
            case steps.StartHandlers(deliveries):
                for delivery in deliveries:
                    self._start(delivery)
                return None
            case steps.Spawn(generator):
                return self._spawn(generator)
            case steps.AckMany(lock_tokens):
                return self.queue.ack_many(lock_tokens)
            case steps.ReleaseMany(lock_tokens):
                return self.queue.release_many(lock_tokens)
            case steps.WaitForHandlers(seconds):
                self._ended.wait(seconds)
                return None
            case steps.HeartbeatWait(seconds):
                return self._finished.wait(seconds)
            case steps.ExtendLock(message, timeout):
                return message.extend(timeout)
            case steps.Nack(message, delay, error):
                return message.nack_outcome(delay, error=error)
            case steps.SleepUnlessStopped(seconds):
                return self._sleep(seconds)
            case steps.JoinSpawned():
                return self._join()
            case steps.Drain(seconds):
                return self._drain(seconds)
            case steps.HandlersFinished():
                return self._finished.set()
            case _:
                assert_never(step)

    def _running(self) -> int:
        self._ended.clear()  # a handler ending from now on ends the next WaitForHandlers at once
        return self._runners.held

    def _start(self, delivery: Delivery) -> None:
        if self._runners.add(delivery):
            self._submit_runner()

    def _submit_runner(self) -> None:
        assert self._pool is not None
        try:
            self._pool.submit(self._run_waiting)
        except RuntimeError:  # the pool is shut down (the worker ended): nothing runs any more
            self._runners.not_started()

    def _run_waiting(self) -> None:
        """A runner (a job of the handler pool): see :class:`pyqueue.core.delivery.Runners`."""
        for delivery, one_more in self._runners.run():
            if one_more:
                self._submit_runner()
            self._handle(delivery)

    def _handle(self, delivery: Delivery) -> None:
        if self._through is not None:
            return self._handle_through(self._through, delivery)
        try:
            self.handler(delivery.message)
        except BaseException as exc:  # whatever it raised, SystemExit too, settles it
            return self._drive(self.failed_steps(delivery, exc))  # type: ignore[no-any-return]
        self.handler_returned(delivery)

    def _handle_through(self, through: Callable[[HandlerCall[Message]], Any], delivery: Delivery) -> None:
        """The handler called through the middleware (:meth:`WorkerCore.middleware_failure` decides)."""
        call = HandlerCall(delivery.message, self.queue.queue)
        try:
            through(call)
        except BaseException as exc:
            if (failure := self.middleware_failure(call, exc)) is not None:
                return self._drive(self.failed_steps(delivery, failure, call))  # type: ignore[no-any-return]
        self.handler_returned(delivery)

    def _call_handler(self, call: HandlerCall[Message]) -> Any:
        """The innermost step of the middleware chain: the handler, its outcome and duration recorded."""
        call.started()
        try:
            result = self.handler(call.message)
        except BaseException as exc:
            self.handler_ended(call, exc)
            raise
        self.handler_ended(call, None)
        return result

    def _spawn(self, generator: WorkerSteps) -> None:
        assert self._beside is not None
        future = self._beside.submit(self._drive, generator)
        self._spawned.add(future)
        future.add_done_callback(self._spawned.discard)

    def _join(self) -> None:
        for future in list(self._spawned):
            future.result()

    def _sleep(self, seconds: float) -> None:
        assert self._waker is not None
        self._waker.wait(seconds, lambda: self._stopping)

    def _drain(self, grace: float) -> int:
        deadline = time.monotonic() + grace
        while self._runners.held and (left := deadline - time.monotonic()) > 0:
            self._ended.clear()
            if self._runners.held:
                self._ended.wait(left)
        return self._runners.held

    def _poll(self, max_count: int, idle: bool) -> list[Message]:
        if not idle:
            return self.queue.poll(max_count, lock_timeout=self.lock_timeout)
        if self._stopping:
            return []
        # The wait runs on a thread of its own, so that stop() ends it at once: a psycopg wait for a
        # notification cannot be interrupted from outside its thread.
        assert self._waker is not None
        waker = self._waker
        box: Future[list[Message]] = Future()
        threading.Thread(target=self._idle_wait, args=(box, max_count), name="pyqueue-idle-wait",
                         daemon=True).start()
        while not box.done():
            if self._stopping:
                box.add_done_callback(_release_late)
                return []
            waker.wait(None, lambda: box.done() or self._stopping)
        return box.result()

    def _idle_wait(self, box: Future[list[Message]], max_count: int) -> None:
        try:
            box.set_result(self.queue.poll(max_count, lock_timeout=self.lock_timeout, wait=self.idle_check,
                                           idle_check=self.idle_check))
        except BaseException as exc:
            box.set_exception(exc)
        finally:
            waker = self._waker
            if waker is not None:
                waker.wake()


def _release_late(box: Future[list[Message]]) -> None:
    """An idle wait the worker stopped waiting for acquired messages after all: give them back now
    (visible again at once) rather than let their locks expire."""
    if box.exception() is not None:
        return
    for message in box.result():
        try:
            message.nack(0)
        except PyQueueError as exc:
            log.info("giving back key %r after the stop failed: %s (the lock will expire)", message.key, exc)
