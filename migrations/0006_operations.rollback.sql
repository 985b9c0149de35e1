DO $$
BEGIN
    -- Nested: cron.job is named only where pg_cron is installed (PL/pgSQL plans a whole condition).
    IF current_schema() = 'public' AND EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        IF EXISTS (SELECT 1 FROM cron.job WHERE jobname = 'dq-archive-prune') THEN
            PERFORM cron.unschedule('dq-archive-prune');
        END IF;
    END IF;
END;
$$;
DROP VIEW IF EXISTS dq_stats;
DROP FUNCTION IF EXISTS dq_queue_stats(text);
DROP TYPE IF EXISTS dq_stats_row;
