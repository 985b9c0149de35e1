DO $$
BEGIN
    -- Nested: cron.job is named only where pg_cron is installed (PL/pgSQL plans a whole condition).
    IF current_schema() = 'public' AND EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        IF EXISTS (SELECT 1 FROM cron.job WHERE jobname = 'dq-cron-prune-history') THEN
            PERFORM cron.unschedule('dq-cron-prune-history');
        END IF;
    END IF;
END;
$$;
