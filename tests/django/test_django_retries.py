"""A task's own retry policy (pyqueue.contrib.django.retries) with a real worker: ``max_attempts``
below the queue's ``max_deliveries`` ends in FAILED and a dead letter, a ``backoff`` that returns None
gives up at once, a backoff's delay is the message's due time, redrive runs the task again, the queue's
limit wins over a larger ``max_attempts``, a queue without a dead-letter queue, and a worker killed by
SIGKILL on the queue's last delivery."""

from __future__ import annotations

import signal
from datetime import timedelta

import psycopg
import pytest
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus
from djangohelpers import log_rows, start_command, wait_for, wait_for_status, worker_thread
from tasksapp import retry_tasks, tasks

from pyqueue import Backoff, DelayedQueue, InvalidArgument, testing
from pyqueue.contrib.django.retries import RetryPolicy, policy_for, retry

FAST = Backoff(base=timedelta(milliseconds=50), cap=timedelta(milliseconds=50), jitter=0)


def configure(dsn: str, queue: str, max_deliveries: int) -> None:
    with DelayedQueue(dsn, queue) as q:
        q.configure(max_deliveries=max_deliveries, dead_letter_queue=f"{queue}.dead")


def dead_letters(dsn: str, queue: str) -> list[tuple[str, str, int, str]]:
    """(key, dead_from, dead_delivery_count, last_error) of the dead letters of ``queue``."""
    with psycopg.connect(dsn) as c:
        return [tuple(r) for r in c.execute(  # type: ignore[misc]
            "SELECT key, dead_from, dead_delivery_count, last_error FROM dq_messages "
            "WHERE queue = %s AND dead_from IS NOT NULL ORDER BY id", (queue,))]


def test_max_attempts_below_the_queues_limit_fails_and_dead_letters(django_dsn: str) -> None:
    configure(django_dsn, "default", 10)
    result = retry_tasks.picky.enqueue("a")
    with worker_thread("default", backoff=FAST):
        failed = wait_for_status(result.id, TaskResultStatus.FAILED)
    assert failed.attempts == 2 and len(failed.errors) == 2 and failed.finished_at is not None
    assert failed.errors[-1].exception_class_path == "builtins.RuntimeError"
    assert [v for v, _ in log_rows(django_dsn, "picky")] == ["a", "a"]
    assert dead_letters(django_dsn, "default.dead") == [(result.id, "default", 2, "RuntimeError: a is not ok yet")]
    assert testing.offered(django_dsn, "default") == {}


def test_a_backoff_returning_none_gives_up_at_once(django_dsn: str) -> None:
    configure(django_dsn, "default", 10)
    finished: list[str] = []

    def on_finished(sender: object, task_result: object, **kwargs: object) -> None:
        finished.append(task_result.status)  # type: ignore[attr-defined]

    from django_tasks.signals import task_finished
    task_finished.connect(on_finished)
    try:
        result = retry_tasks.hopeless.enqueue("b")
        with worker_thread("default", backoff=FAST):
            failed = wait_for_status(result.id, TaskResultStatus.FAILED)
    finally:
        task_finished.disconnect(on_finished)
    assert failed.attempts == 1 and [e.exception_class_path for e in failed.errors] == ["builtins.PermissionError"]
    assert finished == [TaskResultStatus.FAILED]
    assert dead_letters(django_dsn, "default.dead") == [(result.id, "default", 1, "PermissionError: b")]


def test_the_backoffs_delay_is_the_messages_due_time(django_dsn: str) -> None:
    """The backoff saw this attempt's error (10 s per error): the nack made the message due 10 s
    after the error was recorded, both times read from the database."""
    configure(django_dsn, "default", 10)
    result = retry_tasks.later.enqueue("c")
    with worker_thread("default"):
        ready = wait_for(lambda: (r := task_backends["default"].get_result(result.id)).errors
                         and r.status == TaskResultStatus.READY and r, what="the first failure")
    assert len(ready.errors) == 1
    with psycopg.connect(django_dsn) as c:
        due, error_at, locked = c.execute(
            "SELECT scheduled_at, last_error_at, lock_token IS NOT NULL FROM dq_messages WHERE key = %s",
            (result.id,)).fetchone()
    assert not locked and due - error_at == timedelta(seconds=10)


