"""OpenTelemetry traces (pyqueue.otel) against the real server: the SDK's in-memory exporter shows
each offer's producer span and each handler call's consumer span in one trace, for the sync worker,
the asyncio worker with a coroutine and with a plain function; failures, retries, dead-lettering and
lost locks recorded on the consumer span; a caller's or an SQL producer's ``traceparent`` continued;
and without the extra nothing of OpenTelemetry is imported."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from workerhandlers import run_until, run_until_async

from pyqueue import Backoff, DelayedQueue, HandlerCall, Middleware, NackOutcome, NackResult, OfferRequest, Worker
from pyqueue.aio import AsyncDelayedQueue, AsyncWorker
from pyqueue.otel import AsyncTracingMiddleware, TracingMiddleware

MODES = ["sync", "async", "async-thread"]
#: Retries 30 s after a failure: a failed message is not delivered again while the test runs.
BACKOFF = Backoff(base=timedelta(seconds=30), factor=1.0, cap=timedelta(seconds=30), jitter=0.0)
#: The example of the W3C Trace Context recommendation (section "traceparent Header").
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Traces:
    """A TracerProvider of its own (the global one is left alone) whose finished spans are kept."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self, kind: SpanKind) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.kind is kind]

    def one(self, kind: SpanKind, key: str) -> ReadableSpan:
        found = [s for s in self.spans(kind) if (s.attributes or {}).get("messaging.message.id") == key]
        assert len(found) == 1, f"{len(found)} {kind.name} spans of {key!r}"
        return found[0]


@pytest.fixture
def traces() -> Iterator[Traces]:
    t = Traces()
    yield t
    t.provider.shutdown()


def produce(dsn: str, mode: str, traces: Traces, requests: Sequence[OfferRequest], *, batch: bool,
            queue: str = "jobs") -> None:
    """Offer ``requests`` to ``queue`` through the tracing middleware of the client of ``mode``."""
    if mode == "sync":
        with DelayedQueue(dsn, queue, middleware=[TracingMiddleware(tracer_provider=traces.provider)]) as q:
            if batch:
                q.offer_many(requests)
            else:
                for r in requests:
                    q.offer(r.key, r.payload, headers=r.headers)
        return

    async def main() -> None:
        async with AsyncDelayedQueue(dsn, queue,
                                     middleware=[AsyncTracingMiddleware(tracer_provider=traces.provider)]) as q:
            if batch:
                await q.offer_many(requests)
            else:
                for r in requests:
                    await q.offer(r.key, r.payload, headers=r.headers)

    asyncio.run(main())


def consume(dsn: str, mode: str, traces: Traces, done: Callable[[dict[str, Any]], bool], *,
            fail: set[str] = frozenset(), ack_then_fail: set[str] = frozenset(), lose_lock: set[str] = frozenset(),
            outer: Sequence[Any] = (), queue: str = "jobs", lock_timeout: float = 30) -> dict[str, Any]:
    """Run a worker of ``mode`` on ``queue`` (the tracing middleware innermost, ``outer`` around it)
    until ``done(its counters)``, then stop it. Its handler raises for the keys of ``fail``; for
    those of ``ack_then_fail`` it acknowledges the message itself first (its own ack); for those of
    ``lose_lock`` it acknowledges the delivery's lock token through the queue (not the message, so
    the worker does not know), waits until the heartbeat found the lock gone, then raises.
    Returns the counters."""
    settings: dict[str, Any] = {"concurrency": 1, "prefetch": 0, "idle_check": 0.2, "backoff": BACKOFF,
                                "shutdown_grace": 5, "lock_timeout": lock_timeout}
    failing = fail | ack_then_fail | lose_lock
    running: dict[str, Any] = {}  # the queue and the worker, for the handler

    def handler(m: Any) -> None:
        if m.key in ack_then_fail:
            m.ack()
        if m.key in lose_lock:
            running["queue"].ack(m.lock_token)
            while not running["worker"].stats.snapshot()["lock_lost"]:
                time.sleep(0.02)
        if m.key in failing:
            raise ValueError(f"handler failed on {m.key}")

    async def coroutine_handler(m: Any) -> None:
        if m.key in ack_then_fail:
            await m.ack()
        if m.key in lose_lock:
            await running["queue"].ack(m.lock_token)
            while not running["worker"].stats.snapshot()["lock_lost"]:
                await asyncio.sleep(0.02)
        if m.key in failing:
            raise ValueError(f"handler failed on {m.key}")

    if mode == "sync":
        with DelayedQueue(dsn, queue) as q:
            running["queue"] = q
            layers = [*outer, TracingMiddleware(tracer_provider=traces.provider)]
            running["worker"] = worker = Worker(q, handler, middleware=layers, **settings)
            return run_until(worker, done)

    async def main() -> dict[str, Any]:
        async with AsyncDelayedQueue(dsn, queue) as q:
            running["queue"] = q
            layers = [*outer, AsyncTracingMiddleware(tracer_provider=traces.provider)]
            running["worker"] = worker = AsyncWorker(q, coroutine_handler if mode == "async" else handler,
                                                     middleware=layers, **settings)
            return await run_until_async(worker, done)

    return asyncio.run(main())


