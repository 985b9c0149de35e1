"""The asyncio client: :class:`AsyncDelayedQueue`, :class:`AsyncMessage`,
:class:`AsyncTransactionalBatch` and :func:`all_stats` (public as :mod:`pyqueue.aio`).

The same API as :mod:`pyqueue.sync.client` on psycopg's async connections (``psycopg.AsyncConnection``,
``psycopg_pool.AsyncConnectionPool``), for asyncio applications (FastAPI and the like): the same
names, parameters, defaults, results and typed errors (``tests/install/test_parity.py`` checks it), every
method that does I/O a coroutine. The statements, argument checks and decisions are those of
:mod:`pyqueue.core.statements` and :mod:`pyqueue.core.routines`; only the I/O (:mod:`pyqueue.drivers.aio`) differs.
The docstrings of :mod:`pyqueue.sync.client` describe each method in full.

Example::

    async with AsyncDelayedQueue(dsn, "emails") as q:
        await q.offer("welcome/42", {"to": "a@example.com"}, delay=60)
        for message in await q.poll(10, lock_timeout=30, wait=5):
            ...
            await message.ack()
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from ..core import routines
from ..core.graph import Graph, Node
from ..core.middleware import AsyncMiddleware, OfferCall, chain, check_middleware, wraps
from ..core.statements import QueueStatements, Statements, offer_requests
from ..drivers.aio import AsyncConnection, AsyncDriver, run
from ..durations import Seconds
from ..errors import translating
from ..model import (
    Batch,
    LockedMessage,
    NackResult,
    OfferCounts,
    OfferOutcome,
    OfferRequest,
    ParentRef,
    QueueStats,
    StoredMessage,
)
from ..serializers import SerializerRegistry
from ..serializers import registry as default_registry
from .cron import AsyncQueueCron

__all__ = ["AsyncDelayedQueue", "AsyncMessage", "AsyncTransactionalBatch", "all_stats"]


@dataclass(frozen=True)
class AsyncMessage(LockedMessage["AsyncDelayedQueue"]):
    """One delivery, as :class:`pyqueue.Message`, with coroutine ``ack``/``nack``/``extend``."""

    async def ack(self, *, conn: AsyncConnection | None = None) -> bool:
        """Acknowledge (delete) this delivery. False when the lock was lost (stale token)."""
        return self._settle("acked", await self._require_client().ack(self.lock_token, conn=conn))

    async def nack(self, delay: Seconds = 0, *, error: str | None = None, conn: AsyncConnection | None = None) -> bool:
        """Give the message back, visible again after ``delay`` (timedelta or seconds ≥ 0)."""
        client = self._require_client()
        return self._settle("nacked", await client.nack(self.lock_token, delay, error=error, conn=conn))

    async def nack_outcome(
        self, delay: Seconds = 0, *, error: str | None = None, conn: AsyncConnection | None = None
    ) -> NackResult:
        """As :meth:`pyqueue.Message.nack_outcome`."""
        result = await self._require_client().nack_outcome(self, delay, error=error, conn=conn)
        self._settle("nacked", result.nacked)
        return result

    async def dead_letter(self, error: str | None = None, *, conn: AsyncConnection | None = None) -> NackResult:
        """As :meth:`pyqueue.Message.dead_letter`."""
        result = await self._require_client().dead_letter(self.lock_token, error, conn=conn)
        self._settle("dead_lettered", result.nacked)
        return result

    async def extend(self, timeout: Seconds, *, conn: AsyncConnection | None = None) -> datetime | None:
        """Keep the message invisible for ``timeout`` more from now; None when the lock was lost."""
        return await self._require_client().extend(self.lock_token, timeout, conn=conn)


class AsyncTransactionalBatch(Batch[AsyncMessage, AsyncConnection]):
    """What :meth:`AsyncDelayedQueue.transaction` yields (see :class:`pyqueue.TransactionalBatch`)."""


class AsyncDelayedQueue:
    """One queue over an async connection pool; the asyncio twin of :class:`pyqueue.DelayedQueue`
    (same parameters; an owned pool is opened on first use or by ``async with``).

    :param conninfo_or_pool: a libpq connection string/URL, or an
        :class:`psycopg_pool.AsyncConnectionPool` you own (autocommit or idle connections between uses).
    :param queue: the queue name, 1 to :data:`pyqueue.limits.QUEUE_CHARS` characters.
    :param serializers: payload encoders/decoders by payload_type.
    :param pool_size: max connections of the owned pool.
    :param schema: the schema of the install; None: names resolved by the connection's search_path.
    :param middleware: :class:`pyqueue.aio.AsyncMiddleware` objects around each offer and batch
        (and, by default, the handler calls of this queue's workers), the first outermost.
    :raises InvalidArgument: a bad queue or schema name, a connection string libpq cannot parse.

    Given a connection string, ``async with`` or the first call connects once before opening the
    pool, and raises :class:`pyqueue.ConnectionFailed` at once when that connection is refused
    (the pool stays closed; the next call tries again).
    """

    def __init__(self, conninfo_or_pool: str | AsyncConnectionPool[Any], queue: str, *,
                 serializers: SerializerRegistry | None = None, pool_size: int = 4, schema: str | None = None,
                 middleware: Sequence[AsyncMiddleware] = ()) -> None:
        self._statements = QueueStatements(queue, schema, serializers or default_registry)
        self._driver = AsyncDriver(conninfo_or_pool, self._statements, pool_size)
        #: The queue's name, its install's schema (None: search_path) and its payload serializers.
        self.queue, self.schema, self.serializers = queue, self._statements.schema, self._statements.serializers
        #: The middleware around this queue's offers (and, by default, around the handler calls of
        #: its workers): :mod:`pyqueue.core.middleware`.
        self.middleware = check_middleware(middleware, AsyncMiddleware)
        self._offers_wrapped = wraps(self.middleware, "offer")

    async def __aenter__(self) -> AsyncDelayedQueue:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """As :meth:`pyqueue.DelayedQueue.open`."""
        await self._driver.open()

    async def close(self) -> None:
        """As :meth:`pyqueue.DelayedQueue.close`."""
        await self._driver.close()

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """As :attr:`pyqueue.DelayedQueue.pool`."""
        return self._driver.pool

    @property
    def listen_available(self) -> bool | None:
        """As :attr:`pyqueue.DelayedQueue.listen_available`."""
        return self._driver.listening.available

    @property
    def cron(self) -> AsyncQueueCron:
        """This queue's recurring schedules: the asyncio twin of :attr:`pyqueue.DelayedQueue.cron`."""
        return AsyncQueueCron(self._driver)

    # -- offer ---------------------------------------------------------------------------------
    async def offer(
        self, key: str, payload: Any, at: datetime | None = None, delay: Seconds | None = None,
        can_update: bool = True, *, payload_type: str | None = None, priority: int = 0, group: str | None = None,
        expires_at: datetime | None = None, ttl: Seconds | None = None, headers: Mapping[str, Any] | None = None,
        after: Iterable[ParentRef] | None = None, on_parent_failure: str = "wait", conn: AsyncConnection | None = None,
    ) -> OfferOutcome:
        """Offer one message (``dq_offer``); see :meth:`pyqueue.DelayedQueue.offer`."""
        if self._offers_wrapped:
            request = OfferRequest(key, payload, at, delay, payload_type, priority, group, expires_at, ttl, headers,
                                   None if after is None else tuple(after), on_parent_failure)
            outcome: OfferOutcome = await self._offer_through_middleware(
                OfferCall(self.queue, [request], can_update, False), conn)
            return outcome
        op = self._statements.offer(key, payload, at, delay, can_update, payload_type, priority, group, expires_at, ttl,
                                    headers, after, on_parent_failure)
        return await self._driver.run(op, conn)

    async def offer_many(
        self, items: Iterable[OfferRequest | tuple[str, Any]], can_update: bool = True, *,
        conn: AsyncConnection | None = None,
    ) -> dict[str, OfferOutcome]:
        """Offer many in one statement (``dq_offer_many``); see :meth:`pyqueue.DelayedQueue.offer_many`."""
        if self._offers_wrapped:
            call = OfferCall(self.queue, offer_requests(items), can_update, True)
            outcomes: dict[str, OfferOutcome] = await self._offer_through_middleware(call, conn)
            return outcomes
        return await self._driver.run(self._statements.offer_many(items, can_update), conn)

    async def offer_many_counts(
        self, items: Iterable[OfferRequest | tuple[str, Any]], can_update: bool = True, *,
        conn: AsyncConnection | None = None,
    ) -> OfferCounts:
        """Offer many, returning only the counts (``dq_offer_many_counts``); see
        :meth:`pyqueue.DelayedQueue.offer_many_counts`."""
        if self._offers_wrapped:
            call = OfferCall(self.queue, offer_requests(items), can_update, True)
            outcomes: dict[str, OfferOutcome] = await self._offer_through_middleware(call, conn)
            return OfferCounts.of(outcomes.values())
        return await self._driver.run(self._statements.offer_many_counts(items, can_update), conn)

    async def _offer_through_middleware(self, call: OfferCall, conn: Any) -> Any:
        """Run the offer ``call`` through the middleware, then its statement on ``conn``."""

        async def send(final: OfferCall) -> Any:
            return await self._driver.run(self._statements.for_queue(final.queue).offer_call(final), conn)

        return await chain(self.middleware, "offer", send)(call)

    async def offer_graph(
        self, graph: Graph, *, can_update: bool = False, conn: AsyncConnection | None = None
    ) -> dict[Node, OfferOutcome]:
        """Offer every node of ``graph`` in one transaction; see :meth:`pyqueue.DelayedQueue.offer_graph`."""
        batches, calls = graph.offer_calls(can_update)
        # Checked before any I/O (unless middleware may still change the requests).
        ops = None if self._offers_wrapped else self._statements.offer_calls(calls)
        async with self._driver.transaction(conn) as c:
            if ops is not None:
                results = [await self._driver.run(op, c) for op in ops]
            else:
                results = [await self._offer_through_middleware(call, c) for call in calls]
        return graph.outcomes(batches, results)

    # -- poll ----------------------------------------------------------------------------------
    async def channel(self, *, conn: AsyncConnection | None = None) -> str:
        """The LISTEN channel of this queue (``dq_channel``), looked up once."""
        async with self._driver.connection(conn) as c:
            return await self._driver.step(routines.channel(self._statements, self._driver.listening), c)

    async def poll(
        self, max_count: int = 1, lock_timeout: Seconds = timedelta(minutes=5), wait: Seconds | None = None, *,
        idle_check: Seconds = timedelta(seconds=5),
    ) -> list[AsyncMessage]:
        """Acquire up to ``max_count`` due messages; see :meth:`pyqueue.DelayedQueue.poll`. Cancelling
        the task ends the wait (the waiting connection is then closed, not reused)."""
        if wait is None:
            return await self._driver.run(self._statements.poll(max_count, lock_timeout, AsyncMessage, self))
        await self._driver.open()
        routine = routines.poll_waiting(
            self._statements, self._driver.listening, AsyncMessage, self, max_count, lock_timeout, wait, idle_check)
        with translating():
            return await self._driver.step(routine)

    @asynccontextmanager
    async def transaction(
        self, max_count: int = 1, lock_timeout: Seconds = timedelta(minutes=5)
    ) -> AsyncIterator[AsyncTransactionalBatch]:
        """Exactly-once processing for database side effects; see :meth:`pyqueue.DelayedQueue.transaction`."""
        routine = routines.transaction(self._statements, AsyncMessage, self, max_count, lock_timeout)
        async with self._driver.connection(None) as c, c.transaction():
            yield AsyncTransactionalBatch(await self._driver.step(routine, c), c)
            await self._driver.step(routine, c)

    # -- finish a delivery ---------------------------------------------------------------------
    async def ack(self, lock_token: UUID, *, conn: AsyncConnection | None = None) -> bool:
        """Acknowledge the delivery held under ``lock_token`` (``dq_ack``); False if stale."""
        return await self._driver.run(self._statements.ack(lock_token), conn)

    async def ack_many(self, messages: Iterable[AsyncMessage | UUID], *, conn: AsyncConnection | None = None) -> int:
        """Acknowledge many deliveries in one statement (``dq_ack_many(uuid[])``); returns how many held."""
        return await self._driver.run(self._statements.ack_many(messages), conn)

    async def release_many(self, messages: Iterable[AsyncMessage | UUID], *,
                           conn: AsyncConnection | None = None) -> int:
        """Give back deliveries whose handling never started (``dq_release(uuid[])``); see
        :meth:`pyqueue.DelayedQueue.release_many`."""
        return await self._driver.run(self._statements.release_many(messages), conn)

    async def nack(
        self, lock_token: UUID, delay: Seconds = 0, *, error: str | None = None, conn: AsyncConnection | None = None
    ) -> bool:
        """Give the message back, visible after ``delay`` (``dq_nack``); False if stale."""
        return await self._driver.run(self._statements.nack(lock_token, delay, error), conn)

    async def extend(
        self, lock_token: UUID, timeout: Seconds, *, conn: AsyncConnection | None = None
    ) -> datetime | None:
        """Heartbeat (``dq_extend``): invisible until now + timeout; None if the lock was lost."""
        return await self._driver.run(self._statements.extend(lock_token, timeout), conn)

    async def nack_outcome(
        self, message: AsyncMessage, delay: Seconds = 0, *, error: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> NackResult:
        """As :meth:`pyqueue.DelayedQueue.nack_outcome`."""
        async with self._driver.connection(conn) as c, c.transaction():
            return await self._driver.step(
                routines.nack_outcome(self._statements, self._driver.features, message, delay, error), c)

    async def dead_letter(
        self, lock_token: UUID, error: str | None = None, *, conn: AsyncConnection | None = None
    ) -> NackResult:
        """As :meth:`pyqueue.DelayedQueue.dead_letter`."""
        return await self._driver.run(self._statements.dead_letter(lock_token, error), conn)

    async def dead_letter_queue_of(self, message: AsyncMessage) -> str | None:
        """As :meth:`pyqueue.DelayedQueue.dead_letter_queue_of`."""
        async with self._driver.connection(None) as c, c.transaction():
            return await self._driver.step(routines.dead_letter_queue_of(self._statements, message), c)

    # -- operations ----------------------------------------------------------------------------
    async def configure(
        self, *, max_deliveries: int | None = None, dead_letter_queue: str | None = None,
        archive: bool | None = None, retention: Seconds | None = None, notify: bool | None = None,
        max_payload_bytes: int | None = None, max_in_flight: int | None = None, rate_limit: int | None = None,
        rate_period: Seconds | None = None, clear: Iterable[str] = (),
    ) -> None:
        """Configure this queue (``dq_configure_queue``); see :meth:`pyqueue.DelayedQueue.configure`
        (a setting left None keeps its value; ``clear`` names the settings to reset)."""
        await self._driver.run(self._statements.configure(max_deliveries, dead_letter_queue, archive, retention, notify,
                                            max_payload_bytes, max_in_flight, rate_limit, rate_period, clear))

    async def pause(self) -> bool:
        """Pause this queue (``dq_pause_queue``); see :meth:`pyqueue.DelayedQueue.pause`.

        :returns: True when the queue was not paused before."""
        return await self._driver.run(self._statements.pause())

    async def resume(self) -> bool:
        """Resume a paused queue and wake its waiting consumers (``dq_resume_queue``); see
        :meth:`pyqueue.DelayedQueue.resume`.

        :returns: True when the queue was paused."""
        return await self._driver.run(self._statements.resume())

    async def stats(self) -> QueueStats:
        """This queue's figures (``dq_queue_stats``)."""
        return await self._driver.run(self._statements.stats())

    async def purge(self, *, confirm: bool = False) -> int:
        """Delete every message of this queue (``dq_purge``); ``confirm=True`` is required."""
        return await self._driver.run(self._statements.purge(confirm))

    async def release_locks(self) -> int:
        """Make every in-flight message due now (``dq_release_locks``)."""
        return await self._driver.run(self._statements.release_locks())

    async def redrive(self, max_count: int = 1000) -> int:
        """Send up to ``max_count`` dead letters of this queue back (``dq_redrive``)."""
        return await self._driver.run(self._statements.redrive(max_count))

    async def dead_letters(self, max_rows: int = 100) -> list[dict[str, Any]]:
        """This dead-letter queue's dead letters, oldest death first (``dq_dead_letters``); see
        :meth:`pyqueue.DelayedQueue.dead_letters`."""
        return await self._driver.run(self._statements.dead_letters(max_rows))

    # -- read ----------------------------------------------------------------------------------
    async def cancel(self, key: str, *, conn: AsyncConnection | None = None) -> bool:
        """Delete the message with this key (``dq_cancel``); False when absent."""
        return await self._driver.run(self._statements.cancel(key), conn)

    async def get(self, key: str, *, conn: AsyncConnection | None = None) -> StoredMessage | None:
        """Read the message with this key without locking it (``dq_get``), or None; see
        :meth:`pyqueue.DelayedQueue.get`."""
        return await self._driver.run(self._statements.get(key), conn)

    async def contains(self, key: str) -> bool:
        """True when a message with this key is in the queue."""
        return await self.get(key) is not None

    async def next_due(self) -> datetime | None:
        """When the next message becomes visible (``dq_next_due``), None when empty."""
        return await self._driver.run(self._statements.next_due())


async def all_stats(conn: AsyncConnection, *, schema: str | None = None) -> list[QueueStats]:
    """Every queue's figures (the ``dq_stats`` view); see :func:`pyqueue.all_stats`."""
    with translating():
        return await run(conn, Statements(schema).all_stats())
