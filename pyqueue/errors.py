"""Typed exceptions, mapped from PostgreSQL SQLSTATE codes in one place (as psycopg does).

Every error raised by the ``dq_*`` functions carries an explicit SQLSTATE (see docs/api.md);
:func:`translate` turns a :class:`psycopg.Error` into the matching :class:`PyQueueError`
subclass, keeping ``sqlstate`` and the server's message.
"""

from __future__ import annotations

import re
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
    "NotConfigured",
    "DatabaseError",
    "ConnectionFailed",
    "PayloadDecodeError",
    "UnknownPayloadType",
    "translate",
    "translating",
    "connection_failed",
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


class NotConfigured(PyQueueError):
    """The queue's configuration does not allow the call: ``dq_dead_letter`` for a message of a queue
    without a dead-letter queue (SQLSTATE 55000 object_not_in_prerequisite_state). Nothing changed."""

    sqlstate = "55000"


class DatabaseError(PyQueueError):
    """Any other server or connection error; ``__cause__`` is the psycopg exception."""


class ConnectionFailed(DatabaseError, ConnectionError):
    """The first connection of a queue that owns its pool (one made from a connection string) was
    refused or could not be made; the message is libpq's, with the server's own reason
    (``… failed: FATAL:  password authentication failed for user "app"``). Raised at once: the pool
    opens, and retries lost connections in the background, only after a first connection worked.

    :ivar sqlstate: the code of the server's refusal: ``28P01`` a wrong password, ``28000`` an
        unknown role or one that may not log in, ``3D000`` an unknown database, ``42501`` no
        CONNECT privilege on it, ``53300`` too many connections. libpq passes on the message of a
        failed connection but not its SQLSTATE, so the code is read from the message: known for
        these reasons in PostgreSQL's own English (``lc_messages`` ``C`` or ``en``), ``None`` for
        others and when no server answered (connection refused, a host name that does not
        resolve, a timeout).
    """

    @property
    def permanent(self) -> bool:
        """Whether the server refused for a reason that trying again does not change (a wrong
        password, role or database, no CONNECT privilege), rather than one that may pass (no
        server answering yet, too many connections now). Workers retry only the latter."""
        return self.sqlstate in _LASTING_REFUSALS


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
    "55000": NotConfigured,
}


#: The refusals a server states while a connection starts, as libpq reports them ("FATAL:  …"),
#: with the SQLSTATE the server sent along (PostgreSQL 15, src/backend/utils/init/postinit.c,
#: libpq/auth.c, storage/lmgr/proc.c).
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r'password authentication failed for user "'), "28P01"),
    (re.compile(r'role ".*" (does not exist|is not permitted to log in)'), "28000"),
    (re.compile(r'database ".*" does not exist'), "3D000"),
    (re.compile(r'permission denied for database "'), "42501"),
    (re.compile(r'too many connections for (role|database) "|sorry, too many clients already'), "53300"),
)


_LASTING_REFUSALS = frozenset({"28P01", "28000", "3D000", "42501"})


def connection_failed(exc: psycopg.Error) -> ConnectionFailed:
    """The :class:`ConnectionFailed` for psycopg's error of a connection attempt (its message
    kept, its SQLSTATE read from the server's reason; see :class:`ConnectionFailed`)."""
    message = str(exc).strip()
    sqlstate = next((code for pattern, code in _REFUSALS if pattern.search(message)), None)
    err = ConnectionFailed(message, sqlstate=sqlstate)
    err.__cause__ = exc
    return err


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
