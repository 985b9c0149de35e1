"""A Structured Streaming job: order events arriving as JSON files become delayed follow-up messages.

    python examples/spark_stream.py postgresql://postgres@127.0.0.1:55432/dq [--workdir DIR]

1. Unless ``DIR/events`` exists, writes ``--files`` JSON files of ``--rows-per-file`` order
   events there (the stream's input; a real job would have another process drop them).
2. Streams them, one file per micro-batch (``maxFilesPerTrigger``), with
   ``trigger(availableNow=True)``: every file present when the query starts is processed, then the
   query stops. Each order gets a follow-up message (queue ``follow-ups``, key
   ``follow-up/<order>``) due three days after the order, offered by the ``delayedqueue`` sink.
3. Reads the queue back through the data source and prints how many messages it holds.

The checkpoint (``DIR/checkpoint``) records which files were processed and which micro-batches
committed. Killing the job and starting it again with the same ``--workdir`` continues where it
stopped: Spark runs the micro-batch that had not committed again, and its keys make the messages
already offered ``ignored``, so every order has exactly one message (docs/spark.md, "Structured
Streaming"). The database must have the queue installed (``pyqueue migrate --dsn …``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import pyqueue.spark

QUEUE = "follow-ups"
T0 = datetime(2030, 1, 1, tzinfo=UTC)  # the first order's time


def write_events(directory: Path, files: int, rows_per_file: int) -> None:
    """The input: ``files`` JSON-lines files of orders o00000.., one minute apart from T0. Each
    file is written under a temporary name, then renamed, so the stream never reads half a file."""
    directory.mkdir(parents=True)
    for f in range(files):
        lines = []
        for r in range(rows_per_file):
            i = f * rows_per_file + r
            at = T0 + timedelta(minutes=i)
            lines.append(json.dumps({"order_id": f"o{i:05d}", "amount": (i * 37) % 100 + 1, "at": at.isoformat()}))
        tmp = directory / f".events-{f:04d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / f"events-{f:04d}.json")


def run(spark: SparkSession, dsn: str, workdir: Path, batch_size: int = 100) -> None:
    """Stream ``workdir/events`` into the queue until every file there is processed."""
    pyqueue.spark.register(spark)
    events = (
        spark.readStream.schema("order_id string, amount int, at timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(str(workdir / "events"))
    )
    follow_ups = events.select(
        F.concat(F.lit("follow-up/"), "order_id").alias("key"),
        F.struct("order_id", "amount").alias("payload"),  # written as JSON
        (F.col("at") + F.expr("INTERVAL 3 DAYS")).alias("scheduled_at"),  # from the data: the same on a replay
    )
    query = (
        follow_ups.writeStream.format("delayedqueue")
        .option("dsn", dsn)
        .option("queue", QUEUE)
        .option("batchSize", batch_size)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dsn", help="the queue's database")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="input and checkpoint (default: a new temporary one)"
    )
    parser.add_argument("--files", type=int, default=10, help="input files to write (default 10)")
    parser.add_argument("--rows-per-file", type=int, default=50, help="orders per file (default 50)")
    parser.add_argument("--batch-size", type=int, default=100, help="rows per dq_offer_many call (default 100)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="spark_stream-"))
    if not (workdir / "events").exists():
        write_events(workdir / "events", args.files, args.rows_per_file)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    settings["spark.sql.session.timeZone"] = "UTC"
    spark = SparkSession.builder.master("local[2]").appName("spark_stream example").config(map=settings).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        run(spark, args.dsn, workdir, args.batch_size)
        queued = spark.read.format("delayedqueue").option("dsn", args.dsn).option("queue", QUEUE).load().count()
    finally:
        spark.stop()
    print(f"{queued} messages in queue {QUEUE!r} (input and checkpoint in {workdir})")


if __name__ == "__main__":
    main()
