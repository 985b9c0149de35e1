"""The one vocabulary of steps, for the client routines and the worker core alike.

The sans-I/O code is written as generators: a routine (:mod:`pyqueue.core.routines`) or a step
function of the worker core (:mod:`pyqueue.core.delivery`) yields a *step*, an instance of one of
the dataclasses below saying what to do; its driver performs it and sends back the result (or
throws in what the I/O raised), until the generator returns. :class:`Stepper` does the
bookkeeping of that exchange for every driver. Each step class says what its driver does and what
it sends back; a driver matches on the class (``match step: case PollMessages(...)``), so the
type checker sees every case and "go to definition" leads from a yield to its performer.

Client steps act on the routine's connection (the one the driver was given, or the listening
connection taken by :class:`Acquire`); worker steps act on the worker (its queue, handler slots
and clock). Drivers: :class:`pyqueue.drivers.sync.Driver`, :class:`pyqueue.drivers.aio.AsyncDriver`,
:class:`pyqueue.Worker`, :class:`pyqueue.aio.AsyncWorker`.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar
from uuid import UUID

from .statements import Statement

__all__ = [
    "Run", "RunPooled", "Notified", "Sleep", "ClientPid", "NoPrepare", "Acquire", "Release", "Handoff", "ClientStep",
    "Routine", "CountHeld", "WaitForHandlers", "PollMessages", "StartHandlers", "SleepUnlessStopped", "AckMany",
    "ReleaseMany", "Drain", "HandlersFinished", "Nack", "ExtendLock", "HeartbeatWait", "Spawn", "JoinSpawned",
    "WorkerStep", "WorkerSteps", "Step", "Stepper",
]

T = TypeVar("T")
C = TypeVar("C")  # a connection (sync or async)


# -- client steps -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Run:
    """Run ``statement`` on the routine's connection; the result is its decoded result."""

    statement: Statement[Any]


@dataclass(frozen=True, slots=True)
class RunPooled:
    """Run ``statement`` on another connection of the queue's pool (not the routine's)."""

    statement: Statement[Any]


@dataclass(frozen=True, slots=True)
class Notified:
    """Wait up to ``timeout`` seconds for a notification on the routine's connection; the result
    is True when one arrived."""

    timeout: float


@dataclass(frozen=True, slots=True)
class Sleep:
    """Sleep ``seconds`` (no notification can end it)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class ClientPid:
    """The result is the backend pid libpq was given at connect (``conn.info.backend_pid``)."""


@dataclass(frozen=True, slots=True)
class NoPrepare:
    """Turn off psycopg's prepared statements on the routine's connection."""


@dataclass(frozen=True, slots=True)
class Acquire:
    """Make a connection that LISTENs on the queue's channel the routine's connection: an idle one
    kept from an earlier wait, or a new one the driver sets up with :func:`start_listening`."""


@dataclass(frozen=True, slots=True)
class Release:
    """Give the routine's connection back: kept for the next wait when ``keep`` (and it is idle),
    else closed."""

    keep: bool


@dataclass(frozen=True, slots=True)
class Handoff:
    """Hand ``value`` to the driver's caller; the routine resumes (result None) once the caller's
    block ends without an exception, and is abandoned otherwise."""

    value: Any


ClientStep = Run | RunPooled | Notified | Sleep | ClientPid | NoPrepare | Acquire | Release | Handoff
#: A client routine: yields client steps, receives their results, returns ``T``.
Routine = Generator[ClientStep, Any, T]


# -- worker steps -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CountHeld:
    """The result is how many deliveries the worker holds whose handlers have not ended (running,
    or waiting for a handler slot); a handler ending from now on ends the next
    :class:`WaitForHandlers` at once."""


@dataclass(frozen=True, slots=True)
class WaitForHandlers:
    """Wait until a handler ends, or ``seconds`` pass; the result is None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class PollMessages:
    """Poll up to ``max_count`` messages (``queue.poll``); the result is the list of messages.
    ``idle``: nothing is held, so wait for messages up to the worker's ``idle_check`` (on LISTEN),
    and return none at once when the worker is stopped meanwhile."""

    max_count: int
    idle: bool


@dataclass(frozen=True, slots=True)
class StartHandlers:
    """Run the handler of each delivery (recorded RUNNING), in a free handler slot or when one
    frees up; the result is None. Each handler's end is reported to the core:
    :meth:`~pyqueue.core.delivery.WorkerCore.handler_returned`, or the steps of
    :meth:`~pyqueue.core.delivery.WorkerCore.failed_steps`."""

    deliveries: Sequence[Any]  # Delivery records


