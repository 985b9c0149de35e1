"""The pg_cron job of migration 0005 really fires (marker ``cron``).

pg_cron lives only in the database named by ``cron.database_name`` (``dq`` on the test server);
test databases are clones without it. This test migrates that database (``admin_dsn``), checks
that the job ``dq-cron-tick`` is registered as every minute, installs a schedule whose lookahead
covers only the next occurrence, and waits (pg_cron 1.4, Debian bookworm's package, has no
seconds schedules, so up to about two minutes) until a later occurrence appears that only a
tick could have installed, and ``cron.job_run_details`` shows a succeeded run of the job and of
``dq-vacuum`` (migration 0014, the queue table's vacuum).
It removes its schedule and messages afterwards. When the job was not registered before the test,
the test applies migration 0005 itself (rolling back a stale 0005 first) and rolls it back at the
end with its rollback script, which unregisters the job: the database is left as it was found,
and the rollback is exercised too.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from yoyo import get_backend, read_migrations

from pyqueue.migrate import migrate, migrations_dir, yoyo_uri

pytestmark = [pytest.mark.cron, pytest.mark.slow]

NAME = "dq-test-pg-cron"


def rollback_0005(dsn: str) -> None:
    """Roll back 0005 and the schema steps after it (0006 depends on it), newest first."""
    backend = get_backend(yoyo_uri(dsn))
    try:
        migrations = read_migrations(str(migrations_dir())).filter(
            lambda m: m.id >= "0005_cron" and m.id != "9999_sql")
        with backend.lock():
            backend.rollback_migrations(backend.to_rollback(migrations))
    finally:
        backend.connection.close()


def vacuum_schedule(conn: psycopg.Connection) -> str:
    """dq-vacuum's schedule: every 10 seconds from pg_cron 1.5 on, else every minute."""
    version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'").fetchone()[0]  # type: ignore[index]
    major, minor = (int(x) for x in version.split("-")[0].split(".")[:2])
    return "10 seconds" if (major, minor) >= (1, 5) else "* * * * *"


def test_the_pg_cron_job_fires_and_installs_occurrences(admin_dsn):
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_cron'").fetchone() is None:
            pytest.fail("pg_cron is not installed in the test server's cron.database_name database")
        job_before = conn.execute("SELECT jobid FROM cron.job WHERE jobname = 'dq-cron-tick'").fetchone()
        if job_before is None:
            rollback_0005(admin_dsn)  # a 0005 applied without its job: apply it afresh
        migrate(admin_dsn)
        job = conn.execute(
            "SELECT jobid, schedule, command, active FROM cron.job WHERE jobname = 'dq-cron-tick'"
        ).fetchone()
        assert job is not None and job[1:] == ("* * * * *", "SELECT public.dq_cron_tick()", True)
        prune = conn.execute("SELECT schedule, command FROM cron.job WHERE jobname = 'dq-archive-prune'").fetchone()
        assert prune == ("*/10 * * * *", "CALL public.dq_prune_archive_all()")  # registered by 0006, qualified by sql/
        history = conn.execute(
            "SELECT schedule, command FROM cron.job WHERE jobname = 'dq-cron-prune-history'").fetchone()
        assert history == ("17 3 * * *", "SELECT public.dq_cron_prune_run_details()")  # by 0007
        vacuum = conn.execute("SELECT jobid, schedule, command FROM cron.job WHERE jobname = 'dq-vacuum'").fetchone()
        assert vacuum is not None and vacuum[1:] == (  # by 0014; seconds schedules need pg_cron 1.5
            vacuum_schedule(conn), "VACUUM (SKIP_LOCKED) public.dq_messages")
        jobid = job[0]
        started = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        try:
            conn.execute("SELECT dq_cron_install(%s, %s, 'every 1 minute', 'tick'::text, 'UTC', NULL, '1 minute')",
                         (NAME, NAME))
            first = conn.execute("SELECT max(scheduled_at_initially) FROM dq_messages WHERE queue = %s",
                                 (NAME,)).fetchone()[0]  # type: ignore[index]
            assert first is not None
            deadline = time.monotonic() + 150
            later = ran = vacuumed = None
            while time.monotonic() < deadline:
                later = conn.execute(
                    "SELECT count(*) FROM dq_messages WHERE queue = %s AND scheduled_at_initially > %s",
                    (NAME, first),
                ).fetchone()[0]  # type: ignore[index]
                ran = conn.execute(
                    "SELECT count(*) FROM cron.job_run_details WHERE jobid = %s AND status = 'succeeded' "
                    "AND start_time >= %s",
                    (jobid, started),
                ).fetchone()[0]  # type: ignore[index]
                vacuumed = conn.execute(
                    "SELECT count(*) FROM cron.job_run_details WHERE jobid = %s AND status = 'succeeded' "
                    "AND start_time >= %s",
                    (vacuum[0], started),
                ).fetchone()[0]  # type: ignore[index]
                if later and ran and vacuumed:
                    break
                time.sleep(1)
            assert ran, "no succeeded run of dq-cron-tick in cron.job_run_details"
            assert later, "the job ran but installed no later occurrence"
            assert vacuumed, "no succeeded run of dq-vacuum in cron.job_run_details"
        finally:
            conn.execute("SELECT dq_cron_uninstall(%s)", (NAME,))
            conn.execute("DELETE FROM dq_messages WHERE queue = %s", (NAME,))
            if job_before is None:
                rollback_0005(admin_dsn)
                assert conn.execute("SELECT 1 FROM cron.job WHERE jobname = 'dq-cron-tick'").fetchone() is None
                assert conn.execute("SELECT 1 FROM cron.job WHERE jobname = 'dq-archive-prune'").fetchone() is None
                assert conn.execute(
                    "SELECT 1 FROM cron.job WHERE jobname = 'dq-cron-prune-history'").fetchone() is None
                assert conn.execute("SELECT 1 FROM cron.job WHERE jobname = 'dq-vacuum'").fetchone() is None
                assert conn.execute("SELECT to_regclass('dq_cron')").fetchone() == (None,)


