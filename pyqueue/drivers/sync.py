"""The sync driver: runs the operations of :mod:`pyqueue.core.statements` and steps the routines of
:mod:`pyqueue.core.routines` on psycopg's blocking connections. It decides nothing: every query,
argument check and decision comes from those modules (the asyncio twin is :mod:`pyqueue.drivers.aio`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, assert_never, cast

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from ..core import routines, steps
from ..core.checks import check_conninfo, first_connection_kwargs
from ..core.statements import QueueStatements, Statement, Statements
from ..errors import PyQueueError, connection_failed, translating

__all__ = ["Connection", "Driver", "resolve", "run"]

IDLE = TransactionStatus.IDLE
T = TypeVar("T")
Connection = psycopg.Connection[TupleRow]


def run(conn: psycopg.Connection[Any], op: Statement[T]) -> T:
    """Execute ``op`` on ``conn`` and decode its rows (psycopg errors are not translated here)."""
    if op.sql is None:
        return op.decode((), [])
    cur = conn.execute(op.sql, op.params, binary=op.binary)
    if cur.description is None:
        return op.decode((), [])
    return op.decode([c.name for c in cur.description], cur.fetchall())


def resolve(value: Any) -> Any:
    """A pool's conninfo / kwargs: a value, or (psycopg_pool >= 3.3) a function returning it."""
    return value() if callable(value) else value


def _notified(conn: Connection, timeout: float) -> bool:
    """Whether a notification arrives within ``timeout`` s."""
    arrived = False
    for _ in conn.notifies(timeout=timeout, stop_after=1):
        arrived = True
    return arrived


