"""The statements inside dq_poll_many use the intended plans (no sequential scan of the live
table), whatever the table holds: checked with auto_explain on the function's own statements."""

from __future__ import annotations

import json
import re

import psycopg
from sqlhelpers import nested_plans


def test_poll_uses_index_scans_with_many_future_messages(conn) -> None:
    conn.execute(
        "SELECT count(*) FROM dq_offer_many('q', (SELECT array_agg('k' || g) FROM generate_series(1, 20000) g), "
        "(SELECT array_agg('\\x00'::bytea) FROM generate_series(1, 20000) g), "
        "(SELECT array_agg(now() + interval '1 day') FROM generate_series(1, 20000) g))"
    )
    conn.execute("SELECT dq_offer('q', 'due', '\\x01'::bytea, now() - interval '1 second')")
    conn.execute("VACUUM ANALYZE dq_messages")
    plans = nested_plans(conn, "SELECT * FROM dq_poll_many('q', 100, interval '1 hour')")
    assert "Index Scan using dq_messages_ready_idx" in plans, plans
    assert "Index Scan using dq_messages_pkey" in plans, plans
    assert "Seq Scan on dq_messages" not in plans, plans


def test_a_session_that_first_polled_an_empty_table_uses_the_index_for_a_backlog(conn) -> None:
    """Generic plans are made once per session: the first poll, on an empty never-analyzed table,
    must not leave a plan (sequential scan and sort) that the same session then uses on a backlog
    (found by bench/latency.py)."""
    conn.execute("ANALYZE dq_messages")  # empty, as after a queue drained and autovacuum analyzed it
    conn.execute("SELECT * FROM dq_poll_many('q', 100, interval '1 hour')")  # plans on the empty table
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially) "
        "SELECT 'q', 'k' || g, 'x', 'bytes', now() - interval '1 minute', now() FROM generate_series(1, 20000) g")
    plans = nested_plans(conn, "SELECT * FROM dq_poll_many('q', 100, interval '1 hour')")
    assert "Index Scan using dq_messages_ready_idx" in plans, plans
    assert "Seq Scan on dq_messages" not in plans, plans
    assert "Sort Key: d.scheduled_at" not in plans, plans  # the index gives the order
    assert "JIT:" not in plans, plans


def test_ack_keeps_using_the_lock_token_index_after_the_table_grew(conn) -> None:
    """The same hazard for dq_ack, whose plan PL/pgSQL may cache as generic after five calls."""
    conn.execute("ANALYZE dq_messages")
    for _ in range(8):
        conn.execute("SELECT dq_ack_many(ARRAY[gen_random_uuid()])")
        conn.execute("SELECT dq_ack(gen_random_uuid())")
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, lock_token) "
        "SELECT 'q', 'k' || g, 'x', 'bytes', now() + interval '1 minute', now(), gen_random_uuid() "
        "FROM generate_series(1, 20000) g")
    plans = nested_plans(conn, "SELECT dq_ack_many(ARRAY[gen_random_uuid()]), dq_ack(gen_random_uuid())")
    assert "Seq Scan on dq_messages" not in plans, plans
    assert "JIT:" not in plans, plans


# ----------------------------------------------------------------------------- many priority levels

LEVELS = 20_000


def offer_future_levels(conn: psycopg.Connection, queue: str, grouped: bool) -> None:
    """LEVELS messages due in a day, one at each priority from LEVELS / 2 - 1 down to -LEVELS / 2;
    grouped: each heads a FIFO group of its own, so dq_groups has LEVELS levels too. Grouped rows
    are written directly, as dq_offer_many would leave them (its settle of 20,000 new groups on a
    never-analyzed table takes a minute, a matter of its own)."""
    if not grouped:
        conn.execute(
            "SELECT count(*) FROM dq_offer_many(%(q)s, ARRAY(SELECT 'f' || g FROM generate_series(1, %(n)s) g), "
            "array_fill('\\x00'::bytea, ARRAY[%(n)s]), array_fill(now() + interval '1 day', ARRAY[%(n)s]), "
            "priorities => ARRAY(SELECT g - %(n)s / 2 FROM generate_series(0, %(n)s - 1) g))",
            {"q": queue, "n": LEVELS})
        return
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, "
        "priority, message_group) "
        "SELECT %(q)s, 'f' || g, '\\x00', 'bytes', now() + interval '1 day', now() + interval '1 day', "
        "g - %(n)s / 2, 'g' || g FROM generate_series(0, %(n)s - 1) g", {"q": queue, "n": LEVELS})
    conn.execute("INSERT INTO dq_groups (queue, message_group, head_id, priority, due_at) "
                 "SELECT m.queue, m.message_group, m.id, m.priority, m.scheduled_at FROM dq_messages m "
                 "WHERE m.queue = %s", (queue,))


