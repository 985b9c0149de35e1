"""Every operation of the binding as data: a :class:`Statement` holds the SQL text, its parameters
(checked and encoded before any I/O) and a decoder that builds the result from the rows by
column name. The sync driver (:mod:`pyqueue.drivers.sync`) and the asyncio driver
(:mod:`pyqueue.drivers.aio`) only execute a Statement on their kind of connection and return
``op.decode(column_names, rows)``: nothing here does I/O.

The statements name the ``dq_*`` functions of one install: unqualified (``schema=None``, resolved
by the connection's ``search_path``), or qualified by a schema name, quoted as an identifier.
The text is built once per schema (:func:`statements`), so the same text recurs on every call
and psycopg's automatic prepared statements keep working.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from uuid import UUID

from psycopg import sql
from psycopg.types.json import Jsonb

from .. import limits
from ..durations import Seconds, as_timedelta
from ..errors import InvalidArgument
from ..model import (
    CronSchedule,
    LockedMessage,
    NackOutcome,
    NackResult,
    OfferCounts,
    OfferOutcome,
    OfferRequest,
    ParentRef,
    QueueStats,
    StoredMessage,
    column_names,
    delivery_from_row,
)
from ..serializers import SerializerRegistry
from .checks import (
    Controls,
    check_after,
    check_at,
    check_bool,
    check_controls,
    check_int,
    check_lock_token,
    check_queue_name,
    check_schema,
    check_setting_names,
    check_str,
    described,
)
from .middleware import OfferCall

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "Statement", "Statements", "QueueStatements", "Waited", "sql_texts", "qualified", "check_schema",
    "check_queue_name",
]

T = TypeVar("T")
M = TypeVar("M", bound=LockedMessage[Any])
S = TypeVar("S", bound="DataclassInstance")
Rows = list[tuple[Any, ...]]
#: Builds an operation's result from the column names of its result and its rows.
Decoder = Callable[[Sequence[str], Rows], T]


@dataclass(frozen=True, slots=True)
class Statement(Generic[T]):
    """One statement to run and how to read its result.

    :ivar sql: the statement (a ``str`` or a :mod:`psycopg.sql` composition), or None when there is
        nothing to run (an empty batch): then the result is ``decode((), [])``.
    :ivar params: its parameters (a mapping for ``%(name)s`` placeholders), or None when the
        statement has no placeholders to parse.
    :ivar decode: the result from ``(column names, rows)``; rows are empty for a statement without
        a result (LISTEN).
    :ivar binary: ask for binary results (timestamptz and uuid columns decode faster).
    """

    sql: str | sql.Composed | None
    params: dict[str, Any] | None
    decode: Decoder[T]
    binary: bool = False


def _value(column: str, convert: Callable[[Any], Any] | None = None, default: Any = None) -> Decoder[Any]:
    """A decoder: ``convert`` of ``column`` in the first row; ``default`` without a row or on NULL."""

    def decode(names: Sequence[str], rows: Rows) -> Any:
        value = rows[0][names.index(column)] if rows and names else None
        if value is None:
            return default
        return value if convert is None else convert(value)

    return decode


def _records(build: Callable[[dict[str, Any]], T]) -> Decoder[list[T]]:
    """A decoder: ``build`` of each row as a ``{column: value}`` mapping."""

    def decode(names: Sequence[str], rows: Rows) -> list[T]:
        return [build(dict(zip(names, row, strict=True))) for row in rows]

    return decode


def _none(names: Sequence[str], rows: Rows) -> None:
    return None


def _queue_stats(row: dict[str, Any]) -> QueueStats:
    return QueueStats(**row)


def _outcomes(names: Sequence[str], rows: Rows) -> dict[str, OfferOutcome]:
    """``{key: OfferOutcome}`` of ``dq_offer_many``'s rows, in their order."""
    if not rows:
        return {}
    key, outcome = names.index("key"), names.index("outcome")
    return {row[key]: OfferOutcome(row[outcome]) for row in rows}


def _counts(names: Sequence[str], rows: Rows) -> OfferCounts:
    """The one row of ``dq_offer_many_counts`` (zeros without a row: nothing was sent)."""
    if not rows:
        return OfferCounts(0, 0, 0)
    row = dict(zip(names, rows[0], strict=True))
    return OfferCounts(row["created"], row["updated"], row["ignored"])


def _schedule(row: dict[str, Any]) -> CronSchedule:
    return CronSchedule(**{**row, "next_occurrences": tuple(row["next_occurrences"] or ())})


