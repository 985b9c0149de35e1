"""The ``delayedqueue`` Structured Streaming sink (pyqueue.spark.DelayedQueueStreamWriter,
docs/spark.md "Structured Streaming"): exactly one message per key across a crash and a restart.

The stream runs as ``examples/spark_stream.py`` in a separate process (its own Spark, local mode)
reading JSON files one per micro-batch. The test kills that process and its JVM with SIGKILL while
a micro-batch is partly offered, starts it again on the same checkpoint, and compares the queue
with the input; the restarted run's commit summaries show the replayed micro-batch's rows that
were already offered as ``ignored``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("pyspark")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
EXAMPLE = PROJECT / "examples" / "spark_stream.py"
FILES, ROWS_PER_FILE, BATCH = 12, 25, 5  # one file per micro-batch, 5 dq_offer_many calls each
TOTAL = FILES * ROWS_PER_FILE
T0 = datetime(2030, 1, 1, tzinfo=UTC)  # the example's first order time
SUMMARY = re.compile(r"created (\d+), updated (\d+), ignored (\d+), superseded (\d+);.*\(micro-batch (\d+)\)")

# Test scaffolding in the test's own database: every INSERT statement into dq_messages (one per
# dq_offer_many call) takes 0.2 s longer, so that a micro-batch is offered over about a second and
# the kill can land inside one.
SLOW_OFFERS = """
CREATE FUNCTION test_slow_offer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
CREATE TRIGGER test_slow_offer AFTER INSERT ON dq_messages FOR EACH STATEMENT EXECUTE FUNCTION test_slow_offer();
"""


def count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM dq_messages WHERE queue = 'follow-ups'").fetchone()
    assert row is not None
    return int(row[0])


def committed_batches(checkpoint: Path) -> int:
    """Micro-batches Spark recorded as committed in the checkpoint (files commits/0, commits/1, …)."""
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else 0


def test_killed_stream_restarts_with_one_message_per_key(dsn: str, tmp_path: Path) -> None:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(SLOW_OFFERS)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))
    command = [
        sys.executable,
        str(EXAMPLE),
        dsn,
        "--workdir",
        str(tmp_path),
        "--files",
        str(FILES),
        "--rows-per-file",
        str(ROWS_PER_FILE),
        "--batch-size",
        str(BATCH),
    ]

    # 1. Run until the queue holds two whole micro-batches or more and 1 or 2 calls of the next one,
    #    then SIGKILL the process group: the example's Python driver and its JVM.
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while not ((n := count(conn)) >= 2 * ROWS_PER_FILE and 0 < n % ROWS_PER_FILE <= 2 * BATCH):
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the stream did not reach the kill point in time"
                time.sleep(0.02)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    time.sleep(1.0)  # the call in flight at the kill still completes on the server
    at_kill = count(conn)
    done = committed_batches(tmp_path / "checkpoint")
    partial = at_kill - done * ROWS_PER_FILE
    assert at_kill < TOTAL
    assert 0 < partial < ROWS_PER_FILE, (at_kill, done)  # the killed micro-batch was partly offered

    # 2. Start it again on the same checkpoint, at full speed; it runs to the end of the input.
    conn.execute("DROP TRIGGER test_slow_offer ON dq_messages")
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{TOTAL} messages in queue 'follow-ups'" in second.stdout

    summaries = {
        int(m[4]): {"created": int(m[0]), "updated": int(m[1]), "ignored": int(m[2]), "superseded": int(m[3])}
        for m in SUMMARY.findall(second.stderr)
    }
    # the restart began with the micro-batch that had not committed: what the killed run had
    # offered of it is ignored, the rest created; the following micro-batches are new
    assert sorted(summaries) == list(range(done, FILES))
    assert summaries[done] == {"created": ROWS_PER_FILE - partial, "updated": 0, "ignored": partial, "superseded": 0}
    for batch in range(done + 1, FILES):
        assert summaries[batch] == {"created": ROWS_PER_FILE, "updated": 0, "ignored": 0, "superseded": 0}

    # 3. The queue against the input: every order once, with its payload and time.
    rows = conn.execute(
        "SELECT key, payload, payload_type, scheduled_at FROM dq_messages WHERE queue = 'follow-ups'"
    ).fetchall()
    stored = {key: (json.loads(bytes(payload)), ptype, at) for key, payload, ptype, at in rows}
    expected = {
        f"follow-up/o{i:05d}": (
            {"order_id": f"o{i:05d}", "amount": (i * 37) % 100 + 1},
            "json",
            T0 + timedelta(minutes=i, days=3),
        )
        for i in range(TOTAL)
    }
    assert stored == expected
    conn.close()
