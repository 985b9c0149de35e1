"""The task results in Django's admin: the list by status, queue and task, a read-only detail page, and
two actions, retry a FAILED task and cancel a READY one (docs/django.md, "The admin").

The rows are written by the backend and its worker, never by hand: every field is read-only, and
rows are neither added nor deleted here (``manage.py pyqueue_prune_results`` deletes finished ones).
The actions need the change permission of task results. Each task is handled in its own transaction
of the backend's database, its results row locked (``SELECT … FOR UPDATE``, as the worker locks it at
each attempt), and the queue's side is one call of a ``dq_*`` function:

* retry (FAILED): ``dq_redrive_messages`` of the task's dead letters in its queue's dead-letter queue
  (found with ``dq_get`` by the key); when the queue has no dead-letter queue and no message has
  this key any more, the task is offered again from its row (``dq_offer`` of :func:`task_payload`,
  same key, never replacing a message). The row becomes READY. A concurrent redrive of the same dead
  letter (the console, ``pyqueue queue redrive``) cannot make a second message: the redrive takes the
  dead letter ``FOR UPDATE SKIP LOCKED`` and inserts ``ON CONFLICT DO NOTHING``, and a dead letter
  another transaction holds is reported busy instead of being offered again.
* cancel (READY, or RUNNING): ``dq_cancel_waiting`` deletes the message only when no consumer holds
  it; a task that started is not cancelled and the admin says so. A cancelled task's row becomes
  FAILED with an error whose ``exception_class_path`` is
  :class:`~pyqueue.contrib.django.exceptions.TaskCancelled` (Django's statuses have no cancelled one).
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.module_loading import import_string

from ...core.statements import Statement, qualified
from ...model import OfferOutcome
from .backend import DelayedQueueBackend, task_payload
from .compat import TaskResultStatus, task_backends
from .exceptions import TaskCancelled
from .models import TaskResultRecord

__all__ = ["CancelOutcome", "RetryOutcome", "TaskResultAdmin", "cancel_task", "retry_task"]


@dataclass(frozen=True)
class AdminSql:
    """The statements of the admin's actions (``{s}``: the install's schema prefix)."""

    dead_letter_queue: str = "SELECT dead_letter_queue FROM {s}dq_queue_config(%(queue)s)"
    # Every row with the key in the dead-letter queue: dq_redrive_messages ignores those that are
    # not dead letters, and sends each dead letter back to the queue it died in.
    redrive_key: str = (
        "SELECT {s}dq_redrive_messages(%(queue)s, ARRAY(SELECT m.id FROM {s}dq_get(%(queue)s, %(key)s) AS m)) "
        "AS moved")
    present: str = "SELECT count(*) AS n FROM {s}dq_get(%(queue)s, %(key)s)"
    cancel_waiting: str = "SELECT {s}dq_cancel_waiting(%(queue)s, %(key)s) AS outcome"


def _first(names: Sequence[str], rows: list[tuple[Any, ...]]) -> Any:
    return rows[0][0] if rows else None


class RetryOutcome(enum.Enum):
    """What the retry of one task did."""

    REDRIVEN = "redriven"  #: its dead letter went back to its queue
    OFFERED = "offered"  #: no message was left: offered again from its row
    QUEUED = "queued"  #: its message was already back in its queue (redriven elsewhere)
    BUSY = "busy"  #: its dead letter is held by a consumer of the dead-letter queue or another redrive
    NOT_FAILED = "not failed"  #: the row is not FAILED


class CancelOutcome(enum.Enum):
    """What the cancel of one task did."""

    CANCELLED = "cancelled"  #: its message was deleted; the row is FAILED (TaskCancelled)
    RUNNING = "running"  #: a worker holds its message: not cancelled
    ABSENT = "absent"  #: no message with its key in its queue: nothing to cancel
    NOT_READY = "not ready"  #: the row is SUCCESSFUL or FAILED


def backend_of(record: TaskResultRecord) -> DelayedQueueBackend:
    """The backend (``TASKS`` alias) that enqueued ``record``."""
    backend = task_backends[record.backend]
    if not isinstance(backend, DelayedQueueBackend):
        raise TypeError(f"TASKS[{record.backend!r}] is not a DelayedQueueBackend")
    return backend


def _run(backend: DelayedQueueBackend, text: str, **params: Any) -> Any:
    return backend.run_statement(Statement(getattr(qualified(AdminSql, backend.schema), text), params, _first))


def retry_task(result_id: str, *, database: str = "default") -> RetryOutcome:
    """Send the FAILED task ``result_id`` back to its queue (see the module's docstring); its row
    becomes READY unless the outcome is BUSY or NOT_FAILED.

    :raises TaskResultRecord.DoesNotExist: no such row.
    """
    with transaction.atomic(using=database):
        record = TaskResultRecord.objects.using(database).select_for_update().get(id=result_id)
        if record.status != TaskResultStatus.FAILED:
            return RetryOutcome.NOT_FAILED
        backend = backend_of(record)
        queue = backend.statements(record.queue_name).queue
        dlq = _run(backend, "dead_letter_queue", queue=queue)
        if dlq and _run(backend, "redrive_key", queue=dlq, key=record.id):
            outcome = RetryOutcome.REDRIVEN
        elif _run(backend, "present", queue=queue, key=record.id):
            outcome = RetryOutcome.QUEUED
        elif dlq and _run(backend, "present", queue=dlq, key=record.id):
            return RetryOutcome.BUSY
        else:
            task = import_string(record.task_path)
            op = backend.statements(record.queue_name).offer(
                record.id, task_payload(task, record.args, record.kwargs, record.backend), None, None, False, None,
                priority=record.priority)
            created = backend.run_statement(op) is OfferOutcome.CREATED
            outcome = RetryOutcome.OFFERED if created else RetryOutcome.QUEUED
        record.status, record.finished_at = TaskResultStatus.READY, None
        record.save(using=database, update_fields=["status", "finished_at"])
    return outcome


def cancel_task(result_id: str, *, database: str = "default", by: str = "") -> CancelOutcome:
    """Cancel the READY (or RUNNING) task ``result_id`` unless a worker holds its message; a cancelled
    task's row becomes FAILED with a :class:`TaskCancelled` error saying ``by`` whom.

    :raises TaskResultRecord.DoesNotExist: no such row.
    """
    with transaction.atomic(using=database):
        record = TaskResultRecord.objects.using(database).select_for_update().get(id=result_id)
        if record.status not in (TaskResultStatus.READY, TaskResultStatus.RUNNING):
            return CancelOutcome.NOT_READY
        backend = backend_of(record)
        found = _run(backend, "cancel_waiting", queue=backend.statements(record.queue_name).queue, key=record.id)
        if found == "in_flight":
            return CancelOutcome.RUNNING
        if found == "absent":
            return CancelOutcome.ABSENT
        now = timezone.now()
        error = {"exception_class_path": f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}",
                 "traceback": f"{TaskCancelled.__qualname__}: cancelled before it ran"
                              f"{' by ' + by if by else ''} at {now.isoformat()}\n"}
        record.status, record.finished_at = TaskResultStatus.FAILED, now
        record.errors = [*(record.errors or []), error]
        record.save(using=database, update_fields=["status", "finished_at", "errors"])
    return CancelOutcome.CANCELLED


F = TypeVar("F", bound=Callable[..., Any])


def _display(description: str) -> Callable[[F], F]:
    """``admin.display`` (Django is untyped here)."""
    return cast(Callable[[F], F], admin.display(description=description))


def _action(description: str) -> Callable[[F], F]:
    """``admin.action`` for users with the change permission of task results."""
    return cast(Callable[[F], F], admin.action(description=description, permissions=["change"]))


def _pre(value: Any) -> Any:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _report(request: HttpRequest, done: int, verb: str, others: dict[str, int]) -> None:
    """One message of an action's counts, e.g. ``3 retried, 1 not FAILED``: a success when nothing
    was left out, else a warning."""
    rest = {text: n for text, n in others.items() if n}
    level = messages.WARNING if rest else messages.SUCCESS
    messages.add_message(request, level, ", ".join([f"{done} {verb}", *(f"{n} {t}" for t, n in rest.items())]))


@admin.register(TaskResultRecord)
class TaskResultAdmin(admin.ModelAdmin):
    """Read-only task results with the retry and cancel actions (change permission)."""

    list_display = ("id", "task_path", "queue_name", "status", "priority", "enqueued_at", "last_attempted_at",
                    "finished_at", "attempts")
    list_filter = ("status", "queue_name", "task_path")
    search_fields = ("=id", "task_path")
    date_hierarchy = "enqueued_at"
    ordering = ("-enqueued_at",)
    actions = ["retry_tasks", "cancel_tasks"]
    fieldsets = (
        (None, {"fields": ("id", "task_path", "queue_name", "backend", "status", "priority", "attempts")}),
        ("Times", {"fields": ("enqueued_at", "run_after", "started_at", "last_attempted_at", "finished_at")}),
        ("Arguments and result", {"fields": ("args_display", "kwargs_display", "return_value_display")}),
        ("Attempts", {"fields": ("errors_display", "worker_ids_display")}),
    )
    readonly_fields = ("id", "task_path", "queue_name", "backend", "status", "priority", "attempts", "enqueued_at",
                       "run_after", "started_at", "last_attempted_at", "finished_at", "args_display", "kwargs_display",
                       "return_value_display", "errors_display", "worker_ids_display")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> Any:
        """The detail page, without save buttons: nothing on it can be edited."""
        context = {**(extra_context or {}), "show_save": False, "show_save_and_continue": False,
                   "show_save_and_add_another": False}
        return super().change_view(request, object_id, form_url, extra_context=context)

    @_display("attempts")
    def attempts(self, obj: TaskResultRecord) -> int:
        return len(obj.worker_ids or [])

    @_display("args")
    def args_display(self, obj: TaskResultRecord) -> Any:
        return _pre(obj.args)

    @_display("kwargs")
    def kwargs_display(self, obj: TaskResultRecord) -> Any:
        return _pre(obj.kwargs)

    @_display("return value")
    def return_value_display(self, obj: TaskResultRecord) -> Any:
        return _pre(obj.return_value) if obj.status == TaskResultStatus.SUCCESSFUL else "-"

    @_display("errors (oldest first)")
    def errors_display(self, obj: TaskResultRecord) -> Any:
        if not obj.errors:
            return "-"
        return format_html_join("", "<p><strong>{}</strong></p><pre>{}</pre>",
                                ((e.get("exception_class_path", ""), e.get("traceback", "")) for e in obj.errors))

    @_display("worker ids (one per attempt)")
    def worker_ids_display(self, obj: TaskResultRecord) -> Any:
        return _pre(obj.worker_ids)

    @_action("Retry the selected FAILED tasks")
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[TaskResultRecord]) -> None:
        counts: Counter[RetryOutcome] = Counter()
        for record in queryset:
            outcome = retry_task(record.id, database=queryset.db)
            counts[outcome] += 1
            if outcome not in (RetryOutcome.BUSY, RetryOutcome.NOT_FAILED):
                self.log_change(request, record, f"Retried ({outcome.value}).")
        done = counts[RetryOutcome.REDRIVEN] + counts[RetryOutcome.OFFERED] + counts[RetryOutcome.QUEUED]
        _report(request, done, "retried", {
            "of them offered again from their row (no dead letter left)": counts[RetryOutcome.OFFERED],
            "busy (the dead letter is held by a consumer or another redrive: try again)": counts[RetryOutcome.BUSY],
            "not FAILED": counts[RetryOutcome.NOT_FAILED]})

    @_action("Cancel the selected READY tasks")
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[TaskResultRecord]) -> None:
        counts: Counter[CancelOutcome] = Counter()
        by = request.user.get_username() if request.user.is_authenticated else ""
        for record in queryset:
            outcome = cancel_task(record.id, database=queryset.db, by=by)
            counts[outcome] += 1
            if outcome is CancelOutcome.CANCELLED:
                self.log_change(request, record, "Cancelled.")
        _report(request, counts[CancelOutcome.CANCELLED], "cancelled", {
            "running (a worker holds it: not cancelled)": counts[CancelOutcome.RUNNING],
            "not in its queue any more": counts[CancelOutcome.ABSENT],
            "not READY": counts[CancelOutcome.NOT_READY]})
