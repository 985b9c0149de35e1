"""Recurring messages (sql/2*_cron_*.sql, pyqueue/cron.py): evaluation rules, install semantics,
the tick, concurrency with real processes, the Python API, CronTicker and the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from cronhelpers import install
from sqlhelpers import PROJECT, run_workers, table_rows

from pyqueue import cron
from pyqueue.errors import InvalidArgument


def occ(conn: psycopg.Connection[Any], schedule: str, zone: str, after: str, until: str) -> list[str]:
    rows = conn.execute(
        "SELECT to_char(o AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') "
        "FROM dq_cron_occurrences(%s, %s, %s::timestamptz, %s::timestamptz, 10000) o",
        (schedule, zone, after, until),
    ).fetchall()
    return [r[0] for r in rows]


def messages(conn: psycopg.Connection[Any], queue: str) -> list[tuple[str, datetime]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT key, scheduled_at_initially FROM dq_messages WHERE queue = %s ORDER BY scheduled_at_initially, key",
        (queue,),
    )]


def cron_row(conn: psycopg.Connection[Any], name: str) -> tuple[Any, ...] | None:
    return conn.execute("SELECT * FROM dq_cron WHERE name = %s", (name,)).fetchone()


# --------------------------------------------------------------------------- evaluation rules


def test_dst_gap_new_york_fires_once_shifted_by_the_gap(conn):
    # 2021-03-14 02:30 does not exist in New York (02:00 EST -> 03:00 EDT): fires at 03:30 EDT.
    assert occ(conn, "30 2 * * *", "America/New_York", "2021-03-13 00:00Z", "2021-03-16 00:00Z") == [
        "2021-03-13 07:30:00", "2021-03-14 07:30:00", "2021-03-15 06:30:00",
    ]


def test_dst_gap_berlin_fires_once_shifted_by_the_gap(conn):
    # 2021-03-28 02:30 does not exist in Berlin (02:00 CET -> 03:00 CEST): fires at 03:30 CEST = 01:30Z.
    assert occ(conn, "30 2 * * *", "Europe/Berlin", "2021-03-27 00:00Z", "2021-03-30 00:00Z") == [
        "2021-03-27 01:30:00", "2021-03-28 01:30:00", "2021-03-29 00:30:00",
    ]


def test_dst_gap_time_shifted_onto_an_existing_occurrence_is_one_occurrence(conn):
    # 02:30 shifts onto 03:30: one message, not two (one instant, one key).
    assert occ(conn, "30 2,3 * * *", "America/New_York", "2021-03-14 00:00Z", "2021-03-15 00:00Z") == [
        "2021-03-14 07:30:00",
    ]
    # Hourly: 02:00 shifts onto 03:00.
    assert occ(conn, "0 * * * *", "Europe/Berlin", "2021-03-28 00:00Z", "2021-03-28 03:00Z") == [
        "2021-03-28 01:00:00", "2021-03-28 02:00:00", "2021-03-28 03:00:00",
    ]


def test_dst_overlap_new_york_fires_once_at_the_first_instant(conn):
    # 2021-11-07 01:30 happens at 05:30Z (EDT) and 06:30Z (EST): once, at 05:30Z.
    assert occ(conn, "30 1 * * *", "America/New_York", "2021-11-06 00:00Z", "2021-11-09 00:00Z") == [
        "2021-11-06 05:30:00", "2021-11-07 05:30:00", "2021-11-08 06:30:00",
    ]
    # Every half hour: the repeated hour 01:00-01:59 EST has no occurrences of its own.
    assert occ(conn, "0,30 * * * *", "America/New_York", "2021-11-07 04:00Z", "2021-11-07 08:00Z") == [
        "2021-11-07 04:30:00", "2021-11-07 05:00:00", "2021-11-07 05:30:00",
        "2021-11-07 07:00:00", "2021-11-07 07:30:00", "2021-11-07 08:00:00",
    ]


def test_dst_overlap_berlin_fires_once_at_the_first_instant(conn):
    # 2021-10-31 02:30 happens at 00:30Z (CEST) and 01:30Z (CET): once, at 00:30Z.
    assert occ(conn, "30 2 * * *", "Europe/Berlin", "2021-10-30 00:00Z", "2021-11-02 00:00Z") == [
        "2021-10-30 00:30:00", "2021-10-31 00:30:00", "2021-11-01 01:30:00",
    ]
    assert occ(conn, "daily at 02:30:15", "Europe/Berlin", "2021-10-31 00:00Z", "2021-10-31 12:00Z") == [
        "2021-10-31 00:30:15",
    ]


def test_vixie_day_of_month_or_day_of_week(conn):
    # Both restricted: the 13th OR any Friday.
    assert occ(conn, "0 0 13 * fri", "UTC", "2021-01-01Z", "2021-02-01Z") == [
        "2021-01-08 00:00:00", "2021-01-13 00:00:00", "2021-01-15 00:00:00",
        "2021-01-22 00:00:00", "2021-01-29 00:00:00",
    ]
    # A field starting with * counts as unrestricted (Vixie's DOM_STAR): odd days AND Fridays.
    assert occ(conn, "0 0 */2 * 5", "UTC", "2021-01-01Z", "2021-02-01Z") == [
        "2021-01-15 00:00:00", "2021-01-29 00:00:00",
    ]
    # 7 and 0 are Sunday; names work.
    assert occ(conn, "0 12 * jan 7", "UTC", "2021-01-01Z", "2021-01-12Z") == occ(
        conn, "0 12 * 1 sun", "UTC", "2021-01-01Z", "2021-01-12Z"
    ) == ["2021-01-03 12:00:00", "2021-01-10 12:00:00"]


def test_macros(conn):
    assert occ(conn, "@yearly", "UTC", "2021-06-01Z", "2024-01-01Z") == [
        "2022-01-01 00:00:00", "2023-01-01 00:00:00", "2024-01-01 00:00:00",
    ]
    assert occ(conn, "@annually", "UTC", "2021-06-01Z", "2024-01-01Z") == occ(conn, "0 0 1 1 *", "UTC",
                                                                           "2021-06-01Z", "2024-01-01Z")
    assert occ(conn, "@monthly", "UTC", "2021-01-15Z", "2021-03-01Z") == ["2021-02-01 00:00:00", "2021-03-01 00:00:00"]
    assert occ(conn, "@weekly", "UTC", "2021-01-01Z", "2021-01-11Z") == ["2021-01-03 00:00:00", "2021-01-10 00:00:00"]
    assert occ(conn, "@daily", "UTC", "2021-01-01Z", "2021-01-03Z") == ["2021-01-02 00:00:00", "2021-01-03 00:00:00"]
    assert len(occ(conn, "@hourly", "UTC", "2021-01-01Z", "2021-01-02Z")) == 24
    # Feb 29 only: the next one after 2097 is in 2104 (2100 is not a leap year), found by month steps.
    assert occ(conn, "0 0 29 2 *", "UTC", "2097-01-01Z", "2108-03-01Z") == [
        "2104-02-29 00:00:00", "2108-02-29 00:00:00",
    ]


def test_every_15_minutes_is_aligned_to_the_epoch(conn):
    assert occ(conn, "every 15 minutes", "Europe/Berlin", "2021-03-28 00:07:13Z", "2021-03-28 01:00Z") == [
        "2021-03-28 00:15:00", "2021-03-28 00:30:00", "2021-03-28 00:45:00", "2021-03-28 01:00:00",
    ]
    # 7 minutes: multiples of 420 s since 1970-01-01 00:00Z, whatever the zone and start.
    got = occ(conn, "every 7 minutes", "America/New_York", "2021-11-07 05:00Z", "2021-11-07 05:30Z")
    assert got == ["2021-11-07 05:07:00", "2021-11-07 05:14:00", "2021-11-07 05:21:00", "2021-11-07 05:28:00"]
    row = conn.execute("SELECT extract(epoch FROM timestamptz '2021-11-07 05:07Z')::bigint % 420").fetchone()
    assert row == (0,)


def test_daily_at(conn):
    assert occ(conn, "daily at 09:00, 17:30:15", "Europe/Berlin", "2021-03-27Z", "2021-03-29Z") == [
        "2021-03-27 08:00:00", "2021-03-27 16:30:15", "2021-03-28 07:00:00", "2021-03-28 15:30:15",
    ]
    assert occ(conn, "DAILY AT 9:05", "UTC", "2021-01-01Z", "2021-01-02Z") == ["2021-01-01 09:05:00"]


# --------------------------------------------------------------------------- install_tick


P2 = [b"\x01", b"\x02"]


def test_install_tick_keys_idempotence_prefixes_and_hash_replacement(conn):
    t = ["2100-01-01 00:00Z", "2100-01-01 00:01Z"]
    call = "SELECT dq_install_tick(%s, %s, %s, %s::timestamptz[], %s::bytea[], 'bin')"
    assert conn.execute(call, ("q", "a", "h1", t, P2)).fetchone() == (2,)
    assert conn.execute(call, ("q", "a", "h1", t, P2)).fetchone() == (0,)  # idempotent
    conn.execute(call, ("q", "a/b", "h9", t, P2))  # another prefix that starts with 'a/'
    conn.execute(call, ("other", "a", "h8", t, P2))  # same prefix, other queue
    keys = [k for k, _ in messages(conn, "q")]
    assert keys == ["a/b/h9/4102444800000", "a/h1/4102444800000", "a/b/h9/4102444860000", "a/h1/4102444860000"]
    # A new hash replaces the prefix's future messages in that queue only, and not the 'a/b' prefix.
    assert conn.execute(call, ("q", "a", "h2", t[:1], P2[:1])).fetchone() == (1,)
    assert [k for k, _ in messages(conn, "q")] == ["a/b/h9/4102444800000", "a/h2/4102444800000",
                                                   "a/b/h9/4102444860000"]
    assert len(messages(conn, "other")) == 2
    row = conn.execute("SELECT payload, payload_type FROM dq_messages WHERE key = 'a/h2/4102444800000'").fetchone()
    assert row == (b"\x01", "bin")
    assert conn.execute("SELECT dq_uninstall_tick('q', 'a', 'h-other')").fetchone() == (0,)
    assert conn.execute("SELECT dq_uninstall_tick('q', 'a')").fetchone() == (1,)
    assert [k for k, _ in messages(conn, "q")] == ["a/b/h9/4102444800000", "a/b/h9/4102444860000"]


def test_install_tick_never_deletes_due_or_in_flight_messages_and_skips_their_instants(conn):
    past = ["2020-01-01 00:00Z", "2020-01-01 00:01Z"]
    conn.execute("SELECT dq_install_tick('q', 'p', 'old', %s::timestamptz[], ARRAY['\\x00', '\\x00']::bytea[])",
                 (past,))
    polled = conn.execute("SELECT key FROM dq_poll_many('q', 1, interval '1 hour')").fetchall()
    assert polled == [("p/old/1577836800000",)]
    # A new hash offering the same two instants: the in-flight one's instant is skipped, the
    # already-due one stays, and since it stays, the new hash's key for it is a second message
    # only for instants it was asked to install explicitly (callers install future instants).
    created = conn.execute(
        "SELECT dq_install_tick('q', 'p', 'new', %s::timestamptz[], ARRAY['\\x01', '\\x01']::bytea[])", (past,)
    ).fetchone()
    assert created == (1,)
    keys = [k for k, _ in messages(conn, "q")]
    assert sorted(keys) == ["p/new/1577836860000", "p/old/1577836800000", "p/old/1577836860000"]
    assert conn.execute("SELECT dq_uninstall_tick('q', 'p')").fetchone() == (0,)  # nothing future


# --------------------------------------------------------------------------- named schedules


def test_install_and_uninstall_read_only_their_own_prefix_of_the_queue(dsn):
    """dq_install_tick and dq_uninstall_tick find a prefix's messages by a range of the (queue, key)
    index (keys are COLLATE "C", migration 0008), not by reading every future message of the queue:
    with 1,000 schedules in one queue, that made one busy tick take minutes. Measured in rows read
    (pg_stat_xact_user_tables), with 20,000 other messages in the queue."""
    with psycopg.connect(dsn) as c:  # transactions: the xact statistics are per transaction
        c.execute("SELECT count(*) FROM dq_offer_many('q',"
                  " (SELECT array_agg('other/h/' || i) FROM generate_series(1, 20000) i),"
                  " array_fill('\\x00'::bytea, ARRAY[20000]), array_fill(now() + interval '1 day', ARRAY[20000]))")
        c.execute("SELECT dq_install_tick('q', 'mine', 'h0', ARRAY[now() + interval '2 days'], ARRAY['\\x01'::bytea])")
        c.commit()
        c.execute("ANALYZE dq_messages")
        c.commit()
        for call in (
            "SELECT dq_install_tick('q', 'mine', 'h1', ARRAY[now() + interval '3 days', now() + interval '4 days'],"
            " ARRAY['\\x01'::bytea, '\\x02'::bytea])",
            "SELECT dq_uninstall_tick('q', 'mine')",
        ):
            c.execute(call)
            row = c.execute("SELECT seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables"
                            " WHERE relname = 'dq_messages'").fetchone()
            assert row is not None
            seq_read, idx_fetched = row
            assert seq_read == 0 and idx_fetched < 50, (call, row)
            c.commit()
        assert c.execute("SELECT count(*) FROM dq_messages WHERE key LIKE 'mine/%'").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM dq_messages WHERE key LIKE 'other/%'").fetchone() == (20000,)


def test_install_installs_the_lookahead_window_with_keys_name_hash_epoch_ms(conn):
    before = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    # One transaction, so the tick sees the install's instant: in separate ones an occurrence
    # can enter the window between them, and the tick rightly offers it.
    with conn.transaction():
        h = install(conn, "five", "*/5 * * * *", lookahead="2 hours")
        assert len(h) == 16
        msgs = messages(conn, "q")
        assert 23 <= len(msgs) <= 25
        for key, at in msgs:
            name, hash_, ms = key.split("/")
            assert (name, hash_) == ("five", h)
            assert int(ms) == int(at.timestamp() * 1000)
            assert at.minute % 5 == 0 and at.second == 0
        after = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        assert msgs[0][1] > before and msgs[0][1] <= after + timedelta(minutes=5)
        assert msgs[-1][1] <= after + timedelta(hours=2)
        assert conn.execute("SELECT dq_cron_tick()").fetchone() == (0,)


def test_reinstalling_the_same_definition_changes_nothing(conn):
    h1 = install(conn, "j", "*/10 * * * *", "p")
    rows, sched = table_rows(conn), cron_row(conn, "j")
    assert install(conn, "j", "*/10  *  * * *", "p") == h1  # whitespace does not matter
    assert table_rows(conn) == rows
    assert cron_row(conn, "j") == sched


def test_lookahead_is_not_part_of_the_hash(conn):
    h1 = install(conn, "j", "*/10 * * * *", "p", lookahead="1 hour")
    rows = table_rows(conn)
    assert install(conn, "j", "*/10 * * * *", "p", lookahead="3 hours") == h1
    after = table_rows(conn)
    assert after[: len(rows)] == rows  # nothing replaced
    assert len(after) > len(rows)  # more installed


def test_a_changed_definition_replaces_every_future_occurrence(conn):
    h1 = install(conn, "j", "*/10 * * * *", "old")
    h2 = install(conn, "j", "*/10 * * * *", "new")
    assert h1 != h2
    keys = [k for k, _ in messages(conn, "q")]
    assert keys and all(k.split("/")[1] == h2 for k in keys)
    assert {bytes(r[0]) for r in conn.execute("SELECT payload FROM dq_messages")} == {b"new"}
    # Moving to another queue removes the old queue's future messages.
    h3 = install(conn, "j", "*/10 * * * *", "new", queue="q2")
    assert messages(conn, "q") == []
    assert all(k.split("/")[1] == h3 for k, _ in messages(conn, "q2"))


def test_uninstall_removes_the_schedule_and_its_future_messages(conn):
    install(conn, "j", "*/10 * * * *")
    install(conn, "k", "*/10 * * * *")
    n_k = len([1 for k, _ in messages(conn, "q") if k.startswith("k/")])
    assert conn.execute("SELECT dq_cron_uninstall('j')").fetchone() == (True,)
    assert conn.execute("SELECT dq_cron_uninstall('j')").fetchone() == (False,)
    assert cron_row(conn, "j") is None
    assert [k for k, _ in messages(conn, "q") if k.startswith("j/")] == []
    assert len([1 for k, _ in messages(conn, "q") if k.startswith("k/")]) == n_k


def test_pause_and_resume(conn):
    install(conn, "j", "*/10 * * * *")
    assert conn.execute("SELECT dq_cron_pause('j')").fetchone() == (True,)
    assert messages(conn, "q") == []
    assert conn.execute("SELECT dq_cron_tick()").fetchone() == (0,)
    assert messages(conn, "q") == []
    row = conn.execute("SELECT paused, next_occurrences FROM dq_cron_schedules WHERE name = 'j'").fetchone()
    assert row == (True, None)
    # Re-installing a paused schedule keeps it paused.
    install(conn, "j", "*/10 * * * *")
    assert messages(conn, "q") == []
    assert conn.execute("SELECT dq_cron_resume('j')").fetchone() == (True,)
    assert 5 <= len(messages(conn, "q")) <= 7
    assert conn.execute("SELECT dq_cron_pause('nope'), dq_cron_resume('nope')").fetchone() == (False, False)


def test_at_least_the_next_occurrence_is_installed(conn):
    with conn.transaction():  # the tick at the install's instant (see the first install test)
        install(conn, "y", "@yearly", lookahead="1 minute")
        msgs = messages(conn, "q")
        assert len(msgs) == 1
        assert (msgs[0][1].month, msgs[0][1].day, msgs[0][1].hour) == (1, 1, 0)
        assert conn.execute("SELECT dq_cron_tick()").fetchone() == (0,)


@pytest.mark.parametrize("lookahead", ["1 day", "366 days"])
def test_pending_occurrences_per_schedule_are_capped_at_10000(conn, clock, lookahead):
    # every second for a day = 86,400 occurrences (366 days: 31.6 million): a schedule has at most
    # 10,000 pending; the install offers the first 10,000 and each tick only tops the window up to
    # 10,000 after its now(), instead of adding 10,000 more per tick.
    install(conn, "s", "every 1 second", lookahead=lookahead)
    msgs = messages(conn, "q")
    assert len(msgs) == 10000
    first = msgs[0][1]
    for wait in (None, first + timedelta(seconds=1.5), first + timedelta(seconds=3)):
        if wait is not None:
            clock.advance(max(wait - clock.now(), timedelta(0)))  # some occurrences fall due: the tick tops up
        before = len(messages(conn, "q"))
        tick_now, created = conn.execute("SELECT dq_now(), dq_cron_tick()").fetchone()  # type: ignore[misc]
        msgs = messages(conn, "q")
        assert len(msgs) == before + created
        due = sum(1 for _, at in msgs if at <= tick_now)  # counts, not instants: nothing prints now()
        pending = sum(1 for _, at in msgs if at > tick_now)
        assert pending == 10000, (pending, created)
        assert len(msgs) <= 10000 + due
        from_first = msgs[0][1] == first
        assert from_first  # nothing lost at the start, no gap, no repeat
        assert all((b[1] - a[1]) == timedelta(seconds=1) for a, b in zip(msgs, msgs[1:], strict=False))


def test_view_lists_schedules_with_next_occurrences(conn):
    install(conn, "j", "daily at 12:00", zone="Europe/berlin")  # zone names are canonicalised
    row = conn.execute("SELECT timezone, next_occurrences FROM dq_cron_schedules").fetchone()
    assert row is not None and row[0] == "Europe/Berlin"
    assert len(row[1]) == 5
    assert all((b - a) in (timedelta(hours=23), timedelta(hours=24), timedelta(hours=25))
               for a, b in zip(row[1], row[1][1:], strict=False))


# --------------------------------------------------------------------------- concurrency


def _tick_worker(barrier: Any, dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT 1")
        barrier.wait(30)
        total = 0
        for _ in range(3):
            row = c.execute("SELECT dq_cron_tick()").fetchone()
            assert row is not None
            total += int(row[0])
        return total


def test_concurrent_ticks_from_processes_create_every_occurrence_exactly_once(dsn, conn):
    for i in range(8):
        install(conn, f"s{i}", "every 1 minute" if i % 2 else "*/2 * * * *", lookahead="12 hours")
    expected = {
        (k, at) for k, at in conn.execute("SELECT key, scheduled_at_initially FROM dq_messages")
    }
    assert len(expected) > 8 * 300
    # Forget everything the installs did: the schedules now need a full install by the ticks.
    conn.execute("DELETE FROM dq_messages")
    conn.execute("UPDATE dq_cron SET installed_through = NULL, last_installed_at = NULL, next_at = NULL")
    created = run_workers(_tick_worker, [(dsn,)] * 6)
    got = list(conn.execute("SELECT key, scheduled_at_initially FROM dq_messages"))
    assert sum(created) == len(got)
    assert len(set(got)) == len(got)
    # Each schedule's window starts at its tick's now(): the ticks' sets equal the installs' sets
    # except for occurrences that fell due or entered the window in between.
    assert len(got) >= len(expected) - 16 and len(got) <= len(expected) + 16
    per_name: dict[str, int] = {}
    for k, _ in got:
        per_name[k.split("/")[0]] = per_name.get(k.split("/")[0], 0) + 1
    assert sorted(per_name) == [f"s{i}" for i in range(8)]


RACE_PERIODS = {"p1": 1000, "p2": 2000, "p3": 3000, "p1b": 1000}
RACE_LOOKAHEADS = {"p1": "3 seconds", "p2": "5 seconds", "p3": "4 seconds", "p1b": "2 seconds"}


def _tick_or_consume(barrier: Any, dsn: str, role: str) -> Any:
    """The installer installs RACE_PERIODS' schedules once every process is up and returns (its
    dq_now(), messages installed); a ticker calls dq_cron_tick() back to back (0-50 ms apart) and
    logs each tick's dq_now() in race_ticks; a consumer polls and acks what falls due meanwhile (the
    archive keeps what it acked). Both run until the test writes race_stop, and return messages
    created, or acked. The test moves the queue's clock meanwhile."""
    import random

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT 1")
        barrier.wait(30)
        if role == "install":
            with c.transaction():
                started = c.execute("SELECT dq_now()").fetchone()[0]  # type: ignore[index]
                for name, ms in RACE_PERIODS.items():
                    install(c, name, f"every {ms // 1000} seconds", queue="cq", lookahead=RACE_LOOKAHEADS[name])
            installed = c.execute("SELECT count(*) FROM dq_messages WHERE queue = 'cq'").fetchone()[0]  # type: ignore[index]
            return started, installed
        total = 0
        while c.execute("SELECT NOT EXISTS (SELECT FROM race_stop)").fetchone() == (True,):
            if role == "tick":
                row = c.execute("WITH t AS (SELECT dq_cron_tick() AS n) "
                                "INSERT INTO race_ticks SELECT dq_now(), n FROM t RETURNING created").fetchone()
                assert row is not None
                total += int(row[0])
                time.sleep(random.uniform(0, 0.05))
            else:
                tokens = [r[0] for r in c.execute("SELECT lock_token FROM dq_poll_many('cq', 100, '1 minute')")]
                if tokens:
                    row = c.execute("SELECT dq_ack_many(%s::uuid[])", (tokens,)).fetchone()
                    assert row is not None and row[0] == len(tokens)
                    total += len(tokens)
                else:
                    time.sleep(0.05)
        return total


