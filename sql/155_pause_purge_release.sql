-- Operator actions on a queue: pause and resume, purge, releasing locks. Each says what it changed
-- with a NOTICE.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- Pause and resume. A paused queue delivers nothing (dq_poll_many and dq_poll_or_wait return no
-- message); offers, acks, nacks, extends, cancels and schedules work as usual, and messages in
-- flight keep their locks. Waiting consumers sleep through the pause (dq_wait does not let offers
-- wake them) and are woken by dq_resume_queue at once.
-- Concurrency: one INSERT .. ON CONFLICT DO UPDATE of the queue's configuration row. A poll that
-- read the row before the pause committed may still deliver its batch.
CREATE OR REPLACE FUNCTION dq_pause_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_was boolean;
BEGIN
    v_error := dq__name_error('dq_pause_queue', 'queue', dq_pause_queue.queue, dq__limit_queue_chars());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    SELECT q.paused INTO v_was FROM dq_queues q WHERE q.queue = dq_pause_queue.queue FOR NO KEY UPDATE;
    INSERT INTO dq_queues AS q (queue, paused, updated_at) VALUES (dq_pause_queue.queue, true, dq__now())
    ON CONFLICT (queue) DO UPDATE SET paused = true, updated_at = EXCLUDED.updated_at
     WHERE NOT q.paused;
    IF coalesce(v_was, false) THEN
        RETURN false;
    END IF;
    RAISE NOTICE 'dq_pause_queue: queue % is paused', dq_pause_queue.queue;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_pause_queue(text) IS 'dq_pause_queue(queue text) -> boolean: pauses the queue, which delivers nothing until dq_resume_queue; false when it was already paused. Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_pause_queue(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_pause_queue(text) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_resume_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
BEGIN
    v_error := dq__name_error('dq_resume_queue', 'queue', dq_resume_queue.queue, dq__limit_queue_chars());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    UPDATE dq_queues q SET paused = false, updated_at = dq__now()
     WHERE q.queue = dq_resume_queue.queue AND q.paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Every consumer waiting on the queue polls again (delivered at commit).
    PERFORM pg_notify(dq_channel(dq_resume_queue.queue), dq_resume_queue.queue);
    RAISE NOTICE 'dq_resume_queue: queue % is resumed', dq_resume_queue.queue;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_resume_queue(text) IS 'dq_resume_queue(queue text) -> boolean: resumes a paused queue and wakes its waiting consumers; false when it was not paused. Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_resume_queue(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_resume_queue(text) TO dq_admin;

-- Delete every message of a queue. Not archived: a purge is not an outcome of the messages. The
-- children of purged parents follow their on_parent_failure, purged children take their dependency
-- rows along (dq__resolve).
-- In-flight messages are deleted too (their holders' acks then return false). Future occurrences
-- of named schedules are offered again by the next dq_cron_tick (sql/230_cron_schedules.sql). Concurrency:
-- one DELETE; rows locked by a poll in progress are deleted once that transaction ends.
CREATE OR REPLACE FUNCTION dq_purge(queue text, confirm boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_count    bigint;
    v_settled  integer;
    v_woken    boolean;
    v_related  dq_messages[];
    v_resolved integer;
BEGIN
    v_error := coalesce(
        dq__name_error('dq_purge', 'queue', dq_purge.queue, dq__limit_queue_chars()),
        CASE WHEN dq_purge.confirm IS DISTINCT FROM true
             THEN dq__error('22023', format('dq_purge: confirm must be true to delete every message of queue %s', dq_purge.queue))
                  || jsonb_build_object('hint', format('SELECT dq_purge(%L, confirm => true)', dq_purge.queue)) END);
    IF v_error ? 'hint' THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
    ELSIF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    PERFORM dq__cron_note_deleted(dq_purge.queue, NULL);
    WITH gone AS (
        DELETE FROM dq_messages m WHERE m.queue = dq_purge.queue
        RETURNING m.has_children OR m.parents_pending > 0 AS related, CASE WHEN m.has_children OR m.parents_pending > 0 THEN m END AS r
    )
    SELECT count(*), array_agg(gone.r) FILTER (WHERE gone.related) INTO v_count, v_related FROM gone;
    -- Parents and blocked children purged: as any other leaving (sql/095_dependencies.sql), not archived.
    IF v_related IS NOT NULL THEN
        v_resolved := dq__resolve(v_related, 'purged', dq__clock());
    END IF;
    -- Each group is settled rather than its row deleted: a message offered meanwhile (committed after
    -- the DELETE's snapshot) keeps a head (sql/020_groups.sql).
    SELECT dq__settle_groups(array_agg(g.queue), array_agg(g.message_group)) INTO v_settled
      FROM dq_groups g WHERE g.queue = dq_purge.queue;
    v_woken := dq__wake_blocked(dq_purge.queue);  -- in-flight messages are gone: their slots are free
    RAISE NOTICE 'dq_purge: deleted % messages of queue %', v_count, dq_purge.queue;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_purge(text, boolean) IS 'dq_purge(queue text, confirm boolean default false) -> bigint: deletes every message of the queue, in flight or not, without archiving, and returns how many. Errors: 22004/22023/22001 queue; 22023 unless confirm => true.';
REVOKE ALL ON FUNCTION dq_purge(text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_purge(text, boolean) TO dq_admin;

-- After a known crash of every consumer: make the queue's in-flight messages due now instead of
-- waiting for their locks to expire. delivery_count is kept (the crashed deliveries count).
-- Concurrency: rows locked by a poll or an ack in progress are skipped (SKIP LOCKED): they are
-- not stranded; a holder that is still alive loses its lock (its ack returns false).
CREATE OR REPLACE FUNCTION dq_release_locks(queue text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_count   integer;
    v_woken   boolean;
    v_groups  text[];
    v_settled integer;
BEGIN
    v_error := dq__name_error('dq_release_locks', 'queue', dq_release_locks.queue, dq__limit_queue_chars());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    WITH held AS (
        SELECT m.id FROM dq_messages m
         WHERE m.lock_token IS NOT NULL AND m.delivery_count > 0 AND m.queue = dq_release_locks.queue
         ORDER BY m.id
           FOR UPDATE SKIP LOCKED
    )
    , released AS (
        UPDATE dq_messages m SET lock_token = NULL, scheduled_at = dq__clock()
          FROM held WHERE m.id = held.id
        RETURNING m.id, m.message_group, m.scheduled_at, m.dead_from IS NOT NULL AS dead
    )
    SELECT count(*), array_agg(r.message_group) FILTER (WHERE r.message_group IS NOT NULL AND NOT r.dead)
      INTO v_count, v_groups FROM released r;
    -- A released group head keeps its place, due now: its group is settled (or the settle queued
    -- when another transaction holds the group's row, sql/020_groups.sql).
    IF v_groups IS NOT NULL THEN
        v_settled := dq__settle_groups(array_fill(dq_release_locks.queue, ARRAY[cardinality(v_groups)]), v_groups);
    END IF;
    v_woken := dq__wake(dq_release_locks.queue, dq__clock());
    v_woken := dq__wake_blocked(dq_release_locks.queue);
    RAISE NOTICE 'dq_release_locks: released % locks of queue % (due now)', v_count, dq_release_locks.queue;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_release_locks(text) IS 'dq_release_locks(queue text) -> integer: makes every in-flight message of the queue due now (after a known crash of its consumers) and returns how many. Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_release_locks(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_release_locks(text) TO dq_admin;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
