-- 0006: the stats row type, least-privilege roles, and the archive retention job.
-- depends: 0005_cron

-- dq_queue_stats' row (and the dq_stats view's columns).
CREATE TYPE dq_stats_row AS (
    queue              text,
    ready              bigint,       -- due now (expired locks included: they are delivered again)
    scheduled          bigint,       -- due later, not locked
    in_flight          bigint,       -- locked, lock not expired
    redelivered        bigint,       -- in flight with delivery_count > 1
    dead               bigint,       -- dead letters that died in this queue
    oldest_ready_age   interval,
    next_due           timestamptz,
    acked_last_minute  bigint,       -- from the archive; NULL when the queue does not archive
    acked_last_hour    bigint,
    approximate        boolean       -- a count passed the exact limit and was estimated
);

-- Roles for applications (NOLOGIN: grant them to login roles). Roles belong to the whole server,
-- so they are created only when absent and never dropped by a rollback. What each may call is
-- granted in sql/900_grants.sql; none has any privilege on the tables.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dq_producer') THEN
        CREATE ROLE dq_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dq_consumer') THEN
        CREATE ROLE dq_consumer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dq_admin') THEN
        CREATE ROLE dq_admin NOLOGIN;
    END IF;
END;
$$;

-- No direct access to the tables for anyone but their owner (the functions run as the owner).
REVOKE ALL ON dq_messages, dq_waiters, dq_meta, dq_queues, dq_archive, dq_cron FROM PUBLIC;

-- Retention: prune the archive every 10 minutes, when pg_cron is installed in this database.
-- pg_cron's job names are one per database: the install in public uses the plain name and
-- command, one in another schema suffixes the name with '@<schema>' and qualifies the command (the
-- names dq__pg_cron_jobs() of sql/250_cron_pg_cron.sql lists; that function does not exist yet
-- when this step runs).
DO $$
DECLARE
    v_public boolean := current_schema() = 'public';
    v_job    text := 'dq-archive-prune' || CASE WHEN v_public THEN '' ELSE '@' || current_schema() END;
    v_call   text := CASE WHEN v_public THEN '' ELSE quote_ident(current_schema()) || '.' END || 'dq_prune_archive_all()';
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        PERFORM cron.schedule(v_job, '*/10 * * * *', 'CALL ' || v_call);
    ELSE
        RAISE NOTICE 'pg_cron is not installed in this database: archive retention runs only when you CALL % yourself', v_call;
    END IF;
END;
$$;
