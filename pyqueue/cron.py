"""Recurring messages: named schedules installed by the database itself (issue 4, docs/cron.md).

A schedule (``dq_cron_install``) is installed ahead of time as ordinary delayed messages keyed
``<name>/<config_hash>/<epoch ms>`` (seed 003's CronService keys), so every install is idempotent
and any number of installers may run without a leader. In the database that holds pg_cron, the job
``dq-cron-tick`` calls ``dq_cron_tick()`` every minute; elsewhere run :class:`CronTicker` (or
``pyqueue cron tick --every 30s``).

The functions here take an open :class:`psycopg.Connection` and make one call each. In autocommit
mode each call is its own transaction; otherwise it joins the caller's transaction (call them under
READ COMMITTED, the default). Server errors are raised as :mod:`pyqueue.errors` exceptions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row

from .errors import translating
from .serializers import SerializerRegistry
from .serializers import registry as default_registry

__all__ = [
    "CronSchedule",
    "QueueCron",
    "CronTicker",
    "install",
    "uninstall",
    "pause",
    "resume",
    "tick",
    "schedules",
    "occurrences",
    "TICKER_LOCK_KEY",
]

log = logging.getLogger("pyqueue.cron")

#: The session advisory lock a :class:`CronTicker` holds while it ticks (``pg_try_advisory_lock``
#: with this bigint key): at most one ticker per database works at a time.
TICKER_LOCK_KEY = 0x64715F63726F6E  # b"dq_cron"

_INSTALL = (
    "SELECT dq_cron_install(name => %(name)s, queue => %(queue)s, schedule => %(schedule)s, "
    "payload => %(payload)s::bytea, timezone => %(timezone)s, payload_type => %(payload_type)s, "
    "lookahead => %(lookahead)s::interval)"
)
_UNINSTALL = "SELECT dq_cron_uninstall(%s)"
_PAUSE = "SELECT dq_cron_pause(%s)"
_RESUME = "SELECT dq_cron_resume(%s)"
_TICK = "SELECT dq_cron_tick()"
_SCHEDULE_COLUMNS = (
    "SELECT name, queue, schedule, timezone, payload_type, lookahead, config_hash, paused, "
    "next_occurrences, installed_through, created_at, updated_at FROM dq_cron_schedules"
)
_SCHEDULES = _SCHEDULE_COLUMNS + " ORDER BY name"
_SCHEDULES_OF_QUEUE = _SCHEDULE_COLUMNS + " WHERE queue = %s ORDER BY name"
_OCCURRENCES = (
    "SELECT o FROM dq_cron_occurrences(%(schedule)s, %(timezone)s, coalesce(%(after)s::timestamptz, now()), "
    "coalesce(%(until)s::timestamptz, 'infinity'), %(max_count)s) AS o"
)
_TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"


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


def _scalar(conn: psycopg.Connection[Any], query: str, params: Any) -> Any:
    with translating():
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def install(
    conn: psycopg.Connection[Any],
    name: str,
    queue: str,
    schedule: str,
    payload: Any,
    *,
    timezone: str = "UTC",
    payload_type: str | None = None,
    lookahead: timedelta = timedelta(hours=1),
    serializers: SerializerRegistry | None = None,
) -> str:
    """Create or replace the named schedule and install its next occurrences at once.

    :param name: the schedule's name, 1..100 characters; also the key prefix of its messages.
    :param queue: the queue its messages go to, 1..100 characters.
    :param schedule: a 5-field cron expression (``"*/15 9-17 * * mon-fri"``), a macro (``"@daily"``),
        ``"every 15 minutes"`` (multiples of the interval since the Unix epoch) or
        ``"daily at 09:00, 17:30"``; at most 1000 characters. See docs/cron.md.
    :param payload: bytes (payload_type ``bytes``), str (``text``) or a JSON-serializable object
        (``json``), encoded as :meth:`pyqueue.DelayedQueue.offer` does.
    :param timezone: IANA zone name in which cron and ``daily at`` times are read; default ``"UTC"``.
    :param payload_type: tag stored with each message; default inferred from ``payload``.
    :param lookahead: how far ahead occurrences are installed (0 < lookahead <= 366 days); default
        1 hour. Occurrences keep coming as long as something ticks at least once per lookahead.
    :param serializers: payload encoders (default: the process registry).
    :returns: the configuration hash (16 hex digits). The same definition again changes nothing; a
        changed definition replaces every future occurrence in one transaction.
    :raises pyqueue.errors.InvalidArgument: bad schedule, zone or lookahead (22023), or a
        :class:`~pyqueue.errors.NullValueNotAllowed` / :class:`~pyqueue.errors.ValueTooLong`.
    """
    params = _install_params(name, queue, schedule, payload, timezone, payload_type, lookahead, serializers)
    return str(_scalar(conn, _INSTALL, params))


def _install_params(
    name: str,
    queue: str,
    schedule: str,
    payload: Any,
    timezone: str,
    payload_type: str | None,
    lookahead: timedelta,
    serializers: SerializerRegistry | None,
) -> dict[str, Any]:
    data, ptype = (serializers or default_registry).encode(payload, payload_type)
    return {
        "name": name,
        "queue": queue,
        "schedule": schedule,
        "payload": data,
        "timezone": timezone,
        "payload_type": ptype,
        "lookahead": lookahead,
    }


def _to_schedules(rows: list[dict[str, Any]]) -> list[CronSchedule]:
    return [CronSchedule(**{**r, "next_occurrences": tuple(r["next_occurrences"] or ())}) for r in rows]


def uninstall(conn: psycopg.Connection[Any], name: str) -> bool:
    """Remove the schedule and its future occurrence messages (due or in-flight ones stay).

    :returns: ``False`` when no schedule has that name.
    :raises pyqueue.errors.InvalidArgument: empty or too long ``name``.
    """
    return bool(_scalar(conn, _UNINSTALL, (name,)))


def pause(conn: psycopg.Connection[Any], name: str) -> bool:
    """Pause the schedule: its future occurrences are deleted and none is installed until :func:`resume`.

    :returns: ``False`` when no schedule has that name.
    """
    return bool(_scalar(conn, _PAUSE, (name,)))


def resume(conn: psycopg.Connection[Any], name: str) -> bool:
    """Resume a paused schedule from now (what fell while paused is not caught up).

    :returns: ``False`` when no schedule has that name.
    """
    return bool(_scalar(conn, _RESUME, (name,)))


def tick(conn: psycopg.Connection[Any]) -> int:
    """Run ``dq_cron_tick()`` once: install what every active schedule lacks.

    :returns: the number of messages created (0 when everything was installed already).
    """
    return int(_scalar(conn, _TICK, None))


def schedules(conn: psycopg.Connection[Any]) -> list[CronSchedule]:
    """All schedules, by name, with their next occurrences (the view ``dq_cron_schedules``)."""
    with translating(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(_SCHEDULES).fetchall()
    return _to_schedules(rows)


def occurrences(
    conn: psycopg.Connection[Any],
    schedule: str,
    *,
    timezone: str = "UTC",
    after: datetime | None = None,
    until: datetime | None = None,
    max_count: int = 10,
) -> list[datetime]:
    """The instants at which ``schedule`` fires in ``(after, until]``, earliest first (changes nothing).

    :param after: exclusive start; ``None`` = the database's ``now()``.
    :param until: inclusive end; ``None`` = no end (then at most 50 years are searched).
    :param max_count: at most this many, 1..10000.
    :raises pyqueue.errors.InvalidArgument: bad schedule, zone or max_count.
    """
    params = {"schedule": schedule, "timezone": timezone, "after": after, "until": until, "max_count": max_count}
    with translating():
        return [r[0] for r in conn.execute(_OCCURRENCES, params).fetchall()]


class _QueueLike(Protocol):
    queue: str
    serializers: SerializerRegistry

    def _conn(self, conn: None) -> AbstractContextManager[psycopg.Connection[Any]]: ...


class QueueCron:
    """The schedules of one queue: ``DelayedQueue(...).cron`` (the asyncio twin is
    :class:`pyqueue.aio.AsyncQueueCron`). Each method takes a pooled connection and makes one call.

    Schedule names are unique in the whole database, not per queue: :meth:`uninstall`,
    :meth:`pause` and :meth:`resume` act on the named schedule whatever its queue; :meth:`list`
    shows this queue's schedules only.
    """

    def __init__(self, queue: _QueueLike) -> None:
        self._queue = queue

    def install(
        self,
        name: str,
        *,
        schedule: str,
        payload: Any,
        tz: str = "UTC",
        payload_type: str | None = None,
        lookahead: timedelta = timedelta(hours=1),
    ) -> str:
        """Create or replace the named schedule sending ``payload`` to this queue (see :func:`install`:
        the same parameters, ``tz`` being the IANA zone name; the queue's serializers encode the payload).

        :returns: the configuration hash (16 hex digits).
        :raises pyqueue.errors.InvalidArgument: bad schedule, zone or lookahead (22023).
        """
        params = _install_params(name, self._queue.queue, schedule, payload, tz, payload_type, lookahead,
                                 self._queue.serializers)
        with self._queue._conn(None) as c:
            return str(_scalar(c, _INSTALL, params))

    def uninstall(self, name: str) -> bool:
        """Remove the schedule and its future messages (:func:`uninstall`); False when no schedule has that name."""
        with self._queue._conn(None) as c:
            return uninstall(c, name)

    def pause(self, name: str) -> bool:
        """:func:`pause`: future occurrences deleted, none installed until :meth:`resume`."""
        with self._queue._conn(None) as c:
            return pause(c, name)

    def resume(self, name: str) -> bool:
        """:func:`resume`: installs again from now (no catching up)."""
        with self._queue._conn(None) as c:
            return resume(c, name)

    def list(self) -> list[CronSchedule]:
        """This queue's schedules, by name, with their next 5 occurrences."""
        with self._queue._conn(None) as c, c.cursor(row_factory=dict_row) as cur:
            return _to_schedules(cur.execute(_SCHEDULES_OF_QUEUE, (self._queue.queue,)).fetchall())

    def tick(self) -> int:
        """Run ``dq_cron_tick()`` once (every schedule of the database); returns messages created."""
        with self._queue._conn(None) as c:
            return tick(c)


class CronTicker(threading.Thread):
    """A daemon thread that calls ``dq_cron_tick()`` every ``every``, at most one per database.

    Before ticking it takes the session advisory lock :data:`TICKER_LOCK_KEY` with
    ``pg_try_advisory_lock`` and keeps it (and its connection) while it runs: other tickers on the
    same database find it taken and only retry each period, so one works at a time and another
    takes over within one period after the holder stops or its connection dies. Ticking twice
    would not duplicate anything (occurrence keys are unique); the lock only saves the work.

    A lost connection (or any database error) is logged; the ticker reconnects with exponential
    backoff from ``min_backoff`` to ``max_backoff`` and carries on. :meth:`stop` ends it.

    :param dsn: libpq connection string of the database.
    :param every: period between ticks (timedelta or seconds); default 30 s. Keep it below the
        schedules' lookahead (default 1 hour).
    :param min_backoff: first wait after a failure; default 0.5 s.
    :param max_backoff: longest wait between reconnection attempts; default 30 s.
    :param on_tick: called with the number of messages each tick created (in the ticker thread).
    """

    def __init__(
        self,
        dsn: str,
        *,
        every: timedelta | float = timedelta(seconds=30),
        min_backoff: timedelta | float = 0.5,
        max_backoff: timedelta | float = 30.0,
        on_tick: Callable[[int], None] | None = None,
        name: str = "pyqueue-cron-ticker",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.dsn = dsn
        self.every = _seconds(every)
        self.min_backoff = _seconds(min_backoff)
        self.max_backoff = _seconds(max_backoff)
        if self.every <= 0 or self.min_backoff <= 0 or self.max_backoff < self.min_backoff:
            raise ValueError("every and min_backoff must be positive, max_backoff at least min_backoff")
        self.on_tick = on_tick
        self._stop_event = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self.ticks = 0
        """Number of ticks run by this ticker."""
        self.created = 0
        """Messages created by its ticks, in total."""
        self.failures = 0
        """Database errors met (each followed by a reconnect)."""
        self.holds_lock = False
        """Whether it currently holds the advisory lock (is the working ticker)."""

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to stop, close its connection (releasing the lock) and wait up to ``timeout`` s."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    def run(self) -> None:
        backoff = self.min_backoff
        try:
            while not self._stop_event.is_set():
                try:
                    self._cycle()
                    backoff = self.min_backoff
                    wait = self.every
                except psycopg.Error as exc:
                    self.failures += 1
                    log.warning("cron ticker: %s; reconnecting in %.1f s", exc, backoff)
                    self._close()
                    wait = backoff
                    backoff = min(backoff * 2, self.max_backoff)
                self._stop_event.wait(wait)
        finally:
            self._close()

    def _cycle(self) -> None:
        if self._conn is None or self._conn.closed:
            self.holds_lock = False
            conn = psycopg.connect(self.dsn, autocommit=True, application_name="pyqueue-cron-ticker")
            with self._lock:
                self._conn = conn
        conn = self._conn
        if not self.holds_lock:
            row = conn.execute(_TRY_LOCK, (TICKER_LOCK_KEY,)).fetchone()
            self.holds_lock = bool(row and row[0])
            if not self.holds_lock:
                return
        row = conn.execute(_TICK).fetchone()
        created = int(row[0]) if row else 0
        self.ticks += 1
        self.created += created
        if self.on_tick is not None:
            self.on_tick(created)

    def _close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        self.holds_lock = False
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:  # pragma: no cover - closing a broken connection
                pass


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
