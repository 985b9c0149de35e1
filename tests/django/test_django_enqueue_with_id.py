"""enqueue_with_id, the idempotent enqueue under a caller-chosen id, against the real test server: a
second enqueue returns the first task and offers nothing, a pruned id is a new task, bad ids raise
typed errors, a key held by another producer's message is refused, and two concurrent enqueues of one
id from two connections leave exactly one message and one row."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.core.management import call_command
from django.db import connections, transaction
from django.utils import timezone
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus
from django_tasks.signals import task_enqueued
from tasksapp import tasks

from pyqueue import DelayedQueue, InvalidArgument, ValueTooLong, testing
from pyqueue.contrib.django import enqueue_with_id
from pyqueue.contrib.django.exceptions import ResultIdTaken
from pyqueue.contrib.django.models import TaskResultRecord


def rows(dsn: str, result_id: str) -> tuple[int, int]:
    """(messages with this key in any queue, results rows with this id)."""
    with psycopg.connect(dsn) as c:
        return c.execute("SELECT (SELECT count(*) FROM dq_messages WHERE key = %(k)s), "
                         "(SELECT count(*) FROM pyqueue_django_task_result WHERE id = %(k)s)",
                         {"k": result_id}).fetchone()  # type: ignore[return-value]


def test_a_second_enqueue_returns_the_first_task_and_offers_nothing(django_dsn: str) -> None:
    seen = []
    task_enqueued.connect(receiver := lambda sender, task_result, **kw: seen.append(task_result.id))
    try:
        first = enqueue_with_id(tasks.send_mail, "order-42-mail", "a@example.com", subject="hi")
        again = enqueue_with_id(tasks.send_mail, "order-42-mail", "b@example.com", subject="other")
    finally:
        task_enqueued.disconnect(receiver)
    assert first.id == again.id == "order-42-mail" and seen == ["order-42-mail"]
    assert again.args == ["a@example.com"] and again.kwargs == {"subject": "hi"}
    assert again.status == TaskResultStatus.READY
    assert list(testing.offered(django_dsn, "emails")) == ["order-42-mail"]
    assert rows(django_dsn, "order-42-mail") == (1, 1)
    assert task_backends["default"].get_result("order-42-mail").args == ["a@example.com"]


def test_a_finished_and_pruned_id_is_a_new_task(django_dsn: str) -> None:
    first = enqueue_with_id(tasks.add, "daily-report", 1, 2)
    with DelayedQueue(django_dsn, "default") as q:
        [m] = q.poll(1)
        assert m.ack()
    TaskResultRecord.objects.filter(id=first.id).update(
        status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now() - timedelta(days=30))
    assert enqueue_with_id(tasks.add, "daily-report", 3, 4).status == TaskResultStatus.SUCCESSFUL  # still kept
    call_command("pyqueue_prune_results", verbosity=0)
    again = enqueue_with_id(tasks.add, "daily-report", 3, 4)
    assert again.status == TaskResultStatus.READY and again.args == [3, 4]
    assert rows(django_dsn, "daily-report") == (1, 1)


def test_a_rolled_back_enqueue_leaves_the_id_free(django_dsn: str) -> None:
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        enqueue_with_id(tasks.add, "rolled", 1, 1)
        1 / 0  # noqa: B018
    assert rows(django_dsn, "rolled") == (0, 0)
    assert enqueue_with_id(tasks.add, "rolled", 1, 1).id == "rolled"


@pytest.mark.parametrize(("bad", "error", "sqlstate"), [
    ("", InvalidArgument, "22023"),
    (42, InvalidArgument, "22023"),
    (None, InvalidArgument, "22023"),
    ("k" * 201, ValueTooLong, "22001"),
])
def test_bad_ids_raise_typed_errors(django_dsn: str, bad: object, error: type[Exception], sqlstate: str) -> None:
    with pytest.raises(error, match="result_id") as caught:
        enqueue_with_id(tasks.add, bad, 1, 2)  # type: ignore[arg-type]
    assert caught.value.sqlstate == sqlstate  # type: ignore[attr-defined]
    assert enqueue_with_id(tasks.add, "k" * 200, 1, 2).id == "k" * 200


def test_a_key_held_by_another_producer_is_refused(django_dsn: str) -> None:
    with DelayedQueue(django_dsn, "default") as q:
        q.offer("foreign", {"not": "a task"})
    with pytest.raises(ResultIdTaken):
        enqueue_with_id(tasks.add, "foreign", 1, 2)
    assert rows(django_dsn, "foreign") == (1, 0)


def test_two_concurrent_enqueues_of_one_id_make_one_message_and_one_row(django_dsn: str) -> None:
    inside, go_on = threading.Event(), threading.Event()
    results: dict[str, str] = {}

    def first() -> None:
        try:
            with transaction.atomic():  # holds the new row, uncommitted, while the second one tries
                results["first"] = enqueue_with_id(tasks.add, "same", 1, 1).id
                inside.set()
                go_on.wait(10)
        finally:
            connections.close_all()

    def second() -> None:
        try:
            results["second"] = enqueue_with_id(tasks.add, "same", 2, 2).args.__repr__()
        finally:
            connections.close_all()

    a = threading.Thread(target=first)
    a.start()
    assert inside.wait(10)
    b = threading.Thread(target=second)
    b.start()
    b.join(0.5)
    assert b.is_alive()  # waits on the first one's row
    go_on.set()
    a.join(10)
    b.join(10)
    assert results == {"first": "same", "second": "[1, 1]"}  # the second got the first's task
    assert rows(django_dsn, "same") == (1, 1)
