"""The asyncio binding: :class:`AsyncDelayedQueue`, :class:`AsyncMessage` and :class:`AsyncWorker`.

The same API as :mod:`pyqueue.client` and :mod:`pyqueue.worker` on psycopg's async connections
(``psycopg.AsyncConnection``, ``psycopg_pool.AsyncConnectionPool``), for asyncio applications
(FastAPI and the like). The queries, argument checks, payload encoding and row shapes come from
:mod:`pyqueue._core`, and the worker's settings and bookkeeping from ``pyqueue.worker._WorkerCore``:
only the waiting and the running of handlers differ. Errors are the same typed exceptions.

Example::

    async with AsyncDelayedQueue(dsn, "emails") as q:
        await q.offer("welcome/42", {"to": "a@example.com"}, delay=60)
        for message in await q.poll(10, lock_timeout=30, wait=5):
            ...
            await message.ack()
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow, dict_row
from psycopg_pool import AsyncConnectionPool

from . import _core, cron
from ._core import (
    LISTEN_PROBE_TIMEOUT_S,
    LISTEN_UNAVAILABLE,
    Q_ACK,
    Q_ACK_MANY,
    Q_BACKEND_PID,
    Q_CANCEL,
    Q_CHANNEL,
    Q_CONFIGURE,
    Q_EXTEND,
    Q_GET,
    Q_NACK,
    Q_NEXT_DUE,
    Q_NOTIFY,
    Q_OFFER,
    Q_POLL,
    Q_POLL_OR_WAIT,
    Q_PURGE,
    Q_REDRIVE,
    Q_RELEASE_LOCKS,
    Q_STATS,
    Q_UNLISTEN_ALL,
    MessageBase,
    OfferOutcome,
    OfferRequest,
    QueueStats,
    common_fields,
)
from .client import StoredMessage
from .durations import Seconds, as_timedelta
from .errors import InvalidArgument, translate, translating
from .serializers import SerializerRegistry
from .serializers import registry as default_registry

__all__ = ["AsyncDelayedQueue", "AsyncMessage", "AsyncQueueCron", "AsyncTransactionalBatch", "AsyncWorker"]

AsyncConnection = psycopg.AsyncConnection[TupleRow]

log = logging.getLogger("pyqueue.aio")


async def _behind_pooler(conn: AsyncConnection) -> bool:
    """As :func:`pyqueue.client._behind_pooler`: the pid given at connect is not the server's."""
    row = await (await conn.execute(Q_BACKEND_PID)).fetchone()
    return row is not None and row[0] != conn.info.backend_pid


async def _resolve(value: Any) -> Any:
    """The pool's conninfo / kwargs: a value, or (psycopg_pool >= 3.3) a function or coroutine function."""
    if callable(value):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value


async def _configure(conn: AsyncConnection) -> None:
    if await _behind_pooler(conn):
        conn.prepare_threshold = None


@dataclass(frozen=True)
class AsyncMessage(MessageBase):
    """One delivery, as :class:`pyqueue.Message`, with coroutine ``ack``/``nack``/``extend``."""

    lock_token: UUID
    locked_until: datetime
    _client: AsyncDelayedQueue | None = field(default=None, repr=False, compare=False)
    #: ``"acked"`` or ``"nacked"`` once :meth:`ack`/:meth:`nack` on this object returned True (possibly
    #: in the caller's transaction), else None: a worker then neither acknowledges the delivery again
    #: nor counts its lock as lost.
    settled: str | None = field(default=None, init=False, repr=False, compare=False)

    def _serializers(self) -> SerializerRegistry:
        return self._client.serializers if self._client else default_registry

    @property
    def is_redelivery(self) -> bool:
        """True when this message was delivered before (``delivery_count > 1``; seed 003)."""
        return self.delivery_count > 1

    def _require_client(self) -> AsyncDelayedQueue:
        if self._client is None:
            raise InvalidArgument("this AsyncMessage is not bound to an AsyncDelayedQueue")
        return self._client

    async def ack(self, *, conn: AsyncConnection | None = None) -> bool:
        """Acknowledge (delete) this delivery. False when the lock was lost (stale token)."""
        done = await self._require_client().ack(self.lock_token, conn=conn)
        if done:
            object.__setattr__(self, "settled", "acked")
        return done

    async def nack(self, delay: Seconds = 0, *, error: str | None = None, conn: AsyncConnection | None = None) -> bool:
        """Give the message back, visible again after ``delay`` (timedelta or seconds ≥ 0)."""
        done = await self._require_client().nack(self.lock_token, delay, error=error, conn=conn)
        if done:
            object.__setattr__(self, "settled", "nacked")
        return done

    async def extend(self, timeout: Seconds, *, conn: AsyncConnection | None = None) -> datetime | None:
        """Keep the message invisible for ``timeout`` more from now; None when the lock was lost."""
        return await self._require_client().extend(self.lock_token, timeout, conn=conn)


