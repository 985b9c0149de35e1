"""Typed exceptions, mapped from PostgreSQL SQLSTATE codes in one place (as psycopg does).

Every error raised by the ``dq_*`` functions carries an explicit SQLSTATE (see docs/api.md);
:func:`translate` turns a :class:`psycopg.Error` into the matching :class:`PyQueueError`
subclass, keeping ``sqlstate`` and the server's message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

__all__ = [
    "PyQueueError",
    "InvalidArgument",
    "NullValueNotAllowed",
    "ValueTooLong",
    "LimitExceeded",
    "DatetimeOutOfRange",
    "InsufficientPrivilege",
    "DatabaseError",
    "PayloadDecodeError",
    "UnknownPayloadType",
    "translate",
    "translating",
]


class PyQueueError(Exception):
    """Base of every pyqueue exception.

    :ivar sqlstate: the five-character SQLSTATE when the error came from the server, else ``None``.
    """

    sqlstate: str | None = None

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        if sqlstate is not None:
            self.sqlstate = sqlstate

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidArgument(PyQueueError, ValueError):
    """An argument is out of range or malformed (SQLSTATE 22023 invalid_parameter_value)."""

    sqlstate = "22023"


class NullValueNotAllowed(InvalidArgument):
    """A required argument is NULL/None (SQLSTATE 22004 null_value_not_allowed)."""

    sqlstate = "22004"


class ValueTooLong(InvalidArgument):
    """A queue, key or payload type is over its length limit (SQLSTATE 22001)."""

    sqlstate = "22001"


class LimitExceeded(InvalidArgument):
    """A batch or a payload is over its size limit (SQLSTATE 54000 program_limit_exceeded)."""

    sqlstate = "54000"


class DatetimeOutOfRange(InvalidArgument):
    """A time, or now plus a duration, is outside 0001-01-02 .. 9999-12-30 UTC, the range every
    stored time keeps to (SQLSTATE 22008 datetime_field_overflow)."""

    sqlstate = "22008"


class InsufficientPrivilege(PyQueueError, PermissionError):
    """The role may not call this function (SQLSTATE 42501)."""

    sqlstate = "42501"


class DatabaseError(PyQueueError):
    """Any other server or connection error; ``__cause__`` is the psycopg exception."""


class PayloadDecodeError(PyQueueError, ValueError):
    """A payload could not be decoded by the decoder of its payload_type."""


class UnknownPayloadType(PayloadDecodeError, LookupError):
    """No decoder is registered for a message's payload_type (see ``pyqueue.serializers``)."""


_BY_SQLSTATE: dict[str, type[PyQueueError]] = {
    "22023": InvalidArgument,
    "22004": NullValueNotAllowed,
    "22001": ValueTooLong,
    "54000": LimitExceeded,
    "22008": DatetimeOutOfRange,
    "42501": InsufficientPrivilege,
}


def translate(exc: psycopg.Error) -> PyQueueError:
    """Return the pyqueue exception for a psycopg error (its class chosen by SQLSTATE)."""
    sqlstate = exc.sqlstate
    cls = _BY_SQLSTATE.get(sqlstate or "", DatabaseError)
    diag_message = exc.diag.message_primary if sqlstate else None
    err = cls(diag_message or str(exc), sqlstate=sqlstate)
    err.__cause__ = exc
    return err


@contextmanager
def translating() -> Iterator[None]:
    """Context manager that re-raises psycopg errors as :class:`PyQueueError` subclasses."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc
