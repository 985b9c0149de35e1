"""Bad input for every cron function: one row per case with the expected SQLSTATE (the model is
tests/core/test_sql_bad_input.py), and nothing changed: every row of dq_messages and dq_cron is equal
before and after (a schedule 'keep' with installed occurrences is there to be damaged)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlhelpers import check_context_names_only, table_rows


def case(case_id: str, sql: str, sqlstate: str, *contains: str) -> Any:
    return pytest.param(sql, sqlstate, contains, id=case_id)


T2 = "ARRAY['2100-01-01Z', '2100-01-02Z']::timestamptz[]"
P2 = r"ARRAY['\x01', '\x02']::bytea[]"
INST = "SELECT dq_cron_install('keep', 'q', {s}, 'changed'::text{rest})"


def inst(schedule: str, rest: str = "") -> str:
    return INST.format(s=schedule, rest=rest)


# fmt: off
CASES = [
    # ---- dq_install_tick
    case("it-queue-null", f"SELECT dq_install_tick(NULL, 'p', 'h', {T2}, {P2})", "22004", "dq_install_tick:", "queue"),
    case("it-queue-long", f"SELECT dq_install_tick(repeat('q', 101), 'p', 'h', {T2}, {P2})", "22001",
         "dq_install_tick:", "queue", "limit is 100"),
    case("it-prefix-empty", f"SELECT dq_install_tick('q', '', 'h', {T2}, {P2})", "22023",
         "dq_install_tick:", "key_prefix", "empty"),
    case("it-prefix-long", f"SELECT dq_install_tick('q', repeat('p', 101), 'h', {T2}, {P2})", "22001",
         "dq_install_tick:", "key_prefix", "limit is 100"),
    case("it-hash-null", f"SELECT dq_install_tick('q', 'keep', NULL, {T2}, {P2})", "22004",
         "dq_install_tick:", "config_hash"),
    case("it-hash-slash", f"SELECT dq_install_tick('q', 'keep', 'a/b', {T2}, {P2})", "22023",
         "dq_install_tick:", "config_hash", "/"),
    case("it-hash-long", f"SELECT dq_install_tick('q', 'keep', repeat('h', 65), {T2}, {P2})", "22001",
         "dq_install_tick:", "config_hash", "limit is 64"),
    case("it-times-null", f"SELECT dq_install_tick('q', 'keep', 'h', NULL, {P2})", "22004",
         "dq_install_tick:", "scheduled_ats"),
    case("it-payloads-null", f"SELECT dq_install_tick('q', 'keep', 'h', {T2}, NULL)", "22004",
         "dq_install_tick:", "payloads"),
    case("it-lengths", rf"SELECT dq_install_tick('q', 'keep', 'h', {T2}, ARRAY['\x01']::bytea[])", "22023",
         "dq_install_tick:", "payloads has 1", "scheduled_ats has 2"),
    case("it-time-element-null", "SELECT dq_install_tick('q', 'keep', 'h', ARRAY['2100-01-01Z',"
                                 f" NULL]::timestamptz[], {P2})",
         "22004", "dq_install_tick:", "scheduled_ats[2]"),
    case("it-payload-element-null", f"SELECT dq_install_tick('q', 'keep', 'h', {T2}, ARRAY['\\x01', NULL]::bytea[])",
         "22004", "dq_install_tick:", "payloads[2]"),
    # every instant within [0001-01-02, 9999-12-30] UTC, else 22008
    case("it-infinite", "SELECT dq_install_tick('q', 'keep', 'h', ARRAY['2100-01-01Z', 'infinity']::timestamptz[],"
                        f" {P2})",
         "22008", "dq_install_tick:", "scheduled_ats[2]", "9999-12-30"),
    case("it-minus-infinite", "SELECT dq_install_tick('q', 'keep', 'h', ARRAY['2100-01-01Z',"
                              f" '-infinity']::timestamptz[], {P2})",
         "22008", "dq_install_tick:", "scheduled_ats[2]", "9999-12-30"),
    case("it-year-10000", "SELECT dq_install_tick('q', 'keep', 'h', ARRAY['2100-01-01Z',"
                          f" '10000-01-01Z']::timestamptz[], {P2})",
         "22008", "dq_install_tick:", "scheduled_ats[2]", "9999-12-30"),
    case("it-bc", "SELECT dq_install_tick('q', 'keep', 'h', ARRAY['2100-01-01Z',"
                  f" '4713-01-01 00:00:00+00 BC']::timestamptz[], {P2})",
         "22008", "dq_install_tick:", "scheduled_ats[2]", "9999-12-30"),
    case("it-same-ms", "SELECT dq_install_tick('q', 'keep', 'h', ARRAY['2100-01-01 00:00:00.0001Z', '2100-01-01"
                       f" 00:00:00.0002Z']::timestamptz[], {P2})",
         "22023", "dq_install_tick:", "scheduled_ats[2]", "millisecond"),
    case("it-2d", "SELECT dq_install_tick('q', 'keep', 'h', ARRAY[['2100-01-01Z']]::timestamptz[],"
                  " ARRAY[['\\x01']]::bytea[])",
         "22023", "dq_install_tick:", "one-dimensional"),
    case("it-over-limit", "SELECT dq_install_tick('q', 'keep', 'h', ARRAY(SELECT timestamptz '2100-01-01Z' + g *"
                          " interval '1 s' FROM generate_series(1, 100001) g),"
                          " array_fill('\\x01'::bytea, ARRAY[100001]))",
         "54000", "dq_install_tick:", "limit is 100000"),
    case("it-type-empty", f"SELECT dq_install_tick('q', 'keep', 'h', {T2}, {P2}, '')", "22023",
         "dq_install_tick:", "payload_type", "empty"),
    case("it-can-update-null", f"SELECT dq_install_tick('q', 'keep', 'h', {T2}, {P2}, NULL, NULL)", "22004",
         "dq_install_tick:", "can_update"),
    # ---- dq_uninstall_tick
    case("ut-queue-null", "SELECT dq_uninstall_tick(NULL, 'keep')", "22004", "dq_uninstall_tick:", "queue"),
    case("ut-prefix-null", "SELECT dq_uninstall_tick('q', NULL)", "22004", "dq_uninstall_tick:", "key_prefix"),
    case("ut-prefix-long", "SELECT dq_uninstall_tick('q', repeat('p',"
                           " 101))", "22001", "dq_uninstall_tick:", "key_prefix"),
    case("ut-hash-empty", "SELECT dq_uninstall_tick('q', 'keep', '')", "22023", "dq_uninstall_tick:", "config_hash"),
    # ---- dq_cron_install: names, payload, zone, lookahead
    case("ci-name-null", "SELECT dq_cron_install(NULL, 'q', '@daily', 'x'::text)", "22004", "dq_cron_install:", "name"),
    case("ci-name-empty", "SELECT dq_cron_install('', 'q', '@daily', 'x'::text)", "22023", "dq_cron_install:", "name"),
    case("ci-name-long", "SELECT dq_cron_install(repeat('n', 101), 'q', '@daily', 'x'::text)", "22001",
         "dq_cron_install:", "name", "limit is 100"),
    case("ci-queue-null", "SELECT dq_cron_install('keep', NULL, '@daily',"
                          " 'x'::text)", "22004", "dq_cron_install:", "queue"),
    case("ci-queue-long", "SELECT dq_cron_install('keep', repeat('q', 101), '@daily', 'x'::text)", "22001",
         "dq_cron_install:", "queue"),
    case("ci-payload-null-bytea", "SELECT dq_cron_install('keep', 'q', '@daily', NULL::bytea)", "22004",
         "dq_cron_install:", "payload"),
    case("ci-payload-null-jsonb", "SELECT dq_cron_install('keep', 'q', '@daily', NULL::jsonb)", "22004",
         "dq_cron_install:", "payload"),
    case("ci-payload-null-untyped", "SELECT dq_cron_install('keep', 'q', '@daily', NULL)", "22004",
         "dq_cron_install:", "payload"),
    case("ci-type-long", "SELECT dq_cron_install('keep', 'q', '@daily', 'x'::text, 'UTC', repeat('t', 101))", "22001",
         "dq_cron_install:", "payload_type"),
    case("ci-zone-null", inst("'@daily'", ", NULL"), "22004", "dq_cron_install:", "timezone"),
    case("ci-zone-bad", inst("'@daily'", ", 'Mars/Olympus'"), "22023", "dq_cron_install:", "timezone", "Mars/Olympus"),
    case("ci-zone-posix", inst("'@daily'", ", 'UTC+3'"), "22023", "dq_cron_install:", "timezone"),
    case("ci-zone-abbrev", inst("'@daily'", ", 'PST'"), "22023", "dq_cron_install:", "timezone"),
    case("ci-lookahead-null", inst("'@daily'", ", 'UTC', NULL, NULL"), "22004", "dq_cron_install:", "lookahead"),
    case("ci-lookahead-zero", inst("'@daily'", ", 'UTC', NULL, interval '0'"), "22023",
         "dq_cron_install:", "lookahead"),
    case("ci-lookahead-huge", inst("'@daily'", ", 'UTC', NULL, interval '400 days'"), "22023",
         "dq_cron_install:", "lookahead", "366 days"),
    # ---- dq_cron_install: schedule syntax
    case("s-null", "SELECT dq_cron_install('keep', 'q', NULL, 'x'::text)", "22004", "dq_cron_install:", "schedule"),
    case("s-long", "SELECT dq_cron_install('keep', 'q', repeat('* ', 501), 'x'::text)", "22001",
         "dq_cron_install:", "schedule", "limit is 1000"),
    case("s-empty", inst("'  '"), "22023", "dq_cron_install:", "schedule", "empty"),
    case("s-4-fields", inst("'* * * *'"), "22023", "dq_cron_install:", "schedule", "4 fields"),
    case("s-6-fields", inst("'0 * * * * *'"), "22023", "dq_cron_install:", "schedule", "6 fields"),
    case("s-minute-range", inst("'60 * * * *'"), "22023", "dq_cron_install:", "schedule", "minute", "0-59"),
    case("s-hour-range", inst("'0 24 * * *'"), "22023", "dq_cron_install:", "schedule", "hour", "0-23"),
    case("s-dom-zero", inst("'0 0 0 * *'"), "22023", "dq_cron_install:", "schedule", "day-of-month", "1-31"),
    case("s-month-13", inst("'0 0 1 13 *'"), "22023", "dq_cron_install:", "schedule", "month", "1-12"),
    case("s-dow-8", inst("'0 0 * * 8'"), "22023", "dq_cron_install:", "schedule", "day-of-week", "0-7"),
    case("s-backwards", inst("'0 5-2 * * *'"), "22023", "dq_cron_install:", "schedule", "hour", "backwards"),
    case("s-step-zero", inst("'*/0 * * * *'"), "22023", "dq_cron_install:", "schedule", "minute", "step"),
    case("s-garbage", inst("'a b c d e'"), "22023", "dq_cron_install:", "schedule", "minute"),
    case("s-bad-name", inst("'0 0 * foo *'"), "22023", "dq_cron_install:", "schedule", "month", "foo"),
    case("s-dow-name-in-month", inst("'0 0 * mon *'"), "22023", "dq_cron_install:", "schedule", "month"),
    case("s-empty-list-item", inst("'0,,5 * * * *'"), "22023", "dq_cron_install:", "schedule", "minute"),
    case("s-macro", inst("'@reboot'"), "22023", "dq_cron_install:", "schedule", "macro"),
    case("s-never", inst("'0 0 30 2 *'"), "22023", "dq_cron_install:", "schedule", "never fires"),
    case("s-every-months", inst("'every 1 month'"), "22023", "dq_cron_install:", "schedule", "months"),
    case("s-every-zero", inst("'every 0 seconds'"), "22023", "dq_cron_install:", "schedule", "positive"),
    case("s-every-negative", inst("'every -5 minutes'"), "22023", "dq_cron_install:", "schedule", "positive"),
    case("s-every-sub-second", inst("'every 0.5 seconds'"), "22023", "dq_cron_install:", "schedule", "1 second"),
    case("s-every-garbage", inst("'every fortnight'"), "22023", "dq_cron_install:", "schedule", "interval"),
    case("s-daily-bad", inst("'daily at 25:00'"), "22023", "dq_cron_install:", "schedule", "daily at"),
    case("s-daily-empty", inst("'daily at 09:00,'"), "22023", "dq_cron_install:", "schedule", "daily at"),
    # ---- uninstall, pause, resume, occurrences
    case("cu-name-null", "SELECT dq_cron_uninstall(NULL)", "22004", "dq_cron_uninstall:", "name"),
    case("cu-name-long", "SELECT dq_cron_uninstall(repeat('n', 101))", "22001", "dq_cron_uninstall:", "name"),
    case("cp-name-empty", "SELECT dq_cron_pause('')", "22023", "dq_cron_pause:", "name"),
    case("cr-name-null", "SELECT dq_cron_resume(NULL)", "22004", "dq_cron_resume:", "name"),
    case("co-schedule-bad", "SELECT * FROM dq_cron_occurrences('61 * * * *')", "22023",
         "dq_cron_occurrences:", "schedule", "minute"),
    # The preview refuses what dq_cron_install refuses, rather than returning no rows.
    case("co-never", "SELECT * FROM dq_cron_occurrences('0 0 30 2 *')", "22023",
         "dq_cron_occurrences:", "schedule", "never fires"),
    case("co-never-window", "SELECT * FROM dq_cron_occurrences('0 0 31 4 *', 'UTC', '2030-01-01', '2031-01-01')",
         "22023", "dq_cron_occurrences:", "schedule", "never fires"),
    case("co-zone-bad", "SELECT * FROM dq_cron_occurrences('@daily', 'Nowhere')", "22023",
         "dq_cron_occurrences:", "timezone"),
    case("co-max-count", "SELECT * FROM dq_cron_occurrences('@daily', 'UTC', now(), 'infinity', 10001)", "22023",
         "dq_cron_occurrences:", "max_count"),
    case("pr-keep-null", "SELECT dq_cron_prune_run_details(NULL)", "22004", "dq_cron_prune_run_details:", "keep"),
    case("pr-keep-negative", "SELECT dq_cron_prune_run_details(interval '-1 day')", "22023",
         "dq_cron_prune_run_details:", "keep", "negative"),
    case("co-after-null", "SELECT * FROM dq_cron_occurrences('@daily', 'UTC', NULL)", "22004",
         "dq_cron_occurrences:", "after"),
    # after within range; until may be 'infinity' but not '-infinity' nor out of range
    case("co-after-minus-infinity", "SELECT * FROM dq_cron_occurrences('@daily', 'UTC', '-infinity')", "22008",
         "dq_cron_occurrences:", "after", "9999-12-30"),
    case("co-after-infinity", "SELECT * FROM dq_cron_occurrences('@daily', 'UTC', 'infinity')", "22008",
         "dq_cron_occurrences:", "after", "9999-12-30"),
    case("co-after-year-10000", "SELECT * FROM dq_cron_occurrences('@daily', 'UTC', '10000-01-01Z')", "22008",
         "dq_cron_occurrences:", "after", "9999-12-30"),
    case("co-until-minus-infinity", "SELECT * FROM dq_cron_occurrences('@daily', 'UTC', now(), '-infinity')",
         "22008", "dq_cron_occurrences:", "until", "9999-12-30"),
    case("co-until-year-10000", "SELECT * FROM dq_cron_occurrences('@daily', 'UTC', now(), '10000-01-01Z')",
         "22008", "dq_cron_occurrences:", "until", "9999-12-30"),
]
# fmt: on


def snapshot(conn: psycopg.Connection[Any]) -> tuple[Any, Any]:
    return table_rows(conn), conn.execute("SELECT * FROM dq_cron ORDER BY name").fetchall()


@pytest.mark.parametrize(("sql", "sqlstate", "contains"), CASES)
def test_bad_input(module_conn, sql, sqlstate, contains):
    module_conn.execute("DELETE FROM dq_cron")
    module_conn.execute("SELECT dq_cron_install('keep', 'q', '*/10 * * * *', 'x'::text)")
    module_conn.execute(r"SELECT dq_install_tick('q', 'other', 'h0', ARRAY['2100-01-01Z']::timestamptz[],"
                        r" ARRAY['\x00']::bytea[])")
    before = snapshot(module_conn)
    with pytest.raises(psycopg.Error) as info:
        module_conn.execute(sql)
    err = info.value
    message = err.diag.message_primary or ""
    assert err.sqlstate == sqlstate, f"{err.sqlstate}: {message}"
    assert message.startswith(contains[0]), message
    for fragment in contains[1:]:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert snapshot(module_conn) == before
    # The error is raised by the function called: its CONTEXT names no internal helper.
    check_context_names_only(err, contains[0].rstrip(":"))


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_prune_run_details_without_pg_cron_is_a_notice_and_zero(module_conn):
    notices: list[str] = []
    module_conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    assert module_conn.execute("SELECT to_regclass('cron.job_run_details')").fetchone() == (None,)
    assert module_conn.execute("SELECT dq_cron_prune_run_details()").fetchone() == (0,)
    assert any("pg_cron is not installed" in n for n in notices), notices


def test_an_empty_window_of_a_schedule_that_fires_is_no_error(module_conn):
    """Only a schedule that never fires is refused: a window without an occurrence is just empty."""
    rows = module_conn.execute(
        "SELECT * FROM dq_cron_occurrences('0 0 29 2 *', 'UTC', '2027-03-01', '2027-12-31')").fetchall()
    assert rows == []
    (first,) = module_conn.execute("SELECT * FROM dq_cron_occurrences('0 0 29 2 *', 'UTC', '2027-03-01', 'infinity', 1)"
                                   ).fetchone()
    assert (first.year, first.month, first.day) == (2028, 2, 29)
