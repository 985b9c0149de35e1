"""Worker bodies for tests/controls/test_controls.py (module level, so that ``spawn`` children import them).

Each opens its own connection, waits on the Barrier, then races the others; what it saw is
returned to the test, which asserts on the whole.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg


@contextmanager
def racing(barrier: Any, dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection, opened before the Barrier, yielded once every process is ready."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        barrier.wait(30)
        yield conn


def during(seconds: float) -> Iterator[None]:
    """One step per iteration until ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield


def group_consumer(barrier: Any, dsn: str, queue: str, seconds: float, seed: int) -> list[tuple[str, int, str]]:
    """Poll small batches for ``seconds``; acknowledge most deliveries, nack some (no delay or a short
    one) and abandon a few (their lock expires). Returns every (group, sequence, outcome) delivered,
    in the order this consumer claimed them, with the server's claim time order kept by the test."""
    rnd = random.Random(seed)  # noqa: S311 - test randomness, not security
    seen: list[tuple[str, int, str]] = []
    with racing(barrier, dsn) as conn:
        for _ in during(seconds):
            rows = conn.execute(
                "SELECT message_group, key, lock_token, claimed_at "
                "FROM dq_poll_many(%s, %s, interval '300 milliseconds')",
                (queue, rnd.randint(1, 4)),
            ).fetchall()
            if not rows:
                time.sleep(0.005)
                continue
            for group, key, token, _claimed in rows:
                seq = int(key.rsplit("-", 1)[1])
                roll = rnd.random()
                if roll < 0.75:
                    ok = conn.execute("SELECT dq_ack(%s::uuid)", (token,)).fetchone()
                    seen.append((group, seq, "acked" if ok and ok[0] else "stale"))
                elif roll < 0.9:
                    delay = rnd.choice(["0 seconds", "20 milliseconds"])
                    conn.execute("SELECT dq_nack(%s::uuid, %s::interval)", (token, delay))
                    seen.append((group, seq, "nacked"))
                else:
                    seen.append((group, seq, "abandoned"))  # its lock expires
    return seen


def limited_consumer(barrier: Any, dsn: str, queue: str, seconds: float, seed: int) -> int:
    """Poll greedily for ``seconds`` and acknowledge after a short random hold; return how many
    messages this consumer acknowledged."""
    rnd = random.Random(seed)  # noqa: S311 - test randomness, not security
    acked = 0
    with racing(barrier, dsn) as conn:
        for _ in during(seconds):
            rows = conn.execute(
                "SELECT lock_token FROM dq_poll_many(%s, %s, interval '1 minute')", (queue, rnd.randint(1, 5))
            ).fetchall()
            if not rows:
                time.sleep(0.002)
                continue
            time.sleep(rnd.uniform(0, 0.01))
            row = conn.execute("SELECT dq_ack_many(%s::uuid[])", ([r[0] for r in rows],)).fetchone()
            assert row is not None
            acked += int(row[0])
    return acked


def in_flight_sampler(barrier: Any, dsn: str, queue: str, seconds: float) -> list[int]:
    """Count the queue's messages in flight (lock not expired) continuously for ``seconds``."""
    samples: list[int] = []
    with racing(barrier, dsn) as conn:
        for _ in during(seconds):
            row = conn.execute(
                "SELECT count(*) FROM dq_messages WHERE queue = %s AND lock_token IS NOT NULL "
                "AND scheduled_at > clock_timestamp()",
                (queue,),
            ).fetchone()
            assert row is not None
            samples.append(int(row[0]))
    return samples


