DROP VIEW IF EXISTS dq_cron_schedules;
DO $$
DECLARE
    v_fn regprocedure;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        PERFORM cron.unschedule(j.jobid) FROM cron.job j
         WHERE j.jobname = 'dq-cron-tick' || CASE WHEN current_schema() = 'public' THEN '' ELSE '@' || current_schema() END;
    END IF;
    -- The schedule functions of sql/ (2x0_cron_*.sql): they need this step's table and type.
    FOR v_fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
                 WHERE p.pronamespace = current_schema()::regnamespace
                   AND (p.proname LIKE 'dq\_cron\_%' OR p.proname LIKE 'dq\_\_cron\_%'
                        OR p.proname IN ('dq_install_tick', 'dq_uninstall_tick'))
    LOOP
        EXECUTE format('DROP FUNCTION %s', v_fn);
    END LOOP;
END;
$$;
DROP TABLE IF EXISTS dq_cron;
DROP TYPE IF EXISTS dq_cron_spec;
