"""What a dashboard or an exporter reads from SQL: dq_metrics, dq_table_health (the view dq_health)
and the read-only role dq_viewer.

* dq_metrics after a known workload (every state, a dead-letter queue, the delivery controls, the
  archive by outcome) agrees with dq_stats and with the workload.
* A login role holding only dq_viewer reads every figure and may call no function that writes: every
  function of the install schema that it may not execute (read from pg_proc, so a new writer is
  caught) is refused with 42501.
* dq_table_health: the xmin horizon held by another session grows and names it; dead tuples after a
  delete; the index estimate against the real size; this install's pg_cron jobs and a failing one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from installhelpers import VIEWER_READS
from psycopg import errors, sql
from psycopg.rows import dict_row
from sqlhelpers import table_rows

from pyqueue.migrate import migrate

STATS_COLUMNS = ("queue", "ready", "scheduled", "in_flight", "redelivered", "dead", "expired", "held", "paused",
                 "next_due", "acked_last_minute", "acked_last_hour")


def keys_polled(conn: psycopg.Connection[Any], queue: str, n: int = 1) -> dict[str, Any]:
    return dict(conn.execute("SELECT key, lock_token FROM dq_poll_many(%s, %s, '1 hour')", (queue, n)).fetchall())


def metrics(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return {r["queue"]: r for r in cur.execute("SELECT * FROM dq_metrics()")}


def health(conn: psycopg.Connection[Any], **thresholds: Any) -> dict[tuple[str, str | None, str], dict[str, Any]]:
    """dq_table_health(thresholds) by (component, name, figure), read from fresh statistics."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    args = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(sql.Identifier(k), sql.Literal(v)) for k, v in thresholds.items())
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(sql.SQL("SELECT * FROM dq_table_health({})").format(args)).fetchall()
    return {(r["component"], r["name"], r["figure"]): r for r in rows}


