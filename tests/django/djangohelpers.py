"""Helpers of the Django tests: wait for a task's status, run a worker in a thread or as a real
``manage.py pyqueue_worker`` process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from django_tasks import task_backends
from django_tasks.base import TaskResult

from pyqueue import Worker
from pyqueue.contrib.django.worker import make_worker

MANAGE = Path(__file__).resolve().parent / "project" / "manage.py"


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``check()`` every 50 ms until it returns something true; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def wait_for_status(result_id: str, *statuses: str, timeout: float = 30.0) -> TaskResult:
    """The result of ``result_id`` once its status is one of ``statuses``."""
    backend = task_backends["default"]

    def check() -> TaskResult | None:
        found = backend.get_result(result_id)
        return found if found.status in statuses else None

    return wait_for(check, timeout, f"task {result_id} to be {statuses}")


@contextmanager
def worker_thread(queue: str, **options: Any) -> Iterator[Worker]:
    """A Django tasks worker of ``queue`` running in a thread of this process (idle_check 0.2 s)."""
    options.setdefault("idle_check", timedelta(seconds=0.2))
    worker = make_worker(queue, **options)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
        worker.queue.close()
        assert not thread.is_alive()


def start_command(dsn: str, *args: str) -> subprocess.Popen[str]:
    """``manage.py pyqueue_worker ARGS`` as a real process on database ``dsn`` (output piped)."""
    env = dict(os.environ, PYQUEUE_DJANGO_DSN=dsn, DJANGO_SETTINGS_MODULE="settings", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(MANAGE), "pyqueue_worker", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def log_rows(dsn: str, name: str) -> list[tuple[str, int]]:
    """``(value, pid)`` of each row the tasks logged under ``name``, in order."""
    with psycopg.connect(dsn) as c:
        return [(r[0], r[1]) for r in c.execute("SELECT value, pid FROM tasks_log WHERE name = %s ORDER BY id",
                                                (name,))]