# The arguments of a batch offer (dq_offer_many, dq_offer_many_counts): each element's time as in
# offer; its expiry, when some element has a ttl, likewise. (SELECT dq_now()) is an uncorrelated
# subquery: evaluated once per statement, not per element.
_OFFER_MANY_ARGS = (
    "(%(queue)s, %(keys)s::text[], %(payloads)s::bytea[], "
    "(SELECT array_agg(coalesce(u.at, (SELECT {s}dq_now()) + coalesce(u.delay, interval '0')) ORDER BY u.i) "
    "   FROM unnest(%(ats)s::timestamptz[], %(delays)s::interval[]) WITH ORDINALITY AS u(at, delay, i)), "
    "%(can_update)s, %(payload_types)s::text[], %(priorities)s::integer[], %(groups)s::text[], "
    "CASE WHEN %(ttls)s::interval[] IS NULL THEN %(expires_ats)s::timestamptz[] ELSE "
    "(SELECT array_agg(coalesce(u.expires_at, "
    "coalesce(u.at, (SELECT {s}dq_now()) + coalesce(u.delay, interval '0')) + u.ttl) "
    "                  ORDER BY u.i) "
    "   FROM unnest(%(ats)s::timestamptz[], %(delays)s::interval[], %(expires_ats)s::timestamptz[], "
    "               %(ttls)s::interval[]) WITH ORDINALITY AS u(at, delay, expires_at, ttl, i)) END, "
    "%(headers)s::jsonb[])"
)
# The same with each element's parents (dq_offer_many's afters and on_parent_failures).
_OFFER_MANY_AFTER_ARGS = _OFFER_MANY_ARGS[:-1] + ", %(afters)s::jsonb[], %(on_parent_failures)s::text[])"
# Every element due now, without controls.
_OFFER_MANY_NOW_ARGS = (
    "(%(queue)s, %(keys)s::text[], %(payloads)s::bytea[], NULL, %(can_update)s, %(payload_types)s::text[])")