def poll_buffers(conn: psycopg.Connection, queue: str) -> tuple[int, list[str]]:
    """The shared buffers one dq_poll_many(queue, 1) touches, its nested statements included (the
    function scan's counters), and the keys a poll then returns. The measured poll runs twice in a
    rolled-back transaction, the second counted, so the session's plans are made and the catalog
    reads of planning are not counted."""
    for _ in range(2):
        with conn.transaction(force_rollback=True):
            row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                               "SELECT * FROM dq_poll_many(%s, 1, interval '1 hour')", (queue,)).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    keys = [r[0] for r in conn.execute("SELECT key FROM dq_poll_many(%s, 1, interval '1 hour')", (queue,))]
    return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"], keys


def test_an_empty_poll_over_many_future_levels_touches_a_bounded_number_of_buffers(conn) -> None:
    """20,000 priority levels of messages that are not due, ungrouped or each heading a FIFO group:
    an empty poll reads a bounded part of the indexes, not one probe per level (which read 7 to 9
    buffers per level: 140,000 for the ungrouped queue, 180,000 for the grouped one). The bound,
    1,500: 128 skip-scan probes of about 6 buffers, then one pass over the index entries of the
    remaining levels (about 150 to a page), measured at 780 to 820, with a margin."""
    offer_future_levels(conn, "plain", grouped=False)
    offer_future_levels(conn, "grouped", grouped=True)
    conn.execute("VACUUM ANALYZE dq_messages, dq_groups")
    polls = {queue: poll_buffers(conn, queue) for queue in ("plain", "grouped")}
    assert {queue: keys for queue, (_, keys) in polls.items()} == {"plain": [], "grouped": []}
    assert all(buffers < 1500 for buffers, _ in polls.values()), polls


def test_a_due_message_below_many_future_levels_is_found_within_the_same_bound(conn) -> None:
    """The same 20,000 future levels, and one due message at a level below all of them (ungrouped,
    or heading a group): the poll returns it, reading no more than an empty poll may."""
    offer_future_levels(conn, "plain", grouped=False)
    offer_future_levels(conn, "grouped", grouped=True)
    conn.execute("SELECT dq_offer('plain', 'due', '\\x01'::bytea, now() - interval '1 second', priority => -32768)")
    conn.execute("SELECT dq_offer('grouped', 'due', '\\x01'::bytea, now() - interval '1 second', priority => -32768, "
                 "message_group => 'g-due')")
    conn.execute("VACUUM ANALYZE dq_messages, dq_groups")
    polls = {queue: poll_buffers(conn, queue) for queue in ("plain", "grouped")}
    assert {queue: keys for queue, (_, keys) in polls.items()} == {"plain": ["due"], "grouped": ["due"]}
    assert all(buffers < 1500 for buffers, _ in polls.values()), polls


def test_one_due_message_among_many_future_ones_is_polled_without_reading_the_table(conn) -> None:
    """bench.core's latency table: one due message in a queue of 50,000 future ones (one level, no
    group). The generic plan estimated the candidates (LIMIT max_count) at a tenth of the table and
    updated them by a merge join over the whole primary key: 14 ms per poll at 100,000 future
    messages, 129 ms at 1,000,000. With merge and hash joins off the poll reads a few dozen buffers
    whatever the table holds (measured 31 to 33; the merge join read 1,200 here)."""
    conn.execute(
        "SELECT count(*) FROM dq_offer_many('q', (SELECT array_agg('k' || g) FROM generate_series(1, 50000) g), "
        "(SELECT array_agg('\\x00'::bytea) FROM generate_series(1, 50000) g), "
        "(SELECT array_agg(now() + interval '1 day') FROM generate_series(1, 50000) g))")
    conn.execute("VACUUM ANALYZE dq_messages")
    conn.execute("SELECT dq_offer('q', 'due', '\\x01'::bytea, now() - interval '1 second')")
    buffers, keys = poll_buffers(conn, "q")
    assert keys == ["due"]
    assert buffers < 200, buffers


