"""PostgreSQL's binary formats, built from Arrow columns by pyarrow's compute kernels with no
Python code per row: a binary array parameter (what ``array_recv`` reads) for ``dq_offer_many``,
binary COPY rows (PostgreSQL manual, COPY, "Binary Format") for the stage of
``writeMethod=copy``. In both, a value is its length as a 4-byte big-endian integer followed by
its bytes; a timestamptz is a big-endian int8 of microseconds since 2000-01-01 00:00 UTC.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence
from typing import Any

import psycopg

__all__ = ["PgArray", "PgArrayDumper", "copy_rows", "COPY_SIGNATURE", "COPY_TRAILER"]

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
