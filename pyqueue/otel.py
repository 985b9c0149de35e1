"""OpenTelemetry traces from offer to handler (extra ``pgdelayq[otel]``; docs/observability.md, "Traces").

:class:`TracingMiddleware` (for :class:`pyqueue.DelayedQueue` and :class:`pyqueue.Worker`) and
:class:`AsyncTracingMiddleware` (for :class:`pyqueue.aio.AsyncDelayedQueue` and
:class:`pyqueue.aio.AsyncWorker`) follow the OpenTelemetry semantic conventions for messaging spans
(https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/):

* each ``offer``, ``offer_many`` and ``offer_many_counts`` runs in a PRODUCER span ``send <queue>``
  (``messaging.operation.type`` ``send``); its W3C trace context (``traceparent`` and ``tracestate``,
  https://www.w3.org/TR/trace-context/) goes into the headers of every message whose headers have no
  ``traceparent`` yet: that is the message's *creation context*. A ``traceparent`` the caller set is
  kept as it is, and the span links to it;
* each handler call runs in a CONSUMER span ``process <queue>`` (``messaging.operation.type``
  ``process``), linked to the message's creation context. Without a current span around the
  handler (a worker's handler threads and tasks have none) the creation context is also its
  parent, so producer and consumer are one trace; inside another span that span stays the parent
  (the conventions' default when processing happens in the scope of another span);
* a handler that raises: the exception is recorded on the span, its status is ERROR, and the span
  stays open until the worker has nacked the message (:meth:`TracingMiddleware.nacked`), which adds
  an event saying where it went: ``retry`` (with the time it is due again), ``dead_letter`` (with the
  dead-letter queue), ``lock_lost`` (the nack found its lock gone) or ``not_nacked`` (nothing was
  sent: its lock was lost first, or the nack failed). A span whose ``nacked`` never comes (an outer
  middleware swallowed the failure) ends when its call is garbage-collected, at the handler's end.

Importing this module needs ``opentelemetry-api`` (``pip install 'pgdelayq[otel]'``); the rest of
the package never imports it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import lru_cache, partial
from types import MappingProxyType, TracebackType
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.util.types import AttributeValue
except ImportError as exc:  # the extra is not installed
    raise ImportError("pyqueue.otel needs OpenTelemetry: install pgdelayq[otel] "
                      "(pip install 'pgdelayq[otel]')") from exc

from . import __version__
from .core.delivery import error_text
from .core.middleware import AsyncMiddleware, HandlerCall, Middleware, OfferCall
from .model import NackOutcome, NackResult, OfferRequest

__all__ = ["AsyncTracingMiddleware", "TracingMiddleware"]

#: ``messaging.system`` of every span.
SYSTEM = "pgdelayq"
#: The headers of the W3C trace context in a message's headers.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: The attribute of a process span that counts the deliveries of its message (this one included):
#: the conventions define none for every system, so it is in the system's own namespace, as
#: ``messaging.servicebus.message.delivery_count`` is.
DELIVERY_COUNT = "messaging.pgdelayq.message.delivery_count"
#: The events the worker's nack adds to a failed handler call's span, and their attributes.
RETRY_EVENT, DEAD_LETTER_EVENT, LOCK_LOST_EVENT, NOT_NACKED_EVENT = "retry", "dead_letter", "lock_lost", "not_nacked"
DUE = "messaging.pgdelayq.message.due"
DEAD_LETTER_QUEUE = "messaging.pgdelayq.dead_letter_queue"

_W3C = TraceContextTextMapPropagator()


class _HeaderGetter(Getter[Mapping[str, Any]]):
    """Reads a message's headers (a JSON object): only string values count (a header of another
    JSON type, set by hand, is no trace context)."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return list(carrier)


_GETTER = _HeaderGetter()


#: Trace contexts read lately, by (traceparent, tracestate): the messages of one ``offer_many``
#: carry the same one, read once. Bounded (emptied when full); a dict's reads and writes are atomic.
_CONTEXTS: dict[tuple[Any, Any], SpanContext | None] = {}
_CONTEXTS_MOST = 4096


