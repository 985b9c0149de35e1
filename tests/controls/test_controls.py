"""Delivery controls, on a real server: priority, FIFO message groups, the concurrency limit
(max_in_flight), the rate limit, pause/resume, expiry and headers.

Single-session rules run on one shared database (emptied before each test); the races run real
processes (tests/support/controlworkers.py), each with its own connection, started together on a Barrier.
Times are the queue's: tests move its clock (tests/support/clock.py) instead of waiting for the server's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from controlworkers import group_consumer, limited_or_sampler, rate_consumer
from psycopg.rows import dict_row
from sqlhelpers import run_workers

T0 = datetime(2020, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def offer(conn: psycopg.Connection[Any], key: str, when: datetime = T0, queue: str = "q", **controls: Any) -> str:
    names = "".join(f", {name} => %({name})s" for name in controls)
    row = conn.execute(
        f"SELECT dq_offer(%(queue)s, %(key)s, 'v'::bytea, %(when)s{names})",  # noqa: S608 - names are ours
        {"queue": queue, "key": key, "when": when, **{k: (json.dumps(v) if k == "headers" else v)
                                                       for k, v in controls.items()}},
    ).fetchone()
    assert row is not None
    return str(row[0])


def poll(conn: psycopg.Connection[Any], n: int = 10, queue: str = "q", lock: str = "1 minute") -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM dq_poll_many(%s, %s, %s::interval)", (queue, n, lock))
        return cur.fetchall()


def keys(rows: list[dict[str, Any]]) -> list[str]:
    return [r["key"] for r in rows]


def ack(conn: psycopg.Connection[Any], row: dict[str, Any]) -> bool:
    result = conn.execute("SELECT dq_ack(%s::uuid)", (row["lock_token"],)).fetchone()
    assert result is not None
    return bool(result[0])


def groups(conn: psycopg.Connection[Any], queue: str = "q") -> dict[str, str]:
    """{group: key of its head}."""
    return dict(conn.execute(
        "SELECT g.message_group, m.key FROM dq_groups g JOIN dq_messages m ON m.id = g.head_id "
        "WHERE g.queue = %s", (queue,)).fetchall())


# ----------------------------------------------------------------------------- priority


def test_higher_priority_first_then_earliest_due(module_conn):
    offer(module_conn, "low-early", at(1), priority=-5)
    offer(module_conn, "mid-late", at(5))
    offer(module_conn, "mid-early", at(2))
    offer(module_conn, "high-late", at(9), priority=7)
    offer(module_conn, "high-early", at(3), priority=7)
    offer(module_conn, "top", at(8), priority=32767)
    offer(module_conn, "bottom", at(0), priority=-32768)
    assert keys(poll(module_conn, 100)) == [
        "top", "high-early", "high-late", "mid-early", "mid-late", "low-early", "bottom"]


def test_priority_never_makes_a_message_due_early(module_conn):
    later = datetime.now(UTC) + timedelta(hours=1)
    offer(module_conn, "urgent-but-later", later, priority=100)
    offer(module_conn, "plain-now", T0)
    assert keys(poll(module_conn, 10)) == ["plain-now"]
    assert poll(module_conn, 10) == []


def test_priority_levels_skip_a_level_of_future_messages(module_conn):
    # A high level full of future messages must not hide a due message at a lower level.
    module_conn.execute("SELECT count(*) FROM dq_offer_many('q', "
                        "ARRAY(SELECT 'f' || i FROM generate_series(1, 500) i), "
                        "array_fill('x'::bytea, ARRAY[500]), array_fill(now() + interval '1 day', ARRAY[500]), "
                        "priorities => array_fill(10, ARRAY[500]))")
    offer(module_conn, "due-low", T0, priority=1)
    assert keys(poll(module_conn, 5)) == ["due-low"]


def test_priority_order_holds_past_many_levels_of_future_messages(module_conn, module_dsn):
    """More levels of future messages than the poll probes one at a time (128): 300 ungrouped levels
    and 300 levels of FIFO groups above every due message, 100 more levels between two due levels,
    and a due message that another session holds. The poll then finds each level with a due entry
    directly, and keeps the order: highest priority first, earliest due within a level, a group's
    head only, a held message skipped."""
    levels = ("WITH s AS (SELECT p FROM generate_series(%(lo)s::int, %(hi)s::int) p) "
              "SELECT count(*) FROM dq_offer_many('q', ARRAY(SELECT %(prefix)s || p FROM s ORDER BY p), "
              "ARRAY(SELECT 'x'::bytea FROM s), ARRAY(SELECT now() + interval '1 day' FROM s), "
              "priorities => ARRAY(SELECT p FROM s ORDER BY p), "
              "message_groups => CASE WHEN %(grouped)s THEN ARRAY(SELECT %(prefix)s || p FROM s ORDER BY p) END)")
    module_conn.execute(levels, {"prefix": "f", "lo": 1000, "hi": 1299, "grouped": False})
    module_conn.execute(levels, {"prefix": "fg", "lo": 700, "hi": 999, "grouped": True})
    module_conn.execute(levels, {"prefix": "fm", "lo": 400, "hi": 499, "grouped": False})
    offer(module_conn, "held", at(0), priority=600)
    offer(module_conn, "u-500-late", at(5), priority=500)
    offer(module_conn, "u-500-early", at(1), priority=500)
    offer(module_conn, "g-500", at(3), priority=500, message_group="gd")
    offer(module_conn, "g-500-next", at(4), priority=500, message_group="gd")
    offer(module_conn, "u-10", at(0), priority=10)
    with psycopg.connect(module_dsn) as other:  # holds the row lock of "held" until it rolls back
        other.execute("SELECT id FROM dq_messages WHERE queue = 'q' AND key = 'held' FOR UPDATE").fetchone()
        assert keys(poll(module_conn, 10)) == ["u-500-early", "g-500", "u-500-late", "u-10"]
        other.rollback()
    assert keys(poll(module_conn, 10)) == ["held"]


def test_batch_fills_across_levels_in_order(module_conn):
    for level in (3, 2, 1):
        for i in range(3):
            offer(module_conn, f"p{level}-{i}", at(i), priority=level)
    assert keys(poll(module_conn, 5)) == ["p3-0", "p3-1", "p3-2", "p2-0", "p2-1"]
    assert keys(poll(module_conn, 5)) == ["p2-2", "p1-0", "p1-1", "p1-2"]


def test_update_replaces_the_controls_and_counts_as_a_difference(module_conn):
    assert offer(module_conn, "k", T0) == "created"
    assert offer(module_conn, "k", T0) == "ignored"
    assert offer(module_conn, "k", T0, priority=1) == "updated"
    assert offer(module_conn, "k", T0, priority=1, headers={"a": 1}) == "updated"
    assert offer(module_conn, "k", T0, priority=1, headers={"a": 1}) == "ignored"
    assert offer(module_conn, "k", T0, priority=1, headers={"a": 1}, message_group="g") == "updated"
    assert offer(module_conn, "k", T0, priority=1, headers={"a": 1}, message_group="g",
                 expires_at=datetime(2100, 1, 1, tzinfo=UTC)) == "updated"
    row = module_conn.execute("SELECT priority, message_group, headers, expires_at FROM dq_get('q', 'k')").fetchone()
    assert row == (1, "g", {"a": 1}, datetime(2100, 1, 1, tzinfo=UTC))
    assert offer(module_conn, "k", T0) == "updated"  # back to no controls
    row = module_conn.execute("SELECT priority, message_group, headers, expires_at FROM dq_get('q', 'k')").fetchone()
    assert row == (0, None, None, None)
    assert groups(module_conn) == {}


def test_offer_many_with_controls(module_conn):
    rows = module_conn.execute(
        "SELECT key, outcome FROM dq_offer_many('q', ARRAY['a', 'b', 'c'], ARRAY['1', '2', '3']::bytea[], "
        "ARRAY[%s, %s, %s]::timestamptz[], priorities => ARRAY[1, 5, 3], message_groups => ARRAY[NULL, 'g', 'g'], "
        "expires_ats => ARRAY[NULL, '2100-01-01', NULL]::timestamptz[], "
        """headers => ARRAY['{"t": 1}', NULL, '{}']::jsonb[])""", (at(1), at(2), at(3))).fetchall()
    assert rows == [("a", "created"), ("b", "created"), ("c", "created")]
    delivered = poll(module_conn, 10)
    # b heads group g (priority 5) and goes first; c waits behind b in its group.
    assert [(r["key"], r["priority"], r["message_group"], r["headers"]) for r in delivered] == [
        ("b", 5, "g", None), ("a", 1, None, {"t": 1})]
    assert delivered[0]["expires_at"] == datetime(2100, 1, 1, tzinfo=UTC)
    assert ack(module_conn, delivered[0])
    assert [(r["key"], r["headers"]) for r in poll(module_conn, 10)] == [("c", {})]


# ----------------------------------------------------------------------------- FIFO groups


def test_a_group_delivers_one_message_at_a_time_in_order(module_conn):
    for i, when in enumerate([at(3), at(1), at(2)]):
        offer(module_conn, f"g-{i}", when, message_group="G")
    offer(module_conn, "free", at(5))
    first = poll(module_conn, 10)
    assert keys(first) == ["g-1", "free"]  # ungrouped messages are never held back by groups
    assert poll(module_conn, 10) == []
    assert ack(module_conn, first[0])
    second = poll(module_conn, 10)
    assert keys(second) == ["g-2"]
    assert ack(module_conn, second[0])
    assert keys(poll(module_conn, 10)) == ["g-0"]


def test_different_groups_are_delivered_in_parallel(module_conn):
    for g in "ABC":
        for i in range(3):
            offer(module_conn, f"{g}-{i}", at(i), message_group=g)
    assert sorted(keys(poll(module_conn, 10))) == ["A-0", "B-0", "C-0"]


def test_nack_with_delay_keeps_the_group_waiting(module_conn, module_clock):
    offer(module_conn, "first", at(1), message_group="G")
    offer(module_conn, "second", at(2), message_group="G")
    (row,) = poll(module_conn)
    module_conn.execute("SELECT dq_nack(%s::uuid, interval '5 minutes')", (row["lock_token"],))
    assert poll(module_conn) == []  # second must not overtake first
    assert groups(module_conn) == {"G": "first"}
    module_clock.advance(timedelta(minutes=4, seconds=50))
    assert poll(module_conn) == []
    module_clock.advance(20)
    (again,) = poll(module_conn)
    assert again["key"] == "first" and again["delivery_count"] == 2


def test_an_expired_lock_redelivers_the_head_before_the_next(module_conn, module_clock):
    offer(module_conn, "first", at(1), message_group="G")
    offer(module_conn, "second", at(2), message_group="G")
    (row,) = poll(module_conn, lock="30 seconds")
    assert poll(module_conn) == []
    module_clock.advance(31)
    (again,) = poll(module_conn)
    assert (again["key"], again["delivery_count"]) == ("first", 2)
    assert ack(module_conn, row) is False  # the first holder's token is stale
    assert ack(module_conn, again)
    assert keys(poll(module_conn)) == ["second"]


@pytest.mark.parametrize("how", ["cancel", "expire", "dead-letter"])
def test_the_next_message_follows_when_the_head_leaves(module_conn, module_clock, how):
    if how == "dead-letter":
        module_conn.execute("SELECT dq_configure_queue('q', 1, 'q.dead')")
    expires = module_clock.now() + timedelta(minutes=1) if how == "expire" else None
    offer(module_conn, "first", at(1), message_group="G", expires_at=expires)
    offer(module_conn, "second", at(2), message_group="G")
    if how == "cancel":
        assert module_conn.execute("SELECT dq_cancel('q', 'first')").fetchone() == (True,)
    elif how == "expire":
        module_clock.advance(61)
        assert poll(module_conn) == []  # the poll removes the expired head
    else:
        (row,) = poll(module_conn)
        module_conn.execute("SELECT dq_nack(%s::uuid, interval '0', 'boom')", (row["lock_token"],))  # dies at once
        (dead,) = poll(module_conn, queue="q.dead")
        assert dead["key"] == "first" and dead["message_group"] == "G"
    assert keys(poll(module_conn)) == ["second"]


def test_a_new_earlier_message_goes_before_a_head_never_delivered(module_conn):
    offer(module_conn, "later", at(10), message_group="G")
    offer(module_conn, "earlier", at(5), message_group="G")
    assert groups(module_conn) == {"G": "earlier"}
    assert keys(poll(module_conn)) == ["earlier"]


def test_a_delivered_head_keeps_its_place(module_conn):
    offer(module_conn, "first", at(10), message_group="G")
    (row,) = poll(module_conn)
    module_conn.execute("SELECT dq_nack(%s::uuid)", (row["lock_token"],))
    offer(module_conn, "earlier", at(5), message_group="G")  # offered after first was delivered
    assert groups(module_conn) == {"G": "first"}
    assert keys(poll(module_conn)) == ["first"]


def test_an_update_moves_a_message_between_groups(module_conn):
    offer(module_conn, "a", at(1), message_group="G")
    offer(module_conn, "b", at(2), message_group="G")
    offer(module_conn, "c", at(3), message_group="H")
    assert groups(module_conn) == {"G": "a", "H": "c"}
    assert offer(module_conn, "a", at(4), message_group="H") == "updated"  # leaves G (its head) for H
    assert groups(module_conn) == {"G": "b", "H": "c"}
    assert offer(module_conn, "c", at(0)) == "updated"  # leaves H, ungrouped now
    assert groups(module_conn) == {"G": "b", "H": "a"}
    assert sorted(keys(poll(module_conn))) == ["a", "b", "c"]


def test_reoffer_of_a_head_in_flight_releases_the_group(module_conn):
    offer(module_conn, "first", at(1), message_group="G")
    offer(module_conn, "second", at(2), message_group="G")
    (row,) = poll(module_conn)
    assert offer(module_conn, "first", at(3), message_group="G") == "updated"  # replaced, now after second
    assert ack(module_conn, row) is False
    assert keys(poll(module_conn)) == ["second"]


def test_purge_and_redrive_keep_groups_consistent(module_conn):
    module_conn.execute("SELECT dq_configure_queue('q', 1, 'q.dead')")
    offer(module_conn, "a", at(1), message_group="G")
    (row,) = poll(module_conn)
    module_conn.execute("SELECT dq_nack(%s::uuid, interval '0')", (row["lock_token"],))  # dead at once
    offer(module_conn, "b", at(2), message_group="G")
    assert groups(module_conn) == {"G": "b"}
    assert module_conn.execute("SELECT dq_redrive('q.dead')").fetchone() == (1,)
    assert groups(module_conn) == {"G": "b"}  # the redriven message joins the end of the group
    module_conn.execute("SELECT dq_purge('q', true)")
    assert groups(module_conn) == {}
    offer(module_conn, "c", at(3), message_group="G")
    assert keys(poll(module_conn)) == ["c"]


def test_sixteen_consumers_never_break_group_order(dsn):
    """Ledger: per group, the sequence of first deliveries is strictly increasing and no group has
    two messages in flight at once, through acks, nacks (with and without delay) and lock expiries."""
    n_groups, per_group = 12, 25
    with psycopg.connect(dsn, autocommit=True) as c:
        for start in range(per_group):
            c.execute(
                "SELECT count(*) FROM dq_offer_many('fifo', "
                "ARRAY(SELECT 'g' || g || '-' || %s FROM generate_series(1, %s) g), "
                "array_fill('x'::bytea, ARRAY[%s]), array_fill(%s::timestamptz, ARRAY[%s]), "
                "message_groups => ARRAY(SELECT 'g' || g FROM generate_series(1, %s) g))",
                (start, n_groups, n_groups, at(start), n_groups, n_groups))
    results = run_workers(group_consumer, [(dsn, "fifo", 12.0, seed) for seed in range(16)], timeout=120)
    with psycopg.connect(dsn, autocommit=True) as c:
        left = c.execute("SELECT count(*) FROM dq_messages WHERE queue = 'fifo'").fetchone()
        history = c.execute("SELECT count(*) FROM dq_groups WHERE queue = 'fifo'").fetchone()
    # Merge the consumers' observations: per group, the order of acknowledgements must follow the
    # sequence numbers, and every message acknowledged once.
    acked: dict[str, list[int]] = defaultdict(list)
    for seen in results:
        for group, seq, outcome in seen:
            if outcome == "acked":
                acked[group].append(seq)
    for group, seqs in acked.items():
        assert sorted(seqs) == list(range(len(seqs))), (group, sorted(seqs))  # a prefix, each once
    assert left is not None and history is not None
    total_acked = sum(len(s) for s in acked.values())
    assert total_acked + left[0] == n_groups * per_group
    assert total_acked > n_groups * 5, "the consumers made too little progress to prove anything"


# ----------------------------------------------------------------------------- max_in_flight


def test_max_in_flight_limits_a_poll_to_the_free_slots(module_conn):
    module_conn.execute("SELECT dq_configure_queue('q', max_in_flight => 3)")
    for i in range(10):
        offer(module_conn, f"k{i}", at(i))
    first = poll(module_conn, 2)
    assert len(first) == 2
    assert len(poll(module_conn, 10)) == 1
    assert poll(module_conn, 10) == []
    assert ack(module_conn, first[0])
    assert len(poll(module_conn, 10)) == 1
    row = module_conn.execute("SELECT max_in_flight FROM dq_configure_queue('q', max_in_flight => 0)").fetchone()
    assert row == (None,)  # 0 removes the limit
    assert len(poll(module_conn, 10)) == 6


def test_sixteen_pollers_never_exceed_max_in_flight(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT dq_configure_queue('lim', max_in_flight => 7)")
        c.execute("SELECT count(*) FROM dq_offer_many('lim', ARRAY(SELECT 'k' || i FROM generate_series(1, 20000) i), "
                  "array_fill('x'::bytea, ARRAY[20000]), array_fill(%s::timestamptz, ARRAY[20000]))", (T0,))
    args: list[tuple[Any, ...]] = [(dsn, "lim", 6.0, seed) for seed in range(16)]
    results = run_workers(limited_or_sampler, [("sample", *a[:3]) for a in args[:2]]
                          + [("consume", *a) for a in args], timeout=120)
    samples = [s for r in results[:2] for s in r]
    acked = sum(results[2:])
    assert len(samples) > 100, "too few samples"
    assert max(samples) <= 7, max(samples)
    assert max(samples) == 7, "the limit was never reached: the test proves nothing"
    assert acked > 100


# ----------------------------------------------------------------------------- rate limit


def test_rate_limit_counts_deliveries_in_a_sliding_window(module_conn):
    module_conn.execute("SELECT dq_configure_queue('q', rate_limit => 3, rate_period => '1 hour')")
    for i in range(10):
        offer(module_conn, f"k{i}", at(i))
    first = poll(module_conn, 2)
    assert len(first) == 2
    for row in first:
        module_conn.execute("SELECT dq_nack(%s::uuid)", (row["lock_token"],))
    assert keys(poll(module_conn, 10)) == ["k2"]  # redeliveries count too: one token left (k0, k1 due now)
    assert poll(module_conn, 10) == []
    # Raising the limit adds free tokens; lowering keeps the most recent deliveries.
    module_conn.execute("SELECT dq_configure_queue('q', rate_limit => 5)")
    assert len(poll(module_conn, 10)) == 2
    module_conn.execute("SELECT dq_configure_queue('q', rate_limit => 2)")
    assert module_conn.execute("SELECT count(*) FROM dq_rate_tokens WHERE queue = 'q'").fetchone() == (2,)
    assert poll(module_conn, 10) == []
    module_conn.execute("SELECT dq_configure_queue('q', rate_limit => 0)")
    assert module_conn.execute(
        "SELECT rate_limit, rate_period FROM dq_queues WHERE queue = 'q'").fetchone() == (None, None)
    assert len(poll(module_conn, 10)) == 7  # k5..k9 and the nacked k0, k1


def test_rate_limit_holds_in_every_window_with_eight_pollers(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT dq_configure_queue('rated', rate_limit => 50, rate_period => '200 milliseconds')")
        c.execute("SELECT count(*) FROM dq_offer_many('rated', ARRAY(SELECT 'k' || i FROM generate_series(1, 5000) i), "
                  "array_fill('x'::bytea, ARRAY[5000]), array_fill(%s::timestamptz, ARRAY[5000]))", (T0,))
    claimed = sorted(t for r in run_workers(rate_consumer, [(dsn, "rated", 3.0)] * 8, timeout=120) for t in r)
    assert len(claimed) > 100  # enough windows for the check to mean something (no speed floor)
    worst, j = 0, 0
    # The most claims in any half-open window [t, t + 0.2 s), in exact microseconds: a token used
    # at s may be used again at exactly s + 0.2 s, and happens to be (seen in about one run of six).
    for i, t in enumerate(claimed):
        while claimed[j] <= t - 200_000:
            j += 1
        worst = max(worst, i - j + 1)
    assert worst <= 50, worst
    span = claimed[-1] - claimed[0]
    assert len(claimed) <= 50 * (span / 200_000 + 1)


# ----------------------------------------------------------------------------- pause / resume


def test_pause_stops_deliveries_but_not_offers_acks_or_nacks(module_conn):
    offer(module_conn, "a", at(1))
    offer(module_conn, "b", at(2))
    (row,) = poll(module_conn, 1)
    assert module_conn.execute("SELECT dq_pause_queue('q')").fetchone() == (True,)
    assert module_conn.execute("SELECT dq_pause_queue('q')").fetchone() == (False,)
    assert poll(module_conn, 10) == []
    assert offer(module_conn, "c", at(3)) == "created"
    extended = module_conn.execute(
        "SELECT dq_extend(%s::uuid, '1 minute') IS NOT NULL", (row["lock_token"],)).fetchone()
    assert extended == (True,)
    assert module_conn.execute("SELECT dq_nack(%s::uuid)", (row["lock_token"],)).fetchone() == (True,)
    assert module_conn.execute("SELECT paused FROM dq_stats WHERE queue = 'q'").fetchone() == (True,)
    assert module_conn.execute("SELECT dq_poll_or_wait('q', 10, '1 minute', '2 seconds')").fetchone() is not None
    wake = module_conn.execute("SELECT wake_in FROM dq_poll_or_wait('q', 10, '1 minute', '2 seconds')").fetchone()
    assert wake == (timedelta(seconds=2),)  # sleeps its whole max_wait: nothing can be delivered
    assert module_conn.execute("SELECT dq_resume_queue('q')").fetchone() == (True,)
    assert module_conn.execute("SELECT dq_resume_queue('q')").fetchone() == (False,)
    assert keys(poll(module_conn, 10)) == ["b", "c", "a"]  # a was nacked: due now, after the others


def test_resume_wakes_a_waiting_consumer_and_offers_do_not(dsn):
    with psycopg.connect(dsn, autocommit=True) as admin, psycopg.connect(dsn, autocommit=True) as waiter:
        admin.execute("SELECT dq_pause_queue('p')")
        channel = waiter.execute("SELECT dq_channel('p')").fetchone()[0]
        waiter.execute(f'LISTEN "{channel}"')
        (wake_in,) = waiter.execute("SELECT wake_in FROM dq_poll_or_wait('p', 1, '1 minute', '30 seconds')").fetchone()
        assert wake_in == timedelta(seconds=30)
        admin.execute("SELECT dq_offer('p', 'k', 'v')")  # paused: must not wake the waiter
        assert not _notified(waiter, 0.5)
        admin.execute("SELECT dq_resume_queue('p')")
        assert _notified(waiter, 5.0)
        assert waiter.execute("SELECT key FROM dq_poll_or_wait('p', 1, '1 minute', '30 seconds')").fetchone() == ("k",)


def _notified(conn: psycopg.Connection[Any], timeout: float) -> bool:
    """Whether a notification arrives on conn within timeout seconds (select on its socket)."""
    gen = conn.notifies(timeout=timeout, stop_after=1)
    return any(True for _ in gen)


def test_waiters_sleep_until_something_can_be_delivered(dsn):
    """dq_poll_or_wait's wake_in under each control: no busy polling when due messages are held back."""
    with psycopg.connect(dsn, autocommit=True) as c:
        def wake(queue: str, max_wait: str = "20 seconds") -> timedelta:
            row = c.execute("SELECT id, wake_in FROM dq_poll_or_wait(%s, 10, '1 minute', %s::interval)",
                            (queue, max_wait)).fetchone()
            assert row is not None and row[0] is None, row
            return row[1]
        # Full: the next lock expiry (1 minute) is beyond max_wait.
        c.execute("SELECT dq_configure_queue('full', max_in_flight => 1)")
        c.execute("SELECT dq_offer('full', k, 'v', %s) FROM (VALUES ('a'), ('b')) v(k)", (T0,))
        assert c.execute("SELECT count(*) FROM dq_poll_many('full', 5, '1 minute')").fetchone() == (1,)
        assert wake("full") == timedelta(seconds=20)
        # Rate: the next token is about 10 minutes away (minutes: a stalled host cannot change it).
        c.execute("SELECT dq_configure_queue('rated', rate_limit => 1, rate_period => '10 minutes')")
        c.execute("SELECT dq_offer('rated', k, 'v', %s) FROM (VALUES ('a'), ('b')) v(k)", (T0,))
        assert c.execute("SELECT count(*) FROM dq_poll_many('rated', 5, '1 minute')").fetchone() == (1,)
        assert timedelta(minutes=9) < wake("rated", "1 hour") <= timedelta(minutes=10)
        # Groups all held: the head's lock expiry (1 minute) is beyond max_wait.
        c.execute("SELECT dq_offer('held', k, 'v', %s, message_group => 'G') FROM (VALUES ('a'), ('b')) v(k)", (T0,))
        assert c.execute("SELECT count(*) FROM dq_poll_many('held', 5, '1 minute')").fetchone() == (1,)
        assert wake("held") == timedelta(seconds=20)
        # The ack of a full queue's delivery wakes its blocked waiter.
        channel = c.execute("SELECT dq_channel('full')").fetchone()[0]
        c.execute(f'LISTEN "{channel}"')
        wake("full")
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SELECT dq_ack(lock_token) FROM dq_messages WHERE queue = 'full' AND lock_token IS NOT NULL")
        assert _notified(c, 5.0)


