"""Reading with the ``delayedqueue`` PySpark data source (pyqueue.spark, docs/spark.md) against
the test server: filters pushed down to the export functions, chosen columns, the roles that may
read the live messages and the archive, and the export functions themselves in SQL.

The queries are observed through Spark's own Python worker logs
(``spark.tvf.python_worker_logs()``), where the data source logs every query it runs; the Spark
session is tests/spark/conftest.py's.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import Row, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from sparkhelpers import (  # noqa: E402
    T0,
    denied,
    numbered,
    queue_name,
    read_logs,
    writer,
)

import pyqueue.spark  # noqa: E402

pytestmark = pytest.mark.spark


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


def test_read_release_times(spark: SparkSession, dsn: str, conn: psycopg.Connection[Any]) -> None:
    """released_at of the live messages and of the archive: when a child's parents released it
    (NULL for a message that never waited), with a pushed IS NOT NULL filter. Compared as
    microseconds since the epoch (a collected timestamp is in the driver's local time)."""
    queue = queue_name()
    conn.execute("SELECT dq_configure_queue(%s, archive => true)", (queue,))
    conn.execute("SELECT dq_offer(%s, 'parent', 'x'::bytea, now() - interval '1 second')", (queue,))
    for key in ("c1", "c2"):
        conn.execute("SELECT dq_offer(%s, %s, 'x'::bytea, now() - interval '1 second', after => '[\"parent\"]')",
                     (queue, key))
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 5, '1 hour')", (queue,)).fetchone() or (None,)
    assert conn.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,)
    micros = "(extract(epoch FROM released_at) * 1000000)::bigint"
    live = dict(conn.execute(
        f"SELECT key, {micros} FROM dq_messages WHERE queue = %s AND released_at IS NOT NULL",  # noqa: S608
        (queue,)).fetchall())
    assert sorted(live) == ["c1", "c2"]

    def read(table: str) -> dict[str, int]:
        df = (spark.read.format("delayedqueue").option("dsn", dsn).option("table", table).option("queue", queue)
              .load().where(F.col("released_at").isNotNull()))
        return {r.key: r.us for r in df.select("key", F.unix_micros("released_at").alias("us")).collect()}

    assert read("messages") == live
    tokens = [r[0] for r in conn.execute("SELECT lock_token FROM dq_poll_many(%s, 5, '1 hour')", (queue,))]
    assert conn.execute("SELECT dq_ack_many(%s::uuid[])", (tokens,)).fetchone() == (2,)
    assert read("archive") == live
    found = read_logs(spark, f'["queue", "=", "{queue}"]')
    assert any('SELECT "dq_export_archive"' in m and '["released_at", "IS NOT NULL"]' in m for m in found)
    everything = spark.read.format("delayedqueue").option("dsn", dsn).option("table", "archive").option("queue", queue)
    assert {r.key: r.released_at is None for r in everything.load().collect()} == {
        "parent": True, "c1": False, "c2": False}


# --------------------------------------------------------------------------- roles: no table access needed


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
    from sqlhelpers import nested_plans

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
