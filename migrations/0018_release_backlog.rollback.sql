-- Rolling back 0018: the children still in the backlog are released here (plain SQL: the functions
-- of sql/ are those of the next apply), then the table and the job go. dq_release_backlog reads the
-- table and cannot work without it: dropped here (the next full apply creates it again, migrate's
-- rule 4). The groups that released children join are queued for a settle (the next poll of their
-- queue applies it, sql/020_groups.sql).
DROP FUNCTION IF EXISTS dq_release_backlog(integer);
WITH gone AS (
    DELETE FROM dq_dependencies d USING dq_release_backlog b
     WHERE d.parent_queue = b.parent_queue AND d.parent_key = b.parent_key
       AND d.child_id > b.after_id AND d.child_id <= b.up_to
    RETURNING d.child_id
), c AS (
    SELECT gone.child_id, count(*)::integer AS n FROM gone GROUP BY gone.child_id
), upd AS (
UPDATE dq_messages m
   SET parents_pending = greatest(m.parents_pending - c.n, 0),
       scheduled_at = CASE WHEN m.parents_pending <= c.n THEN m.release_at ELSE m.scheduled_at END,
       message_group = CASE WHEN m.parents_pending <= c.n THEN m.release_group ELSE m.message_group END,
       release_at = CASE WHEN m.parents_pending <= c.n THEN NULL ELSE m.release_at END,
       release_group = CASE WHEN m.parents_pending <= c.n THEN NULL ELSE m.release_group END
  FROM c
 WHERE m.id = c.child_id AND m.parents_pending > 0
RETURNING m.queue, m.message_group, m.scheduled_at, m.parents_pending = 0 AS released
)
INSERT INTO dq_group_settles (queue, message_group, due_at)
SELECT upd.queue, upd.message_group, min(upd.scheduled_at) FROM upd
 WHERE upd.released AND upd.message_group IS NOT NULL
 GROUP BY upd.queue, upd.message_group;
DROP TABLE IF EXISTS dq_release_backlog;
DO $$
DECLARE
    v_job text := 'dq-release' || CASE WHEN current_schema() = 'public' THEN '' ELSE '@' || current_schema() END;
BEGIN
    -- Nested: cron.job is named only where pg_cron is installed (PL/pgSQL plans a whole condition).
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        IF EXISTS (SELECT 1 FROM cron.job WHERE jobname = v_job) THEN
            PERFORM cron.unschedule(v_job);
        END IF;
    END IF;
END;
$$;
