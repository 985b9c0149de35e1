"""A blocking view of the asyncio API, so the behaviour tests of the sync client run unchanged
against :class:`pyqueue.aio.AsyncDelayedQueue` (the style guide's rule: sync and async must not
drift, test both with the same tests).

``Blocking(obj, loop)`` forwards attribute access to ``obj``; every awaitable a call returns is
run to completion on ``loop`` (an event loop running in its own thread), async context managers
become ordinary ones, and the objects they produce (messages, batches, async connections and
cursors, the cron accessor) are wrapped the same way. It adds no behaviour of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine, ValuesView
from typing import Any

import psycopg

from pyqueue.aio import AsyncDelayedQueue, AsyncMessage, AsyncQueueCron, AsyncTransactionalBatch


class EventLoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


_WRAPPED = (AsyncDelayedQueue, AsyncMessage, AsyncQueueCron, AsyncTransactionalBatch, psycopg.AsyncConnection,
            psycopg.AsyncCursor)


def _unwrap(value: Any) -> Any:
    if isinstance(value, Blocking):
        return value._obj
    if isinstance(value, list | tuple | ValuesView) or inspect.isgenerator(value):
        return [_unwrap(v) for v in value]
    return value


async def _await(value: Any) -> Any:
    return await value


class _BlockingCM:
    def __init__(self, cm: Any, runner: EventLoopThread) -> None:
        self._cm, self._runner = cm, runner

    def __enter__(self) -> Any:
        return _wrap(self._runner.run(_await(self._cm.__aenter__())), self._runner)

    def __exit__(self, *exc: Any) -> Any:
        return self._runner.run(_await(self._cm.__aexit__(*exc)))


def _wrap(value: Any, runner: EventLoopThread) -> Any:
    if inspect.isawaitable(value):
        return _wrap(runner.run(_await(value)), runner)
    if hasattr(value, "__aenter__") and not isinstance(value, _WRAPPED):
        return _BlockingCM(value, runner)
    if isinstance(value, list):
        return [_wrap(v, runner) for v in value]
    if isinstance(value, _WRAPPED):
        return Blocking(value, runner)
    return value


class Blocking:
    def __init__(self, obj: Any, runner: EventLoopThread) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_runner", runner)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        if callable(attr) and not isinstance(attr, type):
            def call(*args: Any, **kwargs: Any) -> Any:
                result = attr(*[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()})
                return _wrap(result, self._runner)
            return call
        return _wrap(attr, self._runner)

    def __eq__(self, other: object) -> bool:
        return bool(self._obj == _unwrap(other))

    def __hash__(self) -> int:
        return hash(self._obj)

    def __enter__(self) -> Blocking:
        self._runner.run(_await(self._obj.__aenter__()))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._runner.run(_await(self._obj.__aexit__(*exc)))