def test_a_redriven_task_runs_again_and_appends_to_its_errors(django_dsn: str) -> None:
    configure(django_dsn, "default", 10)
    result = retry_tasks.picky.enqueue("d")
    with worker_thread("default", backoff=FAST):
        failed = wait_for_status(result.id, TaskResultStatus.FAILED)
        with psycopg.connect(django_dsn, autocommit=True) as c:
            c.execute("INSERT INTO tasks_log (name, value) VALUES ('picky_ok', 'd')")
        with DelayedQueue(django_dsn, "default.dead") as dead:
            assert dead.redrive() == 1
        done = wait_for_status(result.id, TaskResultStatus.SUCCESSFUL)
    assert done.return_value == "d" and done.attempts == 3 and len(done.errors) == 2
    assert done.finished_at is not None and done.finished_at > failed.finished_at
    assert dead_letters(django_dsn, "default.dead") == []


def test_the_queues_max_deliveries_wins_over_a_larger_max_attempts(django_dsn: str) -> None:
    configure(django_dsn, "default", 1)
    result = retry_tasks.picky.enqueue("e")  # max_attempts 2
    with worker_thread("default", backoff=FAST):
        failed = wait_for_status(result.id, TaskResultStatus.FAILED)
    assert failed.attempts == 1
    assert dead_letters(django_dsn, "default.dead") == [(result.id, "default", 1, "RuntimeError: e is not ok yet")]


def test_without_a_dead_letter_queue_a_task_that_gives_up_is_failed_and_its_message_deleted(
        django_dsn: str) -> None:
    result = retry_tasks.picky.enqueue("f")
    with worker_thread("default", backoff=FAST):
        failed = wait_for_status(result.id, TaskResultStatus.FAILED)
    assert failed.attempts == 2 and failed.finished_at is not None
    assert testing.offered(django_dsn, "default") == {}
    with psycopg.connect(django_dsn) as c:
        assert c.execute("SELECT count(*) FROM dq_messages").fetchone() == (0,)


def test_a_worker_killed_on_the_last_delivery_leaves_the_task_failed(django_dsn: str) -> None:
    """The queue allows one delivery; its worker dies mid-task (SIGKILL). The lock expires, the next
    worker's poll dead-letters the message without running it, and get_result says FAILED (the row
    still says RUNNING: no worker saw the attempt end)."""
    configure(django_dsn, "slow", 1)
    result = tasks.crash_once.enqueue("k")
    first = start_command(django_dsn, "--queue", "slow", "--lock-timeout", "1.5", "--idle-check", "0.2")
    try:
        wait_for(lambda: log_rows(django_dsn, "crash_once"), what="the first attempt")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()
        first.communicate(timeout=30)
    second = start_command(django_dsn, "--queue", "slow", "--idle-check", "0.2")
    try:
        failed = wait_for_status(result.id, TaskResultStatus.FAILED, timeout=30)
    finally:
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out
    assert failed.attempts == 1 and failed.finished_at is None
    assert [v for v, _ in log_rows(django_dsn, "crash_once")] == ["k:1"]
    [(key, dead_from, count, error)] = dead_letters(django_dsn, "slow.dead")
    assert (key, dead_from, count) == (result.id, "slow", 1) and error.startswith("lock expired")
    from pyqueue.contrib.django.models import TaskResultRecord
    assert TaskResultRecord.objects.get(id=result.id).status == TaskResultStatus.RUNNING


def test_policies_come_from_the_task_then_the_backends_options() -> None:
    assert policy_for("tasksapp.retry_tasks.picky", {}) == RetryPolicy(2, None)
    assert policy_for("tasksapp.retry_tasks.hopeless", {"MAX_ATTEMPTS": 4}) == RetryPolicy(4, retry_tasks.never)
    assert policy_for("tasksapp.tasks.add", {"MAX_ATTEMPTS": 3, "BACKOFF": "tasksapp.retry_tasks.never"}) == (
        RetryPolicy(3, retry_tasks.never))
    assert policy_for("tasksapp.tasks.add", {}) == RetryPolicy()
    for bad in ({"max_attempts": 0}, {"max_attempts": True}, {"backoff": 5}):
        with pytest.raises(InvalidArgument):
            retry(**bad)  # type: ignore[arg-type]
