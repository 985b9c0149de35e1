"""The exceptions of :mod:`pyqueue.contrib.django` that a task result records or that enqueue raises.

Django's ``TaskResultStatus`` has no cancelled status: a task cancelled in the admin becomes FAILED with
one more error whose ``exception_class_path`` is :class:`TaskCancelled`'s, so
``result.errors[-1].exception_class is TaskCancelled`` tells it from a task that raised.
"""

from __future__ import annotations

from ...errors import PyQueueError

__all__ = ["ResultIdTaken", "TaskCancelled"]


class TaskCancelled(Exception):
    """Recorded (never raised) as the last error of a task cancelled before it ran."""


class ResultIdTaken(PyQueueError, ValueError):
    """``enqueue_with_id``: the id is free in the results table but a message with this key is already
    in the task's queue (offered by another producer), so the task cannot have it."""

    sqlstate = "23505"
