"""The worker side of :class:`~pyqueue.contrib.django.backend.DelayedQueueBackend`: pyqueue's
:class:`~pyqueue.Worker` (LISTEN wake-ups, lock extension while a task runs, backoff) with

* :class:`TaskRunner`, its handler: runs the task a message names and records each attempt in the
  results table (RUNNING, then SUCCESSFUL, READY for a retry, or FAILED), firing ``task_started`` and
  ``task_finished`` as Django's reference backends do;
* :class:`DjangoConnections`, a middleware that closes Django's unusable or expired database
  connections before and after each task (``django.db.close_old_connections``, as Django does around
  each request), so a worker thread never reuses a broken connection or keeps one past ``CONN_MAX_AGE``.

``manage.py pyqueue_worker`` (:mod:`pyqueue.contrib.django.management.commands.pyqueue_worker`) runs
them; :func:`make_worker` builds the same worker for a program of one's own.

The runner settles each message itself: a SUCCESSFUL row and the acknowledgement commit in one
transaction of Django's connection (a worker killed in between runs the task again, never records a
success it did not acknowledge); a failure is nacked (``dq_nack_outcome``) with the backoff's delay and
the error's text, and the row says where the message went: READY (retried) or FAILED (dead-lettered at
the queue's ``max_deliveries``). A task that gives up earlier (its own ``max_attempts`` reached, or its
``backoff`` returned None: :mod:`pyqueue.contrib.django.retries`) is dead-lettered at once
(``Message.dead_letter``), committed with its FAILED row in one transaction of Django's connection.
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from django.db import close_old_connections, connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ... import limits
from ...core.delivery import Backoff, error_text
from ...core.middleware import HandlerCall, Middleware
from ...errors import InvalidArgument, NotConfigured
from ...model import NackOutcome
from ...sync.client import DelayedQueue, Message
from ...sync.worker import Worker
from .backend import PAYLOAD_VERSION, DelayedQueueBackend
from .compat import Task, TaskContext, TaskResultStatus, normalize_json, task_backends, task_finished, task_started
from .retries import as_delay, policy_for

__all__ = ["DjangoConnections", "TaskRunner", "conninfo", "default_worker_id", "make_worker"]

logger = logging.getLogger("pyqueue.contrib.django")

#: How long a worker id may be (Django's reference backend stores at most 64 characters).
WORKER_ID_CHARS = 64


def default_worker_id() -> str:
    """This process's worker id: ``host:pid`` (at most 64 characters)."""
    return f"{socket.gethostname()}:{os.getpid()}"[-WORKER_ID_CHARS:]


def conninfo(alias: str) -> str:
    """The libpq connection string of Django's database ``alias`` (its NAME, USER, PASSWORD, HOST,
    PORT and the libpq keywords of its OPTIONS), for the worker's own pool.

    :raises django.db.utils.ConnectionDoesNotExist: no such alias.
    """
    params = connections[alias].get_connection_params()
    known = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}
    return psycopg.conninfo.make_conninfo(
        "", **{k: v for k, v in params.items() if k in known and isinstance(v, (str, int)) and v != ""})


class DjangoConnections(Middleware):
    """Closes Django's database connections of the handler's thread that are unusable or past
    ``CONN_MAX_AGE`` (with the default ``CONN_MAX_AGE = 0``: every one) before and after each task."""

    def handle(self, call: HandlerCall[Any], call_next: Callable[[HandlerCall[Any]], Any]) -> Any:
        close_old_connections()
        try:
            return call_next(call)
        finally:
            close_old_connections()


def _payload(message: Message) -> dict[str, Any]:
    """The payload of a task message (see :func:`~pyqueue.contrib.django.backend.task_payload`).

    :raises InvalidArgument: not a task payload of a version this worker reads.
    """
    payload = message.payload
    if not (isinstance(payload, dict) and payload.get("v") == PAYLOAD_VERSION and isinstance(payload.get("task"), str)
            and isinstance(payload.get("args", []), list) and isinstance(payload.get("kwargs", {}), dict)):
        raise InvalidArgument(f"message {message.key!r} is not a Django task (payload version {PAYLOAD_VERSION})")
    return payload


