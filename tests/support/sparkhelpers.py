"""Helpers of the tests in tests/spark: the rows a queue holds, the data source's log lines in
Spark's Python worker logs (its commit summaries, the queries it ran), a writer with options, and
numbered rows to write."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

T0 = datetime(2030, 1, 1, tzinfo=UTC)  # message times far ahead of the server clock


def messages(conn: psycopg.Connection[Any], queue: str) -> dict[str, tuple[bytes, str, datetime]]:
    rows = conn.execute(
        "SELECT key, payload, payload_type, scheduled_at FROM dq_messages WHERE queue = %s", (queue,)
    ).fetchall()
    return {r[0]: (bytes(r[1]), r[2], r[3]) for r in rows}


def logs(spark: SparkSession, marker: str) -> list[str]:
    """Messages of logger pyqueue.spark in Python worker logs that contain ``marker``."""
    rows = (
        spark.tvf.python_worker_logs()
        .where((F.col("logger") == "pyqueue.spark") & F.col("msg").contains(marker))
        .select("msg")
        .collect()
    )
    return [r.msg for r in rows]


def summary(spark: SparkSession, queue: str) -> dict[str, int]:
    """Counts of the commit summaries logged for ``queue`` (the write jobs so far)."""
    found = [m for m in logs(spark, f"queue '{queue}':") if " rows from " in m]
    assert found, f"no commit summary logged for {queue}"
    total: dict[str, int] = {}
    for msg in found:
        body = msg.split(" batches: ", 1)[1].split(";", 1)[0]
        for part in body.split(", "):
            name, n = part.rsplit(" ", 1)
            total[name] = total.get(name, 0) + int(n)
    return total


def writer(df: DataFrame, dsn: str, queue: str, **options: str) -> Any:
    w = df.write.format("delayedqueue").option("dsn", dsn).option("queue", queue).mode("append")
    for name, value in options.items():
        w = w.option(name, value)
    return w


def queue_name() -> str:
    """A queue of this test's own."""
    return f"q-{uuid.uuid4().hex[:8]}"


def numbered(spark: SparkSession, n: int, partitions: int) -> DataFrame:
    """n rows k00000.. with a binary payload and times one second apart from T0."""
    return spark.range(n, numPartitions=partitions).select(
        F.format_string("k%05d", "id").alias("key"),
        F.encode(F.format_string("p%d", "id"), "UTF-8").alias("payload"),
        (F.lit(T0) + F.make_interval(secs=F.col("id"))).alias("scheduled_at"),
    )


def read_logs(spark: SparkSession, marker: str) -> list[str]:
    return [m for m in logs(spark, "rows fetched by") if marker in m]


def denied(dsn: str, statement: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            c.execute(statement)
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False
