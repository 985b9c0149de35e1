"""Writing messages after others with the ``delayedqueue`` data source: the ``after`` column (keys of
the queue, or [queue, key] pairs) and ``on_parent_failure``, with both write methods, against the
test server and a real local Spark (tests/spark/conftest.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402
from sparkhelpers import queue_name, writer  # noqa: E402

pytestmark = pytest.mark.spark
LOCK = timedelta(minutes=5)


def poll_and_ack(conn: psycopg.Connection[Any], queue: str) -> list[str]:
    rows = conn.execute("SELECT key, lock_token FROM dq_poll_many(%s, 100, %s)", (queue, LOCK)).fetchall()
    for _, token in rows:
        conn.execute("SELECT dq_ack(%s)", (token,))
    return sorted(r[0] for r in rows)


@pytest.mark.parametrize("method", ["copy", "arrays"])
def test_an_etl_graph_written_in_one_batch(
    spark: SparkSession, dsn: str, conn: psycopg.Connection[Any], method: str
) -> None:
    queue = queue_name()
    rows = [
        ("extract", "e", None, None),
        ("t1", "1", ["extract"], None),
        ("t2", "2", ["extract"], "proceed"),
        ("t3", "3", ["extract"], None),
        ("load", "l", ["t1", "t2", "t3"], None),
        ("report", "r", ["load"], None),
    ]
    df = spark.createDataFrame(rows, "key string, payload string, after array<string>, on_parent_failure string")
    writer(df.coalesce(1), dsn, queue, writeMethod=method).save()
    pending = dict(conn.execute(
        "SELECT key, parents_pending FROM dq_messages WHERE queue = %s AND parents_pending > 0", (queue,)).fetchall())
    assert pending == {"t1": 1, "t2": 1, "t3": 1, "load": 3, "report": 1}
    assert conn.execute("SELECT m.key FROM dq_dependencies d JOIN dq_messages m ON m.id = d.child_id "
                        "WHERE d.on_parent_failure = 'proceed'").fetchall() == [("t2",)]
    rounds = [poll_and_ack(conn, queue) for _ in range(5)]
    assert rounds == [["extract"], ["t1", "t2", "t3"], ["load"], ["report"], []]


@pytest.mark.parametrize("method", ["copy", "arrays"])
def test_pairs_name_parents_in_other_queues(
    spark: SparkSession, dsn: str, conn: psycopg.Connection[Any], method: str
) -> None:
    queue, upstream = queue_name(), queue_name()
    conn.execute("SELECT dq_offer(%s, 'u', 'x'::text)", (upstream,))
    rows = [("a", "1", [[upstream, "u"]]), ("b", "2", None), ("c", "3", [[queue, "b"], [upstream, "u"]])]
    df = spark.createDataFrame(rows, "key string, payload string, after array<array<string>>")
    writer(df.coalesce(1), dsn, queue, writeMethod=method).save()
    assert poll_and_ack(conn, queue) == ["b"]
    assert poll_and_ack(conn, queue) == []
    assert poll_and_ack(conn, upstream) == ["u"]
    assert poll_and_ack(conn, queue) == ["a", "c"]


def test_a_parent_later_in_the_batch_fails_the_task(spark: SparkSession, dsn: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    queue = queue_name()
    df = spark.createDataFrame([("a", "1", ["b"]), ("b", "2", None)], "key string, payload string, after array<string>")
    with pytest.raises(Exception, match=r"afters\[1\] names b \(keys\[2\]\), which comes later"):
        writer(df.coalesce(1), dsn, queue).save()
    assert conn.execute("SELECT count(*) FROM dq_messages WHERE queue = %s", (queue,)).fetchone() == (0,)


@pytest.mark.parametrize(("ddl", "words"), [
    ("key string, payload string, after string", "column 'after' is string, it must be array<string>"),
    ("key string, payload string, after array<int>", "column 'after' is array<int>"),
    ("key string, payload string, on_parent_failure int", "column 'on_parent_failure' is int, it must be string"),
], ids=["a string", "an array of int", "an int failure"])
def test_bad_parent_columns_are_refused_before_writing(spark: SparkSession, dsn: str, ddl: str, words: str) -> None:
    df = spark.createDataFrame([], ddl)
    with pytest.raises(Exception, match=words):
        writer(df, dsn, queue_name()).save()
