"""The asyncio driver: runs the operations of :mod:`pyqueue.core.statements` and steps the routines of
:mod:`pyqueue.core.routines` on psycopg's async connections; the twin of :mod:`pyqueue.drivers.sync`,
deciding nothing either. Cancelling a task that waits closes its waiting connection.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar, assert_never, cast

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from ..core import routines, steps
from ..core.checks import check_conninfo, first_connection_kwargs
from ..core.statements import QueueStatements, Statement, Statements
from ..errors import PyQueueError, connection_failed, translating

__all__ = ["AsyncConnection", "AsyncDriver", "run", "resolve"]

IDLE = TransactionStatus.IDLE
T = TypeVar("T")
AsyncConnection = psycopg.AsyncConnection[TupleRow]


async def run(conn: psycopg.AsyncConnection[Any], op: Statement[T]) -> T:
    """Execute ``op`` on ``conn`` and decode its rows (psycopg errors are not translated here)."""
    if op.sql is None:
        return op.decode((), [])
    cur = await conn.execute(op.sql, op.params, binary=op.binary)
    if cur.description is None:
        return op.decode((), [])
    return op.decode([c.name for c in cur.description], await cur.fetchall())


async def resolve(value: Any) -> Any:
    """A pool's conninfo / kwargs: a value, or (psycopg_pool >= 3.3) a function or coroutine function."""
    if callable(value):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value


async def _notified(conn: AsyncConnection, timeout: float) -> bool:
    """Whether a notification arrives within ``timeout`` s (the generator is run to its end: left
    suspended, it would keep the connection's lock)."""
    arrived = False
    async for _ in conn.notifies(timeout=timeout, stop_after=1):
        arrived = True
    return arrived


