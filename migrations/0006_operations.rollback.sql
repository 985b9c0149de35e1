DO $$
DECLARE
    v_job text := 'dq-archive-prune' || CASE WHEN current_schema() = 'public' THEN '' ELSE '@' || current_schema() END;
BEGIN
    -- Nested: cron.job is named only where pg_cron is installed (PL/pgSQL plans a whole condition).
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        IF EXISTS (SELECT 1 FROM cron.job WHERE jobname = v_job) THEN
            PERFORM cron.unschedule(v_job);
        END IF;
    END IF;
END;
$$;
DROP VIEW IF EXISTS dq_stats;
DROP FUNCTION IF EXISTS dq_queue_stats(text);
DROP TYPE IF EXISTS dq_stats_row;