def instants_by_schedule(conn: psycopg.Connection[Any], queue: str) -> dict[str, list[int]]:
    """Epoch milliseconds of every occurrence ever offered to `queue`, live or archived, per name."""
    keys = [r[0] for r in conn.execute(
        "SELECT key FROM dq_messages WHERE queue = %s UNION ALL SELECT key FROM dq_archive WHERE queue = %s",
        (queue, queue))]
    out: dict[str, list[int]] = {}
    for k in keys:
        name, _, ms = k.split("/")
        out.setdefault(name, []).append(int(ms))
    return {n: sorted(v) for n, v in out.items()}


def test_four_connections_ticking_repeatedly_with_consumers_create_every_occurrence_exactly_once(dsn, conn, clock):
    """4 processes call dq_cron_tick() back to back while the test moves the queue's clock 40 times
    by half a second (each step only once a tick has seen the one before, so the windows never move
    by more than a lookahead between ticks however slow the host is) and 2 consumers ack what falls
    due (an occurrence installed again after its ack would show as a duplicate): every occurrence of
    every schedule is offered exactly once, with no gap."""
    conn.execute("SELECT dq_configure_queue('cq', archive => true)")
    conn.execute("CREATE TABLE race_ticks (at timestamptz, created integer)")
    conn.execute("CREATE TABLE race_stop ()")
    periods, lookaheads = RACE_PERIODS, RACE_LOOKAHEADS
    roles = [(dsn, "install")] + [(dsn, "tick")] * 4 + [(dsn, "consume")] * 2
    failed: list[BaseException] = []

    def drive() -> None:
        try:
            deadline = time.monotonic() + 60  # until every process is up and the installer is done
            while not conn.execute("SELECT EXISTS (SELECT FROM dq_cron)").fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the installer did not install"
                time.sleep(0.05)
            for _ in range(40):
                clock.advance(0.5)
                moved = clock.now()
                deadline = time.monotonic() + 60
                while conn.execute("SELECT NOT EXISTS (SELECT FROM race_ticks WHERE at >= %s)",
                                   (moved,)).fetchone() == (True,):
                    assert time.monotonic() < deadline, "no tick for 60 s"
                    time.sleep(0.01)
        except BaseException as e:  # reported by the test below
            failed.append(e)
        finally:
            conn.execute("INSERT INTO race_stop DEFAULT VALUES")

    import threading
    driver = threading.Thread(target=drive)
    driver.start()
    try:
        results = run_workers(_tick_or_consume, roles, timeout=300)
    finally:
        driver.join(120)
    assert failed == []
    ended = conn.execute("SELECT max(at) FROM race_ticks").fetchone()[0]  # type: ignore[index]
    (started, installed), created, acked = results[0], sum(results[1:5]), sum(results[5:])
    assert ended - started >= timedelta(seconds=20)
    assert conn.execute("SELECT sum(created) FROM race_ticks").fetchone() == (created,)
    assert acked > 0 and created > 0
    by_name = instants_by_schedule(conn, "cq")
    assert sorted(by_name) == sorted(periods)
    assert sum(len(v) for v in by_name.values()) == installed + created
    epoch_ms = lambda t: int(t.timestamp() * 1000)  # noqa: E731
    for name, ms in periods.items():
        got = by_name[name]
        assert len(got) == len(set(got)), f"{name}: an occurrence offered twice"
        assert got == list(range(got[0], got[-1] + ms, ms)), f"{name}: a gap"
        assert got[0] <= epoch_ms(started) + ms
        # The ticks kept the window filled: installed up to at least (last tick's now + lookahead) - a period.
        assert got[-1] >= epoch_ms(ended) + int(lookaheads[name].split()[0]) * 1000 - ms
    archived = conn.execute("SELECT count(*) FROM dq_archive WHERE queue = 'cq' AND outcome = 'acked'").fetchone()
    assert archived == (acked,)