class TaskRunner:
    """The handler of a Django tasks worker: runs the task of each message and records the attempt.

    :param backend: the backend whose results table is written (its ``DATABASE``).
    :param worker_id: recorded in ``worker_ids`` at each attempt (default: :func:`default_worker_id`).
    :param backoff: the delay before a failed task runs again (default: :class:`pyqueue.Backoff`'s,
        1 s doubling up to 10 min, ±20%).
    :param queue_name: the queue the worker consumes, recorded for a message some other producer
        offered without a results row (default: the task's own ``queue_name``).
    """

    def __init__(self, backend: DelayedQueueBackend, *, worker_id: str | None = None,
                 backoff: Backoff | None = None, queue_name: str | None = None) -> None:
        self.backend = backend
        self.queue_name = queue_name
        self.database = backend.database
        self.worker_id = worker_id or default_worker_id()
        self.backoff = backoff or Backoff()

    def __call__(self, message: Message) -> None:
        payload = _payload(message)
        task: Task = import_string(payload["task"])
        record = self._started(message, payload, task)
        task_result = self.backend.to_result(record)
        task_started.send(type(self.backend), task_result=task_result)
        try:
            if task_result.task.takes_context:
                value = task_result.task.call(TaskContext(task_result=task_result), *record.args, **record.kwargs)
            else:
                value = task_result.task.call(*record.args, **record.kwargs)
        except BaseException as exc:
            self._failed(message, record.id, exc)
            if isinstance(exc, KeyboardInterrupt):
                raise  # the worker stops, as with any handler
            return
        self._succeeded(message, record, value)

    # -- the attempt's transitions ----------------------------------------------------------------
    def _started(self, message: Message, payload: dict[str, Any], task: Task) -> Any:
        """READY → RUNNING: the row of ``message`` (made from the payload when the message was offered
        by another producer), with this attempt's time and worker."""
        from .models import TaskResultRecord

        now = timezone.now()
        # One statement (autocommit) for the usual case, a row written by enqueue: the worker's other
        # round trips per task are the poll and the acknowledging transaction.
        started = list(TaskResultRecord.objects.using(self.database).raw(_STARTED, [
            TaskResultStatus.RUNNING, now, now, self.worker_id, message.key]))
        if started:
            return started[0]
        # No row: the message was offered by another producer (SQL, Spark, pyqueue): made from the payload.
        with transaction.atomic(using=self.database):
            rows = TaskResultRecord.objects.using(self.database).select_for_update()
            record = rows.filter(id=message.key).first()
            if record is None:
                record = TaskResultRecord(
                    id=message.key, task_path=payload["task"], queue_name=self.queue_name or task.queue_name,
                    backend=payload.get("backend", self.backend.alias), priority=message.priority,
                    args=payload.get("args", []), kwargs=payload.get("kwargs", {}),
                    enqueued_at=message.created_at or now)
            record.status = TaskResultStatus.RUNNING
            record.started_at = record.started_at or now
            record.finished_at = None  # a FAILED task redriven from the dead-letter queue runs again
            record.last_attempted_at = now
            record.worker_ids = [*(record.worker_ids or []), self.worker_id]
            record.save(using=self.database)
        return record

    def _succeeded(self, message: Message, record: Any, value: Any) -> None:
        """RUNNING → SUCCESSFUL, committed with the acknowledgement (nothing when the lock was lost);
        ``task_finished`` gets the result as written (``record``, the row of this attempt), as the
        reference backends send it, without reading it back."""
        from .models import TaskResultRecord

        try:
            return_value = _json(value)
        except (TypeError, ValueError) as exc:  # a return value JSON cannot hold fails the attempt
            self._failed(message, record.id, exc)
            return
        finished_at = timezone.now()
        with transaction.atomic(using=self.database):
            TaskResultRecord.objects.using(self.database).filter(id=record.id).update(
                status=TaskResultStatus.SUCCESSFUL, return_value=return_value, finished_at=finished_at)
            connection = connections[self.database]
            acked = message.ack(conn=connection.connection)
            if not acked:
                transaction.set_rollback(True, using=self.database)
        if acked:
            record.status, record.return_value, record.finished_at = (
                TaskResultStatus.SUCCESSFUL, return_value, finished_at)
            task_finished.send(type(self.backend), task_result=self.backend.to_result(record))
        else:
            logger.warning("task %s finished but its lock was lost: it runs again", record.id)

    def _failed(self, message: Message, key: str, exc: BaseException) -> None:
        """RUNNING → READY (nacked, retried after the backoff) or FAILED (dead-lettered: the task's
        ``max_attempts`` reached or its ``backoff`` gave up, or the queue's ``max_deliveries``
        reached); the error appended either way."""
        from .models import TaskResultRecord

        text = error_text(exc)[:limits.ERROR_CHARS]
        error = {"exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
                 "traceback": _traceback(exc)}
        with transaction.atomic(using=self.database):
            record = TaskResultRecord.objects.using(self.database).select_for_update().get(id=key)
            record.errors = [*(record.errors or []), error]
            delay = self._retry_delay(message, record, exc)
            # The message is settled on Django's connection, in this transaction: the row and the
            # queue change together (a reader never sees a dead letter whose row says RUNNING).
            conn = connections[self.database].connection
            if delay is None:  # gives up: dead-lettered now
                failed = self._give_up(message, key, text, conn)
            else:
                outcome = message.nack_outcome(delay, error=text, conn=conn).outcome
                failed = outcome is NackOutcome.DEAD_LETTERED
                if outcome is NackOutcome.RETRIED:
                    record.status = TaskResultStatus.READY
            if failed:
                record.status, record.finished_at = TaskResultStatus.FAILED, timezone.now()
            record.save(using=self.database)
        if failed:
            task_finished.send(type(self.backend), task_result=self.backend.to_result(record))

    def _retry_delay(self, message: Message, record: Any, exc: BaseException) -> timedelta | None:
        """The delay before the next attempt, or None when the task gives up now: its
        ``max_attempts`` reached (attempts = the message's ``delivery_count``), or its ``backoff``
        returned None. A backoff that raises or answers nonsense is logged and the worker's
        :class:`pyqueue.Backoff` decides instead."""
        policy = policy_for(record.task_path, self.backend.options)
        if policy.max_attempts is not None and message.delivery_count >= policy.max_attempts:
            return None
        if policy.backoff is None:
            return self.backoff.delay(message.delivery_count)
        status = record.status
        record.status = TaskResultStatus.FAILED  # what the backoff sees: this attempt failed
        try:
            return as_delay(policy.backoff(exc, self.backend.to_result(record)))
        except Exception:
            logger.exception("the backoff of task %s failed; the worker's backoff is used", record.task_path)
            return self.backoff.delay(message.delivery_count)
        finally:
            record.status = status

    def _give_up(self, message: Message, key: str, text: str, conn: Any) -> bool:
        """Dead-letter ``message`` now, on Django's connection in its current transaction; True when
        it left its queue (the task is FAILED), False when its lock was lost (it runs again). A
        queue without a dead-letter queue refuses (``NotConfigured``): the message is acknowledged
        instead (deleted; archived as acked where the queue archives), there is nothing to redrive."""
        try:
            with transaction.atomic(using=self.database):  # a savepoint: a refusal leaves the rest
                result = message.dead_letter(text, conn=conn)
        except NotConfigured:
            logger.warning("task %s gave up; its queue %s has no dead-letter queue: its message is deleted",
                           key, message.queue)
            return message.ack(conn=conn)
        if result.outcome is NackOutcome.STALE:
            logger.warning("task %s gave up but its lock was lost: it runs again", key)
            return False
        return True


