"""The ``delayedqueue`` PySpark data source (pyqueue.spark, docs/spark.md) against the test server.

One local Spark session for the module (``local[2,2]``: two cores, a failed task is tried once
more, which the retry test needs). Write outcomes and the read queries are observed through
Spark's own Python worker logs (``spark.tvf.python_worker_logs()``), where the data source logs
its commit summary and every query it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, Row, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import pyqueue.spark  # noqa: E402
from pyqueue.migrate import migrate  # noqa: E402

pytestmark = pytest.mark.spark

T0 = datetime(2030, 1, 1, tzinfo=UTC)  # message times far ahead of the server clock


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark needs a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("pyqueue-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.pyspark.worker.logging.enabled", "true")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pyqueue.spark.register(session)
    yield session
    session.stop()


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


def test_write_then_read_back(spark: SparkSession, dsn: str, conn: psycopg.Connection[Any]) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    n = 2500
    df = spark.range(n, numPartitions=3).select(
        F.format_string("k%05d", "id").alias("key"),
        F.format_string("payload %d", "id").alias("payload"),
        (F.lit(T0) + F.make_interval(secs=F.col("id"))).alias("scheduled_at"),
    )
    writer(df, dsn, queue, batchSize="700").save()
    stored = messages(conn, queue)
    assert len(stored) == n
    for i in (0, 1, 699, 700, 1234, n - 1):
        payload, ptype, at = stored[f"k{i:05d}"]
        assert payload == f"payload {i}".encode()
        assert ptype == "text"
        assert at == T0 + timedelta(seconds=i)
    assert summary(spark, queue) == {"created": n, "updated": 0, "ignored": 0, "superseded": 0}
    # 3 partitions of 833/833/834 rows, batches of 700: 2 batches each
    assert any(" from 3 tasks (0 retried) in 6 batches: " in m for m in logs(spark, f"queue '{queue}':"))

    back = (
        spark.read.format("delayedqueue").option("dsn", dsn).option("queue", queue).option("numPartitions", "3").load()
    )
    assert back.rdd.getNumPartitions() == 3
    rows = {r.key: r for r in back.collect()}
    assert len(rows) == n
    r = rows["k01234"]
    # Spark gives timestamps as naive datetimes in the local time zone
    assert (bytes(r.payload), r.payload_type, r.scheduled_at_initially.astimezone(UTC), r.delivery_count, r.locked) == (
        b"payload 1234",
        "text",
        T0 + timedelta(seconds=1234),
        0,
        False,
    )


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


def numbered(spark: SparkSession, n: int, partitions: int) -> DataFrame:
    """n rows k00000.. with a binary payload and times one second apart from T0."""
    return spark.range(n, numPartitions=partitions).select(
        F.format_string("k%05d", "id").alias("key"),
        F.encode(F.format_string("p%d", "id"), "UTF-8").alias("payload"),
        (F.lit(T0) + F.make_interval(secs=F.col("id"))).alias("scheduled_at"),
    )


def test_writing_twice_creates_no_duplicates(spark: SparkSession, dsn: str, conn: psycopg.Connection[Any]) -> None:
    queue = queue_name()
    df = numbered(spark, 300, 2)
    writer(df, dsn, queue, batchSize="100").save()
    first = messages(conn, queue)
    writer(df, dsn, queue, batchSize="100").save()
    assert messages(conn, queue) == first
    assert len(first) == 300
    assert first["k00007"] == (b"p7", "bytes", T0 + timedelta(seconds=7))
    # the two jobs' summaries: 300 created, then 300 ignored (same payload, type and time)
    assert summary(spark, queue) == {"created": 300, "updated": 0, "ignored": 300, "superseded": 0}


@pytest.mark.parametrize("method", ["copy", "arrays"])
def test_retried_task_creates_no_duplicates(
    spark: SparkSession, dsn: str, conn: psycopg.Connection[Any], method: str
) -> None:
    """Partition 1's first attempt fails after committing its first batch; Spark runs it again."""
    queue = queue_name()
    df = numbered(spark, 400, 2)  # partitions of 200 rows: two batches each
    writer(df, dsn, queue, batchSize="100", writeMethod=method, testFailFirstAttempt="1:1").save()
    assert any("injected failure in partition 1 after 1 batches" in m for m in logs(spark, "injected failure"))
    stored = messages(conn, queue)
    assert len(stored) == 400
    assert stored["k00399"] == (b"p399", "bytes", T0 + timedelta(seconds=399))
    # The retry found the first batch of partition 1 already offered (identical rows): ignored.
    assert summary(spark, queue) == {"created": 300, "updated": 0, "ignored": 100, "superseded": 0}
    assert any(" from 2 tasks (1 retried) in 4 batches: " in m for m in logs(spark, f"queue '{queue}':"))
    dupes = conn.execute("SELECT count(*) - count(DISTINCT key) FROM dq_messages WHERE queue = %s", (queue,)).fetchone()
    assert dupes == (0,)


