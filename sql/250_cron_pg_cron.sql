-- Recurring messages, part 6: pg_cron, when it is installed in this database.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- The pg_cron jobs of this install: name, schedule and command. An install in public keeps the
-- names of earlier releases (a deploy finds its jobs by name); an install in another schema
-- suffixes the names with '@<schema>', so two installs in one database have a job each
-- (cron.schedule with an existing name replaces that job). Every command is schema-qualified, so
-- each job calls its own install's function whatever the search_path pg_cron runs it with: pg_cron
-- runs a job as its owner (the installing role) with the database's default search_path
-- ("$user", public), and a role that may create a schema in the database (its owner) could
-- otherwise plant a function named like ours in a schema named after the installing role.
-- dq-vacuum (migration 0014) runs every 10 seconds where pg_cron has seconds schedules (1.5 and
-- later), else every minute: the rule of that step, which runs before this function exists.
CREATE OR REPLACE FUNCTION dq__pg_cron_jobs()
RETURNS TABLE (jobname text, schedule text, command text)
LANGUAGE sql STABLE PARALLEL SAFE SET search_path FROM CURRENT
AS $$
    SELECT j.base || CASE WHEN dq__schema() = 'public' THEN '' ELSE '@' || dq__schema() END,
           j.schedule,
           format(j.command, quote_ident(dq__schema()) || '.')
      FROM (VALUES ('dq-cron-tick', '* * * * *', 'SELECT %sdq_cron_tick()'),
                   ('dq-archive-prune', '*/10 * * * *', 'CALL %sdq_prune_archive_all()'),
                   ('dq-cron-prune-history', '17 3 * * *', 'SELECT %sdq_cron_prune_run_details()'),
                   ('dq-vacuum',
                    CASE WHEN (SELECT string_to_array(split_part(e.extversion, '-', 1), '.')::integer[]
                                 FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_cron') >= '{1,5}'
                         THEN '10 seconds' ELSE '* * * * *' END,
                    'VACUUM (SKIP_LOCKED) %sdq_messages'),
                   -- dq-release (migration 0018): children left to the release backlog, as dq-vacuum.
                   ('dq-release',
                    CASE WHEN (SELECT string_to_array(split_part(e.extversion, '-', 1), '.')::integer[]
                                 FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_cron') >= '{1,5}'
                         THEN '10 seconds' ELSE '* * * * *' END,
                    'SELECT %sdq_release_backlog(100000)'))
           AS j(base, schedule, command)
$$;
COMMENT ON FUNCTION dq__pg_cron_jobs() IS 'Internal: the pg_cron jobs of this install (jobname, schedule, command): dq-cron-tick, dq-archive-prune, dq-cron-prune-history, dq-vacuum and dq-release, suffixed with @<schema> outside public, calling schema-qualified functions and tables.';
REVOKE ALL ON FUNCTION dq__pg_cron_jobs() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- The jobs registered by earlier releases (migrations 0005-0007) in public call unqualified
-- functions; they are given the qualified command of dq__pg_cron_jobs(), keeping their schedule
-- (cron.schedule with an existing job name of the same role replaces its schedule and command). A
-- command an operator changed is left alone.
DO $$
DECLARE
    v_job record;
BEGIN
    IF pg_catalog.to_regclass('cron.job') IS NULL THEN
        RETURN;
    END IF;
    FOR v_job IN SELECT j.jobname, j.schedule, o.command
                   FROM cron.job j JOIN dq__pg_cron_jobs() o ON o.jobname = j.jobname
                  WHERE j.username = current_user AND j.database = pg_catalog.current_database()
                    AND j.command <> o.command
                    AND j.command = pg_catalog.replace(o.command, pg_catalog.quote_ident(dq__schema()) || '.', '')
                  ORDER BY j.jobname
    LOOP
        PERFORM cron.schedule(v_job.jobname, v_job.schedule, v_job.command);
    END LOOP;
END;
$$;

-- pg_cron hygiene. pg_cron writes one cron.job_run_details row per run and never deletes any
-- (github.com/citusdata/pg_cron/issues/416; "cron.log_run" turns logging off server-wide, losing
-- the record of failures). dq-cron-tick alone adds 1,440 rows a day. This deletes the rows of this
-- install's jobs (dq__pg_cron_jobs) that ended more than `keep` ago; other jobs' rows are left
-- alone. The job dq-cron-prune-history runs it daily, so our jobs keep at most `keep` of history
-- (about 10,300 rows at 7 days).
-- Rows of a run that never ended (the server stopped mid-run) count from their start_time.
-- Safe to run concurrently: two runs delete disjoint or already-deleted rows (a DELETE skips rows
-- deleted by a concurrent committed transaction under READ COMMITTED). SECURITY DEFINER (as the
-- migrating role, owner of the jobs: pg_cron's row security shows a role its own runs).
CREATE OR REPLACE FUNCTION dq_cron_prune_run_details(keep interval DEFAULT '7 days')
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    v_error    jsonb;
    v_count bigint;
BEGIN
    v_error := CASE WHEN keep IS NULL THEN dq__null_error('dq_cron_prune_run_details', 'keep')
                    WHEN keep < interval '0'
                    THEN dq__error('22023', format('dq_cron_prune_run_details: keep is %s, it must not be negative', keep)) END;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    IF to_regclass('cron.job_run_details') IS NULL THEN
        RAISE NOTICE 'dq_cron_prune_run_details: pg_cron is not installed in this database; nothing to prune';
        RETURN 0;
    END IF;
    DELETE FROM cron.job_run_details d
     USING cron.job j
     WHERE d.jobid = j.jobid
       AND j.jobname IN (SELECT o.jobname FROM dq__pg_cron_jobs() o)
       AND coalesce(d.end_time, d.start_time) < dq__now() - keep;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_cron_prune_run_details(interval) IS 'dq_cron_prune_run_details(keep interval default 7 days) -> bigint: deletes the cron.job_run_details rows of this install''s pg_cron jobs that ended more than keep ago, and returns how many. Errors: 22004 keep NULL, 22023 keep negative.';
REVOKE ALL ON FUNCTION dq_cron_prune_run_details(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_prune_run_details(interval) TO dq_admin;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