def test_run_history_of_our_jobs_is_pruned_and_other_jobs_rows_are_kept(admin_dsn):
    """dq_cron_prune_run_details (run daily by dq-cron-prune-history) bounds cron.job_run_details
    for our jobs: rows older than `keep` go, recent ones and other jobs' rows stay."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        migrate(admin_dsn)
        ours = conn.execute("SELECT jobid FROM cron.job WHERE jobname = 'dq-cron-tick'").fetchone()
        assert ours is not None
        other = conn.execute("SELECT cron.schedule('dq-test-other-job', '0 0 1 1 *', 'SELECT 1')").fetchone()
        assert other is not None
        try:
            def add(jobid: int, end_age: str | None, start_age: str) -> int:
                row = conn.execute(
                    "INSERT INTO cron.job_run_details (jobid, runid, job_pid, database, username, command, status,"
                    " start_time, end_time) VALUES (%s, nextval('cron.runid_seq'), 0, current_database(),"
                    " current_user, 'test', 'succeeded', now() - %s::interval, now() - %s::interval)"
                    " RETURNING runid", (jobid, start_age, end_age)).fetchone()
                assert row is not None
                return int(row[0])

            old = [add(ours[0], "8 days", "8 days"), add(ours[0], None, "9 days")]  # the second never ended
            recent = [add(ours[0], "6 days", "6 days"), add(ours[0], None, "1 hour")]
            foreign = [add(other[0], "30 days", "30 days")]
            deleted = conn.execute("SELECT dq_cron_prune_run_details()").fetchone()
            assert deleted is not None and deleted[0] >= len(old)
            left = {r[0] for r in conn.execute(
                "SELECT runid FROM cron.job_run_details WHERE runid = ANY(%s)", (old + recent + foreign,))}
            assert left == set(recent + foreign)
            # Nothing of ours older than the default 7 days is left.
            assert conn.execute(
                "SELECT count(*) FROM cron.job_run_details d JOIN cron.job j USING (jobid)"
                " WHERE j.jobname LIKE 'dq-%%' AND j.jobname <> 'dq-test-other-job'"
                " AND coalesce(d.end_time, d.start_time) < now() - interval '7 days'").fetchone() == (0,)
        finally:
            conn.execute("DELETE FROM cron.job_run_details WHERE jobid = %s", (other[0],))
            conn.execute("SELECT cron.unschedule('dq-test-other-job')")
            conn.execute("DELETE FROM cron.job_run_details WHERE jobid = %s AND command = 'test'", (ours[0],))