def rate_consumer(barrier: Any, dsn: str, queue: str, seconds: float) -> list[int]:
    """Poll greedily for ``seconds`` and acknowledge at once; return the claim time (epoch
    microseconds, the server's, exact: a float of epoch seconds rounds a gap of exactly one
    rate_period either way) of every delivery."""
    claimed: list[int] = []
    with racing(barrier, dsn) as conn:
        for _ in during(seconds):
            rows = conn.execute(
                "SELECT lock_token, (extract(epoch FROM claimed_at) * 1000000)::bigint "
                "FROM dq_poll_many(%s, 10, interval '1 minute')",
                (queue,),
            ).fetchall()
            if not rows:
                time.sleep(0.002)
                continue
            conn.execute("SELECT dq_ack_many(%s::uuid[])", ([r[0] for r in rows],))
            claimed.extend(int(r[1]) for r in rows)
    return claimed


def limited_or_sampler(barrier: Any, kind: str, *args: Any) -> Any:
    """in_flight_sampler (kind "sample") or limited_consumer, so one run_workers starts both."""
    return in_flight_sampler(barrier, *args) if kind == "sample" else limited_consumer(barrier, *args)


def transactional_group_consumer(barrier: Any, dsn: str, queue: str, seconds: float, seed: int) -> int:
    """For ``seconds``: poll a small batch inside a transaction (as ``q.transaction()`` does), hold it
    a moment, then mostly record each message in the table ``ledger`` and acknowledge it in that same
    transaction and commit; sometimes roll back instead (the delivery is undone) or nack and commit.
    The ledger's serial order is the order in which each group's messages were handled for good.
    Returns how many transactions committed an acknowledgement."""
    rnd = random.Random(seed)  # noqa: S311 - test randomness, not security
    committed = 0
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")
        conn.commit()
        barrier.wait(30)
        for _ in during(seconds):
            rows = conn.execute(
                "SELECT message_group, key, lock_token FROM dq_poll_many(%s, %s, interval '30 seconds')",
                (queue, rnd.randint(1, 3)),
            ).fetchall()
            if not rows:
                conn.commit()
                time.sleep(0.002)
                continue
            time.sleep(rnd.uniform(0, 0.01))
            roll = rnd.random()
            if roll < 0.1:
                conn.rollback()
                continue
            if roll < 0.15:
                for _group, _key, token in rows:
                    conn.execute("SELECT dq_nack(%s::uuid)", (token,))
                conn.commit()
                continue
            for group, key, token in rows:
                conn.execute("INSERT INTO ledger (message_group, seq) VALUES (%s, %s)",
                             (group, int(key.rsplit("-", 1)[1])))
                acked = conn.execute("SELECT dq_ack(%s::uuid)", (token,)).fetchone()
                assert acked == (True,), (key, acked)
            conn.commit()
            committed += 1
    return committed


def group_producer(barrier: Any, dsn: str, queue: str, groups: list[str], count: int, seed: int) -> int:
    """Offer ``count`` messages to each of ``groups`` (its own: no other producer offers to them), in
    sequence order and due at once (scheduled_at increasing with the sequence number), some in
    autocommit, some two to a transaction (an outbox). Returns how many offers were made."""
    rnd = random.Random(seed)  # noqa: S311 - test randomness, not security
    made = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        barrier.wait(30)
        seq = 0
        while seq < count:
            batch = 2 if rnd.random() < 0.3 and seq + 1 < count else 1
            with conn.transaction():
                for s in range(seq, seq + batch):
                    for group in groups:
                        row = conn.execute(
                            "SELECT dq_offer(%s, %s, 'x'::bytea, "
                            "timestamptz '2020-01-01 00:00:00+00' + %s * interval '1 second', message_group => %s)",
                            (queue, f"{group}-{s}", s, group)).fetchone()
                        assert row == ("created",), row
                        made += 1
            seq += batch
            time.sleep(rnd.uniform(0, 0.004))
    return made


def group_race(barrier: Any, kind: str, *args: Any) -> Any:
    """transactional_group_consumer (kind "consume") or group_producer, so one run_workers starts both."""
    return transactional_group_consumer(barrier, *args) if kind == "consume" else group_producer(barrier, *args)
