"""The tasks bench.django_worker runs with both backends: a no-op, and one that sleeps (I/O-like;
BENCH_DJANGO_SLEEP_MS milliseconds, default 10)."""

import os
import time

from django_tasks import task

SLEEP_S = float(os.environ.get("BENCH_DJANGO_SLEEP_MS", "10")) / 1000


@task()
def noop() -> None:
    """Nothing: what a worker costs per task."""


@task()
def sleep() -> None:
    """Sleep SLEEP_S seconds, as a task waiting on I/O does (the GIL is released)."""
    time.sleep(SLEEP_S)
