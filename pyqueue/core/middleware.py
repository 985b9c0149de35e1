"""Middleware: the one extension point around each handler call of a worker and each offer of a
queue, for traces, metrics, framework hooks and error reporters, without editing the worker.

A middleware is an object with two methods, each given the call and ``call_next``, the rest of
the chain (the next middleware, and at the end the handler call or the statement that offers):

* ``handle(call, call_next)`` around each handler call of :class:`pyqueue.Worker` (sync
  :class:`Middleware`) or :class:`pyqueue.aio.AsyncWorker` (:class:`AsyncMiddleware`, coroutines).
  ``call`` is a :class:`HandlerCall`: the delivery (``call.message``: key, payload, headers,
  delivery_count …) and, once ``call_next`` returned or raised, the handler's own outcome
  (``"returned"`` or ``"raised"``), its exception and its duration (``call.duration``, a
  :class:`~datetime.timedelta`; ``call.seconds``, the same as a float).
* ``offer(call, call_next)`` around each ``offer`` and ``offer_many`` of
  :class:`pyqueue.DelayedQueue` (or :class:`pyqueue.aio.AsyncDelayedQueue`), before anything is
  sent: ``call`` is an :class:`OfferCall` whose ``requests`` a middleware may replace (for
  example with :func:`dataclasses.replace` to add headers such as a trace context).
  ``call_next(call)`` returns what the offer returns (an ``OfferOutcome``, or the ``{key:
  OfferOutcome}`` of a batch).

Subclass :class:`Middleware` or :class:`AsyncMiddleware` and override either method (the other
passes through). Middlewares compose in list order: the first is the outermost, so it sees the
call first and the outcome last (as Starlette's and Django's middleware do). A queue's
``middleware`` wrap its offers; a worker's (by default its queue's) wrap its handler calls.

What a middleware may do to a handler call, and what the worker then does:

* return normally: the delivery succeeded and is acknowledged, whatever the handler did (a
  middleware that catches the handler's exception, or never calls ``call_next``, decides so);
* raise the handler's exception (or let it through): the delivery failed, as without middleware
  (nacked with the backoff, dead-lettered at the queue's ``max_deliveries``);
* raise an exception of its own: that is a fault of the middleware, logged on the worker's
  logger with its traceback, and it never loses the delivery: after the handler returned, the
  delivery is acknowledged as if the middleware had returned; after the handler raised, it fails
  with the handler's exception; before the handler ran, it fails with the middleware's exception
  (nacked, so it is delivered again).

An offer middleware that raises fails the offer with its exception (nothing is sent), as a bad
argument would.

Two more methods are notifications rather than wrappers, plain methods in both base classes (not
coroutines), called in the worker's thread or event loop; they must not block, and what they raise
is logged and ignored:

* ``ended(call)``: the handler of ``call`` just returned or raised (``call.outcome``,
  ``call.seconds`` are set), before any middleware around it sees the outcome. It costs a worker
  less than a ``handle`` wrapper (no frame around the handler): metrics time handlers with it.
* ``nacked(call, result)``: after the worker dealt with a handler call that failed, where the
  message went (``result``: a :class:`pyqueue.NackResult` whose outcome is ``RETRIED``,
  ``DEAD_LETTERED`` or ``STALE``; None when nothing was sent because the lock was lost first or the
  nack failed). Tracing records retries and dead-lettering on the handler's span with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

from ..errors import InvalidArgument
from ..model import NackResult, OfferRequest

__all__ = ["AsyncMiddleware", "HandlerCall", "Middleware", "OfferCall", "chain", "check_middleware", "notified",
           "wraps"]

M = TypeVar("M")


@dataclass(eq=False, slots=True, weakref_slot=True)
class HandlerCall(Generic[M]):
    """One handler call as a middleware sees it.

    :ivar message: the delivery (a :class:`pyqueue.Message` or :class:`pyqueue.aio.AsyncMessage`).
    :ivar queue: the queue's name.
    :ivar outcome: None until the handler ended, then ``"returned"`` or ``"raised"``.
    :ivar error: what the handler raised, or None.
    :ivar seconds: how long the handler ran, in seconds (a float), None until it ended.
    """

    message: M
    queue: str
    outcome: Literal["returned", "raised"] | None = None
    error: BaseException | None = None
    seconds: float | None = None
    _started: float = field(default=0.0, repr=False)

    @property
    def duration(self) -> timedelta | None:
        """How long the handler ran (a timedelta), None until it ended."""
        seconds = self.seconds
        return None if seconds is None else timedelta(seconds=seconds)

    def started(self) -> None:
        """The handler starts now (called by the worker just before the handler)."""
        self._started = time.perf_counter()

    def ended(self, error: BaseException | None) -> None:
        """The handler returned (``error`` None) or raised ``error`` (called by the worker)."""
        self.seconds = time.perf_counter() - self._started
        self.outcome, self.error = ("returned", None) if error is None else ("raised", error)


@dataclass(eq=False)
class OfferCall:
    """One ``offer`` or ``offer_many`` as a middleware sees it, before anything is sent.

    :ivar queue: the queue's name.
    :ivar requests: the messages to offer, as :class:`pyqueue.OfferRequest` (one for ``offer``);
        replace them (the list or its items) to change what is sent.
    :ivar can_update: the ``can_update`` argument of the call.
    :ivar batch: True for ``offer_many`` (the result is ``{key: OfferOutcome}``), False for
        ``offer`` (an ``OfferOutcome``).
    """

    queue: str
    requests: list[OfferRequest]
    can_update: bool
    batch: bool


class Middleware:
    """Base class of a sync middleware (for :class:`pyqueue.DelayedQueue` and :class:`pyqueue.Worker`):
    override :meth:`handle`, :meth:`offer` or both."""

    def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        """Around one handler call: call ``call_next(call)`` (the handler, or the next middleware)
        and return its result, or raise."""
        return call_next(call)

    def offer(self, call: OfferCall, call_next: Callable[[OfferCall], Any]) -> Any:
        """Around one offer or batch, before it is sent: return ``call_next(call)``."""
        return call_next(call)

    def ended(self, call: HandlerCall[Any]) -> None:
        """The handler of ``call`` just returned or raised (``call.outcome``, ``call.seconds``). A
        notification: must not block; what it raises is logged and ignored."""

    def nacked(self, call: HandlerCall[Any], result: NackResult | None) -> None:
        """After the worker dealt with ``call``, whose handler (or middleware) raised: ``result`` is
        where the nack sent the message, or None when nothing was sent (its lock was lost first,
        or the nack failed). A notification: must not block; what it raises is logged and ignored."""


class AsyncMiddleware:
    """Base class of an asyncio middleware (for :class:`pyqueue.aio.AsyncDelayedQueue` and
    :class:`pyqueue.aio.AsyncWorker`): the coroutine twins of :class:`Middleware`'s methods."""

    async def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        """Around one handler call: ``return await call_next(call)``."""
        return await call_next(call)

    async def offer(self, call: OfferCall, call_next: Callable[[OfferCall], Any]) -> Any:
        """Around one offer or batch: ``return await call_next(call)``."""
        return await call_next(call)

    def ended(self, call: HandlerCall[Any]) -> None:
        """As :meth:`Middleware.ended` (a plain method here too, called in the event loop)."""

    def nacked(self, call: HandlerCall[Any], result: NackResult | None) -> None:
        """As :meth:`Middleware.nacked` (a plain method here too, called in the event loop)."""


