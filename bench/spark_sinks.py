"""Spark's own ceiling for ``bench/spark.py``: two Python data sources that write the same
DataFrame as ``delayedqueue`` does, one without a database, one with the cheapest write there is.

* ``dqbench_noop``: each task reads its partition from Spark and puts it through the same batch
  handling as ``delayedqueue``'s default write (:class:`pyqueue.spark.Batching`: every row checked,
  ``batchSize`` rows cut at a time, de-duplicated, encoded as the binary array parameters of
  ``dq_offer_many``), then drops the batches. What Spark and the task's Python cost without any
  database.
* ``dqbench_copy``: each task checks its rows the same way and copies them, in PostgreSQL's
  binary COPY format, into an unindexed table (option ``table``, created by the benchmark), one
  ``COPY`` and one transaction per task. No de-duplication, no outcomes, no index: the most a
  database write from Spark tasks can reach.

Both return the task time per phase (reading from Spark, checking/encoding, copying) in their
commit messages; the driver logs their sum on ``bench.spark_sinks`` (in ``python_worker_logs()``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pyqueue.spark import (
    COPY_SIGNATURE,
    COPY_TRAILER,
    Batching,
    Options,
    TimedIterator,
    check_write_schema,
    copy_rows,
)

log = logging.getLogger("bench.spark_sinks")
DEFAULT_AT_US = 1_893_456_000_000_000  # 2030-01-01 UTC: rows without scheduled_at (the bench always has it)


@dataclass(frozen=True)
class PhaseTimes(WriterCommitMessage):
    """One task's rows and time per phase, in seconds."""

    rows: int
    read_s: float  # waiting for Spark's next Arrow batch
    encode_s: float  # checking and encoding
    copy_s: float = 0.0  # COPY (dqbench_copy)


def _batching(options: dict[str, str], schema: StructType) -> Batching:
    opts = Options(options)
    return Batching(
        columns=tuple(f.name for f in schema.fields),
        batch_size=int(opts.get("batchSize") or 1000),
        can_update=True,
        default_type=check_write_schema(schema),
        default_at_us=DEFAULT_AT_US,
    )


def _log_summary(name: str, messages: list[WriterCommitMessage | None]) -> None:
    ours = [m for m in messages if isinstance(m, PhaseTimes)]
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.info(
        "%s: %d rows from %d tasks; task time: reading from Spark %.1f s, checking/encoding %.1f s, copying %.1f s",
        name,
        sum(m.rows for m in ours),
        len(ours),
        sum(m.read_s for m in ours),
        sum(m.encode_s for m in ours),
        sum(m.copy_s for m in ours),
    )


class SinkWriter(DataSourceArrowWriter):
    """A sink's writer: the batch handling, the sink's options; its commit logs the phase times."""

    sink = ""

    def __init__(self, batching: Batching, options: dict[str, str]) -> None:
        self.batching = batching
        self.options = options

    def write(self, iterator: Iterator[Any]) -> PhaseTimes:
        start = time.perf_counter()
        timed = TimedIterator(iterator)
        rows, copy_s = self.consume(timed)
        encode_s = time.perf_counter() - start - timed.seconds - copy_s
        return PhaseTimes(rows=rows, read_s=timed.seconds, encode_s=encode_s, copy_s=copy_s)

    def consume(self, arrow_batches: Iterator[Any]) -> tuple[int, float]:
        """Write the Arrow batches; return the rows and the seconds spent copying."""
        raise NotImplementedError

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_summary(f"{self.sink} {self.options.get('label', '')}", messages)


class NoopWriter(SinkWriter):
    sink = "dqbench_noop"

    def consume(self, arrow_batches: Iterator[Any]) -> tuple[int, float]:
        rows = 0
        for batch in self.batching.batches(arrow_batches):
            batch.params("bench", True)  # the binary arrays delayedqueue sends
            rows += batch.rows
        return rows, 0.0


class CopyWriter(SinkWriter):
    sink = "dqbench_copy"

    def consume(self, arrow_batches: Iterator[Any]) -> tuple[int, float]:
        rows = 0
        copy_s = 0.0
        query = sql.SQL("COPY {} (key, payload, payload_type, scheduled_at) FROM STDIN (FORMAT binary)").format(
            sql.Identifier(self.options["table"])
        )
        with psycopg.connect(self.options["dsn"], application_name="bench.spark_sinks copy") as conn:
            with conn.cursor() as cur, cur.copy(query) as copy:
                copy.write(COPY_SIGNATURE)
                for batch in arrow_batches:
                    if batch.num_rows == 0:
                        continue
                    checked = self.batching.checked(batch, rows)
                    data = copy_rows(
                        [
                            (checked["key"].combine_chunks(), "text"),
                            (checked["payload"].combine_chunks(), "bytea"),
                            (checked["payload_type"].combine_chunks(), "text"),
                            (checked["at"].combine_chunks(), "timestamptz"),
                        ]
                    )
                    t = time.perf_counter()
                    copy.write(data)
                    copy_s += time.perf_counter() - t
                    rows += batch.num_rows
                t = time.perf_counter()
                copy.write(COPY_TRAILER)
            conn.commit()
            copy_s += time.perf_counter() - t
        return rows, copy_s


class Sink(DataSource):
    """A sink: its name is its writer's; the writer gets the batch handling and the options."""

    writer_class: type[SinkWriter]

    @classmethod
    def name(cls) -> str:
        return cls.writer_class.sink

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return self.writer_class(_batching(self.options, schema), dict(self.options))


class NoopSink(Sink):
    """``dqbench_noop``: the batch handling of ``delayedqueue``, no database. Option ``label``: a
    word the commit summary starts with."""

    writer_class = NoopWriter


class CopySink(Sink):
    """``dqbench_copy``: binary COPY into an unindexed table (options ``dsn``, ``table``), one
    COPY per task. Option ``label`` as for dqbench_noop."""

    writer_class = CopyWriter


def register(spark: Any) -> None:
    """Register both sinks with ``spark``."""
    spark.dataSource.register(NoopSink)
    spark.dataSource.register(CopySink)
