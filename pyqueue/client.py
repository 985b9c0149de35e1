"""The synchronous client: :class:`DelayedQueue`, :class:`Message`, :class:`OfferOutcome`.

A thin binding over the ``dq_*`` SQL functions (docs/api.md): every operation is one call of a
function, all times come from the database clock, and errors are the typed exceptions of
:mod:`pyqueue.errors` carrying the server's SQLSTATE.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from . import _core
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
    Q_STATS_ALL,
    Q_UNLISTEN_ALL,
    MessageBase,
    OfferOutcome,
    OfferRequest,
    QueueStats,
    common_fields,
)
from .cron import QueueCron
from .durations import Seconds, as_timedelta
from .errors import InvalidArgument, translate, translating
from .serializers import SerializerRegistry
from .serializers import registry as default_registry

__all__ = [
    "DelayedQueue", "Message", "StoredMessage", "OfferOutcome", "OfferRequest", "QueueStats", "TransactionalBatch",
    "all_stats",
]

Connection = psycopg.Connection[TupleRow]

log = logging.getLogger("pyqueue.client")


def _behind_pooler(conn: Connection) -> bool:
    """True when a connection pooler (PgBouncer…) sits between us and the server: the backend pid
    libpq was given at connect (the pooler's own cancel key) is not the server process's."""
    row = conn.execute(Q_BACKEND_PID).fetchone()
    return row is not None and row[0] != conn.info.backend_pid


def _configure(conn: Connection) -> None:
    """Pool hook for new connections: behind a pooler, psycopg's client-side prepared statements
    would be created on one server connection and used on another, so they are turned off."""
    if _behind_pooler(conn):
        conn.prepare_threshold = None

@dataclass(frozen=True)
class StoredMessage(MessageBase):
    """A message as stored (``dq_get``): no lock token, so it cannot be acknowledged."""

    locked_until: datetime | None
    _registry: SerializerRegistry = field(default_factory=lambda: default_registry, repr=False, compare=False)

    def _serializers(self) -> SerializerRegistry:
        return self._registry


@dataclass(frozen=True)
class Message(MessageBase):
    """One delivery of a message, held under its own ``lock_token`` until ``locked_until``.

    ``payload`` is decoded on first access by the decoder of ``payload_type`` (so a message of an
    unknown type can still be nacked or inspected through ``raw_payload``). ``scheduled_at`` is the
    time this delivery was due. Acknowledge it with :meth:`ack` before ``locked_until``, or it is
    delivered again (at-least-once).
    """

    lock_token: UUID
    locked_until: datetime
    _client: DelayedQueue | None = field(default=None, repr=False, compare=False)
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

    def _require_client(self) -> DelayedQueue:
        if self._client is None:
            raise InvalidArgument("this Message is not bound to a DelayedQueue")
        return self._client

    def ack(self, *, conn: Connection | None = None) -> bool:
        """Acknowledge (delete) this delivery. False when the lock was lost (stale token)."""
        done = self._require_client().ack(self.lock_token, conn=conn)
        if done:
            object.__setattr__(self, "settled", "acked")
        return done

    def nack(self, delay: Seconds = 0, *, error: str | None = None, conn: Connection | None = None) -> bool:
        """Give the message back, visible again after ``delay`` (timedelta or seconds, ≥ 0); ``error``
        is recorded as its last error (and goes with it to the dead-letter queue)."""
        done = self._require_client().nack(self.lock_token, delay, error=error, conn=conn)
        if done:
            object.__setattr__(self, "settled", "nacked")
        return done

    def extend(self, timeout: Seconds, *, conn: Connection | None = None) -> datetime | None:
        """Keep the message invisible for ``timeout`` more from now; None when the lock was lost."""
        return self._require_client().extend(self.lock_token, timeout, conn=conn)


@dataclass
class TransactionalBatch:
    """What :meth:`DelayedQueue.transaction` yields: the polled messages and the transaction's
    connection, on which the handler makes its own changes."""

    messages: list[Message]
    connection: Connection

    @property
    def message(self) -> Message | None:
        """The first (with ``max_count=1`` the only) message, or None when nothing was due."""
        return self.messages[0] if self.messages else None


class DelayedQueue:
    """One queue of the delayed message queue, over a connection pool.

    :param conninfo_or_pool: a libpq connection string/URL (a small pool is created and owned), or a
        :class:`psycopg_pool.ConnectionPool` you own (its connections must be autocommit, or in
        idle state between uses; each call runs in its own transaction).
    :param queue: the queue name, 1–100 characters.
    :param serializers: payload encoders/decoders by payload_type (default: the process registry).
    :param pool_size: max connections of the owned pool (ignored when a pool is passed).

    Use as a context manager, or call :meth:`close`, to close an owned pool.
    """

    def __init__(
        self,
        conninfo_or_pool: str | ConnectionPool[Any],
        queue: str,
        *,
        serializers: SerializerRegistry | None = None,
        pool_size: int = 4,
    ) -> None:
        self.queue = _core.check_queue_name(queue)
        self.serializers = serializers or default_registry
        if isinstance(conninfo_or_pool, ConnectionPool):
            self._pool = conninfo_or_pool
            self._owns_pool = False
        else:
            self._pool = ConnectionPool(
                conninfo_or_pool,
                min_size=1,
                max_size=pool_size,
                kwargs={"autocommit": True},
                configure=_configure,
                open=True,
                name=f"pyqueue:{queue}",
            )
            self._owns_pool = True
        self._channel: str | None = None
        # Connections that LISTEN on this queue's channel, kept open between waits (a LISTEN and
        # UNLISTEN per wait would cost two round trips); one per concurrently waiting thread.
        self._listeners: list[Connection] = []
        self._listeners_lock = threading.Lock()
        # Whether notifications reach a LISTENing connection: None until a probe told (only
        # behind a pooler is there anything to probe), False for the life of this object after
        # a failed probe (waits become timed polls).
        self.listen_available: bool | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close the waiting connections, and the pool if this queue created it."""
        with self._listeners_lock:
            listeners, self._listeners = self._listeners, []
        for conn in listeners:
            conn.close()
        if self._owns_pool:
            self._pool.close()

    def __enter__(self) -> DelayedQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pool(self) -> ConnectionPool[Any]:
        return self._pool

    @property
    def cron(self) -> QueueCron:
        """This queue's recurring schedules (docs/cron.md): ``q.cron.install(name, schedule=…,
        payload=…, tz=…)``, ``uninstall(name)``, ``pause``, ``resume``, ``list()``, ``tick()``."""
        return QueueCron(self)

    @contextmanager
    def _conn(self, conn: Connection | None) -> Iterator[Connection]:
        with translating():
            if conn is not None:
                yield conn
                return
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

    # -- offer ---------------------------------------------------------------------------------
    def offer(
        self,
        key: str,
        payload: Any,
        at: datetime | None = None,
        delay: Seconds | None = None,
        can_update: bool = True,
        *,
        payload_type: str | None = None,
        conn: Connection | None = None,
    ) -> OfferOutcome:
        """Offer one message (``dq_offer``; seed 003 offer).

        :param key: de-duplication key, 1–200 characters.
        :param payload: bytes (type ``bytes``), str (``text``) or a JSON-serializable object (``json``),
            or anything the encoder registered for ``payload_type`` takes.
        :param at: delivery time, timezone-aware; default now on the database clock.
        :param delay: or deliver this long after now (database clock); timedelta or seconds ≥ 0.
        :param can_update: replace an existing message with this key when payload, type or time differ
            (the time compared is the one offered before, ``scheduled_at_initially``). With the default
            time (now), a repeated offer of an existing key is therefore ``UPDATED``: it is due again now,
            its delivery_count resets and a consumer holding it loses its lock. Pass ``can_update=False``
            for insert-if-absent (idempotent producers, retries).
        :param payload_type: type tag stored with the message (1–100 characters).
        :param conn: run on the caller's connection, inside its transaction (transactional outbox,
            seed 001): a rollback leaves no message.
        :returns: :class:`OfferOutcome`.
        :raises InvalidArgument: (22023/22004/22001) bad key, payload, time or type.
        """
        params = _core.offer_params(self.serializers, self.queue, key, payload, at, delay, can_update, payload_type)
        with self._conn(conn) as c:
            row = c.execute(Q_OFFER, params).fetchone()
        assert row is not None
        return OfferOutcome(row[0])

    def offer_many(
        self,
        items: Iterable[OfferRequest | tuple[str, Any]],
        can_update: bool = True,
        *,
        conn: Connection | None = None,
    ) -> dict[str, OfferOutcome]:
        """Offer many messages in one statement (``dq_offer_many``), in one transaction.

        :param items: :class:`OfferRequest` objects or ``(key, payload)`` pairs (due now); at most
            100,000, keys unique within the call.
        :param can_update: as :meth:`offer`, for every item.
        :param conn: the caller's connection and transaction (outbox), as in :meth:`offer`.
        :returns: ``{key: OfferOutcome}`` in input order.
        :raises InvalidArgument: a repeated key (22023), a bad element, or over 100,000 items (54000).
        """
        prepared = _core.offer_many_query(self.serializers, self.queue, items, can_update)
        if prepared is None:
            return {}
        query, params = prepared
        with self._conn(conn) as c:
            rows = c.execute(query, params).fetchall()
        return {k: OfferOutcome(o) for k, o in rows}

    # -- poll ----------------------------------------------------------------------------------
    def _row_to_message(self, row: Sequence[Any]) -> Message:
        """A ``dq_delivery`` row (the columns of Q_POLL, in order) as a Message."""
        return _core.delivery_from_row(Message, row, self)

    def _poll_once(self, c: Connection, max_count: int, lock_timeout: timedelta) -> list[Message]:
        # Binary results: timestamptz and uuid columns decode about 3 us a row faster than text.
        rows = c.execute(Q_POLL, _core.poll_params(self.queue, max_count, lock_timeout), binary=True).fetchall()
        return [self._row_to_message(r) for r in rows]

    def channel(self, *, conn: Connection | None = None) -> str:
        """The LISTEN channel of this queue (``dq_channel``), looked up once (on ``conn`` if given)."""
        if self._channel is None:
            with self._conn(conn) as c:
                row = c.execute(Q_CHANNEL, (self.queue,)).fetchone()
            assert row is not None
            self._channel = str(row[0])
        return self._channel

    @contextmanager
    def _listener(self) -> Iterator[Connection]:
        """A dedicated autocommit connection already LISTENing on this queue's channel.

        Taken from the idle ones or opened (with the pool's conninfo and kwargs); given back when
        the caller finishes cleanly, closed otherwise (a broken connection is never reused).
        """
        with self._listeners_lock:
            conn = self._listeners.pop() if self._listeners else None
        if conn is None or conn.closed:
            conninfo = self._pool.conninfo() if callable(self._pool.conninfo) else self._pool.conninfo
            pool_kwargs = self._pool.kwargs() if callable(self._pool.kwargs) else self._pool.kwargs
            kwargs = {k: v for k, v in (pool_kwargs or {}).items() if k != "autocommit"}
            conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
            try:
                self._start_listening(conn)
            except BaseException:
                conn.close()
                raise
        clean = False
        try:
            yield conn
            clean = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        finally:
            if clean and not conn.closed:
                with self._listeners_lock:
                    self._listeners.append(conn)
            else:
                conn.close()

    def _start_listening(self, conn: Connection) -> None:
        """LISTEN on this queue's channel; behind a pooler, first check that a notification sent
        from another connection arrives (a transaction-pooling PgBouncer hands the session to
        other clients between transactions, so it would not). Without notifications the waits
        fall back to timed polls (:attr:`listen_available` False), logged once."""
        pooled = _behind_pooler(conn)
        if pooled:
            conn.prepare_threshold = None
        if self.listen_available is False:
            return
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel(conn=conn))))
        if not pooled or self.listen_available:
            return
        probe = _core.probe_channel()
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(probe)))
        with self._pool.connection() as other:
            other.execute(Q_NOTIFY, (probe,))
        arrived = any(True for _ in conn.notifies(timeout=LISTEN_PROBE_TIMEOUT_S, stop_after=1))
        if arrived:
            conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(probe)))
            self.listen_available = True
        else:
            self.listen_available = False
            conn.execute(Q_UNLISTEN_ALL)
            log.warning(LISTEN_UNAVAILABLE, self.queue)

    def poll(
        self,
        max_count: int = 1,
        lock_timeout: Seconds = timedelta(minutes=5),
        wait: Seconds | None = None,
        *,
        idle_check: Seconds = timedelta(seconds=5),
    ) -> list[Message]:
        """Acquire up to ``max_count`` due messages, earliest first (``dq_poll_many``).

        :param max_count: 1–10,000.
        :param lock_timeout: visibility timeout (timedelta or seconds > 0). A handler running longer
            than this without :meth:`Message.extend` means the message is delivered twice.
        :param wait: when nothing is due, sleep on LISTEN/NOTIFY up to this long (timedelta or
            seconds) for a message to become due; ``None`` returns at once. The sleep ends early on
            a notification from an offer, and on the client's own timer at the next due time.
        :param idle_check: while waiting, re-check the queue at least this often (bounds the delay
            of a wake-up missed by a race; default 5 s). The database registers a wait of at most
            1 hour, so longer waits and idle checks re-register every hour.
        :returns: the acquired messages (possibly empty).
        :raises InvalidArgument: max_count or lock_timeout out of range.
        """
        lock_td = as_timedelta(lock_timeout, "lock_timeout")
        if wait is None:
            with self._conn(None) as c:
                return self._poll_once(c, max_count, lock_td)
        deadline = time.monotonic() + as_timedelta(wait, "wait", allow_zero=True).total_seconds()
        check_s = as_timedelta(idle_check, "idle_check").total_seconds()
        # A kept-open waiting connection may have been closed by the server meanwhile (restart,
        # pg_terminate_backend, idle timeout): retry once on a fresh one. A poll whose result was lost
        # with the connection only delays those messages until their lock expires (at-least-once).
        for attempt in (1, 2):
            try:
                return self._poll_waiting(max_count, lock_td, deadline, check_s)
            except psycopg.OperationalError as exc:
                if attempt == 2 or time.monotonic() >= deadline:
                    raise translate(exc) from exc
            except psycopg.Error as exc:
                raise translate(exc) from exc
        raise AssertionError("unreachable")

    def _poll_waiting(self, max_count: int, lock_td: timedelta, deadline: float, check_s: float) -> list[Message]:
        """One ``dq_poll_or_wait`` per cycle: it ends the previous wait, polls, and when nothing came
        registers the wait and says how long to sleep; then sleep on LISTEN until a notification or
        that time. An idle consumer thus costs one statement per wake-up. The registration is left
        in place on return: it expires by itself (at most ``idle_check`` later) and the next call
        replaces it."""
        with self._listener() as c:
            first = True
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 and not first:
                    return []
                first = False
                max_wait = timedelta(seconds=min(max(remaining, 0.001), check_s, _core.MAX_WAIT_S))
                rows = c.execute(
                    Q_POLL_OR_WAIT,
                    {"queue": self.queue, "max_count": max_count, "lock_timeout": lock_td, "max_wait": max_wait},
                    binary=True,
                ).fetchall()
                if rows and rows[0][0] is not None:
                    return [self._row_to_message(r[:11]) for r in rows]
                if remaining <= 0:
                    return []
                sleep_s = min(float(rows[0][11]), remaining) if rows else 0.0
                if sleep_s > 0 and self.listen_available is False:
                    time.sleep(sleep_s)
                elif sleep_s > 0:
                    for _ in c.notifies(timeout=sleep_s, stop_after=1):
                        pass

    @contextmanager
    def transaction(
        self, max_count: int = 1, lock_timeout: Seconds = timedelta(minutes=5)
    ) -> Iterator[TransactionalBatch]:
        """Exactly-once processing for database side effects (seed 001).

        Polls inside a transaction and yields a :class:`TransactionalBatch` whose ``connection`` is
        that transaction's: the handler writes its own rows on it. On normal exit the polled
        messages are acknowledged in the same transaction and it commits, so the side effects and
        the acknowledgement happen together or not at all. On an exception everything rolls back:
        the message stays in the queue, not even its delivery_count changes. The rows stay locked
        (FOR UPDATE) for the life of the transaction, so keep the handler short.
        """
        lock_td = as_timedelta(lock_timeout, "lock_timeout")
        with self._conn(None) as c:
            with c.transaction():
                messages = self._poll_once(c, max_count, lock_td)
                yield TransactionalBatch(messages, c)
                if messages:
                    c.execute(Q_ACK_MANY, ([m.lock_token for m in messages],))

    # -- finish a delivery ---------------------------------------------------------------------
    def ack(self, lock_token: UUID, *, conn: Connection | None = None) -> bool:
        """Acknowledge (delete) the message held under ``lock_token`` (``dq_ack``); False if stale."""
        with self._conn(conn) as c:
            row = c.execute(Q_ACK, (lock_token,)).fetchone()
        return bool(row and row[0])

    def ack_many(self, messages: Iterable[Message | UUID], *, conn: Connection | None = None) -> int:
        """Acknowledge many deliveries in one statement (``dq_ack(uuid[])``); returns how many held."""
        tokens = [m.lock_token if isinstance(m, Message) else m for m in messages]
        if not tokens:
            return 0
        with self._conn(conn) as c:
            row = c.execute(Q_ACK_MANY, (tokens,)).fetchone()
        return int(row[0]) if row else 0

    def nack(
        self, lock_token: UUID, delay: Seconds = 0, *, error: str | None = None, conn: Connection | None = None
    ) -> bool:
        """Give the message back, visible after ``delay`` (``dq_nack``; seed 002 reject); False if stale.

        :param error: the failure, ≤ 10,000 characters, kept as the message's last_error. At the
            queue's ``max_deliveries`` the message goes to its dead-letter queue instead.
        """
        delay_td = as_timedelta(delay, "delay", allow_zero=True)
        with self._conn(conn) as c:
            row = c.execute(Q_NACK, (lock_token, delay_td, error)).fetchone()
        return bool(row and row[0])

    def configure(
        self,
        *,
        max_deliveries: int | None = None,
        dead_letter_queue: str | None = None,
        archive: bool | None = None,
        retention: Seconds | None = None,
        notify: bool | None = None,
        max_payload_bytes: int | None = None,
    ) -> None:
        """Configure this queue (``dq_configure_queue``; needs role dq_admin).

        :param max_deliveries: deliveries before a message is dead-lettered (≥ 1); None: no limit.
            Set together with ``dead_letter_queue`` (both None clears the limit).
        :param dead_letter_queue: where such messages go (required with ``max_deliveries``).
        :param archive: keep acknowledged, dead and cancelled messages in ``dq_archive``; None: unchanged.
        :param retention: how long archive rows are kept (timedelta or seconds > 0); None: unchanged.
        :param notify: wake idle consumers by NOTIFY (default on); off, they poll every idle_check.
        :param max_payload_bytes: the largest payload an offer may carry, in bytes, 1024 to 1073741824
            (the default of a queue is 1048576, 1 MiB); None: unchanged. Larger offers raise
            :class:`pyqueue.LimitExceeded` and write nothing.
        :raises InvalidArgument: (22023) a limit below 1, no dead-letter queue, the queue itself or a
            chain of dead-letter queues leading back to it, retention ≤ 0, max_payload_bytes out of range.
        """
        params = _core.configure_params(
            self.queue, max_deliveries, dead_letter_queue, archive, retention, notify, max_payload_bytes
        )
        with self._conn(None) as c:
            c.execute(Q_CONFIGURE, params)

    def stats(self) -> QueueStats:
        """This queue's figures (``dq_queue_stats``): ready, scheduled, in flight, redelivered, dead…"""
        with self._conn(None) as c:
            row = c.execute(Q_STATS, (self.queue,)).fetchone()
        assert row is not None
        return QueueStats(*row)

    def purge(self, *, confirm: bool = False) -> int:
        """Delete every message of this queue (``dq_purge``; dq_admin); ``confirm=True`` is required.

        :raises InvalidArgument: (22023) without ``confirm=True``; nothing is deleted.
        """
        with self._conn(None) as c:
            row = c.execute(Q_PURGE, (self.queue, confirm)).fetchone()
        return int(row[0]) if row else 0

    def release_locks(self) -> int:
        """Make every in-flight message due now (``dq_release_locks``; after a known consumer crash)."""
        with self._conn(None) as c:
            row = c.execute(Q_RELEASE_LOCKS, (self.queue,)).fetchone()
        return int(row[0]) if row else 0

    def redrive(self, max_count: int = 1000) -> int:
        """Treat this queue as a dead-letter queue: send up to ``max_count`` of its dead letters back to
        the queues they died in (``dq_redrive``); returns how many moved."""
        with self._conn(None) as c:
            row = c.execute(Q_REDRIVE, (self.queue, max_count)).fetchone()
        return int(row[0]) if row else 0

    def extend(self, lock_token: UUID, timeout: Seconds, *, conn: Connection | None = None) -> datetime | None:
        """Heartbeat (``dq_extend``; seed 004): invisible until now + timeout; None if the lock was lost."""
        timeout_td = as_timedelta(timeout, "timeout")
        with self._conn(conn) as c:
            row = c.execute(Q_EXTEND, (lock_token, timeout_td)).fetchone()
        return row[0] if row else None

    # -- read ----------------------------------------------------------------------------------
    def cancel(self, key: str, *, conn: Connection | None = None) -> bool:
        """Delete the message with this key, in flight or not (``dq_cancel``); False when absent."""
        with self._conn(conn) as c:
            row = c.execute(Q_CANCEL, (self.queue, key)).fetchone()
        return bool(row and row[0])

    def get(self, key: str, *, conn: Connection | None = None) -> StoredMessage | None:
        """Read the message with this key without locking it (``dq_get``), or None.

        In a dead-letter queue, dead letters may share a key with each other and with an ordinary
        message: this returns the ordinary message if there is one, else the oldest dead letter.
        """
        with self._conn(conn) as c:
            row = c.execute(Q_GET, (self.queue, key)).fetchone()
        if row is None:
            return None
        *common, locked_until = row
        return StoredMessage(**common_fields(common), locked_until=locked_until, _registry=self.serializers)

    def contains(self, key: str) -> bool:
        """True when a message with this key is in the queue (seed 003 containsMessage)."""
        return self.get(key) is not None

    def next_due(self) -> datetime | None:
        """When the next message becomes visible (``dq_next_due``), None when the queue is empty."""
        with self._conn(None) as c:
            row = c.execute(Q_NEXT_DUE, (self.queue,)).fetchone()
        return row[0] if row else None


def all_stats(conn: Connection) -> list[QueueStats]:
    """Every queue's figures (the ``dq_stats`` view), on the caller's connection."""
    with translating():
        return [QueueStats(*row) for row in conn.execute(Q_STATS_ALL).fetchall()]