@pytest.mark.parametrize("method", ["copy", "arrays"])
@pytest.mark.parametrize(("can_update", "winner"), [("true", "last"), ("false", "first")])
def test_duplicate_keys_in_a_partition(
    spark: SparkSession, dsn: str, conn: psycopg.Connection[Any], can_update: str, winner: str, method: str
) -> None:
    """Rows of one partition act as if offered one by one in order: with canUpdate the last row
    of a key wins, without it the first; within one batch the others are 'superseded'."""
    queue = queue_name()
    rows = [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("a", "a3"), ("b", "b2")]
    df = spark.createDataFrame(rows, "key string, payload string").coalesce(1)
    # batches of 4: [a1 b1 a2 c1] [a3 b2]
    writer(df, dsn, queue, batchSize="4", canUpdate=can_update, writeMethod=method).save()
    stored = {k: v[0] for k, v in messages(conn, queue).items()}
    if winner == "last":
        assert stored == {"a": b"a3", "b": b"b2", "c": b"c1"}
        # batch 1: a2 (a1 superseded), b1, c1 created; batch 2: a3, b2 updated
        assert summary(spark, queue) == {"created": 3, "updated": 2, "ignored": 0, "superseded": 1}
    else:
        assert stored == {"a": b"a1", "b": b"b1", "c": b"c1"}
        # batch 1: a1 (a2 superseded), b1, c1 created; batch 2: a3, b2 ignored
        assert summary(spark, queue) == {"created": 3, "updated": 0, "ignored": 2, "superseded": 1}


def test_payload_kinds_and_default_time(spark: SparkSession, dsn: str, conn: psycopg.Connection[Any]) -> None:
    queue = queue_name()
    before = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    structs = spark.createDataFrame(
        [Row(key="s1", payload=Row(user=7, tags=["x", "y"], at=T0, attrs={"k": 1.5}))],
    )
    writer(structs, dsn, queue).save()
    typed = spark.createDataFrame(
        [("t1", "hello", "greeting"), ("t2", "plain", None)], "key string, payload string, payload_type string"
    )
    writer(typed, dsn, queue).save()
    after = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    stored = messages(conn, queue)
    payload, ptype, at = stored["s1"]
    assert ptype == "json"
    assert json.loads(payload) == {
        "user": 7,
        "tags": ["x", "y"],
        "at": "2030-01-01T00:00:00+00:00",
        "attrs": {"k": 1.5},
    }
    assert before <= at <= after  # no scheduled_at column: the job's start on the database clock
    assert stored["t1"][:2] == (b"hello", "greeting")
    assert stored["t2"][:2] == (b"plain", "text")  # NULL payload_type: the payload column's default


SCHEMA_ERRORS = [
    # (columns as SQL, one row, the message expected)
    ("payload string", ("p",), "column 'key' is missing"),
    ("key int, payload string", (1, "p"), "column 'key' is int, it must be string"),
    ("key string", ("k",), "column 'payload' is missing"),
    ("key string, payload int", ("k", 1), "column 'payload' is int"),
    ("key string, payload string, scheduled_at string", ("k", "p", "2030-01-01"), "column 'scheduled_at' is string"),
    ("key string, payload string, payload_type int", ("k", "p", 1), "column 'payload_type' is int"),
    ("key string, payload string, shedule string", ("k", "p", "x"), "unknown column 'shedule'"),
]


