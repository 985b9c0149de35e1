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
message. Reading goes through the export functions (``dq_export_messages``, ``dq_export_archive``).
With the option ``schema``, every statement names the functions of the install in that schema
(``pyqueue migrate --schema``); without it, the connection's ``search_path`` finds them.

The parts, each a module of this package:

* :mod:`.options`: the options, read and checked on the driver;
* :mod:`.statements`: every SQL statement, qualified by the schema as the clients' are;
* :mod:`.rows`: the DataFrame's columns checked, and a task's rows turned into offer batches;
* :mod:`.pgbinary`: PostgreSQL's binary array and COPY formats, built from Arrow columns;
* :mod:`.writer`: batch and streaming writes through ``dq_offer_many``;
* :mod:`.reader`: reads of the live messages and the archive, with filter pushdown;
* :mod:`.logs`: the ``pyqueue.spark`` logger in Spark's Python processes;
* this module: :func:`register` and :class:`DelayedQueueDataSource`, which ties them together.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from .. import limits
from .logs import log
from .options import DEFAULT_BATCH_SIZE, NAME, WRITE_METHODS, Options
from .pgbinary import (
    ARRAY_OIDS,
    COPY_SIGNATURE,
    COPY_TRAILER,
    ELEMENT_OIDS,
    PG_EPOCH_US,
    PgArray,
    PgArrayDumper,
    copy_rows,
)
from .reader import ARCHIVE, ARCHIVE_SCHEMA, MESSAGES, MESSAGES_SCHEMA, TABLES, DelayedQueueReader, IdRange, table_of
from .rows import BadRow, Batching, OfferBatch, TimedIterator, check_write_schema
from .statements import statements as _statements
from .writer import OUTCOMES, DelayedQueueStreamWriter, DelayedQueueWriter, OfferCommitMessage, OfferSummary

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
    # the parts' names, for code that builds on them (bench/spark_sinks.py)
    "log",
    "Options",
    "DEFAULT_BATCH_SIZE",
    "WRITE_METHODS",
    "OUTCOMES",
    "KEY_LIMIT",
    "PAYLOAD_TYPE_LIMIT",
    "DelayedQueueWriter",
    "DelayedQueueReader",
    "IdRange",
    "MESSAGES",
    "ARCHIVE",
    "TABLES",
    "check_write_schema",
    "Batching",
    "OfferBatch",
    "BadRow",
    "TimedIterator",
    "PgArray",
    "PgArrayDumper",
    "copy_rows",
    "PG_EPOCH_US",
    "ELEMENT_OIDS",
    "ARRAY_OIDS",
    "COPY_SIGNATURE",
    "COPY_TRAILER",
    "Q_WRITER_CHECK",
    "Q_STAGE_CREATE",
    "Q_STAGE_COPY",
    "Q_STAGE_INDEX",
    "Q_STAGE_ANALYZE",
    "Q_STAGE_DROP",
    "Q_OFFER_STAGED_LAST",
    "Q_OFFER_STAGED_FIRST",
    "Q_OFFER_ARRAYS",
]

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


# --------------------------------------------------------------------------- the data source


class DelayedQueueDataSource(DataSource):
    """The ``delayedqueue`` data source (docs/spark.md).

    Write options (``df.write`` and ``stream.writeStream``): ``dsn`` (required), ``queue``
    (required), ``schema`` (the install's schema; default: the ``search_path`` finds it),
    ``canUpdate`` (default ``true``),
    ``batchSize`` (rows per ``dq_offer_many`` call and transaction, default 1000, at most 100000),
    ``writeMethod`` (``arrays``, the default, or ``copy``).

    Read options: ``dsn`` (required), ``queue`` (optional: only this queue), ``schema`` (as for
    writes), ``table`` (``messages``, the default, or ``archive``), ``numPartitions`` (default 4),
    ``fetchSize`` (rows per fetch and per Arrow batch, default 10000).
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return table_of(Options(self.options)).schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return DelayedQueueReader(Options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return DelayedQueueWriter(Options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return DelayedQueueStreamWriter(Options(self.options), schema, overwrite)


# --------------------------------------------------------------------------- names of the parts, kept here too

#: The limits a row must keep: :data:`pyqueue.limits.KEY_CHARS` and :data:`pyqueue.limits.PAYLOAD_TYPE_CHARS`.
KEY_LIMIT = limits.KEY_CHARS
PAYLOAD_TYPE_LIMIT = limits.PAYLOAD_TYPE_CHARS
#: The statements naming the functions through the ``search_path`` (no option ``schema``); a
#: write or read with the option uses those of :func:`pyqueue.spark.statements.statements`.
Q_WRITER_CHECK = _statements(None).writer_check
Q_STAGE_CREATE = _statements(None).stage_create
Q_STAGE_COPY = _statements(None).stage_copy
Q_STAGE_INDEX = _statements(None).stage_index
Q_STAGE_ANALYZE = _statements(None).stage_analyze
Q_STAGE_DROP = _statements(None).stage_drop
Q_OFFER_STAGED_LAST = _statements(None).offer_staged_last
Q_OFFER_STAGED_FIRST = _statements(None).offer_staged_first
Q_OFFER_ARRAYS = _statements(None).offer_arrays
