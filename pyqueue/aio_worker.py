"""The asyncio worker: :class:`AsyncWorker`, the twin of :class:`pyqueue.Worker`."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg

from .aio import AsyncDelayedQueue, AsyncMessage, _resolve
from .errors import PyQueueError
from .worker import Backoff, _WorkerCore

__all__ = ["AsyncWorker", "AsyncHandler"]

log = logging.getLogger("pyqueue.aio")


AsyncHandler = Callable[[AsyncMessage], Awaitable[Any] | Any]


class AsyncWorker(_WorkerCore):
    """Consume ``queue`` with ``handler`` in an asyncio event loop; the twin of :class:`pyqueue.Worker`
    (same parameters, defaults and delivery guarantees).

    :param handler: a coroutine function (awaited in the loop, at most ``concurrency`` at once) or
        a plain function (run in a thread with :func:`asyncio.to_thread`) taking an :class:`AsyncMessage`.

    :meth:`run` returns after :meth:`stop`, or SIGTERM/SIGINT when ``install_signal_handlers`` is
    true (a second signal exits the process at once).
    """

    def __init__(
        self,
        queue: AsyncDelayedQueue,
        handler: AsyncHandler,
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
        self._stop: asyncio.Event | None = None
        self._is_coroutine = inspect.iscoroutinefunction(handler)

    def stop(self) -> None:
        """Stop polling; running handlers get ``shutdown_grace`` to finish. Call from the loop's thread."""
        if self._stop is not None:
            self._stop.set()

    def _on_signal(self, signum: int) -> None:
        self._second_signal(signum)
        self.stop()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Run until :meth:`stop` (or a signal, see the class)."""
        self._stop = asyncio.Event()
        stop = self._stop
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
                    break
        tasks: set[asyncio.Task[None]] = set()
        heartbeat = asyncio.create_task(self._heartbeat(stop), name="pyqueue-heartbeat")
        stopping = asyncio.create_task(stop.wait())
        ticker = self._start_cron_ticker(await _resolve(self.queue.pool.conninfo))
        self._ready_line(self.queue.queue)
        try:
            while not stop.is_set():
                # Prune first: a handler records its token before its task is done, so every
                # pruned task's acknowledgement goes out now, not after the next (idle) wait.
                tasks = {t for t in tasks if not t.done()}
                await self._flush_acks()
                free = self.concurrency - len(tasks)
                if free == 0:
                    await asyncio.wait({*tasks, stopping}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                    continue
                want = min(free, self.batch_size)
                # As Worker.run: wait only when nothing runs and the last poll did not come back full.
                messages = await self._poll(want, idle=not tasks and not self._backlog, stopping=stopping)
                self._backlog = len(messages) == want
                for message in messages:
                    self._received(message)
                    tasks.add(asyncio.create_task(self._handle(message)))
                if not messages and tasks:
                    await asyncio.wait({*tasks, stopping}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
        finally:
            try:
                if tasks:
                    _, pending = await asyncio.wait(tasks, timeout=self.shutdown_grace)
                    if pending:
                        log.warning("%d handlers still running after the grace period; their messages will be "
                                    "redelivered when their locks expire", len(pending))
                        for task in pending:
                            task.cancel()
                stop.set()
                heartbeat.cancel()
                stopping.cancel()
                await self._flush_acks()
                if ticker is not None:
                    await asyncio.to_thread(ticker.stop, 10)
                log.info("worker stopped: %s", self.stats.snapshot())
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)

    async def _poll(self, max_count: int, *, idle: bool, stopping: asyncio.Task[Any]) -> list[AsyncMessage]:
        try:
            if not idle:
                messages = await self.queue.poll(max_count, lock_timeout=self.lock_timeout)
            else:
                # Wait for messages or for the stop, whichever first; a stop cancels the wait.
                polling = asyncio.create_task(self.queue.poll(
                    max_count, lock_timeout=self.lock_timeout, wait=self.idle_check, idle_check=self.idle_check))
                await asyncio.wait({polling, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not polling.done():
                    polling.cancel()
                    try:
                        await polling
                    except (asyncio.CancelledError, PyQueueError, psycopg.Error):
                        pass
                    return []
                messages = polling.result()
        except PyQueueError as exc:
            try:
                await asyncio.wait({stopping}, timeout=self._poll_failed(exc))
            except asyncio.CancelledError:
                pass
            return []
        self._poll_succeeded()
        return messages

    async def _handle(self, message: AsyncMessage) -> None:
        try:
            if self._is_coroutine:
                await self.handler(message)
            else:
                await asyncio.to_thread(self.handler, message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the handler's failure: nack with backoff
            nack = self._failed(message, exc)
            if nack is not None:
                try:
                    await message.nack(nack[0], error=nack[1])
                except PyQueueError as nack_exc:
                    log.warning("nack failed for key %r: %s (the lock will expire)", message.key, nack_exc)
            return
        self._succeeded(message)

    async def _flush_acks(self) -> None:
        tokens = self._take_done()
        if not tokens:
            return
        for attempt in (1, 2):  # one retry on a fresh connection, as the sync worker
            try:
                acked = await self.queue.ack_many(tokens)
                break
            except PyQueueError as exc:
                if attempt == 2:
                    log.warning("acknowledging %d messages failed (%s); they will be redelivered", len(tokens), exc)
                    return
                log.info("acknowledging %d messages failed (%s); retrying", len(tokens), exc)
        self._acked(tokens, acked)

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        """Every lock_timeout / 3, extend the lock of every message whose handler still runs."""
        period = self.lock_timeout.total_seconds() / 3
        while True:
            await asyncio.sleep(period)
            for message in self._running_now():
                try:
                    until = await message.extend(self.lock_timeout)
                except PyQueueError as exc:
                    log.warning("extending the lock of key %r failed: %s", message.key, exc)
                    continue
                if until is None:
                    self._lock_lost(message)
