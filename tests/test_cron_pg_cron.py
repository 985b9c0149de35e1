"""The pg_cron job of migration 0005 really fires (marker ``cron``).

pg_cron lives only in the database named by ``cron.database_name`` (``dq`` on the test server);
test databases are clones without it. This test migrates that database (``admin_dsn``), checks
that the job ``dq-cron-tick`` is registered as every minute, installs a schedule whose lookahead
covers only the next occurrence, and waits (pg_cron 1.4, Debian bookworm's package, has no
seconds schedules, so up to about two minutes) until a later occurrence appears that only a
tick could have installed, and ``cron.job_run_details`` shows a succeeded run of the job.
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
        assert job is not None and job[1:] == ("* * * * *", "SELECT dq_cron_tick()", True)
        prune = conn.execute("SELECT schedule, command FROM cron.job WHERE jobname = 'dq-archive-prune'").fetchone()
        assert prune == ("*/10 * * * *", "CALL dq_prune_archive_all()")  # registered by 0006
        jobid = job[0]
        started = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        try:
            conn.execute("SELECT dq_cron_install(%s, %s, 'every 1 minute', 'tick'::text, 'UTC', NULL, '1 minute')",
                         (NAME, NAME))
            first = conn.execute("SELECT max(scheduled_at_initially) FROM dq_messages WHERE queue = %s",
                                 (NAME,)).fetchone()[0]  # type: ignore[index]
            assert first is not None
            deadline = time.monotonic() + 150
            later = ran = None
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
                if later and ran:
                    break
                time.sleep(1)
            assert ran, "no succeeded run of dq-cron-tick in cron.job_run_details"
            assert later, "the job ran but installed no later occurrence"
        finally:
            conn.execute("SELECT dq_cron_uninstall(%s)", (NAME,))
            conn.execute("DELETE FROM dq_messages WHERE queue = %s", (NAME,))
            if job_before is None:
                rollback_0005(admin_dsn)
                assert conn.execute("SELECT 1 FROM cron.job WHERE jobname = 'dq-cron-tick'").fetchone() is None
                assert conn.execute("SELECT 1 FROM cron.job WHERE jobname = 'dq-archive-prune'").fetchone() is None
                assert conn.execute("SELECT to_regclass('dq_cron')").fetchone() == (None,)
