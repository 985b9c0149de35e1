"""Middleware around handler calls and offers (pyqueue.core.middleware), in both workers and both
clients, against the real server: two middlewares compose in list order, see the handler's
outcome and duration, can add headers to offers, and a middleware that raises is logged and
never loses a delivery."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from workerhandlers import run_until, run_until_async

from pyqueue import (
    Backoff,
    DelayedQueue,
    HandlerCall,
    InvalidArgument,
    Middleware,
    OfferCall,
    OfferRequest,
    Worker,
)
from pyqueue.aio import AsyncDelayedQueue, AsyncMiddleware, AsyncWorker

BACKOFF = Backoff(base=timedelta(seconds=30), factor=1.0, cap=timedelta(seconds=30), jitter=0.0)


class Recorder:
    """What the middlewares of one test saw, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []


class Sync(Middleware):
    """Records before and after each handler call and offer; ``fail`` raises its own error at the
    named moment ("before" the handler, or "after" it)."""

    def __init__(self, name: str, seen: Recorder, fail: str | None = None) -> None:
        self.name, self.seen, self.fail = name, seen, fail

    def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        self.seen.events.append((self.name, "before", call.message.key))
        if self.fail == "before":
            raise RuntimeError(f"{self.name} broke before")
        try:
            return call_next(call)
        finally:
            self.seen.events.append((self.name, "after", call.message.key, call.outcome, call.duration))
            if self.fail == "after":
                raise RuntimeError(f"{self.name} broke after")

    def offer(self, call: OfferCall, call_next: Callable[[OfferCall], Any]) -> Any:
        self.seen.events.append((self.name, "offer", [r.key for r in call.requests], call.batch))
        call.requests = [dataclasses.replace(r, headers={**(r.headers or {}), self.name: "yes"})
                         for r in call.requests]
        return call_next(call)


class Async(AsyncMiddleware):
    """The asyncio twin of :class:`Sync`."""

    def __init__(self, name: str, seen: Recorder, fail: str | None = None) -> None:
        self.name, self.seen, self.fail = name, seen, fail

    async def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        self.seen.events.append((self.name, "before", call.message.key))
        if self.fail == "before":
            raise RuntimeError(f"{self.name} broke before")
        try:
            return await call_next(call)
        finally:
            self.seen.events.append((self.name, "after", call.message.key, call.outcome, call.duration))
            if self.fail == "after":
                raise RuntimeError(f"{self.name} broke after")

    async def offer(self, call: OfferCall, call_next: Callable[[OfferCall], Any]) -> Any:
        self.seen.events.append((self.name, "offer", [r.key for r in call.requests], call.batch))
        call.requests = [dataclasses.replace(r, headers={**(r.headers or {}), self.name: "yes"})
                         for r in call.requests]
        return await call_next(call)


def stored(dsn: str, key: str) -> tuple[int, str | None, dict[str, Any] | None] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT delivery_count, last_error, headers FROM dq_messages WHERE key = %s",
                            (key,)).fetchone()


def run(dsn: str, mode: str, fails: tuple[str | None, str | None], handler_fails: set[str],
        keys: list[str], done: Callable[[Any], bool]) -> tuple[Recorder, Any]:
    """Offer ``keys`` to queue 'jobs' through a queue with two middlewares ("outer", "inner", with
    ``fails``), run a worker of ``mode`` (one slot) whose handler raises for ``handler_fails``
    until ``done(worker.stats.snapshot())``; returns what the middlewares saw and the counters."""
    seen = Recorder()
    settings: dict[str, Any] = {"concurrency": 1, "prefetch": 0, "idle_check": 0.2, "backoff": BACKOFF,
                                "shutdown_grace": 5}

    def handler(m: Any) -> None:
        time.sleep(0.01)
        if m.key in handler_fails:
            raise ValueError(f"handler failed on {m.key}")

    async def coroutine_handler(m: Any) -> None:
        await asyncio.sleep(0.01)
        if m.key in handler_fails:
            raise ValueError(f"handler failed on {m.key}")

    if mode == "sync":
        layers: list[Any] = [Sync("outer", seen, fails[0]), Sync("inner", seen, fails[1])]
        with DelayedQueue(dsn, "jobs", middleware=layers) as q:
            for key in keys:
                q.offer(key, {"k": key})
            return seen, run_until(Worker(q, handler, **settings), done)

    async def main() -> Any:
        layers: list[Any] = [Async("outer", seen, fails[0]), Async("inner", seen, fails[1])]
        async with AsyncDelayedQueue(dsn, "jobs", middleware=layers) as q:
            for key in keys:
                await q.offer(key, {"k": key})
            return await run_until_async(AsyncWorker(q, coroutine_handler if mode == "async" else handler,
                                                     **settings), done)

    return seen, asyncio.run(main())


MODES = ["sync", "async", "async-thread"]


def handled(seen: Recorder) -> list[tuple[Any, ...]]:
    return [e for e in seen.events if e[1] != "offer"]


