"""The processes of the fault-injection run (bench.chaos): producers, handlers for ``pyqueue
worker``, and a consumer built on ``DelayedQueue.transaction``.

Everything here records what it did in the database of ``$CHAOS_DSN`` (that DSN carries the
process's ``application_name``, so the connections of the handlers are the worker's connections
for ``pg_terminate_backend``) or, for the producers, in a file, so that bench.chaos can account
for every key afterwards:

* ``chaos_deliveries``: one row per handler run, written in autocommit when the handler starts
  (key, delivery_count, worker pid, lock token, locked_until, clock_timestamp()). A row survives
  whatever happens to the delivery afterwards, so extra deliveries can be matched to faults.
* ``chaos_ledger`` (exactly-once mode): one row per handled key, written in the transaction
  that acknowledges the message: the ledger and the acknowledgement commit together or not at all.
* ``chaos_offered``: the outbox producer's own record of its offers, in the offer's transaction;
  an offer whose commit outcome the producer did not learn is resolved by looking it up here.

Handlers (``pyqueue worker … bench.chaos_clients:<name>``):

* :func:`record` / :func:`record_async` (at-least-once): log the delivery and return; the worker
  acknowledges.
* :func:`ledger` / :func:`ledger_async` (exactly-once): log the delivery, then in one transaction
  insert the ledger row and acknowledge with ``message.ack(conn=…)``; a stale token (the lock
  was lost, the message re-acquired elsewhere) rolls the ledger row back. The worker sees that
  the handler settled the message and sends no acknowledgement of its own.

Command line (started by bench.chaos)::

    python -m bench.chaos_clients produce --queue Q --kind outbox|plain --prefix P --rate R --until EPOCH --records FILE
    python -m bench.chaos_clients produce --queue Q --queue2 Q2 --kind graph --prefix P --rate R --until EPOCH \
        --records FILE
    python -m bench.chaos_clients consume-tx --queue Q --lock-timeout S --batch N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg

from pyqueue import DelayedQueue, Message, OfferRequest, PyQueueError

DSN_ENV = "CHAOS_DSN"
WORK_MS_ENV = "CHAOS_WORK_MS"  # each handler also sleeps up to this long (default 20 ms)

Q_LOG_DELIVERY = (
    "INSERT INTO chaos_deliveries (queue, key, delivery_count, pid, lock_token, locked_until) "
    "VALUES (%s, %s, %s, %s, %s, %s)"
)
Q_LEDGER = "INSERT INTO chaos_ledger (queue, key, delivery_count, pid) VALUES (%s, %s, %s, %s)"
# A batch of deliveries (consume-tx): the same rows as Q_LOG_DELIVERY and Q_LEDGER, in one statement each.
Q_LOG_DELIVERIES = (
    "INSERT INTO chaos_deliveries (queue, key, delivery_count, pid, lock_token, locked_until) "
    "SELECT %s, k, n, %s, t, u FROM unnest(%s::text[], %s::int[], %s::uuid[], %s::timestamptz[]) AS x (k, n, t, u)"
)
Q_LEDGER_MANY = (
    "INSERT INTO chaos_ledger (queue, key, delivery_count, pid) "
    "SELECT %s, k, n, %s FROM unnest(%s::text[], %s::int[]) AS x (k, n)"
)
Q_OFFERED = "INSERT INTO chaos_offered (queue, key, producer) SELECT %s, k, %s FROM unnest(%s::text[]) AS k"

SCHEMA = """
CREATE TABLE IF NOT EXISTS chaos_deliveries (
    queue text NOT NULL, key text NOT NULL, delivery_count int NOT NULL, pid int NOT NULL,
    lock_token uuid NOT NULL, locked_until timestamptz NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS chaos_ledger (
    queue text NOT NULL, key text NOT NULL, delivery_count int NOT NULL, pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS chaos_offered (
    queue text NOT NULL, key text NOT NULL, producer text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
"""

log = logging.getLogger("bench.chaos_clients")


class LockLost(Exception):
    """The acknowledgement in the ledger transaction found the token stale: roll the ledger back."""


def _work() -> float:
    return random.uniform(0, float(os.environ.get(WORK_MS_ENV, "20")) / 1000)


# --------------------------------------------------------------------------- sync handlers

_idle: list[psycopg.Connection[Any]] = []
_idle_lock = threading.Lock()


@contextmanager
def _connection() -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of this process (kept for reuse when the caller finished cleanly,
    closed after any error: a connection cut by a fault is never reused)."""
    with _idle_lock:
        conn = _idle.pop() if _idle else None
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ[DSN_ENV], autocommit=True)
    ok = False
    try:
        yield conn
        ok = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        if ok:
            with _idle_lock:
                _idle.append(conn)
        else:
            conn.close()


def _log_params(message: Any) -> tuple[Any, ...]:
    return (message.queue, message.key, message.delivery_count, os.getpid(), message.lock_token, message.locked_until)


def record(message: Message) -> None:
    """At-least-once: log the delivery (autocommit) and return; the worker acknowledges."""
    with _connection() as conn:
        conn.execute(Q_LOG_DELIVERY, _log_params(message))
    time.sleep(_work())


def ledger(message: Message) -> None:
    """Exactly-once: log the delivery, then the ledger row and the acknowledgement in one transaction."""
    with _connection() as conn:
        conn.execute(Q_LOG_DELIVERY, _log_params(message))
        time.sleep(_work())
        with conn.transaction():
            conn.execute(Q_LEDGER, (message.queue, message.key, message.delivery_count, os.getpid()))
            if not message.ack(conn=conn):
                raise LockLost(f"{message.key}: the token was stale at the acknowledgement")


# --------------------------------------------------------------------------- async handlers

_aidle: list[psycopg.AsyncConnection[Any]] = []


@asynccontextmanager
async def _aconnection() -> Any:
    conn = _aidle.pop() if _aidle else None
    if conn is None or conn.closed:
        conn = await psycopg.AsyncConnection.connect(os.environ[DSN_ENV], autocommit=True)
    ok = False
    try:
        yield conn
        ok = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        if ok:
            _aidle.append(conn)
        else:
            await conn.close()


async def record_async(message: Any) -> None:
    """:func:`record` as a coroutine (``pyqueue worker --async``)."""
    async with _aconnection() as conn:
        await conn.execute(Q_LOG_DELIVERY, _log_params(message))
    await asyncio.sleep(_work())


async def ledger_async(message: Any) -> None:
    """:func:`ledger` as a coroutine, acknowledging with ``AsyncMessage.ack(conn=…)``."""
    async with _aconnection() as conn:
        await conn.execute(Q_LOG_DELIVERY, _log_params(message))
        await asyncio.sleep(_work())
        async with conn.transaction():
            await conn.execute(Q_LEDGER, (message.queue, message.key, message.delivery_count, os.getpid()))
            if not await message.ack(conn=conn):
                raise LockLost(f"{message.key}: the token was stale at the acknowledgement")


# --------------------------------------------------------------------------- processes


class _Stop:
    def __init__(self) -> None:
        self.event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.event.set())


def produce(args: argparse.Namespace) -> int:
    """Offer keys ``<prefix>-<n>`` at ``rate`` per second until ``until`` (epoch seconds).

    ``outbox``: batches of ``batch`` in one transaction with their ``chaos_offered`` rows
    (``offer_many(conn=…)``); ``plain``: one autocommit ``offer`` per key. A third of the messages
    are delayed 0.5–3 s. Every attempt is one JSON line in ``records``: its keys, the time, and
    ``ok`` (the call returned: committed) or ``unknown`` (it raised: the commit may or may not
    have happened). Nothing is retried: a retried key could be offered again after it was
    acknowledged. Keys are never reused; ``can_update=False``.
    """
    stop = _Stop()
    rng = random.Random(args.seed)
    batch = args.batch if args.kind == "outbox" else 1
    interval = batch / args.rate
    seq = 0
    with open(args.records, "a", encoding="utf-8") as out, DelayedQueue(os.environ[DSN_ENV], args.queue,
                                                                         pool_size=2) as q:
        next_t = time.time()
        while not stop.event.is_set() and time.time() < args.until:
            now = time.time()
            if next_t > now:
                stop.event.wait(min(next_t - now, args.until - now))
                continue
            next_t = max(next_t + interval, now - 1.0)  # after a stall, catch up at most a second
            keys = [f"{args.prefix}-{seq + i:07d}" for i in range(batch)]
            seq += batch
            items = [OfferRequest(k, {"k": k}, delay=rng.uniform(0.5, 3.0) if rng.random() < 1 / 3 else None)
                     for k in keys]
            record: dict[str, Any] = {"t": now, "keys": keys}
            try:
                if args.kind == "outbox":
                    with q.pool.connection() as conn, conn.transaction():
                        conn.execute(Q_OFFERED, (args.queue, args.prefix, keys))
                        outcomes = q.offer_many(items, can_update=False, conn=conn)
                else:
                    r = items[0]
                    outcomes = {r.key: q.offer(r.key, r.payload, delay=r.delay, can_update=False)}
                record["status"] = "ok"
                record["outcomes"] = sorted({o.value for o in outcomes.values()})
            except (PyQueueError, psycopg.Error) as exc:
                record["status"] = "unknown"
                record["error"] = f"{type(exc).__name__}: {exc}"[:300]
            record["t_done"] = time.time()
            out.write(json.dumps(record) + "\n")
            out.flush()
            if record["status"] != "ok":
                stop.event.wait(0.2)
    return 0


#: The graphs the graph producer offers (bench.chaos --mode graph): node name -> (queue 0 or 1, parents).
#: The ETL shape: one extract, three transforms after it, a load after all three, a report after the
#: load; and a chain of four alternating between the two queues.
GRAPHS: dict[str, dict[str, tuple[int, tuple[str, ...]]]] = {
    "etl": {"extract": (0, ()), "t1": (1, ("extract",)), "t2": (1, ("extract",)), "t3": (0, ("extract",)),
            "load": (0, ("t1", "t2", "t3")), "report": (1, ("load",))},
    "chain": {"c1": (0, ()), "c2": (1, ("c1",)), "c3": (0, ("c2",)), "c4": (1, ("c3",))},
}


def offer_node(conn: psycopg.Connection[Any], queue: str, key: str, payload: dict[str, Any],
               after: list[list[str]] | None) -> str:
    """One node of a graph: dq_offer with after (the one place the graph producer offers; the Python
    clients' offer(after=...) can replace it)."""
    row = conn.execute(
        "SELECT dq_offer(queue => %s, key => %s, payload => %s::jsonb, can_update => false, after => %s::jsonb, "
        "on_parent_failure => 'wait')",
        (queue, key, json.dumps(payload), json.dumps(after) if after else None)).fetchone()
    assert row is not None
    return str(row[0])


def produce_graph(args: argparse.Namespace) -> int:
    """Offer graphs (GRAPHS, alternating) of ``<prefix>-<n>-<node>`` keys across ``queue`` and
    ``queue2`` at ``rate`` nodes per second until ``until``: each graph in one transaction, parents
    first, children with ``after`` naming their parents as [queue, key] pairs, with its
    ``chaos_offered`` rows. Every attempt is one JSON line in ``records`` (``keys``: the nodes' keys;
    ``nodes``: [queue, key, [[parent queue, parent key], …]] each; ``status`` ok or unknown), as
    :func:`produce` writes them. Nothing is retried; keys are never reused."""
    stop = _Stop()
    queues = (args.queue, args.queue2)
    names = sorted(GRAPHS)
    seq = 0
    with open(args.records, "a", encoding="utf-8") as out, psycopg.connect(os.environ[DSN_ENV]) as conn:
        next_t = time.time()
        while not stop.event.is_set() and time.time() < args.until:
            now = time.time()
            if next_t > now:
                stop.event.wait(min(next_t - now, args.until - now))
                continue
            shape = GRAPHS[names[seq % len(names)]]
            next_t = max(next_t + len(shape) / args.rate, now - 1.0)
            gid = f"{args.prefix}-{seq:07d}"
            seq += 1
            nodes = [[queues[qi], f"{gid}-{name}", [[queues[shape[p][0]], f"{gid}-{p}"] for p in parents]]
                     for name, (qi, parents) in shape.items()]
            record: dict[str, Any] = {"t": now, "keys": [n[1] for n in nodes], "nodes": nodes}
            try:
                if conn.closed or conn.broken:
                    conn = psycopg.connect(os.environ[DSN_ENV])
                with conn.transaction():
                    conn.execute(Q_OFFERED, (args.queue, args.prefix, record["keys"]))
                    outcomes = {offer_node(conn, q, k, {"k": k}, after) for q, k, after in nodes}
                record["status"] = "ok"
                record["outcomes"] = sorted(outcomes)
            except psycopg.Error as exc:
                record["status"] = "unknown"
                record["error"] = f"{type(exc).__name__}: {exc}"[:300]
            record["t_done"] = time.time()
            out.write(json.dumps(record) + "\n")
            out.flush()
            if record["status"] != "ok":
                stop.event.wait(0.2)
    return 0


def consume_tx(args: argparse.Namespace) -> int:
    """Exactly-once consumer on :meth:`pyqueue.DelayedQueue.transaction`: poll up to ``batch`` in a
    transaction, log the deliveries (one autocommit statement, on another connection), insert the
    ledger rows (one statement) on the transaction's connection; the context manager acknowledges
    and commits. An empty poll
    sleeps 0.1 s; a failure is logged and retried after 0.5 s doubling up to 8 s."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = _Stop()
    failures = 0
    handled = 0
    log.info("consume-tx ready: queue %r, batch %d, lock_timeout %.1f s", args.queue, args.batch, args.lock_timeout)
    with DelayedQueue(os.environ[DSN_ENV], args.queue, pool_size=2) as q:
        while not stop.event.is_set():
            try:
                with q.transaction(max_count=args.batch, lock_timeout=args.lock_timeout) as tx:
                    if tx.messages:
                        ms = tx.messages
                        keys, counts = [m.key for m in ms], [m.delivery_count for m in ms]
                        with _connection() as side:
                            side.execute(Q_LOG_DELIVERIES, (args.queue, os.getpid(), keys, counts,
                                                            [m.lock_token for m in ms],
                                                            [m.locked_until for m in ms]))
                        time.sleep(_work())
                        tx.connection.execute(Q_LEDGER_MANY, (args.queue, os.getpid(), keys, counts))
                n = len(tx.messages)
            except (PyQueueError, psycopg.Error) as exc:
                failures += 1
                delay = min(0.5 * 2 ** (failures - 1), 8.0)
                log.warning("transaction failed (attempt %d: %s); retrying in %.1f s", failures, exc, delay)
                stop.event.wait(delay)
                continue
            if failures:
                log.info("database reachable again after %d failures", failures)
                failures = 0
            handled += n
            if not n:
                stop.event.wait(0.1)
    log.info("consume-tx stopped: %d handled", handled)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos_clients")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--queue", required=True)
    p.add_argument("--kind", choices=["outbox", "plain", "graph"], required=True)
    p.add_argument("--queue2", default=None, help="graph: the second queue")
    p.add_argument("--prefix", required=True)
    p.add_argument("--rate", type=float, required=True, help="messages per second")
    p.add_argument("--batch", type=int, default=10, help="outbox: keys per transaction")
    p.add_argument("--until", type=float, required=True, help="stop at this time (epoch seconds)")
    p.add_argument("--records", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=lambda a: produce_graph(a) if a.kind == "graph" else produce(a))
    p = sub.add_parser("consume-tx")
    p.add_argument("--queue", required=True)
    p.add_argument("--lock-timeout", type=float, required=True)
    p.add_argument("--batch", type=int, default=4)
    p.set_defaults(func=consume_tx)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
