-- 0018: deferred release. An acknowledged parent releases at most dq__limit_release_inline() of its
-- children in its own transaction; the rest is recorded here, one row per acknowledgement, and
-- released in chunks by the next polls (dq_poll_many, of any queue) and by the pg_cron job
-- dq-release (every 10 seconds where pg_cron has seconds schedules, 1.5 and later, else every
-- minute). The dependency rows of the children stay in dq_dependencies until they are released.
-- depends: 0017_dependencies
CREATE TABLE IF NOT EXISTS dq_release_backlog (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    parent_queue  text        NOT NULL,
    parent_key    text        NOT NULL,
    after_id      bigint      NOT NULL,
    up_to         bigint      NOT NULL,
    acked_at      timestamptz NOT NULL,
    CONSTRAINT dq_release_backlog_range CHECK (after_id < up_to)
);
-- The backlog of a parent name (an acknowledgement reads the highest up_to of its parent's name;
-- dq_dependencies shows a child in a range as blocked by a parent 'releasing').
CREATE INDEX IF NOT EXISTS dq_release_backlog_parent_idx ON dq_release_backlog (parent_queue, parent_key, up_to);
COMMENT ON TABLE dq_release_backlog IS
  'Children of acknowledged parents still to be released: the dependency rows of (parent_queue, parent_key) with child ids in (after_id, up_to]. Written by dq_ack and dq_ack_many, emptied by dq_poll_many and dq_release_backlog; do not write this table directly.';
REVOKE ALL ON dq_release_backlog FROM PUBLIC;

-- The job: schema-qualified, named as dq__pg_cron_jobs() of sql/250_cron_pg_cron.sql lists (that
-- function is re-created after this step), with the same rule for seconds schedules as 0014.
DO $$
DECLARE
    v_job     text := 'dq-release' || CASE WHEN current_schema() = 'public' THEN '' ELSE '@' || current_schema() END;
    v_command text := 'SELECT ' || quote_ident(current_schema()) || '.dq_release_backlog(100000)';
    v_version integer[];
BEGIN
    SELECT string_to_array(split_part(extversion, '-', 1), '.')::integer[] INTO v_version
      FROM pg_catalog.pg_extension WHERE extname = 'pg_cron';
    IF v_version IS NULL THEN
        RAISE NOTICE 'pg_cron is not installed in this database: children deferred by an acknowledgement are released by the next polls; schedule % yourself for queues nobody polls (docs/api.md)', v_command;
    ELSE
        PERFORM cron.schedule(v_job, CASE WHEN v_version >= '{1,5}' THEN '10 seconds' ELSE '* * * * *' END, v_command);
    END IF;
END;
$$;
