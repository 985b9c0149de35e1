"""The synchronous client: :class:`DelayedQueue`, :class:`Message`, :class:`TransactionalBatch`
and :func:`all_stats`.

A thin binding over the ``dq_*`` SQL functions (docs/api.md): every operation is one call of a
function, all times come from the database clock, and errors are the typed exceptions of
:mod:`pyqueue.errors` carrying the server's SQLSTATE. Each method takes its statement, checked
parameters and result decoder from :mod:`pyqueue.core.statements` (or its routine from
:mod:`pyqueue.core.routines`) and only runs it (:mod:`pyqueue.drivers.sync`); :mod:`pyqueue.aio` is the
asyncio twin with the same names, parameters and rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from ..core import routines
from ..core.graph import Graph, Node
from ..core.middleware import Middleware, OfferCall, chain, check_middleware, wraps
from ..core.statements import QueueStatements, Statements, offer_requests
from ..drivers.sync import Connection, Driver, run
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
from .cron import QueueCron

__all__ = [
    "DelayedQueue", "Message", "StoredMessage", "OfferOutcome", "OfferRequest", "QueueStats", "TransactionalBatch",
    "all_stats",
]


@dataclass(frozen=True)
class Message(LockedMessage["DelayedQueue"]):
    """One delivery of a message (see :class:`pyqueue.model.LockedMessage` for its fields), settled with
    :meth:`ack` or :meth:`nack` before ``locked_until``, or delivered again (at-least-once)."""

    def ack(self, *, conn: Connection | None = None) -> bool:
        """Acknowledge (delete) this delivery. False when the lock was lost (stale token)."""
        return self._settle("acked", self._require_client().ack(self.lock_token, conn=conn))

    def nack(self, delay: Seconds = 0, *, error: str | None = None, conn: Connection | None = None) -> bool:
        """Give the message back, visible again after ``delay`` (timedelta or seconds, ≥ 0); ``error``
        is recorded as its last error (and goes with it to the dead-letter queue)."""
        return self._settle("nacked", self._require_client().nack(self.lock_token, delay, error=error, conn=conn))

    def nack_outcome(
        self, delay: Seconds = 0, *, error: str | None = None, conn: Connection | None = None
    ) -> NackResult:
        """:meth:`nack`, saying where the message went: retried (due again at ``due``), moved to its
        ``dead_letter_queue``, or stale (the lock was lost); see :meth:`DelayedQueue.nack_outcome`."""
        result = self._require_client().nack_outcome(self, delay, error=error, conn=conn)
        self._settle("nacked", result.nacked)
        return result

    def dead_letter(self, error: str | None = None, *, conn: Connection | None = None) -> NackResult:
        """Give up on this message now: move it to its queue's dead-letter queue whatever its
        ``delivery_count``, as a nack at the queue's ``max_deliveries`` does; see
        :meth:`DelayedQueue.dead_letter`."""
        result = self._require_client().dead_letter(self.lock_token, error, conn=conn)
        self._settle("dead_lettered", result.nacked)
        return result

    def extend(self, timeout: Seconds, *, conn: Connection | None = None) -> datetime | None:
        """Keep the message invisible for ``timeout`` more from now; None when the lock was lost."""
        return self._require_client().extend(self.lock_token, timeout, conn=conn)


class TransactionalBatch(Batch[Message, Connection]):
    """What :meth:`DelayedQueue.transaction` yields: the polled ``messages`` (``message``: the first
    or None) and the transaction's ``connection``, on which the handler makes its own changes."""