@dataclass(frozen=True)
class SqlTexts:
    """The SQL text of every operation; ``{s}`` stands for the schema prefix, ``{delivery}``,
    ``{stored}``, ``{stats}`` and ``{schedule}`` for the columns of the row types of
    :mod:`pyqueue.model` they become, named as their fields (see :func:`sql_texts`)."""

    # The delivery time t.at is computed once, on the database clock; a ttl counts from it.
    offer: str = (
        "SELECT {s}dq_offer(%(queue)s, %(key)s, %(payload)s::bytea, t.at, %(can_update)s, %(payload_type)s, "
        "%(priority)s::integer, %(group)s::text, coalesce(%(expires_at)s::timestamptz, t.at + %(ttl)s::interval), "
        "%(headers)s::jsonb) AS outcome "
        "FROM (SELECT coalesce(%(at)s::timestamptz, {s}dq_now() + coalesce(%(delay)s::interval, interval '0')) "
        "AS at) AS t"
    )
    # An offer after parents: the same with after and on_parent_failure (an offer without them keeps
    # the text above, which an install without dependencies also has).
    offer_after: str = (
        "SELECT {s}dq_offer(%(queue)s, %(key)s, %(payload)s::bytea, t.at, %(can_update)s, %(payload_type)s, "
        "%(priority)s::integer, %(group)s::text, coalesce(%(expires_at)s::timestamptz, t.at + %(ttl)s::interval), "
        "%(headers)s::jsonb, %(after)s::jsonb, %(on_parent_failure)s::text) AS outcome "
        "FROM (SELECT coalesce(%(at)s::timestamptz, {s}dq_now() + coalesce(%(delay)s::interval, interval '0')) "
        "AS at) AS t"
    )
    # {many}, {many_now}: the arguments of a batch offer (_OFFER_MANY_ARGS, _OFFER_MANY_NOW_ARGS).
    offer_many: str = "SELECT key, outcome FROM {s}dq_offer_many{many}"
    offer_many_now: str = "SELECT key, outcome FROM {s}dq_offer_many{many_now}"
    offer_many_counts: str = "SELECT created, updated, ignored FROM {s}dq_offer_many_counts{many}"
    offer_many_counts_now: str = "SELECT created, updated, ignored FROM {s}dq_offer_many_counts{many_now}"
    offer_many_after: str = "SELECT key, outcome FROM {s}dq_offer_many{many_after}"
    offer_many_counts_after: str = "SELECT created, updated, ignored FROM {s}dq_offer_many_counts{many_after}"
    poll: str = "SELECT {delivery} FROM {s}dq_poll_many(%(queue)s, %(max_count)s, %(lock_timeout)s)"
    poll_or_wait: str = (
        "SELECT {delivery}, extract(epoch FROM wake_in)::float8 AS wake_in_s FROM (SELECT *, %(queue)s::text AS queue "
        "FROM {s}dq_poll_or_wait(%(queue)s, %(max_count)s, %(lock_timeout)s, %(max_wait)s)) AS w"
    )
    # binary: 16 bytes a token, no text array to build or parse
    ack: str = "SELECT {s}dq_ack(%(lock_token)s::uuid) AS acked"
    ack_many: str = "SELECT {s}dq_ack_many(%(lock_tokens)b::uuid[]) AS acked"
    release_many: str = "SELECT {s}dq_release(%(lock_tokens)b::uuid[]) AS released"
    nack: str = "SELECT {s}dq_nack(%(lock_token)s::uuid, %(delay)s::interval, %(error)s::text) AS nacked"
    nack_outcome: str = (
        "SELECT outcome, due, dead_letter_queue "
        "FROM {s}dq_nack_outcome(%(lock_token)s::uuid, %(delay)s::interval, %(error)s::text)"
    )
    dead_letter: str = (
        "SELECT outcome, dead_letter_queue FROM {s}dq_dead_letter(%(lock_token)s::uuid, %(error)s::text)"
    )
    # Whether the install has dq_nack_outcome (an install of an earlier release has only dq_nack).
    has_nack_outcome: str = (
        "SELECT to_regprocedure('{s}dq_nack_outcome(uuid,interval,text)') IS NOT NULL AS present"
    )
    extend: str = "SELECT {s}dq_extend(%(lock_token)s::uuid, %(timeout)s::interval) AS locked_until"
    configure: str = (
        "SELECT max_deliveries, dead_letter_queue FROM {s}dq_configure_queue(%(queue)s, %(max_deliveries)s, "
        "%(dead_letter_queue)s, %(archive)s, %(retention)s, %(notify)s, %(max_payload_bytes)s, %(max_in_flight)s, "
        "%(rate_limit)s, %(rate_period)s::interval, %(clear)s::text[])"
    )
    pause: str = "SELECT {s}dq_pause_queue(%(queue)s) AS changed"
    resume: str = "SELECT {s}dq_resume_queue(%(queue)s) AS changed"
    stats: str = "SELECT {stats} FROM {s}dq_queue_stats(%(queue)s)"
    all_stats: str = "SELECT {stats} FROM {s}dq_stats"
    metrics: str = "SELECT * FROM {s}dq_metrics()"
    table_health: str = "SELECT component, name, figure, value FROM {s}dq_table_health()"
    purge: str = "SELECT {s}dq_purge(%(queue)s, %(confirm)s) AS purged"
    release_locks: str = "SELECT {s}dq_release_locks(%(queue)s) AS released"
    redrive: str = "SELECT {s}dq_redrive(%(queue)s, %(max_count)s) AS moved"
    dead_letters: str = "SELECT * FROM {s}dq_dead_letters(%(queue)s, %(max_rows)s::integer)"
    cancel: str = "SELECT {s}dq_cancel(%(queue)s, %(key)s) AS cancelled"
    # A cursor (open until the transaction ends) over the live rows with id >= id_from matching filters.
    export_messages: str = "SELECT {s}dq_export_messages(%(id_from)s, NULL, %(filters)s::jsonb) AS cursor"
    get: str = "SELECT {stored} FROM {s}dq_get(%(queue)s, %(key)s)"
    next_due: str = "SELECT {s}dq_next_due(%(queue)s) AS next_due"
    channel: str = "SELECT {s}dq_channel(%(queue)s) AS channel"
    cron_install: str = (
        "SELECT {s}dq_cron_install(name => %(name)s, queue => %(queue)s, schedule => %(schedule)s, "
        "payload => %(payload)s::bytea, timezone => %(timezone)s, payload_type => %(payload_type)s, "
        "lookahead => %(lookahead)s::interval) AS config_hash"
    )
    cron_uninstall: str = "SELECT {s}dq_cron_uninstall(%(name)s) AS done"
    cron_pause: str = "SELECT {s}dq_cron_pause(%(name)s) AS done"
    cron_resume: str = "SELECT {s}dq_cron_resume(%(name)s) AS done"
    cron_tick: str = "SELECT {s}dq_cron_tick() AS created"
    cron_schedules: str = (
        "SELECT {schedule} FROM {s}dq_cron_schedules WHERE %(queue)s::text IS NULL OR queue = %(queue)s ORDER BY name"
    )
    cron_occurrences: str = (
        "SELECT o AS occurrence FROM {s}dq_cron_occurrences(%(schedule)s, %(timezone)s, "
        "coalesce(%(after)s::timestamptz, {s}dq_now()), coalesce(%(until)s::timestamptz, 'infinity'), "
        "%(max_count)s) AS o"
    )
    # Not in the install's schema: built-in functions.
    # The key of the install in public; another install's key is derived from its schema, so that
    # the tickers of two installs in one database do not stand each other by.
    try_advisory_lock: str = (
        "SELECT pg_try_advisory_lock(CASE n.nspname WHEN 'public' THEN %(key)s "
        "ELSE hashtextextended('dq_cron_tick@' || n.nspname, 0) END) AS locked "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = '{s}dq_cron_tick()'::regprocedure"
    )
    backend_pid: str = "SELECT pg_backend_pid() AS pid"
    notify: str = "SELECT pg_notify(%(channel)s, '')"


