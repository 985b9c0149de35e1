"""Durations as the API takes them: a :class:`datetime.timedelta` or a number of seconds.

The one place where a caller's duration is checked, converted and written back in an error
message; every module (client, worker, cron ticker) uses :func:`as_timedelta`, so the rule and its
error are the same everywhere.
"""

from __future__ import annotations

import math
from datetime import timedelta

from .errors import InvalidArgument

__all__ = ["Seconds", "as_timedelta", "format_duration"]

#: What a duration parameter accepts: a timedelta, or seconds as an int or float.
Seconds = float | int | timedelta


def format_duration(value: timedelta) -> str:
    """``value`` as people write it, in seconds with its sign: ``-5 s``, ``1.5 s``, ``90000 s``
    (never ``-1 day, 23:59:55``, which is how :class:`datetime.timedelta` prints ``-5 s``)."""
    return f"{value.total_seconds():g} s"


def as_timedelta(value: Seconds, name: str, *, allow_zero: bool = False) -> timedelta:
    """``value`` as a timedelta. Raises :class:`pyqueue.InvalidArgument` naming ``name``, before any
    I/O, when it is neither a timedelta nor a finite number of seconds (a ``bool`` is not a
    number here), when it is negative, or zero without ``allow_zero``."""
    if isinstance(value, timedelta):
        td = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        try:
            td = timedelta(seconds=value)
        except OverflowError:
            raise InvalidArgument(f"{name} is {value!r} seconds, beyond what a timedelta holds") from None
    else:
        raise InvalidArgument(
            f"{name} must be a timedelta or a number of seconds, got {type(value).__name__} {value!r}")
    if td < timedelta(0) or (td == timedelta(0) and not allow_zero):
        raise InvalidArgument(
            f"{name} is {format_duration(td)}, it must be {'non-negative' if allow_zero else 'positive'}")
    return td
