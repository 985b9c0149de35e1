"""The Tasks API of the running Django: ``django.tasks`` (Django 6) when present, else the
``django-tasks`` backport (Django 5.2). Everything the backend needs from it, under one set of names."""

from __future__ import annotations

try:  # Django 6.0+
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.tasks.utils import normalize_json

    TASKS_MODULE = "django.tasks"
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    TASKS_MODULE = "django_tasks"

__all__ = [
    "TASKS_MODULE", "BaseTaskBackend", "Task", "TaskContext", "TaskError", "TaskResult", "TaskResultDoesNotExist",
    "TaskResultStatus", "normalize_json", "task_backends", "task_enqueued", "task_finished", "task_started",
]
