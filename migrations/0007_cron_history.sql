-- 0007: pg_cron hygiene, the daily prune of our jobs' run history.
-- depends: 0006_operations

-- pg_cron keeps every run of every job in cron.job_run_details forever (pg_cron issue 416).
-- Prune our jobs' rows daily at 03:17 UTC, keeping 7 days, with dq_cron_prune_run_details
-- (sql/250_cron_pg_cron.sql), when pg_cron is installed in this database.
-- pg_cron's job names are one per database: the install in public uses the plain name and
-- command, one in another schema suffixes the name with '@<schema>' and qualifies the command (the
-- names dq__pg_cron_jobs() of sql/250_cron_pg_cron.sql lists; that function does not exist yet
-- when this step runs).
DO $$
DECLARE
    v_public boolean := current_schema() = 'public';
    v_job    text := 'dq-cron-prune-history' || CASE WHEN v_public THEN '' ELSE '@' || current_schema() END;
    v_call   text := CASE WHEN v_public THEN '' ELSE quote_ident(current_schema()) || '.' END || 'dq_cron_prune_run_details()';
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        PERFORM cron.schedule(v_job, '17 3 * * *', 'SELECT ' || v_call);
    ELSE
        RAISE NOTICE 'pg_cron is not installed in this database: no job run history to prune';
    END IF;
END;
$$;
