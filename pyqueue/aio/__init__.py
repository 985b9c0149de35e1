"""The asyncio API, twin of the sync one (same names, parameters, defaults, results and typed
errors; ``tests`` check the parity): :class:`AsyncDelayedQueue` and :class:`AsyncMessage`
(:mod:`pyqueue.aio.client`), :class:`AsyncWorker` (:mod:`pyqueue.aio.worker`), and
:class:`AsyncQueueCron` with the schedule functions (:mod:`pyqueue.aio.cron`).

Example::

    async with AsyncDelayedQueue(dsn, "emails") as q:
        await q.offer("welcome/42", {"to": "a@example.com"}, delay=60)
        for message in await q.poll(10, lock_timeout=30, wait=5):
            ...
            await message.ack()
"""

from ..core.middleware import AsyncMiddleware
from .client import AsyncDelayedQueue, AsyncMessage, AsyncTransactionalBatch, all_stats
from .cron import AsyncQueueCron
from .worker import AsyncHandler, AsyncWorker

__all__ = [
    "AsyncDelayedQueue", "AsyncMessage", "AsyncQueueCron", "AsyncTransactionalBatch", "AsyncWorker", "AsyncHandler",
    "AsyncMiddleware", "all_stats",
]
