"""The task results in Django's admin (pyqueue.contrib.django.admin) through Django's test client as a
logged-in user, against the real test server: the list and its filters, the detail page, the retry of
a FAILED task (dead-lettered, or with no message left) then run by a real worker, the cancel of a
READY task and the refusal of a held one, a redrive racing on another connection, and the change
permission the actions need."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html import unescape

import psycopg
import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import transaction
from django.test import Client
from django_tasks import task_backends
from django_tasks.base import TaskResultStatus
from djangohelpers import wait_for_status, worker_thread
from tasksapp import tasks

from pyqueue import Backoff, DelayedQueue, testing
from pyqueue.contrib.django.admin import RetryOutcome, retry_task
from pyqueue.contrib.django.backend import task_payload
from pyqueue.contrib.django.exceptions import TaskCancelled
from pyqueue.contrib.django.models import TaskResultRecord

LIST = "/admin/pyqueue_django/taskresultrecord/"
FAST = Backoff(base=timedelta(milliseconds=50), cap=timedelta(milliseconds=50), jitter=0)


@pytest.fixture
def client(django_dsn: str) -> Client:
    c = Client()
    c.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return c


def act(client: Client, action: str, *ids: str) -> list[str]:
    """POST ``action`` on ``ids`` from the list; the messages the admin shows after it."""
    response = client.post(LIST, {"action": action, "_selected_action": list(ids), "index": 0}, follow=True)
    assert response.status_code == 200
    return shown(response.content.decode())


def shown(html: str) -> list[str]:
    """The texts of the messages framework's list on an admin page."""
    listed = re.search(r'<ul class="messagelist">(.*?)</ul>', html, re.S)
    return [unescape(m) for m in re.findall(r"<li[^>]*>(.*?)</li>", listed.group(1), re.S)] if listed else []


def keys_with(dsn: str, key: str) -> list[tuple[str, bool]]:
    """(queue, is a dead letter) of every message with ``key``."""
    with psycopg.connect(dsn) as c:
        return [(q, d) for q, d in c.execute(
            "SELECT queue, dead_from IS NOT NULL FROM dq_messages WHERE key = %s ORDER BY queue", (key,))]


def dead_lettered(dsn: str, name: str) -> str:
    """The id of a ``flaky`` task run by a worker until FAILED (max_deliveries 1, dead-letter queue)."""
    with DelayedQueue(dsn, "default") as q:
        q.configure(max_deliveries=1, dead_letter_queue="default.dead")
    result = tasks.flaky.enqueue(name)
    with worker_thread("default", backoff=FAST):
        wait_for_status(result.id, TaskResultStatus.FAILED)
    assert keys_with(dsn, result.id) == [("default.dead", True)]
    return result.id


def test_the_list_renders_with_its_filters_and_filters_by_status(django_dsn: str, client: Client) -> None:
    ready = tasks.add.enqueue(1, 2)
    mail = tasks.send_mail.enqueue("a@example.com", subject="hi")
    TaskResultRecord.objects.filter(id=mail.id).update(status=TaskResultStatus.FAILED)
    page = client.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    assert ready.id in html and mail.id in html
    for heading in ("By status", "By queue name", "By task path"):
        assert heading in html
    assert "Retry the selected FAILED tasks" in html and "Cancel the selected READY tasks" in html
    failed = client.get(LIST, {"status__exact": "FAILED"}).content.decode()
    assert mail.id in failed and ready.id not in failed
    assert ready.id in client.get(LIST, {"q": ready.id}).content.decode()