def creation_context(headers: Mapping[str, Any] | None) -> SpanContext | None:
    """The trace context a message's ``headers`` carry (``traceparent``, ``tracestate``), or None
    when they carry none or an invalid one."""
    if not isinstance(headers, Mapping) or TRACEPARENT not in headers:
        return None
    cache_key = (headers[TRACEPARENT], headers.get(TRACESTATE))
    try:
        return _CONTEXTS[cache_key]
    except (KeyError, TypeError):  # not read yet, or a header value that is no str (unhashable)
        pass
    found: SpanContext | None = trace.get_current_span(
        _W3C.extract(headers, otel_context.Context(), _GETTER)).get_span_context()
    if found is not None and not found.is_valid:
        found = None
    if isinstance(cache_key[0], str) and isinstance(cache_key[1], (str, type(None))):
        if len(_CONTEXTS) >= _CONTEXTS_MOST:
            _CONTEXTS.clear()
        _CONTEXTS[cache_key] = found
    return found


def _error_type(exc: BaseException) -> str:
    """``error.type``: the exception's class, qualified by its module unless it is a builtin."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _record_error(span: Span, exc: BaseException, *, failed: bool) -> None:
    """``exc`` on ``span`` (an ``exception`` event); when it ``failed`` the operation, also
    ``error.type`` and the ERROR status with the error's text (as the worker logs it)."""
    span.record_exception(exc, escaped=True)
    if failed:
        span.set_attribute("error.type", _error_type(exc))
        span.set_status(Status(StatusCode.ERROR, error_text(exc)))


class _Current:
    """A context manager: ``span`` is the current span while the call runs; on the way out,
    ``ended(span, error)`` (``error`` None when the call returned) decides what becomes of it."""

    __slots__ = ("_ended", "_span", "_token")

    def __init__(self, span: Span, ended: Callable[[Span, BaseException | None], None]) -> None:
        self._span = span
        self._ended = ended

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        otel_context.detach(self._token)
        self._ended(self._span, exc)


class _Tracing:
    """What the sync and asyncio tracing middleware share: the spans, the headers, the nack events."""

    def __init__(self, *, tracer_provider: trace.TracerProvider | None = None,
                 creation_context_as_parent: bool = True) -> None:
        """
        :param tracer_provider: where the spans go; None (the default): the global one
            (:func:`opentelemetry.trace.set_tracer_provider`), looked up when the first span starts.
        :param creation_context_as_parent: True (the default): a handler call's span, when no other
            span is current, is a child of its message's creation context (one trace from offer to
            handler); False: it only links to it (a trace of its own per handler call).
        """
        self._tracer = trace.get_tracer(__name__, __version__, tracer_provider)
        self._creation_parent = creation_context_as_parent
        #: Failed handler calls whose span waits for the worker's nack: call -> (finalizer, span).
        self._held: weakref.WeakKeyDictionary[HandlerCall[Any], tuple[weakref.finalize[Any, Any], Span]] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()

    # -- offers --------------------------------------------------------------------------------
    def _sending(self, call: OfferCall) -> _Current:
        """The producer span of ``call``, its trace context written into the requests' headers."""
        requests = call.requests
        attributes: dict[str, AttributeValue] = _attributes(call.queue, "send")
        if call.batch:
            attributes["messaging.batch.message_count"] = len(requests)
        elif requests:
            attributes["messaging.message.id"] = requests[0].key
        # A creation context the caller set is kept, and the send span links to it.
        own = [found for r in requests if (found := creation_context(r.headers)) is not None]
        span = self._tracer.start_span(f"send {call.queue}", kind=SpanKind.PRODUCER, attributes=attributes,
                                       links=[Link(found) for found in own])
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, trace.set_span_in_context(span))
        if carrier and len(own) < len(requests):
            call.requests = [_with_context(r, carrier) for r in requests]
        return _Current(span, _offer_ended)

    # -- handler calls -------------------------------------------------------------------------
    def _processing(self, call: HandlerCall[Any]) -> _Current:
        """The consumer span of ``call``, linked to its message's creation context (and its child,
        see ``creation_context_as_parent``)."""
        message = call.message
        found = creation_context(message.headers)
        parent = None
        if found is not None and self._creation_parent and not trace.get_current_span().get_span_context().is_valid:
            parent = trace.set_span_in_context(NonRecordingSpan(found))
        attributes = {**_attributes(call.queue, "process"), "messaging.message.id": message.key,
                      DELIVERY_COUNT: message.delivery_count}
        span = self._tracer.start_span(f"process {call.queue}", parent, SpanKind.CONSUMER, attributes,
                                       None if found is None else [Link(found)])
        return _Current(span, partial(self._handler_ended, call))

    def _handler_ended(self, call: HandlerCall[Any], span: Span, exc: BaseException | None) -> None:
        if exc is None:
            span.end()
            return
        # After the handler returned, a middleware inside this one raised: the worker acknowledges.
        returned = call.outcome == "returned"
        _record_error(span, exc, failed=not returned)
        if returned:
            span.end()
            return
        # The worker nacks the message, then calls nacked(): the span ends there. If that never
        # comes, it ends when the call is garbage-collected, at the time the handler ended.
        finalizer = weakref.finalize(call, span.end, time.time_ns())
        finalizer.atexit = False
        with self._lock:
            self._held[call] = (finalizer, span)

    def nacked(self, call: HandlerCall[Any], result: NackResult | None) -> None:
        """The worker nacked the message of ``call`` (failed): where it went, as an event on the
        call's span, which ends now."""
        with self._lock:
            held = self._held.pop(call, None)
        if held is None or held[0].detach() is None:  # not a call of this middleware, or ended already
            return
        span = held[1]
        if result is None:
            span.add_event(NOT_NACKED_EVENT)
        elif result.outcome is NackOutcome.RETRIED:
            span.add_event(RETRY_EVENT, {DUE: result.due.isoformat()} if result.due is not None else None)
        elif result.outcome is NackOutcome.DEAD_LETTERED:
            span.add_event(DEAD_LETTER_EVENT, {DEAD_LETTER_QUEUE: result.dead_letter_queue or ""})
        else:
            span.add_event(LOCK_LOST_EVENT)
        span.end()