class DelayedQueue:
    """One queue of the delayed message queue, over a connection pool.

    :param conninfo_or_pool: a libpq connection string/URL (a small pool is created and owned), or a
        :class:`psycopg_pool.ConnectionPool` you own (its connections must be autocommit, or in
        idle state between uses; each call runs in its own transaction).
    :param queue: the queue name, 1 to :data:`pyqueue.limits.QUEUE_CHARS` characters.
    :param serializers: payload encoders/decoders by payload_type (default: the process registry).
    :param pool_size: max connections of the owned pool (ignored when a pool is passed).
    :param schema: the schema of the install (``pyqueue migrate --schema``): every statement names
        ``"schema".dq_…``. None (the default) leaves the names unqualified, resolved by the
        connection's ``search_path`` (set it in the conninfo, e.g. ``options=-csearch_path=myq``).
    :param middleware: :class:`pyqueue.Middleware` objects around each offer and offer batch (and,
        by default, around the handler calls of this queue's workers), the first outermost
        (:mod:`pyqueue.core.middleware`). Default: none.
    :raises InvalidArgument: a bad queue or schema name, a connection string libpq cannot parse,
        middleware that is not a list of :class:`pyqueue.Middleware`.

    Given a connection string, ``with``, :meth:`open` or the first call connects once before
    opening the pool, and raises :class:`pyqueue.ConnectionFailed` at once when that connection is
    refused (the pool stays closed; the next call tries again). Use as a context manager, or call
    :meth:`close`, to close an owned pool.
    """

    def __init__(
        self,
        conninfo_or_pool: str | ConnectionPool[Any],
        queue: str,
        *,
        serializers: SerializerRegistry | None = None,
        pool_size: int = 4,
        schema: str | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        self._statements = QueueStatements(queue, schema, serializers or default_registry)
        self._driver = Driver(conninfo_or_pool, self._statements, pool_size)
        #: The queue's name, its install's schema (None: search_path) and its payload serializers.
        self.queue, self.schema, self.serializers = queue, self._statements.schema, self._statements.serializers
        #: The middleware around this queue's offers (and, by default, around the handler calls of
        #: its workers): :mod:`pyqueue.core.middleware`.
        self.middleware = check_middleware(middleware, Middleware)
        self._offers_wrapped = wraps(self.middleware, "offer")

    def __enter__(self) -> DelayedQueue:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Open the owned pool (done by ``with`` and on first use), after a first connection worked:
        a refused one raises :class:`pyqueue.ConnectionFailed` at once, with the server's reason,
        and the pool stays closed (the next use tries again). Safe from several threads."""
        self._driver.open()

    def close(self) -> None:
        """Close the connections kept for waits, and the pool if this queue created it."""
        self._driver.close()

    @property
    def pool(self) -> ConnectionPool[Any]:
        """The connection pool the queue runs on (one it owns is open once :meth:`open` ran: at
        ``with``, or the first call)."""
        return self._driver.pool

    @property
    def listen_available(self) -> bool | None:
        """Whether notifications reach a LISTENing connection: None until a probe told (only behind
        a pooler is there anything to probe), False for the life of this object after a failed
        probe (waits are then timed polls)."""
        return self._driver.listening.available

    @property
    def cron(self) -> QueueCron:
        """This queue's recurring schedules (docs/cron.md): ``q.cron.install(name, schedule=…,
        payload=…, timezone=…)``, ``uninstall(name)``, ``pause``, ``resume``, ``list()``, ``tick()``."""
        return QueueCron(self._driver)

    # -- offer ---------------------------------------------------------------------------------
    def offer(
        self, key: str, payload: Any, at: datetime | None = None, delay: Seconds | None = None,
        can_update: bool = True, *, payload_type: str | None = None, priority: int = 0, group: str | None = None,
        expires_at: datetime | None = None, ttl: Seconds | None = None, headers: Mapping[str, Any] | None = None,
        after: Iterable[ParentRef] | None = None, on_parent_failure: str = "wait", conn: Connection | None = None,
    ) -> OfferOutcome:
        """Offer one message (``dq_offer``).

        :param key: de-duplication key, 1 to :data:`pyqueue.limits.KEY_CHARS` characters.
        :param payload: bytes (type ``bytes``), str (``text``) or a JSON-serializable object (``json``),
            or anything the encoder registered for ``payload_type`` takes.
        :param at: delivery time, timezone-aware; default now on the database clock.
        :param delay: or deliver this long after now (database clock); timedelta or seconds ≥ 0.
        :param can_update: replace an existing message with this key when payload, type or time differ
            (the time compared is the one offered before, ``scheduled_at_initially``), or when priority,
            group, expiry or headers differ (an update replaces them too). With the default
            time (now), a repeated offer of an existing key is therefore ``UPDATED``: it is due again now,
            its delivery_count resets and a consumer holding it loses its lock. Pass ``can_update=False``
            for insert-if-absent (idempotent producers, retries).
        :param payload_type: type tag stored with the message (1 to
            :data:`pyqueue.limits.PAYLOAD_TYPE_CHARS` characters).
        :param priority: int from :data:`pyqueue.limits.PRIORITY_MIN` to
            :data:`pyqueue.limits.PRIORITY_MAX`, default 0. Among the messages due now a higher
            priority is delivered first, equal priorities earliest due first; a priority never makes a
            message due early.
        :param group: FIFO message group, 1 to :data:`pyqueue.limits.GROUP_CHARS` characters, or None
            (default: no group). The messages of one group are delivered one at a time, in order of
            their first delivery time (then of offer): the next one only after the one delivered is
            acknowledged, cancelled, expired or dead-lettered; a nack keeps the group waiting for it
            (as SQS FIFO message groups do). Different groups, and messages without one, are not held.
        :param expires_at: the message is never delivered (nor redelivered) after this instant
            (timezone-aware, after the delivery time); a poll that meets it removes it (archived with
            outcome ``expired`` when the queue archives). Default None: it does not expire.
        :param ttl: or expire this long after the delivery time (timedelta or seconds > 0): the
            instant is computed by the database from the message's delivery time (``at``, or the
            database's now plus ``delay``), never from this machine's clock.
        :param headers: metadata such as trace context: a JSON object (a dict), at most
            :data:`pyqueue.limits.HEADERS_BYTES` bytes as JSON text, stored as jsonb and returned with
            every delivery (:attr:`Message.headers`) and by :meth:`get`. Default None.
        :param after: parents, each a key (str: a message of this queue), a ``(queue, key)`` pair, or a
            message object (a :class:`Message` being handled, a :class:`StoredMessage`, a
            :class:`pyqueue.Graph` node); at most :data:`pyqueue.limits.AFTER_PARENTS_MAX`. A new
            message is stored held (never polled, not due) until each parent that exists is
            acknowledged; then it is due at its delivery time (``at``/``delay``; already passed: at
            once) in its group. A parent that does not exist (never offered, or already
            acknowledged) counts as acknowledged. Default None: no parents. ``after`` applies to a
            *new* key: with ``can_update`` an existing key is refused (22023), without it the
            offer is ``IGNORED``.
        :param on_parent_failure: when a parent is dead-lettered, cancelled, expired or purged
            instead of acknowledged: ``"wait"`` (default: held until that parent is redriven and
            acknowledged, or the message is cancelled), ``"proceed"`` (as if acknowledged) or
            ``"dead_letter"`` (moved to this queue's dead-letter queue; without one it waits).
        :param conn: run on the caller's connection, inside its transaction (transactional outbox):
            a rollback leaves no message.
        :returns: :class:`OfferOutcome`.
        :raises InvalidArgument: (22023/22004/22001) bad key, payload, time or type; a priority out of
            range or not an int, an empty group, headers that are not a JSON object, an expiry not
            after the delivery time, both ``expires_at`` and ``ttl``, a naive ``expires_at`` or a
            ``ttl`` ≤ 0 (22023); a group over its length (:class:`pyqueue.ValueTooLong`, 22001);
            :class:`pyqueue.DatetimeOutOfRange` (22008) an expiry outside the supported range;
            :class:`pyqueue.LimitExceeded` (54000) a payload over the queue's limit, headers over
            their limit, more parents than :data:`pyqueue.limits.AFTER_PARENTS_MAX`.
            With ``after`` (22023): an element that is not a key, pair or message, the message
            itself, an unknown ``on_parent_failure``, ``can_update`` on an existing key, a parent
            that waits (through other messages) for this key: a cycle.
        """
        if self._offers_wrapped:
            request = OfferRequest(key, payload, at, delay, payload_type, priority, group, expires_at, ttl, headers,
                                   None if after is None else tuple(after), on_parent_failure)
            outcome: OfferOutcome = self._offer_through_middleware(
                OfferCall(self.queue, [request], can_update, False), conn)
            return outcome
        op = self._statements.offer(key, payload, at, delay, can_update, payload_type, priority, group, expires_at, ttl,
                                    headers, after, on_parent_failure)
        return self._driver.run(op, conn)

    def offer_many(
        self, items: Iterable[OfferRequest | tuple[str, Any]], can_update: bool = True, *,
        conn: Connection | None = None,
    ) -> dict[str, OfferOutcome]:
        """Offer many messages in one statement (``dq_offer_many``), in one transaction.

        :param items: :class:`OfferRequest` objects (each with its own time, priority, group,
            expiry, headers, ``after`` and ``on_parent_failure``, as the parameters of :meth:`offer`)
            or ``(key, payload)`` pairs (due now, no controls); at most
            :data:`pyqueue.limits.OFFER_MANY_MAX_ITEMS`, keys unique within the call. An item's
            ``after`` may name items *before* it in the same call (a graph offered at once; a
            later one is refused, so a call cannot hold a cycle). Items without parents are
            offered set-based; items with parents one at a time, after them, in input order.
        :param can_update: as :meth:`offer`, for every item.
        :param conn: the caller's connection and transaction (outbox), as in :meth:`offer`.
        :returns: ``{key: OfferOutcome}`` in input order.
        :raises InvalidArgument: a repeated key (22023), a bad element (its position named, as
            ``priorities[3]``, ``message_groups[2]`` or ``afters[2]``, 1-based, or ``items[1]``,
            0-based, when refused before any I/O; the errors of :meth:`offer`), a parent later in
            the call (22023), or too many items (54000).
        """
        if self._offers_wrapped:
            call = OfferCall(self.queue, offer_requests(items), can_update, True)
            outcomes: dict[str, OfferOutcome] = self._offer_through_middleware(call, conn)
            return outcomes
        return self._driver.run(self._statements.offer_many(items, can_update), conn)

    def offer_many_counts(
        self, items: Iterable[OfferRequest | tuple[str, Any]], can_update: bool = True, *,
        conn: Connection | None = None,
    ) -> OfferCounts:
        """Offer many messages as :meth:`offer_many` does (``dq_offer_many_counts``), returning only
        how many were created, updated and ignored: for bulk producers that do not read the
        outcome of each key (the database builds no row per key).

        :param items: as :meth:`offer_many`.
        :param can_update: as :meth:`offer`, for every item.
        :param conn: the caller's connection and transaction (outbox), as in :meth:`offer`.
        :returns: :class:`OfferCounts`.
        :raises InvalidArgument: as :meth:`offer_many`.

        With middleware around offers, the batch goes through it as an ``offer_many`` call (its
        result is ``{key: OfferOutcome}``) and the outcomes are counted here.
        """
        if self._offers_wrapped:
            call = OfferCall(self.queue, offer_requests(items), can_update, True)
            outcomes: dict[str, OfferOutcome] = self._offer_through_middleware(call, conn)
            return OfferCounts.of(outcomes.values())
        return self._driver.run(self._statements.offer_many_counts(items, can_update), conn)

    def _offer_through_middleware(self, call: OfferCall, conn: Any) -> Any:
        """Run the offer ``call`` through the middleware, then its statement on ``conn``."""

        def send(final: OfferCall) -> Any:
            return self._driver.run(self._statements.for_queue(final.queue).offer_call(final), conn)

        return chain(self.middleware, "offer", send)(call)

    def offer_graph(
        self, graph: Graph, *, can_update: bool = False, conn: Connection | None = None
    ) -> dict[Node, OfferOutcome]:
        """Offer every node of ``graph`` (:class:`pyqueue.Graph`) in one transaction: all or none.

        The nodes go out as ``dq_offer_many`` calls (:meth:`pyqueue.Graph.batches`): one for a
        graph in one queue, else one per run of nodes of a queue, each node after its parents.
        Each node is offered as :meth:`offer` with its ``after`` offers it: held until each of
        its parents is acknowledged. The middleware around offers sees each call.

        :param graph: the nodes and their parents.
        :param can_update: as :meth:`offer`; default False here, so that offering a graph again
            (a retried producer) leaves the messages already there as they are (``IGNORED``); with
            True, a node that has parents and exists already is refused (22023).
        :param conn: the caller's connection: the graph is offered in its transaction (a
            savepoint of the one open; on an autocommit connection, a transaction of its own).
        :returns: ``{Node: OfferOutcome}``, in the order the nodes were added.
        :raises InvalidArgument: the graph's edges form a cycle (before any I/O); the errors of
            :meth:`offer_many` (its element positions count within one call); a cycle through
            messages already stored (22023). Nothing is offered on error.
        """
        batches, calls = graph.offer_calls(can_update)
        # Checked before any I/O (unless middleware may still change the requests).
        ops = None if self._offers_wrapped else self._statements.offer_calls(calls)
        with self._driver.transaction(conn) as c:
            if ops is not None:
                results = [self._driver.run(op, c) for op in ops]
            else:
                results = [self._offer_through_middleware(call, c) for call in calls]
        return graph.outcomes(batches, results)

    # -- poll ----------------------------------------------------------------------------------
    def channel(self, *, conn: Connection | None = None) -> str:
        """The LISTEN channel of this queue (``dq_channel``), looked up once (on ``conn`` if given)."""
        with self._driver.connection(conn) as c:
            return self._driver.step(routines.channel(self._statements, self._driver.listening), c)

    def poll(
        self, max_count: int = 1, lock_timeout: Seconds = timedelta(minutes=5), wait: Seconds | None = None, *,
        idle_check: Seconds = timedelta(seconds=5),
    ) -> list[Message]:
        """Acquire up to ``max_count`` due messages, earliest first (``dq_poll_many``).

        :param max_count: 1 to :data:`pyqueue.limits.POLL_MAX_COUNT`.
        :param lock_timeout: visibility timeout (timedelta or seconds > 0). A handler running longer
            than this without :meth:`Message.extend` means the message is delivered twice.
        :param wait: when nothing is due, sleep on LISTEN/NOTIFY up to this long (timedelta or
            seconds) for a message to become due; ``None`` returns at once. The sleep ends early on
            a notification from an offer, and on the client's own timer at the next due time.
        :param idle_check: while waiting, re-check the queue at least this often (bounds the delay
            of a wake-up missed by a race; default 5 s). The database registers a wait of at most
            :data:`pyqueue.limits.WAIT_MAX`, so longer waits and idle checks re-register.
        :returns: the acquired messages (possibly empty).
        :raises InvalidArgument: max_count or lock_timeout out of range.
        """
        if wait is None:
            return self._driver.run(self._statements.poll(max_count, lock_timeout, Message, self))
        routine = routines.poll_waiting(
            self._statements, self._driver.listening, Message, self, max_count, lock_timeout, wait, idle_check)
        with translating():
            return self._driver.step(routine)

    @contextmanager
    def transaction(
        self, max_count: int = 1, lock_timeout: Seconds = timedelta(minutes=5)
    ) -> Iterator[TransactionalBatch]:
        """Exactly-once processing for database side effects.

        Polls inside a transaction and yields a :class:`TransactionalBatch` whose ``connection`` is
        that transaction's: the handler writes its own rows on it. On normal exit the polled
        messages are acknowledged in the same transaction and it commits, so the side effects and
        the acknowledgement happen together or not at all. On an exception everything rolls back:
        the message stays in the queue, not even its delivery_count changes. The rows stay locked
        (FOR UPDATE) for the life of the transaction, so keep the handler short.
        """
        routine = routines.transaction(self._statements, Message, self, max_count, lock_timeout)
        with self._driver.connection(None) as c, c.transaction():
            yield TransactionalBatch(self._driver.step(routine, c), c)
            self._driver.step(routine, c)

    # -- finish a delivery ---------------------------------------------------------------------
    def ack(self, lock_token: UUID, *, conn: Connection | None = None) -> bool:
        """Acknowledge (delete) the message held under ``lock_token`` (``dq_ack``); False if stale."""
        return self._driver.run(self._statements.ack(lock_token), conn)

    def ack_many(self, messages: Iterable[Message | UUID], *, conn: Connection | None = None) -> int:
        """Acknowledge many deliveries in one statement (``dq_ack_many(uuid[])``); returns how many held."""
        return self._driver.run(self._statements.ack_many(messages), conn)

    def release_many(self, messages: Iterable[Message | UUID], *, conn: Connection | None = None) -> int:
        """Give back deliveries whose handling never started, in one statement (``dq_release(uuid[])``):
        each is due again at once, at the due time it was claimed at, and its delivery is not counted
        (``delivery_count`` restored), so a message at the queue's ``max_deliveries`` is not
        dead-lettered for it. What a stopping worker does with the messages it polled ahead.

        :param messages: deliveries (:class:`Message`) or their lock tokens (UUID).
        :returns: how many were still held and are released (stale tokens are skipped).
        :raises InvalidArgument: not an iterable of deliveries or lock tokens.
        """
        return self._driver.run(self._statements.release_many(messages), conn)

    def nack(
        self, lock_token: UUID, delay: Seconds = 0, *, error: str | None = None, conn: Connection | None = None
    ) -> bool:
        """Give the message back, visible after ``delay`` (``dq_nack``); False if stale.

        :param error: the failure, at most :data:`pyqueue.limits.ERROR_CHARS` characters, kept as
            the message's last_error. At the queue's ``max_deliveries`` the message goes to its
            dead-letter queue instead.
        """
        return self._driver.run(self._statements.nack(lock_token, delay, error), conn)

    def extend(self, lock_token: UUID, timeout: Seconds, *, conn: Connection | None = None) -> datetime | None:
        """Heartbeat (``dq_extend``): invisible until now + timeout; None if the lock was lost."""
        return self._driver.run(self._statements.extend(lock_token, timeout), conn)

    def nack_outcome(
        self, message: Message, delay: Seconds = 0, *, error: str | None = None, conn: Connection | None = None
    ) -> NackResult:
        """Give ``message`` back as :meth:`nack` does and say where it went (``dq_nack_outcome``), in
        one statement on a connection of the pool (or on ``conn``: in a savepoint of its open
        transaction, else in a transaction of its own, committed). On an install of an earlier
        release, which has only ``dq_nack``, the nack is followed by :meth:`dead_letter_queue_of`'s
        reads.

        :param delay: visible again after this long (timedelta or seconds, ≥ 0).
        :param error: the failure, kept as the message's last_error (at most
            :data:`pyqueue.limits.ERROR_CHARS` characters).
        :returns: :class:`pyqueue.NackResult`: outcome ``RETRIED`` with the time the message is due
            again, ``DEAD_LETTERED`` with the dead-letter queue it was moved to at the queue's
            ``max_deliveries``, or ``STALE`` when the lock was lost.
        """
        with self._driver.connection(conn) as c, c.transaction():
            return self._driver.step(
                routines.nack_outcome(self._statements, self._driver.features, message, delay, error), c)

    def dead_letter(self, lock_token: UUID, error: str | None = None, *, conn: Connection | None = None) -> NackResult:
        """Move the message held under ``lock_token`` to its queue's dead-letter queue now
        (``dq_dead_letter``), as :meth:`nack` does at the queue's ``max_deliveries``: archived as
        dead when the queue archives, its FIFO group's next message and a ``max_in_flight`` slot
        freed. For a consumer whose own retry policy gave up before the queue's limit.

        :param error: the failure, kept as the dead letter's last_error (at most
            :data:`pyqueue.limits.ERROR_CHARS` characters); None keeps the last one recorded.
        :param conn: run on this connection, in its transaction (e.g. with the handler's own
            writes); default: a connection of the pool, committed at once.
        :returns: :class:`pyqueue.NackResult`: outcome ``DEAD_LETTERED`` with the
            ``dead_letter_queue``, or ``STALE`` when the token no longer holds the message.
        :raises NotConfigured: the queue has no dead-letter queue (SQLSTATE 55000); nothing changed
            and the token still holds the message (ack or nack it).
        :raises ValueTooLong: ``error`` is too long (22001).
        """
        return self._driver.run(self._statements.dead_letter(lock_token, error), conn)

    def dead_letter_queue_of(self, message: Message) -> str | None:
        """After ``message`` was nacked: the dead-letter queue it was moved to (the nack reached the
        queue's ``max_deliveries``), or None while it stays in this queue to be delivered again (or
        when it left otherwise, cancelled meanwhile). Workers use it to say in their log where a
        failed message went. One ``dq_get``, and a read of the dead letters only when it left.

        :returns: the dead-letter queue's name (str) or None.
        """
        with self._driver.connection(None) as c, c.transaction():
            return self._driver.step(routines.dead_letter_queue_of(self._statements, message), c)

    # -- operations ----------------------------------------------------------------------------
    def configure(
        self, *, max_deliveries: int | None = None, dead_letter_queue: str | None = None,
        archive: bool | None = None, retention: Seconds | None = None, notify: bool | None = None,
        max_payload_bytes: int | None = None, max_in_flight: int | None = None, rate_limit: int | None = None,
        rate_period: Seconds | None = None, clear: Iterable[str] = (),
    ) -> None:
        """Configure this queue (``dq_configure_queue``; needs role dq_admin).

        One rule for every setting: a setting left None keeps its current value; to reset one to
        its default (that of a queue never configured), name it in ``clear``. The call is one
        statement that locks the queue's configuration row, so a concurrent ``configure`` of
        another setting is kept, not undone.

        :param max_deliveries: deliveries before a message is dead-lettered (≥ 1); None: unchanged
            (a new queue has no limit). Needs a ``dead_letter_queue``, given now or set before.
        :param dead_letter_queue: where such messages go; None: unchanged.
        :param archive: keep acknowledged, dead and cancelled messages in ``dq_archive``; None: unchanged.
        :param retention: how long archive rows are kept (timedelta or seconds > 0); None: unchanged.
        :param notify: wake idle consumers by NOTIFY (default on); off, they poll every idle_check.
            None: unchanged.
        :param max_payload_bytes: the largest payload an offer may carry, in bytes, from
            :data:`pyqueue.limits.PAYLOAD_BYTES_MIN` to :data:`pyqueue.limits.PAYLOAD_BYTES_MAX` (a
            queue's default is :data:`pyqueue.limits.PAYLOAD_BYTES_DEFAULT`, 1 MiB); None: unchanged.
            Larger offers raise :class:`pyqueue.LimitExceeded` and write nothing.
        :param max_in_flight: the queue's concurrency limit: at most this many of its messages are
            locked at any moment, across every consumer and session (a poll returns at most the free
            slots), 1 to :data:`pyqueue.limits.MAX_IN_FLIGHT_MAX`; ``0`` clears the limit; None:
            unchanged.
        :param rate_limit: at most this many deliveries (first deliveries and redeliveries) start in
            any window of ``rate_period``, across every consumer, 1 to
            :data:`pyqueue.limits.RATE_LIMIT_MAX`; ``0`` clears the rate limit; None: unchanged.
            Needs a ``rate_period``, given now or set before.
        :param rate_period: the window of ``rate_limit`` (timedelta or seconds > 0, at most
            :data:`pyqueue.limits.RATE_PERIOD_MAX`); None: unchanged.
        :param clear: names of settings to reset to their defaults (a list of str, e.g.
            ``["max_deliveries", "dead_letter_queue"]``): ``max_deliveries`` (no delivery limit),
            ``dead_letter_queue`` (none; refused while a ``max_deliveries`` stays), ``archive``
            (off), ``retention`` (archive rows kept forever), ``notify`` (on), ``max_payload_bytes``
            (:data:`pyqueue.limits.PAYLOAD_BYTES_DEFAULT`), ``max_in_flight`` (no limit),
            ``rate_limit`` (no limit; its ``rate_period`` goes with it), ``rate_period`` (refused
            while a ``rate_limit`` stays). Default: none.
        :raises InvalidArgument: (22023) a limit below 1, no dead-letter queue, the queue itself or a
            chain of dead-letter queues leading back to it, retention ≤ 0, max_payload_bytes out of range,
            max_in_flight or rate_limit out of range, a rate_limit without a rate_period, a rate_period
            ≤ 0 or over its limit, an unknown name in ``clear`` or a setting both given and cleared;
            before any I/O, ``clear`` that is not a list of str. Nothing is changed on error.
        """
        op = self._statements.configure(max_deliveries, dead_letter_queue, archive, retention, notify,
                                        max_payload_bytes, max_in_flight, rate_limit, rate_period, clear)
        self._driver.run(op)

    def pause(self) -> bool:
        """Pause this queue (``dq_pause_queue``; needs role dq_admin): polls deliver nothing until
        :meth:`resume`, across every consumer; offers, acks, nacks and extends keep working, and the
        messages already in flight stay so. Waiting consumers sleep until the resume wakes them
        (they do not poll meanwhile, beyond their ``idle_check``).

        :returns: True when the queue was not paused before, False when it already was.
        """
        return self._driver.run(self._statements.pause())

    def resume(self) -> bool:
        """Resume a paused queue (``dq_resume_queue``; needs role dq_admin): deliveries start again
        and waiting consumers are woken at once.

        :returns: True when the queue was paused, False when it was not.
        """
        return self._driver.run(self._statements.resume())

    def stats(self) -> QueueStats:
        """This queue's figures (``dq_queue_stats``): ready, scheduled, in flight, redelivered, dead…"""
        return self._driver.run(self._statements.stats())

    def purge(self, *, confirm: bool = False) -> int:
        """Delete every message of this queue (``dq_purge``; dq_admin); ``confirm=True`` is required.

        :raises InvalidArgument: (22023) without ``confirm=True``; nothing is deleted.
        """
        return self._driver.run(self._statements.purge(confirm))

    def release_locks(self) -> int:
        """Make every in-flight message due now (``dq_release_locks``; after a known consumer crash)."""
        return self._driver.run(self._statements.release_locks())

    def redrive(self, max_count: int = 1000) -> int:
        """Treat this queue as a dead-letter queue: send up to ``max_count`` (at most
        :data:`pyqueue.limits.REDRIVE_MAX_COUNT`) of its dead letters back to the queues they died
        in (``dq_redrive``); returns how many moved."""
        return self._driver.run(self._statements.redrive(max_count))

    def dead_letters(self, max_rows: int = 100) -> list[dict[str, Any]]:
        """Treat this queue as a dead-letter queue: its dead letters, oldest death first, at most
        ``max_rows`` (1 to :data:`pyqueue.limits.DEAD_LETTERS_MAX_ROWS`), each a dict of the columns
        of ``dq_dead_letters`` (key, dead_from, dead_at, last_error, payload_text …). Role dq_admin;
        a plain read."""
        return self._driver.run(self._statements.dead_letters(max_rows))

    # -- read ----------------------------------------------------------------------------------
    def cancel(self, key: str, *, conn: Connection | None = None) -> bool:
        """Delete the message with this key, in flight or not (``dq_cancel``); False when absent."""
        return self._driver.run(self._statements.cancel(key), conn)

    def get(self, key: str, *, conn: Connection | None = None) -> StoredMessage | None:
        """Read the message with this key without locking it (``dq_get``), or None.

        In a dead-letter queue, dead letters may share a key with each other and with an ordinary
        message: this returns the ordinary message if there is one, else the oldest dead letter.
        """
        return self._driver.run(self._statements.get(key), conn)

    def contains(self, key: str) -> bool:
        """True when a message with this key is in the queue (``dq_get`` found it)."""
        return self.get(key) is not None

    def next_due(self) -> datetime | None:
        """When the next message becomes visible (``dq_next_due``), None when the queue is empty."""
        return self._driver.run(self._statements.next_due())


def all_stats(conn: Connection, *, schema: str | None = None) -> list[QueueStats]:
    """Every queue's figures (the ``dq_stats`` view of the install in ``schema``; None: found by
    the connection's search_path), on the caller's connection."""
    with translating():
        return run(conn, Statements(schema).all_stats())
