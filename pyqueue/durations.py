"""Durations as the API takes them: a :class:`datetime.timedelta` or a number of seconds.

The one place where a caller's duration is checked, converted and written back in an error
message; every module (client, worker, cron ticker) uses :func:`as_timedelta`, so the rule and its
error are the same everywhere.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import InvalidArgument

__all__ = ["Seconds", "as_timedelta", "format_duration", "parse_duration"]

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


_UNITS = {"ms": 0.001, "millisecond": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0,
          "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_WITH_UNIT = re.compile(r"^\s*(\S+?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?)\s*$")


def parse_duration(text: str, name: str, *, allow_zero: bool = False) -> timedelta:
    """A duration typed by a person: seconds (``30``, ``1.5``) or a number with a unit (``500ms``,
    ``30s``, ``2m``, ``1h``, or spelt out: ``1 second``, ``5 minutes``), checked by
    :func:`as_timedelta`. Raises :class:`pyqueue.InvalidArgument` naming ``name`` when it is neither."""
    m = _WITH_UNIT.match(text)
    number, unit = (m.group(1), _UNITS[m.group(2).rstrip("s") or "s"] if m.group(2) not in _UNITS
                    else _UNITS[m.group(2)]) if m else (text, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise InvalidArgument(
            f"{name} is not a duration: {text[:40]!r} (seconds, or a number with ms, s, m or h: 500ms, 30s, 2m, "
            "1h)") from None
    return as_timedelta(seconds, name, allow_zero=allow_zero)