def statement_buffers(conn: psycopg.Connection, statement: str, *params: object) -> int:
    """The shared buffers ``statement`` touches, its functions' nested statements included, the
    second of two runs in rolled-back transactions (plans made, catalogs cached)."""
    for _ in range(2):
        with conn.transaction(force_rollback=True):
            row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


def test_an_idle_wait_over_many_future_levels_touches_a_bounded_number_of_buffers(conn) -> None:
    """What an idle consumer runs after its empty poll, dq_wait (and dq_next_due, which reads the same
    next due time), over the same 20,000 future levels: a bounded part of the index, as for the poll
    (one probe per level read about 7 buffers a level), and the right answer: the future messages'
    due time, not now."""
    offer_future_levels(conn, "plain", grouped=False)
    conn.execute("SELECT dq_offer('plain', 'low', '\\x01'::bytea, now() + interval '1 minute', priority => -32768)")
    conn.execute("VACUUM ANALYZE dq_messages, dq_groups")
    buffers = {fn: statement_buffers(conn, f"SELECT {fn}") for fn in (  # noqa: S608 (a constant)
        "dq_wait('plain', interval '1 hour')", "dq_next_due('plain')")}
    assert all(b < 1500 for b in buffers.values()), buffers
    # The earliest is the low-priority message below every level, due in a minute.
    row = conn.execute("SELECT dq_next_due('plain') - now() BETWEEN interval '50 seconds' AND interval '61 seconds', "
                       "dq_wait('plain', interval '1 hour') BETWEEN interval '50 seconds' AND interval '61 seconds'"
                       ).fetchone()
    assert row == (True, True)


def test_the_due_probe_checks_the_due_time_in_both_indexes(conn) -> None:
    """Past 128 levels that gave nothing, the poll looks for the next level with a due entry: the
    due time must be an index condition of dq_messages_ready_idx and dq_groups_poll_idx (entries that
    are not due are passed without reading their rows), read in priority order, not a scan of
    dq_groups_due_at_idx and a sort over every due group (a backlog of 20,000 due groups here)."""
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, priority) "
        "SELECT 'q', 'f' || g, 'x', 'bytes', now() + interval '1 day', now(), 1000 + g FROM generate_series(1, 200) g")
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, priority, "
        "message_group) SELECT 'q', 'd' || g, 'x', 'bytes', now() - interval '1 hour', now(), g % 3, "
        "CASE WHEN g % 2 = 0 THEN 'g' || g END FROM generate_series(1, 40000) g")
    conn.execute("INSERT INTO dq_groups (queue, message_group, head_id, priority, due_at) "
                 "SELECT queue, message_group, id, priority, scheduled_at FROM dq_messages "
                 "WHERE message_group IS NOT NULL")
    conn.execute("VACUUM ANALYZE dq_messages, dq_groups")
    plans = nested_plans(conn, "SELECT * FROM dq_poll_many('q', 1, interval '1 hour')")
    for index, column in (("dq_messages_ready_idx", "scheduled_at"), ("dq_groups_poll_idx", "due_at")):
        assert re.search(rf"Index (Only )?Scan using {index} on \w+ \w+ .*\n\s+Index Cond: \(\(queue = \$\d+\) "
                         rf"AND \(priority <= \$\d+\) AND \({column} <= \$\d+\)\)", plans), (index, plans)
    assert "dq_groups_due_at_idx" not in plans, plans
    assert "Seq Scan" not in plans, plans


