DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron')
       AND EXISTS (SELECT 1 FROM cron.job WHERE jobname = 'dq-cron-prune-history') THEN
        PERFORM cron.unschedule('dq-cron-prune-history');
    END IF;
END;
$$;
