"""PySpark Python Data Source ``delayedqueue``: offer DataFrame rows as delayed messages, and read
the queue's tables back as DataFrames (docs/spark.md).

Install the extra (``pip install 'pgdelayq[spark]'``, PySpark >= 4.1 and a Java 17+ runtime),
then::

    import pyqueue.spark
    pyqueue.spark.register(spark)

    (df.write.format("delayedqueue").option("dsn", dsn).option("queue", "reminders")
       .mode("append").save())
    spark.read.format("delayedqueue").option("dsn", dsn).option("queue", "reminders").load()

Writing goes through ``dq_offer_many`` only (never into ``dq_messages`` directly; ``dq_producer``
may call it), so a message is identified by its de-duplication key: a task that Spark runs
twice (retry, speculation) or a job run again offers the same keys again, which creates no second
message. Each task offers its partition in batches of ``batchSize`` rows, one ``dq_offer_many``
call and one transaction per batch, in one of two ways (option ``writeMethod``):

* ``arrays`` (default): each Arrow batch Spark hands over is checked, then its rows are cut into
  batches, de-duplicated and encoded as PostgreSQL binary arrays by pyarrow's compute functions
  (no Python code per row); a second thread of the task runs each batch's ``dq_offer_many`` while
  the task reads and encodes the next one. Measured fastest (docs/spark.md).
* ``copy``: the whole partition is first staged in a temporary table with ``COPY`` and checked,
  then offered from the stage by set-based calls; a bad row stops the task before it offers
  anything, at the cost of not overlapping Spark's work with the database's.

The same writer is a Structured Streaming sink (``stream.writeStream.format("delayedqueue")``):
each micro-batch is offered as above; a micro-batch that Spark runs again after a failure or a
restart offers its keys again, and those already offered are ``ignored``.

Reading goes through the export functions (``dq_export_messages``, which ``dq_consumer`` may
call, and ``dq_export_archive``, for ``dq_admin``; no role reads the tables directly): the id range
of ``dq_messages`` (or ``archive_id`` of ``dq_archive``) is split into ``numPartitions`` parallel
reads, and comparisons on the queue, the keys and the times are passed to the function as its
``filters`` argument, which PostgreSQL plans with the id range (docs/spark.md).
"""

from __future__ import annotations

import array
import base64
import datetime as dt
import json
import logging
import struct
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "NAME",
    "DelayedQueueDataSource",
    "DelayedQueueStreamWriter",
    "OfferCommitMessage",
    "OfferSummary",
    "register",
    "MESSAGES_SCHEMA",
    "ARCHIVE_SCHEMA",
]

NAME = "delayedqueue"
log = logging.getLogger("pyqueue.spark")

# --------------------------------------------------------------------------- registration


def register(spark: SparkSession) -> None:
    """Register the ``delayedqueue`` data source with ``spark``, make sure Spark's Python workers
    can run it, and enable Python filter pushdown.

    Spark runs the data source in Python worker processes started from its own interpreter
    setting, not from the interpreter running this code: ``PYSPARK_PYTHON`` as it was when the
    SparkContext was created, else ``python3`` found on PATH (Spark docs, "Python Package
    Management"). From a virtualenv that is not activated, that ``python3`` lacks psycopg and the
    job fails inside the worker with ``No module named 'psycopg'``. So, with a classic
    (non-Connect) session:

    * when the workers' interpreter is this one, nothing changes;
    * when it cannot import psycopg and pyqueue and ``PYSPARK_PYTHON`` was not set, on a local
      master (``local[…]``, workers on this machine) the session's Python workers are switched to
      this interpreter (``sys.executable``), logged at INFO;
    * otherwise, when it cannot import them, :class:`RuntimeError` says to set ``PYSPARK_PYTHON``
      (or ``spark.pyspark.python``) to an interpreter where pgdelayq is installed. A cluster
      master's workers run elsewhere and are not checked.

    Also sets ``spark.sql.python.filterPushdown.enabled`` to ``true`` for the session: Spark
    refuses to read from a Python data source that pushes filters while that setting is off (its
    default).

    :param spark: the session to register with.
    :raises RuntimeError: the workers' interpreter cannot import psycopg or pyqueue and cannot be
        set from here.
    """
    _check_worker_python(spark)
    spark.dataSource.register(DelayedQueueDataSource)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


#: What a worker's interpreter must import to run the data source.
_WORKER_IMPORTS = "import psycopg, pyqueue.spark"


def _check_worker_python(spark: SparkSession) -> None:
    """Check, or on a local master set, the interpreter of the session's Python workers (see
    :func:`register`). The data source's functions take ``SparkContext.pythonExec`` when they are
    registered, so setting it before the registration is what the workers run."""
    import os
    import shutil
    import subprocess

    sc = getattr(spark, "_sc", None)  # None for a Spark Connect session: nothing to check from here
    if sc is None or not isinstance(getattr(sc, "pythonExec", None), str):
        return
    configured = sc.pythonExec
    found = shutil.which(configured)
    if found is not None and os.path.realpath(found) == os.path.realpath(sys.executable):
        return
    master = sc.master or ""
    if not master.startswith("local"):
        return
    if found is not None:
        probe = subprocess.run([found, "-c", _WORKER_IMPORTS], capture_output=True, text=True, timeout=120)
        if probe.returncode == 0:
            return
        reason = (probe.stderr.strip().splitlines() or ["it failed"])[-1]
    else:
        reason = "it is not found on PATH"
    explicit = os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python")
    if not explicit:
        log.info("Spark's Python workers would run %r, which cannot import psycopg and pyqueue (%s): "
                 "running them with this interpreter, %s", configured, reason, sys.executable)
        sc.pythonExec = sys.executable
        return
    raise RuntimeError(
        f"{NAME}: Spark's Python workers run {configured!r} (PYSPARK_PYTHON / spark.pyspark.python), which "
        f"cannot import psycopg and pyqueue ({reason}). Set PYSPARK_PYTHON to an interpreter where pgdelayq "
        f"is installed, for example this one: PYSPARK_PYTHON={sys.executable}, before the SparkSession is "
        f"created.")


