"""End-to-end demo against a real server: offer delayed messages, consume them, measure lateness.

Run ``python examples/demo.py --dsn DSN``. Nothing is simulated:

1. installs the schema (:func:`pyqueue.migrate`) and uses a fresh queue ``demo-<timestamp>-<pid>``;
2. starts ``--consumers`` processes (multiprocessing ``spawn``), each with its own
   :class:`~pyqueue.DelayedQueue`, looping ``poll(wait=1 s)`` → read the database clock → ``ack_many``;
3. once every consumer's first poll has returned, offers ``--messages`` messages ``py-<n>`` from
   Python: a few with :meth:`~pyqueue.DelayedQueue.offer`, the rest in 20 chunks of
   :meth:`~pyqueue.DelayedQueue.offer_many` paced evenly over ``--spread`` seconds; each message is
   due ``delay`` after its own offer, ``delay`` uniform in [0, spread] seconds, and the database
   computes the due time (``now() + delay``);
4. half-way through, offers ``--psql-batch`` messages ``psql-<n>`` through the real ``psql`` program
   with one ``dq_offer_many`` statement whose due times are ``now() + random() * spread`` seconds;
5. shows a progress bar of delivered / total, then a summary; exit status 0 only when no message was
   lost and none was received twice.

Lateness is measured on the database clock only (never the client's): see :func:`consume`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from multiprocessing.queues import Queue as MpQueue
from multiprocessing.synchronize import Event as MpEvent
from queue import Empty
from typing import Any

import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pyqueue import DelayedQueue, OfferOutcome, OfferRequest
from pyqueue.migrate import migrate

__all__ = ["main"]

LOCK_TIMEOUT = timedelta(seconds=30)
POLL_WAIT_S = 1.0
CHUNKS = 20  # offer_many calls for the Python messages
SINGLES = 5  # Python messages offered one by one with offer()

# psql variables (:'queue', :n, :spread) are quoted/substituted by psql itself: no SQL is built here.
PSQL_OFFER = """
SELECT count(*) FILTER (WHERE o.outcome = 'created')
  FROM (SELECT array_agg('psql-' || g ORDER BY g)                                 AS keys,
               array_agg(convert_to('{"n":' || g || '}', 'UTF8') ORDER BY g)      AS payloads,
               array_agg(now() + random() * :spread * interval '1 second' ORDER BY g) AS ats,
               array_agg('json'::text ORDER BY g)                                 AS types
          FROM generate_series(1, :n) AS g) AS a,
       dq_offer_many(:'queue', a.keys, a.payloads, a.ats, true, a.types) AS o;
