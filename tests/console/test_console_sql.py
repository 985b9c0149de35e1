"""The SQL side of the web console (sql/168_console.sql), against a real server.

* dq_browse_messages pages a queue by (key, id) without losing or repeating a row, names each
  message's state as dq_list_messages and the poll see it, filters by each state, and reads a key
  prefix as a range of the (queue, key) index (never a pattern: '%' and '_' are plain characters).
* dq_message_detail cuts the payload and says its full size; another queue's id gives no row.
* Dead letters: groups, the count dq_redrive_matching would redrive (equal to what it then redrives),
  redrive of chosen ids and of a filter through dq_redrive's own path.
* Nothing lost: dq_make_due refuses a message in flight and a dead letter, a re-offer racing it keeps
  the re-offer, a redrive never touches an ordinary message nor another queue's rows, and a dead
  letter whose key is live in its queue stays where it is.
* dq_make_due on FIFO groups and priorities, and it wakes a waiting consumer.
* dq_queue_config, dq_throughput (by bucket and outcome, through the archive's index), the audit log.
* Every error: SQLSTATE and a message that starts with the function and names the parameter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from clock import TestClock
from sqlhelpers import message, nested_plans, table_rows, value_of, wait_for_lock_wait


def browse(conn: psycopg.Connection[Any], queue: str, state: str | None = None, **kw: Any) -> list[tuple[Any, ...]]:
    args = "".join(f", {k} => %({k})s" for k in kw)
    return conn.execute(f"SELECT key, state FROM dq_browse_messages(%(q)s, %(s)s{args})",  # noqa: S608
                        {"q": queue, "s": state, **kw}).fetchall()


def kill(conn: psycopg.Connection[Any], queue: str, key: str, error: str = "boom", payload: str = "x") -> None:
    """Offer (queue, key) due now, deliver it once and nack it: with max_deliveries 1 it is a dead letter."""
    conn.execute("SELECT dq_offer(%s, %s, %s::text)", (queue, key, payload))
    rows = conn.execute("SELECT key, lock_token FROM dq_poll_many(%s, 100, '1 hour')", (queue,)).fetchall()
    for k, token in rows:
        conn.execute("SELECT dq_nack(%s, '0', %s)", (token, error if k == key else None))


def dead_ids(conn: psycopg.Connection[Any], dlq: str) -> dict[tuple[str, str], int]:
    """(dead_from, key) -> id of the dead letters of dlq."""
    return {(r[1], r[0]): r[2] for r in conn.execute(
        "SELECT key, dead_from, id FROM dq_messages WHERE queue = %s AND dead_from IS NOT NULL", (dlq,))}


# --------------------------------------------------------------------------- dq_browse_messages


def every_state(conn: psycopg.Connection[Any]) -> None:
    """Queue 's' with one message in each state, and its dead-letter queue 's.dead' with one dead letter."""
    conn.execute("SELECT dq_configure_queue('s', 5, 's.dead')")
    conn.execute("SELECT dq_configure_queue('other', 1, 's.dead')")
    # 'flight' is delivered and held; 'again' is delivered three times and given back for later.
    conn.execute("SELECT dq_offer('s', 'flight', 'x'::text, now() - interval '3 minutes')")
    assert value_of(conn, "SELECT key FROM dq_poll_many('s', 1, '1 hour')") == "flight"
    conn.execute("SELECT dq_offer('s', 'again', 'x'::text, now() - interval '2 minutes')")
    for delay in ("0", "0", "1 hour"):
        (key, token) = conn.execute("SELECT key, lock_token FROM dq_poll_many('s', 1, '1 hour')").fetchone()
        assert key == "again"
        conn.execute("SELECT dq_nack(%s, %s, %s)", (token, delay, "later" if delay != "0" else "retry"))
    # The group's head is its earliest first due time; the other waits behind it (held).
    conn.execute("""SELECT dq_offer('s', 'ready', 'x'::text, now() - interval '1 minute'),
                           dq_offer('s', 'scheduled', 'x'::text, now() + interval '1 hour'),
                           dq_offer('s', 'g-head', 'x'::text, now() + interval '1 hour', message_group => 'g'),
                           dq_offer('s', 'g-held', 'x'::text, now() + interval '2 hours', message_group => 'g'),
                           dq_offer('s', 'expired', 'x'::text, now() - interval '1 minute',
                                    expires_at => now() - interval '1 second')""")
    kill(conn, "other", "d")


def test_browse_names_every_state_and_filters_by_each(conn: psycopg.Connection[Any]) -> None:
    every_state(conn)
    assert browse(conn, "s") == [("again", "scheduled"), ("expired", "expired"), ("flight", "in_flight"),
                                 ("g-head", "scheduled"), ("g-held", "held"), ("ready", "ready"),
                                 ("scheduled", "scheduled")]
    expected = {"ready": ["ready"], "scheduled": ["again", "g-head", "scheduled"], "in_flight": ["flight"],
                "held": ["g-held"], "expired": ["expired"], "dead": [], "redelivered": ["again"]}
    for state, keys in expected.items():
        assert [k for k, _ in browse(conn, "s", state)] == keys, state
    # The dead letter in its dead-letter queue: state dead, dead_from the queue it died in.
    dead = conn.execute("SELECT key, state, dead_from, delivery_count FROM dq_browse_messages('s.dead')").fetchall()
    assert dead == [("d", "dead", "other", 0)]
    assert [k for k, _ in browse(conn, "s.dead", "dead")] == ["d"]
    # The columns of one row: in flight says until when, the redelivered one its count and error.
    rows = {r[0]: r for r in conn.execute(
        "SELECT key, locked_until IS NOT NULL, delivery_count, last_error, payload_type, payload_bytes, message_group "
        "FROM dq_browse_messages('s')")}
    assert rows["flight"][1:3] == (True, 1) and rows["ready"][1] is False
    assert rows["again"][2:] == (3, "later", "text", 1, None)
    assert rows["g-held"][6] == "g"
    # The timing part agrees with dq_list_messages (one classification: dq__timing_state).
    listed = dict(conn.execute("SELECT key, state FROM dq_list_messages('s')").fetchall())
    for key, state in browse(conn, "s"):
        if state in ("ready", "scheduled", "in_flight"):
            assert listed[key] == state, key


def test_browse_pages_through_every_row_once_in_key_and_id_order(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_configure_queue('p', 1, 'p.dead')")
    for key in ("b", "a", "c"):
        kill(conn, "p", key)
    # Ordinary messages in the dead-letter queue beside dead letters of the same key: (key, id) pages them.
    conn.execute("SELECT dq_offer('p.dead', 'a', 'fresh'::text), dq_offer('p.dead', 'b', 'fresh'::text)")
    everything = conn.execute("SELECT id, key FROM dq_messages WHERE queue = 'p.dead' ORDER BY key, id").fetchall()
    assert len(everything) == 5
    for size in (1, 2, 3, 5):
        seen: list[tuple[Any, ...]] = []
        after: tuple[Any, Any] = (None, None)
        while True:
            page = conn.execute("SELECT id, key FROM dq_browse_messages('p.dead', after_key => %s, after_id => %s, "
                                "max_rows => %s)", (after[1], after[0], size)).fetchall()
            seen += page
            if len(page) < size:
                break
            after = page[-1]
        assert seen == everything, size
    # Keys compare bytewise, whatever the database's collation.
    conn.execute("SELECT dq_offer('c', k, 'x'::text) FROM unnest(ARRAY['b', 'B', 'a', '_', 'é']) k")
    assert [k for k, _ in browse(conn, "c")] == ["B", "_", "a", "b", "é"]


def test_browse_key_prefix_is_a_range_of_the_key_index_not_a_pattern(conn: psycopg.Connection[Any]) -> None:
    keys = ["a%b", "a%c", "a_b", "ab", "axb", "a", "b%"]
    conn.execute("SELECT dq_offer('k', k, 'x'::text) FROM unnest(%s::text[]) k", (keys,))
    conn.execute("SELECT dq_offer('other', 'a%z', 'x'::text)")
    assert [k for k, _ in browse(conn, "k", key_prefix="a%")] == ["a%b", "a%c"]
    assert [k for k, _ in browse(conn, "k", key_prefix="a_")] == ["a_b"]
    assert [k for k, _ in browse(conn, "k", key_prefix="a")] == ["a", "a%b", "a%c", "a_b", "ab", "axb"]
    assert [k for k, _ in browse(conn, "k", key_prefix="zz")] == []
    assert [k for k, _ in browse(conn, "k", key_prefix="a%", after_key="a%b", after_id=10**12)] == ["a%c"]
    plans = nested_plans(conn, "SELECT * FROM dq_browse_messages('k', key_prefix => 'a%')")
    assert "dq_messages_queue_key_key" in plans, plans
    assert "(key >= 'a%'::text) AND (key < 'a&'::text)" in plans, plans
    # Paging without a prefix walks the same index in order (no sort of the queue).
    plans = nested_plans(conn, "SELECT * FROM dq_browse_messages('k', after_key => 'a', after_id => 1)")
    assert "Index Scan using dq_messages_queue_key_key" in plans and "key >= 'a'::text" in plans, plans


# --------------------------------------------------------------------------- dq_message_detail


def test_message_detail_cuts_the_payload_and_names_its_size(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_offer('d', 'k', %s::bytea, now() + interval '1 hour', priority => 3, "
                 "message_group => 'g', headers => '{\"traceparent\": \"x\"}')", (b"0123456789",))
    (mid,) = conn.execute("SELECT id FROM dq_messages WHERE key = 'k'").fetchone()
    row = conn.execute("SELECT queue, key, state, payload, payload_bytes, payload_type, headers, priority, "
                       "message_group, delivery_count, locked_until, dead_from, dead_at, "
                       "scheduled_at = scheduled_at_initially FROM dq_message_detail('d', %s, 4)", (mid,)).fetchone()
    assert row == ("d", "k", "scheduled", b"0123", 10, "bytes", {"traceparent": "x"}, 3, "g", 0, None, None, None, True)
    assert value_of(conn, "SELECT payload FROM dq_message_detail('d', %s)", (mid,)) == b"0123456789"
    assert value_of(conn, "SELECT payload FROM dq_message_detail('d', %s, 0)", (mid,)) == b""
    assert conn.execute("SELECT * FROM dq_message_detail('other', %s)", (mid,)).fetchall() == []
    assert conn.execute("SELECT * FROM dq_message_detail('d', %s)", (mid + 1000,)).fetchall() == []
    # A dead letter: where and when it died.
    conn.execute("SELECT dq_configure_queue('e', 1, 'e.dead')")
    kill(conn, "e", "gone")
    (did,) = conn.execute("SELECT id FROM dq_messages WHERE queue = 'e.dead'").fetchone()
    assert conn.execute("SELECT state, dead_from, dead_at IS NOT NULL, last_error FROM dq_message_detail('e.dead', %s)",
                        (did,)).fetchone() == ("dead", "e", True, "boom")


# --------------------------------------------------------------------------- dead letters


def many_dead(conn: psycopg.Connection[Any]) -> None:
    """dlq holds: from 'a' three 'timeout' and one 'refused'; from 'b' one 'timeout'."""
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq'), dq_configure_queue('b', 1, 'dlq')")
    for key in ("k1", "k2", "k3"):
        kill(conn, "a", key, "timeout")
    kill(conn, "a", "k4", "refused")
    kill(conn, "b", "k1", "timeout")


def test_dead_letter_groups_largest_first(conn: psycopg.Connection[Any]) -> None:
    many_dead(conn)
    rows = conn.execute("SELECT dead_from, last_error, messages, oldest_dead_at <= newest_dead_at "
                        "FROM dq_dead_letter_groups('dlq')").fetchall()
    assert rows == [("a", "timeout", 3, True), ("a", "refused", 1, True), ("b", "timeout", 1, True)]
    assert len(conn.execute("SELECT * FROM dq_dead_letter_groups('dlq', 1)").fetchall()) == 1
    assert conn.execute("SELECT * FROM dq_dead_letter_groups('a')").fetchall() == []


def test_count_is_what_redrive_matching_then_redrives(dsn: str, conn: psycopg.Connection[Any]) -> None:
    many_dead(conn)
    # k2 of 'a' is live again in 'a' (it stays a dead letter); k1 of 'a' dies a second time (one of
    # the two goes back per call); a consumer of dlq holds the oldest dead letter (skipped).
    conn.execute("SELECT dq_offer('a', 'k2', 'again'::text, now() + interval '1 hour')")
    kill(conn, "a", "k1", "timeout")
    assert value_of(conn, "SELECT count(*) FROM dq_messages WHERE queue = 'dlq'") == 6
    (held,) = conn.execute("SELECT key FROM dq_poll_many('dlq', 1, '1 hour')").fetchone()
    assert held == "k1"
    filters = [(None, None), ("a", None), ("a", "timeout"), ("a", "refused"), ("b", None), ("c", None),
               (None, "timeout"), (None, "nothing")]
    counts = {}
    for f in filters:
        with psycopg.connect(dsn) as tx:  # each filter from the same state: rolled back
            counts[f] = value_of(tx, "SELECT dq_count_dead_letters('dlq', %s, %s)", f)
            assert value_of(tx, "SELECT dq_redrive_matching('dlq', %s, %s)", f) == counts[f], f
            assert value_of(tx, "SELECT dq_count_dead_letters('dlq', %s, %s)", f) == 0, f
            tx.rollback()
    # a: k1 held by the consumer (its second death goes back), k2 live in a, k3, k4; b: k1.
    assert counts == {(None, None): 4, ("a", None): 3, ("a", "timeout"): 2, ("a", "refused"): 1, ("b", None): 1,
                      ("c", None): 0, (None, "timeout"): 3, (None, "nothing"): 0}
    assert value_of(conn, "SELECT dq_redrive_matching('dlq')") == 4
    # Left: the held k1, the live k2.
    assert sorted(conn.execute("SELECT dead_from, key FROM dq_messages WHERE queue = 'dlq'")) == [
        ("a", "k1"), ("a", "k2")]


def test_redrive_matching_takes_only_the_filter_and_at_most_max_count(conn: psycopg.Connection[Any]) -> None:
    many_dead(conn)
    assert value_of(conn, "SELECT dq_redrive_matching('dlq', 'a', 'timeout', 2)") == 2
    assert value_of(conn, "SELECT dq_count_dead_letters('dlq', 'a', 'timeout')") == 1
    assert value_of(conn, "SELECT dq_redrive_matching('dlq', last_error => 'refused')") == 1
    assert sorted(conn.execute("SELECT queue, key, delivery_count, last_error FROM dq_messages "
                               "WHERE dead_from IS NULL").fetchall()) == [
        ("a", "k1", 0, "timeout"), ("a", "k2", 0, "timeout"), ("a", "k4", 0, "refused")]
    assert value_of(conn, "SELECT dq_redrive_matching('dlq', 'b')") == 1
    assert value_of(conn, "SELECT dq_redrive_matching('dlq')") == 1  # a's k3
    assert value_of(conn, "SELECT count(*) FROM dq_messages WHERE queue = 'dlq'") == 0


def test_redrive_messages_takes_exactly_the_dead_letters_named(conn: psycopg.Connection[Any]) -> None:
    many_dead(conn)
    ids = dead_ids(conn, "dlq")
    conn.execute("SELECT dq_offer('dlq', 'k1', 'ordinary'::text)")  # an ordinary message of the dlq
    conn.execute("SELECT dq_offer('a', 'live', 'x'::text, now() + interval '1 hour')")
    ordinary = [r[0] for r in conn.execute("SELECT id FROM dq_messages WHERE dead_from IS NULL ORDER BY id")]
    assert len(ordinary) == 2
    before = {r[0]: r for r in table_rows(conn)}
    assert value_of(conn, "SELECT dq_redrive_messages('dlq', %s)", ([ids[("a", "k1")], ids[("b", "k1")]],)) == 2
    assert sorted(conn.execute("SELECT queue, key FROM dq_messages WHERE dead_from IS NULL AND key = 'k1'")) == [
        ("a", "k1"), ("b", "k1"), ("dlq", "k1")]
    # Ordinary messages (of the dlq, of another queue) and unknown ids are never touched.
    assert value_of(conn, "SELECT dq_redrive_messages('dlq', %s)", (ordinary + [10**12],)) == 0
    assert value_of(conn, "SELECT dq_redrive_messages('a', %s)", ([ids[("a", "k2")]],)) == 0  # wrong queue
    after = {r[0]: r for r in table_rows(conn)}
    for i in ordinary + [ids[("a", "k2")], ids[("a", "k3")], ids[("a", "k4")]]:
        assert after[i] == before[i]
    assert value_of(conn, "SELECT dq_redrive_messages('dlq', '{}')") == 0


def test_a_dead_letter_whose_key_is_live_in_its_queue_stays(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    kill(conn, "a", "k", payload="old")
    conn.execute("SELECT dq_offer('a', 'k', 'new'::text, now() + interval '1 hour')")
    (dead,) = conn.execute("SELECT id FROM dq_messages WHERE queue = 'dlq'").fetchone()
    before = table_rows(conn)
    assert value_of(conn, "SELECT dq_count_dead_letters('dlq')") == 0
    assert value_of(conn, "SELECT dq_redrive_messages('dlq', %s)", ([dead],)) == 0
    assert value_of(conn, "SELECT dq_redrive_matching('dlq')") == 0
    assert value_of(conn, "SELECT dq_redrive('dlq')") == 0  # the same behaviour as dq_redrive
    assert table_rows(conn) == before


def test_redrive_and_make_due_never_touch_another_queue_with_the_same_key(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq-a'), dq_configure_queue('b', 1, 'dlq-b')")
    kill(conn, "a", "k")
    kill(conn, "b", "k")
    conn.execute("SELECT dq_offer('a', 'j', 'x'::text, now() + interval '1 hour'), "
                 "dq_offer('b', 'j', 'x'::text, now() + interval '1 hour')")
    b_rows = conn.execute("SELECT * FROM dq_messages WHERE queue LIKE '%b' ORDER BY id").fetchall()
    assert value_of(conn, "SELECT dq_make_due('a', 'j')") is True
    assert value_of(conn, "SELECT dq_redrive_matching('dlq-a')") == 1
    assert value_of(conn, "SELECT dq_redrive_messages('dlq-a', %s)", ([r[0] for r in b_rows],)) == 0
    assert conn.execute("SELECT * FROM dq_messages WHERE queue LIKE '%b' ORDER BY id").fetchall() == b_rows
    assert [k for k, _ in browse(conn, "a")] == ["j", "k"]


# --------------------------------------------------------------------------- dq_make_due


def test_make_due_moves_a_scheduled_message_and_refuses_the_rest(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_configure_queue('q', 1, 'q.dead')")
    conn.execute("SELECT dq_offer('q', 'later', 'x'::text, now() + interval '1 hour', priority => -5)")
    conn.execute("SELECT dq_offer('q', 'due', 'x'::text, now() - interval '1 minute')")
    first = message(conn, "q", "later")
    assert value_of(conn, "SELECT dq_make_due('q', 'later')") is True
    after = message(conn, "q", "later")
    assert after["scheduled_at"] <= value_of(conn, "SELECT clock_timestamp()")  # type: ignore[index]
    assert after["scheduled_at_initially"] == first["scheduled_at_initially"]  # type: ignore[index]
    assert after["priority"] == -5  # type: ignore[index]
    # Priorities still order the poll: 'due' (priority 0) before 'later' (-5).
    assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('q', 2, '1 hour')")] == ["due", "later"]
    # Now both are in flight: refused, unchanged.
    before = table_rows(conn)
    assert value_of(conn, "SELECT dq_make_due('q', 'later')") is False
    assert value_of(conn, "SELECT dq_make_due('q', 'due')") is False
    assert value_of(conn, "SELECT dq_make_due('q', 'none')") is False
    assert table_rows(conn) == before
    # A dead letter (in the dead-letter queue) is not made due either.
    conn.execute("SELECT dq_nack(lock_token, '0', 'x') FROM dq_messages WHERE queue = 'q' AND key = 'due'")
    assert value_of(conn, "SELECT dq_make_due('q.dead', 'due')") is False


def test_make_due_of_a_group_head_moves_its_group(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_offer('g', 'first', 'x'::text, now() + interval '1 hour', message_group => 'grp'), "
                 "dq_offer('g', 'second', 'x'::text, now() + interval '2 hours', message_group => 'grp')")
    # The message behind the head is made due: it still waits for the head.
    assert value_of(conn, "SELECT dq_make_due('g', 'second')") is True
    assert [r[0] for r in conn.execute("SELECT state FROM dq_browse_messages('g')")] == ["scheduled", "held"]
    assert conn.execute("SELECT key FROM dq_poll_many('g', 10, '1 hour')").fetchall() == []
    assert value_of(conn, "SELECT dq_make_due('g', 'first')") is True
    due_at = value_of(conn, "SELECT due_at FROM dq_groups WHERE queue = 'g' AND message_group = 'grp'")
    assert due_at <= value_of(conn, "SELECT clock_timestamp()")
    assert [r[0] for r in conn.execute("SELECT key FROM dq_poll_many('g', 10, '1 hour')")] == ["first"]
    assert [r[0] for r in conn.execute("SELECT state FROM dq_browse_messages('g')")] == ["in_flight", "held"]


def test_make_due_wakes_a_waiting_consumer(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_offer('w', 'k', 'x'::text, now() + interval '1 hour')")
    with psycopg.connect(dsn, autocommit=True) as waiter:
        channel = value_of(waiter, "SELECT dq_channel('w')")
        waiter.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        sleep = value_of(waiter, "SELECT dq_wait('w', '1 minute')")
        assert sleep > timedelta(seconds=30)
        assert value_of(conn, "SELECT dq_make_due('w', 'k')") is True
        got = list(waiter.notifies(timeout=10, stop_after=1))
        assert [n.payload for n in got] == ["w"]


def run_into(result: list[Any], dsn: str, statement: str) -> None:
    """Run ``statement`` on a new connection of its own (in a thread) and append its value to ``result``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        result.append(value_of(c, statement))


