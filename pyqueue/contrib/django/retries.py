"""A task's own retry policy: how many attempts it gets and how long to wait before the next one.

Django's ``Task`` is a frozen dataclass with no such fields (a retry API for it is proposed, with
``max_attempts`` and ``backoff(exception, task_result) -> seconds | None``, but not in Django); so the
policy lives beside the task, in a registry of this module keyed by the task's ``module_path``, filled
by the :func:`retry` decorator when the task's module is imported (the worker imports it to run the
task)::

    @retry(max_attempts=3, backoff=lambda exc, result: 30)
    @task()
    def send_mail(to: str) -> None: ...

Defaults for every task of a backend come from its ``OPTIONS``: ``"MAX_ATTEMPTS"`` (an int) and
``"BACKOFF"`` (a callable, or the dotted path of one). Without either, a task gets its queue's
``max_deliveries`` attempts and the worker's :class:`pyqueue.Backoff`.

The worker (:class:`~pyqueue.contrib.django.worker.TaskRunner`) counts attempts by the message's
``delivery_count``: once it reaches ``max_attempts``, or when ``backoff`` returns None, the message is
dead-lettered at once (``Message.dead_letter``) and the task is FAILED. The queue's own
``max_deliveries`` still applies: a larger ``max_attempts`` is cut to it (the nack of the queue's last
delivery dead-letters the message).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.utils.module_loading import import_string

from ...errors import InvalidArgument

__all__ = ["Backoff", "RetryPolicy", "policy_for", "retry"]

#: ``backoff(exception, task_result)``: the delay before the next attempt (seconds or a timedelta,
#: ≥ 0), or None to give up now. ``task_result`` is the task's ``TaskResult`` with this attempt's error
#: already in ``errors`` and status FAILED.
Backoff = Callable[[BaseException, Any], "float | timedelta | None"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """The retry settings of one task (None: the default).

    :param max_attempts: attempts before the task is FAILED (≥ 1); None: the backend's
        ``OPTIONS["MAX_ATTEMPTS"]``, else the queue's ``max_deliveries`` (no limit without one).
    :param backoff: the delay before the next attempt, or None to give up; None: the backend's
        ``OPTIONS["BACKOFF"]``, else the worker's :class:`pyqueue.Backoff`.
    """

    max_attempts: int | None = None
    backoff: Backoff | None = None

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
                isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1):
            raise InvalidArgument(f"max_attempts must be an int >= 1 or None, got {self.max_attempts!r}")
        if self.backoff is not None and not callable(self.backoff):
            raise InvalidArgument(f"backoff must be callable or None, got {self.backoff!r}")


_POLICIES: dict[str, RetryPolicy] = {}


def _module_path(target: Any) -> str:
    """``module.qualname`` of a Task (its ``module_path``) or of the function it wraps."""
    path = getattr(target, "module_path", None)
    if isinstance(path, str):
        return path
    if callable(target) and hasattr(target, "__qualname__"):
        return f"{target.__module__}.{target.__qualname__}"
    raise InvalidArgument(f"retry() decorates a task or its function, got {target!r}")


def retry(*, max_attempts: int | None = None, backoff: Backoff | None = None) -> Callable[[T], T]:
    """Give the decorated task (above or below ``@task``) its own retry policy, returned unchanged.

    :param max_attempts: attempts before the task is FAILED and dead-lettered (≥ 1); None: the default.
    :param backoff: ``backoff(exception, task_result) -> seconds | timedelta | None``; None: the default.
    :raises InvalidArgument: a value out of range, or something that is neither a task nor a function.
    """
    policy = RetryPolicy(max_attempts, backoff)

    def register(target: T) -> T:
        _POLICIES[_module_path(target)] = policy
        return target

    return register


def policy_for(task_path: str, options: dict[str, Any]) -> RetryPolicy:
    """The policy of the task ``task_path``: its own settings, else the backend ``options``'
    ``MAX_ATTEMPTS`` and ``BACKOFF``, else None (the queue's and the worker's defaults).

    :raises InvalidArgument: an option out of range (``BACKOFF`` neither callable nor a dotted path).
    """
    own = _POLICIES.get(task_path, RetryPolicy())
    max_attempts = own.max_attempts if own.max_attempts is not None else options.get("MAX_ATTEMPTS")
    backoff = own.backoff if own.backoff is not None else options.get("BACKOFF")
    if isinstance(backoff, str):
        backoff = import_string(backoff)
    return RetryPolicy(max_attempts, backoff)


def as_delay(value: Any) -> timedelta | None:
    """A backoff's answer as a delay: None stays None (give up), seconds or a timedelta ≥ 0.

    :raises InvalidArgument: anything else.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        delay = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        delay = timedelta(seconds=value)
    else:
        raise InvalidArgument(f"backoff returned {value!r}: seconds, a timedelta or None expected")
    if delay < timedelta(0):
        raise InvalidArgument(f"backoff returned {value!r}: a delay must not be negative")
    return delay