@dataclass(frozen=True, slots=True)
class SleepUnlessStopped:
    """Sleep ``seconds``, ended early by a stop of the worker; the result is None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class AckMany:
    """Acknowledge these lock tokens in one statement (``queue.ack_many``); the result is how many
    were acknowledged (the others had lost their locks)."""

    lock_tokens: list[UUID]


@dataclass(frozen=True, slots=True)
class ReleaseMany:
    """Give back these lock tokens, whose handlers never started, in one statement
    (``queue.release_many``, ``dq_release``); the result is how many were released."""

    lock_tokens: list[UUID]


@dataclass(frozen=True, slots=True)
class Drain:
    """Wait up to ``seconds`` for the held deliveries' handlers to end (the grace period; the
    asyncio worker then cancels those still running); the result is how many are still held."""

    seconds: float


@dataclass(frozen=True, slots=True)
class HandlersFinished:
    """No handler runs any more: end the heartbeat. The result is None."""


@dataclass(frozen=True, slots=True)
class Nack:
    """Negatively acknowledge ``message`` (``message.nack_outcome(delay, error=error)``); the result
    is the :class:`pyqueue.NackResult`: retried, dead-lettered (and where), or stale."""

    message: Any
    delay: timedelta
    error: str


@dataclass(frozen=True, slots=True)
class ExtendLock:
    """Extend the lock of ``message`` by ``timeout`` from now (``message.extend``); the result is
    the new ``locked_until``, or None when the lock was lost."""

    message: Any
    timeout: timedelta


@dataclass(frozen=True, slots=True)
class HeartbeatWait:
    """Wait one heartbeat period of ``seconds``; the result is True once the heartbeat must end
    (no handler runs any more and none will), else False."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Spawn:
    """Drive ``steps`` beside the run loop (a task, or a thread); the result is None at once."""

    steps: Generator[WorkerStep, Any, Any]


@dataclass(frozen=True, slots=True)
class JoinSpawned:
    """Wait until every spawned step generator has ended; the result is None."""


WorkerStep = (CountHeld | WaitForHandlers | PollMessages | StartHandlers | SleepUnlessStopped | AckMany
              | ReleaseMany | Drain | HandlersFinished | Nack | ExtendLock | HeartbeatWait | Spawn | JoinSpawned)
#: The step functions of the worker core: yield worker steps, receive their results.
WorkerSteps = Generator[WorkerStep, Any, Any]
Step = ClientStep | WorkerStep


class Stepper(Generic[C]):
    """The bookkeeping of stepping one generator of steps, for every driver, which only performs
    the steps. A client driver::

        stepper = Stepper(routine, conn)
        try:
            while (step := stepper.next()) is not None:
                try:
                    stepper.performed(step, perform(step, stepper.held))
                except psycopg.Error as exc:
                    stepper.failed(exc)
            return stepper.result
        finally:
            close(stepper.left_open())  # when not None

    ``held`` is the routine's connection: ``conn``, or the one an :class:`Acquire` step got. The
    stepping stops when the generator returns or yields a :class:`Handoff` (``result`` is then its
    value; stepping the same routine again resumes it). A worker driver, whose steps hold no
    connection, uses the shorter :meth:`step` (``step()`` first, then ``step(result)`` or
    ``step(error=exc)``).
    """

    __slots__ = ("routine", "conn", "held", "result", "_value", "_error")

    def __init__(self, routine: Generator[Any, Any, Any], conn: C | None = None) -> None:
        self.routine = routine
        self.conn = conn
        self.held = conn
        self.result: Any = None
        self._value: Any = None
        self._error: BaseException | None = None

    def next(self) -> Any:
        """The next step to perform, or None when the stepping is over (see :attr:`result`)."""
        value, error, self._value, self._error = self._value, self._error, None, None
        try:
            step = self.routine.send(value) if error is None else self.routine.throw(error)
        except StopIteration as done:
            self.result = done.value
            return None
        if isinstance(step, Handoff):
            self.result = step.value
            return None
        return step

    def performed(self, step: Step, value: Any) -> None:
        """``step`` gave ``value`` (for :class:`Acquire`, the connection now held)."""
        self._value = value
        if isinstance(step, Acquire):
            self.held = value
        elif isinstance(step, Release):
            self.held = None

    def failed(self, exc: BaseException) -> None:
        """The step raised ``exc``: it is thrown into the generator at the next :meth:`next`."""
        self._error = exc

    def step(self, value: Any = None, error: BaseException | None = None) -> Any:
        """For steps that hold no connection: the last step gave ``value`` (or raised ``error``);
        the next step, or None when the generator ended (its value in :attr:`result`)."""
        self._value, self._error = value, error
        return self.next()

    def left_open(self) -> C | None:
        """The connection acquired and not released (the driver closes it), or None."""
        return self.held if self.held is not self.conn else None
