"""``DelayedQueueBackend``: Django's Tasks API on pyqueue (docs/django.md).

``enqueue`` offers one message with ``dq_offer`` on Django's own database connection and writes the
task's row in the results table (:class:`~pyqueue.contrib.django.models.TaskResultRecord`) in the same
transaction: inside ``transaction.atomic()`` a rollback leaves neither (the transactional outbox), a
commit makes both visible. The statement is the binding's own (:mod:`pyqueue.core.statements`): this
module decides no queue logic.

The message: key = the result id; queue = the task's ``queue_name``; due time = ``run_after`` (now when
None); priority = Django's priority unchanged (Django's -100 … 100 lies inside pyqueue's -32768 … 32767
and both run higher first); payload = the JSON object :func:`task_payload` builds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone
from django.utils.crypto import get_random_string
from django.utils.module_loading import import_string
from psycopg.types.json import Jsonb

from ... import limits
from ...core.checks import described
from ...core.statements import QueueStatements, Statement, qualified
from ...drivers.sync import run
from ...errors import InvalidArgument, ValueTooLong, translating
from ...model import OfferOutcome
from ...serializers import SerializerRegistry
from .compat import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from .exceptions import ResultIdTaken

__all__ = ["DelayedQueueBackend", "PAYLOAD_VERSION", "check_result_id", "enqueue_with_id", "task_payload"]

#: The version of the payload format of :func:`task_payload` (the ``"v"`` member).
PAYLOAD_VERSION = 1

# Django's priority range, and the check that it fits pyqueue's (so the mapping is the identity).
DJANGO_PRIORITY_MIN, DJANGO_PRIORITY_MAX = -100, 100
assert limits.PRIORITY_MIN <= DJANGO_PRIORITY_MIN and DJANGO_PRIORITY_MAX <= limits.PRIORITY_MAX
#: The longest result id: a message key (the results table's ``id`` has the same length).
RESULT_ID_CHARS = limits.KEY_CHARS


@dataclass(frozen=True)
class DjangoSql:
    """The backend's own statements (``{s}``: the install's schema prefix, see
    :func:`pyqueue.core.statements.qualified`)."""

    #: Whether the message of a task is in its queue and deliverable now or later, not held by a
    #: consumer (never locked, or its lock expired, on the database clock).
    waiting: str = (
        "SELECT (m.locked_until IS NULL OR m.locked_until <= {s}dq_now()) AS waiting "
        "FROM {s}dq_get(%(queue)s, %(key)s) AS m"
    )
    #: A cursor over the dead letters of a task's message (its key, died in its queue), wherever its
    #: queue's dead-letter queue is (the filter reads the index of dead letters by source queue).
    dead_letters: str = "SELECT {s}dq_export_messages(NULL, NULL, %(filters)s) AS cursor"


def check_result_id(result_id: object) -> str:
    """``result_id`` if it can be a task's id and message key: a str of 1 to 200 characters.

    :raises pyqueue.InvalidArgument: not a str, or empty (22023).
    :raises pyqueue.ValueTooLong: over 200 characters (22001).
    """
    if not isinstance(result_id, str) or not result_id:
        raise InvalidArgument(f"result_id must be a str of 1 to {RESULT_ID_CHARS} characters, "
                              f"got {described(result_id)}")
    if len(result_id) > RESULT_ID_CHARS:
        raise ValueTooLong(f"result_id is {len(result_id)} characters, the limit is {RESULT_ID_CHARS}")
    return result_id


def _waiting(names: Sequence[str], rows: list[tuple[Any, ...]]) -> bool | None:
    """None when the message is not in its queue, else whether no consumer holds it."""
    return bool(rows[0][0]) if rows else None


def _cursor(names: Sequence[str], rows: list[tuple[Any, ...]]) -> str:
    return str(rows[0][0])


def task_payload(task: Task, args: Any, kwargs: Any, backend: str) -> dict[str, Any]:
    """The message payload of one enqueued task, a JSON object::

        {"v": 1, "task": "app.tasks.send_mail", "args": [...], "kwargs": {...}, "backend": "default"}

    ``task`` is the task's ``module_path`` (``import_string`` of it is the ``Task``), ``args`` and
    ``kwargs`` its arguments as JSON (Django's ``normalize_json``: tuples become lists), ``backend`` the
    ``TASKS`` alias. A worker needs nothing else to run it; SQL and other producers may offer it too.
    """
    return {"v": PAYLOAD_VERSION, "task": task.module_path, "args": list(args), "kwargs": dict(kwargs),
            "backend": backend}


class DelayedQueueBackend(BaseTaskBackend):
    """A Django Tasks backend whose queue is pyqueue's, in the database of Django's ``DATABASE`` alias.

    ``TASKS = {"default": {"BACKEND": "pyqueue.contrib.django.DelayedQueueBackend", "QUEUES": ["default"],
    "OPTIONS": {...}}}``. ``QUEUES`` lists the queue names tasks may use (pyqueue queue names, at most
    100 characters); an empty list allows any. ``OPTIONS``:

    * ``"DATABASE"``: the alias in ``DATABASES`` where pyqueue is installed and the results table
      lives (default ``"default"``); enqueue runs on that alias's connection and transaction.
    * ``"SCHEMA"``: the schema of the pyqueue install (``pyqueue migrate --schema``); None (default)
      leaves the names to the connection's ``search_path``.

    :raises pyqueue.InvalidArgument: from ``enqueue``, a queue name or key pyqueue refuses.
    :raises pyqueue.DatabaseError: from ``enqueue`` or ``get_result``, the database failed.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", DEFAULT_DB_ALIAS)
        self.schema: str | None = self.options.get("SCHEMA")
        self.serializers = SerializerRegistry.default()
        self._statements: dict[str, QueueStatements] = {}
        self._sql = qualified(DjangoSql, self.schema)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """Django's system checks of this backend (``manage.py check``): the base class's, and the error
        ``pyqueue_django.E001`` when ``pyqueue.contrib.django``, the app owning the results table that
        ``enqueue`` and the worker write, is not in ``INSTALLED_APPS``."""
        yield from super().check(**kwargs)
        if not apps.is_installed("pyqueue.contrib.django"):
            yield checks.Error(f"TASKS[{self.alias!r}] is a {type(self).__name__}, but its app is not installed",
                               hint="Add 'pyqueue.contrib.django' to INSTALLED_APPS", id="pyqueue_django.E001")

    # -- the queue's statements -------------------------------------------------------------------
    def statements(self, queue_name: str) -> QueueStatements:
        """The binding's statements for ``queue_name`` in this backend's install (made once per queue).

        :raises pyqueue.InvalidArgument: pyqueue refuses the queue name.
        """
        found = self._statements.get(queue_name)
        if found is None:
            found = self._statements[queue_name] = QueueStatements(queue_name, self.schema, self.serializers)
        return found

    def run_statement(self, op: Statement[Any]) -> Any:
        """Run ``op`` on Django's connection of this backend's ``DATABASE``, in its current transaction.

        :raises pyqueue.PyQueueError: the exception of the server's SQLSTATE.
        """
        connection = connections[self.database]
        connection.ensure_connection()
        with translating():
            return run(connection.connection, op)

    # -- enqueue ----------------------------------------------------------------------------------
    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Offer ``task`` with ``args`` and ``kwargs`` and record its READY result, in one transaction
        of Django's connection (a savepoint inside the caller's ``atomic()`` block, so a rollback there
        leaves no message and no row). Fires ``task_enqueued`` once both are written.

        :returns: the ``TaskResult`` (status READY; its ``id``, 32 random characters, is the message key).
        :raises InvalidTaskError: the task is not valid for this backend (``validate_task``).
        :raises pyqueue.InvalidArgument: pyqueue refuses the queue name.
        """
        return self._enqueue(task, args, kwargs, None)

    def enqueue_with_id(self, task: Task, result_id: str, args: Any, kwargs: Any) -> TaskResult:
        """``enqueue`` under the caller's ``result_id`` (also the message key), idempotently: while a
        results row with this id exists (until ``pyqueue_prune_results`` deletes it once finished),
        another call offers nothing and returns that task's result as ``get_result`` reads it, whatever
        task and arguments it was given, and fires no signal. A concurrent enqueue of the same id in
        another transaction waits for that transaction (the row's primary key), then returns its task,
        or enqueues if it rolled back: exactly one message and one row.

        :param result_id: 1 to 200 characters (the results table's ``id`` and pyqueue's key limit).
        :raises pyqueue.InvalidArgument: ``result_id`` is not a str or is empty (22023).
        :raises pyqueue.ValueTooLong: ``result_id`` is over 200 characters (22001).
        :raises ResultIdTaken: no task has this id, but a message with this key, offered by another
            producer, is in the task's queue (nothing is written).
        """
        return self._enqueue(task, args, kwargs, check_result_id(result_id))

    def _enqueue(self, task: Task, args: Any, kwargs: Any, result_id: str | None) -> TaskResult:
        from .models import TaskResultRecord

        self.validate_task(task)
        key = result_id or get_random_string(32)
        payload = task_payload(task, args, kwargs, self.alias)
        op = self.statements(task.queue_name).offer(key, payload, task.run_after, None, False, None,
                                                    priority=task.priority)
        row = {"task_path": task.module_path, "queue_name": task.queue_name, "backend": self.alias,
               "priority": task.priority, "args": payload["args"], "kwargs": payload["kwargs"],
               "run_after": task.run_after, "status": TaskResultStatus.READY, "enqueued_at": timezone.now()}
        rows = TaskResultRecord.objects.using(self.database)
        with transaction.atomic(using=self.database):
            if result_id is None:
                record = rows.create(id=key, **row)
            else:  # the row's primary key decides between concurrent enqueues of one id
                record, created = rows.get_or_create(id=key, defaults=row)
                if not created:
                    return self.get_result(key)
            if self.run_statement(op) is not OfferOutcome.CREATED:
                raise ResultIdTaken(f"enqueue_with_id: queue {task.queue_name!r} already has a message with key "
                                    f"{key!r} that is no task of this backend")
        result = self.to_result(record, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    # -- results ----------------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult:
        """The result of the task ``result_id``, on this backend's ``DATABASE``.

        The row says RUNNING from the start of an attempt to its end, and FAILED once the message was
        dead-lettered. Three cases are read from the queue instead: a RUNNING task whose message no
        consumer holds any more (its worker died and the lock expired) and a FAILED task whose message
        is back in its queue (redriven from the dead-letter queue) are READY: they run again; a RUNNING
        task whose message is a dead letter (its worker died on the queue's last delivery, and the
        next poll dead-lettered it) is FAILED (``finished_at`` stays None: no worker saw it end).

        :raises TaskResultDoesNotExist: no task has this id.
        :raises pyqueue.DatabaseError: the database failed.
        """
        from .models import TaskResultRecord

        try:
            record = TaskResultRecord.objects.using(self.database).get(id=result_id)
        except TaskResultRecord.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        if record.status in (TaskResultStatus.RUNNING, TaskResultStatus.FAILED):
            waiting = self.queue_state(record)
            if waiting:
                record.status = TaskResultStatus.READY
            elif waiting is None and record.status == TaskResultStatus.RUNNING and self.dead_lettered(record):
                record.status = TaskResultStatus.FAILED
        return self.to_result(record)

    def waiting(self, record: Any) -> bool:
        """Whether the message of ``record`` is in its queue and no consumer holds it."""
        return bool(self.queue_state(record))

    def queue_state(self, record: Any) -> bool | None:
        """None when the message of ``record`` is not in its queue, else whether no consumer holds it."""
        params = {"queue": self.statements(record.queue_name).queue, "key": record.id}
        return self.run_statement(Statement(self._sql.waiting, params, _waiting))  # type: ignore[no-any-return]

    def dead_lettered(self, record: Any) -> bool:
        """Whether the message of ``record`` is a dead letter (it died in its queue and was not redriven)."""
        filters = Jsonb([["key", "=", record.id], ["dead_from", "=", self.statements(record.queue_name).queue]])
        with transaction.atomic(using=self.database):  # the cursor lives until the transaction ends
            cursor = self.run_statement(Statement(self._sql.dead_letters, {"filters": filters}, _cursor))
            return bool(self.run_statement(QueueStatements.fetch_all(cursor)))

    def to_result(self, record: Any, task: Task | None = None) -> TaskResult:
        """The ``TaskResult`` of a results row (``task``: the Task when known, else imported from the
        row's ``task_path`` and set to the row's priority, queue, due time and backend)."""
        if task is None:
            task = import_string(record.task_path).using(
                priority=record.priority, queue_name=record.queue_name, run_after=record.run_after,
                backend=record.backend)
        result = TaskResult(
            task=task, id=record.id, status=TaskResultStatus(record.status), enqueued_at=record.enqueued_at,
            started_at=record.started_at, finished_at=record.finished_at,
            last_attempted_at=record.last_attempted_at, args=record.args, kwargs=record.kwargs,
            backend=record.backend,
            errors=[TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                    for e in record.errors or []],
            worker_ids=list(record.worker_ids or []))
        object.__setattr__(result, "_return_value", record.return_value)
        return result


def enqueue_with_id(task: Task, result_id: str, /, *args: Any, **kwargs: Any) -> TaskResult:
    """``task.enqueue(*args, **kwargs)`` under the caller's ``result_id``, idempotently
    (:meth:`DelayedQueueBackend.enqueue_with_id`): ``task``'s backend must be a ``DelayedQueueBackend``.

    :raises pyqueue.InvalidArgument: the backend is not a ``DelayedQueueBackend``, or a bad ``result_id``.
    """
    backend = task.get_backend()
    if not isinstance(backend, DelayedQueueBackend):
        raise InvalidArgument(f"enqueue_with_id: TASKS[{task.backend!r}] is not a DelayedQueueBackend")
    return backend.enqueue_with_id(task, result_id, args, kwargs)
