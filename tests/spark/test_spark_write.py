"""Writing with the ``delayedqueue`` PySpark data source (pyqueue.spark, docs/spark.md) against
the test server: batches and their outcomes, retried tasks, duplicate keys, payload kinds, bad rows
and options, the producer role, an install in another schema, the example job and the interpreter
of Spark's Python workers.

Write outcomes are observed through Spark's own Python worker logs
(``spark.tvf.python_worker_logs()``), where the data source logs its commit summary; the Spark
session is tests/spark/conftest.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from datetime import UTC, timedelta
from typing import Any

import psycopg
import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, Row, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from sparkhelpers import (  # noqa: E402
    T0,
    denied,
    logs,
    messages,
    numbered,
    queue_name,
    read_logs,
    summary,
    writer,
)

from pyqueue.migrate import migrate  # noqa: E402

pytestmark = pytest.mark.spark


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
