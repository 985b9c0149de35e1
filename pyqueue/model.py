"""The row types of the binding, shared by the sync and the asyncio clients.

Each class here holds every field and rule of its kind; the clients only add their I/O:
:class:`pyqueue.Message` and :class:`pyqueue.aio.AsyncMessage` are :class:`LockedMessage` with a
blocking or an awaited ``ack``/``nack``/``extend``, :class:`pyqueue.TransactionalBatch` and
:class:`pyqueue.aio.AsyncTransactionalBatch` are :class:`Batch` over their kind of connection.
Field names are the column names of the SQL results (see :mod:`pyqueue.core.statements`), which is how the
decoders build these objects.
"""

from __future__ import annotations

import collections
import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable
from uuid import UUID

from .errors import InvalidArgument
from .serializers import SerializerRegistry
from .serializers import registry as default_registry

__all__ = [
    "OfferCounts",
    "OfferOutcome",
    "OfferRequest",
    "ParentRef",
    "Named",
    "NackOutcome",
    "NackResult",
    "MessageBase",
    "StoredMessage",
    "LockedMessage",
    "Batch",
    "QueueStats",
    "CronSchedule",
    "delivery_from_row",
    "common_fields",
]

C = TypeVar("C")  # the client a delivery is bound to (DelayedQueue or AsyncDelayedQueue)
M = TypeVar("M")  # a delivery class (Message or AsyncMessage)
K = TypeVar("K")  # a connection class (psycopg.Connection or psycopg.AsyncConnection)


class OfferOutcome(enum.Enum):
    """Result of an offer: a new key, a replaced message, or nothing changed."""

    CREATED = "created"
    UPDATED = "updated"
    IGNORED = "ignored"


@dataclass(frozen=True, slots=True)
class OfferCounts:
    """How many elements of a batch offer were created, updated and ignored
    (:meth:`pyqueue.DelayedQueue.offer_many_counts`).

    :ivar created: new keys.
    :ivar updated: existing messages replaced (``can_update`` and something differed).
    :ivar ignored: elements that changed nothing.
    """

    created: int
    updated: int
    ignored: int

    @classmethod
    def of(cls, outcomes: Iterable[OfferOutcome]) -> OfferCounts:
        """The counts of ``outcomes`` (the values of :meth:`pyqueue.DelayedQueue.offer_many`'s result)."""
        tally = collections.Counter(outcomes)
        return cls(tally[OfferOutcome.CREATED], tally[OfferOutcome.UPDATED], tally[OfferOutcome.IGNORED])


class NackOutcome(enum.Enum):
    """Where a nacked message went: back to its queue, to its dead-letter queue, or nowhere (the
    lock token no longer held it)."""

    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"
    STALE = "stale"


@dataclass(frozen=True)
class NackResult:
    """What a nack did (``dq_nack_outcome``).

    :param outcome: :class:`NackOutcome`.
    :param due: when the message is due again (timezone-aware), for ``RETRIED``; else None.
    :param dead_letter_queue: the queue it was moved to at its queue's ``max_deliveries``, for
        ``DEAD_LETTERED``; else None.
    """

    outcome: NackOutcome
    due: datetime | None = None
    dead_letter_queue: str | None = None

    @property
    def nacked(self) -> bool:
        """True unless the lock was lost (what ``nack`` returns)."""
        return self.outcome is not NackOutcome.STALE


@runtime_checkable
class Named(Protocol):
    """Anything that names a message by its queue and key: a delivery (:class:`pyqueue.Message`), a
    :class:`StoredMessage`, a node of a :class:`pyqueue.Graph`."""

    @property
    def queue(self) -> str: ...

    @property
    def key(self) -> str: ...


#: A parent named in ``after``: a key (str: a message of the child's own queue), a ``(queue, key)``
#: pair, or an object with ``queue`` and ``key`` (:class:`Named`: a delivery, a stored message, a
#: graph node).
ParentRef = str | tuple[str, str] | Named


