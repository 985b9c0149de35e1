"""The two sides every benchmark compares: the queue's ``dq_*`` functions (DQ) and plain SQL doing
the same work on ``bench_baseline``, a copy of ``dq_messages`` (BASELINE); and the units of work
that client processes repeat with them (offer, offer_many, poll + ack).

The baseline is the most the server can do for the work: the same rows written and read by plain
statements, without validation, wake-ups or function calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

QUEUE = "bench"
PAYLOAD = bytes(range(100))  # every message carries 100 bytes
FILL_BATCH = 10_000  # rows per server-side fill statement


@dataclass(frozen=True)
class Side:
    """The statements one side runs. Hot-path statements take positional parameters:
    offer (queue, key, payload); offer_many (queue, keys, payloads); poll (queue, n) returning
    (id, key, payload, lock_token); ack (lock_tokens). The others take named parameters."""

    name: str
    table: str
    truncate: tuple[str, ...]
    offer: str
    offer_many: str
    poll: str
    ack: str
    wait: str  # (queue, max_wait) -> seconds to sleep
    channel: str  # (queue) -> LISTEN channel
    fill: str  # (queue, prefix, payload, t0, lo, hi): messages lo..hi due at t0 + g ms


DQ = Side(
    name="dq",
    table="dq_messages",
    truncate=("dq_messages", "dq_waiters"),
    offer="SELECT dq_offer(%s::text, %s::text, %s::bytea)",
    offer_many="SELECT key, outcome FROM dq_offer_many(%s::text, %s::text[], %s::bytea[])",
    poll="SELECT id, key, payload, lock_token FROM dq_poll_many(%s::text, %s::int)",
    ack="SELECT dq_ack_many(%s::uuid[])",
    wait="SELECT extract(epoch FROM dq_wait(%(queue)s::text, make_interval(secs => %(max_wait)s::float8)))::float8",
    channel="SELECT dq_channel(%(queue)s::text)",
    fill="""
        SELECT count(*)
          FROM (SELECT array_agg(%(prefix)s || lpad(g::text, 9, '0')) AS k,
                       array_agg(%(payload)s::bytea) AS p,
                       array_agg(%(t0)s::timestamptz + g * interval '1 millisecond') AS s
                  FROM generate_series(%(lo)s::int, %(hi)s::int) AS g) AS a,
               LATERAL dq_offer_many(%(queue)s::text, a.k, a.p, a.s)""",
)

BASELINE = Side(
    name="baseline",
    table="bench_baseline",
    truncate=("bench_baseline",),
    offer="INSERT INTO bench_baseline (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially)"
    " VALUES (%s, %s, %s, 'bytes', now(), now()) ON CONFLICT DO NOTHING",
    offer_many="INSERT INTO bench_baseline"
    " (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially)"
    " SELECT %s, u.k, u.p, 'bytes', now(), now() FROM unnest(%s::text[], %s::bytea[]) AS u(k, p)"
    " ON CONFLICT DO NOTHING",
    # The due-time index of ungrouped messages (dq_messages_ready_idx, copied with the table) is
    # by (queue, priority, scheduled_at) and partial: the baseline's messages all have priority 0.
    poll="""
        WITH c AS (SELECT id FROM bench_baseline
                    WHERE queue = %s AND (message_group IS NULL OR dead_from IS NOT NULL) AND priority = 0
                      AND scheduled_at <= now()
                    ORDER BY scheduled_at LIMIT %s::int FOR UPDATE SKIP LOCKED)
        UPDATE bench_baseline t
           SET scheduled_at = now() + interval '5 min', lock_token = gen_random_uuid(),
               delivery_count = t.delivery_count + 1
          FROM c WHERE t.id = c.id
        RETURNING t.id, t.key, t.payload, t.lock_token""",
    ack="DELETE FROM bench_baseline WHERE lock_token = ANY(%s::uuid[])",
    # The baseline has no wake-up protocol: its waiters sleep max_wait and poll.
    wait="SELECT %(max_wait)s::float8",
    channel="SELECT 'bench_' || md5(%(queue)s::text)",
    fill="""
        INSERT INTO bench_baseline (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially)
        SELECT %(queue)s::text, %(prefix)s || lpad(g::text, 9, '0'), %(payload)s::bytea, 'bytes',
               %(t0)s::timestamptz + g * interval '1 millisecond',
               %(t0)s::timestamptz + g * interval '1 millisecond'
          FROM generate_series(%(lo)s::int, %(hi)s::int) AS g""",
)

SIDES = (DQ, BASELINE)


def connect(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection preparing every statement on its first execution."""
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0, application_name="bench.core")


def value(conn: psycopg.Connection[Any] | psycopg.Cursor[Any], query: str | sql.Composed, params: Any = None) -> Any:
    """The first column of the one row `query` returns."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row[0]


# --------------------------------------------------------------------------- workloads

Step = Callable[[], int | None]  # one unit of work: rows done, or None when nothing was left


def _keys(client: int) -> Iterator[str]:
    return (f"c{client:02d}-{i:09d}" for i in itertools.count())


def offer_step(conn: psycopg.Connection[Any], side: Side, client: int, batch: int) -> Step:
    """Offer one message per transaction."""
    cur, keys = conn.cursor(), _keys(client)

    def step() -> int:
        cur.execute(side.offer, (QUEUE, next(keys), PAYLOAD))
        return 1

    return step


def offer_many_step(conn: psycopg.Connection[Any], side: Side, client: int, batch: int) -> Step:
    """Offer `batch` messages in one statement."""
    cur, keys, payloads = conn.cursor(), _keys(client), [PAYLOAD] * batch

    def step() -> int:
        cur.execute(side.offer_many, (QUEUE, [next(keys) for _ in range(batch)], payloads))
        return batch

    return step


def poll_ack_step(conn: psycopg.Connection[Any], side: Side, client: int, batch: int) -> Step:
    """Poll up to `batch` due messages, then acknowledge them by their lock tokens."""
    cur = conn.cursor()

    def step() -> int | None:
        cur.execute(side.poll, (QUEUE, batch))
        tokens = [row[3] for row in cur.fetchall()]
        if not tokens:
            return None
        cur.execute(side.ack, (tokens,))
        return len(tokens)

    return step


@dataclass(frozen=True)
class Workload:
    name: str
    step: Callable[[psycopg.Connection[Any], Side, int, int], Step]
    batch: int
    target: float  # minimum dq / baseline ratio
    waiters: int = 0  # extra processes waiting on the queue (LISTEN + dq_wait; see bench.lib.clients)
    waiters_consume: bool = True  # they wake up and consume; False: they stay asleep
    backlog: int = 0  # due messages pre-filled per run (poll workloads)

