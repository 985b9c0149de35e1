"""``python manage.py pyqueue_prune_results [--backend default] [--older-than SECONDS]``: delete the rows
of finished tasks (SUCCESSFUL or FAILED) that finished longer ago than the retention, from the results
table of the backend's ``DATABASE``. The retention is ``--older-than``, else the backend's
``OPTIONS["RESULT_RETENTION"]`` (seconds or a timedelta), else 7 days. READY and RUNNING tasks are never
deleted. Prints how many rows were deleted. Run it from cron, or schedule the same DELETE with pg_cron."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ...backend import DelayedQueueBackend
from ...compat import TaskResultStatus, task_backends
from ...models import TaskResultRecord

#: The retention of finished results when neither the command nor the backend's OPTIONS names one.
DEFAULT_RESULT_RETENTION = timedelta(days=7)


def retention_of(backend: DelayedQueueBackend) -> timedelta:
    """The backend's ``OPTIONS["RESULT_RETENTION"]`` as a timedelta (default 7 days).

    :raises CommandError: not a positive number of seconds or timedelta.
    """
    value = backend.options.get("RESULT_RETENTION", DEFAULT_RESULT_RETENTION)
    found = value if isinstance(value, timedelta) else timedelta(seconds=float(value))
    if found <= timedelta(0):
        raise CommandError(f"RESULT_RETENTION must be more than 0 seconds, got {value!r}")
    return found


def prune_results(backend: DelayedQueueBackend, older_than: timedelta) -> int:
    """Delete the finished results of ``backend`` whose ``finished_at`` is more than ``older_than``
    ago (Django's clock); returns how many rows were deleted."""
    before = timezone.now() - older_than
    deleted, _ = TaskResultRecord.objects.using(backend.database).filter(
        status__in=[TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED], finished_at__lt=before,
        backend=backend.alias).delete()
    return int(deleted)


class Command(BaseCommand):
    help = "Delete the results of tasks that finished longer ago than the retention."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias of a DelayedQueueBackend")
        parser.add_argument("--older-than", type=float, default=None,
                            help="seconds since a task finished (default: OPTIONS['RESULT_RETENTION'], else 7 days)")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = task_backends[options["backend"]]
        if not isinstance(backend, DelayedQueueBackend):
            raise CommandError(f"TASKS[{options['backend']!r}] is not a DelayedQueueBackend")
        if options["older_than"] is not None:
            if not options["older_than"] > 0:
                raise CommandError("--older-than must be more than 0 seconds")
            older_than = timedelta(seconds=options["older_than"])
        else:
            older_than = retention_of(backend)
        self.stdout.write(f"pyqueue_prune_results: {prune_results(backend, older_than)} deleted")