@pytest.mark.parametrize(("columns", "row", "message"), SCHEMA_ERRORS, ids=[c[2] for c in SCHEMA_ERRORS])
def test_schema_errors_write_nothing(
    spark: SparkSession, dsn: str, conn: psycopg.Connection[Any], columns: str, row: tuple[Any, ...], message: str
) -> None:
    queue = queue_name()
    df = spark.createDataFrame([row], columns)
    with pytest.raises(Exception, match=message):
        writer(df, dsn, queue).save()
    assert messages(conn, queue) == {}


@pytest.mark.parametrize("method", ["copy", "arrays"])
@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ((None, b"p"), "column 'key' is NULL in row 35 of partition 0"),
        (("", b"p"), "column 'key' is empty in row 35"),
        (("x" * 201, b"p"), "column 'key' is longer than 200 characters in row 35"),
        (("k", None), "column 'payload' is NULL in row 35"),
    ],
)
def test_bad_row_fails_its_task_before_any_batch(
    spark: SparkSession,
    dsn: str,
    conn: psycopg.Connection[Any],
    bad_row: tuple[Any, ...],
    message: str,
    method: str,
) -> None:
    """A bad row in the fourth batch of a partition that Spark hands over in one Arrow batch:
    the task offers none of its batches (both methods)."""
    queue = queue_name()
    rows = [(f"k{i}", b"p") for i in range(50)]
    rows[35] = bad_row
    df = spark.createDataFrame(rows, "key string, payload binary").coalesce(1)
    with pytest.raises(Exception, match=message + r".*this task offered nothing"):
        writer(df, dsn, queue, batchSize="10", writeMethod=method).save()
    assert messages(conn, queue) == {}


