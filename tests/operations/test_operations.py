"""Operations: archive, retention, stats, purge, releasing locks, least-privilege roles."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql
from sqlhelpers import nested_plans


def one(conn: psycopg.Connection, query: str, params=None):
    return conn.execute(query, params).fetchone()


def poll(conn, queue: str, n: int = 1, lock: str = "1 hour") -> list[uuid.UUID]:
    return [r[0] for r in conn.execute("SELECT lock_token FROM dq_poll_many(%s, %s, %s::interval)", (queue, n, lock))]


# -- archive -------------------------------------------------------------------------------------
def test_archive_on_moves_acked_cancelled_and_dead_rows_with_their_outcome(conn) -> None:
    conn.execute("SELECT dq_configure_queue('a', 2, 'a.dead', archive => true)")
    for key in ("k1", "k2", "k3", "gone", "poison"):
        conn.execute("SELECT dq_offer('a', %s, 'x', now() - interval '1 minute')", (key,))
    tokens = poll(conn, "a", 2)  # k1, k2
    assert one(conn, "SELECT dq_ack(%s::uuid)", (tokens[0],))[0] is True
    assert one(conn, "SELECT dq_ack_many(%s::uuid[])", ([tokens[1]],))[0] == 1
    assert one(conn, "SELECT dq_cancel('a', 'gone')")[0] is True
    conn.execute("SELECT dq_cancel('a', 'k3')")
    for _ in range(2):  # poison: two failed deliveries, dead on the third poll
        (t,) = poll(conn, "a")
        conn.execute("SELECT dq_nack(%s, '0', 'boom')", (t,))
    assert poll(conn, "a") == []
    rows = conn.execute(
        "SELECT key, outcome, delivery_count, last_error, acked_at <= clock_timestamp() FROM dq_archive "
        "WHERE queue = 'a' ORDER BY archive_id").fetchall()
    assert rows == [("k1", "acked", 1, None, True), ("k2", "acked", 1, None, True),
                    ("gone", "cancelled", 0, None, True), ("k3", "cancelled", 0, None, True),
                    ("poison", "dead", 2, "boom", True)]
    assert one(conn, "SELECT count(*) FROM dq_messages WHERE queue = 'a'")[0] == 0
    assert one(conn, "SELECT queue, dead_from FROM dq_messages WHERE key = 'poison'") == ("a.dead", "a")


def test_archive_off_deletes(conn) -> None:
    conn.execute("SELECT dq_offer('b', 'k', 'x')")
    (t,) = poll(conn, "b")
    assert one(conn, "SELECT dq_ack(%s::uuid)", (t,))[0] is True
    assert one(conn, "SELECT count(*) FROM dq_archive")[0] == 0
    assert one(conn, "SELECT count(*) FROM dq_messages")[0] == 0


def archive_row(conn, queue: str, key: str, age: str) -> None:
    conn.execute(
        "INSERT INTO dq_archive (id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, "
        "created_at, delivery_count, outcome, acked_at) "
        "VALUES (0, %s, %s, 'x', 'bytes', now(), now(), now(), 1, 'acked', now() - %s::interval)", (queue, key, age))


def test_retention_prunes_only_rows_older_than_the_queues_retention(conn) -> None:
    conn.execute("SELECT dq_configure_queue('r', archive => true, retention => '1 day')")
    conn.execute("SELECT dq_configure_queue('forever', archive => true)")
    for i in range(25):
        archive_row(conn, "r", f"old{i}", "2 days")
    archive_row(conn, "r", "young", "1 hour")
    archive_row(conn, "forever", "ancient", "400 days")
    assert one(conn, "SELECT dq_prune_archive(10)")[0] == 10  # bounded batch
    conn.execute("CALL dq_prune_archive_all(7)")  # batches of 7, each committed, until done
    keys = sorted(r[0] for r in conn.execute("SELECT key FROM dq_archive"))
    assert keys == ["ancient", "young"]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="batch_size is 0"):
        conn.execute("SELECT dq_prune_archive(0)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="retention"):
        conn.execute("SELECT dq_configure_queue('r', retention => '-1 day')")
    assert one(conn, "SELECT retention FROM dq_queues WHERE queue = 'r'")[0] == timedelta(days=1)


# -- stats ---------------------------------------------------------------------------------------
def test_stats_are_exact_on_a_crafted_queue(conn) -> None:
    conn.execute("SELECT dq_configure_queue('s', 1, 's.dead', archive => true)")
    at = one(conn, "SELECT now()")[0]
    conn.execute("SELECT dq_offer('s', 'ready1', 'x', %s - interval '10 minutes')", (at,))
    conn.execute("SELECT dq_offer('s', 'ready2', 'x', %s - interval '1 minute')", (at,))
    for i in range(3):
        conn.execute("SELECT dq_offer('s', %s, 'x', %s + interval '1 hour' + %s * interval '1 minute')",
                     (f"later{i}", at, i))
    conn.execute("SELECT dq_offer('s', 'f1', 'x', %s - interval '20 minutes')", (at,))
    conn.execute("SELECT dq_offer('s', 'f2', 'x', %s - interval '19 minutes')", (at,))
    conn.execute("SELECT dq_offer('s', 'acked', 'x', %s - interval '18 minutes')", (at,))
    # in flight: f1 (first delivery), f2 (a redelivery: its first lock expired); acked: archived
    f1, f2, acked = poll(conn, "s", 3)
    conn.execute("SELECT dq_ack(%s::uuid)", (acked,))
    conn.execute("UPDATE dq_messages SET delivery_count = 2 WHERE key = 'f2'")  # as after an expiry
    conn.execute("SELECT dq_offer('s', 'expired', 'x', %s - interval '30 minutes')", (at,))
    (expired,) = poll(conn, "s", 1, "1 millisecond")  # the oldest due: its lock expires at once
    conn.execute("SELECT pg_sleep(0.01)")
    conn.execute("SELECT dq_offer('other', 'x', 'x', %s - interval '1 minute')", (at,))
    # a dead letter of s: delivered once (the limit), due again -> moved to s.dead on the next poll
    conn.execute("SELECT dq_configure_queue('d', 1, 's.dead')")
    conn.execute("INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, "
                 "scheduled_at_initially, delivery_count, dead_from, dead_at) "
                 "VALUES ('s.dead', 'dl', 'x', 'bytes', now(), now(), 1, 's', now())")

    row = conn.execute("SELECT * FROM dq_stats WHERE queue = 's'").fetchone()
    cols = [d.name for d in conn.execute("SELECT * FROM dq_stats LIMIT 0").description]
    stats = dict(zip(cols, row, strict=True))
    # ready: ready1, ready2 and 'expired' (its lock ran out: it is due again) -> 3
    assert stats["ready"] == 3
    assert stats["scheduled"] == 3
    assert stats["in_flight"] == 2 and stats["redelivered"] == 1
    assert stats["dead"] == 1
    assert stats["oldest_ready_age"] >= timedelta(minutes=10)  # 'expired' is due since its lock ran out
    assert stats["next_due"] == at + timedelta(hours=1)
    assert stats["acked_last_minute"] == 1 and stats["acked_last_hour"] == 1
    assert stats["approximate"] is False
    queues = [r[0] for r in conn.execute("SELECT queue FROM dq_stats")]
    assert queues == ["d", "other", "s", "s.dead"]  # with messages, or configured
    other = conn.execute("SELECT ready, acked_last_hour FROM dq_stats WHERE queue = 'other'").fetchone()
    assert other == (1, None)  # no archive: no acknowledgement counts
    assert expired is not None


def test_stats_past_the_exact_limit_are_estimated_and_flagged(conn) -> None:
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially) "
        "SELECT 'big', 'k' || g, 'x', 'bytes', now() + interval '1 hour' + g * interval '1 second', now() "
        "FROM generate_series(1, 30000) g")  # due in an hour: none becomes ready during a slow ANALYZE
    conn.execute("SELECT dq_offer('big', 'due', 'x', now() - interval '1 second')")
    conn.execute("ANALYZE dq_messages")
    ready, scheduled, approximate = conn.execute(
        "SELECT ready, scheduled, approximate FROM dq_queue_stats('big')").fetchone()
    assert ready == 1 and approximate is True
    assert 0.8 * 30000 <= scheduled <= 1.2 * 30000


def test_stats_count_messages_in_flight_up_to_the_exact_limit(conn) -> None:
    """In flight past the exact limit (20,000): the count stops at the limit + 1 and the row says it
    is approximate, so a scrape of a queue with a hundred thousand messages in flight stays cheap."""
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, "
        "                         lock_token, delivery_count) "
        "SELECT 'busy', 'k' || g, 'x', 'bytes', now() + interval '1 hour', now(), gen_random_uuid(), 1 + g % 2 "
        "FROM generate_series(1, 25000) g")
    in_flight, redelivered, approximate = conn.execute(
        "SELECT in_flight, redelivered, approximate FROM dq_queue_stats('busy')").fetchone()
    assert in_flight == 20001 and approximate is True
    assert 9000 < redelivered < 11000  # of the rows counted
    conn.execute("DELETE FROM dq_messages WHERE queue = 'busy' AND key NOT IN ('k1', 'k2', 'k3')")
    assert conn.execute("SELECT in_flight, redelivered, approximate FROM dq_queue_stats('busy')"
                        ).fetchone() == (3, 2, False)  # k1 and k3 were delivered twice


def test_stats_use_no_sequential_scan_of_the_live_table(conn) -> None:
    conn.execute(
        "INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially) "
        "SELECT 'q' || (g % 5), 'k' || g, 'x', 'bytes', now() + g * interval '1 second', now() "
        "FROM generate_series(1, 20000) g")
    conn.execute("VACUUM ANALYZE dq_messages")
    plans = nested_plans(conn, "SELECT * FROM dq_stats")
    assert "dq_messages_ready_idx" in plans, plans
    assert "Seq Scan on dq_messages" not in plans, plans


# -- purge and release ---------------------------------------------------------------------------
def test_purge_needs_confirm_and_release_makes_in_flight_due(conn) -> None:
    for i in range(3):
        conn.execute("SELECT dq_offer('p', %s, 'x')", (f"k{i}",))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="confirm must be true"):
        conn.execute("SELECT dq_purge('p')")
    assert one(conn, "SELECT count(*) FROM dq_messages")[0] == 3
    tokens = poll(conn, "p", 2)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    assert one(conn, "SELECT dq_release_locks('p')")[0] == 2
    assert one(conn, "SELECT dq_ack_many(%s::uuid[])", (tokens,))[0] == 0  # the old holders lost their locks
    assert len(poll(conn, "p", 3)) == 3  # all due now
    assert one(conn, "SELECT max(delivery_count) FROM dq_messages")[0] == 2  # the crashed delivery counts
    assert one(conn, "SELECT dq_purge('p', confirm => true)")[0] == 3
    assert notices == ["dq_release_locks: released 2 locks of queue p (due now)",
                       "dq_purge: deleted 3 messages of queue p"]


# -- roles ---------------------------------------------------------------------------------------
PRODUCER = ["SELECT dq_offer('jobs', 'k', 'x')", "SELECT * FROM dq_offer_many('jobs', ARRAY['m'], ARRAY['x']::bytea[])",
            "SELECT dq_cancel('jobs', 'm')"]
CONSUMER = ["SELECT * FROM dq_poll_many('jobs', 1, '1 minute')", "SELECT * FROM dq_poll_or_wait('jobs', 1, '1 minute')",
            "SELECT dq_ack(gen_random_uuid())", "SELECT dq_ack_many(ARRAY[gen_random_uuid()])",
            "SELECT dq_nack(gen_random_uuid())",
            "SELECT dq_extend(gen_random_uuid(), '1 minute')", "SELECT * FROM dq_get('jobs', 'k')",
            "SELECT dq_next_due('jobs')", "SELECT dq_channel('jobs')", "SELECT dq_wait('jobs', '1 second')"]
ADMIN = ["SELECT dq_configure_queue('jobs', archive => true)", "SELECT dq_redrive('jobs.dead')",
         "SELECT * FROM dq_dead_letters('jobs.dead')", "SELECT * FROM dq_list_messages('jobs')",
         "SELECT dq_purge('nothing', confirm => true)", "SELECT dq_release_locks('jobs')",
         "SELECT * FROM dq_stats", "SELECT dq_prune_archive()", "SELECT * FROM dq_cron_schedules",
         "SELECT dq_cron_install('nightly', 'jobs', 'daily at 03:00', 'x'::bytea)", "SELECT dq_cron_tick()",
         "SELECT dq_cron_pause('nightly')", "SELECT dq_install_tick('jobs', 'p', 'h', ARRAY[now()], ARRAY['x'::bytea])"]
TABLES = ["SELECT * FROM dq_messages", "INSERT INTO dq_waiters VALUES ('q', 1, now())", "SELECT * FROM dq_queues",
          "SELECT * FROM dq_archive", "DELETE FROM dq_meta", "SELECT * FROM dq_cron"]


@pytest.fixture
def login_roles(dsn: str, conn) -> Iterator[dict[str, str]]:
    """A login role per application role (cluster-wide, so uniquely named and dropped after)."""
    suffix = uuid.uuid4().hex[:8]
    made = {}
    for role in ("dq_producer", "dq_consumer", "dq_admin"):
        name = f"app_{role}_{suffix}"
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw' IN ROLE {}").format(
            sql.Identifier(name), sql.Identifier(role)))
        made[role] = name
    conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
        sql.Identifier(conn.info.dbname), sql.Identifier(made["dq_consumer"])))
    yield {role: psycopg.conninfo.make_conninfo(dsn, user=name, password="pw") for role, name in made.items()}
    for name in made.values():
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def allowed(dsn: str, statement: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            c.execute(statement)
            return True
        except psycopg.errors.InsufficientPrivilege:
            return False


def test_each_role_can_call_exactly_its_functions(login_roles) -> None:
    expected = {
        "dq_producer": set(PRODUCER),
        "dq_consumer": set(CONSUMER),
        "dq_admin": set(PRODUCER) | set(CONSUMER) | set(ADMIN),
    }
    for role, dsn in login_roles.items():
        got = {s for s in PRODUCER + CONSUMER + ADMIN if allowed(dsn, s)}
        assert got == expected[role], (role, got ^ expected[role])
        assert not any(allowed(dsn, s) for s in TABLES), role


def test_public_has_no_privileges_and_every_public_function_is_a_pinned_security_definer(conn) -> None:
    leaks = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'public' AND p.proname LIKE 'dq\\_%' AND has_function_privilege('public', p.oid, 'EXECUTE')"
    ).fetchall()
    assert leaks == []
    not_definer = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'public' AND p.proname LIKE 'dq\\_%' AND p.proname NOT LIKE 'dq\\_\\_%' AND p.prokind = 'f' "
        "AND NOT (p.prosecdef AND 'search_path=public_internal, public, pg_temp' = ANY (p.proconfig))").fetchall()
    assert not_definer == []


def test_a_function_planted_in_the_callers_search_path_is_not_used(login_roles, conn) -> None:
    planted = "00000000-0000-0000-0000-000000000001"
    conn.execute("SELECT dq_offer('jobs', 'k', 'x')")
    with psycopg.connect(login_roles["dq_consumer"], autocommit=True) as c:
        c.execute("CREATE SCHEMA evil")
        c.execute(f"CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid LANGUAGE sql AS $$ SELECT '{planted}'::uuid $$")
        c.execute("CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql "
                  "AS $$ SELECT '2000-01-01'::timestamptz $$")
        c.execute("CREATE TEMP TABLE dq_messages (LIKE pg_class)")  # a temp table shadowing ours
        c.execute("SET search_path = evil, pg_temp, public")
        (token, until) = c.execute("SELECT lock_token, locked_until FROM dq_poll_many('jobs', 1, '1 hour')").fetchone()
    assert str(token) != planted
    assert until.year > 2000
    assert one(conn, "SELECT lock_token FROM dq_messages WHERE key = 'k'")[0] == token


def test_cli_stats_prints_every_queue_and_watch_stops_on_sigint(dsn: str, conn) -> None:
    import signal
    import subprocess
    import sys
    import time

    conn.execute("SELECT dq_offer('mail', 'k', 'x')")
    conn.execute("SELECT dq_configure_queue('audit', archive => true)")
    out = subprocess.run([sys.executable, "-m", "pyqueue", "stats", "--dsn", dsn], capture_output=True, text=True,
                         timeout=60, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "mail" in out.stdout and "audit" in out.stdout and "ready" in out.stdout
    proc = subprocess.Popen([sys.executable, "-m", "pyqueue", "stats", "--dsn", dsn, "--watch", "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Signal once it is watching (its session has queried the stats; on a pipe, rich's Live prints
        # only its last table, at exit), then at some point of the refresh cycle.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND query LIKE '%%stats%%'").fetchone() == (0,):
            time.sleep(0.1)
        time.sleep(1.3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "mail" in stdout
