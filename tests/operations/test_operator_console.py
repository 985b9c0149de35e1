"""psql as the operator's console: dead letters readable by a dq_admin login (which may not read
the tables), and a NOTICE from every operator function that changes something."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest


def notices_of(conn: psycopg.Connection[Any], statement: str) -> list[str]:
    got: list[str] = []

    def handler(diag: psycopg.errors.Diagnostic) -> None:
        got.append(diag.message_primary or "")

    conn.add_notice_handler(handler)
    try:
        conn.execute(statement)
    finally:
        conn.remove_notice_handler(handler)
    return got


def test_a_dq_admin_login_reads_dead_letters_with_their_errors_and_payloads(
    conn: psycopg.Connection[Any], login: Callable[[str], str]
) -> None:
    conn.execute("SELECT dq_configure_queue('emails', max_deliveries => 1, dead_letter_queue => 'emails.dead')")
    conn.execute("""SELECT dq_offer('emails', 'order-8', '{"to": "a@example.com"}'::jsonb),
                           dq_offer('emails', 'bin', '\\xff00'::bytea),
                           dq_offer('other', 'order-8', 'x')""")
    errors = {"order-8": "SMTP 550: mailbox unavailable", "bin": "timeout"}
    for key, token in conn.execute("SELECT key, lock_token FROM dq_poll_many('emails', 2, '1 minute')").fetchall():
        conn.execute("SELECT dq_nack(%s, '0', %s)", (token, errors[key]))
    with psycopg.connect(login("dq_admin"), autocommit=True) as admin:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            admin.execute("SELECT * FROM dq_messages")
        rows = admin.execute("SELECT key, dead_from, dead_delivery_count, delivery_count, last_error, payload_type, "
                             "payload_text, locked_until FROM dq_dead_letters('emails.dead')").fetchall()
        assert sorted(rows) == [
            ("bin", "emails", 1, 0, "timeout", "bytes", "\\xff00", None),
            ("order-8", "emails", 1, 0, "SMTP 550: mailbox unavailable", "json", '{"to": "a@example.com"}', None),
        ]
        assert admin.execute("SELECT count(*) FROM dq_dead_letters('emails.dead', 1)").fetchone()[0] == 1
        assert admin.execute("SELECT count(*) FROM dq_dead_letters('emails')").fetchone()[0] == 0  # no dead letters
        # A dead letter a consumer holds shows until when.
        conn.execute("SELECT lock_token FROM dq_poll_many('emails.dead', 1, '1 minute')")
        held = admin.execute("SELECT count(*) FROM dq_dead_letters('emails.dead') WHERE locked_until > now()")
        assert held.fetchone()[0] == 1
    with psycopg.connect(login("dq_consumer"), autocommit=True) as consumer:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            consumer.execute("SELECT * FROM dq_dead_letters('emails.dead')")


def test_a_dq_admin_login_lists_a_queue_by_state(conn: psycopg.Connection[Any], login: Callable[[str], str]) -> None:
    conn.execute("""SELECT dq_offer('jobs', 'due', '{"n": 1}'::jsonb, now() - interval '1 minute'),
                           dq_offer('jobs', 'held', 'x', now() - interval '30 seconds'),
                           dq_offer('jobs', 'later', '\\x00ff'::bytea, now() + interval '1 hour'),
                           dq_offer('other', 'due', 'x')""")
    (token,) = conn.execute("SELECT lock_token FROM dq_poll_many('jobs', 1, '1 minute')").fetchone()  # 'due'
    conn.execute("SELECT dq_nack(%s, '0', 'boom')", (token,))  # delivered once, due again
    assert conn.execute("SELECT count(*) FROM dq_poll_many('jobs', 2, '10 minutes')").fetchone()[0] == 2
    conn.execute("SELECT dq_offer('jobs', 'fresh', 'x', now() - interval '1 second')")
    with psycopg.connect(login("dq_admin"), autocommit=True) as admin:
        rows = admin.execute("SELECT key, state, delivery_count, locked_until IS NOT NULL, last_error, payload_type, "
                             "payload_text FROM dq_list_messages('jobs')").fetchall()
        assert sorted(rows) == sorted([("fresh", "ready", 0, False, None, "text", "x"),
                                       ("due", "in_flight", 2, True, "boom", "json", '{"n": 1}'),
                                       ("held", "in_flight", 1, True, None, "text", "x"),
                                       ("later", "scheduled", 0, False, None, "bytes", "\\x00ff")])
        assert (rows[0][0], rows[-1][0]) == ("fresh", "later")  # by due time; in flight: by lock expiry
        by_state = {s: sorted(r[0] for r in admin.execute("SELECT key FROM dq_list_messages('jobs', %s)", (s,)))
                    for s in ("ready", "scheduled", "in_flight", "redelivered")}
        assert by_state == {"ready": ["fresh"], "scheduled": ["later"], "in_flight": ["due", "held"],
                            "redelivered": ["due"]}
        assert [r[0] for r in admin.execute("SELECT key FROM dq_list_messages('jobs', max_rows => 1)")] == ["fresh"]


def test_dq_dead_letters_and_dq_list_messages_reject_bad_input(conn: psycopg.Connection[Any]) -> None:
    for statement, sqlstate, fragment in [
        ("SELECT * FROM dq_list_messages(NULL)", "22004", "queue"),
        ("SELECT * FROM dq_list_messages('q', 'stuck')", "22023", "in_state"),
        ("SELECT * FROM dq_list_messages('q', NULL, 0)", "22023", "max_rows"),
        ("SELECT * FROM dq_list_messages('q', NULL, 10001)", "22023", "max_rows"),
        ("SELECT * FROM dq_dead_letters(NULL)", "22004", "dead_letter_queue"),
        ("SELECT * FROM dq_dead_letters('')", "22023", "dead_letter_queue"),
        ("SELECT * FROM dq_dead_letters('q', 0)", "22023", "max_rows"),
        ("SELECT * FROM dq_dead_letters('q', 100001)", "22023", "max_rows"),
    ]:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(statement)
        assert info.value.sqlstate == sqlstate, statement
        assert (info.value.diag.message_primary or "").startswith(statement.split("FROM ")[1].split("(")[0] + ":")
        assert fragment in (info.value.diag.message_primary or "")


# Operator functions (granted to dq_admin only) that change nothing, or that pg_cron and the
# workers call on a schedule (a NOTICE there would fill pg_cron's run log): the rest must print one.
QUIET = {
    "dq_queue_stats", "dq_export_archive", "dq_export_archive_bounds", "dq_cron_config_hash", "dq_cron_occurrences",
    "dq_cron_list", "dq_dead_letters", "dq_list_messages", "dq_metrics", "dq_table_health",  # read only
    "dq_browse_messages", "dq_message_detail", "dq_dead_letter_groups", "dq_count_dead_letters", "dq_queue_config",
    "dq_throughput", "dq_audit_entries",  # read only (the web console's)
    "dq_install_tick", "dq_uninstall_tick", "dq_cron_tick",  # called by pg_cron and the cron ticker
    "dq_prune_archive",  # one batch of dq_prune_archive_all (pg_cron's retention job), which prints the total
    "dq_cron_prune_run_details",  # pg_cron's history job
    "dq_release_backlog",  # pg_cron's dq-release job, every 10 s; it returns how many children it released
}
# One call per operator function, each changing something; run in this order on one database.
CALLS = [
    ("dq_configure_queue",
     "SELECT * FROM dq_configure_queue('jobs', max_deliveries => 3, dead_letter_queue => 'jobs.dead')",
     "dq_configure_queue: queue jobs configured: max_deliveries 3, dead_letter_queue jobs.dead"),
    ("dq_cron_install", "SELECT dq_cron_install('nightly', 'jobs', 'daily at 03:00', 'x'::text)",
     "dq_cron_install: schedule nightly installed"),
    ("dq_cron_pause", "SELECT dq_cron_pause('nightly')",
     "dq_cron_pause: schedule nightly paused; 1 future occurrences"),
    ("dq_cron_resume", "SELECT dq_cron_resume('nightly')", "dq_cron_resume: schedule nightly resumed"),
    ("dq_cron_uninstall", "SELECT dq_cron_uninstall('nightly')", "dq_cron_uninstall: schedule nightly removed"),
    ("dq_pause_queue", "SELECT dq_pause_queue('jobs')", "dq_pause_queue: queue jobs is paused"),
    ("dq_resume_queue", "SELECT dq_resume_queue('jobs')", "dq_resume_queue: queue jobs is resumed"),
    ("dq_release_locks", "SELECT dq_release_locks('jobs')", "dq_release_locks: released 0 locks of queue jobs"),
    ("dq_redrive", "SELECT dq_redrive('jobs.dead')", "dq_redrive: 0 dead letters of jobs.dead"),
    ("dq_redrive_messages", "SELECT dq_redrive_messages('jobs.dead', '{1}')",
     "dq_redrive_messages: 0 dead letters of jobs.dead"),
    ("dq_redrive_matching", "SELECT dq_redrive_matching('jobs.dead', 'jobs')",
     "dq_redrive_matching: 0 dead letters of jobs.dead"),
    ("dq_make_due", "SELECT dq_make_due('jobs', 'nope')",
     "dq_make_due: queue jobs has no scheduled message with key nope"),
    ("dq_audit", "SELECT dq_audit('alice', 'pause', 'jobs', NULL, NULL, 'ok')",
     "dq_audit: entry 1 recorded (pause by alice)"),
    ("dq_purge", "SELECT dq_purge('jobs', confirm => true)", "dq_purge: deleted"),
    ("dq_prune_archive_all", "CALL dq_prune_archive_all()", None),  # prints only when it deleted something
]


def test_every_operator_function_that_changes_something_prints_a_notice(conn: psycopg.Connection[Any]) -> None:
    operator = {r[0] for r in conn.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = current_schema() AND p.proname LIKE 'dq\\_%' AND p.proname NOT LIKE 'dq\\_\\_%' "
        "  AND has_function_privilege('dq_admin', p.oid, 'EXECUTE') "
        "  AND NOT has_function_privilege('dq_consumer', p.oid, 'EXECUTE') "
        "  AND NOT has_function_privilege('dq_producer', p.oid, 'EXECUTE')")}
    assert operator - QUIET == {name for name, _, _ in CALLS}, "a new operator function: give it a NOTICE and a call"
    for name, statement, expected in CALLS:
        got = notices_of(conn, statement)
        if expected is not None:
            assert any(n.startswith(expected) for n in got), (name, got)
    # Calls that find nothing say so too.
    for statement, expected in [("SELECT dq_cron_pause('nope')", "dq_cron_pause: no schedule named nope"),
                                ("SELECT dq_cron_resume('nope')", "dq_cron_resume: no schedule named nope"),
                                ("SELECT dq_cron_uninstall('nope')", "dq_cron_uninstall: no schedule named nope")]:
        assert any(n.startswith(expected) for n in notices_of(conn, statement)), statement


def test_the_clients_list_dead_letters(conn: psycopg.Connection[Any], dsn: str) -> None:
    import asyncio

    from pyqueue import DelayedQueue
    from pyqueue.aio import AsyncDelayedQueue

    conn.execute("SELECT * FROM dq_configure_queue('jobs', max_deliveries => 1, dead_letter_queue => 'jobs.dead')")
    conn.execute("SELECT dq_offer('jobs', 'a', 'x'), dq_offer('jobs', 'b', 'y')")
    for key, token in conn.execute("SELECT key, lock_token FROM dq_poll_many('jobs', 2, '1 minute')").fetchall():
        conn.execute("SELECT dq_nack(%s, '0', %s)", (token, f"failed {key}"))
    with DelayedQueue(dsn, "jobs.dead") as dead:
        rows = dead.dead_letters()
        assert dead.dead_letters(max_rows=1) == rows[:1]
    assert sorted((r["key"], r["dead_from"], r["last_error"], r["payload_text"]) for r in rows) == [
        ("a", "jobs", "failed a", "x"), ("b", "jobs", "failed b", "y")]

    async def listed() -> list[dict[str, Any]]:
        async with AsyncDelayedQueue(dsn, "jobs.dead") as adead:
            return await adead.dead_letters()

    assert asyncio.run(listed()) == rows