#: READY (or any) -> RUNNING for an attempt, in one statement returning the row (the table is
#: ``TaskResultRecord._meta.db_table``, checked by tests/django/test_django_worker.py).
_STARTED = (
    "UPDATE pyqueue_django_task_result SET status = %s, started_at = coalesce(started_at, %s), "
    "finished_at = NULL, last_attempted_at = %s, worker_ids = worker_ids || jsonb_build_array(%s::text) "
    "WHERE id = %s RETURNING *")


def _json(value: Any) -> Any:
    """``value`` as JSON values (Django's ``normalize_json``: tuples become lists).

    :raises TypeError: a value JSON cannot hold.
    """
    return normalize_json(value)


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def make_worker(queue_name: str, *, backend: str = "default", concurrency: int = 4,
                lock_timeout: timedelta = timedelta(seconds=30), shutdown_grace: timedelta = timedelta(seconds=30),
                idle_check: timedelta = timedelta(seconds=5), backoff: Backoff | None = None) -> Worker:
    """A :class:`pyqueue.Worker` running the tasks of ``queue_name`` enqueued through the ``TASKS``
    alias ``backend``, on a pool of ``concurrency + 3`` connections to that backend's ``DATABASE``.
    ``run()`` opens its queue (``worker.queue``) at the first poll; close it after.

    :param concurrency: tasks running at once (threads), ≥ 1.
    :param lock_timeout: the lock of each delivery, extended every third of it while the task runs; a
        worker that dies leaves its task to run again once this has passed (default 30 s).
    :param shutdown_grace: on stop, how long running tasks may finish (default 30 s).
    :param idle_check: while idle, re-check the queue at least this often (default 5 s).
    :param backoff: the delay before a failed task runs again (default :class:`pyqueue.Backoff`).
    :raises InvalidArgument: ``backend`` is not a :class:`DelayedQueueBackend`, or a setting is out of range.
    """
    found = task_backends[backend]
    if not isinstance(found, DelayedQueueBackend):
        raise InvalidArgument(f"TASKS[{backend!r}] is not a DelayedQueueBackend")
    queue = DelayedQueue(conninfo(found.database), queue_name, pool_size=concurrency + 3, schema=found.schema)
    runner = TaskRunner(found, backoff=backoff, queue_name=queue_name)
    return Worker(queue, runner, concurrency=concurrency, lock_timeout=lock_timeout, shutdown_grace=shutdown_grace,
                  idle_check=idle_check, middleware=[DjangoConnections()])
