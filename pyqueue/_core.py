"""The part of the binding shared by the sync client (:mod:`pyqueue.client`) and the asyncio
client (:mod:`pyqueue.aio`): the named queries, argument checks, payload encoding and the row
shapes. Neither client re-implements any of this; each only runs the queries on its kind of
connection (the sans-I/O split psycopg recommends for sync/async pairs).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, TypeVar
from uuid import uuid4

from .durations import Seconds, as_timedelta
from .errors import InvalidArgument
from .serializers import SerializerRegistry
from .serializers import registry as default_registry

# Named queries (never built from runtime data).
Q_OFFER = (
    "SELECT dq_offer(%(queue)s, %(key)s, %(payload)s::bytea, "
    "coalesce(%(at)s::timestamptz, now() + coalesce(%(delay)s::interval, interval '0')), "
    "%(can_update)s, %(payload_type)s)"
)
Q_OFFER_MANY = (
    "SELECT key, outcome FROM dq_offer_many(%(queue)s, %(keys)s::text[], %(payloads)s::bytea[], "
    "(SELECT array_agg(coalesce(u.at, now() + coalesce(u.delay, interval '0')) ORDER BY u.i) "
    "   FROM unnest(%(ats)s::timestamptz[], %(delays)s::interval[]) WITH ORDINALITY AS u(at, delay, i)), "
    "%(can_update)s, %(payload_types)s::text[])"
)
Q_OFFER_MANY_NOW = (
    "SELECT key, outcome FROM dq_offer_many(%(queue)s, %(keys)s::text[], %(payloads)s::bytea[], NULL, "
    "%(can_update)s, %(payload_types)s::text[])"
)
Q_POLL = (
    "SELECT id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, "
    "delivery_count, lock_token, locked_until FROM dq_poll_many(%(queue)s, %(max_count)s, %(lock_timeout)s)"
)
Q_ACK = "SELECT dq_ack(%s::uuid)"
Q_ACK_MANY = "SELECT dq_ack(%b::uuid[])"  # binary: 16 bytes a token, no text array to build or parse
Q_NACK = "SELECT dq_nack(%s::uuid, %s::interval, %s::text)"
Q_CONFIGURE = (
    "SELECT max_deliveries, dead_letter_queue FROM dq_configure_queue(%(queue)s, %(max_deliveries)s, "
    "%(dead_letter_queue)s, %(archive)s, %(retention)s, %(notify)s, %(max_payload_bytes)s)"
)
Q_STATS = "SELECT * FROM dq_queue_stats(%s)"
Q_STATS_ALL = "SELECT * FROM dq_stats"
Q_PURGE = "SELECT dq_purge(%s, %s)"
Q_RELEASE_LOCKS = "SELECT dq_release_locks(%s)"
Q_REDRIVE = "SELECT dq_redrive(%s, %s)"
Q_EXTEND = "SELECT dq_extend(%s::uuid, %s::interval)"
Q_CANCEL = "SELECT dq_cancel(%s, %s)"
Q_GET = (
    "SELECT id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, "
    "delivery_count, locked_until FROM dq_get(%s, %s)"
)
Q_NEXT_DUE = "SELECT dq_next_due(%s)"
Q_CHANNEL = "SELECT dq_channel(%s)"
Q_BACKEND_PID = "SELECT pg_backend_pid()"
Q_NOTIFY = "SELECT pg_notify(%s, '')"
Q_UNLISTEN_ALL = "UNLISTEN *"
#: The longest wait one dq_wait / dq_poll_or_wait registers (the database refuses more than 1 hour):
#: longer waits and idle checks are made of several registrations (seconds).
MAX_WAIT_S = 3600.0
#: How long a LISTEN probe waits for its own notification before concluding that notifications
#: do not reach this connection (seconds).
LISTEN_PROBE_TIMEOUT_S = 2.0
LISTEN_UNAVAILABLE = (
    "queue %r: notifications do not reach this connection (LISTEN behind a transaction-pooling "
    "PgBouncer or similar); waiting with timed polls instead (at most idle_check between polls)"
)
Q_POLL_OR_WAIT = (
    "SELECT id, %(queue)s::text, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, "
    "delivery_count, lock_token, locked_until, extract(epoch FROM wake_in)::float8 "
    "FROM dq_poll_or_wait(%(queue)s, %(max_count)s, %(lock_timeout)s, %(max_wait)s)"
)


def common_fields(row: Sequence[Any]) -> dict[str, Any]:
    """The leading columns shared by dq_delivery and dq_message rows (id … delivery_count)."""
    fields = dict(zip(_common_names(), row, strict=True))
    fields["raw_payload"] = bytes(fields["raw_payload"])
    return fields


class OfferOutcome(enum.Enum):
    """Result of an offer (seed 003): a new key, a replaced message, or nothing changed."""

    CREATED = "created"
    UPDATED = "updated"
    IGNORED = "ignored"


def check_at(at: datetime | None, delay: Seconds | None) -> tuple[datetime | None, timedelta | None]:
    if at is not None and delay is not None:
        raise InvalidArgument("pass either at or delay, not both")
    if at is not None and at.tzinfo is None:
        raise InvalidArgument("at must be timezone-aware (a naive datetime has no defined instant)")
    return at, (None if delay is None else as_timedelta(delay, "delay", allow_zero=True))


@dataclass(frozen=True)
class OfferRequest:
    """One message for :meth:`DelayedQueue.offer_many`.

    :param key: de-duplication key, 1–200 characters.
    :param payload: bytes, str, or any object the payload_type's encoder takes (JSON by default).
    :param at: delivery time (timezone-aware); ``None`` with ``delay=None`` means now (database clock).
    :param delay: delivery after this long from now on the database clock (timedelta or seconds).
    :param payload_type: type tag; inferred from the payload when ``None`` (bytes/text/json).
    """

    key: str
    payload: Any
    at: datetime | None = None
    delay: timedelta | float | None = None
    payload_type: str | None = None


@dataclass(frozen=True)
class MessageBase:
    """The columns shared by ``dq_message`` (dq_get) and ``dq_delivery`` (dq_poll_many) rows."""

    id: int
    queue: str
    key: str
    raw_payload: bytes
    payload_type: str
    scheduled_at: datetime
    scheduled_at_initially: datetime
    created_at: datetime
    delivery_count: int

    def _serializers(self) -> SerializerRegistry:
        return default_registry

    @cached_property
    def payload(self) -> Any:
        """The payload decoded by its payload_type; raises :class:`pyqueue.UnknownPayloadType`."""
        return self._serializers().decode(self.raw_payload, self.payload_type)


@functools.cache
def _common_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(MessageBase))


def offer_params(
    serializers: SerializerRegistry,
    queue: str,
    key: str,
    payload: Any,
    at: datetime | None,
    delay: Seconds | None,
    can_update: bool,
    payload_type: str | None,
) -> dict[str, Any]:
    """Parameters of Q_OFFER, checked and encoded."""
    at, delay_td = check_at(at, delay)
    data, ptype = serializers.encode(payload, payload_type)
    return {
        "queue": queue,
        "key": key,
        "payload": data,
        "at": at,
        "delay": delay_td,
        "can_update": can_update,
        "payload_type": ptype,
    }


def offer_many_query(
    serializers: SerializerRegistry,
    queue: str,
    items: Iterable[OfferRequest | tuple[str, Any]],
    can_update: bool,
) -> tuple[str, dict[str, Any]] | None:
    """The query and parameters offering ``items`` in one statement; None when there are none."""
    keys: list[str] = []
    payloads: list[bytes] = []
    types: list[str] = []
    ats: list[datetime | None] = []
    delays: list[timedelta | None] = []
    for item in items:
        req = item if isinstance(item, OfferRequest) else OfferRequest(item[0], item[1])
        at, delay_td = check_at(req.at, req.delay)
        data, ptype = serializers.encode(req.payload, req.payload_type)
        keys.append(req.key)
        payloads.append(data)
        types.append(ptype)
        ats.append(at)
        delays.append(delay_td)
    if not keys:
        return None
    params: dict[str, Any] = {
        "queue": queue,
        "keys": keys,
        "payloads": payloads,
        "can_update": can_update,
        "payload_types": types,
    }
    if all(a is None for a in ats) and all(d is None for d in delays):
        return Q_OFFER_MANY_NOW, params
    params["ats"] = ats
    params["delays"] = delays
    return Q_OFFER_MANY, params


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


def configure_params(
    queue: str,
    max_deliveries: int | None,
    dead_letter_queue: str | None,
    archive: bool | None,
    retention: Seconds | None,
    notify: bool | None,
    max_payload_bytes: int | None = None,
) -> dict[str, Any]:
    return {
        "queue": queue,
        "max_deliveries": max_deliveries,
        "dead_letter_queue": dead_letter_queue,
        "archive": archive,
        "retention": None if retention is None else as_timedelta(retention, "retention"),
        "notify": notify,
        "max_payload_bytes": max_payload_bytes,
    }


def poll_params(queue: str, max_count: int, lock_timeout: timedelta) -> dict[str, Any]:
    return {"queue": queue, "max_count": max_count, "lock_timeout": lock_timeout}


_M = TypeVar("_M")


def delivery_from_row(cls: type[_M], row: Sequence[Any], client: Any) -> _M:
    """A ``dq_delivery`` row (the columns of Q_POLL, in order) as ``cls`` (Message or AsyncMessage)
    bound to ``client``: the same object as ``cls(**fields, lock_token=…, locked_until=…, _client=…)``,
    built without the frozen dataclass ``__init__`` (one ``object.__setattr__`` per field: 9.4 us a
    message against 2.7 on the worker's hot path). tests/test_model.py checks that both agree and
    that every field is set."""
    obj = object.__new__(cls)
    d = obj.__dict__
    d.update(zip(_delivery_names(), row, strict=True))
    d["raw_payload"] = bytes(d["raw_payload"])
    d["_client"] = client
    d["settled"] = None
    return obj


@functools.cache
def _delivery_names() -> tuple[str, ...]:
    return (*_common_names(), "lock_token", "locked_until")


def probe_channel() -> str:
    """A channel name for one LISTEN probe (unique, so no other listener wakes up)."""
    return f"dq_probe_{uuid4().hex}"


def check_queue_name(queue: object) -> str:
    if not isinstance(queue, str) or not 1 <= len(queue) <= 100:
        raise InvalidArgument("queue must be a str of 1 to 100 characters")
    return queue
