"""Recurring messages, sync API (docs/cron.md): the schedule functions taking a connection
(:func:`install`, :func:`uninstall`, :func:`pause`, :func:`resume`, :func:`tick`,
:func:`schedules`, :func:`occurrences`), a queue's :class:`QueueCron` (``DelayedQueue.cron``) and
the :class:`CronTicker` thread; defined in :mod:`pyqueue.sync.cron`, the asyncio twins in
:mod:`pyqueue.aio.cron`."""

from .sync.cron import (
    TICKER_LOCK_KEY,
    CronSchedule,
    CronTicker,
    QueueCron,
    install,
    occurrences,
    pause,
    resume,
    schedules,
    tick,
    uninstall,
)

__all__ = [
    "CronSchedule", "QueueCron", "CronTicker", "install", "uninstall", "pause", "resume", "tick", "schedules",
    "occurrences", "TICKER_LOCK_KEY",
]
