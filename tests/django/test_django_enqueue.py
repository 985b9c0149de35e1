"""DelayedQueueBackend.enqueue and get_result against the real test server: the message offered on
Django's own connection (committed, rolled back, delayed, prioritised) and the results row read back."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import transaction
from django.utils import timezone
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
from django_tasks.signals import task_enqueued
from tasksapp import tasks

from pyqueue import testing
from pyqueue.contrib.django import DelayedQueueBackend
from pyqueue.contrib.django.backend import PAYLOAD_VERSION


def test_backend_is_ours_and_honest(django_dsn: str) -> None:
    b = task_backends["default"]
    assert isinstance(b, DelayedQueueBackend)
    assert (b.supports_defer, b.supports_async_task, b.supports_get_result, b.supports_priority) == (
        True, True, True, True)


def test_enqueue_offers_a_message_with_the_result_id_as_key(django_dsn: str) -> None:
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3] and result.kwargs == {}
    offered = testing.offered(django_dsn, "default")
    assert list(offered) == [result.id]
    with psycopg.connect(django_dsn) as c:
        payload, priority = c.execute(
            "SELECT convert_from(payload, 'UTF8')::jsonb, priority FROM dq_messages WHERE key = %s",
            (result.id,)).fetchone()
    assert payload == {"v": PAYLOAD_VERSION, "task": "tasksapp.tasks.add", "args": [2, 3], "kwargs": {},
                       "backend": "default"}
    assert priority == 0


def test_queue_name_and_priority_are_the_message_s(django_dsn: str) -> None:
    result = tasks.send_mail.enqueue("a@example.com", subject="hi")
    low = tasks.send_mail.using(priority=-100).enqueue("b@example.com")
    with psycopg.connect(django_dsn) as c:
        rows = dict(c.execute("SELECT key, priority FROM dq_messages WHERE queue = 'emails'").fetchall())
    assert rows == {result.id: 10, low.id: -100}


def test_rollback_leaves_no_task_and_commit_makes_it_visible(django_dsn: str) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        rolled_back = tasks.add.enqueue(1, 1)
        raise Abort
    with transaction.atomic():
        committed = tasks.add.enqueue(1, 2)
        with psycopg.connect(django_dsn) as other:  # not visible to another session before the commit
            assert other.execute("SELECT count(*) FROM dq_messages").fetchone() == (0,)
    assert list(testing.offered(django_dsn, "default")) == [committed.id]
    with pytest.raises(TaskResultDoesNotExist):
        task_backends['default'].get_result(rolled_back.id)
    assert task_backends['default'].get_result(committed.id).status == TaskResultStatus.READY


def test_run_after_is_the_due_time(django_dsn: str) -> None:
    due = timezone.now() + timedelta(hours=2)
    result = tasks.add.using(run_after=due).enqueue(1, 2)
    with psycopg.connect(django_dsn) as c:
        (scheduled_at,) = c.execute("SELECT scheduled_at FROM dq_messages WHERE key = %s", (result.id,)).fetchone()
    assert scheduled_at == due
    assert task_backends['default'].get_result(result.id).task.run_after == due


def test_get_result_reads_the_row_back(django_dsn: str) -> None:
    result = tasks.send_mail.enqueue("a@example.com", subject="hi")
    again = tasks.send_mail.get_result(result.id)
    assert (again.id, again.status, again.args, again.kwargs, again.backend) == (
        result.id, TaskResultStatus.READY, ["a@example.com"], {"subject": "hi"}, "default")
    assert again.task.queue_name == "emails" and again.task.priority == 10
    assert again.enqueued_at is not None and again.errors == [] and again.worker_ids == []
    with pytest.raises(ValueError):
        again.return_value  # noqa: B018 - not finished yet


def test_unknown_id_raises_task_result_does_not_exist(django_dsn: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends['default'].get_result("no-such-id")


def test_validate_task_as_the_base_class(django_dsn: str) -> None:
    with pytest.raises(InvalidTaskError):
        tasks.add.using(queue_name="not-configured")
    with pytest.raises(InvalidTaskError):
        tasks.add.using(priority=101)


def test_task_enqueued_fires_with_the_result(django_dsn: str) -> None:
    seen = []

    def receiver(sender: type, task_result: object, **kwargs: object) -> None:
        seen.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        result = tasks.add.enqueue(4, 5)
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [(DelayedQueueBackend, result)]


def test_async_task_enqueues_and_aenqueue_works(django_dsn: str) -> None:
    import asyncio

    result = tasks.async_add.enqueue(1, 2)
    assert result.status == TaskResultStatus.READY
    later = asyncio.run(tasks.add.aenqueue(3, 4))
    assert set(testing.offered(django_dsn, "default")) == {result.id, later.id}
