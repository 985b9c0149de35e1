DO $$
DECLARE
    v_job text := 'dq-vacuum' || CASE WHEN current_schema() = 'public' THEN '' ELSE '@' || current_schema() END;
BEGIN
    -- Nested: cron.job is named only where pg_cron is installed (PL/pgSQL plans a whole condition).
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        IF EXISTS (SELECT 1 FROM cron.job WHERE jobname = v_job) THEN
            PERFORM cron.unschedule(v_job);
        END IF;
    END IF;
END;
$$;