def test_bad_row_in_a_later_arrow_batch_with_arrays(
    spark: SparkSession, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """writeMethod=arrays checks each Arrow batch before offering its rows: with Arrow batches of
    10 rows, the batches before the bad row's were committed, and the error says how many rows."""
    queue = queue_name()
    rows = [(f"k{i:02d}", b"p") for i in range(50)]
    rows[35] = (None, b"p")
    df = spark.createDataFrame(rows, "key string, payload binary").coalesce(1)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        with pytest.raises(Exception, match="row 35 of partition 0.*had offered its first 30 rows"):
            writer(df, dsn, queue, batchSize="10", writeMethod="arrays").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert sorted(messages(conn, queue)) == [f"k{i:02d}" for i in range(30)]


def test_bad_options(spark: SparkSession, dsn: str) -> None:
    df = spark.createDataFrame([("k", "p")], "key string, payload string")
    with pytest.raises(Exception, match="option 'queue' is required"):
        df.write.format("delayedqueue").option("dsn", dsn).mode("append").save()
    with pytest.raises(Exception, match="option 'batchSize' is 0"):
        writer(df, dsn, "q", batchSize="0").save()
    with pytest.raises(Exception, match="overwrite"):
        df.write.format("delayedqueue").option("dsn", dsn).option("queue", "q").mode("overwrite").save()


def read_logs(spark: SparkSession, marker: str) -> list[str]:
    return [m for m in logs(spark, "rows fetched by") if marker in m]


def test_read_messages_with_pushdown(spark: SparkSession, dsn: str, conn: psycopg.Connection[Any]) -> None:
    queue, other = queue_name(), queue_name()
    writer(numbered(spark, 200, 2), dsn, queue).save()
    writer(numbered(spark, 50, 1), dsn, other).save()
    df = (
        spark.read.format("delayedqueue")
        .option("dsn", dsn)
        .option("numPartitions", "2")
        .load()
        .where(
            (F.col("queue") == queue)
            & (F.col("scheduled_at") >= F.lit(T0 + timedelta(seconds=50)))
            & (F.col("scheduled_at") < F.lit(T0 + timedelta(seconds=80)))
        )
    )
    keys = sorted(r.key for r in df.select("key").collect())
    assert keys == [f"k{i:05d}" for i in range(50, 80)]
    # Both partitions called the export function with the filters; together they fetched exactly the 30 rows.
    found = read_logs(spark, f'["queue", "=", "{queue}"]')
    assert len(found) == 2, found
    for msg in found:
        assert 'SELECT "dq_export_messages"(%s, %s, %s::jsonb)' in msg
        assert '["scheduled_at", ">=", "2030-01-01T00:00:50+00:00"]' in msg
        assert '["scheduled_at", "<", "2030-01-01T00:01:20+00:00"]' in msg
        assert msg.endswith("; columns " + ", ".join(pyqueue.spark.MESSAGES_SCHEMA.names))
        assert "locked" in msg and "lock_token" not in msg
    assert sum(int(m.split(" rows fetched")[0].rsplit(" ", 1)[1]) for m in found) == 30


def test_read_archive_with_pushdown(spark: SparkSession, dsn: str, conn: psycopg.Connection[Any]) -> None:
    queue = queue_name()
    conn.execute(
        """INSERT INTO dq_archive (id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially,
                                   created_at, delivery_count, outcome, acked_at, last_error)
           SELECT g, %(q)s, 'a' || g, '\\x00'::bytea, 'bytes', %(t0)s, %(t0)s, %(t0)s, 1,
                  CASE WHEN g %% 10 = 0 THEN 'dead' ELSE 'acked' END,
                  %(t0)s + g * interval '1 minute', CASE WHEN g %% 10 = 0 THEN 'boom' END
             FROM generate_series(1, 100) AS g""",
        {"q": queue, "t0": T0},
    )
    df = (
        spark.read.format("delayedqueue")
        .option("dsn", dsn)
        .option("table", "archive")
        .option("queue", queue)
        .load()
        .where(F.col("acked_at") > F.lit(T0 + timedelta(minutes=40)))
        .where(F.col("outcome").isin("dead", "cancelled"))
    )
    rows = df.select("id", "last_error", "outcome").collect()
    assert sorted(r.id for r in rows) == [50, 60, 70, 80, 90, 100]
    assert {r.last_error for r in rows} == {"boom"}
    found = read_logs(spark, f'["queue", "=", "{queue}"]')
    assert found and all('["acked_at", ">", ' in m and '["outcome", "IN", [' in m for m in found)
    assert all('SELECT "dq_export_archive"(%s, %s, %s::jsonb)' in m for m in found)
    assert sum(int(m.split(" rows fetched")[0].rsplit(" ", 1)[1]) for m in found) == 6
    assert "archive_id" in found[0]


def test_read_chosen_columns(spark: SparkSession, dsn: str) -> None:
    queue = queue_name()
    writer(numbered(spark, 10, 1), dsn, queue).save()
    df = (
        spark.read.format("delayedqueue")
        .schema("key string, scheduled_at timestamp")
        .option("dsn", dsn)
        .option("queue", queue)
        .load()
    )
    assert df.count() == 10
    assert df.columns == ["key", "scheduled_at"]
    with pytest.raises(Exception, match="column 'lock_token' is not a column of dq_messages"):
        spark.read.format("delayedqueue").schema("lock_token string").option("dsn", dsn).load().collect()


def test_example_job(spark: SparkSession, dsn: str, tmp_path: Any) -> None:
    """examples/spark_reminders.py end to end: 300 users, one in three did not pay."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "spark_reminders.py"
    spec = importlib.util.spec_from_file_location("spark_reminders", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    counts = {q: (ready, scheduled) for q, ready, scheduled in module.run(spark, dsn, users=300, workdir=str(tmp_path))}
    assert set(counts) == {"digests", "reminders"}
    assert counts["digests"] == (0, 300)
    assert sum(counts["reminders"]) == 100
    # running it again creates no second message for any key
    module.run(spark, dsn, users=300, workdir=str(tmp_path))
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM dq_messages").fetchone() == (400,)


# --------------------------------------------------------------------------- roles: no table access needed


def denied(dsn: str, statement: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            c.execute(statement)
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False


@pytest.mark.parametrize("method", ["copy", "arrays"])
def test_dq_producer_writes(spark: SparkSession, conn: psycopg.Connection[Any], login: Any, method: str) -> None:
    producer = login("dq_producer")
    assert denied(producer, "SELECT 1 FROM dq_messages LIMIT 1")
    queue = queue_name()
    writer(numbered(spark, 120, 2), producer, queue, batchSize="50", writeMethod=method).save()
    stored = messages(conn, queue)
    assert len(stored) == 120
    assert stored["k00042"] == (b"p42", "bytes", T0 + timedelta(seconds=42))
    assert summary(spark, queue) == {"created": 120, "updated": 0, "ignored": 0, "superseded": 0}
    # a producer may not read the queue back
    with pytest.raises(Exception, match="permission denied for function dq_export_messages_bounds"):
        spark.read.format("delayedqueue").option("dsn", producer).option("queue", queue).load().collect()


def test_dq_consumer_reads_messages_but_not_the_archive(
    spark: SparkSession, dsn: str, conn: psycopg.Connection[Any], login: Any
) -> None:
    consumer = login("dq_consumer")
    assert denied(consumer, "SELECT 1 FROM dq_messages LIMIT 1")
    queue = queue_name()
    writer(numbered(spark, 200, 2), dsn, queue).save()
    conn.execute("SELECT dq_poll_many(%s, 3, '1 hour')", (queue,))  # nothing is due: locks nothing
    conn.execute("SELECT dq_offer(%s, 'due', 'x'::bytea, now() - interval '1 second')", (queue,))
    conn.execute("SELECT dq_poll_many(%s, 1, '1 hour')", (queue,))  # locks 'due'
    df = (
        spark.read.format("delayedqueue")
        .option("dsn", consumer)
        .option("queue", queue)
        .option("numPartitions", "3")
        .load()
        .where(
            F.col("key").isin("k00007", "k00150", "due") | (F.col("scheduled_at") >= F.lit(T0 + timedelta(seconds=198)))
        )
    )
    rows = {r.key: r for r in df.collect()}
    assert sorted(rows) == ["due", "k00007", "k00150", "k00198", "k00199"]
    assert (bytes(rows["k00150"].payload), rows["k00150"].locked, rows["due"].locked) == (b"p150", False, True)
    everything = spark.read.format("delayedqueue").option("dsn", consumer).option("queue", queue).load()
    assert everything.count() == 201
    with pytest.raises(Exception, match="permission denied for function dq_export_archive_bounds"):
        spark.read.format("delayedqueue").option("dsn", consumer).option("table", "archive").load().collect()


def test_dq_admin_reads_the_archive(spark: SparkSession, conn: psycopg.Connection[Any], login: Any) -> None:
    admin = login("dq_admin")
    assert denied(admin, "SELECT 1 FROM dq_archive LIMIT 1")
    queue = queue_name()
    conn.execute("SELECT dq_configure_queue(%s, archive => true)", (queue,))
    for i in range(5):
        conn.execute("SELECT dq_offer(%s, %s, 'x'::bytea, now() - interval '1 second')", (queue, f"a{i}"))
    tokens = [r[0] for r in conn.execute("SELECT lock_token FROM dq_poll_many(%s, 5, '1 hour')", (queue,))]
    conn.execute("SELECT dq_ack_many(%s::uuid[])", (tokens[:4],))
    conn.execute("SELECT dq_cancel(%s, %s)", (queue, "a4"))
    df = (
        spark.read.format("delayedqueue")
        .option("dsn", admin)
        .option("table", "archive")
        .option("queue", queue)
        .option("numPartitions", "2")
        .load()
    )
    outcomes = {r.key: r.outcome for r in df.collect()}
    assert outcomes == {"a0": "acked", "a1": "acked", "a2": "acked", "a3": "acked", "a4": "cancelled"}
    assert df.where(F.col("outcome") == "cancelled").select("key").collect() == [Row(key="a4")]
    # dq_admin is a member of dq_consumer: it reads the live messages too
    assert spark.read.format("delayedqueue").option("dsn", admin).option("queue", queue).load().count() == 0


# --------------------------------------------------------------------------- an install in another schema

OTHER = "other"


@pytest.mark.parametrize("method", ["copy", "arrays"])
def test_write_and_read_an_install_in_another_schema(
    spark: SparkSession, dsn: str, conn: psycopg.Connection[Any], method: str
) -> None:
    """With the option ``schema``, every statement names the functions of the install in that
    schema: the rows land in its tables, not in those of the install the search_path finds
    (public), and are read back from its live messages and its archive."""
    migrate(dsn, schema=OTHER)
    queue = queue_name()
    writer(numbered(spark, 120, 2), dsn, queue, batchSize="50", writeMethod=method, schema=OTHER).save()
    assert messages(conn, queue) == {}
    stored = conn.execute(
        "SELECT key, payload, scheduled_at FROM other.dq_messages WHERE queue = %s", (queue,)
    ).fetchall()
    assert len(stored) == 120
    assert ("k00042", b"p42", T0 + timedelta(seconds=42)) in [(k, bytes(p), at) for k, p, at in stored]
    assert summary(spark, queue) == {"created": 120, "updated": 0, "ignored": 0, "superseded": 0}

    def read(**options: str) -> DataFrame:
        r = spark.read.format("delayedqueue").option("dsn", dsn).option("queue", queue).option("numPartitions", "2")
        for name, value in options.items():
            r = r.option(name, value)
        return r.load()

    assert sorted(r.key for r in read(schema=OTHER).where(F.col("key") < "k00003").collect()) == [
        "k00000", "k00001", "k00002"]
    assert read().count() == 0  # without the option: public's install, which has none of them
    found = [m for m in read_logs(spark, f'["queue", "=", "{queue}"]') if '"key", "<", "k00003"' in m]
    assert len(found) == 2, found
    for msg in found:
        assert 'SELECT "other"."dq_export_messages"(%s, %s, %s::jsonb)' in msg

    conn.execute("SELECT other.dq_configure_queue(%s, archive => true)", (queue,))
    conn.execute("UPDATE other.dq_messages SET scheduled_at = now() - interval '1 second' WHERE key < 'k00003'")
    tokens = [r[0] for r in conn.execute("SELECT lock_token FROM other.dq_poll_many(%s, 5, '1 hour')", (queue,))]
    conn.execute("SELECT other.dq_ack_many(%s::uuid[])", (tokens,))
    archived = read(schema=OTHER, table="archive").collect()
    assert sorted((r.key, r.outcome) for r in archived) == [(k, "acked") for k in ("k00000", "k00001", "k00002")]
    assert read(table="archive").count() == 0


def test_schema_option_errors(spark: SparkSession, dsn: str) -> None:
    df = spark.createDataFrame([("k", "p")], "key string, payload string")
    with pytest.raises(Exception, match="option 'schema' is 'xxx.*', it must be a schema name of 1 to 63 bytes"):
        writer(df, dsn, "q", schema="x" * 64).save()
    with pytest.raises(Exception, match="has no dq_offer_many in schema 'nowhere'; install the queue "
                                        r"\(pyqueue migrate --schema nowhere\)"):
        writer(df, dsn, "q", schema="nowhere").save()
    with pytest.raises(Exception, match='schema "nowhere" does not exist'):
        spark.read.format("delayedqueue").option("dsn", dsn).option("schema", "nowhere").load().collect()


# --------------------------------------------------------------------------- the export functions in SQL


def export(conn: psycopg.Connection[Any], function: str, *args: Any) -> list[tuple[Any, ...]]:
    """Every row of the cursor that ``function(id_from, id_to, filters)`` opens, in one transaction."""
    with conn.transaction():
        opened = conn.execute(
            psycopg.sql.SQL("SELECT {}(%s, %s, %s::jsonb)").format(psycopg.sql.Identifier(function)), args
        ).fetchone()
        assert opened is not None
        return conn.execute(psycopg.sql.SQL("FETCH ALL FROM {}").format(psycopg.sql.Identifier(opened[0]))).fetchall()


EXPORT_FILTERS = [
    # (filters, the same condition on dq_messages)
    ([], "true"),
    ([["queue", "=", "e1"]], "queue = 'e1'"),
    ([["key", "IN", ["k3", "k9", "nope"]], ["queue", "=", "e1"]], "key IN ('k3', 'k9', 'nope') AND queue = 'e1'"),
    ([["key", ">=", "k5"], ["key", "<", "k7"]], "key >= 'k5' AND key < 'k7'"),
    ([["scheduled_at", "<=", "2030-01-01T00:00:07+00:00"]], "scheduled_at <= '2030-01-01 00:00:07+00'"),
    ([["id", ">", 4]], "id > 4"),
    ([["delivery_count", "=", 1]], "delivery_count = 1"),
    ([["locked", "=", True]], "lock_token IS NOT NULL"),
    ([["dead_from", "IS NOT NULL"]], "dead_from IS NOT NULL"),
    ([["last_error", "IS NULL"], ["queue", "IN", ["e2"]]], "last_error IS NULL AND queue = 'e2'"),
]


@pytest.mark.parametrize(("filters", "where"), EXPORT_FILTERS, ids=[w for _, w in EXPORT_FILTERS])
def test_export_messages_filters_equal_the_where_clause(
    conn: psycopg.Connection[Any], filters: list[Any], where: str
) -> None:
    for queue in ("e1", "e2"):
        for i in range(12):
            conn.execute("SELECT dq_offer(%s, %s, 'x'::bytea, %s)", (queue, f"k{i}", T0 + timedelta(seconds=i)))
    conn.execute("UPDATE dq_messages SET scheduled_at = now() - interval '1 second' WHERE key IN ('k2', 'k4')")
    conn.execute("SELECT dq_poll_many('e1', 2, '1 hour')")
    expected = conn.execute(f"SELECT id FROM dq_messages WHERE {where} ORDER BY id").fetchall()  # noqa: S608
    got = sorted((r[0],) for r in export(conn, "dq_export_messages", None, None, json.dumps(filters)))
    assert got == expected
    ids = [r[0] for r in expected]
    bounds = conn.execute("SELECT * FROM dq_export_messages_bounds(%s::jsonb)", (json.dumps(filters),)).fetchone()
    assert bounds == ((min(ids), max(ids)) if ids else (None, None))
    if len(ids) > 2:  # an id range keeps id_from and leaves out id_to
        ranged = export(conn, "dq_export_messages", ids[1], ids[-1], json.dumps(filters))
        assert sorted(r[0] for r in ranged) == ids[1:-1]


@pytest.mark.parametrize(
    ("filters", "sqlstate", "message"),
    [
        (None, "22004", "dq_export_messages: filters must not be NULL"),
        ({"queue": "q"}, "22023", 'filters is {"queue": "q"}, it must be a JSON array'),
        ([["lock_token", "=", "x"]], "22023", 'filter \\["lock_token", "=", "x"\\] names no column'),
        ([["key", "LIKE", "k%"]], "22023", 'filter \\["key", "LIKE", "k%"\\] is not'),
        ([["key", "IN", "k1"]], "22023", "is not"),
        ([["key", "="]], "22023", "is not"),
        ([["key", "IS NULL", None]], "22023", "is not"),
        (["key"], "22023", "must be \\[column, operator, value\\]"),
        ([["id", "=", "x"]], "22P02", "invalid input syntax for type bigint"),
        ([["scheduled_at", "<", "soon"]], "22007", "invalid input syntax for type timestamp with time zone"),
    ],
)
def test_export_rejects_bad_filters(conn: psycopg.Connection[Any], filters: Any, sqlstate: str, message: str) -> None:
    with pytest.raises(psycopg.Error, match=message) as info:
        export(conn, "dq_export_messages", None, None, None if filters is None else json.dumps(filters))
    assert info.value.sqlstate == sqlstate


def test_export_reads_ranges_of_the_primary_key_with_the_filters(conn: psycopg.Connection[Any]) -> None:
    """The function's query is planned with the id range and the filters, as a WHERE on the table would be."""
    from test_plans import nested_plans

    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially) "
        "SELECT 'q' || (g %% 4), 'k' || g, 'x', 'bytes', %s + g * interval '1 second', %s "
        "FROM generate_series(1, 20000) g",
        (T0, T0),
    )
    conn.execute("VACUUM ANALYZE dq_messages")
    filters = """'[["queue", "=", "q1"], ["scheduled_at", "<", "2030-01-01T01:00:00+00:00"]]'"""
    read_all = f"""DO $$
        DECLARE
            c refcursor := dq_export_messages(5000, 10000, {filters});
            r record;
        BEGIN
            LOOP
                FETCH c INTO r;
                EXIT WHEN NOT FOUND;
            END LOOP;
        END $$"""
    plans = nested_plans(conn, read_all)
    assert "Index Scan using dq_messages_pkey on dq_messages" in plans, plans
    assert "Index Cond: ((id >= '5000'::bigint) AND (id < '10000'::bigint))" in plans, plans
    assert "Filter: ((queue = 'q1'::text) AND (scheduled_at <" in plans, plans
    plans = nested_plans(conn, f"SELECT * FROM dq_export_messages_bounds({filters})")  # noqa: S608
    assert "Index Scan using dq_messages_pkey on dq_messages" in plans, plans
    assert "Index Scan Backward using dq_messages_pkey on dq_messages" in plans, plans
    assert "Seq Scan" not in plans, plans


