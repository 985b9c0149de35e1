"""The argument checks of the binding, made before any I/O: each returns the value (converted
where said) or raises :class:`pyqueue.InvalidArgument` naming the parameter and the rule. The
database checks again what it alone can (lengths of text, sizes of payloads), with the same
wording; :mod:`pyqueue.limits` holds the limits both sides use."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from .. import limits
from ..durations import Seconds, as_timedelta
from ..errors import InvalidArgument
from ..serializers import json_bytes


def check_schema(schema: object) -> str | None:
    """``schema`` if it is None or a usable schema name; raises :class:`pyqueue.InvalidArgument`."""
    if schema is None:
        return None
    if not isinstance(schema, str) or not 1 <= len(schema.encode()) <= 63 or "\x00" in schema:
        raise InvalidArgument("schema must be None or a str of 1 to 63 bytes (a PostgreSQL identifier)")
    return schema


def described(value: object) -> str:
    """How an error message shows a wrong argument: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def check_queue_name(queue: object, name: str = "queue") -> str:
    """``queue`` if it is a valid queue name; raises :class:`pyqueue.InvalidArgument` before any I/O."""
    if not isinstance(queue, str) or not 1 <= len(queue) <= limits.QUEUE_CHARS:
        raise InvalidArgument(f"{name} must be a str of 1 to {limits.QUEUE_CHARS} characters, got {described(queue)}")
    return queue


def _check_kind(value: object, name: str, kind: type, expected: str, optional: bool) -> Any:
    """``value`` if it is a ``kind`` (or None when ``optional``), else InvalidArgument naming ``name``."""
    if isinstance(value, kind) or (optional and value is None):
        return value
    raise InvalidArgument(f"{name} must be {expected}{' or None' if optional else ''}, got {described(value)}")


def check_str(value: object, name: str, *, optional: bool = False) -> Any:
    """``value`` if it is a str (or None when ``optional``); the database checks its length."""
    return _check_kind(value, name, str, "a str", optional)


def check_int(
    value: object, name: str, lo: int | None = None, hi: int | None = None, *, optional: bool = False
) -> Any:
    """``value`` if it is an int (not a bool) within ``lo`` .. ``hi`` when given (or None when
    ``optional``); raises :class:`pyqueue.InvalidArgument` naming ``name``."""
    if optional and value is None:
        return None
    in_range = (lo is None or value >= lo) and (hi is None or value <= hi) \
        if isinstance(value, int) and not isinstance(value, bool) else False
    if not in_range:
        bounds = f" from {lo} to {hi}" if lo is not None and hi is not None else (
            f" of at least {lo}" if lo is not None else "")
        raise InvalidArgument(f"{name} must be an int{bounds}{' or None' if optional else ''}, got {described(value)}")
    return value


