"""``python manage.py pyqueue_worker --queue Q [--concurrency N] [--backend default] [--lock-timeout S]
[--shutdown-grace S] [--idle-check S]``: run the Django tasks of one queue on pyqueue's worker until
SIGTERM or SIGINT (a second signal exits at once; the tasks then running are delivered again when their
locks expire). A connection refused for good ends it with exit status 2."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from .....cli import _first_stops_second_exits
from .....drivers.signals import stop_signals
from .....errors import ConnectionFailed, InvalidArgument
from ...worker import make_worker


def _seconds(text: str) -> timedelta:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return timedelta(seconds=value)


class Command(BaseCommand):
    help = "Run the Django tasks of one queue on pyqueue's worker, until SIGTERM or SIGINT."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--queue", required=True, help="the queue (the tasks' queue_name)")
        parser.add_argument("--concurrency", type=int, default=4, help="tasks running at once, in threads (4)")
        parser.add_argument("--backend", default="default", help="the TASKS alias of a DelayedQueueBackend")
        parser.add_argument("--lock-timeout", type=_seconds, default=timedelta(seconds=30),
                            help="seconds each delivery stays locked, extended while the task runs (30)")
        parser.add_argument("--shutdown-grace", type=_seconds, default=timedelta(seconds=30),
                            help="seconds running tasks may finish after a stop signal (30)")
        parser.add_argument("--idle-check", type=_seconds, default=timedelta(seconds=5),
                            help="while idle, re-check the queue at least this often, in seconds (5)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            worker = make_worker(
                options["queue"], backend=options["backend"], concurrency=options["concurrency"],
                lock_timeout=options["lock_timeout"], shutdown_grace=options["shutdown_grace"],
                idle_check=options["idle_check"])
        except InvalidArgument as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"pyqueue_worker: queue {options['queue']}, concurrency {options['concurrency']}")
        self.stdout.flush()
        # As `pyqueue worker`: the first poll opens the queue (a server not answering yet is waited
        # for), the first signal stops the worker, a second one exits at once.
        try:
            with stop_signals(_first_stops_second_exits(worker)):
                worker.run(install_signal_handlers=False)
        except ConnectionFailed as exc:
            self.stderr.write(f"pyqueue_worker: {exc}")
            sys.exit(2)
        finally:
            worker.queue.close()