# --------------------------------------------------------------------------- the workers' interpreter

WORKER_PYTHON_SCRIPT = """
import sys
from pyspark.sql import SparkSession
import pyqueue.spark

spark = (SparkSession.builder.master("local[1]").appName("pyqueue-worker-python")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=error").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
try:
    pyqueue.spark.register(spark)
except RuntimeError as exc:
    print("REGISTER FAILED:", exc, flush=True)
    spark.stop()
    sys.exit(3)
print("workers run:", spark.sparkContext.pythonExec, flush=True)
df = spark.createDataFrame([("k1", "hello")], "key string, payload string")
(df.write.format("delayedqueue").option("dsn", sys.argv[1]).option("queue", sys.argv[2]).mode("append").save())
print("written", flush=True)
spark.stop()
"""


def run_without_venv(tmp_path: Any, dsn: str, queue: str, **env: str) -> Any:
    """The script above, run by this virtualenv's interpreter as a user would without activating
    it: PATH has only the system directories (their ``python3`` lacks psycopg), no PYSPARK_*."""
    import subprocess

    script = tmp_path / "job.py"
    script.write_text(WORKER_PYTHON_SCRIPT)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "VIRTUAL_ENV"))}
    java = shutil.which("java")
    path = "/usr/bin:/bin" + (f":{os.path.dirname(java)}" if java else "")
    return subprocess.run([sys.executable, str(script), dsn, queue], capture_output=True, text=True, timeout=300,
                          env={**base, "PATH": path, **env}, cwd=tmp_path)