class AsyncDriver:
    """The I/O of one asyncio queue: its pool (an owned one is opened on first use), the
    connections it keeps LISTENing between waits, and the stepping of routines."""

    def __init__(
        self, conninfo_or_pool: str | AsyncConnectionPool[Any], statements: QueueStatements, pool_size: int
    ) -> None:
        #: The statements of the queue this driver runs (its name, schema and serializers).
        self.statements = statements
        #: What the queue learnt about waiting: its LISTEN channel, whether notifications arrive.
        self.listening = routines.Listening()
        #: What the queue learnt about its install (whether it has dq_nack_outcome).
        self.features = routines.Features()
        self._listeners: list[AsyncConnection] = []
        self._closed = False  # after close(), a wait that ends gives its connection back by closing it
        self._opened = False
        self._owns_pool = isinstance(conninfo_or_pool, str)
        if isinstance(conninfo_or_pool, str):
            check_conninfo(conninfo_or_pool)
            settings = statements.pool_settings(pool_size, "pyqueue-aio")
            self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                conninfo_or_pool, configure=self._configure, open=False, **settings)
        else:
            self._pool = conninfo_or_pool

    async def _configure(self, conn: AsyncConnection) -> None:
        await self.step(routines.behind_pooler(Statements()), conn)

    async def open(self) -> None:
        """Open the owned pool (done by ``async with`` and on first use), after a first connection
        worked: :class:`pyqueue.ConnectionFailed` at once when it is refused, and the pool stays
        closed (the next use tries again); see :meth:`pyqueue.drivers.sync.Driver.open`."""
        if self._owns_pool and not self._opened:
            conninfo = await resolve(self._pool.conninfo)
            with translating():
                try:
                    conn = await psycopg.AsyncConnection.connect(
                        conninfo, **first_connection_kwargs(conninfo, self._pool.timeout))
                except psycopg.OperationalError as exc:
                    raise connection_failed(exc) from exc
                await conn.close()
                await self._pool.open()
        self._opened, self._closed = True, False

    async def close(self) -> None:
        """Close the waiting connections, and the pool if this queue created it."""
        listeners, self._listeners, self._closed = self._listeners, [], True
        for conn in listeners:
            await conn.close()
        if self._owns_pool and self._opened:
            await self._pool.close()
        self._opened = False

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """The connection pool the queue runs on (one it owns is open once :meth:`open` ran:
        at ``with``, or the first call)."""
        return self._pool

    @asynccontextmanager
    async def connection(self, conn: AsyncConnection | None) -> AsyncIterator[AsyncConnection]:
        """As :meth:`pyqueue.drivers.sync.Driver.connection`, opening the owned pool on first use."""
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
                if c is not None and c.broken:
                    await self._pool.check()
                raise

    @asynccontextmanager
    async def transaction(self, conn: AsyncConnection | None) -> AsyncIterator[AsyncConnection]:
        """As :meth:`pyqueue.drivers.sync.Driver.transaction`."""
        async with self.connection(conn) as c:
            if conn is not None and not c.autocommit and c.info.transaction_status == IDLE:
                yield c
            else:
                async with c.transaction():
                    yield c

    async def run(self, op: Statement[T], conn: AsyncConnection | None = None) -> T:
        if op.sql is None:  # nothing to run (an empty batch): no connection either
            return op.decode((), [])
        async with self.connection(conn) as c:
            return await run(c, op)

    async def _take_listener(self) -> AsyncConnection:
        conn = self._listeners.pop() if self._listeners else None
        if conn is not None and not conn.closed:
            return conn
        await self.open()
        pool_kwargs = await resolve(self._pool.kwargs)
        kwargs = {k: v for k, v in (pool_kwargs or {}).items() if k != "autocommit"}
        conn = await psycopg.AsyncConnection.connect(await resolve(self._pool.conninfo), autocommit=True, **kwargs)
        try:
            await self.step(routines.start_listening(self.statements, self.listening), conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _give_back(self, conn: AsyncConnection, keep: bool) -> None:
        if keep and not self._closed and not conn.closed \
                and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            self._listeners.append(conn)
        else:
            await conn.close()

    async def step(self, routine: steps.Routine[T], conn: AsyncConnection | None = None) -> T:
        """As :meth:`pyqueue.drivers.sync.Driver.step`, awaiting each step."""
        stepper: steps.Stepper[AsyncConnection] = steps.Stepper(routine, conn)
        try:
            while (step := stepper.next()) is not None:
                try:
                    stepper.performed(step, await self._perform(step, stepper.held))
                except psycopg.Error as exc:
                    stepper.failed(exc)
            return cast(T, stepper.result)
        finally:
            if (left := stepper.left_open()) is not None:
                await left.close()

    async def _perform(self, step: steps.ClientStep, held: AsyncConnection | None) -> Any:
        match step:
            case steps.Run(statement):
                return await run(_held(held, step), statement)
            case steps.Acquire():
                return await self._take_listener()
            case steps.Release(keep):
                if held is not None:
                    await self._give_back(held, keep)
                return None
            case steps.Notified(timeout):
                notified = await _notified(_held(held, step), timeout)
                if self._closed:  # closed meanwhile: no poll after the wait (nobody would take what it claims)
                    raise PyQueueError("the queue was closed during the wait")
                return notified
            case steps.RunPooled(statement):
                async with self._pool.connection() as other:
                    return await run(other, statement)
            case steps.Sleep(seconds):
                await asyncio.sleep(seconds)
                return None
            case steps.ClientPid():
                return _held(held, step).info.backend_pid
            case steps.NoPrepare():
                _held(held, step).prepare_threshold = None
                return None
            case steps.Handoff():  # pragma: no cover - the Stepper never hands these out
                raise AssertionError(step)
            case _:
                assert_never(step)


def _held(conn: AsyncConnection | None, step: steps.ClientStep) -> AsyncConnection:
    """The routine's connection, which ``step`` needs."""
    if conn is None:
        raise AssertionError(f"{step} needs a connection")
    return conn
