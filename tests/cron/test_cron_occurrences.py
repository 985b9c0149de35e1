"""Hardening (issue 12), part B: dead letters that never replace each other (item 2), a fresh
delivery count and no cycles in dead-letter queues (3), schedules that touch only their own
occurrences (4), refill the window (5) and cap it (6), dq_admin reading dq_cron_schedules (7),
waiters of dead sessions (8), one lock order in an ICU database, and a schedule that fails to
evaluate. The rules are in docs/api.md, docs/cron.md and docs/operations.md; each test fails on the
code before migration 0009.

Real server, no mocks: races use separate connections, sessions die by pg_terminate_backend."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from cronhelpers import install
from psycopg import sql
from sqlhelpers import wait_until_server_time

from pyqueue import testing
from pyqueue.migrate import migrate

# --------------------------------------------------------------------------- helpers


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row


def poll_tokens(conn: psycopg.Connection[Any], queue: str, n: int = 1, lock: str = "1 hour") -> list[uuid.UUID]:
    return [r[0] for r in conn.execute("SELECT lock_token FROM dq_poll_many(%s, %s, %s::interval)", (queue, n, lock))]


def offer_and_kill(conn: psycopg.Connection[Any], queue: str, key: str, payload: str, error: str) -> None:
    """Offer (queue, key) due now and nack it once: with max_deliveries 1 it is dead at once."""
    conn.execute("SELECT dq_offer(%s, %s, %s::text::bytea)", (queue, key, payload))
    (token,) = poll_tokens(conn, queue)
    assert one(conn, "SELECT dq_nack(%s, '0', %s)", (token, error)) == (True,)


def dead_letters(conn: psycopg.Connection[Any], queue: str, key: str) -> list[tuple[Any, ...]]:
    """(dead_from, payload, last_error) of every row with this key in queue, oldest death first."""
    return [
        (r[0], bytes(r[1]), r[2])
        for r in conn.execute(
            "SELECT dead_from, payload, last_error FROM dq_messages WHERE queue = %s AND key = %s "
            "ORDER BY dead_at, id", (queue, key))
    ]


# --------------------------------------------------------------------------- item 2: dead letters


def test_dead_letters_from_two_queues_with_one_key_are_both_kept(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    conn.execute("SELECT dq_configure_queue('b', 1, 'dlq')")
    offer_and_kill(conn, "a", "order-8", "from a", "a failed")
    offer_and_kill(conn, "b", "order-8", "from b", "b failed")
    assert dead_letters(conn, "dlq", "order-8") == [
        ("a", b"from a", "a failed"), ("b", b"from b", "b failed")]
    assert one(conn, "SELECT count(*) FROM dq_messages WHERE queue IN ('a', 'b')") == (0,)


def test_a_consumer_holding_a_dead_letter_can_ack_it_after_another_one_with_its_key_died(dsn, conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    conn.execute("SELECT dq_configure_queue('b', 1, 'dlq')")
    offer_and_kill(conn, "a", "order-8", "from a", "a failed")
    with psycopg.connect(dsn, autocommit=True) as consumer:
        rows = consumer.execute("SELECT key, payload, lock_token FROM dq_poll_many('dlq', 10, '1 hour')").fetchall()
        assert [(k, bytes(p)) for k, p, _ in rows] == [("order-8", b"from a")]
        token = rows[0][2]
        offer_and_kill(conn, "b", "order-8", "from b", "b failed")  # while the consumer handles A's
        assert one(consumer, "SELECT dq_ack(%s::uuid)", (token,)) == (True,), "A's dead letter was replaced"
    assert dead_letters(conn, "dlq", "order-8") == [("b", b"from b", "b failed")]


def test_redrive_sends_each_dead_letter_back_to_its_own_source(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    conn.execute("SELECT dq_configure_queue('b', 1, 'dlq')")
    offer_and_kill(conn, "a", "order-8", "from a", "a failed")
    offer_and_kill(conn, "b", "order-8", "from b", "b failed")
    assert one(conn, "SELECT dq_redrive('dlq')") == (2,)
    got = conn.execute(
        "SELECT queue, key, payload, delivery_count, dead_from FROM dq_messages ORDER BY queue").fetchall()
    assert [(q, k, bytes(p), n, d) for q, k, p, n, d in got] == [
        ("a", "order-8", b"from a", 0, None), ("b", "order-8", b"from b", 0, None)]


def test_dying_twice_from_the_same_queue_with_the_same_key_keeps_both(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 1, 'dlq')")
    offer_and_kill(conn, "a", "order-8", "first", "failed first")
    offer_and_kill(conn, "a", "order-8", "second", "failed second")
    assert dead_letters(conn, "dlq", "order-8") == [
        ("a", b"first", "failed first"), ("a", b"second", "failed second")]


# --------------------------------------------------------------------------- item 3: delivery count, cycles


def test_a_dead_letter_starts_with_delivery_count_0_and_keeps_its_old_count(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 3, 'dlq')")
    conn.execute("SELECT dq_offer('a', 'k', 'x')")
    for i in range(3):
        (token,) = poll_tokens(conn, "a")
        conn.execute("SELECT dq_nack(%s, '0', %s)", (token, f"failure {i + 1}"))
    assert one(conn, "SELECT count(*) FROM dq_messages WHERE queue = 'a'") == (0,)
    assert one(conn, "SELECT delivery_count FROM dq_messages WHERE queue = 'dlq' AND key = 'k'") == (0,)
    assert one(conn, "SELECT dead_delivery_count, dead_from, last_error FROM dq_messages "
                     "WHERE queue = 'dlq' AND key = 'k'") == (3, "a", "failure 3")


def test_a_dead_letter_queue_with_max_deliveries_2_delivers_twice_before_moving_it_on(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 3, 'dlq')")
    conn.execute("SELECT dq_configure_queue('dlq', 2, 'dlq2')")
    conn.execute("SELECT dq_offer('a', 'k', 'x')")
    for _ in range(3):  # dies in a after 3 deliveries, more than the dead-letter queue's limit
        (token,) = poll_tokens(conn, "a")
        conn.execute("SELECT dq_nack(%s, '0', 'failed in a')", (token,))
    for expected in (1, 2):
        got = conn.execute("SELECT lock_token, delivery_count FROM dq_poll_many('dlq', 10, '1 hour')").fetchall()
        assert [n for _, n in got] == [expected], "the dead letter was not delivered in its dead-letter queue"
        conn.execute("SELECT dq_nack(%s, '0', 'failed in dlq')", (got[0][0],))
    assert conn.execute("SELECT * FROM dq_poll_many('dlq', 10)").fetchall() == []
    assert one(conn, "SELECT dead_from, delivery_count, dead_delivery_count, last_error FROM dq_messages "
                     "WHERE queue = 'dlq2' AND key = 'k'") == ("dlq", 0, 2, "failed in dlq")


def test_configuring_a_dead_letter_cycle_is_rejected_naming_it(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 2, 'b')")
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT dq_configure_queue('b', 2, 'a')")
    assert info.value.sqlstate == "22023"
    assert "a -> b -> a" in str(info.value) or "b -> a -> b" in str(info.value), str(info.value)
    # nothing written: b has no configuration, a's is unchanged
    assert conn.execute("SELECT queue, max_deliveries, dead_letter_queue FROM dq_queues ORDER BY queue").fetchall() == [
        ("a", 2, "b")]


def test_a_longer_dead_letter_cycle_is_rejected_too(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 2, 'b')")
    conn.execute("SELECT dq_configure_queue('b', 2, 'c')")
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT dq_configure_queue('c', 2, 'a')")
    assert info.value.sqlstate == "22023"
    text = str(info.value)
    assert " -> " in text and all(f"{q} -> " in text for q in ("a", "b", "c")), text
    assert one(conn, "SELECT count(*) FROM dq_queues WHERE queue = 'c'") == (0,)
    conn.execute("SELECT dq_configure_queue('c', 2, 'd')")  # a chain that ends is fine


def test_two_concurrent_configurations_that_together_form_a_cycle_one_fails(dsn, conn) -> None:
    """conn1 configures a -> b in an open transaction; conn2 configures b -> a in its own
    transaction (it may block) before conn1 commits; once conn1 commits, conn2 must fail with
    22023: the two must not both commit and leave a -> b -> a."""
    first = psycopg.connect(dsn)  # explicit transactions (autocommit off)
    second = psycopg.connect(dsn)
    second_pid = second.info.backend_pid
    outcome: dict[str, Any] = {}

    def configure_b_to_a() -> None:
        try:
            second.execute("SELECT dq_configure_queue('b', 2, 'a')")
            outcome["result"] = "accepted"
        except psycopg.Error as exc:
            outcome["result"] = exc

    try:
        first.execute("SELECT dq_configure_queue('a', 2, 'b')")  # not committed yet
        thread = threading.Thread(target=configure_b_to_a, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while thread.is_alive():  # until the second statement has finished or waits on a lock
            waiting = one(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                          (second_pid,))
            if waiting == (1,):
                break
            assert time.monotonic() < deadline, "the second configuration neither finished nor waited on a lock"
            time.sleep(0.02)
        first.commit()
        thread.join(30)
        assert not thread.is_alive(), "the second configuration still hangs after the first committed"
        result = outcome["result"]
        if result == "accepted":
            second.commit()
        else:
            second.rollback()
        configured = conn.execute(
            "SELECT queue, dead_letter_queue FROM dq_queues ORDER BY queue").fetchall()
        assert isinstance(result, psycopg.Error), f"both configurations committed: {configured}"
        assert result.sqlstate == "22023", str(result)
        assert "a -> b -> a" in str(result) or "b -> a -> b" in str(result), str(result)
        assert configured == [("a", "b")]
    finally:
        first.close()
        second.close()


# --------------------------------------------------------------------------- item 4: ownership of occurrences

USER_KEYS = ["reports/q3/20251001", "reports/eu/42", "reports/abcdef0123456789/1700000000000"]


def offer_user_messages(conn: psycopg.Connection[Any], queue: str = "jobs") -> None:
    for key in USER_KEYS:
        conn.execute("SELECT dq_offer(%s, %s, 'user data'::text::bytea, now() + interval '1 day')", (queue, key))


def user_messages(conn: psycopg.Connection[Any], queue: str = "jobs") -> list[tuple[str, bytes]]:
    return [(k, bytes(p)) for k, p in conn.execute(
        "SELECT key, payload FROM dq_messages WHERE queue = %s AND key = ANY (%s) ORDER BY key", (queue, USER_KEYS))]


def occurrences_of(conn: psycopg.Connection[Any], config_hash: str, queue: str = "jobs") -> int:
    return int(one(conn, "SELECT count(*) FROM dq_messages WHERE queue = %s AND key LIKE %s",
                   (queue, f"reports/{config_hash}/%"))[0])


@pytest.mark.parametrize("operation", ["install", "reinstall with a new definition", "move to another queue",
                                       "pause", "resume", "uninstall"])
def test_schedule_operations_never_delete_ordinary_messages_with_occurrence_like_keys(conn, operation: str) -> None:
    expected = sorted((k, b"user data") for k in USER_KEYS)
    if operation == "install":
        offer_user_messages(conn)
        h = install(conn, "reports", "every 10 minutes", queue="jobs")
        assert occurrences_of(conn, h) >= 5
        assert user_messages(conn) == expected
        return
    h1 = install(conn, "reports", "every 10 minutes", queue="jobs")
    if operation == "resume":
        conn.execute("SELECT dq_cron_pause('reports')")
    offer_user_messages(conn)
    current: str | None = None  # the hash whose occurrences the queue 'jobs' holds afterwards
    if operation == "reinstall with a new definition":
        current = install(conn, "reports", "every 10 minutes", "new payload", queue="jobs")
        assert current != h1 and occurrences_of(conn, h1) == 0 and occurrences_of(conn, current) >= 5
    elif operation == "move to another queue":
        h2 = install(conn, "reports", "every 10 minutes", queue="jobs2")
        assert occurrences_of(conn, h1) == 0 and occurrences_of(conn, h2, "jobs2") >= 5
    elif operation == "pause":
        assert one(conn, "SELECT dq_cron_pause('reports')") == (True,)
        assert occurrences_of(conn, h1) == 0
    elif operation == "resume":
        assert one(conn, "SELECT dq_cron_resume('reports')") == (True,)
        current = h1
        assert occurrences_of(conn, h1) >= 5
    else:
        assert one(conn, "SELECT dq_cron_uninstall('reports')") == (True,)
        assert occurrences_of(conn, h1) == 0
    assert user_messages(conn) == expected, f"{operation} deleted ordinary messages"
    # and the schedule left nothing else behind in 'jobs'
    assert one(conn, "SELECT count(*) FROM dq_messages WHERE queue = 'jobs' AND NOT key = ANY (%s) "
                     "AND (%s::text IS NULL OR key NOT LIKE 'reports/' || %s || '/%%')",
               (USER_KEYS, current, current)) == (0,)


# --------------------------------------------------------------------------- item 5: refill


def instants(conn: psycopg.Connection[Any], queue: str, name: str) -> list[Any]:
    """scheduled_at_initially of every message of schedule `name` in queue (with repeats)."""
    return [r[0] for r in conn.execute(
        "SELECT scheduled_at_initially FROM dq_messages WHERE queue = %s AND key LIKE %s "
        "ORDER BY scheduled_at_initially", (queue, f"{name}/%"))]


def expected_instants(conn: psycopg.Connection[Any], schedule: str, after: Any, until: Any) -> list[Any]:
    return [r[0] for r in conn.execute(
        "SELECT o FROM dq_cron_occurrences(%s, 'UTC', %s::timestamptz, %s::timestamptz, 10000) o",
        (schedule, after, until))]


def test_a_cancelled_occurrence_is_offered_again_by_the_next_tick(conn) -> None:
    install(conn, "r", "every 5 minutes", queue="jobs", lookahead="1 hour")
    before = instants(conn, "jobs", "r")
    assert len(before) >= 11
    key, at = one(conn, "SELECT key, scheduled_at_initially FROM dq_messages WHERE queue = 'jobs' "
                        "AND scheduled_at_initially > now() + interval '10 minutes' "
                        "ORDER BY scheduled_at_initially LIMIT 1")
    assert one(conn, "SELECT dq_cancel('jobs', %s)", (key,)) == (True,)
    gone = at not in instants(conn, "jobs", "r")
    assert gone
    tick_now, _ = one(conn, "SELECT now(), dq_cron_tick()")
    after = instants(conn, "jobs", "r")
    back = at in after
    assert back, "the cancelled occurrence was not offered again by the tick"
    assert len(after) == len(set(after))
    wanted = expected_instants(conn, "every 5 minutes", tick_now + timedelta(minutes=1), tick_now + timedelta(hours=1))
    missing = len(set(wanted) - set(after))
    assert missing == 0


def test_purged_occurrences_are_offered_again_by_the_next_tick(conn) -> None:
    install(conn, "r", "every 5 minutes", queue="jobs", lookahead="1 hour")
    assert len(instants(conn, "jobs", "r")) >= 11
    assert one(conn, "SELECT dq_purge('jobs', confirm => true)")[0] >= 11
    tick_now, created = one(conn, "SELECT now(), dq_cron_tick()")
    after = instants(conn, "jobs", "r")
    wanted = expected_instants(conn, "every 5 minutes", tick_now + timedelta(minutes=1), tick_now + timedelta(hours=1))
    assert len(wanted) >= 10
    missing = len(set(wanted) - set(after))
    assert missing == 0, f"{missing} of {len(wanted)} purged occurrences not offered again"
    assert len(after) == len(set(after)) and created == len(after)


def test_an_acknowledged_occurrence_never_comes_back_while_a_cancelled_one_does(conn) -> None:
    conn.execute("SELECT dq_configure_queue('jobs', archive => true)")
    install(conn, "s", "every 1 second", queue="jobs", lookahead="5 minutes")
    first = instants(conn, "jobs", "s")[0]
    wait_until_server_time(conn, first)
    got = conn.execute("SELECT lock_token, scheduled_at_initially FROM dq_poll_many('jobs', 1, '1 hour')").fetchall()
    assert len(got) == 1
    token, acked_at = got[0]
    assert one(conn, "SELECT dq_ack(%s::uuid)", (token,)) == (True,)
    key, cancelled_at = one(conn, "SELECT key, scheduled_at_initially FROM dq_messages WHERE queue = 'jobs' "
                                  "AND scheduled_at_initially > now() + interval '2 minutes' "
                                  "ORDER BY scheduled_at_initially LIMIT 1")
    assert one(conn, "SELECT dq_cancel('jobs', %s)", (key,)) == (True,)
    for _ in range(2):
        conn.execute("SELECT dq_cron_tick()")
        after = instants(conn, "jobs", "s")
        back, acked_back = cancelled_at in after, acked_at in after  # booleans: no instant printed
        assert back, "the cancelled occurrence was not offered again"
        assert not acked_back, "an acknowledged occurrence was offered again"
        assert len(after) == len(set(after))
    assert one(conn, "SELECT count(*) FROM dq_archive WHERE queue = 'jobs' AND outcome = 'acked' "
                     "AND scheduled_at_initially = %s", (acked_at,)) == (1,)


# --------------------------------------------------------------------------- item 7: dq_admin reads the view


@pytest.fixture
def admin_login(dsn: str, conn) -> Iterator[str]:
    """DSN of a LOGIN role granted dq_admin and nothing else (cluster-wide: unique name, dropped after)."""
    name = f"hb_admin_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw' IN ROLE dq_admin").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(dsn, user=name, password="pw")
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_dq_admin_reads_dq_cron_schedules_in_a_fresh_session_for_every_kind_of_schedule(conn, admin_login) -> None:
    install(conn, "berlin", "30 8 * * mon-fri", zone="Europe/Berlin")
    install(conn, "nine", "daily at 09:00")
    install(conn, "five", "every 5 minutes")
    for name in ("berlin", "nine", "five"):
        with psycopg.connect(admin_login, autocommit=True) as fresh:
            rows = fresh.execute("SELECT name, next_occurrences FROM dq_cron_schedules WHERE name = %s",
                                 (name,)).fetchall()
        assert len(rows) == 1 and len(rows[0][1]) == 5, (name, rows)
    with psycopg.connect(admin_login, autocommit=True) as fresh:
        cur = fresh.execute("SELECT * FROM dq_cron_schedules ORDER BY name")
        rows = cur.fetchall()
        columns = [d.name for d in cur.description or []]
    assert [r[0] for r in rows] == ["berlin", "five", "nine"]
    assert columns[-2:] == ["last_error", "last_error_at"]


# --------------------------------------------------------------------------- item 8: waiters of dead sessions


def listen(c: psycopg.Connection[Any], channel: str) -> None:
    c.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def terminate(conn: psycopg.Connection[Any], pid: int) -> None:
    """pg_terminate_backend(pid), then wait until the session is gone from pg_stat_activity."""
    assert one(conn, "SELECT pg_terminate_backend(%s)", (pid,)) == (True,)
    deadline = time.monotonic() + 30
    while one(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) != (0,):
        assert time.monotonic() < deadline, "the terminated session did not go away"
        time.sleep(0.02)


def waiter_pids(conn: psycopg.Connection[Any], queue: str) -> set[int]:
    return {r[0] for r in conn.execute("SELECT pid FROM dq_waiters WHERE queue = %s", (queue,))}


def test_a_dead_sessions_waiter_never_causes_a_notify_and_a_live_one_does(dsn, conn) -> None:
    (channel,) = one(conn, "SELECT dq_channel('wq')")
    # Every session is opened before the waiter dies, so none can reuse its pid.
    with psycopg.connect(dsn, autocommit=True) as doomed, psycopg.connect(dsn, autocommit=True) as listener, \
            psycopg.connect(dsn, autocommit=True) as live:
        listen(doomed, channel)
        doomed.execute("SELECT dq_wait('wq', '1 hour')")
        doomed_pid = doomed.info.backend_pid
        assert waiter_pids(conn, "wq") == {doomed_pid}
        listen(listener, channel)
        terminate(conn, doomed_pid)

        conn.execute("SELECT dq_offer('wq', 'k1', 'x')")
        conn.execute("SELECT * FROM dq_offer_many('wq', ARRAY['k2'], ARRAY['y']::bytea[])")
        got = list(listener.notifies(timeout=1.5))
        assert got == [], "a waiter of a dead session made offers notify"

        conn.execute("SELECT dq_purge('wq', confirm => true)")  # nothing due: the live waiter sleeps its hour
        listen(live, channel)
        live.execute("SELECT dq_wait('wq', '1 hour')")
        conn.execute("SELECT dq_offer('wq', 'k3', 'x')")
        got = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload) for n in got] == [(channel, "wq")], "a live waiter was not woken"


def test_the_next_dq_wait_on_the_queue_removes_dead_sessions_waiters(dsn, conn) -> None:
    with psycopg.connect(dsn, autocommit=True) as doomed, psycopg.connect(dsn, autocommit=True) as other:
        doomed.execute("SELECT dq_wait('wq', '1 hour')")
        doomed_pid, other_pid = doomed.info.backend_pid, other.info.backend_pid
        assert waiter_pids(conn, "wq") == {doomed_pid}
        terminate(conn, doomed_pid)
        other.execute("SELECT dq_wait('wq', '1 second')")
        assert waiter_pids(conn, "wq") == {other_pid}, "the dead session's waiter row was kept"


# --------------------------------------------------------------------------- suspicion: ICU collation


@pytest.fixture
def icu_dsn(admin_dsn: str) -> Iterator[str]:
    """A database with an ICU (non-C) collation, installed by pyqueue.migrate; dropped after."""
    with psycopg.connect(admin_dsn, autocommit=True) as a:
        if one(a, "SELECT count(*) FROM pg_collation WHERE collprovider = 'i'") == (0,):
            pytest.skip("this PostgreSQL server was built without ICU (no ICU collation in pg_collation)")
        name = f"dq_icu_{uuid.uuid4().hex[:12]}"
        a.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
                          "LOCALE 'C.UTF-8'").format(sql.Identifier(name)))
    try:
        dsn = testing.with_dbname(admin_dsn, name)
        migrate(dsn)
        yield dsn
    finally:
        testing.drop_database(admin_dsn, name)


def test_icu_database_inserts_offers_dead_letters_and_redrives_in_c_order(icu_dsn: str) -> None:
    with psycopg.connect(icu_dsn, autocommit=True) as c:
        assert one(c, "SELECT 'a' < 'B', 'a' COLLATE \"C\" > 'B' COLLATE \"C\"") == (True, True)  # really not C
        c.execute("SELECT dq_configure_queue('q', 1, 'q.dead')")
        c.execute("SELECT * FROM dq_offer_many('q', ARRAY['a', 'B'], ARRAY['x', 'y']::bytea[])")

        def ids(queue: str) -> dict[str, int]:
            return dict(c.execute("SELECT key, id FROM dq_messages WHERE queue = %s", (queue,)).fetchall())

        assert ids("q")["B"] < ids("q")["a"], "dq_offer_many inserted in the database collation's order"
        # both delivered once in one batch, both locks expire: one poll dead-letters both together
        assert len(poll_tokens(c, "q", 2, "10 ms")) == 2
        c.execute("SELECT pg_sleep(0.05)")
        assert poll_tokens(c, "q", 10) == []
        dead = ids("q.dead")
        assert sorted(dead) == ["B", "a"] and dead["B"] < dead["a"]
        assert one(c, "SELECT dq_redrive('q.dead')") == (2,)
        back = ids("q")
        assert sorted(back) == ["B", "a"] and back["B"] < back["a"]


# --------------------------------------------------------------------------- suspicion: a failing schedule


def test_a_schedule_that_fails_to_evaluate_does_not_stop_the_tick(conn) -> None:
    # Cron expressions: their evaluation converts to the schedule's time zone ('every ...' does not).
    install(conn, "a-good", "* * * * *", lookahead="10 minutes")
    install(conn, "z-good", "*/2 * * * *", lookahead="10 minutes")
    # A time zone tzdata does not have (as after a tzdata update), written as the table owner.
    conn.execute("INSERT INTO dq_cron (name, queue, schedule, timezone, payload, payload_type, lookahead, config_hash) "
                 "SELECT 'm-bad', queue, schedule, 'Mars/Olympus', payload, payload_type, lookahead, config_hash "
                 "FROM dq_cron WHERE name = 'a-good'")
    conn.execute("DELETE FROM dq_messages")
    conn.execute("UPDATE dq_cron SET installed_through = NULL, last_installed_at = NULL, next_at = NULL")
    notices: list[tuple[str | None, str]] = []
    conn.add_notice_handler(lambda d: notices.append((d.severity_nonlocalized, d.message_primary or "")))
    (created,) = one(conn, "SELECT dq_cron_tick()")
    per_name = dict(conn.execute("SELECT split_part(key, '/', 1), count(*) FROM dq_messages GROUP BY 1").fetchall())
    assert per_name.get("a-good", 0) >= 9 and per_name.get("z-good", 0) >= 4 and "m-bad" not in per_name
    assert created == sum(per_name.values())
    warnings = [text for severity, text in notices if severity == "WARNING"]
    assert any("m-bad" in text for text in warnings), notices
    rows = {r[0]: r[1:] for r in conn.execute("SELECT name, last_error, last_error_at IS NOT NULL FROM dq_cron")}
    assert rows["m-bad"][1] is True and "Mars/Olympus" in (rows["m-bad"][0] or ""), rows
    assert rows["a-good"] == (None, False) and rows["z-good"] == (None, False)