#: Fields of :mod:`pyqueue.model` named otherwise than their SQL column: field -> select item.
_RENAMED = {"raw_payload": "payload AS raw_payload", "group": 'message_group AS "group"'}


def _select_list(cls: type) -> str:
    """The result columns of ``cls`` (its fields), the columns of :data:`_RENAMED` renamed."""
    return ", ".join(_RENAMED.get(n, n) for n in column_names(cls))


def qualified(cls: type[S], schema: str | None, marks: Mapping[str, str] | None = None) -> S:
    """The dataclass ``cls`` of statement texts (its fields' defaults) naming the install in
    ``schema``: each ``{s}`` becomes ``"schema".`` (quoted as an identifier, ``%`` doubled for the
    placeholder syntax), or nothing when ``schema`` is None (the ``search_path`` decides); each
    other mark of ``marks`` becomes its value first (a value may hold ``{s}``)."""
    prefix = "" if schema is None else sql.Identifier(schema).as_string(None).replace("%", "%%") + "."
    replacements = {**(marks or {}), "{s}": prefix}
    texts = {}
    for f in fields(cls):
        text = str(f.default)
        for mark, value in replacements.items():
            text = text.replace(mark, value)
        texts[f.name] = text
    return cls(**texts)


@functools.cache
def sql_texts(schema: str | None) -> SqlTexts:
    """Every statement naming the install in ``schema``: ``"schema".dq_…`` (quoted as an identifier,
    ``%`` doubled for the placeholder syntax), or the bare ``dq_…`` names when ``schema`` is None."""
    return qualified(SqlTexts, schema, {
        "{delivery}": _select_list(LockedMessage), "{stored}": _select_list(StoredMessage),
        "{stats}": _select_list(QueueStats), "{schedule}": _select_list(CronSchedule),
        "{many}": _OFFER_MANY_ARGS, "{many_now}": _OFFER_MANY_NOW_ARGS, "{many_after}": _OFFER_MANY_AFTER_ARGS})


@dataclass(frozen=True, slots=True)
class Waited(Generic[M]):
    """The result of one ``dq_poll_or_wait``: the messages acquired, or none and how long the
    caller should sleep on LISTEN before the next call (seconds)."""

    messages: list[M]
    wake_in_s: float


class Statements:
    """The operations of one install (``schema``) that belong to no single queue: statistics,
    cron schedules, and the helpers of waiting (LISTEN, the pooler check)."""

    def __init__(self, schema: str | None = None) -> None:
        self.schema = check_schema(schema)
        self.sql = sql_texts(self.schema)

    def all_stats(self) -> Statement[list[QueueStats]]:
        return Statement(self.sql.all_stats, {}, _records(_queue_stats))

    def metrics(self) -> Statement[list[dict[str, Any]]]:
        """Every queue's row of ``dq_metrics()`` as ``{column: value}``."""
        return Statement(self.sql.metrics, {}, _records(dict))

    def table_health(self) -> Statement[list[dict[str, Any]]]:
        """The figures of ``dq_table_health()`` (component, name, figure, value) as ``{column: value}``."""
        return Statement(self.sql.table_health, {}, _records(dict))

    # -- cron ------------------------------------------------------------------------------------
    def cron_install(
        self,
        name: str,
        queue: str,
        schedule: str,
        payload: Any,
        timezone: str,
        payload_type: str | None,
        lookahead: timedelta,
        serializers: SerializerRegistry,
    ) -> Statement[str]:
        check_str(name, "name")
        check_queue_name(queue)
        check_str(schedule, "schedule")
        check_str(timezone, "timezone")
        lookahead = as_timedelta(lookahead, "lookahead")
        data, ptype = serializers.encode(payload, check_str(payload_type, "payload_type", optional=True))
        params = {"name": name, "queue": queue, "schedule": schedule, "payload": data, "timezone": timezone,
                  "payload_type": ptype, "lookahead": lookahead}
        return Statement(self.sql.cron_install, params, _value("config_hash", str))

    def cron_uninstall(self, name: str) -> Statement[bool]:
        return Statement(self.sql.cron_uninstall, {"name": name}, _value("done", bool, False))

    def cron_pause(self, name: str) -> Statement[bool]:
        return Statement(self.sql.cron_pause, {"name": name}, _value("done", bool, False))

    def cron_resume(self, name: str) -> Statement[bool]:
        return Statement(self.sql.cron_resume, {"name": name}, _value("done", bool, False))

    def cron_tick(self) -> Statement[int]:
        return Statement(self.sql.cron_tick, {}, _value("created", int, 0))

    def cron_schedules(self, queue: str | None = None) -> Statement[list[CronSchedule]]:
        """Every schedule, or those of ``queue``, by name."""
        return Statement(self.sql.cron_schedules, {"queue": queue}, _records(_schedule))

    def cron_occurrences(
        self, schedule: str, timezone: str, after: datetime | None, until: datetime | None, max_count: int
    ) -> Statement[list[datetime]]:
        params = {"schedule": schedule, "timezone": timezone, "after": after, "until": until, "max_count": max_count}
        return Statement(self.sql.cron_occurrences, params, _records(lambda r: r["occurrence"]))

    def try_advisory_lock(self, key: int) -> Statement[bool]:
        return Statement(self.sql.try_advisory_lock, {"key": key}, _value("locked", bool, False))

    # -- waiting -----------------------------------------------------------------------------------
    def backend_pid(self) -> Statement[int]:
        """The server process of the connection (differs from libpq's behind a pooler)."""
        return Statement(self.sql.backend_pid, {}, _value("pid"))

    def notify(self, channel: str) -> Statement[None]:
        return Statement(self.sql.notify, {"channel": channel}, _none)

    @staticmethod
    def listen(channel: str) -> Statement[None]:
        return Statement(sql.SQL("LISTEN {}").format(sql.Identifier(channel)), None, _none)

    @staticmethod
    def unlisten(channel: str | None) -> Statement[None]:
        """UNLISTEN ``channel``, or every channel when None."""
        target = sql.SQL("*") if channel is None else sql.Identifier(channel)
        return Statement(sql.SQL("UNLISTEN {}").format(target), None, _none)