def test_a_re_offer_racing_make_due_is_kept(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_offer('r', 'k', 'v1'::text, now() + interval '1 hour')")
    # The re-offer holds the row; make_due waits, then works on the re-offer's version.
    with psycopg.connect(dsn) as offerer:
        offerer.execute("SELECT dq_offer('r', 'k', 'v2'::text, now() + interval '2 hours')")
        result: list[Any] = []
        t = threading.Thread(target=run_into, args=(result, dsn, "SELECT dq_make_due('r', 'k')"))
        t.start()
        wait_for_lock_wait(conn, "dq_make_due")
        offerer.commit()
        t.join(30)
    assert result == [True]
    row = message(conn, "r", "k")
    assert bytes(row["payload"]) == b"v2" and row["scheduled_at"] <= value_of(conn, "SELECT clock_timestamp()")  # type: ignore[index]
    # make_due holds the row; the re-offer waits, then replaces it with its own due time: nothing lost.
    with psycopg.connect(dsn) as admin:
        assert value_of(admin, "SELECT dq_make_due('r', 'k')") is False  # already due
        conn.execute("SELECT dq_offer('r', 'k', 'v3'::text, now() + interval '1 hour')")
        assert value_of(admin, "SELECT dq_make_due('r', 'k')") is True
        t = threading.Thread(target=run_into, args=(
            result, dsn, "SELECT dq_offer('r', 'k', 'v4'::text, now() + interval '3 hours')"))
        t.start()
        wait_for_lock_wait(conn, "dq_offer")
        admin.commit()
        t.join(30)
    assert result == [True, "updated"]
    row = message(conn, "r", "k")
    assert bytes(row["payload"]) == b"v4" and row["scheduled_at"] > value_of(conn, "SELECT now() + interval '2 hours'")  # type: ignore[index]


# --------------------------------------------------------------------------- config, throughput, audit


def test_queue_config_of_a_configured_and_a_new_queue(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_configure_queue('c', 3, 'c.dead', archive => true, max_in_flight => 7)")
    assert conn.execute("SELECT queue, max_deliveries, dead_letter_queue, archive, max_in_flight, paused, "
                        "updated_at IS NOT NULL FROM dq_queue_config('c')").fetchone() == (
        "c", 3, "c.dead", True, 7, False, True)
    fresh = conn.execute("SELECT * FROM dq_queue_config('never')").fetchone()
    empty = conn.execute("INSERT INTO dq_queues (queue) VALUES ('never') RETURNING *").fetchone()
    conn.execute("DELETE FROM dq_queues WHERE queue = 'never'")
    # The defaults of a never-configured queue are the table's own column defaults (updated_at aside).
    assert fresh[:3] + fresh[4:] == empty[:3] + empty[4:] and fresh[3] is None  # type: ignore[index]


def test_throughput_by_bucket_and_outcome(conn: psycopg.Connection[Any], clock: TestClock) -> None:
    conn.execute("SELECT dq_configure_queue('t', 1, 't.dead', archive => true)")
    conn.execute("SELECT dq_configure_queue('quiet')")
    conn.execute("SELECT dq_offer('t', 'a' || i, 'x'::text) FROM generate_series(1, 3) i")
    conn.execute("SELECT dq_ack(lock_token) FROM dq_poll_many('t', 2, '1 hour')")
    kill(conn, "t", "a3", "boom")
    clock.advance(timedelta(minutes=5))
    conn.execute("SELECT dq_offer('t', 'c', 'x'::text), dq_cancel('t', 'c')")
    conn.execute("SELECT dq_offer('t', 'e', 'x'::text, expires_at => now() + interval '5 minutes 1 second')")
    clock.advance(timedelta(seconds=2))
    conn.execute("SELECT dq_poll_many('t', 1, '1 hour')")  # removes the expired one
    rows = conn.execute(
        "SELECT acked, dead, expired, cancelled FROM dq_throughput('t', '1 hour', '1 minute')").fetchall()
    assert rows in ([(2, 1, 0, 0), (0, 0, 1, 1)], [(2, 1, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0)]), rows
    starts = [r[0] for r in conn.execute("SELECT bucket_start FROM dq_throughput('t', '1 hour', '1 minute')")]
    assert all(s.second == 0 and s.microsecond == 0 for s in starts) and starts == sorted(starts)
    hourly = conn.execute("SELECT sum(acked), sum(cancelled) FROM dq_throughput('t', '1 hour', '1 hour')").fetchone()
    assert hourly == (2, 1)
    assert conn.execute("SELECT count(*) FROM dq_throughput('t', '1 minute')").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM dq_throughput('quiet')").fetchone() == (0,)
    plans = nested_plans(conn, "SELECT * FROM dq_throughput('t')")
    assert "dq_archive_queue_acked_at_idx" in plans, plans


def test_audit_log_newest_first_by_keyset(conn: psycopg.Connection[Any], login: Callable[[str], str]) -> None:
    ids = [value_of(conn, "SELECT dq_audit(%s, %s, %s, %s, %s, %s)",
                    ("alice", f"action{i}", "q" if i % 2 else None, None if i % 2 else "k", f'{{"n": {i}}}', "ok"))
           for i in range(5)]
    assert ids == sorted(ids)
    with psycopg.connect(login("dq_viewer"), autocommit=True) as viewer:
        page = viewer.execute("SELECT id, actor, action, queue, target, details, outcome "
                              "FROM dq_audit_entries(max_rows => 2)").fetchall()
        assert [r[0] for r in page] == ids[:-3:-1]
        assert page[0][1:] == ("alice", "action4", None, "k", {"n": 4}, "ok")
        rest = viewer.execute("SELECT id FROM dq_audit_entries(%s)", (page[-1][0],)).fetchall()
        assert [r[0] for r in rest] == ids[-3::-1]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            viewer.execute("SELECT dq_audit('v', 'x', NULL, NULL, NULL, 'ok')")
    with psycopg.connect(login("dq_admin"), autocommit=True) as admin:
        assert value_of(admin, "SELECT dq_audit('bob', 'purge', 'q', NULL, NULL, 'error 22023: no')") > ids[-1]
        assert value_of(admin, "SELECT at <= clock_timestamp() FROM dq_audit_entries(max_rows => 1)") is True
        assert value_of(admin, "SELECT count(*) FROM dq_browse_messages('q')") == 0


# --------------------------------------------------------------------------- errors

LONG = "x" * 201
ERRORS = [
    ("SELECT * FROM dq_browse_messages(NULL)", "22004", "queue"),
    ("SELECT * FROM dq_browse_messages('')", "22023", "queue"),
    ("SELECT * FROM dq_browse_messages('q', 'stuck')", "22023", "in_state"),
    ("SELECT * FROM dq_browse_messages('q', key_prefix => repeat('x', 201))", "22001", "key_prefix"),
    ("SELECT * FROM dq_browse_messages('q', after_key => repeat('x', 201), after_id => 1)", "22001", "after_key"),
    ("SELECT * FROM dq_browse_messages('q', after_key => 'a')", "22023", "after_id"),
    ("SELECT * FROM dq_browse_messages('q', after_id => 1)", "22023", "after_key"),
    ("SELECT * FROM dq_browse_messages('q', max_rows => 0)", "22023", "max_rows"),
    ("SELECT * FROM dq_browse_messages('q', max_rows => 10001)", "22023", "max_rows"),
    ("SELECT * FROM dq_browse_messages('q', max_rows => NULL)", "22004", "max_rows"),
    ("SELECT * FROM dq_message_detail(NULL, 1)", "22004", "in_queue"),
    ("SELECT * FROM dq_message_detail('q', NULL)", "22004", "message_id"),
    ("SELECT * FROM dq_message_detail('q', 1, -1)", "22023", "max_payload_bytes"),
    ("SELECT * FROM dq_dead_letter_groups(NULL)", "22004", "dead_letter_queue"),
    ("SELECT * FROM dq_dead_letter_groups('d', 0)", "22023", "max_rows"),
    ("SELECT dq_count_dead_letters(NULL)", "22004", "dead_letter_queue"),
    ("SELECT dq_count_dead_letters('d', '')", "22023", "dead_from"),
    ("SELECT dq_count_dead_letters('d', NULL, repeat('e', 10001))", "22001", "last_error"),
    ("SELECT dq_redrive_messages(NULL, '{1}')", "22004", "dead_letter_queue"),
    ("SELECT dq_redrive_messages('d', NULL)", "22004", "ids"),
    ("SELECT dq_redrive_messages('d', '{{1},{2}}')", "22023", "ids"),
    ("SELECT dq_redrive_messages('d', array_fill(1::bigint, ARRAY[100001]))", "54000", "ids"),
    ("SELECT dq_redrive_matching(NULL)", "22004", "dead_letter_queue"),
    (f"SELECT dq_redrive_matching('d', '{'q' * 101}')", "22001", "dead_from"),
    ("SELECT dq_redrive_matching('d', NULL, repeat('e', 10001))", "22001", "last_error"),
    ("SELECT dq_redrive_matching('d', max_count => 0)", "22023", "max_count"),
    ("SELECT dq_redrive_matching('d', max_count => 100001)", "22023", "max_count"),
    ("SELECT dq_make_due(NULL, 'k')", "22004", "queue"),
    ("SELECT dq_make_due('q', NULL)", "22004", "key"),
    (f"SELECT dq_make_due('q', '{LONG}')", "22001", "key"),
    ("SELECT dq_queue_config(NULL)", "22004", "queue"),
    ("SELECT * FROM dq_throughput(NULL)", "22004", "queue"),
    ("SELECT * FROM dq_throughput('q', NULL)", "22004", "since"),
    ("SELECT * FROM dq_throughput('q', '0')", "22023", "since"),
    ("SELECT * FROM dq_throughput('q', '1 hour', NULL)", "22004", "bucket"),
    ("SELECT * FROM dq_throughput('q', '1 hour', '1 mon')", "22023", "bucket"),
    ("SELECT * FROM dq_throughput('q', '1 hour', '0.5 seconds')", "22023", "bucket"),
    ("SELECT * FROM dq_throughput('q', '1 day', '1 second')", "54000", "since"),
    ("SELECT dq_audit(NULL, 'a', NULL, NULL, NULL, 'ok')", "22004", "actor"),
    (f"SELECT dq_audit('{LONG}', 'a', NULL, NULL, NULL, 'ok')", "22001", "actor"),
    ("SELECT dq_audit('a', '', NULL, NULL, NULL, 'ok')", "22023", "action"),
    ("SELECT dq_audit('a', 'b', '', NULL, NULL, 'ok')", "22023", "queue"),
    ("SELECT dq_audit('a', 'b', NULL, repeat('t', 10001), NULL, 'ok')", "22001", "target"),
    ("SELECT dq_audit('a', 'b', NULL, NULL, '[1]', 'ok')", "22023", "details"),
    ("SELECT dq_audit('a', 'b', NULL, NULL, jsonb_build_object('x', repeat('y', 9000)), 'ok')", "54000", "details"),
    ("SELECT dq_audit('a', 'b', NULL, NULL, NULL, NULL)", "22004", "outcome"),
    ("SELECT * FROM dq_audit_entries(NULL, 0)", "22023", "max_rows"),
]


@pytest.mark.parametrize(("statement", "sqlstate", "parameter"), ERRORS, ids=[e[0][:60] for e in ERRORS])
def test_errors_name_the_function_and_the_parameter(module_conn: psycopg.Connection[Any], statement: str,
                                                    sqlstate: str, parameter: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        module_conn.execute(statement)  # type: ignore[arg-type]
    function = statement.split("dq_", 1)[1].split("(", 1)[0]
    text = info.value.diag.message_primary or ""
    assert (info.value.sqlstate, text.startswith(f"dq_{function}: ")) == (sqlstate, True), text
    assert parameter in text, text
