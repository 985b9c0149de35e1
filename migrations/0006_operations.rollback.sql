DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron')
       AND EXISTS (SELECT 1 FROM cron.job WHERE jobname = 'dq-archive-prune') THEN
        PERFORM cron.unschedule('dq-archive-prune');
    END IF;
END;
$$;
DROP VIEW IF EXISTS dq_stats;
DROP FUNCTION IF EXISTS dq_queue_stats(text);
DROP TYPE IF EXISTS dq_stats_row;
