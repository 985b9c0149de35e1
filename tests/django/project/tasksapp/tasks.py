"""The tasks of the test project. Each writes what it did to the table ``tasks_log`` (made by the tests'
fixture) through Django's connection, so a test can see from another process what ran, how often."""

import asyncio
import os
import time

from django.db import connection
from django_tasks import task


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


@task(queue_name="slow")
def sleep_then_log(seconds: float, name: str) -> str:
    log("sleep_started", name)
    time.sleep(seconds)
    log("sleep_done", name)
    return name