def check_middleware(layers: Iterable[Any] | None, kind: type) -> tuple[Any, ...]:
    """``layers`` as a tuple, each an instance of ``kind`` (:class:`Middleware` for the sync
    classes, :class:`AsyncMiddleware` for the asyncio ones); :class:`pyqueue.InvalidArgument`
    otherwise, before any I/O."""
    if layers is None:
        return ()
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise InvalidArgument(f"middleware must be a list of {kind.__name__} objects")
    found = tuple(layers)
    for i, layer in enumerate(found):
        if not isinstance(layer, kind):
            raise InvalidArgument(f"middleware[{i}] must be a {kind.__name__}, got {type(layer).__name__}")
    return found


def chain(
    layers: Sequence[Any], method: Literal["handle", "offer"], final: Callable[[Any], Any]
) -> Callable[[Any], Any]:
    """``final`` wrapped in the ``method`` of each layer, the first outermost; layers that do not
    override ``method`` are left out (no cost). Works for sync and asyncio middleware alike (an
    async layer's method returns a coroutine, awaited by the layer around it)."""
    call = final
    for layer in reversed(layers):
        if _overrides(layer, method):
            call = _wrapped(getattr(layer, method), call)
    return call


Next = Callable[[Any], Any]


def _wrapped(method: Callable[[Any, Next], Any], call_next: Next) -> Next:
    return lambda call: method(call, call_next)


def notified(layers: Sequence[Any], method: Literal["ended", "nacked"]) -> tuple[Callable[..., None], ...]:
    """The bound ``method`` of each of ``layers`` that defines its own, in list order (empty: the
    worker skips the notification)."""
    return tuple(getattr(layer, method) for layer in layers if _overrides(layer, method))


def wraps(layers: Sequence[Any], method: Literal["handle", "offer"]) -> bool:
    """Whether any of ``layers`` defines its own ``method``: without one, :func:`chain` would add
    nothing, and the caller keeps its direct path."""
    return any(_overrides(layer, method) for layer in layers)


def _overrides(layer: Any, method: Literal["handle", "offer", "ended", "nacked"]) -> bool:
    """Whether ``layer`` defines its own ``method`` (else it passes through and is left out)."""
    own = getattr(type(layer), method)
    return own is not getattr(Middleware, method) and own is not getattr(AsyncMiddleware, method)
