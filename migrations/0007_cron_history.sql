-- 0007: pg_cron hygiene, the daily prune of our jobs' run history.
-- depends: 0006_operations

-- pg_cron keeps every run of every job in cron.job_run_details forever (pg_cron issue 416).
-- Prune our jobs' rows daily at 03:17 UTC, keeping 7 days, with dq_cron_prune_run_details
-- (sql/200_cron.sql), when pg_cron is installed in this database (the install in schema public
-- only: pg_cron's job names are one per database).
DO $$
BEGIN
    IF current_schema() <> 'public' THEN
        RAISE NOTICE 'installed in schema %: no pg_cron job registered, no job run history to prune', current_schema();
    ELSIF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        PERFORM cron.schedule('dq-cron-prune-history', '17 3 * * *', 'SELECT dq_cron_prune_run_details()');
    ELSE
        RAISE NOTICE 'pg_cron is not installed in this database: no job run history to prune';
    END IF;
END;
$$;