def wait_for(read: Callable[[], Any], check: Callable[[Any], bool], limit: float = 15.0) -> Any:
    """``read()`` until ``check`` accepts it (statistics are flushed asynchronously), at most ``limit`` s."""
    deadline = time.monotonic() + limit
    while True:
        value = read()
        if check(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


# --------------------------------------------------------------------------- dq_metrics


def test_dq_metrics_after_a_known_workload_agrees_with_dq_stats(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_configure_queue('w', max_deliveries => 2, dead_letter_queue => 'w.dead', archive => true, "
                 "max_in_flight => 5, rate_limit => 10, rate_period => '1 hour')")
    # The archive: one expired, two acknowledged, one dead letter, one cancelled.
    conn.execute("SELECT dq_offer('w', 'exp', 'x', now() - interval '10 minutes', "
                 "expires_at => now() - interval '1 minute')")
    conn.execute("SELECT dq_offer('w', 'poison', 'x', now() - interval '5 minutes')")
    conn.execute("SELECT dq_offer('w', 'a1', 'x', now() - interval '4 minutes'), "
                 "dq_offer('w', 'a2', 'x', now() - interval '4 minutes')")
    polled = keys_polled(conn, "w", 3)  # removes exp (expired, it took a place of the batch) and delivers two
    polled |= keys_polled(conn, "w", 1)
    assert set(polled) == {"poison", "a1", "a2"}
    conn.execute("SELECT dq_ack(%s), dq_ack(%s)", (polled["a1"], polled["a2"]))
    conn.execute("SELECT dq_nack(%s)", (polled["poison"],))
    conn.execute("SELECT dq_nack(%s)", (keys_polled(conn, "w")["poison"],))  # second delivery fails too
    assert keys_polled(conn, "w") == {}  # the third poll moves it to w.dead
    conn.execute("SELECT dq_offer('w', 'c1', 'x')")
    conn.execute("SELECT dq_cancel('w', 'c1')")
    # Live: r1 in flight for the second time; r2, x (expired), g1 and g2 (held behind g1) due; s later.
    conn.execute("SELECT dq_offer('w', 'r1', 'x', now() - interval '3 minutes')")
    conn.execute("SELECT dq_nack(%s)", (keys_polled(conn, "w")["r1"],))
    assert set(keys_polled(conn, "w")) == {"r1"}
    conn.execute("SELECT dq_offer('w', 'r2', 'x', now() - interval '2 minutes')")
    conn.execute("SELECT dq_offer('w', 'x', 'x', now() - interval '1 minute', "
                 "expires_at => now() - interval '1 second')")
    conn.execute("SELECT dq_offer('w', 'g1', 'x', now() - interval '2 minutes', message_group => 'g'), "
                 "dq_offer('w', 'g2', 'x', now() - interval '2 minutes', message_group => 'g')")
    conn.execute("SELECT dq_offer('w', 's', 'x', now() + interval '1 hour')")
    conn.execute("SELECT dq_pause_queue('p')")

    got = metrics(conn)
    with conn.cursor(row_factory=dict_row) as cur:
        stats = {r["queue"]: r for r in cur.execute("SELECT * FROM dq_stats")}
    assert list(got) == sorted(stats) == ["p", "w", "w.dead"]
    for queue, row in stats.items():
        assert {c: got[queue][c] for c in STATS_COLUMNS} == {c: row[c] for c in STATS_COLUMNS}, queue
        age = row["oldest_ready_age"]
        # Two statements, two instants of the clock.
        expected_age = None if age is None else pytest.approx(age.total_seconds(), abs=5)
        assert got[queue]["oldest_ready_age_seconds"] == expected_age
        assert got[queue]["approximate"] is row["approximate"] is False
    w = got["w"]
    counts = ("ready", "scheduled", "in_flight", "redelivered", "dead", "expired", "held", "paused")
    assert {c: w[c] for c in counts} == {
        "ready": 4, "scheduled": 1, "in_flight": 1, "redelivered": 1, "dead": 1, "expired": 1, "held": 1,
        "paused": False}
    assert w["oldest_ready_age_seconds"] >= 120
    assert (w["is_dead_letter_queue"], w["max_in_flight"], w["rate_limit"], w["rate_limit_period_seconds"]) == (
        False, 5, 10, 3600.0)
    assert w["rate_limit_used"] == 6  # deliveries: poison twice, a1, a2, r1 twice
    assert (w["archive"], w["acked_last_minute"], w["acked_last_hour"]) == (True, 2, 2)
    assert (w["archived_acked"], w["archived_dead"], w["archived_cancelled"], w["archived_expired"]) == (2, 1, 1, 1)
    dead = got["w.dead"]
    assert (dead["is_dead_letter_queue"], dead["ready"], dead["archive"], dead["archived_acked"]) == (
        True, 1, False, None)
    assert (dead["max_in_flight"], dead["rate_limit"], dead["rate_limit_used"]) == (None, None, None)
    assert got["p"]["paused"] is True and got["p"]["ready"] == 0


def test_dq_metrics_archive_counts_past_the_exact_limit_are_estimated(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT dq_configure_queue('big', archive => true)")
    conn.execute(
        "INSERT INTO dq_archive (id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, "
        "created_at, delivery_count, outcome, acked_at) "
        "SELECT g, 'big', 'k' || g, 'x', 'bytes', now(), now(), now(), 1, "
        "       CASE WHEN g % 4 = 0 THEN 'dead' ELSE 'acked' END, now() - interval '2 hours' + g * interval '1 ms' "
        "  FROM generate_series(1, 40000) g")
    conn.execute("ANALYZE dq_archive")
    row = metrics(conn)["big"]
    assert row["approximate"] is True
    assert row["archived_acked"] == pytest.approx(30000, rel=0.05)
    assert row["archived_dead"] == pytest.approx(10000, rel=0.05)
    assert (row["archived_cancelled"], row["archived_expired"]) == (0, 0)


# --------------------------------------------------------------------------- dq_viewer


def test_a_viewer_reads_every_figure_and_may_change_nothing(conn: psycopg.Connection[Any],
                                                            login: Callable[[str], str]) -> None:
    conn.execute("SELECT dq_configure_queue('v', 1, 'v.dead')")
    conn.execute("SELECT dq_offer('v', 'k', 'x', now() - interval '1 minute')")
    conn.execute("SELECT dq_nack(%s)", (keys_polled(conn, "v")["k"],))
    assert keys_polled(conn, "v") == {}  # k is a dead letter in v.dead
    conn.execute("SELECT dq_offer('v', 'live', 'x')")
    conn.execute("SELECT dq_cron_install('nightly', 'v', 'daily at 03:00', 'x'::text)")
    before = table_rows(conn)
    with psycopg.connect(login("dq_viewer"), autocommit=True) as viewer:
        assert [r[0] for r in viewer.execute("SELECT queue FROM dq_metrics()")] == ["v", "v.dead"]
        assert viewer.execute("SELECT count(*) FROM dq_health WHERE component = 'table'").fetchone()[0] == 35
        assert viewer.execute("SELECT queue, ready FROM dq_stats").fetchall() == [("v", 1), ("v.dead", 1)]
        assert viewer.execute("SELECT ready FROM dq_queue_stats('v')").fetchone() == (1,)
        assert ("live",) in viewer.execute("SELECT key FROM dq_list_messages('v')").fetchall()
        assert viewer.execute("SELECT key FROM dq_dead_letters('v.dead')").fetchall() == [("k",)]
        assert viewer.execute("SELECT key FROM dq_get('v', 'live')").fetchall() == [("live",)]
        assert viewer.execute("SELECT dq_next_due('v') IS NOT NULL").fetchone() == (True,)
        assert viewer.execute("SELECT name FROM dq_cron_list()").fetchall() == [("nightly",)]
        assert viewer.execute("SELECT name FROM dq_cron_schedules").fetchall() == [("nightly",)]
        assert len(viewer.execute("SELECT * FROM dq_cron_occurrences('every 1 minute')").fetchall()) == 10
        # The web console's reads (sql/168_console.sql).
        assert viewer.execute("SELECT key, state FROM dq_browse_messages('v', 'ready')").fetchall() == [
            ("live", "ready")]
        assert viewer.execute("SELECT key, state, dead_from FROM dq_browse_messages('v.dead', 'dead')").fetchall() == [
            ("k", "dead", "v")]
        (dead_id,) = viewer.execute("SELECT id FROM dq_browse_messages('v.dead')").fetchone()
        assert viewer.execute("SELECT key, payload FROM dq_message_detail('v.dead', %s)", (dead_id,)).fetchall() == [
            ("k", b"x")]
        assert viewer.execute("SELECT dead_from, messages FROM dq_dead_letter_groups('v.dead')").fetchall() == [
            ("v", 1)]
        assert viewer.execute("SELECT dq_count_dead_letters('v.dead')").fetchone() == (1,)
        assert viewer.execute("SELECT max_deliveries, dead_letter_queue FROM dq_queue_config('v')").fetchone() == (
            1, "v.dead")
        assert viewer.execute("SELECT count(*) FROM dq_throughput('v')").fetchone() == (0,)  # v does not archive
        assert viewer.execute("SELECT count(*) FROM dq_audit_entries()").fetchone() == (0,)

        functions = conn.execute(
            r"SELECT p.oid::regprocedure::text, p.proname, p.prokind, "
            r"       array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t), "
            r"       has_function_privilege('dq_viewer', p.oid, 'EXECUTE') "
            r"  FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'dq\_%' "
            r" ORDER BY 1").fetchall()
        assert {name for _, name, _, _, may in functions if may} == VIEWER_READS
        refused = []
        for signature, name, kind, types, may in functions:
            if may:
                continue
            if kind == "p":
                call = f"CALL {name}({', '.join(f'NULL::{t}' for t in types)})"
            else:  # arguments from a materialized CTE: a STRICT function is not folded to NULL before the check
                columns = ", ".join(f"NULL::{t} AS a{i}" for i, t in enumerate(types)) or "1"
                names = ", ".join(f"a{i}" for i in range(len(types)))
                call = f"WITH args AS MATERIALIZED (SELECT {columns}) SELECT {name}({names}) FROM args"  # noqa: S608
            with pytest.raises(errors.InsufficientPrivilege):
                viewer.execute(call)  # type: ignore[arg-type]
            refused.append(signature)
        # The writers are among them (the list comes from pg_proc, so a new one is called too).
        assert {"dq_offer", "dq_offer_many", "dq_poll_many", "dq_ack", "dq_nack", "dq_extend", "dq_cancel",
                "dq_configure_queue", "dq_pause_queue", "dq_purge", "dq_redrive", "dq_release_locks",
                "dq_cron_install", "dq_cron_pause", "dq_cron_tick", "dq_install_tick",
                "dq_prune_archive_all", "dq_wait", "dq_redrive_messages", "dq_redrive_matching", "dq_make_due",
                "dq_audit"} <= {s.split("(")[0] for s in refused}
    assert table_rows(conn) == before


# --------------------------------------------------------------------------- dq_table_health


@pytest.mark.parametrize("hold", ["REPEATABLE READ snapshot", "transaction id"])
def test_health_the_xmin_horizon_held_by_another_session_grows_and_names_it(
        dsn: str, conn: psycopg.Connection[Any], hold: str) -> None:
    with psycopg.connect(dsn, application_name="holder") as holder:
        if hold == "REPEATABLE READ snapshot":
            holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            holder.execute("SELECT count(*) FROM dq_messages")
        else:
            holder.execute("SELECT txid_current()")
        pid = holder.info.backend_pid
        conn.execute("SELECT txid_current()")  # a newer transaction: the holder's is at least 1 older
        first = health(conn)[("xmin_horizon", None, "age_seconds")]
        time.sleep(1.5)
        rows = health(conn)
        later = rows[("xmin_horizon", None, "age_seconds")]
        assert later["value"] >= first["value"] + 1.0
        assert f"pid {pid} (idle in transaction, application_name 'holder', client backend)" in later["shown"]
        assert later["status"] == "ok" and later["advice"] is None  # the default threshold is 5 minutes
        assert rows[("xmin_horizon", None, "age_transactions")]["value"] >= 1
        warned = health(conn, xmin_horizon_age="1 second")[("xmin_horizon", None, "age_seconds")]
        assert warned["status"] == "warning" and "pg_terminate_backend" in warned["advice"]
    released = health(conn)[("xmin_horizon", None, "age_seconds")]
    assert f"pid {pid} " not in released["shown"]


def test_health_dead_tuples_grow_after_a_delete_and_vacuum_clears_them(conn: psycopg.Connection[Any]) -> None:
    conn.execute("ALTER TABLE dq_messages SET (autovacuum_enabled = false)")  # this test's database only
    conn.execute("INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially) "
                 "SELECT 'd', 'k' || g, 'x', 'bytes', now(), now() FROM generate_series(1, 5000) g")
    conn.execute("DELETE FROM dq_messages WHERE queue = 'd'")
    conn.execute("SELECT pg_stat_force_next_flush()")

    def dead() -> dict[tuple[str, str | None, str], dict[str, Any]]:
        return health(conn, dead_tuples=1000)

    rows = wait_for(dead, lambda r: r[("table", "dq_messages", "dead_tuples")]["value"] >= 5000)
    assert rows[("table", "dq_messages", "dead_tuples")]["value"] >= 5000
    assert rows[("table", "dq_messages", "dead_tuples")]["status"] == "warning"
    assert rows[("table", "dq_messages", "dead_tuple_ratio")]["value"] > 0.9
    assert rows[("table", "dq_messages", "dead_tuple_ratio")]["status"] == "warning"
    assert rows[("table", "dq_messages", "last_vacuum_timestamp_seconds")]["status"] == "warning"
    autovacuum = rows[("table", "dq_messages", "last_autovacuum_timestamp_seconds")]
    assert autovacuum["status"] == "warning" and "autovacuum_enabled" in autovacuum["advice"]
    assert rows[("table", "dq_groups", "dead_tuples")]["status"] == "ok"

    conn.execute("VACUUM dq_messages")
    conn.execute("SELECT pg_stat_force_next_flush()")
    rows = wait_for(dead, lambda r: r[("table", "dq_messages", "dead_tuples")]["value"] == 0)
    assert rows[("table", "dq_messages", "dead_tuples")]["value"] == 0
    vacuumed = rows[("table", "dq_messages", "last_vacuum_timestamp_seconds")]
    assert vacuumed["value"] is not None and vacuumed["status"] == "ok"
    assert conn.execute("SELECT %s <= extract(epoch FROM clock_timestamp())",
                        (vacuumed["value"],)).fetchone() == (True,)


def test_health_index_estimate_stays_below_the_size_and_shows_bloat(conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO dq_messages (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially) "
                 "SELECT 'i' || (g % 3), 'key-' || g, 'x', 'bytes', now() + g * interval '1 second', now() "
                 "  FROM generate_series(1, 60000) g")
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # the insert reaches the statistics before ANALYZE sets them
    conn.execute("ANALYZE dq_messages")
    conn.execute("REINDEX TABLE dq_messages")  # as small as these entries make them
    packed = health(conn)
    indexes = {name for component, name, _ in packed if component == "index" and name.startswith("dq_messages")}
    assert len(indexes) == 9
    for index in indexes:
        size = packed[("index", index, "size_bytes")]["value"]
        estimate = packed[("index", index, "estimated_minimum_bytes")]["value"]
        assert estimate <= size, index
    for index in ("dq_messages_pkey", "dq_messages_queue_key_key", "dq_messages_ready_idx"):  # the big ones
        size = packed[("index", index, "size_bytes")]["value"]
        assert packed[("index", index, "estimated_minimum_bytes")]["value"] >= 0.6 * size, index

    conn.execute("DELETE FROM dq_messages WHERE id % 10 <> 0")  # the indexes keep their size
    conn.execute("SELECT pg_stat_force_next_flush()")
    bloated = wait_for(lambda: health(conn),  # until the delete reaches the statistics
                       lambda r: r[("table", "dq_messages", "live_tuples")]["value"] == 6000)
    assert bloated[("table", "dq_messages", "live_tuples")]["value"] == 6000
    for index in ("dq_messages_pkey", "dq_messages_queue_key_key", "dq_messages_ready_idx"):
        size = bloated[("index", index, "size_bytes")]["value"]
        assert size >= packed[("index", index, "size_bytes")]["value"]
        assert bloated[("index", index, "estimated_minimum_bytes")]["value"] <= 0.2 * size, index
        assert bloated[("index", index, "size_bytes")]["status"] == "ok"  # under 16 MB over: no warning


def test_health_refuses_bad_thresholds(conn: psycopg.Connection[Any]) -> None:
    cases = [
        ("xmin_horizon_age => NULL", "22004"), ("xmin_horizon_age => '-1 s'", "22023"),
        ("dead_tuples => -1", "22023"), ("dead_tuple_ratio => 1.5", "22023"),
        ("vacuum_age => NULL", "22004"), ("index_bloat_ratio => 0.5", "22023"),
    ]
    for args, sqlstate in cases:
        with pytest.raises(psycopg.Error) as raised:
            conn.execute(f"SELECT * FROM dq_table_health({args})")  # type: ignore[arg-type]  # noqa: S608 (constants)
        assert raised.value.sqlstate == sqlstate, args
        assert str(raised.value).startswith("dq_table_health: ") or sqlstate == "22004", args


def test_health_has_no_cron_rows_without_pg_cron(conn: psycopg.Connection[Any]) -> None:
    assert conn.execute("SELECT to_regclass('cron.job')").fetchone() == (None,)
    assert conn.execute("SELECT count(*) FROM dq_health WHERE component = 'cron_job'").fetchone() == (0,)


@pytest.mark.cron
@pytest.mark.slow
def test_health_shows_this_installs_pg_cron_jobs_and_a_failing_one(admin_dsn: str) -> None:
    """In the database where pg_cron lives (test databases are clones without it): the jobs, then
    dq-cron-prune-history made to fail every minute (pg_cron 1.4 has no seconds schedules)."""
    migrate(admin_dsn)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = health(conn)
        jobs = {name for component, name, _ in rows if component == "cron_job"}
        assert {"dq-cron-tick", "dq-vacuum", "dq-archive-prune", "dq-cron-prune-history"} <= jobs
        for job in jobs:
            assert {f for c, n, f in rows if (c, n) == ("cron_job", job)} == {
                "last_start_timestamp_seconds", "last_run_failed", "failures_last_hour"}
        jobid, schedule, command = conn.execute(
            "SELECT jobid, schedule, command FROM cron.job WHERE jobname = 'dq-cron-prune-history'").fetchone()
        started = conn.execute("SELECT now()").fetchone()[0]
        conn.execute("SELECT cron.alter_job(%s, schedule => '* * * * *', command => 'SELECT 1/0')", (jobid,))
        try:
            failed = wait_for(
                lambda: conn.execute("SELECT count(*) FROM cron.job_run_details WHERE jobid = %s AND status = 'failed' "
                                     "AND start_time > %s", (jobid, started)).fetchone()[0],
                lambda n: n > 0, limit=150)
            assert failed > 0, "pg_cron did not run the job within 150 s"
            rows = health(conn)
            last = rows[("cron_job", "dq-cron-prune-history", "last_run_failed")]
            assert (last["value"], last["status"]) == (1, "warning")
            assert last["shown"].startswith("failed: ") and "division by zero" in last["shown"]
            failures = rows[("cron_job", "dq-cron-prune-history", "failures_last_hour")]
            assert failures["value"] >= 1 and failures["status"] == "warning"
            start = rows[("cron_job", "dq-cron-prune-history", "last_start_timestamp_seconds")]
            assert start["value"] >= started.timestamp()
        finally:
            conn.execute("SELECT cron.alter_job(%s, schedule => %s, command => %s)", (jobid, schedule, command))
            conn.execute("DELETE FROM cron.job_run_details WHERE jobid = %s AND start_time >= %s", (jobid, started))
