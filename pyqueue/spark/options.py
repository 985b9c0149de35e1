"""The options of the ``delayedqueue`` data source, read and checked on the driver before any
task starts (docs/spark.md, "Options"): each error names the option and says what it must be.

A limit the database has (a queue name's length, the items of one ``dq_offer_many`` call) comes
from :mod:`pyqueue.limits`; the checks of the clients (:mod:`pyqueue.core.checks`) decide, and the
message is the data source's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import limits
from ..core.checks import check_int, check_queue_name, check_schema
from ..errors import InvalidArgument

__all__ = ["NAME", "Options", "OptionError", "WriteOptions", "ReadOptions"]

#: The data source's name (``format("delayedqueue")``); every error message starts with it.
NAME = "delayedqueue"

WRITE_METHODS = ("copy", "arrays")
DEFAULT_BATCH_SIZE = 1000
#: The largest ``batchSize``: the items one ``dq_offer_many`` call takes.
BATCH_SIZE_MAX = limits.OFFER_MANY_MAX_ITEMS
#: The bounds of the read options (the data source's own: no database limit is behind them).
NUM_PARTITIONS_MAX = 10_000
FETCH_SIZE_MAX = 1_000_000
TABLE_NAMES = ("messages", "archive")


class OptionError(ValueError):
    """An option is missing or malformed."""


class Options:
    """Options by case-insensitive name, as Spark treats them (``batchSize`` is ``batchsize``)."""

    def __init__(self, options: Any) -> None:
        self._values = {str(k).lower(): str(v) for k, v in dict(options).items()}

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)

    def required(self, name: str) -> str:
        value = self.get(name)
        if value is None or value == "":
            raise OptionError(f"{NAME}: option {name!r} is required")
        return value

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        raw = self.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise OptionError(f"{NAME}: option {name!r} is {raw!r}, it must be an integer") from None
        try:
            return int(check_int(value, name, lo, hi))
        except InvalidArgument:
            raise OptionError(f"{NAME}: option {name!r} is {value}, it must be between {lo} and {hi}") from None

    def boolean(self, name: str, default: bool) -> bool:
        raw = self.get(name)
        if raw is None:
            return default
        if raw.strip().lower() in ("true", "1", "yes"):
            return True
        if raw.strip().lower() in ("false", "0", "no"):
            return False
        raise OptionError(f"{NAME}: option {name!r} is {raw!r}, it must be true or false")

    def queue(self) -> str:
        """The required option ``queue``: a queue name (1 to :data:`pyqueue.limits.QUEUE_CHARS` characters)."""
        queue = self.required("queue")
        try:
            return check_queue_name(queue)
        except InvalidArgument:
            raise OptionError(
                f"{NAME}: option 'queue' is {len(queue)} characters, the limit is {limits.QUEUE_CHARS}"
            ) from None

    def schema(self) -> str | None:
        """The option ``schema``: the schema of the install (``pyqueue migrate --schema``), or None
        when it is absent or empty (the connection's ``search_path`` finds the functions)."""
        schema = self.get("schema") or None
        try:
            return check_schema(schema)
        except InvalidArgument:
            raise OptionError(
                f"{NAME}: option 'schema' is {schema!r}, it must be a schema name of 1 to 63 bytes"
            ) from None


@dataclass(frozen=True)
class WriteOptions:
    """The options of ``df.write`` and ``stream.writeStream`` (docs/spark.md, "Writing")."""

    dsn: str
    queue: str
    schema: str | None
    can_update: bool
    batch_size: int
    method: str  # one of WRITE_METHODS
    # Testing only (tests/spark/test_spark_write.py): the first attempt of this partition raises after this
    # many of its batches were committed, to exercise Spark's task retry ("partition:batches").
    fail_first_attempt: tuple[int, int] | None = None

    @classmethod
    def parse(cls, options: Options) -> WriteOptions:
        dsn = options.required("dsn")
        queue = options.queue()
        can_update = options.boolean("canUpdate", True)
        batch_size = options.integer("batchSize", DEFAULT_BATCH_SIZE, 1, BATCH_SIZE_MAX)
        method = (options.get("writeMethod") or "arrays").lower()
        if method not in WRITE_METHODS:
            raise OptionError(f"{NAME}: option 'writeMethod' is {method!r}, it must be one of {WRITE_METHODS}")
        schema = options.schema()
        fail = options.get("testFailFirstAttempt")
        fail_first_attempt = None
        if fail:
            part, _, batches = fail.partition(":")
            fail_first_attempt = (int(part), int(batches))
        return cls(dsn, queue, schema, can_update, batch_size, method, fail_first_attempt)


def table_option(options: Options) -> str:
    """The option ``table`` of a read: ``messages`` (the default) or ``archive``."""
    name = (options.get("table") or "messages").lower()
    if name not in TABLE_NAMES:
        raise OptionError(f"{NAME}: option 'table' is {name!r}, it must be 'messages' or 'archive'")
    return name


@dataclass(frozen=True)
class ReadOptions:
    """The options of ``spark.read`` (docs/spark.md, "Reading")."""

    dsn: str
    table: str  # one of TABLE_NAMES
    queue: str | None  # only this queue, or every queue
    schema: str | None
    num_partitions: int
    fetch_size: int

    @classmethod
    def parse(cls, options: Options) -> ReadOptions:
        dsn = options.required("dsn")
        table = table_option(options)
        queue = options.queue() if options.get("queue") else None
        num_partitions = options.integer("numPartitions", 4, 1, NUM_PARTITIONS_MAX)
        fetch_size = options.integer("fetchSize", 10_000, 1, FETCH_SIZE_MAX)
        schema = options.schema()
        return cls(dsn, table, queue, schema, num_partitions, fetch_size)