class Driver:
    """The I/O of one sync queue: its pool, the connections it keeps LISTENing between waits
    (one per concurrently waiting thread), and the stepping of routines.

    :param conninfo_or_pool: a libpq connection string (a pool of at most ``pool_size``
        connections is created and owned; :meth:`open` opens it) or a
        :class:`psycopg_pool.ConnectionPool`.
    :raises InvalidArgument: a connection string libpq cannot parse.
    """

    def __init__(
        self, conninfo_or_pool: str | ConnectionPool[Any], statements: QueueStatements, pool_size: int
    ) -> None:
        #: The statements of the queue this driver runs (its name, schema and serializers).
        self.statements = statements
        #: What the queue learnt about waiting: its LISTEN channel, whether notifications arrive.
        self.listening = routines.Listening()
        #: What the queue learnt about its install (whether it has dq_nack_outcome).
        self.features = routines.Features()
        self._listeners: list[Connection] = []
        self._listeners_lock = threading.Lock()
        self._closed = False  # after close(), a wait that ends gives its connection back by closing it
        self._owns_pool = isinstance(conninfo_or_pool, str)
        self._opened = not self._owns_pool  # a pool passed in is the caller's to open
        self._opening = threading.Lock()
        if isinstance(conninfo_or_pool, str):
            check_conninfo(conninfo_or_pool)
            settings = statements.pool_settings(pool_size, "pyqueue")
            self._pool: ConnectionPool[Any] = ConnectionPool(
                conninfo_or_pool, configure=self._configure, open=False, **settings)
        else:
            self._pool = conninfo_or_pool

    def open(self) -> None:
        """Open the owned pool (done by ``with`` and on first use), after a first connection
        worked: made once, directly, so that a refused one raises :class:`pyqueue.ConnectionFailed`
        at once with the server's reason, and the pool stays closed (the next use tries again). A
        pool opened on a wrong DSN would retry in the background until its ``timeout`` (30 s),
        logging each attempt, and report only the timeout; once a connection worked, that
        retrying is what rides out a server restart. Safe from several threads (a lock)."""
        if self._opened:
            return
        with self._opening:
            if self._opened:
                return
            conninfo = resolve(self._pool.conninfo)
            with translating():
                try:
                    psycopg.connect(conninfo, **first_connection_kwargs(conninfo, self._pool.timeout)).close()
                except psycopg.OperationalError as exc:
                    raise connection_failed(exc) from exc
                self._pool.open()
            self._opened = True

    def _configure(self, conn: Connection) -> None:
        """Pool hook for new connections: behind a pooler, no prepared statements."""
        self.step(routines.behind_pooler(Statements()), conn)

    def close(self) -> None:
        """Close the waiting connections, and the pool if this queue created it."""
        with self._listeners_lock:
            listeners, self._listeners, self._closed = self._listeners, [], True
        for conn in listeners:
            conn.close()
        if self._owns_pool:
            self._pool.close()

    @property
    def pool(self) -> ConnectionPool[Any]:
        """The connection pool the queue runs on (one it owns is open once :meth:`open` ran:
        at ``with``, or the first call)."""
        return self._pool

    @contextmanager
    def connection(self, conn: Connection | None) -> Iterator[Connection]:
        """``conn``, or a pooled connection; psycopg errors leave as :class:`pyqueue.PyQueueError`."""
        with translating():
            if conn is not None:
                yield conn
                return
            self.open()
            c: Connection | None = None
            try:
                with self._pool.connection() as c:
                    yield c
            except psycopg.OperationalError:
                # What cut this connection (a server restart, pg_terminate_backend) usually cut the
                # pool's idle ones too, which the pool finds out only as it hands them out: check
                # them now, so that a retry gets a live connection and not the next cut one.
                if c is not None and c.broken:
                    self._pool.check()
                raise

    @contextmanager
    def transaction(self, conn: Connection | None) -> Iterator[Connection]:
        """A connection in one transaction for several statements: a pooled connection's own
        transaction (committed at exit), a savepoint of the open transaction of ``conn``, or, on a
        ``conn`` that is not autocommit and has none open, the transaction its first statement
        begins, left to the caller to commit or roll back (as a single statement on ``conn``)."""
        with self.connection(conn) as c:
            if conn is not None and not c.autocommit and c.info.transaction_status == IDLE:
                yield c
            else:
                with c.transaction():
                    yield c

    def run(self, op: Statement[T], conn: Connection | None = None) -> T:
        if op.sql is None:  # nothing to run (an empty batch): no connection either
            return op.decode((), [])
        with self.connection(conn) as c:
            return run(c, op)

    def _take_listener(self) -> Connection:
        """An idle LISTENing connection, or a new one (the pool's conninfo and kwargs) set up by
        :func:`pyqueue.core.routines.start_listening`."""
        with self._listeners_lock:
            conn = self._listeners.pop() if self._listeners else None
        if conn is not None and not conn.closed:
            return conn
        self.open()
        conninfo = resolve(self._pool.conninfo)
        pool_kwargs = resolve(self._pool.kwargs)
        kwargs = {k: v for k, v in (pool_kwargs or {}).items() if k != "autocommit"}
        conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
        try:
            self.step(routines.start_listening(self.statements, self.listening), conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _give_back(self, conn: Connection, keep: bool) -> None:
        if keep and not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            with self._listeners_lock:
                if not self._closed:  # a wait that outlived close() (a worker's idle wait) closes its own
                    self._listeners.append(conn)
                    return
        conn.close()

    def step(self, routine: steps.Routine[T], conn: Connection | None = None) -> T:
        """Perform the steps of ``routine`` on ``conn`` (or the connection it acquires) until it
        returns, or until it hands a value over (:class:`Handoff`: that value is returned, and the
        next call resumes the routine). A connection acquired and not released is closed."""
        stepper: steps.Stepper[Connection] = steps.Stepper(routine, conn)
        try:
            while (step := stepper.next()) is not None:
                try:
                    stepper.performed(step, self._perform(step, stepper.held))
                except psycopg.Error as exc:
                    stepper.failed(exc)
            return cast(T, stepper.result)
        finally:
            if (left := stepper.left_open()) is not None:
                left.close()

    def _perform(self, step: steps.ClientStep, held: Connection | None) -> Any:
        match step:
            case steps.Run(statement):
                return run(_held(held, step), statement)
            case steps.Acquire():
                return self._take_listener()
            case steps.Release(keep):
                if held is not None:
                    self._give_back(held, keep)
                return None
            case steps.Notified(timeout):
                notified = _notified(_held(held, step), timeout)
                if self._closed:  # closed meanwhile: no poll after the wait (nobody would take what it claims)
                    raise PyQueueError("the queue was closed during the wait")
                return notified
            case steps.RunPooled(statement):
                self.open()
                with self._pool.connection() as other:
                    return run(other, statement)
            case steps.Sleep(seconds):
                time.sleep(seconds)
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


def _held(conn: Connection | None, step: steps.ClientStep) -> Connection:
    """The routine's connection, which ``step`` needs."""
    if conn is None:
        raise AssertionError(f"{step} needs a connection")
    return conn
