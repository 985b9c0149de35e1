"""pyqueue: a delayed message queue that lives inside PostgreSQL (distribution ``pgdelayq``).

The queue is the ``dq_*`` PL/pgSQL API (docs/api.md); this package is a thin binding over it,
sync and asyncio, built sans-I/O. :mod:`pyqueue._ops` describes every operation as data (the SQL
text, qualified once per install schema; the parameters, checked and encoded; a decoder building
the result from the rows by column name), and :mod:`pyqueue._routines` writes the operations of
several steps once (the wait cycle of ``poll(wait=…)``, the LISTEN probe behind a pooler,
``transaction()``) as generators yielding steps. Two drivers only perform them: :mod:`pyqueue._sync`
on blocking connections, :mod:`pyqueue._async` on asyncio ones. On those sit the public APIs,
twins with the same names and signatures (tests/test_parity.py): :mod:`pyqueue.client` and
:mod:`pyqueue.aio` (queues, messages, batches, ``all_stats``), :mod:`pyqueue.cron` and
:mod:`pyqueue.aio_cron` (schedules; ``cron`` also holds the :class:`~pyqueue.cron.CronTicker`
thread), :mod:`pyqueue.worker` and :mod:`pyqueue.aio_worker` (run loops). :mod:`pyqueue.model`
holds the row types both sides share, :mod:`pyqueue.limits` the size and count limits,
:mod:`pyqueue.durations`, :mod:`pyqueue.errors` and :mod:`pyqueue.serializers` the argument,
error and payload rules; :mod:`pyqueue.cli`, :mod:`pyqueue.migrate`, :mod:`pyqueue.testing`,
:mod:`pyqueue.spark` and :mod:`pyqueue.demo` are the command line, the installer, the test
servers, the Spark data source and the demo.
"""

from .core.middleware import HandlerCall, Middleware, OfferCall
from .errors import (
    ConnectionFailed,
    DatabaseError,
    DatetimeOutOfRange,
    InsufficientPrivilege,
    InvalidArgument,
    LimitExceeded,
    NullValueNotAllowed,
    PayloadDecodeError,
    PyQueueError,
    UnknownPayloadType,
    ValueTooLong,
)
from .migrate import migrate
from .model import OfferOutcome, OfferRequest, QueueStats, StoredMessage
from .serializers import SerializerRegistry, registry
from .sync.client import DelayedQueue, Message, TransactionalBatch, all_stats
from .sync.worker import Backoff, Worker, WorkerStats

__version__ = "0.2.0.dev0"

__all__ = [
    "DelayedQueue",
    "Message",
    "OfferOutcome",
    "OfferRequest",
    "StoredMessage",
    "QueueStats",
    "all_stats",
    "TransactionalBatch",
    "PyQueueError",
    "InvalidArgument",
    "NullValueNotAllowed",
    "ValueTooLong",
    "LimitExceeded",
    "DatetimeOutOfRange",
    "InsufficientPrivilege",
    "DatabaseError",
    "ConnectionFailed",
    "PayloadDecodeError",
    "UnknownPayloadType",
    "SerializerRegistry",
    "registry",
    "migrate",
    "Worker",
    "Backoff",
    "WorkerStats",
    "Middleware",
    "HandlerCall",
    "OfferCall",
]