# ----------------------------------------------------------------------------- expiry and headers


@pytest.mark.parametrize("archive", [False, True])
def test_expired_messages_are_never_delivered(module_conn, module_clock, archive):
    module_conn.execute("SELECT dq_configure_queue('q', archive => %s)", (archive,))
    soon = module_clock.now() + timedelta(minutes=1)
    offer(module_conn, "expires", at(1), expires_at=soon)
    offer(module_conn, "in-flight-expires", at(0), expires_at=soon)
    offer(module_conn, "stays", at(2), expires_at=datetime(2100, 1, 1, tzinfo=UTC))
    (row,) = poll(module_conn, 1, lock="30 seconds")
    assert row["key"] == "in-flight-expires"
    assert module_conn.execute("SELECT expired FROM dq_queue_stats('q')").fetchone() == (0,)
    module_clock.advance(61)
    assert module_conn.execute("SELECT expired FROM dq_queue_stats('q')").fetchone() == (2,)
    assert keys(poll(module_conn, 10)) == ["stays"]  # neither delivered nor redelivered
    assert module_conn.execute(
        "SELECT count(*) FROM dq_messages WHERE queue = 'q' AND key <> 'stays'").fetchone() == (0,)
    assert module_conn.execute("SELECT expired FROM dq_queue_stats('q')").fetchone() == (0,)
    archived = module_conn.execute(
        "SELECT key, outcome, expires_at FROM dq_archive WHERE queue = 'q' ORDER BY key").fetchall()
    if archive:
        assert [(k, o) for k, o, _ in archived] == [("expires", "expired"), ("in-flight-expires", "expired")]
        assert all(e == soon for _, _, e in archived)
    else:
        assert archived == []
    assert ack(module_conn, row) is False


def test_headers_are_returned_on_every_delivery(module_conn, module_clock):
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "n": [1, 2]}
    offer(module_conn, "k", at(1), headers=headers)
    (row,) = poll(module_conn, lock="30 seconds")
    assert row["headers"] == headers
    module_clock.advance(31)
    (again,) = poll(module_conn)
    assert again["headers"] == headers and again["delivery_count"] == 2
    assert module_conn.execute("SELECT headers FROM dq_get('q', 'k')").fetchone() == (headers,)
    # In flight: nothing to deliver, dq_poll_or_wait returns its wait row.
    waited = module_conn.execute("SELECT id, headers FROM dq_poll_or_wait('q', 1, '1 minute', '1 second')").fetchone()
    assert waited == (None, None)