def check_setting_names(value: object, name: str) -> list[str]:
    """``value`` (an iterable of str, not a str itself, which would name its letters) as a list;
    raises :class:`pyqueue.InvalidArgument` naming ``name``. Which names exist is the database's
    rule (``dq_configure_queue`` raises 22023 for an unknown one)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidArgument(
            f"{name} must be a list of setting names (e.g. ['max_in_flight']), got {described(value)}")
    names = list(value)
    for i, item in enumerate(names):
        if not isinstance(item, str):
            raise InvalidArgument(f"{name}[{i}] must be a setting name (a str), got {described(item)}")
    return names


def check_bool(value: object, name: str, *, optional: bool = False) -> Any:
    """``value`` if it is a bool (or None when ``optional``)."""
    return _check_kind(value, name, bool, "True or False", optional)


def check_instant(value: object, name: str) -> datetime | None:
    """``value`` if it is None or a timezone-aware datetime (a naive one has no defined instant)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidArgument(f"{name} must be a timezone-aware datetime or None, got {described(value)}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(f"{name} must be timezone-aware (a naive datetime has no defined instant)")
    return value


def check_after(after: object, name: str = "after") -> Jsonb | None:
    """The parents of an offer as the JSON array ``dq_offer`` takes (a key of the child's queue
    stays a string, anything else becomes a ``[queue, key]`` pair), or None for no parents (None or
    empty). Refused before any I/O: not a sequence, an element that is neither a str, a pair of str
    nor an object with str ``queue`` and ``key`` (:class:`pyqueue.model.Named`). The other rules
    (lengths, the number of parents, the message itself, cycles) are the database's."""
    if after is None:
        return None
    if isinstance(after, (str, bytes, Mapping)) or not isinstance(after, Iterable):
        raise InvalidArgument(
            f"{name} must be a list of keys, (queue, key) pairs or messages, got {described(after)}")
    parents: list[Any] = []
    for i, ref in enumerate(after):
        if isinstance(ref, str):
            parents.append(ref)
        elif isinstance(ref, (tuple, list)) and len(ref) == 2 and all(isinstance(v, str) for v in ref):
            parents.append([ref[0], ref[1]])
        elif isinstance(getattr(ref, "queue", None), str) and isinstance(getattr(ref, "key", None), str):
            parents.append([ref.queue, ref.key])
        else:
            raise InvalidArgument(
                f"{name}[{i}] must be a key, a (queue, key) pair of str or a message, got {described(ref)}")
    return Jsonb(parents) if parents else None


def check_lock_token(value: object, name: str = "lock_token") -> UUID:
    """``value`` as a :class:`uuid.UUID`: a UUID, or its text form (as ``Message.lock_token``
    prints); anything else raises :class:`pyqueue.InvalidArgument` before any I/O."""
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise InvalidArgument(f"{name} must be a UUID (the lock_token of a delivery), got {described(value)}")


def check_at(at: datetime | None, delay: Seconds | None) -> tuple[datetime | None, timedelta | None]:
    """The delivery time of an offer: ``at`` (timezone-aware) or ``delay`` (≥ 0), not both."""
    if at is not None and delay is not None:
        raise InvalidArgument("pass either at or delay, not both")
    return check_instant(at, "at"), (None if delay is None else as_timedelta(delay, "delay", allow_zero=True))


def cron_timezone(timezone: str, tz: str | None) -> str:
    """The time zone of ``QueueCron.install`` (and its async twin): ``timezone``, or the value of the
    deprecated ``tz`` keyword with a :class:`DeprecationWarning` (it goes in the next release)."""
    if tz is None:
        return timezone
    warnings.warn("install(tz=...) is deprecated, use timezone=... (the name the SQL function and "
                  "the CLI use)", DeprecationWarning, stacklevel=3)
    if timezone != "UTC" and timezone != tz:
        raise InvalidArgument("pass either timezone or the deprecated tz, not both")
    return tz


@dataclass(frozen=True, slots=True)
class Controls:
    """The delivery controls of one offer, checked and encoded: ``ttl`` stays a duration, turned
    into an instant by the statement (from the delivery time, on the database clock)."""

    priority: int
    group: str | None
    expires_at: datetime | None
    ttl: timedelta | None
    headers: Jsonb | None

    @property
    def default(self) -> bool:
        """None of the controls is set (the offer is as one without them)."""
        return (self.priority == 0 and self.group is None and self.expires_at is None and self.ttl is None
                and self.headers is None)


def check_controls(
    priority: int, group: str | None, expires_at: datetime | None, ttl: Seconds | None,
    headers: Mapping[str, Any] | None,
) -> Controls:
    """The delivery controls of an offer. Refused before any I/O: a priority that is not an int
    in :data:`pyqueue.limits.PRIORITY_MIN` .. :data:`pyqueue.limits.PRIORITY_MAX` (it could not
    even be sent as an integer beyond), ``expires_at`` together with ``ttl``, a naive
    ``expires_at``, a ``ttl`` ≤ 0, headers that are not a mapping or have no JSON text
    (:func:`pyqueue.serializers.json_bytes`: NaN, colliding keys, a set…); the other rules (group
    length, the size of the headers) are the database's."""
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not limits.PRIORITY_MIN <= priority <= limits.PRIORITY_MAX:
        raise InvalidArgument(
            f"priority is {priority!r}, it must be an int from {limits.PRIORITY_MIN} to {limits.PRIORITY_MAX}")
    if expires_at is not None and ttl is not None:
        raise InvalidArgument("pass either expires_at or ttl, not both")
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidArgument(f"headers must be a mapping (a JSON object) or None, got {described(headers)}")
    return Controls(priority, check_str(group, "group", optional=True), check_instant(expires_at, "expires_at"),
                    None if ttl is None else as_timedelta(ttl, "ttl"),
                    None if headers is None else Jsonb(json_bytes(headers, "headers"), dumps=_written))


def _written(data: bytes) -> bytes:
    """The ``dumps`` of a :class:`Jsonb` whose JSON text is written already (by ``json_bytes``,
    before any I/O): sent as it is."""
    return data


def check_conninfo(conninfo: str) -> dict[str, Any]:
    """The parameters of a libpq connection string or URL, or :class:`InvalidArgument` for one
    libpq cannot parse (before any I/O)."""
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise InvalidArgument(f"conninfo_or_pool is not a libpq connection string: {exc}") from None


def first_connection_kwargs(conninfo: str, timeout: float) -> dict[str, Any]:
    """The keyword arguments of the first connection of a queue that owns its pool, made before
    the pool opens (so that a refusal is reported at once, with the server's reason, and not
    retried by the pool until its ``timeout``): a ``connect_timeout`` of the pool's ``timeout``
    seconds (at least 2, libpq's least) when neither ``conninfo`` nor ``PGCONNECT_TIMEOUT`` sets
    one, as an unanswered connection would otherwise wait psycopg's 130 s."""
    if "connect_timeout" in check_conninfo(conninfo) or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": max(2, math.ceil(timeout))}
