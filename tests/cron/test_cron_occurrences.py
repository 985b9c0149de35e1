"""The occurrences a schedule owns: its operations (install, reinstall, move, pause, resume,
uninstall) touch only its own messages, never ordinary ones whose keys look like occurrences; the
next tick offers again the occurrences that were cancelled or purged, never one acknowledged; no
occurrence passes 9999-12-30; dq_admin reads dq_cron_schedules for every kind of schedule; and a
schedule that fails to evaluate does not stop the tick for the others. The rules are in
docs/cron.md and docs/api.md.

Real server, no mocks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from cronhelpers import install
from sqlhelpers import row_of, wait_until_server_time

# --------------------------------------------------------------------------- ownership of occurrences

USER_KEYS = ["reports/q3/20251001", "reports/eu/42", "reports/abcdef0123456789/1700000000000"]


def offer_user_messages(conn: psycopg.Connection[Any], queue: str = "jobs") -> None:
    for key in USER_KEYS:
        conn.execute("SELECT dq_offer(%s, %s, 'user data'::text::bytea, now() + interval '1 day')", (queue, key))


def user_messages(conn: psycopg.Connection[Any], queue: str = "jobs") -> list[tuple[str, bytes]]:
    return [(k, bytes(p)) for k, p in conn.execute(
        "SELECT key, payload FROM dq_messages WHERE queue = %s AND key = ANY (%s) ORDER BY key", (queue, USER_KEYS))]


def occurrences_of(conn: psycopg.Connection[Any], config_hash: str, queue: str = "jobs") -> int:
    return int(row_of(conn, "SELECT count(*) FROM dq_messages WHERE queue = %s AND key LIKE %s",
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
        assert row_of(conn, "SELECT dq_cron_pause('reports')") == (True,)
        assert occurrences_of(conn, h1) == 0
    elif operation == "resume":
        assert row_of(conn, "SELECT dq_cron_resume('reports')") == (True,)
        current = h1
        assert occurrences_of(conn, h1) >= 5
    else:
        assert row_of(conn, "SELECT dq_cron_uninstall('reports')") == (True,)
        assert occurrences_of(conn, h1) == 0
    assert user_messages(conn) == expected, f"{operation} deleted ordinary messages"
    # and the schedule left nothing else behind in 'jobs'
    assert row_of(conn, "SELECT count(*) FROM dq_messages WHERE queue = 'jobs' AND NOT key = ANY (%s) "
                        "AND (%s::text IS NULL OR key NOT LIKE 'reports/' || %s || '/%%')",
                  (USER_KEYS, current, current)) == (0,)


# --------------------------------------------------------------------------- refilling the window


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
    key, at = row_of(conn, "SELECT key, scheduled_at_initially FROM dq_messages WHERE queue = 'jobs' "
                           "AND scheduled_at_initially > now() + interval '10 minutes' "
                           "ORDER BY scheduled_at_initially LIMIT 1")
    assert row_of(conn, "SELECT dq_cancel('jobs', %s)", (key,)) == (True,)
    gone = at not in instants(conn, "jobs", "r")
    assert gone
    tick_now, _ = row_of(conn, "SELECT now(), dq_cron_tick()")
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
    assert row_of(conn, "SELECT dq_purge('jobs', confirm => true)")[0] >= 11
    tick_now, created = row_of(conn, "SELECT now(), dq_cron_tick()")
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
    assert row_of(conn, "SELECT dq_ack(%s::uuid)", (token,)) == (True,)
    key, cancelled_at = row_of(conn, "SELECT key, scheduled_at_initially FROM dq_messages WHERE queue = 'jobs' "
                                     "AND scheduled_at_initially > now() + interval '2 minutes' "
                                     "ORDER BY scheduled_at_initially LIMIT 1")
    assert row_of(conn, "SELECT dq_cancel('jobs', %s)", (key,)) == (True,)
    for _ in range(2):
        conn.execute("SELECT dq_cron_tick()")
        after = instants(conn, "jobs", "s")
        back, acked_back = cancelled_at in after, acked_at in after  # booleans: no instant printed
        assert back, "the cancelled occurrence was not offered again"
        assert not acked_back, "an acknowledged occurrence was offered again"
        assert len(after) == len(set(after))
    assert row_of(conn, "SELECT count(*) FROM dq_archive WHERE queue = 'jobs' AND outcome = 'acked' "
                        "AND scheduled_at_initially = %s", (acked_at,)) == (1,)


# --------------------------------------------------------------------------- the last occurrence


def test_cron_occurrences_never_pass_9999_12_30(conn) -> None:
    rows = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE x > timestamptz '9999-12-30 00:00:00+00'),"
        "       max(x) = timestamptz '9999-12-30 00:00:00+00'"
        "  FROM dq_cron_occurrences('@daily', 'UTC', '9999-12-25 00:00:00+00', 'infinity', 20) x"
    ).fetchall()
    assert rows == [(5, 0, True)]  # 26, 27, 28, 29, 30 December 9999


# --------------------------------------------------------------------------- dq_admin reads the view


def test_dq_admin_reads_dq_cron_schedules_in_a_fresh_session_for_every_kind_of_schedule(conn, login) -> None:
    admin_login = login("dq_admin")
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


# --------------------------------------------------------------------------- a schedule that fails to evaluate


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
    (created,) = row_of(conn, "SELECT dq_cron_tick()")
    per_name = dict(conn.execute("SELECT split_part(key, '/', 1), count(*) FROM dq_messages GROUP BY 1").fetchall())
    assert per_name.get("a-good", 0) >= 9 and per_name.get("z-good", 0) >= 4 and "m-bad" not in per_name
    assert created == sum(per_name.values())
    warnings = [text for severity, text in notices if severity == "WARNING"]
    assert any("m-bad" in text for text in warnings), notices
    rows = {r[0]: r[1:] for r in conn.execute("SELECT name, last_error, last_error_at IS NOT NULL FROM dq_cron")}
    assert rows["m-bad"][1] is True and "Mars/Olympus" in (rows["m-bad"][0] or ""), rows
    assert rows["a-good"] == (None, False) and rows["z-good"] == (None, False)