"""

# One delivery as reported by a consumer: key, due time, claim time, receipt time (all epoch
# seconds on the database clock), delivery_count, payload matched its key.
Delivery = tuple[str, float, float, float, int, bool]


def consume(cid: int, dsn: str, queue: str, batch_size: int, results: MpQueue[Any], stop: MpEvent) -> None:
    """Consumer process: poll, stamp, acknowledge, report, until ``stop`` is set.

    Two database-clock times per message, both in epoch seconds:

    * claim time = ``locked_until - lock_timeout``: ``dq_poll_many`` sets ``locked_until`` to its
      own ``clock_timestamp()`` + lock_timeout, so this is the server's clock when it took the row,
      fetched in the poll's own round trip;
    * receipt time = ``SELECT clock_timestamp()`` sent right after ``poll`` returned, one round trip
      per batch on the same pool: an upper bound of when the consumer had the message in hand.

    Sends ``("ready", cid)`` after the first poll, ``("batch", cid, [Delivery…])`` per batch,
    ``("done", cid)`` at the end, or ``("error", cid, traceback)``.
    """
    try:
        with DelayedQueue(dsn, queue, pool_size=2) as q:
            first = True
            while not stop.is_set():
                batch = q.poll(max_count=batch_size, lock_timeout=LOCK_TIMEOUT, wait=POLL_WAIT_S)
                if batch:
                    with q.pool.connection() as conn:
                        row = conn.execute("SELECT clock_timestamp()").fetchone()
                    assert row is not None
                    received: datetime = row[0]
                    deliveries: list[Delivery] = [
                        (
                            m.key,
                            m.scheduled_at.timestamp(),
                            (m.locked_until - LOCK_TIMEOUT).timestamp(),
                            received.timestamp(),
                            m.delivery_count,
                            f"-{m.payload.get('n')}" == m.key[m.key.rindex("-") :],
                        )
                        for m in batch
                    ]
                    q.ack_many(batch)
                    results.put(("batch", cid, deliveries))
                if first:
                    results.put(("ready", cid))
                    first = False
        results.put(("done", cid))
    except BaseException:  # report everything, the parent decides
        results.put(("error", cid, traceback.format_exc()))


@dataclass
class Produced:
    """What the producer offered (keys the database answered ``created`` for) and when."""

    python_keys: list[str] = field(default_factory=list)
    psql_keys: list[str] = field(default_factory=list)
    finished_at: float | None = None  # time.monotonic() seconds, None while producing
    error: str | None = None


def offer_with_psql(dsn: str, queue: str, count: int, spread: float) -> int:
    """Offer ``count`` messages ``psql-1..count`` with the ``psql`` program; return how many were created."""
    psql = shutil.which("psql")
    if psql is None:
        raise RuntimeError("psql is not on PATH")
    out = subprocess.run(
        [
            psql,
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            f"queue={queue}",
            "-v",
            f"n={count}",
            "-v",
            f"spread={float(spread)}",
            "-f",
            "-",
            dsn,
        ],
        input=PSQL_OFFER,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(out.stdout.strip())


def produce(dsn: str, queue: str, n: int, spread: float, psql_n: int, produced: Produced) -> None:
    """Producer thread: ``n`` Python messages and ``psql_n`` psql messages over ``spread`` seconds."""
    rng = random.Random()
    try:
        with DelayedQueue(dsn, queue, pool_size=1) as q:
            requests = [OfferRequest(f"py-{i}", {"n": i}, delay=rng.uniform(0.0, spread)) for i in range(1, n + 1)]
            for r in requests[:SINGLES]:
                if q.offer(r.key, r.payload, delay=r.delay) is OfferOutcome.CREATED:
                    produced.python_keys.append(r.key)
            rest = requests[SINGLES:]
            size = -(-len(rest) // CHUNKS)
            start = time.monotonic()
            for i in range(CHUNKS):
                time.sleep(max(0.0, start + i * spread / CHUNKS - time.monotonic()))
                if i == CHUNKS // 2 and psql_n > 0:
                    if offer_with_psql(dsn, queue, psql_n, spread) == psql_n:
                        produced.psql_keys = [f"psql-{g}" for g in range(1, psql_n + 1)]
                outcomes = q.offer_many(rest[i * size : (i + 1) * size])
                produced.python_keys += [k for k, o in outcomes.items() if o is OfferOutcome.CREATED]
    except Exception:
        produced.error = traceback.format_exc()
    finally:
        produced.finished_at = time.monotonic()


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0–100) of already sorted values; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def server_line(dsn: str) -> str:
    """One line naming the server, database and user (never the password)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_setting('server_version')").fetchone()
        i = conn.info
        version = row[0] if row else "?"
        return f"server: PostgreSQL {version} at {i.host}:{i.port}, database {i.dbname}, user {i.user}"


