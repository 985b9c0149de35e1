"""The client operations of more than one statement, written once as sans-I/O routines.

A routine is a generator of the client steps of :mod:`pyqueue.core.steps` (run this
:class:`~pyqueue.core.statements.Statement`, wait for a notification up to ``s`` seconds, sleep
``s`` seconds …): the sync driver (:meth:`pyqueue.drivers.sync.Driver.step`) or the asyncio one
(:meth:`pyqueue.drivers.aio.AsyncDriver.step`) performs each on its kind of connection and sends
the result back (or throws the driver's :class:`psycopg.Error` in), until the routine returns its
result. The decisions (when to poll, how long to sleep, when to retry, what a pooler breaks) are
here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg

from .. import limits
from ..durations import Seconds, as_timedelta
from ..model import NackOutcome, NackResult
from .checks import check_int
from .statements import M, QueueStatements, Statement, Statements
from .steps import Acquire, ClientPid, Handoff, NoPrepare, Notified, Release, Routine, Run, RunPooled, Sleep

__all__ = [
    "Listening", "Features", "behind_pooler", "start_listening", "poll_waiting", "transaction", "dead_letter_queue_of",
    "nack_outcome",
]


log = logging.getLogger("pyqueue.client")


#: How long a LISTEN probe waits for its own notification before concluding that notifications
#: do not reach this connection (seconds).
LISTEN_PROBE_TIMEOUT_S = 2.0
LISTEN_UNAVAILABLE = (
    "queue %r: notifications do not reach this connection (LISTEN behind a transaction-pooling "
    "PgBouncer or similar); waiting with timed polls instead (at most idle_check between polls)"
)


@dataclass
class Listening:
    """What a queue has learnt about waiting, kept for its life: its LISTEN channel (``dq_channel``,
    looked up once) and whether notifications reach a LISTENing connection (None until a probe
    told: only behind a pooler is there anything to probe; False after a failed probe, and the
    waits become timed polls)."""

    channel: str | None = None
    available: bool | None = None


@dataclass
class Features:
    """What a queue has learnt about its install, kept for its life: whether it has
    ``dq_nack_outcome`` (None until the first nack that reports its outcome asked; an install of
    an earlier release has only ``dq_nack``)."""

    nack_outcome: bool | None = None


def behind_pooler(ops: Statements) -> Routine[bool]:
    """True when a connection pooler (PgBouncer…) sits between the connection and the server: the
    backend pid libpq was given at connect (the pooler's own cancel key) is not the server
    process's. Then psycopg's prepared statements, which would be created on one server
    connection and used on another, are turned off."""
    server_pid = yield Run(ops.backend_pid())
    client_pid = yield ClientPid()
    if server_pid == client_pid:
        return False
    yield NoPrepare()
    return True


def channel(ops: QueueStatements, state: Listening) -> Routine[str]:
    """The queue's LISTEN channel, looked up once."""
    if state.channel is None:
        state.channel = yield Run(ops.channel())
    return state.channel


def start_listening(ops: QueueStatements, state: Listening) -> Routine[None]:
    """LISTEN on the queue's channel; behind a pooler, first check that a notification sent from
    another connection arrives (a transaction-pooling PgBouncer hands the session to other clients
    between transactions, so it would not). Without notifications the waits fall back to timed
    polls (``state.available`` False), logged once."""
    pooled = yield from behind_pooler(ops)
    if state.available is False:
        return
    yield Run(ops.listen((yield from channel(ops, state))))
    if not pooled or state.available:
        return
    probe = f"dq_probe_{uuid4().hex}"  # unique, so that no other listener wakes up
    yield Run(ops.listen(probe))
    yield RunPooled(ops.notify(probe))
    if (yield Notified(LISTEN_PROBE_TIMEOUT_S)):
        yield Run(ops.unlisten(probe))
        state.available = True
    else:
        state.available = False
        yield Run(ops.unlisten(None))
        log.warning(LISTEN_UNAVAILABLE, ops.queue)


def poll_waiting(
    ops: QueueStatements,
    state: Listening,
    cls: type[M],
    client: Any,
    max_count: int,
    lock_timeout: Seconds,
    wait: Seconds,
    idle_check: Seconds,
) -> Routine[list[M]]:
    """``poll(wait=…)`` on a listening connection (:class:`Acquire`). A kept-open waiting connection
    may have been closed by the server meanwhile (restart, pg_terminate_backend, idle timeout): on
    an :class:`psycopg.OperationalError` it retries once on a fresh one, unless the wait is over.
    A poll whose result was lost with the connection only delays those messages until their lock
    expires (at-least-once)."""
    check_int(max_count, "max_count", 1, limits.POLL_MAX_COUNT)  # every argument checked before any I/O
    lock_td = as_timedelta(lock_timeout, "lock_timeout")
    wait_s = as_timedelta(wait, "wait", allow_zero=True).total_seconds()
    check_s = as_timedelta(idle_check, "idle_check").total_seconds()

    def steps() -> Routine[list[M]]:
        deadline = time.monotonic() + wait_s
        for attempt in (1, 2):
            try:
                yield Acquire()
                messages = yield from _wait_cycle(ops, state, cls, client, max_count, lock_td, deadline, check_s)
            except psycopg.OperationalError:
                yield Release(keep=False)
                if attempt == 2 or time.monotonic() >= deadline:
                    raise
                continue
            yield Release(keep=True)
            return messages
        raise AssertionError("unreachable")

    return steps()


def _wait_cycle(
    ops: QueueStatements,
    state: Listening,
    cls: type[M],
    client: Any,
    max_count: int,
    lock_td: timedelta,
    deadline: float,
    check_s: float,
) -> Routine[list[M]]:
    """One ``dq_poll_or_wait`` per cycle: it ends the previous wait, polls, and when nothing came
    registers the wait and says how long to sleep; then sleep on LISTEN until a notification or
    that time. An idle consumer thus costs one statement per wake-up. The registration is left
    in place on return: it expires by itself (at most ``idle_check`` later) and the next call
    replaces it. The database registers a wait of at most :data:`pyqueue.limits.WAIT_MAX`, so
    longer waits and idle checks re-register."""
    first = True
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 and not first:
            return []
        first = False
        max_wait = timedelta(seconds=min(max(remaining, 0.001), check_s, limits.WAIT_MAX.total_seconds()))
        waited = yield Run(ops.poll_or_wait(max_count, lock_td, max_wait, cls, client))
        if waited.messages:
            return list(waited.messages)
        if remaining <= 0:
            return []
        sleep_s = min(waited.wake_in_s, remaining)
        if sleep_s > 0:
            yield Sleep(sleep_s) if state.available is False else Notified(sleep_s)


def dead_letter_queue_of(ops: QueueStatements, message: Any) -> Routine[str | None]:
    """Where a delivery that was just nacked went, run inside the driver's transaction (the
    cursor of ``dq_export_messages`` lives until its end): None while the message is still in its
    queue (it will be delivered again), else the dead-letter queue it was moved to at the queue's
    ``max_deliveries`` (None too if it left otherwise, cancelled meanwhile). One ``dq_get`` in the
    usual case; the dead letter is looked up only when the message left."""
    stored = yield Run(ops.get(message.key))
    if stored is not None and stored.id == message.id:
        return None
    return (yield from _dead_letter_queue(ops, message))


def nack_outcome(
    ops: QueueStatements, features: Features, message: Any, delay: Seconds, error: str | None
) -> Routine[NackResult]:
    """Nack ``message`` and say where it went, run inside the driver's transaction: one
    ``dq_nack_outcome`` (after a one-time check that the install has it). On an install of an
    earlier release (during an upgrade), ``dq_nack`` and then :func:`dead_letter_queue_of`'s reads;
    a message that left its queue for no dead-letter queue (cancelled meanwhile) then reads as
    retried, with no due time."""
    if features.nack_outcome is None:
        features.nack_outcome = yield Run(ops.has_nack_outcome())
    if features.nack_outcome:
        result: NackResult = yield Run(ops.nack_outcome(message.lock_token, delay, error))
        return result
    if not (yield Run(ops.nack(message.lock_token, delay, error))):
        return NackResult(NackOutcome.STALE)
    stored = yield Run(ops.get(message.key))
    if stored is not None and stored.id == message.id:
        return NackResult(NackOutcome.RETRIED, stored.scheduled_at)
    dead_letter_queue = yield from _dead_letter_queue(ops, message)
    if dead_letter_queue is None:
        return NackResult(NackOutcome.RETRIED)
    return NackResult(NackOutcome.DEAD_LETTERED, dead_letter_queue=dead_letter_queue)


def _dead_letter_queue(ops: QueueStatements, message: Any) -> Routine[str | None]:
    """The dead-letter queue of the newest dead letter ``message`` became, or None."""
    cursor = yield Run(ops.dead_letters_of(message))
    rows = yield Run(ops.fetch_all(cursor))
    if not rows:
        return None
    return str(max(rows, key=lambda r: (r["dead_at"], r["id"]))["queue"])


def transaction(
    ops: QueueStatements, cls: type[M], client: Any, max_count: int, lock_timeout: Seconds
) -> Routine[list[M]]:
    """Exactly-once processing, run inside the driver's transaction: poll, hand the messages to the
    caller (:class:`Handoff`), and when the caller's block ends normally acknowledge them in the
    same transaction; returns them. The arguments are checked at the call, before any I/O."""
    return _transaction(ops, ops.poll(max_count, lock_timeout, cls, client))


def _transaction(ops: QueueStatements, poll: Statement[list[M]]) -> Routine[list[M]]:
    messages: list[M] = yield Run(poll)
    yield Handoff(messages)
    yield Run(ops.ack_many(messages))
    return messages