@dataclass(frozen=True)
class OfferRequest:
    """One message for :meth:`pyqueue.DelayedQueue.offer_many`.

    :param key: de-duplication key, 1 to :data:`pyqueue.limits.KEY_CHARS` characters.
    :param payload: bytes, str, or any object the payload_type's encoder takes (JSON by default).
    :param at: delivery time (timezone-aware); ``None`` with ``delay=None`` means now (database clock).
    :param delay: delivery after this long from now on the database clock (timedelta or seconds).
    :param payload_type: type tag; inferred from the payload when ``None`` (bytes/text/json).
    :param priority: among due messages a higher one is delivered first (int,
        :data:`pyqueue.limits.PRIORITY_MIN` to :data:`pyqueue.limits.PRIORITY_MAX`, default 0).
    :param group: FIFO message group (str, 1 to :data:`pyqueue.limits.GROUP_CHARS` characters), or
        None for none: the messages of a group are delivered one at a time, in order.
    :param expires_at: never delivered after this instant (timezone-aware, after the delivery time).
    :param ttl: or expire this long after the delivery time (timedelta or seconds > 0), computed
        on the database clock; not together with ``expires_at``.
    :param headers: metadata (a JSON object, at most :data:`pyqueue.limits.HEADERS_BYTES` bytes as
        text), returned with every delivery.
    :param after: parents (:data:`ParentRef`: a key of this queue, a ``(queue, key)`` pair or a
        message object): a new message is held until each of them that exists is acknowledged.
        A parent may be another element of the same batch that comes *before* this one.
    :param on_parent_failure: ``"wait"`` (default), ``"dead_letter"`` or ``"proceed"``: what happens
        to this message when a parent is dead-lettered, cancelled, expired or purged instead.

    See :meth:`pyqueue.DelayedQueue.offer` for each field's rules and errors.
    """

    key: str
    payload: Any
    at: datetime | None = None
    delay: timedelta | float | None = None
    payload_type: str | None = None
    priority: int = 0
    group: str | None = None
    expires_at: datetime | None = None
    ttl: timedelta | float | None = None
    headers: Mapping[str, Any] | None = None
    after: Sequence[ParentRef] | None = None
    on_parent_failure: str = "wait"


@dataclass(frozen=True)
class MessageBase:
    """The columns shared by ``dq_message`` (dq_get) and ``dq_delivery`` (dq_poll_many) rows.

    :ivar priority: the message's priority (higher first among due messages; default 0).
    :ivar group: its FIFO message group (column ``message_group``), or None.
    :ivar expires_at: the instant after which it is never delivered, or None.
    :ivar headers: its headers (a JSON object decoded as a dict), or None.

    These four are keyword-only with defaults, so that a message built by hand (in a test) needs
    only the fields it had before them.
    """

    id: int
    queue: str
    key: str
    raw_payload: bytes
    payload_type: str
    scheduled_at: datetime
    scheduled_at_initially: datetime
    created_at: datetime
    delivery_count: int
    priority: int = field(default=0, kw_only=True)
    group: str | None = field(default=None, kw_only=True)
    expires_at: datetime | None = field(default=None, kw_only=True)
    headers: dict[str, Any] | None = field(default=None, kw_only=True)

    def _serializers(self) -> SerializerRegistry:
        return default_registry

    @cached_property
    def payload(self) -> Any:
        """The payload decoded by its payload_type; raises :class:`pyqueue.UnknownPayloadType`."""
        return self._serializers().decode(self.raw_payload, self.payload_type)


@dataclass(frozen=True)
class StoredMessage(MessageBase):
    """A message as stored (``dq_get``): no lock token, so it cannot be acknowledged.

    :ivar released_at: when its parents released it (the last one acknowledged, or a parent's other
        fate with ``on_parent_failure="proceed"``), or None: it never waited for parents (a re-offer
        of its key makes it a new message and clears it).
    """

    locked_until: datetime | None
    released_at: datetime | None = field(default=None, kw_only=True)
    _registry: SerializerRegistry = field(default_factory=lambda: default_registry, repr=False, compare=False)

    def _serializers(self) -> SerializerRegistry:
        return self._registry