def test_a_ticker_outage_shorter_than_the_lookahead_loses_no_occurrence(conn, dsn, clock):
    """Ticks with gaps of 1-3 s (on the queue's clock, which the test moves) for `every 1 second`
    with a 4 s lookahead, and a consumer acking what falls due after each gap: every second from the
    install to the last window is delivered or still queued, exactly once. Then an outage longer than
    the lookahead: the documented limit (docs/cron.md "The tick"): the occurrences that fell in the
    outage beyond the lookahead are not back-filled (none is offered late), and the tick resumes with
    the next one."""
    import random

    conn.execute("SELECT dq_configure_queue('cq', archive => true)")
    install(conn, "o", "every 1 second", queue="cq", lookahead="4 seconds")
    first_now = clock.now()
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as consumer:
        def drain() -> None:
            """Ack everything due on the queue's clock now."""
            while tokens := [r[0] for r in consumer.execute(
                    "SELECT lock_token FROM dq_poll_many('cq', 100, '1 minute')")]:
                consumer.execute("SELECT dq_ack_many(%s::uuid[])", (tokens,))

        gaps = [rng.uniform(1.0, 3.0) for _ in range(5)]
        for gap in gaps:
            clock.advance(gap)  # the ticker is down for `gap` seconds
            drain()
            conn.execute("SELECT dq_cron_tick()")
        last_tick = clock.now()
        drain()
        got = instants_by_schedule(conn, "cq")["o"]
        assert len(got) == len(set(got))
        assert got == list(range(got[0], got[-1] + 1000, 1000)), "an occurrence was lost during an outage"
        assert got[0] <= int(first_now.timestamp() * 1000) + 1000
        assert got[-1] >= int(last_tick.timestamp() * 1000) + 3000
        acked = conn.execute("SELECT count(*) FROM dq_archive WHERE queue = 'cq'").fetchone()[0]  # type: ignore[index]
        assert acked >= sum(gaps) - 2

        # An outage longer than the lookahead: no back-fill.
        installed_until = got[-1]
        clock.advance(6.5)
        drain()
        tick_now = conn.execute("SELECT dq_now(), dq_cron_tick()").fetchone()[0]  # type: ignore[index]
        after = instants_by_schedule(conn, "cq")["o"]
        late = [ms for ms in after if installed_until < ms <= int(tick_now.timestamp() * 1000)]
        assert late == [], "occurrences that fell due during the outage were offered late"
        resumed = [ms for ms in after if ms > installed_until]
        assert resumed and resumed[0] <= int(tick_now.timestamp() * 1000) + 1000
        assert resumed == list(range(resumed[0], resumed[-1] + 1000, 1000))


