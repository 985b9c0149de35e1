"""Reading: the live messages (``dq_messages``) or the archive (``dq_archive``) as a DataFrame,
through the export functions (``dq_export_messages``, which ``dq_consumer`` may call, and
``dq_export_archive``, for ``dq_admin``; no role reads the tables directly). The id range of the
table (``archive_id`` of ``dq_archive``) is split into ``numPartitions`` parallel reads, and
comparisons on the queue, the keys and the times are passed to the function as its ``filters``
argument, which PostgreSQL plans with the id range (docs/spark.md, "Reading").
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql.datasource import (
    DataSourceReader,
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
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .logs import task_logger
from .options import NAME, Options, ReadOptions, table_option
from .statements import statements

__all__ = ["DelayedQueueReader", "IdRange", "MESSAGES", "ARCHIVE", "TABLES", "MESSAGES_SCHEMA", "ARCHIVE_SCHEMA"]


@dataclass(frozen=True)
class _Table:
    """A readable table: its name, its split column and its columns (name, Spark type, nullable),
    in the order its export function (sql/170_export.sql) returns them."""

    name: str
    split: str
    columns: tuple[tuple[str, DataType, bool], ...]

    @property
    def schema(self) -> StructType:
        return StructType([StructField(n, t, nullable) for n, t, nullable in self.columns])


def _col(name: str, data_type: DataType, nullable: bool = False) -> tuple[str, DataType, bool]:
    return (name, data_type, nullable)


# The columns of a message that dq_messages and dq_archive share, in the same order.
_MESSAGE_COLUMNS = (
    _col("id", LongType()),
    _col("queue", StringType()),
    _col("key", StringType()),
    _col("payload", BinaryType()),
    _col("payload_type", StringType()),
    _col("scheduled_at", TimestampType()),
    _col("scheduled_at_initially", TimestampType()),
)
MESSAGES = _Table(
    name="dq_messages",
    split="id",
    columns=(
        *_MESSAGE_COLUMNS,
        _col("delivery_count", IntegerType()),
        _col("created_at", TimestampType()),
        _col("locked", BooleanType()),  # whether a consumer holds the message; its lock token is never read
        _col("last_error", StringType(), True),
        _col("last_error_at", TimestampType(), True),
        _col("dead_from", StringType(), True),
        _col("dead_at", TimestampType(), True),
        _col("released_at", TimestampType(), True),  # when its parents released it; None: it never waited
    ),
)
ARCHIVE = _Table(
    name="dq_archive",
    split="archive_id",
    columns=(
        _col("archive_id", LongType()),
        *_MESSAGE_COLUMNS,
        _col("created_at", TimestampType()),
        _col("delivery_count", IntegerType()),
        _col("outcome", StringType()),
        _col("acked_at", TimestampType()),
        _col("last_error", StringType(), True),
        _col("released_at", TimestampType(), True),
    ),
)
TABLES = {"messages": MESSAGES, "archive": ARCHIVE}
MESSAGES_SCHEMA = MESSAGES.schema
ARCHIVE_SCHEMA = ARCHIVE.schema


def table_of(options: Options) -> _Table:
    """The table the option ``table`` names."""
    return TABLES[table_option(options)]


def _export(name: str, schema: str | None) -> tuple[str, str]:
    """The statements that read the table ``name`` (a key of :data:`TABLES`) from the install in
    ``schema``: its bounds (``dq_export_messages_bounds(filters)``: the smallest and largest id),
    and the call that opens a cursor over an id range (``dq_export_messages(id_from, id_to, filters)``)."""
    s = statements(schema)
    return (s.archive_bounds, s.archive_open) if name == "archive" else (s.messages_bounds, s.messages_open)


# Pushed filter kinds → the operator of the export functions' filters. In, IsNull and IsNotNull apart.
_COMPARISONS: dict[type[Filter], str] = {
    EqualTo: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}
_NULLS: dict[type[Filter], str] = {IsNull: "IS NULL", IsNotNull: "IS NOT NULL"}


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
        self.options = ReadOptions.parse(options)
        self.table = TABLES[self.options.table]
        self.bounds_sql, self.open_sql = _export(self.options.table, self.options.schema)
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
        parts = [["queue", "=", self.options.queue]] if self.options.queue is not None else []
        parts.extend(p.as_json() for p in self.pushed)
        return json.dumps(parts, ensure_ascii=False)

    def partitions(self) -> Sequence[InputPartition]:
        with psycopg.connect(self.options.dsn, autocommit=True, application_name="pyqueue.spark reader") as conn:
            row = conn.execute(self.bounds_sql, [self.filters()]).fetchone()
        assert row is not None
        lo, hi = row
        if lo is None:
            return [IdRange(0, 0, 0)]
        span = hi - lo + 1
        n = min(self.options.num_partitions, span)
        bounds = [lo + span * i // n for i in range(n + 1)]
        return [IdRange(i, bounds[i], bounds[i + 1]) for i in range(n)]

    def query(self, partition: IdRange) -> tuple[str, list[Any]]:
        """The call that opens the cursor of one partition, and its parameters (never string-built)."""
        return self.open_sql, [partition.lo, partition.hi, self.filters()]

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
        with psycopg.connect(self.options.dsn, application_name=f"pyqueue.spark read {partition.index}") as conn:
            row = conn.execute(query, params).fetchone()
            assert row is not None
            size = self.options.fetch_size
            fetch = sql.SQL("FETCH FORWARD {} FROM {}").format(sql.Literal(size), sql.Identifier(row[0]))
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
        task_logger().info(
            "%s: read partition %d of %s: %d rows fetched by: %s; parameters %r; columns %s",
            NAME,
            partition.index,
            self.table.name,
            fetched,
            query,
            params,
            ", ".join(f.name for f in self.schema.fields),
            extra={"sql": query, "rows_fetched": fetched},
        )
