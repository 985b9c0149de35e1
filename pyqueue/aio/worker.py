"""The asyncio worker: :class:`AsyncWorker`, the twin of :class:`pyqueue.Worker`.

Its decisions are those of :mod:`pyqueue.core.delivery`, shared with the thread worker; this module
only performs their I/O with asyncio tasks.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, assert_never

import psycopg

from ..core import steps
from ..core.delivery import Delivery, Runners, WorkerCore
from ..core.middleware import AsyncMiddleware, HandlerCall
from ..core.steps import Stepper, WorkerStep, WorkerSteps
from ..drivers.aio import resolve
from ..drivers.signals import stop_signals
from ..errors import PyQueueError
from ..sync.cron import start_ticker
from .client import AsyncDelayedQueue, AsyncMessage

__all__ = ["AsyncWorker", "AsyncHandler"]

log = logging.getLogger("pyqueue.aio")


AsyncHandler = Callable[[AsyncMessage], Awaitable[Any] | Any]



class AsyncWorker(WorkerCore[AsyncDelayedQueue, AsyncHandler]):
    """Consume ``queue`` with ``handler`` in an asyncio event loop; the twin of :class:`pyqueue.Worker`
    (same parameters, defaults, errors and delivery guarantees).

    :param handler: a coroutine function (awaited in the loop, at most ``concurrency`` at once) or
        a plain function (run in the worker's own ``concurrency`` threads, short ones one after
        the other in one thread) taking an :class:`AsyncMessage`.
        Whatever it raises, a ``CancelledError`` that comes out of a task it awaited included, is
        a failure of its message, as for :class:`pyqueue.Worker`; only the worker's own
        cancellation of a handler still running after ``shutdown_grace`` is not (its message is
        delivered again when its lock expires).

    :meth:`run` returns after :meth:`stop`, or SIGTERM/SIGINT when ``install_signal_handlers`` is
    true and it runs in the main thread (the process is never exited here; ``pyqueue worker
    --async`` exits at once on a second signal).
    """

    _log = log
    _middleware_kind = AsyncMiddleware

    def _setup(self) -> None:
        self._is_coroutine = inspect.iscoroutinefunction(self.handler)
        # Plain handlers without handler middleware: runs of them in threads (_run_plain).
        self._plain_runs = not self._is_coroutine and self._through is None
        self._threads: ThreadPoolExecutor | None = None  # where plain handlers run, while run() runs
        self._plain_lock = threading.Lock()  # guards the two below, written by the handler threads
        self._plain_outcomes: list[tuple[Delivery, BaseException | None]] = []  # for _settle_plain
        self._plain_wake = False  # a _settle_plain is scheduled in the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._stopped: asyncio.Task[Any] | None = None  # ends at the stop: what idle waits race against
        self._heartbeat: asyncio.Task[Any] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # the runners' tasks
        self._runners_cancelled = False  # set as _drain cancels the runners' tasks after the grace period
        self._ended = asyncio.Event()  # a handler ended since the run loop last counted (or a stop)
        self._runners = Runners(self.concurrency, self._ended.set)  # the handler slots: deliveries and their runners
        self._spawned: set[asyncio.Task[Any]] = set()  # steps driven beside the run loop (acknowledgements)

    def stop(self) -> None:
        """Stop polling and end an idle wait at once (its wait task is cancelled); running handlers
        get ``shutdown_grace`` to finish, then :meth:`run` returns. Safe from any thread and from a
        signal handler."""
        self._request_stop()
        if self._loop is not None and self._stop_event is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop_event.set)
            self._loop.call_soon_threadsafe(self._ended.set)

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Run until :meth:`stop` (or a signal, see the class)."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        self._stopped = asyncio.create_task(self._stop_event.wait())
        self._heartbeat = asyncio.create_task(self._drive(self.heartbeat_steps()), name="pyqueue-heartbeat")
        if not self._is_coroutine:
            self._threads = ThreadPoolExecutor(self.concurrency, thread_name_prefix="pyqueue-handler")
        ticker = None
        try:
            with stop_signals(self._on_signal) if install_signal_handlers else nullcontext():
                conninfo = await resolve(self.queue.pool.conninfo)
                ticker = start_ticker(conninfo, self.cron_tick, self.queue.schema, log)
                await self._drive(self.run_steps(self.queue.queue))
        finally:
            await self._finish()
            if self._threads is not None:
                self._threads.shutdown(wait=False, cancel_futures=True)
            if ticker is not None:
                await asyncio.to_thread(ticker.stop, 10)

    # -- the driver ----------------------------------------------------------------------------
    async def _drive(self, generator: WorkerSteps) -> Any:
        """Perform the steps of ``generator`` in this task until it ends; returns its value."""
        stepper: Stepper[None] = Stepper(generator)
        step = stepper.step()
        while step is not None:
            try:
                result = await self._perform(step)
            except BaseException as exc:
                step = stepper.step(error=exc)
            else:
                step = stepper.step(result)
        return stepper.result

    async def _perform(self, step: WorkerStep) -> Any:
        """What each worker step of :mod:`pyqueue.core.steps` does with tasks (most frequent first)."""
        match step:
            case steps.CountHeld():
                return self._running()
            case steps.PollMessages(max_count, idle):
                return await self._poll(max_count, idle)
            case steps.StartHandlers(deliveries):
                for delivery in deliveries:
                    self._start(delivery)
                return None
            case steps.Spawn(generator):
                return self._spawn(generator)
            case steps.AckMany(lock_tokens):
                return await self.queue.ack_many(lock_tokens)
            case steps.ReleaseMany(lock_tokens):
                return await self.queue.release_many(lock_tokens)
            case steps.WaitForHandlers(seconds):
                return await self._wait_handlers(seconds)
            case steps.HeartbeatWait(seconds):
                await asyncio.sleep(seconds)
                return False  # the heartbeat task is cancelled at the end
            case steps.ExtendLock(message, timeout):
                return await message.extend(timeout)
            case steps.Nack(message, delay, error):
                return await message.nack_outcome(delay, error=error)
            case steps.SleepUnlessStopped(seconds):
                return await self._sleep(seconds)
            case steps.JoinSpawned():
                return await self._join()
            case steps.Drain(seconds):
                return await self._drain(seconds)
            case steps.HandlersFinished():
                return await self._finish()
            case _:
                assert_never(step)

    def _running(self) -> int:
        self._ended.clear()  # a handler ending from now on ends the next WaitForHandlers at once
        return self._runners.held

    async def _wait_handlers(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._ended.wait(), timeout)
        except TimeoutError:
            pass

    def _start(self, delivery: Delivery) -> None:
        if self._runners.add(delivery):
            self._start_runner()

    def _start_runner(self) -> None:
        task = asyncio.create_task(self._run_waiting())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_waiting(self) -> None:
        """A runner task: see :class:`pyqueue.core.delivery.Runners`. Coroutine handlers that do not
        suspend run one after the other in it, without a task of their own."""
        if self._plain_runs:
            return await self._run_plain()
        for delivery, one_more in self._runners.run():
            if one_more:
                self._start_runner()
            await self._handle(delivery)

    async def _handle(self, delivery: Delivery) -> None:
        call = None if self._through is None else HandlerCall(delivery.message, self.queue.queue)
        try:
            if call is None:
                await self._call(delivery.message)
            else:
                await self._through(call)  # type: ignore[misc]
        except BaseException as exc:  # whatever it raised settles it, SystemExit too, but:
            if isinstance(exc, asyncio.CancelledError):
                if self._runners_cancelled:
                    # _drain cancelled the runners after the grace period: not the handler's outcome;
                    # the delivery stays running and its lock expires (docs/state_machine.md).
                    raise
                # A task the handler awaited was cancelled (or the handler cancelled its own task):
                # a failure, and a cancellation request of this task it may hold is consumed here.
                _uncancel()
            failure = exc if call is None else self.middleware_failure(call, exc)
            if failure is not None:
                return await self._drive(self.failed_steps(delivery, failure, call))  # type: ignore[no-any-return]
        self.handler_returned(delivery)

    async def _run_plain(self) -> None:
        """A runner task of a plain handler: its run of handlers goes on in a thread
        (:meth:`_plain_run`), whose outcomes the loop settles as they come (:meth:`_settle_plain`)."""
        self._runners.started()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, self._plain_run, loop, contextvars.copy_context())

    def _plain_run(self, loop: asyncio.AbstractEventLoop, context: contextvars.Context) -> None:
        """In a thread: the handler on the waiting deliveries, one after the other, each in a copy of
        the runner task's context, until none waits. Each outcome goes to the loop: at once when
        the loop has settled every earlier one, else with the others it has not yet taken (one
        wake-up of the loop per batch of short handlers, not one per message, and never held back
        by a slow handler that follows). A runner to start (the ramp-up of
        :class:`~pyqueue.core.delivery.Runners`) is started in the loop at once."""
        while not self._runners_cancelled:
            delivery, one_more = self._runners.take()
            if delivery is None:
                return
            if one_more:
                self._in_loop(loop, self._start_runner)
            try:
                context.copy().run(self.handler, delivery.message)
            except BaseException as exc:  # whatever it raised settles it, as in _handle
                outcome: BaseException | None = exc
            else:
                outcome = None
            with self._plain_lock:
                self._plain_outcomes.append((delivery, outcome))
                wake, self._plain_wake = not self._plain_wake, True
            if wake:
                self._in_loop(loop, self._settle_plain)

    @staticmethod
    def _in_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop closed: the worker ended, the lock of the message expires
            pass

    def _settle_plain(self) -> None:
        """In the loop: settle the outcomes the handler threads recorded, as :meth:`_handle` does
        (a failure's nack in a task of its own); each delivery's end counted once settled."""
        with self._plain_lock:
            outcomes, self._plain_outcomes, self._plain_wake = self._plain_outcomes, [], False
        for delivery, exc in outcomes:
            if exc is None:
                self.handler_returned(delivery)
                self._runners.ended()
            else:
                task = asyncio.create_task(self._failed_plain(delivery, exc))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _failed_plain(self, delivery: Delivery, exc: BaseException) -> None:
        try:
            await self._drive(self.failed_steps(delivery, exc))
        finally:
            self._runners.ended()

    async def _call_handler(self, call: HandlerCall[AsyncMessage]) -> Any:
        """The innermost step of the middleware chain: the handler, its outcome and duration recorded."""
        call.started()
        try:
            result = await self._call(call.message)
        except BaseException as exc:
            self.handler_ended(call, exc)
            raise
        self.handler_ended(call, None)
        return result

    def _spawn(self, generator: WorkerSteps) -> None:
        task = asyncio.create_task(self._drive(generator))
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    async def _join(self) -> None:
        while self._spawned:
            for task in list(self._spawned):
                await task

    async def _sleep(self, seconds: float) -> None:
        assert self._stopped is not None
        await asyncio.wait({self._stopped}, timeout=seconds)

    async def _drain(self, grace: float) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._runners.held and (left := deadline - loop.time()) > 0:
            self._ended.clear()
            await self._wait_handlers(left)
        self._runners_cancelled = True
        for task in list(self._tasks):
            task.cancel()
        return self._runners.held

    async def _finish(self) -> None:
        for task in (self._heartbeat, self._stopped):
            if task is not None:
                task.cancel()

    async def _call(self, message: AsyncMessage) -> Any:
        if self._is_coroutine:
            return await self.handler(message)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, contextvars.copy_context().run, self.handler, message)

    async def _poll(self, max_count: int, idle: bool) -> list[AsyncMessage]:
        if not idle:
            return await self.queue.poll(max_count, lock_timeout=self.lock_timeout)
        assert self._stopped is not None
        # Wait for messages or for the stop, whichever first; a stop cancels the wait.
        polling = asyncio.create_task(self.queue.poll(
            max_count, lock_timeout=self.lock_timeout, wait=self.idle_check, idle_check=self.idle_check))
        await asyncio.wait({polling, self._stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not polling.done():
            polling.cancel()
            try:
                await polling
            except (asyncio.CancelledError, PyQueueError, psycopg.Error):
                pass
            return []
        return polling.result()


def _uncancel() -> None:
    """A CancelledError the running task caught and did not re-raise: withdraw the cancellation
    request it answered, if one was made of this task (``Task.uncancel()``), so that a later
    ``asyncio.timeout()`` or ``TaskGroup`` in the task is not misled by it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()
