"""From the rows Spark hands a write task to offer batches: the DataFrame's columns checked on
the driver (:func:`check_write_schema`), then in the task every row checked, converted, cut into
batches of ``batchSize`` rows and de-duplicated (:class:`Batching`), with pyarrow's compute
functions and no Python code per row (but for struct/map/array payloads, written as JSON).
The limits a row must keep are the database's (:mod:`pyqueue.limits`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from .. import limits
from .options import NAME
from .pgbinary import PgArray

__all__ = ["check_write_schema", "Batching", "OfferBatch", "BadRow", "TimedIterator"]

# --------------------------------------------------------------------------- the DataFrame's columns


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
    allowed = ("key", "payload", "scheduled_at", "payload_type", "after", "on_parent_failure")
    unknown = [name for name in fields if name not in allowed]
    if unknown:
        raise ValueError(
            f"{NAME}: unknown column {unknown[0]!r}; the columns are key, payload, scheduled_at, payload_type, "
            "after, on_parent_failure"
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
    for name in ("payload_type", "on_parent_failure"):
        if name in fields and not isinstance(fields[name].dataType, StringType):
            raise ValueError(f"{NAME}: column {name!r} is {fields[name].dataType.simpleString()}, it must be string")
    if "after" in fields:
        after_type = fields["after"].dataType
        element = after_type.elementType if isinstance(after_type, ArrayType) else None
        if not (isinstance(element, StringType)
                or (isinstance(element, ArrayType) and isinstance(element.elementType, StringType))):
            raise ValueError(
                f"{NAME}: column 'after' is {after_type.simpleString()}, it must be array<string> (keys of the "
                "queue) or array<array<string>> ([queue, key] pairs)"
            )
    return kind


def _after_json(value: Any) -> str:
    """An ``after`` cell as the JSON text of dq_offer_many's afters element: ``[]`` for NULL."""
    return "[]" if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------- JSON payloads


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
    afters: Any = None  # JSON text of each row's parents ("[]": none), when the DataFrame has them
    failures: Any = None  # each row's on_parent_failure, likewise

    @property
    def offered(self) -> int:
        return len(self.keys)

    def params(self, queue: str, can_update: bool) -> dict[str, Any]:
        """The parameters of the statement ``offer_arrays`` of :mod:`pyqueue.spark.statements`
        (binary arrays, see :class:`PgArray`)."""
        return {
            "queue": queue,
            "keys": PgArray(self.keys, "text"),
            "payloads": PgArray(self.payloads, "bytea"),
            "types": PgArray(self.types, "text"),
            "ats": PgArray(self.ats, "timestamptz"),
            "can_update": can_update,
            **({} if self.afters is None else {"afters": PgArray(self.afters, "text"),
                                                "failures": PgArray(self.failures, "text")}),
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

    @property
    def parents(self) -> bool:
        """The DataFrame names parents (an ``after`` or ``on_parent_failure`` column)."""
        return "after" in self.columns or "on_parent_failure" in self.columns

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
        fail("key", pc.greater(length, limits.KEY_CHARS), f"is longer than {limits.KEY_CHARS} characters")
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
            too_long = f"is longer than {limits.PAYLOAD_TYPE_CHARS} characters"
            fail("payload_type", pc.greater(plen, limits.PAYLOAD_TYPE_CHARS), too_long)
            types = pc.fill_null(ptype, self.default_type)
        else:
            types = pc.fill_null(pa.nulls(n, pa.string()), self.default_type)
        if "scheduled_at" in cols:
            at_us = cols["scheduled_at"].cast(pa.timestamp("us", "UTC")).cast(pa.int64())
            ats = pc.fill_null(at_us, self.default_at_us)
        else:
            ats = pc.fill_null(pa.nulls(n, pa.int64()), self.default_at_us)
        table = {"key": keys.cast(pa.string()), "payload": payloads, "payload_type": types, "at": ats}
        if self.parents:
            # A JSON array per row (the database checks its elements); NULL: no parents.
            after = cols.get("after")
            table["after"] = (pa.array(["[]"] * n, pa.string()) if after is None
                              else pa.array([_after_json(v) for v in after.to_pylist()], pa.string()))
            failure = cols.get("on_parent_failure")
            table["on_parent_failure"] = pc.fill_null(
                pa.nulls(n, pa.string()) if failure is None else failure.cast(pa.string()), "wait")
        return pa.table(table)

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
            afters=rows["after"].combine_chunks() if self.parents else None,
            failures=rows["on_parent_failure"].combine_chunks() if self.parents else None,
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