def settled(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s["acknowledged"] + s["failed"] >= n


def stored_headers(dsn: str, key: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT headers FROM dq_messages WHERE key = %s", (key,)).fetchone()
    return None if row is None else row[0]


def assert_continues(process: ReadableSpan, trace_id: int, span_id: int) -> None:
    """``process`` is a child of, and links to, the creation context (trace_id, span_id)."""
    assert process.context is not None and process.context.trace_id == trace_id
    assert process.parent is not None and process.parent.span_id == span_id and process.parent.is_remote
    assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [(trace_id, span_id)]


@pytest.mark.parametrize("batch", [False, True], ids=["offer", "offer_many"])
@pytest.mark.parametrize("mode", MODES)
def test_producer_and_consumer_spans_are_one_trace(dsn: str, traces: Traces, mode: str, batch: bool) -> None:
    produce(dsn, mode, traces, [OfferRequest("a", {"n": 1}), OfferRequest("b", {"n": 2}, headers={"x": 1})],
            batch=batch)
    assert stored_headers(dsn, "b")["x"] == 1  # the caller's headers kept beside the trace context
    stats = consume(dsn, mode, traces, settled(2))
    assert stats["acknowledged"] == 2

    sends = traces.spans(SpanKind.PRODUCER)
    assert [s.name for s in sends] == ["send jobs"] * (1 if batch else 2)
    for send, key in zip(sends, ["a", "b"], strict=False):
        attributes = dict(send.attributes or {})
        if batch:
            assert attributes.pop("messaging.batch.message_count") == 2
        else:
            assert attributes.pop("messaging.message.id") == key
        assert attributes == {"messaging.system": "pgdelayq", "messaging.destination.name": "jobs",
                              "messaging.operation.type": "send", "messaging.operation.name": "send"}
        assert send.status.status_code is StatusCode.UNSET and send.parent is None
    for key in ("a", "b"):
        send = sends[0] if batch else traces.one(SpanKind.PRODUCER, key)
        assert send.context is not None
        process = traces.one(SpanKind.CONSUMER, key)
        assert process.name == "process jobs"
        assert process.attributes == {
            "messaging.system": "pgdelayq", "messaging.destination.name": "jobs",
            "messaging.operation.type": "process", "messaging.operation.name": "process",
            "messaging.message.id": key, "messaging.pgdelayq.message.delivery_count": 1}
        assert process.status.status_code is StatusCode.UNSET and not process.events
        assert_continues(process, send.context.trace_id, send.context.span_id)
        # What the message carried: the producer span's context, as W3C traceparent.
        assert stored_headers(dsn, key) is None  # acknowledged
    assert len(traces.spans(SpanKind.CONSUMER)) == 2


@pytest.mark.parametrize("mode", MODES)
def test_a_retried_and_a_dead_lettered_message_are_recorded_on_their_spans(
        dsn: str, traces: Traces, mode: str) -> None:
    with DelayedQueue(dsn, "dl") as q:
        q.configure(max_deliveries=1, dead_letter_queue="dl_dead")
    produce(dsn, mode, traces, [OfferRequest("r", 1)], batch=False)
    produce(dsn, mode, traces, [OfferRequest("d", 1)], batch=False, queue="dl")
    before = datetime.now().astimezone()
    assert consume(dsn, mode, traces, settled(1), fail={"r"})["retried"] == 1
    assert consume(dsn, mode, traces, settled(1), fail={"d"}, queue="dl")["dead_lettered"] == 1

    retried = traces.one(SpanKind.CONSUMER, "r")
    assert retried.status.status_code is StatusCode.ERROR
    assert retried.status.description == "ValueError: handler failed on r"
    assert (retried.attributes or {})["error.type"] == "ValueError"
    assert [e.name for e in retried.events] == ["exception", "retry"]
    assert (retried.events[0].attributes or {})["exception.message"] == "handler failed on r"
    due = datetime.fromisoformat(str((retried.events[1].attributes or {})["messaging.pgdelayq.message.due"]))
    assert due > before  # the backoff's 30 s from the nack
    assert_continues(retried, traces.one(SpanKind.PRODUCER, "r").context.trace_id,  # type: ignore[union-attr]
                     traces.one(SpanKind.PRODUCER, "r").context.span_id)  # type: ignore[union-attr]

    dead = traces.one(SpanKind.CONSUMER, "d")
    assert dead.name == "process dl" and dead.status.status_code is StatusCode.ERROR
    assert [e.name for e in dead.events] == ["exception", "dead_letter"]
    assert dict(dead.events[1].attributes or {}) == {"messaging.pgdelayq.dead_letter_queue": "dl_dead"}
    assert stored_headers(dsn, "d") is not None  # in dl_dead now, its trace context with it
    # The span ended after the nack: its end follows the event.
    assert dead.end_time is not None and dead.end_time >= dead.events[1].timestamp


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_nack_that_finds_its_lock_gone_is_recorded(dsn: str, traces: Traces, mode: str) -> None:
    """The handler acknowledged its message itself and then raised: the worker's nack finds no lock."""
    produce(dsn, mode, traces, [OfferRequest("k", 1)], batch=False)
    consume(dsn, mode, traces, settled(1), ack_then_fail={"k"})
    span = traces.one(SpanKind.CONSUMER, "k")
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception", "lock_lost"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failed_call_whose_lock_was_lost_first_is_recorded(dsn: str, traces: Traces, mode: str) -> None:
    """The heartbeat found the lock gone while the handler ran: the worker sends no nack."""
    produce(dsn, mode, traces, [OfferRequest("k", 1)], batch=False)
    stats = consume(dsn, mode, traces, settled(1), lose_lock={"k"}, lock_timeout=0.6)
    assert stats["lock_lost"] == 1 and stats["retried"] == 0
    span = traces.one(SpanKind.CONSUMER, "k")
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception", "not_nacked"]


class Swallow(Middleware):
    """Turns a failed handler call into a success: the worker acknowledges and never calls nacked()."""

    def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        try:
            return call_next(call)
        except Exception:
            return None


def test_a_failed_call_whose_nack_never_comes_still_ends_its_span(dsn: str, traces: Traces) -> None:
    produce(dsn, "sync", traces, [OfferRequest("s", 1)], batch=False)
    stats = consume(dsn, "sync", traces, settled(1), fail={"s"}, outer=[Swallow()])
    assert stats["acknowledged"] == 1 and stats["failed"] == 0
    gc.collect()  # the call, its exception and traceback form a cycle: collected here at the latest
    span = traces.one(SpanKind.CONSUMER, "s")
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]  # no nack, so no event of one


def test_nacked_with_nothing_sent_and_for_a_call_it_never_saw() -> None:
    """Without a worker: a failed call whose nack sent nothing (None) gets ``not_nacked``; a call
    the middleware did not trace, or one already ended, is ignored."""
    traces = Traces()
    tracing = TracingMiddleware(tracer_provider=traces.provider)
    message = SimpleNamespace(key="m", headers={"traceparent": TRACEPARENT}, delivery_count=3)
    call: HandlerCall[Any] = HandlerCall(message, "jobs")

    def failing(c: HandlerCall[Any]) -> None:
        c.started()
        c.ended(KeyError("x"))
        raise KeyError("x")

    with pytest.raises(KeyError):
        tracing.handle(call, failing)
    assert traces.spans(SpanKind.CONSUMER) == []  # open until nacked
    tracing.nacked(call, None)
    tracing.nacked(call, NackResult(NackOutcome.STALE))  # ended already: nothing more
    tracing.nacked(HandlerCall(message, "jobs"), None)  # never traced
    [span] = traces.spans(SpanKind.CONSUMER)
    assert [e.name for e in span.events] == ["exception", "not_nacked"]
    assert (span.attributes or {})["messaging.pgdelayq.message.delivery_count"] == 3
    assert (span.attributes or {})["error.type"] == "KeyError"
    assert_continues(span, int(TRACE_ID, 16), int(PARENT_ID, 16))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_caller_set_traceparent_is_kept(dsn: str, traces: Traces, mode: str) -> None:
    own = {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
    produce(dsn, mode, traces, [OfferRequest("own", 1, headers=own), OfferRequest("new", 2)], batch=True)
    assert stored_headers(dsn, "own") == own
    [send] = traces.spans(SpanKind.PRODUCER)
    assert send.context is not None
    # The send span links to the creation context the caller set (the conventions' "custom creation context").
    assert [(link.context.trace_id, link.context.span_id) for link in send.links] == [
        (int(TRACE_ID, 16), int(PARENT_ID, 16))]
    new = stored_headers(dsn, "new")
    ctx = send.context
    assert new["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    consume(dsn, mode, traces, settled(2))
    process = traces.one(SpanKind.CONSUMER, "own")
    assert_continues(process, int(TRACE_ID, 16), int(PARENT_ID, 16))
    assert process.links[0].context.trace_state.get("congo") == "t61rcWkgMzE"
    assert_continues(traces.one(SpanKind.CONSUMER, "new"), send.context.trace_id, send.context.span_id)


@pytest.mark.parametrize("mode", MODES)
def test_an_sql_producers_traceparent_is_continued_by_the_consumer(dsn: str, traces: Traces, mode: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT dq_offer('jobs', 'from-sql', '{}'::jsonb, headers => jsonb_build_object("
                     "'traceparent', %s::text))", (TRACEPARENT,))
        conn.execute("SELECT dq_offer('jobs', 'bad-header', '{}'::jsonb, headers => jsonb_build_object("
                     "'traceparent', 'not a trace context'))")
    consume(dsn, mode, traces, settled(2))
    assert_continues(traces.one(SpanKind.CONSUMER, "from-sql"), int(TRACE_ID, 16), int(PARENT_ID, 16))
    # An unreadable traceparent starts a trace of its own, with no link.
    bad = traces.one(SpanKind.CONSUMER, "bad-header")
    assert bad.parent is None and not bad.links


def test_inside_another_span_the_handler_span_is_its_child_and_links_to_the_producer() -> None:
    """The conventions' default when processing happens in the scope of another span; and with
    creation_context_as_parent=False the handler span only links to the message's context."""
    traces = Traces()
    message = SimpleNamespace(key="m", headers={"traceparent": TRACEPARENT}, delivery_count=1)
    tracer = traces.provider.get_tracer("test")
    with tracer.start_as_current_span("around") as around:
        TracingMiddleware(tracer_provider=traces.provider).handle(HandlerCall(message, "jobs"), lambda c: None)
    TracingMiddleware(tracer_provider=traces.provider, creation_context_as_parent=False).handle(
        HandlerCall(message, "jobs"), lambda c: None)
    inside, alone = traces.spans(SpanKind.CONSUMER)
    assert inside.parent is not None and inside.parent.span_id == around.get_span_context().span_id
    assert alone.parent is None
    for span in (inside, alone):
        assert [link.context.span_id for link in span.links] == [int(PARENT_ID, 16)]


CHECK_NOT_IMPORTED = (
    "import pyqueue, pyqueue.aio, pyqueue.cron, sys; "
    "assert not any(m.startswith('opentelemetry') for m in sys.modules), "
    "sorted(m for m in sys.modules if m.startswith('opentelemetry'))"
)

BLOCKED = """
import importlib.abc, sys

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
import pyqueue
try:
    import pyqueue.otel
except ImportError as exc:
    print(exc)
else:
    raise SystemExit("imported without opentelemetry")
"""


def test_import_pyqueue_imports_no_opentelemetry() -> None:
    subprocess.run([sys.executable, "-c", CHECK_NOT_IMPORTED], check=True, timeout=60)


def test_pyqueue_otel_without_opentelemetry_says_which_extra_to_install() -> None:
    out = subprocess.run([sys.executable, "-c", BLOCKED], check=True, capture_output=True, text=True, timeout=60)
    assert "install pgdelayq[otel]" in out.stdout
