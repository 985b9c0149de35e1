"""The durable results of the tasks enqueued through :class:`DelayedQueueBackend`: one row per task
(its id is the message key), written in the enqueuing transaction and by the worker.

The queue holds what is still to run (``dq_messages``); this table holds what Django's ``get_result``
reports: status, return value, the errors of each attempt, the times and the workers. Table
``pyqueue_django_task_result``.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from .compat import TaskResultStatus

#: The longest task path stored (module path and function name of the task).
TASK_PATH_CHARS = 1000


class TaskResultRecord(models.Model):
    """One task, from its enqueue to its last attempt.

    :ivar id: the result id, which is also the message key in the queue (at most 200 characters).
    :ivar task_path: ``module.function`` of the task (what ``import_string`` finds).
    :ivar queue_name: the queue (Django's ``queue_name`` is pyqueue's queue).
    :ivar backend: the alias in ``TASKS`` that enqueued it.
    :ivar priority: Django's priority (-100 … 100), offered unchanged as the message priority.
    :ivar args, kwargs: the task's arguments, as JSON.
    :ivar run_after: the due time asked for, or None (now).
    :ivar status: READY, RUNNING, SUCCESSFUL or FAILED (Django's ``TaskResultStatus``).
    :ivar return_value: the JSON of what the task returned, once SUCCESSFUL.
    :ivar errors: one ``{"exception_class_path", "traceback"}`` per failed attempt, oldest first.
    :ivar worker_ids: one worker id per attempt started, oldest first.
    :ivar enqueued_at, started_at, finished_at, last_attempted_at: when it was enqueued, first
        started, finished (SUCCESSFUL or FAILED), last started (the worker's clock, as Django's).
    """

    id = models.CharField(primary_key=True, max_length=200)
    task_path = models.CharField(max_length=TASK_PATH_CHARS)
    queue_name = models.CharField(max_length=100)
    backend = models.CharField(max_length=100)
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    run_after = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=TaskResultStatus.choices, default=TaskResultStatus.READY)
    return_value = models.JSONField(null=True, blank=True)
    errors = models.JSONField(default=list)
    worker_ids = models.JSONField(default=list)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pyqueue_django_task_result"  # also in worker._STARTED
        verbose_name = "task result"
        indexes = [
            models.Index(fields=["status", "queue_name"], name="pyqueue_dj_status_queue"),
            models.Index(fields=["finished_at"], name="pyqueue_dj_finished_at"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} ({self.status})"

    def error_list(self) -> list[dict[str, Any]]:
        """The errors as stored (a list of dicts)."""
        return list(self.errors or [])