# --------------------------------------------------------------------------- options


class _OptionError(ValueError):
    pass


class Options:
    """Options by case-insensitive name, as Spark treats them (``batchSize`` is ``batchsize``)."""

    def __init__(self, options: Any) -> None:
        self._values = {str(k).lower(): str(v) for k, v in dict(options).items()}

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)


def _required(options: Options, name: str) -> str:
    value = options.get(name)
    if value is None or value == "":
        raise _OptionError(f"{NAME}: option {name!r} is required")
    return value


def _int_option(options: Options, name: str, default: int, lo: int, hi: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _OptionError(f"{NAME}: option {name!r} is {raw!r}, it must be an integer") from None
    if not lo <= value <= hi:
        raise _OptionError(f"{NAME}: option {name!r} is {value}, it must be between {lo} and {hi}")
    return value


def _bool_option(options: Options, name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise _OptionError(f"{NAME}: option {name!r} is {raw!r}, it must be true or false")


def _queue_option(options: Options) -> str:
    queue = _required(options, "queue")
    if len(queue) > 100:
        raise _OptionError(f"{NAME}: option 'queue' is {len(queue)} characters, the limit is 100")
    return queue


# --------------------------------------------------------------------------- the data source


class DelayedQueueDataSource(DataSource):
    """The ``delayedqueue`` data source (docs/spark.md).

    Write options (``df.write`` and ``stream.writeStream``): ``dsn`` (required), ``queue``
    (required), ``canUpdate`` (default ``true``),
    ``batchSize`` (rows per ``dq_offer_many`` call and transaction, default 1000, at most 100000),
    ``writeMethod`` (``arrays``, the default, or ``copy``).

    Read options: ``dsn`` (required), ``queue`` (optional: only this queue), ``table``
    (``messages``, the default, or ``archive``), ``numPartitions`` (default 4), ``fetchSize``
    (rows per fetch and per Arrow batch, default 10000).
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return _table(self.options).schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return DelayedQueueReader(Options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return DelayedQueueWriter(Options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return DelayedQueueStreamWriter(Options(self.options), schema, overwrite)


# --------------------------------------------------------------------------- writing

# The staging table of one task: its whole partition, checked, before anything is offered.
# seq is the row's position in the partition (0-based); batch = seq // batchSize.
Q_STAGE_CREATE = """
CREATE TEMPORARY TABLE dq_spark_stage (
    seq           bigint  NOT NULL,
    batch         integer NOT NULL,
    key           text    NOT NULL,
    payload       bytea   NOT NULL,
    payload_type  text    NOT NULL,
    at            timestamptz NOT NULL
)"""
Q_STAGE_COPY = "COPY dq_spark_stage (seq, batch, key, payload, payload_type, at) FROM STDIN (FORMAT binary)"
Q_STAGE_INDEX = "CREATE INDEX ON dq_spark_stage (batch)"
Q_STAGE_ANALYZE = "ANALYZE dq_spark_stage"
Q_STAGE_DROP = "DROP TABLE IF EXISTS dq_spark_stage"

# One batch of staged rows offered by one set-based dq_offer_many call. A key repeated within the
# batch is offered once: with can_update the last row of the batch (highest seq) wins, without it
# the first (lowest seq) wins, which is what offering the rows one by one in order would leave.
# The four array_agg run over the same rows in the same order, so their elements line up.
_Q_OFFER_STAGED = """
SELECT o.outcome, count(*)::bigint
  FROM (SELECT array_agg(s.key) AS keys, array_agg(s.payload) AS payloads,
               array_agg(s.at) AS ats,
               array_agg(s.payload_type) AS types
          FROM (SELECT DISTINCT ON (t.key) t.key, t.payload, t.payload_type, t.at
                  FROM dq_spark_stage t
                 WHERE t.batch = %(batch)s
                 ORDER BY t.key, t.seq {order}) AS s) AS a
       CROSS JOIN LATERAL dq_offer_many(%(queue)s, a.keys, a.payloads, a.ats, %(can_update)s, a.types) AS o
 GROUP BY o.outcome"""
Q_OFFER_STAGED_LAST = _Q_OFFER_STAGED.format(order="DESC")
Q_OFFER_STAGED_FIRST = _Q_OFFER_STAGED.format(order="ASC")

# The "arrays" method: one batch sent as binary arrays (already de-duplicated, see Batching).
Q_OFFER_ARRAYS = """
SELECT o.outcome, count(*)::bigint
  FROM dq_offer_many(%(queue)s, %(keys)b::text[], %(payloads)b::bytea[], %(ats)b::timestamptz[],
                     %(can_update)s, %(types)b::text[]) AS o
 GROUP BY o.outcome"""

Q_WRITER_CHECK = (
    "SELECT (extract(epoch FROM date_trunc('microseconds', now())) * 1000000)::int8, "
    "EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.proname = 'dq_offer_many' "
    "AND pg_catalog.pg_function_is_visible(p.oid))"
)

WRITE_METHODS = ("copy", "arrays")
DEFAULT_BATCH_SIZE = 1000
KEY_LIMIT = 200
PAYLOAD_TYPE_LIMIT = 100
OUTCOMES = ("created", "updated", "ignored")


@dataclass(frozen=True)
class OfferCommitMessage(WriterCommitMessage):
    """What one successful task offered, sent back to the driver.

    ``created``/``updated``/``ignored`` are the ``dq_offer_many`` outcomes of the rows this
    attempt offered; ``superseded`` counts rows not offered because a row with the same key
    followed (or, without ``canUpdate``, preceded) them in the same batch.
    """

    partition: int
    attempt: int
    rows: int
    batches: int
    created: int = 0
    updated: int = 0
    ignored: int = 0
    superseded: int = 0
    # Task time, in seconds. read_s: waiting for Spark's next Arrow batch; encode_s: checking,
    # cutting and encoding the rows (and, for writeMethod=copy, copying them into the stage);
    # offer_s: the dq_offer_many calls (for writeMethod=arrays in a second thread, overlapping the
    # other two); wait_s: the task waiting for that thread to finish the previous batch.
    read_s: float = 0.0
    encode_s: float = 0.0
    offer_s: float = 0.0
    wait_s: float = 0.0


@dataclass(frozen=True)
class OfferSummary:
    """The sum of the commit messages of one write job (what the driver logs)."""

    queue: str
    tasks: int
    retried: int  # tasks whose successful attempt was not their first
    rows: int
    batches: int
    created: int
    updated: int
    ignored: int
    superseded: int
    read_s: float
    encode_s: float
    offer_s: float
    wait_s: float

    @classmethod
    def of(cls, queue: str, messages: Sequence[WriterCommitMessage | None]) -> OfferSummary:
        ours = [m for m in messages if isinstance(m, OfferCommitMessage)]
        return cls(
            queue=queue,
            tasks=len(ours),
            retried=sum(1 for m in ours if m.attempt > 0),
            rows=sum(m.rows for m in ours),
            batches=sum(m.batches for m in ours),
            created=sum(m.created for m in ours),
            updated=sum(m.updated for m in ours),
            ignored=sum(m.ignored for m in ours),
            superseded=sum(m.superseded for m in ours),
            read_s=sum(m.read_s for m in ours),
            encode_s=sum(m.encode_s for m in ours),
            offer_s=sum(m.offer_s for m in ours),
            wait_s=sum(m.wait_s for m in ours),
        )

    def __str__(self) -> str:
        return (
            f"{NAME}: queue {self.queue!r}: {self.rows} rows from {self.tasks} tasks ({self.retried} retried)"
            f" in {self.batches} batches:"
            f" created {self.created}, updated {self.updated}, ignored {self.ignored},"
            f" superseded {self.superseded}; task time: reading from Spark {self.read_s:.1f} s,"
            f" checking/encoding {self.encode_s:.1f} s, offering {self.offer_s:.1f} s,"
            f" waiting for the offers {self.wait_s:.1f} s"
        )


def _payload_kind(data_type: DataType) -> str | None:
    """The default payload_type of a payload column of this Spark type, None if not allowed."""
    if isinstance(data_type, BinaryType):
        return "bytes"
    if isinstance(data_type, StringType):
        return "text"
    if isinstance(data_type, (StructType, MapType, ArrayType)):
        return "json"
    return None


def check_write_schema(schema: StructType) -> str:
    """Check the DataFrame's columns; return the default payload_type. Raises ValueError naming the column."""
    fields = {f.name: f for f in schema.fields}
    allowed = ("key", "payload", "scheduled_at", "payload_type")
    unknown = [name for name in fields if name not in allowed]
    if unknown:
        raise ValueError(
            f"{NAME}: unknown column {unknown[0]!r}; the columns are key, payload, scheduled_at, payload_type"
        )
    for name in ("key", "payload"):
        if name not in fields:
            raise ValueError(f"{NAME}: column {name!r} is missing; it is required")
    key_type = fields["key"].dataType
    if not isinstance(key_type, StringType):
        raise ValueError(f"{NAME}: column 'key' is {key_type.simpleString()}, it must be string")
    kind = _payload_kind(fields["payload"].dataType)
    if kind is None:
        raise ValueError(
            f"{NAME}: column 'payload' is {fields['payload'].dataType.simpleString()}, "
            "it must be binary, string, or a struct, map or array (written as JSON)"
        )
    if "scheduled_at" in fields:
        at_type = fields["scheduled_at"].dataType
        if isinstance(at_type, TimestampNTZType):
            raise ValueError(
                f"{NAME}: column 'scheduled_at' is timestamp_ntz, which names no instant; "
                "it must be timestamp (with the session time zone)"
            )
        if not isinstance(at_type, TimestampType):
            raise ValueError(f"{NAME}: column 'scheduled_at' is {at_type.simpleString()}, it must be timestamp")
    if "payload_type" in fields and not isinstance(fields["payload_type"].dataType, StringType):
        raise ValueError(
            f"{NAME}: column 'payload_type' is {fields['payload_type'].dataType.simpleString()}, it must be string"
        )
    return kind


# --------------------------------------------------------------------------- PostgreSQL binary formats

# The batches travel in PostgreSQL's binary formats, built from the Arrow columns by pyarrow's
# compute kernels, with no Python code per row: a binary array parameter (what ``array_recv``
# reads) for dq_offer_many, binary COPY rows (PostgreSQL manual, COPY, "Binary Format") for the
# stage of writeMethod=copy. In both, a value is its length as a 4-byte big-endian integer
# followed by its bytes; a timestamptz is a big-endian int8 of microseconds since
# 2000-01-01 00:00 UTC.
PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 00:00 UTC in microseconds since 1970-01-01
ELEMENT_OIDS = {"text": 25, "bytea": 17, "timestamptz": 1184, "int8": 20, "int4": 23}
ARRAY_OIDS = {"text": 1009, "bytea": 1001, "timestamptz": 1185, "int8": 1016, "int4": 1007}
COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
COPY_TRAILER = struct.pack("!h", -1)


def _big_endian(values: Any, code: str, width: int) -> Any:
    """A primitive Arrow array without nulls (int32: ``code`` "i", width 4; int64: "q", 8) as a
    ``fixed_size_binary`` array of its big-endian values, cast to ``binary``."""
    import pyarrow as pa

    n = len(values)
    data = memoryview(values.buffers()[1])[values.offset * width : (values.offset + n) * width]
    swapped = array.array(code)
    swapped.frombytes(data)
    if sys.byteorder == "little":
        swapped.byteswap()
    return pa.Array.from_buffers(pa.binary(width), n, [None, pa.py_buffer(swapped.tobytes())]).cast(pa.binary())


def _fields(values: Any) -> Any:
    """A ``binary`` array without nulls, each value preceded by its length (4 bytes, big-endian)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = pc.binary_length(values).cast(pa.int32())
    return pc.binary_join_element_wise(_big_endian(lengths, "i", 4), values, pa.scalar(b"", pa.binary()))


def _concatenated(values: Any) -> bytes:
    """The bytes of a ``binary`` array's values, one after the other."""
    import pyarrow as pa

    offsets = pa.Array.from_buffers(pa.int32(), len(values) + 1, [None, values.buffers()[1]], offset=values.offset)
    start, end = offsets[0].as_py(), offsets[len(values)].as_py()
    return bytes(memoryview(values.buffers()[2])[start:end])


def _as_binary(values: Any, element: str) -> Any:
    """A column as ``binary`` values in the binary format of ``element`` (text, bytea: their bytes;
    int8, int4: integers; timestamptz: from int64 microseconds since 1970)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if element == "int8":
        return _big_endian(values.cast(pa.int64()), "q", 8)
    if element == "int4":
        return _big_endian(values.cast(pa.int32()), "i", 4)
    if element == "timestamptz":
        return _big_endian(pc.subtract(values, pa.scalar(PG_EPOCH_US, pa.int64())), "q", 8)
    return values.cast(pa.binary())


class PgArray:
    """A one-dimensional PostgreSQL array in binary format, passed as a query parameter (see
    :class:`_PgArrayDumper`). ``element`` is text, bytea, int8, int4 or timestamptz; ``values`` an Arrow array
    without nulls (timestamptz: int64 microseconds since 1970-01-01 UTC)."""

    __slots__ = ("data", "element")

    def __init__(self, values: Any, element: str) -> None:
        header = struct.pack("!iiiii", 1, 0, ELEMENT_OIDS[element], len(values), 1)
        self.element = element
        self.data = header + _concatenated(_fields(_as_binary(values, element)))


class PgArrayDumper(psycopg.adapt.Dumper):
    """Dumps a :class:`PgArray` as it is, with the oid of its array type (register it on the
    connection: ``conn.adapters.register_dumper(PgArray, PgArrayDumper)``)."""

    format = psycopg.pq.Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return obj.data  # type: ignore[no-any-return]

    def get_key(self, obj: Any, format: psycopg.adapt.PyFormat) -> Any:
        return (self.cls, obj.element)

    def upgrade(self, obj: Any, format: psycopg.adapt.PyFormat) -> psycopg.adapt.Dumper:
        dumper = PgArrayDumper(self.cls, self.connection)
        dumper.oid = ARRAY_OIDS[obj.element]
        return dumper


def copy_rows(columns: Sequence[tuple[Any, str]]) -> bytes:
    """Binary COPY rows (without the signature and trailer) of Arrow arrays without nulls of equal
    length, each with its type (text, bytea, int8, int4, timestamptz)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = pa.scalar(struct.pack("!h", len(columns)), pa.binary())
    fields = [_fields(_as_binary(values, element)) for values, element in columns]
    return _concatenated(pc.binary_join_element_wise(count, *fields, pa.scalar(b"", pa.binary())))


# --------------------------------------------------------------------------- a task's batches


class TimedIterator:
    """An iterator that adds up the time spent waiting for its items (``seconds``)."""

    def __init__(self, items: Iterator[Any]) -> None:
        self.items = items
        self.seconds = 0.0

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        t = time.perf_counter()
        try:
            return next(self.items)
        finally:
            self.seconds += time.perf_counter() - t


class BadRow(ValueError):
    """A row that cannot be offered: ``column`` ``what`` (e.g. "is NULL") in row ``row`` of the
    partition (counted from 0). The writer turns it into the task's error."""

    def __init__(self, column: str, what: str, row: int) -> None:
        super().__init__(f"column {column!r} {what} in row {row}")
        self.column, self.what, self.row = column, what, row


@dataclass(frozen=True)
class OfferBatch:
    """One ``dq_offer_many`` call's worth of a partition: ``rows`` consecutive rows, of which
    ``len(keys)`` distinct keys are offered (the others are superseded), as Arrow arrays without
    nulls (``ats``: int64 microseconds since 1970-01-01 UTC)."""

    rows: int
    keys: Any
    payloads: Any
    types: Any
    ats: Any

    @property
    def offered(self) -> int:
        return len(self.keys)

    def params(self, queue: str, can_update: bool) -> dict[str, Any]:
        """The parameters of :data:`Q_OFFER_ARRAYS` (binary arrays, see :class:`PgArray`)."""
        return {
            "queue": queue,
            "keys": PgArray(self.keys, "text"),
            "payloads": PgArray(self.payloads, "bytea"),
            "types": PgArray(self.types, "text"),
            "ats": PgArray(self.ats, "timestamptz"),
            "can_update": can_update,
        }


@dataclass(frozen=True)
class Batching:
    """How a task turns the Arrow batches Spark hands it into offer batches: checks every row,
    converts the columns, cuts ``batch_size`` rows at a time and de-duplicates each cut (the rule
    of docs/spark.md: with ``can_update`` the last row of a key wins, otherwise the first). Arrow
    compute throughout, no Python code per row (but for struct/map/array payloads, written as
    JSON). Plain data: Spark pickles it to the executors."""

    columns: tuple[str, ...]
    batch_size: int
    can_update: bool
    default_type: str  # payload_type of rows without one
    default_at_us: int  # scheduled_at of rows without one, microseconds since 1970-01-01 UTC

    def checked(self, batch: Any, seq0: int) -> Any:
        """One Arrow batch, checked and converted: a table of key (string), payload (binary),
        payload_type (string) and at (int64 µs), without nulls. ``seq0`` is the position of its
        first row in the partition. Raises :class:`BadRow` for the first bad row."""
        import pyarrow as pa
        import pyarrow.compute as pc

        cols = dict(zip(self.columns, batch.columns, strict=True))
        n = batch.num_rows

        def fail(column: str, mask: Any, what: str) -> None:
            index = pc.index(mask, pa.scalar(True)).as_py()
            if index is not None and index >= 0:
                raise BadRow(column, what, seq0 + index)

        keys = cols["key"]
        fail("key", pc.is_null(keys), "is NULL")
        length = pc.utf8_length(keys)
        fail("key", pc.equal(length, 0), "is empty")
        fail("key", pc.greater(length, KEY_LIMIT), f"is longer than {KEY_LIMIT} characters")
        payload = cols["payload"]
        fail("payload", pc.is_null(payload), "is NULL")
        if self.default_type == "json":
            payloads = pa.array([_json_bytes(v, payload.type) for v in payload.to_pylist()], pa.binary())
        else:
            payloads = payload.cast(pa.binary())
        if "payload_type" in cols:
            ptype = cols["payload_type"]
            plen = pc.utf8_length(ptype)
            fail("payload_type", pc.equal(plen, 0), "is empty")
            too_long = f"is longer than {PAYLOAD_TYPE_LIMIT} characters"
            fail("payload_type", pc.greater(plen, PAYLOAD_TYPE_LIMIT), too_long)
            types = pc.fill_null(ptype, self.default_type)
        else:
            types = pc.fill_null(pa.nulls(n, pa.string()), self.default_type)
        if "scheduled_at" in cols:
            at_us = cols["scheduled_at"].cast(pa.timestamp("us", "UTC")).cast(pa.int64())
            ats = pc.fill_null(at_us, self.default_at_us)
        else:
            ats = pc.fill_null(pa.nulls(n, pa.int64()), self.default_at_us)
        return pa.table({"key": keys.cast(pa.string()), "payload": payloads, "payload_type": types, "at": ats})

    def cut(self, rows: Any) -> OfferBatch:
        """``rows`` (a table from :meth:`checked`) as one offer batch, de-duplicated."""
        import pyarrow as pa
        import pyarrow.compute as pc

        rows = rows.combine_chunks()
        n = rows.num_rows
        if pc.count_distinct(rows["key"]).as_py() != n:
            # the last (canUpdate) or first row of each key, in the order of the rows
            numbered = pa.table({"key": rows["key"], "i": pa.array(range(n), pa.int64())})
            pick = "max" if self.can_update else "min"
            kept = numbered.group_by("key", use_threads=False).aggregate([("i", pick)])[f"i_{pick}"]
            rows = rows.take(pc.take(kept, pc.array_sort_indices(kept)))
        return OfferBatch(
            rows=n,
            keys=rows["key"].combine_chunks(),
            payloads=rows["payload"].combine_chunks(),
            types=rows["payload_type"].combine_chunks(),
            ats=rows["at"].combine_chunks(),
        )

    def batches(self, iterator: Iterator[Any]) -> Iterator[OfferBatch]:
        """The offer batches of a partition, in order: ``batch_size`` rows each, the last one
        shorter. Each Arrow batch is checked whole before any of its rows is in a yielded batch;
        raises :class:`BadRow` (nothing of that Arrow batch yielded)."""
        import pyarrow as pa

        seq = 0
        pending: Any = None
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            rows = self.checked(batch, seq)
            seq += batch.num_rows
            pending = rows if pending is None else pa.concat_tables([pending, rows])
            while pending.num_rows >= self.batch_size:
                yield self.cut(pending.slice(0, self.batch_size))
                pending = pending.slice(self.batch_size)
        if pending is not None and pending.num_rows:
            yield self.cut(pending)


class DelayedQueueWriter(DataSourceArrowWriter):
    """Offers each partition's rows through ``dq_offer_many`` (see the module docstring and
    docs/spark.md for the duplicate-key rule and what is guaranteed when a row is bad).

    Created on the driver by :meth:`DelayedQueueDataSource.writer`, which checks the schema and the
    options and asks the database for the job's default time (``now()`` once per job, so that a
    retried task offers rows without ``scheduled_at`` with the same time as its first attempt).
    """

    def __init__(self, options: Options, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError(f"{NAME}: mode('overwrite') is not supported; offers add or replace by key: use append")
        self.dsn = _required(options, "dsn")
        self.queue = _queue_option(options)
        can_update = _bool_option(options, "canUpdate", True)
        batch_size = _int_option(options, "batchSize", DEFAULT_BATCH_SIZE, 1, 100_000)
        self.method = (options.get("writeMethod") or "arrays").lower()
        if self.method not in WRITE_METHODS:
            raise ValueError(f"{NAME}: option 'writeMethod' is {self.method!r}, it must be one of {WRITE_METHODS}")
        default_type = check_write_schema(schema)
        # Testing only (tests/test_spark.py): the first attempt of this partition raises after
        # this many of its batches were committed, to exercise Spark's task retry.
        fail = options.get("testFailFirstAttempt")  # "partition:batches"
        self.fail_first_attempt: tuple[int, int] | None = None
        if fail:
            part, _, batches = fail.partition(":")
            self.fail_first_attempt = (int(part), int(batches))
        with psycopg.connect(self.dsn, autocommit=True, application_name="pyqueue.spark writer") as conn:
            row = conn.execute(Q_WRITER_CHECK).fetchone()
        assert row is not None
        if not row[1]:
            raise ValueError(f"{NAME}: the database of 'dsn' has no dq_offer_many; install the queue (pyqueue migrate)")
        self.batching = Batching(
            columns=tuple(f.name for f in schema.fields),
            batch_size=batch_size,
            can_update=can_update,
            default_type=default_type,
            default_at_us=int(row[0]),
        )

    # ----------------------------------------------------------------- on the executors

    def write(self, iterator: Iterator[Any]) -> OfferCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        with psycopg.connect(
            self.dsn, autocommit=True, application_name=f"pyqueue.spark write {partition}.{attempt}"
        ) as conn:
            conn.adapters.register_dumper(PgArray, PgArrayDumper)
            if self.method == "copy":
                counts = self._write_staged(conn, iterator, partition, attempt)
            else:
                counts = self._write_arrays(conn, iterator, partition, attempt)
        return OfferCommitMessage(partition=partition, attempt=attempt, **counts)

    def _bad_row(self, bad: BadRow, partition: int, offered: int, method: str) -> ValueError:
        done = (
            "this task offered nothing"
            if offered == 0
            else f"this task had offered its first {offered} rows (writeMethod={method})"
        )
        return ValueError(
            f"{NAME}: column {bad.column!r} {bad.what} in row {bad.row} of partition {partition} "
            f"(rows counted from 0); {done}"
        )

    def _maybe_fail(self, partition: int, attempt: int, batches_done: int) -> None:
        if (
            self.fail_first_attempt is not None
            and attempt == 0
            and self.fail_first_attempt == (partition, batches_done)
        ):
            _task_logger().warning(
                "%s: injected failure in partition %d after %d batches", NAME, partition, batches_done
            )
            raise RuntimeError(f"{NAME}: injected failure (testFailFirstAttempt) after {batches_done} batches")

    def _write_staged(
        self, conn: psycopg.Connection[Any], iterator: Iterator[Any], partition: int, attempt: int
    ) -> dict[str, Any]:
        """Stage the partition with COPY, then offer it batch by batch from the stage."""
        import pyarrow as pa
        import pyarrow.compute as pc

        started = time.perf_counter()
        iterator = timed = TimedIterator(iterator)
        size = self.batching.batch_size
        conn.execute(Q_STAGE_DROP)
        conn.execute(Q_STAGE_CREATE)
        seq = 0
        with conn.cursor() as cur, cur.copy(Q_STAGE_COPY) as copy:
            copy.write(COPY_SIGNATURE)
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                try:
                    rows = self.batching.checked(batch, seq)
                except BadRow as bad:
                    raise self._bad_row(bad, partition, 0, self.method) from None
                seqs = pa.array(range(seq, seq + batch.num_rows), pa.int64())
                copy.write(
                    copy_rows(
                        [
                            (seqs, "int8"),
                            (pc.divide(seqs, size), "int4"),
                            (rows["key"].combine_chunks(), "text"),
                            (rows["payload"].combine_chunks(), "bytea"),
                            (rows["payload_type"].combine_chunks(), "text"),
                            (rows["at"].combine_chunks(), "timestamptz"),
                        ]
                    )
                )
                seq += batch.num_rows
            copy.write(COPY_TRAILER)
        if seq == 0:
            conn.execute(Q_STAGE_DROP)
            return {"rows": 0, "batches": 0}
        conn.execute(Q_STAGE_INDEX)
        conn.execute(Q_STAGE_ANALYZE)
        staged = time.perf_counter()
        counts = dict.fromkeys(OUTCOMES, 0)
        batches = (seq + size - 1) // size
        query = Q_OFFER_STAGED_LAST if self.batching.can_update else Q_OFFER_STAGED_FIRST
        for b in range(batches):
            self._maybe_fail(partition, attempt, b)
            rows = conn.execute(
                query, {"batch": b, "queue": self.queue, "can_update": self.batching.can_update}
            ).fetchall()  # autocommit: this statement is the batch's transaction
            for outcome, n in rows:
                counts[outcome] += int(n)
        conn.execute(Q_STAGE_DROP)
        offered = sum(counts.values())
        return {
            "rows": seq,
            "batches": batches,
            **counts,
            "superseded": seq - offered,
            "read_s": timed.seconds,
            "encode_s": staged - started - timed.seconds,
            "offer_s": time.perf_counter() - staged,
        }

    def _write_arrays(
        self, conn: psycopg.Connection[Any], iterator: Iterator[Any], partition: int, attempt: int
    ) -> dict[str, Any]:
        """Offer each batch as binary arrays; the next batch is read from Spark, checked and
        encoded (in this thread) while the database runs the current one (in another thread)."""
        counts = dict.fromkeys(OUTCOMES, 0)
        done = {"rows": 0, "batches": 0, "superseded": 0, "offer_s": 0.0}

        def offer(batch: OfferBatch, params: dict[str, Any]) -> None:  # in the offering thread
            t = time.perf_counter()
            for outcome, n in conn.execute(Q_OFFER_ARRAYS, params).fetchall():  # autocommit: one transaction
                counts[outcome] += int(n)
            done["rows"] += batch.rows
            done["batches"] += 1
            done["superseded"] += batch.rows - batch.offered
            done["offer_s"] += time.perf_counter() - t

        timed = TimedIterator(iterator)
        batches = self.batching.batches(timed)
        encode_s = wait_s = 0.0
        with ThreadPoolExecutor(1, thread_name_prefix="pyqueue.spark offer") as pool:
            running: Future[None] | None = None
            while True:
                t = time.perf_counter()
                try:
                    batch = next(batches, None)
                    params = None if batch is None else batch.params(self.queue, self.batching.can_update)
                except BadRow as bad:
                    if running is not None:
                        running.result()
                    raise self._bad_row(bad, partition, int(done["rows"]), self.method) from None
                t2 = time.perf_counter()
                encode_s += t2 - t
                if running is not None:
                    running.result()
                    wait_s += time.perf_counter() - t2
                if batch is None or params is None:
                    break
                self._maybe_fail(partition, attempt, int(done["batches"]))
                running = pool.submit(offer, batch, params)
        return {
            **done,
            **counts,
            "read_s": timed.seconds,
            "encode_s": encode_s - timed.seconds,
            "wait_s": wait_s,
        }

    # ----------------------------------------------------------------- on the driver

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = OfferSummary.of(self.queue, messages)
        _driver_logger().info("%s", summary, extra={"offer_summary": summary.__dict__})

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = OfferSummary.of(self.queue, messages)
        _driver_logger().warning(
            "%s: write to queue %r failed; batches already committed stay offered (offering them again is"
            " safe: the keys de-duplicate). Finished tasks: %s",
            NAME,
            self.queue,
            summary,
        )


class DelayedQueueStreamWriter(DataSourceStreamArrowWriter):
    """The Structured Streaming sink: every micro-batch is offered by the tasks exactly as a
    ``df.write`` job would (:class:`DelayedQueueWriter`: same options, checks, batches and
    outcomes). Spark runs a micro-batch again after a failure or a restart from its checkpoint
    when the batch was not committed; its keys make the rows already offered ``ignored``, so the
    queue holds each key once (docs/spark.md, "Structured Streaming").

    Created once per start of the query: the default time of rows without ``scheduled_at`` is
    ``now()`` at that start. Output mode ``complete`` is refused (offers cannot replace a queue).
    """

    def __init__(self, options: Options, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError(
                f"{NAME}: outputMode('complete') is not supported; offers add or replace by key: use append or update"
            )
        self.offers = DelayedQueueWriter(options, schema, overwrite=False)

    def write(self, iterator: Iterator[Any]) -> OfferCommitMessage:
        return self.offers.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        summary = OfferSummary.of(self.offers.queue, messages)
        _driver_logger().info(
            "%s (micro-batch %d)", summary, batchId, extra={"offer_summary": summary.__dict__, "batch_id": batchId}
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _driver_logger().warning(
            "%s: micro-batch %d to queue %r failed; Spark runs it again (the keys make the rows already offered"
            " ignored). Finished tasks: %s",
            NAME,
            batchId,
            self.offers.queue,
            OfferSummary.of(self.offers.queue, messages),
        )


def _driver_logger() -> logging.Logger:
    """The ``pyqueue.spark`` logger, made to show INFO in the Python process Spark starts for
    commit/abort on the driver (it has no logging configuration of its own): level INFO unless
    set, and a stderr handler when nothing in the process handles records (with
    ``spark.sql.pyspark.worker.logging.enabled`` Spark installs one, and the records appear in
    ``spark.tvf.python_worker_logs()``)."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    return log


def _json_ready(value: Any, arrow_type: Any) -> Any:
    """A Python value from Arrow's ``to_pylist`` made JSON-serialisable, following its Arrow type."""
    import pyarrow.types as pat

    if value is None:
        return None
    if pat.is_struct(arrow_type):
        return {
            arrow_type.field(i).name: _json_ready(value[arrow_type.field(i).name], arrow_type.field(i).type)
            for i in range(arrow_type.num_fields)
        }
    if pat.is_map(arrow_type):
        return {str(_json_ready(k, arrow_type.key_type)): _json_ready(v, arrow_type.item_type) for k, v in value}
    if pat.is_list(arrow_type) or pat.is_large_list(arrow_type):
        return [_json_ready(v, arrow_type.value_type) for v in value]
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


def _json_bytes(value: Any, arrow_type: Any) -> bytes:
    return json.dumps(_json_ready(value, arrow_type), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Table:
    """A readable table: its name, the functions that read it (sql/170_export.sql), its split
    column and its columns (name, Spark type, nullable), in the order the read function returns them."""

    name: str
    function: str  # dq_export_messages(id_from, id_to, filters): the rows of an id range
    bounds: str  # dq_export_messages_bounds(filters): the smallest and largest id
    split: str
    columns: tuple[tuple[str, DataType, bool], ...]

    @property
    def schema(self) -> StructType:
        return StructType([StructField(n, t, nullable) for n, t, nullable in self.columns])


def _col(name: str, data_type: DataType, nullable: bool = False) -> tuple[str, DataType, bool]:
    return (name, data_type, nullable)


MESSAGES = _Table(
    name="dq_messages",
    function="dq_export_messages",
    bounds="dq_export_messages_bounds",
    split="id",
    columns=(
        _col("id", LongType()),
        _col("queue", StringType()),
        _col("key", StringType()),
        _col("payload", BinaryType()),
        _col("payload_type", StringType()),
        _col("scheduled_at", TimestampType()),
        _col("scheduled_at_initially", TimestampType()),
        _col("delivery_count", IntegerType()),
        _col("created_at", TimestampType()),
        _col("locked", BooleanType()),  # whether a consumer holds the message; its lock token is never read
        _col("last_error", StringType(), True),
        _col("last_error_at", TimestampType(), True),
        _col("dead_from", StringType(), True),
        _col("dead_at", TimestampType(), True),
    ),
)
ARCHIVE = _Table(
    name="dq_archive",
    function="dq_export_archive",
    bounds="dq_export_archive_bounds",
    split="archive_id",
    columns=(
        _col("archive_id", LongType()),
        _col("id", LongType()),
        _col("queue", StringType()),
        _col("key", StringType()),
        _col("payload", BinaryType()),
        _col("payload_type", StringType()),
        _col("scheduled_at", TimestampType()),
        _col("scheduled_at_initially", TimestampType()),
        _col("created_at", TimestampType()),
        _col("delivery_count", IntegerType()),
        _col("outcome", StringType()),
        _col("acked_at", TimestampType()),
        _col("last_error", StringType(), True),
    ),
)
TABLES = {"messages": MESSAGES, "archive": ARCHIVE}
MESSAGES_SCHEMA = MESSAGES.schema
ARCHIVE_SCHEMA = ARCHIVE.schema

# Pushed filter kinds → the operator of the export functions' filters. In, IsNull and IsNotNull apart.
_COMPARISONS: dict[type[Filter], str] = {
    EqualTo: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}
_NULLS: dict[type[Filter], str] = {IsNull: "IS NULL", IsNotNull: "IS NOT NULL"}


def _table(options: Any) -> _Table:
    name = (options.get("table") or "messages").lower()
    if name not in TABLES:
        raise ValueError(f"{NAME}: option 'table' is {name!r}, it must be 'messages' or 'archive'")
    return TABLES[name]


def _filter_value(value: Any) -> Any:
    """A pushed literal as a JSON value of a filter, or ``_UNPUSHABLE``. Spark passes timestamp
    literals as aware datetimes (UTC); a naive one (timestamp_ntz) is read as UTC, as Spark's
    variant decoding defines it. Timestamps travel as ISO 8601 text with their offset, which the
    export functions cast to timestamptz exactly (microseconds included)."""
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)).isoformat()
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return _UNPUSHABLE


_UNPUSHABLE = object()


@dataclass(frozen=True)
class _Pushed:
    """One pushed filter in plain data (picklable): column, operator, value."""

    column: str
    op: str  # one of _COMPARISONS' values, "IN", "IS NULL", "IS NOT NULL"
    value: Any = None

    def as_json(self) -> list[Any]:
        """The filter as the export functions take it: [column, op, value] or [column, op]."""
        if self.op in _NULLS.values():
            return [self.column, self.op]
        return [self.column, self.op, list(self.value) if self.op == "IN" else self.value]


class IdRange(InputPartition):
    """Rows with ``lo <= split column < hi`` (``index`` numbers the partitions from 0)."""

    def __init__(self, index: int, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.index = index
        self.lo = lo
        self.hi = hi


class DelayedQueueReader(DataSourceReader):
    """Reads ``dq_messages`` or ``dq_archive`` in id ranges through the export functions
    (``dq_export_messages``, granted to ``dq_consumer``; ``dq_export_archive``, granted to
    ``dq_admin``), with the pushed filters passed to them as a JSON argument."""

    def __init__(self, options: Options, schema: StructType) -> None:
        self.dsn = _required(options, "dsn")
        self.table = _table(options)
        self.queue = options.get("queue") or None
        if self.queue is not None:
            _queue_option(options)
        self.num_partitions = _int_option(options, "numPartitions", 4, 1, 10_000)
        self.fetch_size = _int_option(options, "fetchSize", 10_000, 1, 1_000_000)
        known = {name: (data_type, nullable) for name, data_type, nullable in self.table.columns}
        for f in schema.fields:  # a user-given schema may choose (a subset of) the columns
            if f.name not in known:
                raise ValueError(f"{NAME}: column {f.name!r} is not a column of {self.table.name}")
            if f.dataType != known[f.name][0]:
                raise ValueError(
                    f"{NAME}: column {f.name!r} is {known[f.name][0].simpleString()} in {self.table.name}, "
                    f"not {f.dataType.simpleString()}"
                )
        self.schema = schema
        self.pushed: list[_Pushed] = []

    # ----------------------------------------------------------------- planning (driver)

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        columns = {name: data_type for name, data_type, _ in self.table.columns}
        for f in filters:
            attr: tuple[str, ...] = getattr(f, "attribute", ())
            name = attr[0] if len(attr) == 1 else None
            if name is None or name not in columns:
                yield f
                continue
            kind = type(f)
            comparable = not isinstance(columns[name], BinaryType)
            if kind in _COMPARISONS and comparable:
                value = _filter_value(f.value)  # type: ignore[attr-defined]
                if value is _UNPUSHABLE:
                    yield f
                    continue
                self.pushed.append(_Pushed(name, _COMPARISONS[kind], value))
            elif kind is In and comparable:
                values = tuple(_filter_value(v) for v in f.value)  # type: ignore[attr-defined]
                if any(v is _UNPUSHABLE for v in values):
                    yield f
                    continue
                self.pushed.append(_Pushed(name, "IN", values))
            elif kind in _NULLS:
                self.pushed.append(_Pushed(name, _NULLS[kind]))
            else:
                yield f

    def filters(self) -> str:
        """The ``filters`` argument of the export functions: the queue option and the pushed
        filters, as JSON text."""
        parts = [["queue", "=", self.queue]] if self.queue is not None else []
        parts.extend(p.as_json() for p in self.pushed)
        return json.dumps(parts, ensure_ascii=False)

    def partitions(self) -> Sequence[InputPartition]:
        query = sql.SQL("SELECT id_min, id_max FROM {bounds}(%s::jsonb)").format(
            bounds=sql.Identifier(self.table.bounds)
        )
        with psycopg.connect(self.dsn, autocommit=True, application_name="pyqueue.spark reader") as conn:
            row = conn.execute(query, [self.filters()]).fetchone()
        assert row is not None
        lo, hi = row
        if lo is None:
            return [IdRange(0, 0, 0)]
        span = hi - lo + 1
        n = min(self.num_partitions, span)
        bounds = [lo + span * i // n for i in range(n + 1)]
        return [IdRange(i, bounds[i], bounds[i + 1]) for i in range(n)]

    def query(self, partition: IdRange) -> tuple[sql.Composed, list[Any]]:
        """The call that opens the cursor of one partition, and its parameters (composed, never string-built)."""
        query = sql.SQL("SELECT {function}(%s, %s, %s::jsonb)").format(function=sql.Identifier(self.table.function))
        return query, [partition.lo, partition.hi, self.filters()]

    # ----------------------------------------------------------------- reading (executors)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, IdRange)
        if partition.hi <= partition.lo:
            return
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        query, params = self.query(partition)
        fetched = 0
        # The function opens a cursor over all the table's columns (in self.table.columns' order);
        # the schema's fields pick theirs.
        order = [name for name, _, _ in self.table.columns]
        picks = [order.index(f.name) for f in self.schema.fields]
        with psycopg.connect(self.dsn, application_name=f"pyqueue.spark read {partition.index}") as conn:
            text = query.as_string(conn)
            row = conn.execute(query, params).fetchone()
            assert row is not None
            fetch = sql.SQL("FETCH FORWARD {} FROM {}").format(sql.Literal(self.fetch_size), sql.Identifier(row[0]))
            with conn.cursor() as cur:
                while rows := cur.execute(fetch).fetchall():
                    fetched += len(rows)
                    columns = list(zip(*rows, strict=True))
                    arrays = [
                        pa.array(
                            [bytes(v) for v in columns[i]] if pa.types.is_binary(field.type) else columns[i],
                            type=field.type,
                        )
                        for i, field in zip(picks, arrow_schema, strict=True)
                    ]
                    yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
            conn.rollback()
        _task_logger().info(
            "%s: read partition %d of %s: %d rows fetched by: %s; parameters %r; columns %s",
            NAME,
            partition.index,
            self.table.name,
            fetched,
            text,
            params,
            ", ".join(f.name for f in self.schema.fields),
            extra={"sql": text, "rows_fetched": fetched},
        )


def _task_logger() -> logging.Logger:
    """The ``pyqueue.spark`` logger in a task: level INFO unless set, so that the queries a read
    runs reach ``spark.tvf.python_worker_logs()`` when Spark's worker logging is on."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    return log
