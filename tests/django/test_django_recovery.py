"""What happens to a task after its worker died (SIGKILL mid-task, a real process) and after its
message was dead-lettered and redriven: READY again, and run again with the attempt counted."""

from __future__ import annotations

import signal
from datetime import timedelta

import psycopg
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus
from djangohelpers import log_rows, start_command, wait_for, wait_for_status, worker_thread
from tasksapp import tasks

from pyqueue import Backoff, DelayedQueue, testing


def test_a_worker_killed_mid_task_leaves_it_running_until_its_lock_expires(django_dsn: str) -> None:
    result = tasks.crash_once.enqueue("k")
    first = start_command(django_dsn, "--queue", "slow", "--lock-timeout", "1.5", "--idle-check", "0.2")
    try:
        wait_for(lambda: log_rows(django_dsn, "crash_once"), what="the first attempt")
        assert task_backends["default"].get_result(result.id).status == TaskResultStatus.RUNNING
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()
        first.communicate(timeout=30)
    # No worker runs now: once the lock expires (the heartbeat is dead), the task is READY again.
    ready = wait_for_status(result.id, TaskResultStatus.READY, timeout=10)
    assert ready.attempts == 1 and ready.finished_at is None
    second = start_command(django_dsn, "--queue", "slow", "--idle-check", "0.2")
    try:
        done = wait_for_status(result.id, TaskResultStatus.SUCCESSFUL)
    finally:
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out
    assert done.return_value == 2 and done.attempts == 2 and done.errors == []
    assert len(set(done.worker_ids)) == 2  # two processes, each recorded
    assert [v for v, _ in log_rows(django_dsn, "crash_once")] == ["k:1", "k:2"]
    assert [pid for _, pid in log_rows(django_dsn, "crash_once")] == [first.pid, second.pid]
    assert testing.offered(django_dsn, "slow") == {}


def test_a_redriven_failed_task_is_ready_and_runs_again(django_dsn: str) -> None:
    with DelayedQueue(django_dsn, "default") as q:
        q.configure(max_deliveries=1, dead_letter_queue="default.dead")
    result = tasks.flaky.enqueue("x")
    fast = Backoff(base=timedelta(milliseconds=50), cap=timedelta(milliseconds=50), jitter=0)
    with worker_thread("default", backoff=fast):
        failed = wait_for_status(result.id, TaskResultStatus.FAILED)
    assert len(failed.errors) == 1 and failed.finished_at is not None
    with psycopg.connect(django_dsn, autocommit=True) as c:
        c.execute("INSERT INTO tasks_log (name, value) VALUES ('flaky_ok', 'x')")
    with DelayedQueue(django_dsn, "default.dead") as dead:
        assert dead.redrive() == 1
    ready = task_backends["default"].get_result(result.id)
    assert ready.status == TaskResultStatus.READY
    with worker_thread("default", backoff=fast):
        done = wait_for_status(result.id, TaskResultStatus.SUCCESSFUL)
    assert done.return_value == "x" and done.attempts == 2 and len(done.errors) == 1
    assert done.finished_at is not None and done.finished_at > failed.finished_at


def test_prune_results_deletes_only_finished_rows_past_the_retention(django_dsn: str) -> None:
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    from pyqueue.contrib.django.models import TaskResultRecord

    old, recent, ready = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2), tasks.add.enqueue(3, 3)
    TaskResultRecord.objects.filter(id=old.id).update(
        status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now() - timedelta(days=8))
    TaskResultRecord.objects.filter(id=recent.id).update(
        status=TaskResultStatus.FAILED, finished_at=timezone.now() - timedelta(days=6))
    TaskResultRecord.objects.filter(id=ready.id).update(enqueued_at=timezone.now() - timedelta(days=30))
    out = StringIO()
    call_command("pyqueue_prune_results", stdout=out)
    assert out.getvalue().strip() == "pyqueue_prune_results: 1 deleted"
    assert set(TaskResultRecord.objects.values_list("id", flat=True)) == {recent.id, ready.id}
    call_command("pyqueue_prune_results", "--older-than", str(5 * 86400), stdout=out)
    assert set(TaskResultRecord.objects.values_list("id", flat=True)) == {ready.id}
