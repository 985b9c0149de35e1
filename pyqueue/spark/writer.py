"""Writing: each task offers its partition through ``dq_offer_many_counts`` (``dq_offer_many`` on
an install older than it; docs/spark.md, "Writing"),
in batches of ``batchSize`` rows, one call and one transaction per batch, by one of two methods
(option ``writeMethod``):

* ``arrays`` (default): each Arrow batch Spark hands over is checked, then its rows are cut into
  batches, de-duplicated and encoded as PostgreSQL binary arrays (:mod:`.rows`,
  :mod:`.pgbinary`); a second thread of the task runs each batch's ``dq_offer_many`` while the
  task reads and encodes the next one. Measured fastest (docs/spark.md).
* ``copy``: the whole partition is first staged in a temporary table with ``COPY`` and checked,
  then offered from the stage by set-based calls; a bad row stops the task before it offers
  anything, at the cost of not overlapping Spark's work with the database's.

The same writer is a Structured Streaming sink (:class:`DelayedQueueStreamWriter`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from .logs import driver_logger, task_logger
from .options import NAME, Options, WriteOptions
from .pgbinary import COPY_SIGNATURE, COPY_TRAILER, PgArray, PgArrayDumper, copy_rows
from .rows import BadRow, Batching, OfferBatch, TimedIterator, check_write_schema
from .statements import statements

__all__ = ["DelayedQueueWriter", "DelayedQueueStreamWriter", "OfferCommitMessage", "OfferSummary"]

OUTCOMES = ("created", "updated", "ignored")  # of dq_offer_many


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
        self.options = WriteOptions.parse(options)
        self.sql = statements(self.options.schema)
        default_type = check_write_schema(schema)
        with psycopg.connect(self.options.dsn, autocommit=True, application_name="pyqueue.spark writer") as conn:
            row = conn.execute(self.sql.writer_check, {"schema": self.options.schema}).fetchone()
        assert row is not None
        if not row[1]:
            install = self.options.schema
            where, flag = ("", "") if install is None else (f" in schema {install!r}", f" --schema {install}")
            raise ValueError(
                f"{NAME}: the database of 'dsn' has no dq_offer_many{where}; install the queue (pyqueue migrate{flag})"
            )
        # dq_offer_many_counts (no row per key) where the install has it, dq_offer_many before it.
        self.counts_only = bool(row[2])
        self.batching = Batching(
            columns=tuple(f.name for f in schema.fields),
            batch_size=self.options.batch_size,
            can_update=self.options.can_update,
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
            self.options.dsn, autocommit=True, application_name=f"pyqueue.spark write {partition}.{attempt}"
        ) as conn:
            conn.adapters.register_dumper(PgArray, PgArrayDumper)
            if self.options.method == "copy":
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
            self.options.fail_first_attempt is not None
            and attempt == 0
            and self.options.fail_first_attempt == (partition, batches_done)
        ):
            task_logger().warning(
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
        conn.execute(self.sql.stage_drop)
        conn.execute(self.sql.stage_create)
        seq = 0
        parents = self.batching.parents
        with conn.cursor() as cur, cur.copy(self.sql.stage_copy_after if parents else self.sql.stage_copy) as copy:
            copy.write(COPY_SIGNATURE)
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                try:
                    rows = self.batching.checked(batch, seq)
                except BadRow as bad:
                    raise self._bad_row(bad, partition, 0, self.options.method) from None
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
                            *([(rows["after"].combine_chunks(), "text"),
                               (rows["on_parent_failure"].combine_chunks(), "text")] if parents else []),
                        ]
                    )
                )
                seq += batch.num_rows
            copy.write(COPY_TRAILER)
        if seq == 0:
            conn.execute(self.sql.stage_drop)
            return {"rows": 0, "batches": 0}
        conn.execute(self.sql.stage_index)
        conn.execute(self.sql.stage_analyze)
        staged = time.perf_counter()
        counts = dict.fromkeys(OUTCOMES, 0)
        batches = (seq + size - 1) // size
        which = ("offer_staged_" + ("last" if self.batching.can_update else "first") + ("_after" if parents else "")
                 + ("_counts" if self.counts_only else ""))
        query = getattr(self.sql, which)
        for b in range(batches):
            self._maybe_fail(partition, attempt, b)
            rows = conn.execute(
                query, {"batch": b, "queue": self.options.queue, "can_update": self.batching.can_update}
            ).fetchall()  # autocommit: this statement is the batch's transaction
            for outcome, n in rows:
                counts[outcome] += int(n)
        conn.execute(self.sql.stage_drop)
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
        if self.batching.parents:
            query = self.sql.offer_arrays_after_counts if self.counts_only else self.sql.offer_arrays_after
        else:
            query = self.sql.offer_arrays_counts if self.counts_only else self.sql.offer_arrays

        def offer(batch: OfferBatch, params: dict[str, Any]) -> None:  # in the offering thread
            t = time.perf_counter()
            for outcome, n in conn.execute(query, params).fetchall():  # autocommit: one transaction
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
                    params = None if batch is None else batch.params(self.options.queue, self.batching.can_update)
                except BadRow as bad:
                    if running is not None:
                        running.result()
                    raise self._bad_row(bad, partition, int(done["rows"]), self.options.method) from None
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
        summary = OfferSummary.of(self.options.queue, messages)
        driver_logger().info("%s", summary, extra={"offer_summary": summary.__dict__})

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = OfferSummary.of(self.options.queue, messages)
        driver_logger().warning(
            "%s: write to queue %r failed; batches already committed stay offered (offering them again is"
            " safe: the keys de-duplicate). Finished tasks: %s",
            NAME,
            self.options.queue,
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
        summary = OfferSummary.of(self.offers.options.queue, messages)
        driver_logger().info(
            "%s (micro-batch %d)", summary, batchId, extra={"offer_summary": summary.__dict__, "batch_id": batchId}
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        driver_logger().warning(
            "%s: micro-batch %d to queue %r failed; Spark runs it again (the keys make the rows already offered"
            " ignored). Finished tasks: %s",
            NAME,
            batchId,
            self.offers.options.queue,
            OfferSummary.of(self.offers.options.queue, messages),
        )
