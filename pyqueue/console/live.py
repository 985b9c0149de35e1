"""Live updates of the overview: server-sent events (``/events``) woken by the queues' own NOTIFY
channels and debounced.

One connection per console, open while at least one browser listens: it LISTENs on
``dq_channel(queue)`` of every queue and reads ``dq_metrics()`` at most every ``interval``; a
notification wakes it early (then it waits ``debounce`` more, so a burst of offers is one update).
Each browser is sent ``refresh`` when the figures changed, and fetches the overview's table again.
Offers notify only while a consumer waits on the queue, and acknowledgements never do, so the read
every ``interval`` is what shows those; the console itself never registers as a waiter (that would
make every offer send a NOTIFY, which takes a database-wide lock at commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from ..drivers.aio import _notified, run
from .statements import ConsoleStatements

if TYPE_CHECKING:
    from starlette.requests import Request

log = logging.getLogger("pyqueue.console")

#: The figures whose change is worth an update.
WATCHED = ("ready", "scheduled", "in_flight", "redelivered", "dead", "expired", "held", "paused")


class LiveHub:
    """Fans one reader of the queues' figures out to every ``/events`` stream of a console."""

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
                 statements: ConsoleStatements, *, interval: float = 2.0, debounce: float = 0.5) -> None:
        """:param connect: opens the hub's own connection (autocommit, the console's role and timeout).
        :param interval: seconds between reads of the figures; :param debounce: seconds a
        notification waits for the ones that follow it."""
        self.connect = connect
        self.statements = statements
        self.interval = interval
        self.debounce = debounce
        self._subscribers: set[asyncio.Queue[str]] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def subscribe(self, request: Request) -> AsyncIterator[dict[str, str]]:
        """The events of one stream: ``refresh`` on every change, until the browser goes away."""
        inbox: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._subscribers.add(inbox)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="pyqueue-console-live")
        try:
            yield {"event": "hello", "data": "live"}
            while True:
                await inbox.get()
                yield {"event": "refresh", "data": "changed"}
        finally:
            self._subscribers.discard(inbox)
            if not self._subscribers:
                await self._stop()

    def _publish(self) -> None:
        for inbox in self._subscribers:
            with contextlib.suppress(asyncio.QueueFull):  # one pending refresh is enough
                inbox.put_nowait("refresh")

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def close(self) -> None:
        await self._stop()

    async def _run(self) -> None:
        previous: Any = None
        while self._subscribers:
            try:
                async with await self.connect() as conn:
                    listening: set[str] = set()
                    while self._subscribers:
                        rows = await run(conn, self.statements.metrics())
                        figures = tuple((r["queue"], *(r.get(k) for k in WATCHED)) for r in rows)
                        if previous is not None and figures != previous:
                            self._publish()
                        previous = figures
                        new = [r["queue"] for r in rows if r["queue"] not in listening]
                        if new:
                            for channel in await run(conn, self.statements.channels(new)):
                                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                            listening.update(new)
                        if await _notified(conn, self.interval):
                            await asyncio.sleep(self.debounce)
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as exc:
                log.warning("live updates: %s; retrying in %.0f s", str(exc).strip(), self.interval)
                await asyncio.sleep(self.interval)
