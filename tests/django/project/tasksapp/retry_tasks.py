"""Tasks with their own retry policy (pyqueue.contrib.django.retries), for tests/django/test_django_retries.py.
Each logs its attempts to ``tasks_log`` as the tasks of tasks.py do."""

from datetime import timedelta
from typing import Any

from django.db import connection
from django_tasks import task

from pyqueue.contrib.django.retries import retry

from .tasks import log


def ok_logged(name: str, value: str) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM tasks_log WHERE name = %s AND value = %s", [name, value])
        return bool(cur.fetchone()[0])


@retry(max_attempts=2)
@task()
def picky(name: str) -> str:
    """Fails until the test logs ``("picky_ok", name)``; two attempts, then FAILED."""
    log("picky", name)
    if not ok_logged("picky_ok", name):
        raise RuntimeError(f"{name} is not ok yet")
    return name


def never(exception: BaseException, task_result: Any) -> None:
    return None


@task()
def hopeless(name: str) -> None:
    log("hopeless", name)
    raise PermissionError(name)


retry(backoff=never)(hopeless)  # the decorator's other form: applied to the Task afterwards


def ten_seconds_per_error(exception: BaseException, task_result: Any) -> timedelta | None:
    """10 s per error recorded so far (this attempt's included), for a ValueError; else give up."""
    if not isinstance(exception, ValueError) or task_result.status != "FAILED":
        return None
    return timedelta(seconds=10 * len(task_result.errors))


@retry(max_attempts=5, backoff=ten_seconds_per_error)
@task()
def later(name: str) -> None:
    log("later", name)
    raise ValueError(name)