def _install_worker(barrier: Any, dsn: str, payload: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT 1")
        barrier.wait(30)
        row = c.execute("SELECT dq_cron_install('race', 'q', '*/5 * * * *', %s::text)", (payload,)).fetchone()
        c.execute("SELECT dq_cron_tick()")
        assert row is not None
        return str(row[0])


def test_concurrent_installs_of_one_name_leave_one_definition(dsn, conn):
    hashes = run_workers(_install_worker, [(dsn, f"p{i}") for i in range(5)])
    final = conn.execute("SELECT config_hash FROM dq_cron WHERE name = 'race'").fetchone()
    assert final is not None and final[0] in hashes
    keys = [k for k, _ in messages(conn, "q")]
    assert keys and {k.split("/")[1] for k in keys} == {final[0]}
    instants = [k.split("/")[2] for k in keys]
    assert len(instants) == len(set(instants))


# --------------------------------------------------------------------------- Python API, ticker, CLI


def test_python_api(conn):
    with conn.transaction():  # the tick at the install's instant (see the first install test)
        h = cron.install(conn, "py", "q", "every 10 minutes", {"a": 1}, lookahead=timedelta(hours=1))
        [s] = cron.schedules(conn)
        assert (s.name, s.config_hash, s.payload_type, s.paused) == ("py", h, "json", False)
        assert s.lookahead == timedelta(hours=1)
        assert len(s.next_occurrences) == 5
        assert cron.tick(conn) == 0
    assert cron.pause(conn, "py") and messages(conn, "q") == []
    assert cron.resume(conn, "py") and len(messages(conn, "q")) >= 6
    assert cron.uninstall(conn, "py") and not cron.uninstall(conn, "py")
    got = cron.occurrences(conn, "0 0 * * *", timezone="Europe/Berlin",
                           after=datetime(2021, 1, 1, tzinfo=UTC), max_count=2)
    assert got == [datetime(2021, 1, 1, 23, tzinfo=UTC), datetime(2021, 1, 2, 23, tzinfo=UTC)]
    with pytest.raises(InvalidArgument) as info:
        cron.install(conn, "bad", "q", "61 * * * *", b"x")
    assert info.value.sqlstate == "22023" and "schedule" in str(info.value)


def test_cron_ticker_one_per_database_and_survives_a_lost_connection(dsn, conn):
    install(conn, "t", "every 1 second", lookahead="2 seconds")
    a = cron.CronTicker(dsn, every=0.1, min_backoff=0.05, max_backoff=0.2)
    b = cron.CronTicker(dsn, every=0.1, min_backoff=0.05, max_backoff=0.2)
    a.start()
    deadline = time.monotonic() + 20
    while a.ticks < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    b.start()
    time.sleep(0.5)
    try:
        assert a.holds_lock and not b.holds_lock and b.ticks == 0
        # Cut every ticker connection: the holder loses the lock; one of them takes over.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = 'pyqueue-cron-ticker' AND datname = current_database()")
        deadline = time.monotonic() + 20
        ticks_before = a.ticks + b.ticks
        while (a.ticks + b.ticks) < ticks_before + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.ticks + b.ticks >= ticks_before + 3
        assert a.failures + b.failures >= 1
        assert a.holds_lock != b.holds_lock
    finally:
        a.stop(10)
        b.stop(10)
    assert not a.is_alive() and not b.is_alive()


def cli(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyqueue", "cron", *args, "--dsn", dsn],
                          capture_output=True, text=True, timeout=60, cwd=PROJECT)


def test_cli_install_list_tick_once(dsn, conn):
    out = cli("install", "--name", "c", "--queue", "q", "--schedule", "*/15 * * * *", "--payload", "hi", dsn=dsn)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) == 16
    listed = cli("list", dsn=dsn)
    assert listed.returncode == 0 and '"name": "c"' in listed.stdout
    conn.execute("DELETE FROM dq_messages")
    conn.execute("UPDATE dq_cron SET installed_through = NULL, last_installed_at = NULL, next_at = NULL")
    once = cli("tick", dsn=dsn)
    assert once.returncode == 0, once.stderr
    assert int(once.stdout.strip()) == len(messages(conn, "q")) >= 4
    assert cli("tick", dsn=dsn).stdout.strip() == "0"
    bad = cli("install", "--name", "c", "--queue", "q", "--schedule", "every 1 month", "--payload", "x", dsn=dsn)
    assert bad.returncode == 2 and "22023" in bad.stderr
    assert cli("pause", "--name", "c", dsn=dsn).returncode == 0
    assert cli("resume", "--name", "nope", dsn=dsn).returncode == 1


def test_cli_tick_every_stops_on_sigterm_with_exit_0(dsn, conn):
    install(conn, "e", "every 1 second", lookahead="1 second")
    with subprocess.Popen([sys.executable, "-m", "pyqueue", "cron", "tick", "--dsn", dsn, "--every", "200ms"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT,
                          env=dict(os.environ, PYTHONUNBUFFERED="1")) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            lines = [proc.stdout.readline() for _ in range(3)]  # one line per tick
            assert all(line.strip().isdigit() for line in lines), lines
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
        err = proc.stderr.read()
    assert rc == 0, err
