"""Durations as the API takes them: a :class:`datetime.timedelta` or a number of seconds.

The one place where a caller's duration is checked and converted; every module (client, worker,
cron ticker) uses :func:`as_timedelta`, so the rule and its error are the same everywhere.
"""

from __future__ import annotations

from datetime import timedelta

from .errors import InvalidArgument

__all__ = ["Seconds", "as_timedelta"]

#: What a duration parameter accepts: a timedelta, or seconds as an int or float.
Seconds = float | int | timedelta


def as_timedelta(value: Seconds, name: str, *, allow_zero: bool = False) -> timedelta:
    """``value`` as a timedelta; raises :class:`pyqueue.InvalidArgument` naming ``name`` when it is
    negative, or zero without ``allow_zero``."""
    td = value if isinstance(value, timedelta) else timedelta(seconds=float(value))
    if td < timedelta(0) or (td == timedelta(0) and not allow_zero):
        raise InvalidArgument(f"{name} is {td}, it must be {'non-negative' if allow_zero else 'positive'}")
    return td
