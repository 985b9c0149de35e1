"""pyqueue: a delayed message queue that lives inside PostgreSQL (distribution ``pgdelayq``).

The queue is the ``dq_*`` PL/pgSQL API (docs/api.md); this package is a thin binding over it,
sync and asyncio, built sans-I/O. The tree, from the bottom:

- the foundation: :mod:`pyqueue.errors`, :mod:`pyqueue.limits`, :mod:`pyqueue.durations`,
  :mod:`pyqueue.serializers` and :mod:`pyqueue.model` (the row types both sides share);
- :mod:`pyqueue.core`, no I/O: the argument checks, every operation as data (SQL text qualified
  per install schema, checked parameters, a decoder), the one vocabulary of steps, the client
  routines of several steps, the worker's decisions, and the middleware extension point;
- :mod:`pyqueue.drivers`: perform the core's steps on psycopg's blocking or asyncio connections;
- the twin APIs, with the same names and signatures (the parity tests check it):
  :mod:`pyqueue.sync` (public here and in :mod:`pyqueue.cron`) and :mod:`pyqueue.aio`, each a
  client that *has* a driver, a worker, and cron schedules;
- programs: :mod:`pyqueue.cli`, :mod:`pyqueue.migrate` (the installer), :mod:`pyqueue.testing`
  (test servers) and :mod:`pyqueue.spark` (the PySpark data source).

``tests/install/test_structure.py`` keeps that order: no import cycle, no layer importing one above it.
"""

from .core.graph import Graph, Node
from .core.middleware import HandlerCall, Middleware, OfferCall
from .errors import (
    ConnectionFailed,
    DatabaseError,
    DatetimeOutOfRange,
    InsufficientPrivilege,
    InvalidArgument,
    LimitExceeded,
    NotConfigured,
    NullValueNotAllowed,
    PayloadDecodeError,
    PyQueueError,
    UnknownPayloadType,
    ValueTooLong,
)
from .migrate import migrate
from .model import NackOutcome, NackResult, OfferCounts, OfferOutcome, OfferRequest, QueueStats, StoredMessage
from .serializers import SerializerRegistry, registry
from .sync.client import DelayedQueue, Message, TransactionalBatch, all_stats
from .sync.worker import Backoff, Worker, WorkerStats

__version__ = "0.2.0.dev0"

__all__ = [
    "DelayedQueue",
    "Message",
    "OfferCounts",
    "OfferOutcome",
    "OfferRequest",
    "Graph",
    "Node",
    "NackOutcome",
    "NackResult",
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
    "NotConfigured",
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
