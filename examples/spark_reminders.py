"""A small PySpark job: from a Parquet file of shop events to delayed reminder messages, and back.

    python examples/spark_reminders.py --dsn postgresql://postgres@127.0.0.1:55432/dq [--users 2000]

1. Writes a Parquet file of events itself (users who put items in a cart, some of whom paid).
2. Computes reminders: a cart not paid for within the hour gets a reminder 24 hours after it was
   filled (queue ``reminders``); every user gets a weekly digest next Monday 08:00 UTC (queue
   ``digests``). The de-duplication key names what the message is about
   (``cart/<user>/<cart>``, ``digest/<user>/<monday>``), so running the job twice, or Spark
   retrying a task, creates no second reminder.
3. Offers them with the ``delayedqueue`` data source.
4. Reads the queue back through the data source and prints per-queue counts: messages ready
   (due now) and scheduled (due later).

The database must have the queue installed (``pyqueue migrate --dsn …``). See docs/spark.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import pyqueue.spark


def make_events(spark: SparkSession, path: str, users: int) -> None:
    """Write the example's input: one 'cart' event per user, and a 'paid' event for two in three."""
    base = spark.range(users).select(
        F.format_string("u%05d", "id").alias("user_id"),
        F.format_string("c%05d", "id").alias("cart_id"),
        # carts filled over the last three days
        (F.current_timestamp() - F.make_interval(mins=(F.col("id") * 7919) % (3 * 24 * 60))).alias("cart_at"),
        ((F.col("id") * 37) % 100 + 1).alias("amount"),
        (F.col("id") % 3 != 0).alias("paid"),
    )
    carts = base.select("user_id", "cart_id", F.lit("cart").alias("event"), F.col("cart_at").alias("at"), "amount")
    paid = base.where("paid").select(
        "user_id", "cart_id", F.lit("paid").alias("event"), (F.col("cart_at") + F.expr("INTERVAL 20 MINUTES")), "amount"
    )
    carts.unionByName(paid.toDF(*carts.columns)).write.mode("overwrite").parquet(path)


def reminders(events: DataFrame) -> DataFrame:
    """Carts not paid within the hour: a reminder 24 hours after the cart, payload a struct (JSON)."""
    carts = events.where(F.col("event") == "cart").alias("c")
    paid = events.where(F.col("event") == "paid").alias("p")
    unpaid = carts.join(
        paid,
        (F.col("c.cart_id") == F.col("p.cart_id")) & (F.col("p.at") <= F.col("c.at") + F.expr("INTERVAL 1 HOUR")),
        "left_anti",
    )
    return unpaid.select(
        F.concat_ws("/", F.lit("cart"), "user_id", "cart_id").alias("key"),
        F.struct("user_id", "cart_id", "amount", F.col("at").alias("cart_at")).alias("payload"),
        (F.col("at") + F.expr("INTERVAL 24 HOURS")).alias("scheduled_at"),
    )


def digests(events: DataFrame) -> DataFrame:
    """One weekly digest per user, next Monday 08:00 UTC; a text payload."""
    monday = F.to_timestamp(F.concat(F.next_day(F.current_date(), "Mon").cast("string"), F.lit(" 08:00:00")))
    return (
        events.select("user_id")
        .distinct()
        .select(
            F.concat_ws("/", F.lit("digest"), "user_id", F.date_format(monday, "yyyy-MM-dd")).alias("key"),
            F.concat(F.lit("weekly digest for "), "user_id").alias("payload"),
            monday.alias("scheduled_at"),
        )
    )


def offer(df: DataFrame, dsn: str, queue: str) -> None:
    df.write.format("delayedqueue").option("dsn", dsn).option("queue", queue).mode("append").save()


def queue_counts(spark: SparkSession, dsn: str) -> list[tuple[str, int, int]]:
    """(queue, ready, scheduled) for the queues this job fills, read through the data source."""
    messages = (
        spark.read.format("delayedqueue")
        .option("dsn", dsn)
        .option("numPartitions", "2")
        .load()
        .where(F.col("queue").isin("reminders", "digests"))  # pushed into the SQL
    )
    rows = (
        messages.groupBy("queue")
        .agg(
            F.sum((F.col("scheduled_at") <= F.current_timestamp()).cast("int")).alias("ready"),
            F.sum((F.col("scheduled_at") > F.current_timestamp()).cast("int")).alias("scheduled"),
        )
        .orderBy("queue")
        .collect()
    )
    return [(r["queue"], int(r["ready"]), int(r["scheduled"])) for r in rows]


def run(spark: SparkSession, dsn: str, users: int = 2000, workdir: str | None = None) -> list[tuple[str, int, int]]:
    """The whole job; returns the per-queue counts it prints."""
    pyqueue.spark.register(spark)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = str(Path(tmp) / "events.parquet")
        make_events(spark, path, users)
        events = spark.read.parquet(path)
        offer(reminders(events), dsn, "reminders")
        offer(digests(events), dsn, "digests")
    counts = queue_counts(spark, dsn)
    print(f"{'queue':<12}{'ready':>8}{'scheduled':>11}")
    for queue, ready, scheduled in counts:
        print(f"{queue:<12}{ready:>8}{scheduled:>11}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True, help="the queue's database")
    parser.add_argument("--users", type=int, default=2000)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("spark_reminders")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        run(spark, args.dsn, args.users)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