@lru_cache(maxsize=1024)
def _span_attributes(queue: str, operation: str) -> Mapping[str, AttributeValue]:
    return MappingProxyType({"messaging.system": SYSTEM, "messaging.destination.name": queue,
                             "messaging.operation.type": operation, "messaging.operation.name": operation})


def _attributes(queue: str, operation: str) -> dict[str, AttributeValue]:
    """The attributes every span of ``operation`` (``send``, ``process``) on ``queue`` has (a new
    dict, from one built once per queue and operation)."""
    return dict(_span_attributes(queue, operation))


def _with_context(request: OfferRequest, carrier: dict[str, str]) -> OfferRequest:
    """``request`` with the trace context of ``carrier`` in its headers, unless they hold a
    ``traceparent`` (the caller's own) or are no mapping (the offer's checks refuse them)."""
    headers = request.headers
    if headers is None:
        return replace(request, headers=dict(carrier))
    if not isinstance(headers, Mapping) or TRACEPARENT in headers:
        return request
    return replace(request, headers={**headers, **carrier})


def _offer_ended(span: Span, exc: BaseException | None) -> None:
    if exc is not None:
        _record_error(span, exc, failed=True)
    span.end()


class TracingMiddleware(_Tracing, Middleware):
    """Traces of a :class:`pyqueue.DelayedQueue`'s offers and a :class:`pyqueue.Worker`'s handler
    calls (the module's docstring says what each span holds). Give it to the queue
    (``DelayedQueue(dsn, "emails", middleware=[TracingMiddleware()])``): its workers take it too.

    :param tracer_provider: the :class:`opentelemetry.trace.TracerProvider` the spans go to; None
        (the default): the global one.
    :param creation_context_as_parent: True (the default): a handler call's span is a child of its
        message's creation context when no other span is current (producer and consumer in one
        trace, as the conventions allow for single messages); False: it only links to it.
    """

    def offer(self, call: OfferCall, call_next: Callable[[OfferCall], Any]) -> Any:
        """The offer in a producer span whose context goes into the messages' headers."""
        with self._sending(call):
            return call_next(call)

    def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        """The handler call in a consumer span linked to the message's creation context."""
        with self._processing(call):
            return call_next(call)


class AsyncTracingMiddleware(_Tracing, AsyncMiddleware):
    """The asyncio twin of :class:`TracingMiddleware`, for :class:`pyqueue.aio.AsyncDelayedQueue`
    and :class:`pyqueue.aio.AsyncWorker`; the same parameters."""

    async def offer(self, call: OfferCall, call_next: Callable[[OfferCall], Any]) -> Any:
        """As :meth:`TracingMiddleware.offer`."""
        with self._sending(call):
            return await call_next(call)

    async def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        """As :meth:`TracingMiddleware.handle`."""
        with self._processing(call):
            return await call_next(call)
