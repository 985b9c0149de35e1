"""The tasks of the test project. Each writes what it did to the table ``tasks_log`` (made by the tests'
fixture) through Django's connection, so a test can see from another process what ran, how often."""

import asyncio
import os
import time

from django.db import connection
from django_tasks import task
from django_tasks.base import TaskContext


def log(name: str, value: str = "") -> None:
    with connection.cursor() as cur:
        cur.execute("INSERT INTO tasks_log (name, value, pid) VALUES (%s, %s, %s)", [name, value, os.getpid()])


@task()
def add(a: int, b: int) -> int:
    log("add", f"{a}+{b}")
    return a + b


@task(queue_name="emails", priority=10)
def send_mail(to: str, *, subject: str = "") -> dict:
    log("send_mail", to)
    return {"to": to, "subject": subject}


@task()
def fail(message: str) -> None:
    log("fail", message)
    raise ValueError(message)


@task()
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task(queue_name="slow", takes_context=True)
def crash_once(context: TaskContext, name: str) -> int:
    """Logs each attempt; the first one sleeps a minute (the test kills its worker meanwhile)."""
    log("crash_once", f"{name}:{context.attempt}")
    if context.attempt == 1:
        time.sleep(60)
    return context.attempt


@task()
def flaky(name: str) -> str:
    """Fails until the test logs ``("flaky_ok", name)``."""
    log("flaky", name)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM tasks_log WHERE name = 'flaky_ok' AND value = %s", [name])
        if cur.fetchone()[0] == 0:
            raise RuntimeError(f"{name} is not ok yet")
    return name