def cleanup(dsn: str, queue: str) -> tuple[int, int]:
    """Remove the queue's leftovers: messages (through ``dq_cancel``) and waiter rows. Returns the counts."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        msgs = conn.execute(
            "SELECT count(*) FILTER (WHERE dq_cancel(m.queue, m.key)) FROM dq_messages m WHERE m.queue = %s",
            (queue,),
        ).fetchone()
        # dq_waiters is soft state (a consumer that died never called dq_wait_done).
        waiters = conn.execute("DELETE FROM dq_waiters WHERE queue = %s", (queue,)).rowcount
    return (int(msgs[0]) if msgs else 0), waiters


@dataclass
class Collected:
    """What the parent received from the consumers."""

    deliveries: list[tuple[int, Delivery]] = field(default_factory=list)  # (consumer id, delivery)
    keys: set[str] = field(default_factory=set)
    batches: Counter[int] = field(default_factory=Counter)
    ready: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def handle(self, msg: tuple[Any, ...]) -> None:
        """Record one report from a consumer (see :func:`consume`)."""
        kind, cid = msg[0], msg[1]
        if kind == "batch":
            self.deliveries += [(cid, d) for d in msg[2]]
            self.keys.update(d[0] for d in msg[2])
            self.batches[cid] += 1
        elif kind == "ready":
            self.ready.add(cid)
        elif kind == "done":
            self.done.add(cid)
        else:
            self.errors.append(f"consumer {cid}:\n{msg[2]}")
            self.done.add(cid)


def drain(results: MpQueue[Any], got: Collected, timeout_s: float) -> None:
    """Handle whatever reports arrive within ``timeout_s`` seconds (returns at the first gap)."""
    try:
        got.handle(results.get(timeout=timeout_s))
        while True:
            got.handle(results.get_nowait())
    except Empty:
        return


def summarize(console: Console, produced: Produced, got: Collected, consumers: int, wall_s: float) -> tuple[int, int]:
    """Print the summary tables; return ``(lost, duplicates)``. Times in ms, rates in messages/s."""
    deliveries = [d for _, d in got.deliveries]
    counts = Counter(d[0] for d in deliveries)
    lost = len((set(produced.python_keys) | set(produced.psql_keys)) - counts.keys())
    duplicates = sum(1 for c in counts.values() if c > 1)
    receipt_ms = sorted((d[3] - d[1]) * 1000 for d in deliveries)
    claim_ms = sorted((d[2] - d[1]) * 1000 for d in deliveries)
    first_due = min((d[1] for d in deliveries), default=0.0)
    window = max((d[3] for d in deliveries), default=0.0) - first_due
    bad = sum(1 for d in deliveries if not d[5])

    t = Table(title="pyqueue demo", caption_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("offered (python / psql)", f"{len(produced.python_keys):,} / {len(produced.psql_keys):,}")
    t.add_row("delivered (distinct keys)", f"{len(counts):,}")
    t.add_row("duplicates (keys received more than once)", f"{duplicates:,}", style="red" if duplicates else None)
    t.add_row("lost (offered, never received)", f"{lost:,}", style="red" if lost else None)
    t.add_row("redeliveries (delivery_count > 1)", f"{sum(1 for d in deliveries if d[4] > 1):,}")
    t.add_row("payloads not matching their key", f"{bad:,}", style="red" if bad else None)
    for label, values in (("receipt", receipt_ms), ("claim", claim_ms)):
        stats = " / ".join(f"{percentile(values, q):.1f}" for q in (50, 99, 100))
        t.add_row(f"lateness at {label}, p50 / p99 / max (ms)", stats)
    rate = len(deliveries) / window if window > 0 else float("nan")
    t.add_row("delivery rate (msg/s)", f"{rate:,.0f}")
    t.add_row("wall time (s)", f"{wall_s:.1f}")
    t.caption = (
        "All times on the database clock. lateness = t - scheduled_at, where t is, at receipt, a "
        "clock_timestamp() read right after poll returned (an upper bound) and, at claim, dq_poll_many's "
        f"clock_timestamp() when it locked the row. delivery rate = deliveries / (last receipt - first due) "
        f"= {len(deliveries):,} / {window:.2f} s: the offered load, not the capacity."
    )
    console.print(t)

    per = Table(title="per consumer")
    for col in ("consumer", "messages", "batches", "mean batch"):
        per.add_column(col, justify="right")
    msgs = Counter(cid for cid, _ in got.deliveries)
    for cid in range(consumers):
        mean = msgs[cid] / got.batches[cid] if got.batches[cid] else 0.0
        per.add_row(str(cid), f"{msgs[cid]:,}", f"{got.batches[cid]:,}", f"{mean:.1f}")
    console.print(per)
    return lost, duplicates


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit status (0 only when nothing was lost or duplicated)."""
    ap = argparse.ArgumentParser(prog="python examples/demo.py", description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", required=True, help="libpq connection string or URL")
    ap.add_argument("--messages", type=int, default=10_000, help="messages offered from Python (default 10000)")
    ap.add_argument("--spread", type=float, default=10.0, help="seconds: offers and delays span this (default 10)")
    ap.add_argument("--consumers", type=int, default=4, help="consumer processes (default 4)")
    ap.add_argument("--batch-size", type=int, default=100, help="max messages per poll (default 100)")
    ap.add_argument("--psql-batch", type=int, default=500, help="messages offered through psql (default 500)")
    args = ap.parse_args(argv)

    console = Console()
    try:
        console.print(server_line(args.dsn), soft_wrap=True)
    except psycopg.OperationalError as e:
        console.print(f"[red]cannot connect:[/red] {e}", soft_wrap=True)
        return 2
    wall0 = time.monotonic()
    migrate(args.dsn)
    queue = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    console.print(
        f"queue {queue}: {args.consumers} consumers, {args.messages:,} + {args.psql_batch:,} psql "
        f"messages due within {args.spread:g} s of their offer, offers spread over {args.spread:g} s",
        soft_wrap=True,
    )

    ctx = mp.get_context("spawn")
    results: MpQueue[Any] = ctx.Queue()
    stop = ctx.Event()
    procs = [
        ctx.Process(
            target=consume,
            args=(i, args.dsn, queue, args.batch_size, results, stop),
            name=f"consumer-{i}",
            daemon=True,  # never outlive the demo
        )
        for i in range(args.consumers)
    ]
    for p in procs:
        p.start()
    got, produced = Collected(), Produced()
    ready_by = time.monotonic() + 60
    while len(got.ready) < args.consumers and not got.errors and time.monotonic() < ready_by:
        drain(results, got, 0.5)
        if any(p.exitcode is not None for p in procs):
            break

    producer = threading.Thread(
        target=produce, args=(args.dsn, queue, args.messages, args.spread, args.psql_batch, produced)
    )
    if len(got.ready) == args.consumers and not got.errors:
        producer.start()
        columns = (TextColumn("delivered"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("delivered", total=args.messages + args.psql_batch)
            while not got.errors:
                drain(results, got, 0.1)
                progress.update(task, completed=len(got.keys))
                if produced.finished_at is not None:
                    offered = set(produced.python_keys) | set(produced.psql_keys)
                    if offered <= got.keys or time.monotonic() > produced.finished_at + args.spread + 30:
                        break
        producer.join()
    else:
        got.errors.append("consumers did not all become ready (died, or not within 60 s)")
    stop.set()
    done_by = time.monotonic() + 30
    while len(got.done) < args.consumers and time.monotonic() < done_by:
        drain(results, got, 0.5)
        if all(p.exitcode is not None for p in procs):
            drain(results, got, 0.5)
            break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
            got.errors.append(f"{p.name} did not stop within 35 s and was terminated")
    wall_s = time.monotonic() - wall0

    lost, duplicates = summarize(console, produced, got, args.consumers, wall_s)
    for err in got.errors + ([produced.error] if produced.error else []):
        console.print(f"[red]error:[/red] {err}")
    ok = lost == 0 and duplicates == 0 and not got.errors and produced.error is None
    if ok:
        msgs, waiters = cleanup(args.dsn, queue)
        console.print(
            f"all delivered; removed queue {queue} ({msgs} leftover messages, {waiters} waiter rows)", soft_wrap=True
        )
    else:
        console.print(f"[red]FAILED[/red]: lost {lost}, duplicates {duplicates}; queue {queue} kept", soft_wrap=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
