"""Recurring messages, asyncio API: the twins of :mod:`pyqueue.cron`'s functions on a
``psycopg.AsyncConnection`` and :class:`AsyncQueueCron` (``AsyncDelayedQueue(...).cron``).

Same names, parameters, results and errors as :mod:`pyqueue.cron` (whose docstrings describe
each in full), the same statements (:mod:`pyqueue.core.statements`); only the I/O is awaited.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from ..core.checks import cron_timezone
from ..core.statements import Statement, Statements
from ..drivers.aio import AsyncDriver, run
from ..errors import translating
from ..model import CronSchedule
from ..serializers import SerializerRegistry
from ..serializers import registry as default_registry

__all__ = ["AsyncQueueCron", "install", "uninstall", "pause", "resume", "tick", "schedules", "occurrences"]


async def _run(conn: psycopg.AsyncConnection[Any], op: Statement[Any]) -> Any:
    with translating():
        return await run(conn, op)


async def install(
    conn: psycopg.AsyncConnection[Any], name: str, queue: str, schedule: str, payload: Any, *, timezone: str = "UTC",
    payload_type: str | None = None, lookahead: timedelta = timedelta(hours=1),
    serializers: SerializerRegistry | None = None, schema: str | None = None,
) -> str:
    """Create or replace the named schedule; returns its config hash (see :func:`pyqueue.cron.install`)."""
    op = Statements(schema).cron_install(name, queue, schedule, payload, timezone, payload_type, lookahead,
                                  serializers or default_registry)
    return str(await _run(conn, op))


async def uninstall(conn: psycopg.AsyncConnection[Any], name: str, *, schema: str | None = None) -> bool:
    """Remove the schedule and its future messages; False when absent (:func:`pyqueue.cron.uninstall`)."""
    return bool(await _run(conn, Statements(schema).cron_uninstall(name)))


async def pause(conn: psycopg.AsyncConnection[Any], name: str, *, schema: str | None = None) -> bool:
    """Pause the schedule; False when absent (:func:`pyqueue.cron.pause`)."""
    return bool(await _run(conn, Statements(schema).cron_pause(name)))


async def resume(conn: psycopg.AsyncConnection[Any], name: str, *, schema: str | None = None) -> bool:
    """Resume a paused schedule from now; False when absent (:func:`pyqueue.cron.resume`)."""
    return bool(await _run(conn, Statements(schema).cron_resume(name)))


async def tick(conn: psycopg.AsyncConnection[Any], *, schema: str | None = None) -> int:
    """Run ``dq_cron_tick()`` once; returns the messages created (:func:`pyqueue.cron.tick`)."""
    return int(await _run(conn, Statements(schema).cron_tick()))


async def schedules(conn: psycopg.AsyncConnection[Any], *, schema: str | None = None) -> list[CronSchedule]:
    """All schedules, by name (:func:`pyqueue.cron.schedules`)."""
    result: list[CronSchedule] = await _run(conn, Statements(schema).cron_schedules())
    return result


async def occurrences(
    conn: psycopg.AsyncConnection[Any], schedule: str, *, timezone: str = "UTC", after: datetime | None = None,
    until: datetime | None = None, max_count: int = 10, schema: str | None = None,
) -> list[datetime]:
    """The instants at which ``schedule`` fires in ``(after, until]`` (:func:`pyqueue.cron.occurrences`)."""
    op = Statements(schema).cron_occurrences(schedule, timezone, after, until, max_count)
    result: list[datetime] = await _run(conn, op)
    return result


class AsyncQueueCron:
    """The schedules of one queue: ``AsyncDelayedQueue(...).cron``; the asyncio twin of
    :class:`pyqueue.cron.QueueCron` (same methods, same errors, awaited). Schedule names are unique
    in the whole database; :meth:`list` shows this queue's schedules only."""

    def __init__(self, driver: AsyncDriver) -> None:
        self._driver = driver
        self._statements = driver.statements

    async def install(
        self, name: str, *, schedule: str, payload: Any, timezone: str = "UTC",
        payload_type: str | None = None, lookahead: timedelta = timedelta(hours=1), tz: str | None = None,
    ) -> str:
        """Create or replace the named schedule sending ``payload`` to this queue; returns the config hash."""
        ops = self._statements
        op = ops.cron_install(name, ops.queue, schedule, payload, cron_timezone(timezone, tz), payload_type, lookahead,
                              ops.serializers)
        return await self._driver.run(op)

    async def uninstall(self, name: str) -> bool:
        """Remove the schedule and its future messages; False when no schedule has that name."""
        return await self._driver.run(self._statements.cron_uninstall(name))

    async def pause(self, name: str) -> bool:
        """Pause the schedule (:meth:`pyqueue.cron.QueueCron.pause`)."""
        return await self._driver.run(self._statements.cron_pause(name))

    async def resume(self, name: str) -> bool:
        """Resume the schedule from now (:meth:`pyqueue.cron.QueueCron.resume`)."""
        return await self._driver.run(self._statements.cron_resume(name))

    async def list(self) -> list[CronSchedule]:
        """This queue's schedules, by name, with their next 5 occurrences."""
        return await self._driver.run(self._statements.cron_schedules(self._statements.queue))

    async def tick(self) -> int:
        """Run ``dq_cron_tick()`` once; returns messages created."""
        return await self._driver.run(self._statements.cron_tick())
