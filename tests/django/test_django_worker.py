"""The worker of pyqueue.contrib.django (TaskRunner, DjangoConnections, manage.py pyqueue_worker) against
the real test server: tasks run, results and signals recorded, async tasks awaited, failures retried then
FAILED and dead-lettered, and results read back from another process."""

from __future__ import annotations

import signal
from datetime import timedelta

import psycopg
from django.db import connections
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus
from django_tasks.signals import task_finished, task_started
from djangohelpers import log_rows, start_command, wait_for, wait_for_status, worker_thread
from tasksapp import tasks

from pyqueue import Backoff, DelayedQueue, testing
from pyqueue.contrib.django.worker import DjangoConnections, TaskRunner, conninfo

FAST = Backoff(base=timedelta(milliseconds=50), cap=timedelta(milliseconds=50), jitter=0)


def test_conninfo_is_django_s_database(django_dsn: str) -> None:
    with psycopg.connect(conninfo("default")) as c, psycopg.connect(django_dsn) as d:
        assert c.execute("SELECT current_database()").fetchone() == d.execute(
            "SELECT current_database()").fetchone()


def test_a_task_runs_and_its_result_is_recorded(django_dsn: str) -> None:
    events: list[tuple[str, str, str]] = []

    def started(sender: type, task_result: object, **kwargs: object) -> None:
        events.append(("started", task_result.id, task_result.status))  # type: ignore[attr-defined]

    def finished(sender: type, task_result: object, **kwargs: object) -> None:
        events.append(("finished", task_result.id, task_result.status))  # type: ignore[attr-defined]

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        result = tasks.add.enqueue(2, 3)
        with worker_thread("default", concurrency=2):
            done = wait_for_status(result.id, TaskResultStatus.SUCCESSFUL)
            wait_for(lambda: len(events) == 2, what="both signals")
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert done.return_value == 5
    assert done.started_at is not None and done.finished_at is not None and done.last_attempted_at is not None
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert len(done.worker_ids) == 1 and done.attempts == 1 and done.errors == []
    assert events == [("started", result.id, TaskResultStatus.RUNNING),
                      ("finished", result.id, TaskResultStatus.SUCCESSFUL)]
    assert testing.offered(django_dsn, "default") == {}  # acknowledged with the result


def test_each_queue_has_its_worker(django_dsn: str) -> None:
    mail = tasks.send_mail.enqueue("a@example.com", subject="hi")
    add = tasks.add.enqueue(1, 1)
    with worker_thread("emails"):
        done = wait_for_status(mail.id, TaskResultStatus.SUCCESSFUL)
    assert done.return_value == {"to": "a@example.com", "subject": "hi"}
    assert task_backends["default"].get_result(add.id).status == TaskResultStatus.READY


def test_an_async_task_is_awaited(django_dsn: str) -> None:
    result = tasks.async_add.enqueue(20, 22)
    with worker_thread("default"):
        assert wait_for_status(result.id, TaskResultStatus.SUCCESSFUL).return_value == 42


def test_a_failing_task_is_retried_then_failed_and_dead_lettered(django_dsn: str) -> None:
    with DelayedQueue(django_dsn, "default") as q:
        q.configure(max_deliveries=3, dead_letter_queue="default.dead")
    result = tasks.fail.enqueue("boom")
    with worker_thread("default", backoff=FAST):
        failed = wait_for_status(result.id, TaskResultStatus.FAILED)
    assert [e.exception_class_path for e in failed.errors] == ["builtins.ValueError"] * 3
    assert "ValueError: boom" in failed.errors[-1].traceback
    assert failed.errors[-1].exception_class is ValueError
    assert failed.attempts == 3 and failed.finished_at is not None
    assert [v for v, _ in log_rows(django_dsn, "fail")] == ["boom"] * 3
    assert testing.offered(django_dsn, "default") == {}
    with DelayedQueue(django_dsn, "default.dead") as dead:
        [row] = dead.dead_letters()
    assert row["key"] == result.id and "ValueError: boom" in row["last_error"]


def test_a_retried_task_is_ready_between_attempts(django_dsn: str) -> None:
    result = tasks.fail.enqueue("once")
    with worker_thread("default", backoff=Backoff(base=timedelta(hours=1), cap=timedelta(hours=1), jitter=0)):
        wait_for(lambda: task_backends["default"].get_result(result.id).errors, what="the first error")
    again = wait_for_status(result.id, TaskResultStatus.READY)
    assert again.attempts == 1 and len(again.errors) == 1 and again.finished_at is None


def test_the_runner_closes_django_connections_around_each_task(django_dsn: str) -> None:
    assert isinstance(DjangoConnections(), DjangoConnections)
    result = tasks.add.enqueue(1, 2)
    with worker_thread("default", concurrency=1) as worker:
        assert isinstance(worker.handler, TaskRunner)
        wait_for_status(result.id, TaskResultStatus.SUCCESSFUL)
        connections.close_all()  # this thread's; the handler thread's was closed by DjangoConnections
        with psycopg.connect(django_dsn) as c:
            wait_for(lambda: c.execute(
                "SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = '' AND pid <> pg_backend_pid() AND state = 'idle' "
                "AND query LIKE '%pyqueue_django_task_result%'").fetchone()[0], 10, "no idle Django connection")


def test_manage_py_pyqueue_worker_runs_tasks_read_back_here(django_dsn: str) -> None:
    result = tasks.add.enqueue(40, 2)
    proc = start_command(django_dsn, "--queue", "default", "--concurrency", "2", "--idle-check", "0.2")
    try:
        done = wait_for_status(result.id, TaskResultStatus.SUCCESSFUL)
        later = tasks.add.enqueue(1, 1)  # woken by NOTIFY, read back from this process
        assert wait_for_status(later.id, TaskResultStatus.SUCCESSFUL).return_value == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert done.return_value == 42
    [(_, pid)] = log_rows(django_dsn, "add")[:1]
    assert pid == proc.pid
    assert "pyqueue_worker: queue default, concurrency 2" in out


def test_the_running_statement_names_the_results_table() -> None:
    from pyqueue.contrib.django.models import TaskResultRecord
    from pyqueue.contrib.django.worker import _STARTED

    assert _STARTED.split()[:2] == ["UPDATE", TaskResultRecord._meta.db_table]
