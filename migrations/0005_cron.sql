-- 0005: named recurring schedules, installed as ordinary delayed messages.
-- depends: 0004_archive

-- One row per named schedule. The functions of sql/2x0_cron_*.sql are the only writers. Occurrences
-- are messages of `queue` keyed '<name>/<config_hash>/<epoch ms>' (one key per occurrence, so
-- installing an occurrence twice offers it once).
-- installed_through / last_installed_at / next_at are the tick's bookkeeping: every occurrence in
-- (first install, installed_through] has been offered, the latest of them is last_installed_at,
-- and next_at is the first occurrence after installed_through ('infinity' when there is none), so
-- dq_cron_tick() skips a schedule with one comparison when it has nothing new to install.
CREATE TABLE IF NOT EXISTS dq_cron (
    name               text        PRIMARY KEY,
    queue              text        NOT NULL,
    schedule           text        NOT NULL,
    timezone           text        NOT NULL,
    payload            bytea       NOT NULL,
    payload_type       text        NOT NULL,
    lookahead          interval    NOT NULL,
    config_hash        text        NOT NULL,
    paused             boolean     NOT NULL DEFAULT false,
    installed_through  timestamptz NULL,
    last_installed_at  timestamptz NULL,
    next_at            timestamptz NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dq_cron_name_length CHECK (char_length(name) BETWEEN 1 AND 100),
    CONSTRAINT dq_cron_queue_length CHECK (char_length(queue) BETWEEN 1 AND 100),
    CONSTRAINT dq_cron_schedule_length CHECK (char_length(schedule) BETWEEN 1 AND 1000),
    CONSTRAINT dq_cron_payload_type_length CHECK (char_length(payload_type) BETWEEN 1 AND 100),
    CONSTRAINT dq_cron_lookahead_range CHECK (lookahead > interval '0' AND lookahead <= interval '366 days')
);
COMMENT ON TABLE dq_cron IS
  'Named recurring schedules (dq_cron_install); their occurrences are messages keyed <name>/<config_hash>/<epoch ms>. Write it only through the dq_cron_* functions.';

-- The parsed form of a schedule (sql/200_cron_parse.sql, dq__cron_parse): kind 'cron' or 'daily' walks
-- matching local days and fires at each time of day in `times`; kind 'every' fires at whole
-- multiples of period_ms milliseconds since the Unix epoch.
CREATE TYPE dq_cron_spec AS (
    kind       text,
    period_ms  bigint,
    months     integer[],
    doms       integer[],
    dows       integer[],
    dom_star   boolean,
    dow_star   boolean,
    times      interval[]
);

-- The pg_cron job that keeps installing occurrences while PostgreSQL runs. pg_cron lives only in
-- the database named by cron.database_name; elsewhere (test clones, other databases) this step
-- only says so. cron.schedule() with a job name replaces a job of that name (pg_cron >= 1.3), so
-- re-running the step does not create a second job.
-- pg_cron's job names are one per database: the install in public uses the plain name and
-- command, one in another schema suffixes the name with '@<schema>' and qualifies the command (the
-- names dq__pg_cron_jobs() of sql/250_cron_pg_cron.sql lists; that function does not exist yet
-- when this step runs).
DO $$
DECLARE
    v_public boolean := current_schema() = 'public';
    v_job    text := 'dq-cron-tick' || CASE WHEN v_public THEN '' ELSE '@' || current_schema() END;
    v_call   text := CASE WHEN v_public THEN '' ELSE quote_ident(current_schema()) || '.' END || 'dq_cron_tick()';
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        PERFORM cron.schedule(v_job, '* * * * *', 'SELECT ' || v_call);
    ELSE
        RAISE NOTICE 'dq 0005_cron: pg_cron is not installed in database %, job % not registered; call % from elsewhere (pyqueue cron tick --every, CronTicker)',
            current_database(), v_job, v_call;
    END IF;
END;
$$;