@dataclass
class AsyncTransactionalBatch:
    """What :meth:`AsyncDelayedQueue.transaction` yields (see :class:`pyqueue.TransactionalBatch`)."""

    messages: list[AsyncMessage]
    connection: AsyncConnection

    @property
    def message(self) -> AsyncMessage | None:
        return self.messages[0] if self.messages else None


class AsyncQueueCron:
    """The schedules of one queue: ``AsyncDelayedQueue(...).cron``; the asyncio twin of
    :class:`pyqueue.cron.QueueCron` (same methods, same errors, awaited). Schedule names are unique
    in the whole database; :meth:`list` shows this queue's schedules only."""

    def __init__(self, queue: AsyncDelayedQueue) -> None:
        self._queue = queue

    async def install(
        self,
        name: str,
        *,
        schedule: str,
        payload: Any,
        tz: str = "UTC",
        payload_type: str | None = None,
        lookahead: timedelta = timedelta(hours=1),
    ) -> str:
        """Create or replace the named schedule sending ``payload`` to this queue; returns the config hash."""
        params = cron._install_params(name, self._queue.queue, schedule, payload, tz, payload_type, lookahead,
                                      self._queue.serializers)
        return str(await self._queue._one(cron._INSTALL, params, None))

    async def uninstall(self, name: str) -> bool:
        """Remove the schedule and its future messages; False when no schedule has that name."""
        return bool(await self._queue._one(cron._UNINSTALL, (name,), None))

    async def pause(self, name: str) -> bool:
        return bool(await self._queue._one(cron._PAUSE, (name,), None))

    async def resume(self, name: str) -> bool:
        return bool(await self._queue._one(cron._RESUME, (name,), None))

    async def list(self) -> list[cron.CronSchedule]:
        """This queue's schedules, by name, with their next 5 occurrences."""
        async with self._queue._conn(None) as c, c.cursor(row_factory=dict_row) as cur:
            await cur.execute(cron._SCHEDULES_OF_QUEUE, (self._queue.queue,))
            return cron._to_schedules(await cur.fetchall())

    async def tick(self) -> int:
        """Run ``dq_cron_tick()`` once; returns messages created."""
        return int(await self._queue._one(cron._TICK, None, None))


