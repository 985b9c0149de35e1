"""A queue and its worker inside an ASGI application (Starlette, FastAPI, or anything with a lifespan),
without taking the server's signals.

    from typing import Annotated
    from fastapi import Depends, FastAPI
    from pyqueue.aio import AsyncDelayedQueue
    from pyqueue.contrib.asgi import QueueLifespan, get_queue

    app = FastAPI(lifespan=QueueLifespan(DSN, "emails", handler=send_email, concurrency=4))

    @app.post("/signup")
    async def signup(queue: Annotated[AsyncDelayedQueue, Depends(get_queue)]) -> dict:
        await queue.offer("welcome-42", {"to": "a@example.com"})
        return {"ok": True}

The server (uvicorn, hypercorn) owns SIGTERM and SIGINT: it stops accepting requests, then runs the
lifespan's shutdown, where the worker stops polling and gives its running handlers and the messages it
had prefetched ``shutdown_grace`` to finish (what is still held after it is delivered again when its
lock expires), and the queue's pool closes. An
:class:`~pyqueue.aio.AsyncWorker` started with its defaults would install its own handlers instead and
stop on the first signal while the server went on accepting offers that no one consumed; here it runs
with ``install_signal_handlers=False`` (the ASGI lifespan protocol: https://asgi.readthedocs.io/en/latest/specs/lifespan.html).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from psycopg_pool import AsyncConnectionPool
from starlette.requests import HTTPConnection

from ..aio import AsyncDelayedQueue, AsyncHandler, AsyncWorker

__all__ = ["QueueLifespan", "get_queue", "STATE_KEY"]

log = logging.getLogger("pyqueue.contrib.asgi")

#: The name under which the lifespan puts the queue in the application's state (``request.state``).
STATE_KEY = "pgdelayq"


class QueueLifespan:
    """An ASGI lifespan (``FastAPI(lifespan=...)``, ``Starlette(lifespan=...)``) that opens an
    :class:`~pyqueue.aio.AsyncDelayedQueue` and, given a handler, runs an
    :class:`~pyqueue.aio.AsyncWorker` on it beside the server.

    :param conninfo_or_pool: libpq connection string, or an ``AsyncConnectionPool`` of the
        application's (then the queue shares it, and the application closes it).
    :param queue: the queue's name.
    :param handler: the worker's handler (a coroutine function, or a plain function run in
        threads); None: the application only offers.
    :param state_key: the name of the queue in the lifespan state (``request.state.<state_key>``),
        so several lifespans can serve several queues; default :data:`STATE_KEY`.
    :param queue_options: keyword arguments of :class:`~pyqueue.aio.AsyncDelayedQueue`
        (``schema``, ``pool_size``, ``serializers``, ``middleware``).
    :param worker_options: keyword arguments of :class:`~pyqueue.aio.AsyncWorker` (``concurrency``,
        ``lock_timeout``, ``shutdown_grace`` as a timedelta or seconds, ``middleware``, ``metrics`` …).
    :raises pyqueue.InvalidArgument: at startup, a worker option out of range (as the worker raises it).
    :raises pyqueue.ConnectionFailed: at startup, the database refused the connection: the server does
        not start serving.

    The worker's task is watched: if it ends with an error while the server runs, the error is
    logged on ``pyqueue.contrib.asgi`` (the server goes on serving and offering). On shutdown the
    worker is stopped and awaited (its ``shutdown_grace``) before the pool closes.
    """

    def __init__(self, conninfo_or_pool: str | AsyncConnectionPool[Any], queue: str,
                 handler: AsyncHandler | None = None, *, state_key: str = STATE_KEY,
                 queue_options: Mapping[str, Any] | None = None, **worker_options: Any) -> None:
        self.conninfo_or_pool = conninfo_or_pool
        self.queue = queue
        self.handler = handler
        self.state_key = state_key
        self.queue_options = dict(queue_options or {})
        self.worker_options = worker_options
        #: The worker while the application runs (None before startup, after shutdown, or without a handler).
        self.worker: AsyncWorker | None = None

    def __call__(self, app: Any) -> contextlib.AbstractAsyncContextManager[dict[str, Any]]:
        return self._lifespan(app)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[dict[str, Any]]:
        async with AsyncDelayedQueue(self.conninfo_or_pool, self.queue, **self.queue_options) as queue:
            task: asyncio.Task[None] | None = None
            if self.handler is not None:
                self.worker = AsyncWorker(queue, self.handler, **self.worker_options)
                task = asyncio.create_task(self.worker.run(install_signal_handlers=False),
                                           name=f"pyqueue-worker-{self.queue}")
                task.add_done_callback(self._ended)
            state = getattr(app, "state", None)
            if state is not None:  # for code that reads app.state rather than the lifespan state
                setattr(state, self.state_key, queue)
            try:
                yield {self.state_key: queue}
            finally:
                if self.worker is not None and task is not None:
                    self.worker.stop()
                    with contextlib.suppress(Exception):  # already logged by _ended
                        await task
                self.worker = None

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the worker of queue %r stopped with an error; offers are still accepted", self.queue,
                      exc_info=task.exception())


def get_queue(request: HTTPConnection) -> AsyncDelayedQueue:
    """The queue of the application's :class:`QueueLifespan` (the default state key), for request
    handlers: ``queue: Annotated[AsyncDelayedQueue, Depends(get_queue)]`` in FastAPI, ``get_queue(request)`` in
    Starlette (a request or a websocket).

    :raises RuntimeError: the application has no :class:`QueueLifespan` (or it has not started).
    """
    queue = getattr(request.state, STATE_KEY, None)
    if queue is None:
        raise RuntimeError("no queue in the request's state: give the application lifespan=QueueLifespan(...)")
    return queue  # type: ignore[no-any-return]
