"""What django-tasks-db's backend tests (DatabaseBackendTestCase, 0.12.0) check, asked of ours where their
own test cannot be (it reads their model or counts their queries; scripts/run-django-tasks-suite.sh runs
them): a result refreshes in place from the worker's record, get_result equals what enqueue returned,
and an id of no task raises TaskResultDoesNotExist, synchronously and asynchronously."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus
from django_tasks.exceptions import TaskResultDoesNotExist
from djangohelpers import wait_for_status, worker_thread
from tasksapp import tasks


def test_refresh_reads_the_worker_s_record_into_the_result(django_dsn: str) -> None:
    result = tasks.add.enqueue(40, 2)
    assert result.status == TaskResultStatus.READY and result.attempts == 0 and result.started_at is None
    with worker_thread("default"):
        wait_for_status(result.id, TaskResultStatus.SUCCESSFUL)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished and result.return_value == 42
    assert result.started_at is not None and result.finished_at is not None and result.last_attempted_at is not None
    assert result.attempts == 1
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


def test_get_result_equals_what_enqueue_returned(django_dsn: str) -> None:
    backend = task_backends["default"]
    result = backend.enqueue(tasks.add, [1], {"b": 2})
    assert backend.get_result(result.id) == result
    assert async_to_sync(backend.aget_result)(result.id) == result


@pytest.mark.parametrize("result_id", ["123", "0" * 32, "a" * 200])
def test_an_id_of_no_task_raises_does_not_exist(django_dsn: str, result_id: str) -> None:
    backend = task_backends["default"]
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(backend.aget_result)(result_id)