def test_register_runs_workers_with_this_interpreter_outside_an_activated_venv(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Any
) -> None:
    """Spark would start ``python3`` from PATH (no psycopg there); register() runs the local
    workers with this interpreter instead, and the write succeeds."""
    import subprocess

    assert subprocess.run(["/usr/bin/python3", "-c", "import psycopg"], capture_output=True).returncode != 0
    queue = queue_name()
    out = run_without_venv(tmp_path, dsn, queue)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"workers run: {sys.executable}" in out.stdout and "written" in out.stdout, out.stdout
    assert set(messages(conn, queue)) == {"k1"}


def test_register_says_to_set_pyspark_python_when_it_cannot(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Any
) -> None:
    """PYSPARK_PYTHON set to an interpreter without psycopg: register() does not override the
    user's choice; it fails at once saying to set PYSPARK_PYTHON, and nothing is written."""
    queue = queue_name()
    out = run_without_venv(tmp_path, dsn, queue, PYSPARK_PYTHON="/usr/bin/python3")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "REGISTER FAILED: delayedqueue: Spark's Python workers run '/usr/bin/python3'" in out.stdout, out.stdout
    assert "No module named 'psycopg'" in out.stdout
    assert f"Set PYSPARK_PYTHON to an interpreter where pgdelayq is installed, for example this one: " \
           f"PYSPARK_PYTHON={sys.executable}" in out.stdout
    assert messages(conn, queue) == {}
