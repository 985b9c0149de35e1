"""pyqueue: a delayed message queue that lives inside PostgreSQL (distribution ``pgdelayq``).

The queue is the ``dq_*`` PL/pgSQL API (docs/api.md); this package is a thin binding over it.
"""

from .client import (
    DelayedQueue,
    Message,
    OfferOutcome,
    OfferRequest,
    QueueStats,
    StoredMessage,
    TransactionalBatch,
    all_stats,
)
from .errors import (
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
from .serializers import SerializerRegistry, registry
from .worker import Backoff, Worker, WorkerStats

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
    "PayloadDecodeError",
    "UnknownPayloadType",
    "SerializerRegistry",
    "registry",
    "migrate",
    "Worker",
    "Backoff",
    "WorkerStats",
]