def test_the_token_functions_use_the_lock_token_index_with_many_in_flight_after_an_analyze_that_saw_none(
        conn) -> None:
    """10,000 messages in flight in one queue, the table last analyzed while none was: the
    statistics say no row has a lock token, and the plans made then (generic, kept for the session)
    scanned dq_messages_in_flight_idx from end to end, filtering every message in flight (about
    1 ms a statement), instead of looking the token up in the lock-token index: dq_ack, dq_ack_many,
    and dq_extend, dq_nack and dq_release twice each (their update by id took that path too).
    Since migration 0020, dq_messages_in_flight_idx also requires delivery_count > 0, which a lock
    token lookup does not imply: the acknowledgements delete by lock token in one pass."""
    conn.execute(
        "SELECT count(*) FROM dq_offer_many('q', ARRAY(SELECT 'k' || g FROM generate_series(1, 10000) g), "
        "array_fill('\\x00'::bytea, ARRAY[10000]), array_fill(now() - interval '1 minute', ARRAY[10000]))")
    conn.execute("VACUUM ANALYZE dq_messages")  # nothing in flight yet
    t = [r[0] for r in conn.execute("SELECT lock_token FROM dq_poll_many('q', 10000, interval '1 hour')")]
    assert len(t) == 10000
    plans = nested_plans(conn, f"SELECT dq_ack('{t[0]}'), dq_ack_many(ARRAY['{t[1]}', '{t[2]}']::uuid[]), "  # noqa: S608
                               f"dq_extend('{t[3]}', interval '1 hour'), dq_nack('{t[4]}', interval '1 hour'), "
                               f"dq_release(ARRAY['{t[5]}', '{t[6]}']::uuid[])")
    assert "in_flight_idx" not in plans and "Seq Scan on dq_messages" not in plans, plans
    deletes = [p for p in plans.split("duration:") if "DELETE FROM dq_messages" in p]
    # dq_ack's delete three times, dq_ack_many's plain delete three times and, once its tokens are stale
    # (the second and third runs), its second delete.
    assert len(deletes) == 8, plans
    for plan in deletes:
        assert "using dq_messages_lock_token_idx" in plan, plan
    lookups = [p for p in plans.split("duration:") if "ORDER BY l.lock_token" in p]
    assert lookups and all("Index Scan using dq_messages_lock_token_idx" in p for p in lookups), plans
    # The statements did their work the first time: 3 acknowledged, 4 given back.
    assert conn.execute("SELECT count(*), count(*) FILTER (WHERE lock_token IS NULL) FROM dq_messages"
                        ).fetchone() == (9997, 2 + 1)


def test_the_mark_of_many_parents_is_one_update_in_id_order(conn) -> None:
    """An offer after 2,000 parents marks them has_children with one UPDATE that walks the primary
    key, which visits the ids in ascending order, as the parents were locked: two offers that mark
    the same parents then do not deadlock. A bitmap scan would visit the rows in table order: the
    function turns bitmap scans off, so the order does not rest on the planner's estimates."""
    conn.execute(
        "SELECT count(*) FROM dq_offer_many('p', ARRAY(SELECT 'p' || g FROM generate_series(1, 2000) g), "
        "array_fill('\\x00'::bytea, ARRAY[2000]), array_fill(now(), ARRAY[2000]))")
    conn.execute("VACUUM ANALYZE dq_messages")
    after = conn.execute("SELECT jsonb_agg(jsonb_build_array('p', 'p' || g)) FROM generate_series(1, 2000) g"
                         ).fetchone()[0]
    plans = nested_plans(conn, f"SELECT dq_offer('c', 'child', '\\x00'::bytea, now(), can_update => false, "
                               f"after => '{json.dumps(after)}')")
    marks = [p for p in plans.split("duration:") if "SET has_children = true" in p]
    assert len(marks) == 1, plans  # the first offer; the next two find the key and change nothing
    assert "Index Scan using dq_messages_pkey" in marks[0] and "Bitmap" not in marks[0], marks[0]
    assert conn.execute("SELECT count(*) FILTER (WHERE has_children), max(parents_pending) FROM dq_messages"
                        ).fetchone() == (2000, 2000)