@pytest.mark.parametrize("mode", MODES)
def test_two_middlewares_wrap_each_handler_call_in_list_order(dsn: str, mode: str) -> None:
    seen, stats = run(dsn, mode, (None, None), {"b"}, ["a", "b"], lambda s: s["acknowledged"] + s["failed"] >= 2)
    assert stats["acknowledged"] == 1 and stats["failed"] == 1
    # The offers went through both, outer first, and each added its header.
    assert [e for e in seen.events if e[1] == "offer"] == [("outer", "offer", ["a"], False),
                                                           ("inner", "offer", ["a"], False),
                                                           ("outer", "offer", ["b"], False),
                                                           ("inner", "offer", ["b"], False)]
    for key in ("a", "b"):
        calls = [e for e in handled(seen) if e[2] == key]
        assert [(e[0], e[1]) for e in calls] == [("outer", "before"), ("inner", "before"),
                                                 ("inner", "after"), ("outer", "after")]
        outcome = "raised" if key == "b" else "returned"
        for after in (calls[2], calls[3]):
            assert after[3] == outcome
            assert isinstance(after[4], timedelta) and after[4] >= timedelta(milliseconds=10)
    assert stored(dsn, "a") is None  # acknowledged
    row = stored(dsn, "b")
    assert row is not None and row[0] == 1 and row[1] == "ValueError: handler failed on b"  # nacked, kept
    assert row[2] == {"outer": "yes", "inner": "yes"}  # the headers the offer middlewares added


@pytest.mark.parametrize("mode", MODES)
def test_a_middleware_failing_before_the_handler_nacks_the_message(
        dsn: str, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    seen, stats = run(dsn, mode, (None, "before"), set(), ["a"], lambda s: s["failed"] >= 1)
    assert stats["failed"] == 1 and stats["acknowledged"] == 0
    assert [(e[0], e[1]) for e in handled(seen)] == [("outer", "before"), ("inner", "before"), ("outer", "after")]
    row = stored(dsn, "a")
    assert row is not None and row[1] == "RuntimeError: inner broke before"  # not lost: nacked, delivered again
    assert any("middleware raised before the handler of key 'a' ran" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", MODES)
def test_a_middleware_failing_after_the_handler_keeps_its_outcome(
        dsn: str, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    seen, stats = run(dsn, mode, ("after", None), {"b"}, ["a", "b"],
                      lambda s: s["acknowledged"] + s["failed"] >= 2)
    assert stats["acknowledged"] == 1 and stats["failed"] == 1
    assert stored(dsn, "a") is None  # the handler returned: acknowledged despite the middleware
    row = stored(dsn, "b")
    assert row is not None and row[1] == "ValueError: handler failed on b"  # the handler's error, not the middleware's
    logs = [r.getMessage() for r in caplog.records]
    assert any("middleware raised after the handler of key 'a' returned" in m for m in logs)
    assert any("middleware raised after the handler of key 'b' raised" in m for m in logs)


def test_offer_many_goes_through_the_middleware_as_one_batch(dsn: str) -> None:
    seen = Recorder()
    with DelayedQueue(dsn, "emails", middleware=[Sync("tag", seen)]) as q:
        outcomes = q.offer_many([("x", 1), OfferRequest("y", 2, headers={"a": 1})])
        assert set(outcomes) == {"x", "y"}
        assert seen.events == [("tag", "offer", ["x", "y"], True)]
        assert q.get("x").headers == {"tag": "yes"}  # type: ignore[union-attr]
        assert q.get("y").headers == {"a": 1, "tag": "yes"}  # type: ignore[union-attr]


def test_async_offer_many_through_middleware(dsn: str) -> None:
    seen = Recorder()

    async def main() -> None:
        async with AsyncDelayedQueue(dsn, "emails", middleware=[Async("tag", seen)]) as q:
            await q.offer_many([("x", 1), ("y", 2)])
            stored_x = await q.get("x")
            assert stored_x is not None and stored_x.headers == {"tag": "yes"}

    asyncio.run(main())
    assert seen.events == [("tag", "offer", ["x", "y"], True)]


def test_middleware_of_the_wrong_kind_is_refused(dsn: str) -> None:
    seen = Recorder()
    with pytest.raises(InvalidArgument, match=r"middleware\[0\] must be a Middleware, got Async"):
        DelayedQueue(dsn, "jobs", middleware=[Async("a", seen)])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match=r"middleware\[0\] must be a AsyncMiddleware, got Sync"):
        AsyncDelayedQueue(dsn, "jobs", middleware=[Sync("s", seen)])  # type: ignore[list-item]
    with DelayedQueue(dsn, "jobs") as q, pytest.raises(InvalidArgument, match="middleware must be a list"):
        Worker(q, print, middleware="not a list")  # type: ignore[arg-type]


def test_a_worker_takes_its_queues_middleware_unless_given_its_own(dsn: str) -> None:
    seen = Recorder()
    layer = Sync("q", seen)
    with DelayedQueue(dsn, "jobs", middleware=[layer]) as q:
        assert Worker(q, print).middleware == (layer,)
        assert Worker(q, print, middleware=[]).middleware == ()
