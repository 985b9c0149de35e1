"""Recurring messages, sync API: named schedules installed by the database itself (docs/cron.md).

A schedule (``dq_cron_install``) is installed ahead of time as ordinary delayed messages keyed
``<name>/<config_hash>/<epoch ms>``, so every install is idempotent and any number of installers
may run without a leader. In the database that holds pg_cron, the job ``dq-cron-tick`` calls
``dq_cron_tick()`` every minute; elsewhere run :class:`CronTicker` (or
``pyqueue cron tick --every 30s``).

The functions here take an open :class:`psycopg.Connection` and make one call each. In autocommit
mode each call is its own transaction; otherwise it joins the caller's transaction (call them under
READ COMMITTED, the default). Server errors are raised as :mod:`pyqueue.errors` exceptions. Each
takes ``schema``, the schema of the install (None: the names are resolved by the connection's
search_path). :mod:`pyqueue.aio.cron` holds the asyncio twins (same names and parameters).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from ..core.checks import cron_timezone
from ..core.statements import Statement, Statements
from ..drivers.sync import Driver, run
from ..durations import Seconds, as_timedelta
from ..errors import InvalidArgument, translating
from ..model import CronSchedule
from ..serializers import SerializerRegistry
from ..serializers import registry as default_registry

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
    "start_ticker",
]

log = logging.getLogger("pyqueue.cron")

#: The session advisory lock a :class:`CronTicker` holds while it ticks (``pg_try_advisory_lock``
#: with this bigint key, for the install in ``public``; an install in another schema uses
#: ``hashtextextended('dq_cron_tick@' || schema, 0)``): at most one ticker per install works at a time.
TICKER_LOCK_KEY = 0x64715F63726F6E  # b"dq_cron"


def _run(conn: psycopg.Connection[Any], op: Statement[Any]) -> Any:
    with translating():
        return run(conn, op)


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
    schema: str | None = None,
) -> str:
    """Create or replace the named schedule and install its next occurrences at once.

    :param name: the schedule's name, 1 to :data:`pyqueue.limits.CRON_NAME_CHARS` characters; also
        the key prefix of its messages.
    :param queue: the queue its messages go to, 1 to :data:`pyqueue.limits.QUEUE_CHARS` characters.
    :param schedule: a 5-field cron expression (``"*/15 9-17 * * mon-fri"``), a macro (``"@daily"``),
        ``"every 15 minutes"`` (multiples of the interval since the Unix epoch) or
        ``"daily at 09:00, 17:30"``; at most :data:`pyqueue.limits.CRON_SCHEDULE_CHARS` characters.
        See docs/cron.md.
    :param payload: bytes (payload_type ``bytes``), str (``text``) or a JSON-serializable object
        (``json``), encoded as :meth:`pyqueue.DelayedQueue.offer` does.
    :param timezone: IANA zone name in which cron and ``daily at`` times are read; default ``"UTC"``.
    :param payload_type: tag stored with each message; default inferred from ``payload``.
    :param lookahead: how far ahead occurrences are installed (more than 0, at most
        :data:`pyqueue.limits.CRON_LOOKAHEAD_MAX`); default 1 hour. Occurrences keep coming as long
        as something ticks at least once per lookahead.
    :param serializers: payload encoders (default: the process registry).
    :param schema: the schema of the install; None: resolved by the connection's search_path.
    :returns: the configuration hash (16 hex digits). The same definition again changes nothing; a
        changed definition replaces every future occurrence in one transaction.
    :raises pyqueue.errors.InvalidArgument: bad schedule, zone or lookahead (22023), or a
        :class:`~pyqueue.errors.NullValueNotAllowed` / :class:`~pyqueue.errors.ValueTooLong`.
    """
    op = Statements(schema).cron_install(name, queue, schedule, payload, timezone, payload_type, lookahead,
                                  serializers or default_registry)
    return str(_run(conn, op))


def uninstall(conn: psycopg.Connection[Any], name: str, *, schema: str | None = None) -> bool:
    """Remove the schedule and its future occurrence messages (due or in-flight ones stay).

    :returns: ``False`` when no schedule has that name.
    :raises pyqueue.errors.InvalidArgument: empty or too long ``name``.
    """
    return bool(_run(conn, Statements(schema).cron_uninstall(name)))


def pause(conn: psycopg.Connection[Any], name: str, *, schema: str | None = None) -> bool:
    """Pause the schedule: its future occurrences are deleted and none is installed until :func:`resume`.

    :returns: ``False`` when no schedule has that name.
    """
    return bool(_run(conn, Statements(schema).cron_pause(name)))


def resume(conn: psycopg.Connection[Any], name: str, *, schema: str | None = None) -> bool:
    """Resume a paused schedule from now (what fell while paused is not caught up).

    :returns: ``False`` when no schedule has that name.
    """
    return bool(_run(conn, Statements(schema).cron_resume(name)))


def tick(conn: psycopg.Connection[Any], *, schema: str | None = None) -> int:
    """Run ``dq_cron_tick()`` once: install what every active schedule lacks.

    :returns: the number of messages created (0 when everything was installed already).
    """
    return int(_run(conn, Statements(schema).cron_tick()))


def schedules(conn: psycopg.Connection[Any], *, schema: str | None = None) -> list[CronSchedule]:
    """All schedules, by name, with their next occurrences (the view ``dq_cron_schedules``)."""
    result: list[CronSchedule] = _run(conn, Statements(schema).cron_schedules())
    return result


def occurrences(
    conn: psycopg.Connection[Any],
    schedule: str,
    *,
    timezone: str = "UTC",
    after: datetime | None = None,
    until: datetime | None = None,
    max_count: int = 10,
    schema: str | None = None,
) -> list[datetime]:
    """The instants at which ``schedule`` fires in ``(after, until]``, earliest first (changes nothing).

    :param after: exclusive start; ``None`` = the queue's time, ``dq_now()`` (the start of the transaction).
    :param until: inclusive end; ``None`` = no end (then at most 50 years are searched).
    :param max_count: at most this many, 1 to :data:`pyqueue.limits.OCCURRENCES_MAX_COUNT`.
    :raises pyqueue.errors.InvalidArgument: bad schedule, zone or max_count.
    """
    op = Statements(schema).cron_occurrences(schedule, timezone, after, until, max_count)
    result: list[datetime] = _run(conn, op)
    return result


class QueueCron:
    """The schedules of one queue: ``DelayedQueue(...).cron`` (the asyncio twin is
    :class:`pyqueue.aio.AsyncQueueCron`). Each method takes a pooled connection and makes one call.

    Schedule names are unique in the whole database, not per queue: :meth:`uninstall`,
    :meth:`pause` and :meth:`resume` act on the named schedule whatever its queue; :meth:`list`
    shows this queue's schedules only.
    """

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._statements = driver.statements

    def install(
        self, name: str, *, schedule: str, payload: Any, timezone: str = "UTC",
        payload_type: str | None = None, lookahead: timedelta = timedelta(hours=1), tz: str | None = None,
    ) -> str:
        """Create or replace the named schedule sending ``payload`` to this queue (see :func:`install`:
        the same parameters, ``timezone`` being the IANA zone name; the queue's serializers encode the
        payload). ``tz`` is the former name of ``timezone``: it still works in this release, with a
        :class:`DeprecationWarning`.

        :returns: the configuration hash (16 hex digits).
        :raises pyqueue.errors.InvalidArgument: bad schedule, zone or lookahead (22023).
        """
        ops = self._statements
        op = ops.cron_install(name, ops.queue, schedule, payload, cron_timezone(timezone, tz), payload_type, lookahead,
                              ops.serializers)
        return self._driver.run(op)

    def uninstall(self, name: str) -> bool:
        """Remove the schedule and its future messages (:func:`uninstall`); False when no schedule has that name."""
        return self._driver.run(self._statements.cron_uninstall(name))

    def pause(self, name: str) -> bool:
        """:func:`pause`: future occurrences deleted, none installed until :meth:`resume`."""
        return self._driver.run(self._statements.cron_pause(name))

    def resume(self, name: str) -> bool:
        """:func:`resume`: installs again from now (no catching up)."""
        return self._driver.run(self._statements.cron_resume(name))

    def list(self) -> list[CronSchedule]:
        """This queue's schedules, by name, with their next 5 occurrences."""
        return self._driver.run(self._statements.cron_schedules(self._statements.queue))

    def tick(self) -> int:
        """Run ``dq_cron_tick()`` once (every schedule of the database); returns messages created."""
        return self._driver.run(self._statements.cron_tick())


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
    :param schema: the schema of the install; None: resolved by the connection's search_path.
    :raises pyqueue.InvalidArgument: a period or backoff not positive, or max_backoff below min_backoff.
    """

    def __init__(
        self,
        dsn: str,
        *,
        every: Seconds = timedelta(seconds=30),
        min_backoff: Seconds = 0.5,
        max_backoff: Seconds = 30.0,
        on_tick: Callable[[int], None] | None = None,
        name: str = "pyqueue-cron-ticker",
        schema: str | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.dsn = dsn
        #: Seconds between ticks, and the first and longest waits after a failure.
        self.every = as_timedelta(every, "every").total_seconds()
        self.min_backoff = as_timedelta(min_backoff, "min_backoff").total_seconds()
        self.max_backoff = as_timedelta(max_backoff, "max_backoff").total_seconds()
        if self.max_backoff < self.min_backoff:
            raise InvalidArgument("max_backoff must be at least min_backoff")
        self._statements = Statements(schema)
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
            self.holds_lock = run(conn, self._statements.try_advisory_lock(TICKER_LOCK_KEY))
            if not self.holds_lock:
                return
        created = run(conn, self._statements.cron_tick())
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


def start_ticker(dsn: str, every: timedelta | None, schema: str | None, logger: logging.Logger) -> CronTicker | None:
    """A worker's ``cron_tick``: a started :class:`CronTicker` thread driving ``dq_cron_tick()``
    every ``every`` (one ticker per database works at a time, by an advisory lock; the others stand
    by), its start logged on ``logger``; None when ``every`` is None. The caller stops it."""
    if every is None:
        return None
    ticker = CronTicker(dsn, every=every, schema=schema)
    ticker.start()
    logger.info("cron ticker started: dq_cron_tick() every %s while this worker holds the tick lock", every)
    return ticker