def test_the_detail_page_shows_arguments_and_errors_read_only(django_dsn: str, client: Client) -> None:
    result = tasks.send_mail.enqueue("a@example.com", subject="<hi>")
    TaskResultRecord.objects.filter(id=result.id).update(errors=[
        {"exception_class_path": "builtins.ValueError", "traceback": "Traceback ...\nValueError: boom\n"}])
    page = client.get(f"{LIST}{result.id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "&quot;subject&quot;: &quot;&lt;hi&gt;&quot;" in html  # kwargs as indented JSON, escaped
    assert "builtins.ValueError" in html and "ValueError: boom" in html
    assert 'name="status"' not in html and 'name="_save"' not in html  # no editable field, no save button
    assert client.get(f"{LIST}add/").status_code == 403


def test_retry_a_dead_lettered_task_then_a_worker_runs_it(django_dsn: str, client: Client) -> None:
    key = dead_lettered(django_dsn, "r1")
    tasks.log("flaky_ok", "r1")
    assert act(client, "retry_tasks", key) == ["1 retried"]
    assert keys_with(django_dsn, key) == [("default", False)]  # the dead letter went back, nothing else
    assert TaskResultRecord.objects.get(id=key).status == TaskResultStatus.READY
    assert LogEntry.objects.get(object_id=key).get_change_message() == "Retried (redriven)."
    with worker_thread("default", backoff=FAST):
        done = wait_for_status(key, TaskResultStatus.SUCCESSFUL)
    assert done.return_value == "r1" and done.attempts == 2 and len(done.errors) == 1


def test_retry_with_no_message_left_offers_it_again_from_the_row(django_dsn: str, client: Client) -> None:
    result = tasks.send_mail.enqueue("a@example.com", subject="again")
    with DelayedQueue(django_dsn, "emails") as q:
        assert q.cancel(result.id)
    TaskResultRecord.objects.filter(id=result.id).update(status=TaskResultStatus.FAILED)
    assert act(client, "retry_tasks", result.id) == [
        "1 retried, 1 of them offered again from their row (no dead letter left)"]
    offered = testing.offered(django_dsn, "emails")
    assert list(offered) == [result.id]
    assert json.loads(offered[result.id]["payload"]) == task_payload(
        tasks.send_mail, ["a@example.com"], {"subject": "again"}, "default")
    assert task_backends["default"].get_result(result.id).status == TaskResultStatus.READY


def test_retry_racing_a_redrive_on_another_connection_makes_one_message(django_dsn: str, client: Client) -> None:
    key = dead_lettered(django_dsn, "race")
    with psycopg.connect(django_dsn) as console:  # the console's redrive, not committed yet
        assert console.execute("SELECT dq_redrive('default.dead')").fetchone() == (1,)
        assert retry_task(key) is RetryOutcome.BUSY  # its dead letter is locked: skipped, not offered again
        assert TaskResultRecord.objects.get(id=key).status == TaskResultStatus.FAILED
        console.commit()
    assert keys_with(django_dsn, key) == [("default", False)]
    assert act(client, "retry_tasks", key) == ["1 retried"]  # already back in its queue: the row follows
    assert keys_with(django_dsn, key) == [("default", False)]
    assert TaskResultRecord.objects.get(id=key).status == TaskResultStatus.READY
    with psycopg.connect(django_dsn) as console:  # and the other way round: the admin's retry first
        TaskResultRecord.objects.filter(id=key).update(status=TaskResultStatus.FAILED)
        with DelayedQueue(django_dsn, "default") as q:
            [m] = q.poll(1)
            m.nack()  # max_deliveries 1: dead-lettered again
        assert keys_with(django_dsn, key) == [("default.dead", True)]
        with transaction.atomic():  # the admin's retry not committed yet: the console's redrive skips it
            assert retry_task(key) is RetryOutcome.REDRIVEN
            assert console.execute("SELECT dq_redrive('default.dead')").fetchone() == (0,)
        console.commit()
    assert keys_with(django_dsn, key) == [("default", False)]


def test_cancel_a_ready_task(django_dsn: str, client: Client) -> None:
    result = tasks.add.enqueue(1, 2)
    kept = tasks.add.enqueue(3, 4)
    assert act(client, "cancel_tasks", result.id) == ["1 cancelled"]
    assert list(testing.offered(django_dsn, "default")) == [kept.id]
    cancelled = task_backends["default"].get_result(result.id)
    assert cancelled.status == TaskResultStatus.FAILED and cancelled.finished_at is not None
    assert cancelled.errors[-1].exception_class is TaskCancelled
    assert "cancelled before it ran by root" in cancelled.errors[-1].traceback
    assert act(client, "cancel_tasks", result.id) == ["0 cancelled, 1 not READY"]


def test_cancel_of_a_held_task_is_refused(django_dsn: str, client: Client) -> None:
    result = tasks.add.enqueue(1, 2)
    with DelayedQueue(django_dsn, "default") as q:
        [m] = q.poll(1, lock_timeout=timedelta(hours=1))  # a worker holds it (READY or RUNNING row alike)
        assert act(client, "cancel_tasks", result.id) == [
            "0 cancelled, 1 running (a worker holds it: not cancelled)"]
        TaskResultRecord.objects.filter(id=result.id).update(status=TaskResultStatus.RUNNING)
        assert act(client, "cancel_tasks", result.id) == [
            "0 cancelled, 1 running (a worker holds it: not cancelled)"]
        assert m.ack()
    assert TaskResultRecord.objects.get(id=result.id).status == TaskResultStatus.RUNNING


def test_a_user_without_the_change_permission_runs_no_action(django_dsn: str) -> None:
    result = tasks.add.enqueue(1, 2)
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_taskresultrecord"))
    c = Client()
    c.force_login(viewer)
    page = c.get(LIST).content.decode()
    assert result.id in page and "Cancel the selected READY tasks" not in page
    response = c.post(LIST, {"action": "cancel_tasks", "_selected_action": [result.id], "index": 0}, follow=True)
    assert response.status_code == 200 and not any("cancelled" in s for s in shown(response.content.decode()))
    assert list(testing.offered(django_dsn, "default")) == [result.id]
    assert TaskResultRecord.objects.get(id=result.id).status == TaskResultStatus.READY