class AsyncDelayedQueue:
    """One queue over an async connection pool; the asyncio twin of :class:`pyqueue.DelayedQueue`.

    :param conninfo_or_pool: a libpq connection string/URL (an owned pool is opened on first use or
        ``async with``), or an :class:`psycopg_pool.AsyncConnectionPool` you own (autocommit or idle
        connections between uses).
    :param queue: the queue name, 1–100 characters.
    :param serializers: payload encoders/decoders by payload_type.
    :param pool_size: max connections of the owned pool.
    """

    def __init__(
        self,
        conninfo_or_pool: str | AsyncConnectionPool[Any],
        queue: str,
        *,
        serializers: SerializerRegistry | None = None,
        pool_size: int = 4,
    ) -> None:
        self.queue = _core.check_queue_name(queue)
        self.serializers = serializers or default_registry
        if isinstance(conninfo_or_pool, AsyncConnectionPool):
            self._pool = conninfo_or_pool
            self._owns_pool = False
        else:
            self._pool = AsyncConnectionPool(
                conninfo_or_pool,
                min_size=1,
                max_size=pool_size,
                kwargs={"autocommit": True},
                configure=_configure,
                open=False,
                name=f"pyqueue-aio:{queue}",
            )
            self._owns_pool = True
        self._opened = False
        self._channel: str | None = None
        self._listeners: list[AsyncConnection] = []
        self.listen_available: bool | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def open(self) -> None:
        """Open the owned pool (done by ``async with`` and on first use)."""
        if self._owns_pool and not self._opened:
            await self._pool.open()
        self._opened = True

    async def close(self) -> None:
        """Close the waiting connections, and the pool if this queue created it."""
        listeners, self._listeners = self._listeners, []
        for conn in listeners:
            await conn.close()
        if self._owns_pool and self._opened:
            await self._pool.close()
        self._opened = False

    async def __aenter__(self) -> AsyncDelayedQueue:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        return self._pool

    @property
    def cron(self) -> AsyncQueueCron:
        """This queue's recurring schedules: the asyncio twin of :attr:`pyqueue.DelayedQueue.cron`."""
        return AsyncQueueCron(self)

    @asynccontextmanager
    async def _conn(self, conn: AsyncConnection | None) -> AsyncIterator[AsyncConnection]:
        with translating():
            if conn is not None:
                yield conn
                return
            await self.open()
            c: AsyncConnection | None = None
            try:
                async with self._pool.connection() as c:
                    yield c
            except psycopg.OperationalError:
                # As pyqueue.DelayedQueue._conn: the fault that cut this connection cut the idle
                # ones too; check them, so that a retry gets a live connection.
                if c is not None and c.broken:
                    await self._pool.check()
                raise

    async def _one(
        self, query: str, params: Sequence[Any] | dict[str, Any] | None, conn: AsyncConnection | None
    ) -> Any:
        async with self._conn(conn) as c:
            row = await (await c.execute(query, params)).fetchone()
        return row[0] if row else None

    # -- offer ---------------------------------------------------------------------------------
    async def offer(
        self,
        key: str,
        payload: Any,
        at: datetime | None = None,
        delay: Seconds | None = None,
        can_update: bool = True,
        *,
        payload_type: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> OfferOutcome:
        """Offer one message (``dq_offer``); parameters, result and errors as :meth:`pyqueue.DelayedQueue.offer`."""
        params = _core.offer_params(self.serializers, self.queue, key, payload, at, delay, can_update, payload_type)
        return OfferOutcome(await self._one(Q_OFFER, params, conn))

    async def offer_many(
        self,
        items: Iterable[OfferRequest | tuple[str, Any]],
        can_update: bool = True,
        *,
        conn: AsyncConnection | None = None,
    ) -> dict[str, OfferOutcome]:
        """Offer many in one statement (``dq_offer_many``); as :meth:`pyqueue.DelayedQueue.offer_many`."""
        prepared = _core.offer_many_query(self.serializers, self.queue, items, can_update)
        if prepared is None:
            return {}
        query, params = prepared
        async with self._conn(conn) as c:
            rows = await (await c.execute(query, params)).fetchall()
        return {k: OfferOutcome(o) for k, o in rows}

    # -- poll ----------------------------------------------------------------------------------
    def _row_to_message(self, row: Sequence[Any]) -> AsyncMessage:
        return _core.delivery_from_row(AsyncMessage, row, self)

    async def _poll_once(self, c: AsyncConnection, max_count: int, lock_timeout: timedelta) -> list[AsyncMessage]:
        cur = await c.execute(Q_POLL, _core.poll_params(self.queue, max_count, lock_timeout), binary=True)
        return [self._row_to_message(r) for r in await cur.fetchall()]

    async def channel(self, *, conn: AsyncConnection | None = None) -> str:
        """The LISTEN channel of this queue (``dq_channel``), looked up once."""
        if self._channel is None:
            self._channel = str(await self._one(Q_CHANNEL, (self.queue,), conn))
        return self._channel

    async def _new_listener(self) -> AsyncConnection:
        conninfo = await _resolve(self._pool.conninfo)
        pool_kwargs = await _resolve(self._pool.kwargs)
        kwargs = {k: v for k, v in (pool_kwargs or {}).items() if k != "autocommit"}
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        try:
            pooled = await _behind_pooler(conn)
            if pooled:
                conn.prepare_threshold = None
            if self.listen_available is False:
                return conn
            channel = await self.channel(conn=conn)
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            if not pooled or self.listen_available:
                return conn
            # The probe of pyqueue.client.DelayedQueue._start_listening.
            probe = _core.probe_channel()
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(probe)))
            async with self._conn(None) as other:
                await other.execute(Q_NOTIFY, (probe,))
            arrived = False
            async for _ in conn.notifies(timeout=LISTEN_PROBE_TIMEOUT_S, stop_after=1):
                arrived = True
            if arrived:
                await conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(probe)))
                self.listen_available = True
            else:
                self.listen_available = False
                await conn.execute(Q_UNLISTEN_ALL)
                log.warning(LISTEN_UNAVAILABLE, self.queue)
            return conn
        except BaseException:
            await conn.close()
            raise

    @asynccontextmanager
    async def _listener(self) -> AsyncIterator[AsyncConnection]:
        """A dedicated connection LISTENing on this queue's channel, kept between waits; closed
        instead of kept when the caller did not finish cleanly (cancelled, failed)."""
        conn = self._listeners.pop() if self._listeners else None
        if conn is None or conn.closed:
            await self.open()
            conn = await self._new_listener()
        clean = False
        try:
            yield conn
            clean = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        finally:
            if clean and not conn.closed:
                self._listeners.append(conn)
            else:
                await conn.close()

    async def poll(
        self,
        max_count: int = 1,
        lock_timeout: Seconds = timedelta(minutes=5),
        wait: Seconds | None = None,
        *,
        idle_check: Seconds = timedelta(seconds=5),
    ) -> list[AsyncMessage]:
        """Acquire up to ``max_count`` due messages (``dq_poll_many``); with ``wait``, sleep on
        LISTEN/NOTIFY up to that long for one to become due. As :meth:`pyqueue.DelayedQueue.poll`;
        cancelling the task ends the wait (the waiting connection is then closed, not reused)."""
        lock_td = as_timedelta(lock_timeout, "lock_timeout")
        if wait is None:
            async with self._conn(None) as c:
                return await self._poll_once(c, max_count, lock_td)
        deadline = time.monotonic() + as_timedelta(wait, "wait", allow_zero=True).total_seconds()
        check_s = as_timedelta(idle_check, "idle_check").total_seconds()
        for attempt in (1, 2):
            try:
                return await self._poll_waiting(max_count, lock_td, deadline, check_s)
            except psycopg.OperationalError as exc:
                if attempt == 2 or time.monotonic() >= deadline:
                    raise translate(exc) from exc
            except psycopg.Error as exc:
                raise translate(exc) from exc
        raise AssertionError("unreachable")

    async def _poll_waiting(
        self, max_count: int, lock_td: timedelta, deadline: float, check_s: float
    ) -> list[AsyncMessage]:
        """The cycle of :meth:`pyqueue.DelayedQueue._poll_waiting` (one ``dq_poll_or_wait`` per wake-up)."""
        async with self._listener() as c:
            first = True
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and not first:
                    return []
                first = False
                max_wait = timedelta(seconds=min(max(remaining, 0.001), check_s, _core.MAX_WAIT_S))
                cur = await c.execute(
                    Q_POLL_OR_WAIT,
                    {"queue": self.queue, "max_count": max_count, "lock_timeout": lock_td, "max_wait": max_wait},
                    binary=True,
                )
                rows = await cur.fetchall()
                if rows and rows[0][0] is not None:
                    return [self._row_to_message(r[:11]) for r in rows]
                if remaining <= 0:
                    return []
                sleep_s = min(float(rows[0][11]), remaining) if rows else 0.0
                if sleep_s > 0 and self.listen_available is False:
                    await asyncio.sleep(sleep_s)
                elif sleep_s > 0:
                    async for _ in c.notifies(timeout=sleep_s, stop_after=1):
                        pass

    @asynccontextmanager
    async def transaction(
        self, max_count: int = 1, lock_timeout: Seconds = timedelta(minutes=5)
    ) -> AsyncIterator[AsyncTransactionalBatch]:
        """Exactly-once processing for database side effects, as :meth:`pyqueue.DelayedQueue.transaction`."""
        lock_td = as_timedelta(lock_timeout, "lock_timeout")
        async with self._conn(None) as c:
            async with c.transaction():
                messages = await self._poll_once(c, max_count, lock_td)
                yield AsyncTransactionalBatch(messages, c)
                if messages:
                    await c.execute(Q_ACK_MANY, ([m.lock_token for m in messages],))

    # -- finish a delivery ---------------------------------------------------------------------
    async def ack(self, lock_token: UUID, *, conn: AsyncConnection | None = None) -> bool:
        """Acknowledge the delivery held under ``lock_token`` (``dq_ack``); False if stale."""
        return bool(await self._one(Q_ACK, (lock_token,), conn))

    async def ack_many(self, messages: Iterable[AsyncMessage | UUID], *, conn: AsyncConnection | None = None) -> int:
        """Acknowledge many deliveries in one statement (``dq_ack(uuid[])``); returns how many held."""
        tokens = [m.lock_token if isinstance(m, AsyncMessage) else m for m in messages]
        if not tokens:
            return 0
        return int(await self._one(Q_ACK_MANY, (tokens,), conn) or 0)

    async def nack(
        self, lock_token: UUID, delay: Seconds = 0, *, error: str | None = None, conn: AsyncConnection | None = None
    ) -> bool:
        """Give the message back, visible after ``delay`` (``dq_nack``); False if stale."""
        delay_td = as_timedelta(delay, "delay", allow_zero=True)
        return bool(await self._one(Q_NACK, (lock_token, delay_td, error), conn))

    async def extend(
        self, lock_token: UUID, timeout: Seconds, *, conn: AsyncConnection | None = None
    ) -> datetime | None:
        """Heartbeat (``dq_extend``): invisible until now + timeout; None if the lock was lost."""
        timeout_td = as_timedelta(timeout, "timeout")
        result: datetime | None = await self._one(Q_EXTEND, (lock_token, timeout_td), conn)
        return result

    async def configure(
        self,
        *,
        max_deliveries: int | None = None,
        dead_letter_queue: str | None = None,
        archive: bool | None = None,
        retention: Seconds | None = None,
        notify: bool | None = None,
        max_payload_bytes: int | None = None,
    ) -> None:
        """Configure this queue (``dq_configure_queue``); as :meth:`pyqueue.DelayedQueue.configure`."""
        params = _core.configure_params(
            self.queue, max_deliveries, dead_letter_queue, archive, retention, notify, max_payload_bytes
        )
        async with self._conn(None) as c:
            await c.execute(Q_CONFIGURE, params)

    async def stats(self) -> QueueStats:
        """This queue's figures (``dq_queue_stats``)."""
        async with self._conn(None) as c:
            row = await (await c.execute(Q_STATS, (self.queue,))).fetchone()
        assert row is not None
        return QueueStats(*row)

    async def purge(self, *, confirm: bool = False) -> int:
        """Delete every message of this queue (``dq_purge``); ``confirm=True`` is required."""
        return int(await self._one(Q_PURGE, (self.queue, confirm), None) or 0)

    async def release_locks(self) -> int:
        """Make every in-flight message due now (``dq_release_locks``)."""
        return int(await self._one(Q_RELEASE_LOCKS, (self.queue,), None) or 0)

    async def redrive(self, max_count: int = 1000) -> int:
        """Send up to ``max_count`` dead letters of this queue back (``dq_redrive``)."""
        return int(await self._one(Q_REDRIVE, (self.queue, max_count), None) or 0)

    # -- read ----------------------------------------------------------------------------------
    async def cancel(self, key: str, *, conn: AsyncConnection | None = None) -> bool:
        """Delete the message with this key (``dq_cancel``); False when absent."""
        return bool(await self._one(Q_CANCEL, (self.queue, key), conn))

    async def get(self, key: str, *, conn: AsyncConnection | None = None) -> StoredMessage | None:
        """Read the message with this key without locking it (``dq_get``), or None.

        In a dead-letter queue, dead letters may share a key with each other and with an ordinary
        message: this returns the ordinary message if there is one, else the oldest dead letter.
        """
        async with self._conn(conn) as c:
            row = await (await c.execute(Q_GET, (self.queue, key))).fetchone()
        if row is None:
            return None
        *common, locked_until = row
        return StoredMessage(**common_fields(common), locked_until=locked_until, _registry=self.serializers)

    async def contains(self, key: str) -> bool:
        """True when a message with this key is in the queue."""
        return await self.get(key) is not None

    async def next_due(self) -> datetime | None:
        """When the next message becomes visible (``dq_next_due``), None when empty."""
        result: datetime | None = await self._one(Q_NEXT_DUE, (self.queue,), None)
        return result


# The asyncio worker lives in its own module; imported last (it uses the classes above).
from .aio_worker import AsyncWorker  # noqa: E402