@dataclass(frozen=True)
class LockedMessage(MessageBase, Generic[C]):
    """One delivery of a message, held under its own ``lock_token`` until ``locked_until``.

    ``payload`` is decoded on first access by the decoder of ``payload_type`` (so a message of an
    unknown type can still be nacked or inspected through ``raw_payload``). ``scheduled_at`` is the
    time this delivery was due. Acknowledge it before ``locked_until``, or it is delivered again
    (at-least-once). ``claimed_at`` is when this delivery was claimed (database clock; None only
    for a message built by hand).
    """

    lock_token: UUID
    locked_until: datetime
    claimed_at: datetime | None = field(default=None, kw_only=True)
    _client: C | None = field(default=None, repr=False, compare=False)
    #: ``"acked"``, ``"nacked"`` or ``"dead_lettered"`` once ``ack``/``nack``/``dead_letter`` on this
    #: object returned True (possibly in the caller's transaction), else None: a worker then neither
    #: acknowledges the delivery again nor counts its lock as lost.
    settled: str | None = field(default=None, init=False, repr=False, compare=False)

    def _serializers(self) -> SerializerRegistry:
        serializers: SerializerRegistry | None = getattr(self._client, "serializers", None)
        return serializers or default_registry

    @property
    def is_redelivery(self) -> bool:
        """True when this message was delivered before (``delivery_count > 1``)."""
        return self.delivery_count > 1

    def _require_client(self) -> C:
        if self._client is None:
            raise InvalidArgument(f"this {type(self).__name__} is not bound to a queue")
        return self._client

    def _settle(self, outcome: str, done: bool) -> bool:
        """Record ``outcome`` ("acked"/"nacked") in :attr:`settled` when ``done``; returns ``done``."""
        if done:
            object.__setattr__(self, "settled", outcome)
        return done


@dataclass
class Batch(Generic[M, K]):
    """What a queue's ``transaction()`` yields: the polled messages and the transaction's
    connection, on which the handler makes its own changes."""

    messages: list[M]
    connection: K

    @property
    def message(self) -> M | None:
        """The first (with ``max_count=1`` the only) message, or None when nothing was due."""
        return self.messages[0] if self.messages else None


@dataclass(frozen=True)
class QueueStats:
    """One row of ``dq_stats`` / ``dq_queue_stats`` (counts are exact unless ``approximate``)."""

    queue: str
    ready: int
    scheduled: int
    in_flight: int
    redelivered: int
    dead: int
    oldest_ready_age: timedelta | None
    next_due: datetime | None
    acked_last_minute: int | None
    acked_last_hour: int | None
    approximate: bool
    #: The queue is paused (:meth:`pyqueue.DelayedQueue.pause`): it delivers nothing.
    paused: bool
    #: Grouped messages waiting behind their group's first message.
    held: int
    #: Messages past their expires_at, not removed yet (a poll that meets one removes it).
    expired: int
    #: Messages waiting for their parents (offered ``after`` others), in none of ready, scheduled
    #: or expired: delivered once every parent is acknowledged.
    blocked: int


@dataclass(frozen=True)
class CronSchedule:
    """One row of the view ``dq_cron_schedules``.

    :ivar next_occurrences: the next 5 instants (timezone-aware) at which it fires; empty when paused.
    :ivar lookahead: how far ahead occurrences are installed as messages.
    :ivar installed_through: occurrences up to this instant are installed (``None`` before the first
        install after a pause or a change).
    """

    name: str
    queue: str
    schedule: str
    timezone: str
    payload_type: str
    lookahead: timedelta
    config_hash: str
    paused: bool
    next_occurrences: tuple[datetime, ...]
    installed_through: datetime | None
    created_at: datetime
    updated_at: datetime


@functools.cache
def column_names(cls: type) -> tuple[str, ...]:
    """The result columns ``cls`` is built from: its init fields, in order (``_client`` and the
    like are not columns)."""
    return tuple(f.name for f in fields(cls) if f.init and not f.name.startswith("_"))


#: The columns of a ``dq_delivery`` row (``dq_poll_many``) as the binding selects them.
DELIVERY_COLUMNS = column_names(LockedMessage)


def common_fields(row: Sequence[Any], columns: Sequence[str] = column_names(MessageBase)) -> dict[str, Any]:
    """The fields of :class:`MessageBase` from a row whose columns are named ``columns``."""
    values = dict(zip(columns, row, strict=True))
    values["raw_payload"] = bytes(values["raw_payload"])
    return values


def delivery_from_row(
    cls: type[M], row: Sequence[Any], client: Any, columns: Sequence[str] = DELIVERY_COLUMNS
) -> M:
    """A ``dq_delivery`` row whose columns are named ``columns`` as ``cls`` (a :class:`LockedMessage`)
    bound to ``client``: the same object as ``cls(**fields, _client=client)``, built without the
    frozen dataclass ``__init__`` (which costs one ``object.__setattr__`` per field): this is the
    worker's hot path. tests/core/test_model.py checks that both agree and that every field is set."""
    obj = object.__new__(cls)
    d = obj.__dict__
    d.update(zip(columns, row, strict=True))
    d["raw_payload"] = bytes(d["raw_payload"])
    d["_client"] = client
    d["settled"] = None
    return obj