class QueueStatements(Statements):
    """The operations on one queue of one install, with the queue's payload serializers."""

    def __init__(self, queue: str, schema: str | None, serializers: SerializerRegistry) -> None:
        super().__init__(schema)
        self.queue = check_queue_name(queue)
        self.serializers = serializers

    def for_queue(self, queue: str) -> QueueStatements:
        """The statements of ``queue`` in the same install, with the same serializers (this object
        for its own queue): what a graph spanning queues offers with."""
        return self if queue == self.queue else QueueStatements(queue, self.schema, self.serializers)

    def offer_calls(self, calls: Sequence[OfferCall]) -> list[Statement[Any]]:
        """The statements of ``calls`` (:meth:`offer_call`), each in its own queue: what
        ``offer_graph`` sends when no middleware wraps offers."""
        return [self.for_queue(c.queue).offer_call(c) for c in calls]

    def pool_settings(self, pool_size: int, prefix: str) -> dict[str, Any]:
        """The settings of a pool a queue creates: 1 to ``pool_size`` autocommit connections."""
        return {"min_size": 1, "max_size": pool_size, "kwargs": {"autocommit": True}, "name": f"{prefix}:{self.queue}"}

    def _q(self, **params: Any) -> dict[str, Any]:
        return {"queue": self.queue, **params}

    # -- offer -------------------------------------------------------------------------------------
    def offer(
        self,
        key: str,
        payload: Any,
        at: datetime | None,
        delay: Seconds | None,
        can_update: bool,
        payload_type: str | None,
        priority: int = 0,
        group: str | None = None,
        expires_at: datetime | None = None,
        ttl: Seconds | None = None,
        headers: Mapping[str, Any] | None = None,
        after: Iterable[ParentRef] | None = None,
        on_parent_failure: str = "wait",
    ) -> Statement[OfferOutcome]:
        check_str(key, "key")
        check_bool(can_update, "can_update")
        at, delay_td = check_at(at, delay)
        c = check_controls(priority, group, expires_at, ttl, headers)
        parents = check_after(after)
        check_str(on_parent_failure, "on_parent_failure")
        data, ptype = self.serializers.encode(payload, check_str(payload_type, "payload_type", optional=True))
        params = self._q(key=key, payload=data, at=at, delay=delay_td, can_update=can_update, payload_type=ptype,
                         priority=c.priority, group=c.group, expires_at=c.expires_at, ttl=c.ttl, headers=c.headers)
        if parents is None and on_parent_failure == "wait":
            return Statement(self.sql.offer, params, _value("outcome", OfferOutcome))
        params.update(after=parents, on_parent_failure=on_parent_failure)
        return Statement(self.sql.offer_after, params, _value("outcome", OfferOutcome))

    def offer_many(
        self, items: Iterable[OfferRequest | tuple[str, Any]], can_update: bool
    ) -> Statement[dict[str, OfferOutcome]]:
        """``dq_offer_many`` of ``items``: ``{key: OfferOutcome}`` in input order."""
        params, now = self._offer_many_params(items, can_update)
        if params is None:
            return Statement(None, None, _outcomes)
        text = (self.sql.offer_many_now if now else
                self.sql.offer_many_after if "afters" in params else self.sql.offer_many)
        return Statement(text, params, _outcomes)

    def offer_many_counts(
        self, items: Iterable[OfferRequest | tuple[str, Any]], can_update: bool
    ) -> Statement[OfferCounts]:
        """``dq_offer_many_counts`` of ``items``: how many were created, updated and ignored."""
        params, now = self._offer_many_params(items, can_update)
        if params is None:
            return Statement(None, None, _counts)
        text = (self.sql.offer_many_counts_now if now else
                self.sql.offer_many_counts_after if "afters" in params else self.sql.offer_many_counts)
        return Statement(text, params, _counts)

    def _offer_many_params(
        self, items: Iterable[OfferRequest | tuple[str, Any]], can_update: bool
    ) -> tuple[dict[str, Any] | None, bool]:
        """The checked parameters of a batch offer (None for no items), and whether every element is
        due now without controls (the statement of the short argument list then takes them); with
        ``afters`` and ``on_parent_failures`` when some element names parents."""
        keys: list[str] = []
        payloads: list[bytes] = []
        types: list[str] = []
        ats: list[datetime | None] = []
        delays: list[timedelta | None] = []
        controls: list[Controls] = []
        afters: list[Jsonb | None] = []
        failures: list[str | None] = []
        check_bool(can_update, "can_update")
        for i, req in enumerate(offer_requests(items)):
            check_str(req.key, f"items[{i}].key")
            ptype_given = check_str(req.payload_type, f"items[{i}].payload_type", optional=True)
            try:
                at, delay_td = check_at(req.at, req.delay)
                data, ptype = self.serializers.encode(req.payload, ptype_given)
                controls.append(check_controls(req.priority, req.group, req.expires_at, req.ttl, req.headers))
                afters.append(check_after(req.after))
                failures.append(None if req.on_parent_failure == "wait"
                                else check_str(req.on_parent_failure, "on_parent_failure"))
            except InvalidArgument as exc:  # the same message as offer()'s, with the element named
                raise type(exc)(f"items[{i}]: {exc.message}", sqlstate=exc.sqlstate) from None
            keys.append(req.key)
            payloads.append(data)
            types.append(ptype)
            ats.append(at)
            delays.append(delay_td)
        if not keys:
            return None, True
        params = self._q(keys=keys, payloads=payloads, can_update=can_update, payload_types=types)
        timed = not all(a is None for a in ats) or not all(d is None for d in delays)
        parents = not all(a is None for a in afters) or not all(f is None for f in failures)
        if not timed and not parents and all(c.default for c in controls):
            return params, True
        if parents:
            params.update(afters=afters, on_parent_failures=failures)

        def column(values: list[Any], default: Any = None) -> list[Any] | None:
            """The array of one control, or None (the default for every element) when none is set."""
            return None if all(v == default for v in values) else values

        params.update(
            ats=ats, delays=delays, priorities=column([c.priority for c in controls], 0),
            groups=column([c.group for c in controls]), expires_ats=column([c.expires_at for c in controls]),
            ttls=column([c.ttl for c in controls]), headers=column([c.headers for c in controls]),
        )
        return params, False

    def offer_call(self, call: OfferCall) -> Statement[Any]:
        """The statement of an offer that went through middleware (:mod:`pyqueue.core.middleware`):
        ``dq_offer`` of its one request, or ``dq_offer_many`` of a batch."""
        if call.batch:
            return self.offer_many(call.requests, call.can_update)
        if len(call.requests) != 1:
            raise InvalidArgument(f"an offer's middleware must leave one request, it left {len(call.requests)}")
        r = call.requests[0]
        return self.offer(r.key, r.payload, r.at, r.delay, call.can_update, r.payload_type, r.priority, r.group,
                          r.expires_at, r.ttl, r.headers, r.after, r.on_parent_failure)

    # -- poll --------------------------------------------------------------------------------------
    def poll(self, max_count: int, lock_timeout: Seconds, cls: type[M], client: Any) -> Statement[list[M]]:
        """``dq_poll_many``; the rows become ``cls`` objects bound to ``client``."""
        params = self._q(max_count=check_int(max_count, "max_count", 1, limits.POLL_MAX_COUNT),
                         lock_timeout=as_timedelta(lock_timeout, "lock_timeout"))

        def decode(names: Sequence[str], rows: Rows) -> list[M]:
            return [delivery_from_row(cls, row, client, names) for row in rows]

        # Binary results: timestamptz and uuid columns decode about 3 us a row faster than text.
        return Statement(self.sql.poll, params, decode, binary=True)

    def poll_or_wait(
        self, max_count: int, lock_timeout: timedelta, max_wait: timedelta, cls: type[M], client: Any
    ) -> Statement[Waited[M]]:
        """``dq_poll_or_wait``: acquire, or register as a waiter for up to ``max_wait``."""
        params = self._q(max_count=max_count, lock_timeout=lock_timeout, max_wait=max_wait)

        def decode(names: Sequence[str], rows: Rows) -> Waited[M]:
            if not rows:
                return Waited([], 0.0)
            if rows[0][names.index("id")] is None:  # nothing due: one row saying how long to sleep
                return Waited([], float(rows[0][names.index("wake_in_s")]))
            messages = [delivery_from_row(cls, row, client, names) for row in rows]
            for m in messages:
                del m.__dict__["wake_in_s"]
            return Waited(messages, 0.0)

        return Statement(self.sql.poll_or_wait, params, decode, binary=True)

    # -- finish a delivery -------------------------------------------------------------------------
    def ack(self, lock_token: Any) -> Statement[bool]:
        return Statement(self.sql.ack, {"lock_token": check_lock_token(lock_token)}, _value("acked", bool, False))

    def ack_many(self, messages: Iterable[Any]) -> Statement[int]:
        """Acknowledge deliveries or lock tokens (UUIDs); no statement when there are none."""
        return self._many(self.sql.ack_many, "acked", messages)

    def release_many(self, messages: Iterable[Any]) -> Statement[int]:
        """``dq_release``: give back deliveries or lock tokens (UUIDs) whose handling never started;
        no statement when there are none."""
        return self._many(self.sql.release_many, "released", messages)

    @staticmethod
    def _many(sql: str, column: str, messages: Iterable[Any]) -> Statement[int]:
        """A statement on the lock tokens of ``messages`` (deliveries or UUIDs) that counts rows."""
        if isinstance(messages, (str, bytes, UUID, LockedMessage)) or not isinstance(messages, Iterable):
            raise InvalidArgument(
                f"messages must be an iterable of deliveries or lock tokens, got {described(messages)}")
        tokens = [m.lock_token if isinstance(m, LockedMessage) else check_lock_token(m, f"messages[{i}]")
                  for i, m in enumerate(messages)]
        decode = _value(column, int, 0)
        if not tokens:
            return Statement(None, None, decode)
        return Statement(sql, {"lock_tokens": tokens}, decode)

    def nack(self, lock_token: Any, delay: Seconds, error: str | None) -> Statement[bool]:
        return Statement(self.sql.nack, self._nack_params(lock_token, delay, error), _value("nacked", bool, False))

    def nack_outcome(self, lock_token: Any, delay: Seconds, error: str | None) -> Statement[NackResult]:
        """``dq_nack_outcome``: the nack, and where the message went."""

        def decode(names: Sequence[str], rows: Rows) -> NackResult:
            row = dict(zip(names, rows[0], strict=True))
            return NackResult(NackOutcome(row["outcome"]), row["due"], row["dead_letter_queue"])

        return Statement(self.sql.nack_outcome, self._nack_params(lock_token, delay, error), decode)

    def dead_letter(self, lock_token: Any, error: str | None) -> Statement[NackResult]:
        """``dq_dead_letter``: move the held message to its dead-letter queue now."""

        def decode(names: Sequence[str], rows: Rows) -> NackResult:
            row = dict(zip(names, rows[0], strict=True))
            return NackResult(NackOutcome(row["outcome"]), dead_letter_queue=row["dead_letter_queue"])

        params = {"lock_token": check_lock_token(lock_token), "error": check_str(error, "error", optional=True)}
        return Statement(self.sql.dead_letter, params, decode)

    @staticmethod
    def _nack_params(lock_token: Any, delay: Seconds, error: str | None) -> dict[str, Any]:
        return {"lock_token": check_lock_token(lock_token), "delay": as_timedelta(delay, "delay", allow_zero=True),
                "error": check_str(error, "error", optional=True)}

    def has_nack_outcome(self) -> Statement[bool]:
        return Statement(self.sql.has_nack_outcome, {}, _value("present", bool, False))  # {}: %% is %

    def extend(self, lock_token: Any, timeout: Seconds) -> Statement[datetime | None]:
        params = {"lock_token": check_lock_token(lock_token), "timeout": as_timedelta(timeout, "timeout")}
        return Statement(self.sql.extend, params, _value("locked_until"))

    # -- operations --------------------------------------------------------------------------------
    def configure(
        self,
        max_deliveries: int | None,
        dead_letter_queue: str | None,
        archive: bool | None,
        retention: Seconds | None,
        notify: bool | None,
        max_payload_bytes: int | None,
        max_in_flight: int | None = None,
        rate_limit: int | None = None,
        rate_period: Seconds | None = None,
        clear: Iterable[str] = (),
    ) -> Statement[None]:
        params = self._q(
            max_deliveries=check_int(max_deliveries, "max_deliveries", optional=True),
            dead_letter_queue=None if dead_letter_queue is None else check_queue_name(
                dead_letter_queue, "dead_letter_queue"),
            archive=check_bool(archive, "archive", optional=True),
            retention=None if retention is None else as_timedelta(retention, "retention"),
            notify=check_bool(notify, "notify", optional=True),
            max_payload_bytes=check_int(max_payload_bytes, "max_payload_bytes", optional=True),
            max_in_flight=check_int(max_in_flight, "max_in_flight", optional=True),
            rate_limit=check_int(rate_limit, "rate_limit", optional=True),
            rate_period=None if rate_period is None else as_timedelta(rate_period, "rate_period"),
            clear=check_setting_names(clear, "clear"),
        )
        return Statement(self.sql.configure, params, _none)

    def pause(self) -> Statement[bool]:
        return Statement(self.sql.pause, self._q(), _value("changed", bool, False))

    def resume(self) -> Statement[bool]:
        return Statement(self.sql.resume, self._q(), _value("changed", bool, False))

    def stats(self) -> Statement[QueueStats]:
        return Statement(self.sql.stats, self._q(), lambda names, rows: _records(_queue_stats)(names, rows)[0])

    def purge(self, confirm: bool) -> Statement[int]:
        return Statement(self.sql.purge, self._q(confirm=check_bool(confirm, "confirm")), _value("purged", int, 0))

    def release_locks(self) -> Statement[int]:
        return Statement(self.sql.release_locks, self._q(), _value("released", int, 0))

    def redrive(self, max_count: int) -> Statement[int]:
        params = self._q(max_count=check_int(max_count, "max_count", 1, limits.REDRIVE_MAX_COUNT))
        return Statement(self.sql.redrive, params, _value("moved", int, 0))

    def dead_letters(self, max_rows: int) -> Statement[list[dict[str, Any]]]:
        """``dq_dead_letters``: this dead-letter queue's dead letters, oldest death first, each as
        ``{column: value}`` (key, dead_from, last_error, payload_text …)."""
        params = self._q(max_rows=check_int(max_rows, "max_rows", 1, limits.DEAD_LETTERS_MAX_ROWS))
        return Statement(self.sql.dead_letters, params, _records(dict))

    # -- read --------------------------------------------------------------------------------------
    def cancel(self, key: str) -> Statement[bool]:
        return Statement(self.sql.cancel, self._q(key=check_str(key, "key")), _value("cancelled", bool, False))

    def get(self, key: str) -> Statement[StoredMessage | None]:
        def decode(names: Sequence[str], rows: Rows) -> StoredMessage | None:
            if not rows:
                return None
            row = dict(zip(names, rows[0], strict=True))
            return StoredMessage(**{**row, "raw_payload": bytes(row["raw_payload"])}, _registry=self.serializers)

        return Statement(self.sql.get, self._q(key=check_str(key, "key")), decode)

    def dead_letters_of(self, message: LockedMessage[Any]) -> Statement[str]:
        """Opens a cursor (inside a transaction) over the dead letters ``message`` may have become:
        rows of this key that died in this queue, inserted after it (ids only grow)."""
        filters = Jsonb([["key", "=", message.key], ["dead_from", "=", self.queue]])
        return Statement(self.sql.export_messages, {"id_from": message.id, "filters": filters}, _value("cursor", str))

    @staticmethod
    def fetch_all(cursor: str) -> Statement[list[dict[str, Any]]]:
        """Every row left in the named cursor, as ``{column: value}``."""
        return Statement(sql.SQL("FETCH ALL FROM {}").format(sql.Identifier(cursor)), None, _records(dict))

    def next_due(self) -> Statement[datetime | None]:
        return Statement(self.sql.next_due, self._q(), _value("next_due"))

    def channel(self) -> Statement[str]:
        return Statement(self.sql.channel, self._q(), _value("channel", str))


def offer_requests(items: Iterable[OfferRequest | tuple[str, Any]]) -> list[OfferRequest]:
    """The items of ``offer_many`` as :class:`OfferRequest` objects (``(key, payload)`` pairs
    become requests due now); :class:`pyqueue.InvalidArgument` for anything else, before any I/O."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise InvalidArgument(
            f"items must be an iterable of OfferRequest or (key, payload) pairs, got {described(items)}")
    requests = []
    for i, item in enumerate(items):
        if isinstance(item, OfferRequest):
            requests.append(item)
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            requests.append(OfferRequest(item[0], item[1]))
        else:
            raise InvalidArgument(
                f"items[{i}] must be an OfferRequest or a (key, payload) pair, got {described(item)}")
    return requests
