-- Dead letters: moving a message to its queue's dead-letter queue, dq_redrive and dq_dead_letters.
--
-- A queue configured with max_deliveries N and a dead-letter queue D: a message delivered N times
-- that comes due again (its handler failed and dq_nack gave it back, or its lock expired again
-- and again because its worker died) is moved to queue D instead of being delivered an (N+1)-th
-- time. The model is the redrive policy of Amazon SQS (SQS Developer Guide, "Using dead-letter
-- queues in Amazon SQS").
--
-- The move keeps key, payload, payload_type, created_at and released_at (when its parents released
-- it, sql/095_dependencies.sql), and records last_error / last_error_at
-- (dq_nack's error text, or the expiry of its lock), dead_from (the queue it died in), dead_at and
-- dead_delivery_count (its delivery_count there). In D it starts again with delivery_count 0, so D's
-- own max_deliveries counts D's deliveries. D is an ordinary queue: it can be polled, inspected with
-- dq_get, and sent back with dq_redrive.
--
-- A dead letter never replaces another message. It records the id it had where it died
-- (dead_from_id, also the id of its archive row), and its identity is (D, key, dead_from_id): the
-- unique constraint dq_messages_queue_key_key is NULLS NOT DISTINCT over (queue, key, dead_from_id),
-- one ordinary message per (queue, key) and any number of dead letters beside it. Dead letters of
-- two queues with one key, or of one key that died twice, are all kept, and an offer to D of that
-- key creates an ordinary message beside them. dq_configure_queue refuses a
-- chain of dead-letter queues that loops back to the queue.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- Move the given rows (locked by the caller's transaction) to dead_letter_queue, archiving them
-- with outcome dead (dq__gone, which also settles their FIFO groups and applies their children's
-- on_parent_failure). The dead letter keeps has_children (a redrive brings the parent back) and a
-- blocked message's FIFO group; it waits for no parent (its dependency rows go, dq__resolve). A row still carrying its lock token died of lock expiry: that is
-- recorded as its last error, at the time the lock expired (its scheduled_at). Concurrency: the
-- caller holds the rows' locks (poll's FOR UPDATE SKIP LOCKED, nack's UPDATE). The insert is a
-- plain INSERT in bytewise key order, the order every insert into dq_messages uses: it cannot
-- conflict (dead_from_id is the unique id of the row that died).
CREATE OR REPLACE FUNCTION dq__dead_letter(ids bigint[], dead_letter_queue text, at timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_dead     dq_messages[];
    v_count    integer;
    v_archived integer;
BEGIN
    -- The final error of each row, recorded before it moves, for the archive and the dead letter: a
    -- row still holding its lock token died of lock expiry, at the time the lock expired.
    UPDATE dq_messages m
       SET last_error = format('lock expired: delivery %s was not acknowledged', m.delivery_count),
           last_error_at = m.scheduled_at
     WHERE m.id = ANY (dq__dead_letter.ids) AND m.lock_token IS NOT NULL;
    WITH dead AS (
        DELETE FROM dq_messages m WHERE m.id = ANY (dq__dead_letter.ids) RETURNING m.*, m AS gone_row
    ), moved AS (
        INSERT INTO dq_messages AS d
               (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
                delivery_count, dead_delivery_count, last_error, last_error_at, dead_from, dead_at, dead_from_id,
                priority, message_group, expires_at, headers, has_children, released_at)
        SELECT dq__dead_letter.dead_letter_queue, dead.key, dead.payload, dead.payload_type, dq__dead_letter.at,
               dq__dead_letter.at, dead.created_at, 0, dead.delivery_count, dead.last_error, dead.last_error_at,
               dead.queue, dq__dead_letter.at, dead.id, dead.priority, coalesce(dead.message_group, dead.release_group),
               dead.expires_at, dead.headers, dead.has_children, dead.released_at
          FROM dead
         ORDER BY dead.key COLLATE "C"
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved), array_agg(dead.gone_row) INTO v_count, v_dead FROM dead;
    v_archived := dq__gone(v_dead, 'dead', dq__dead_letter.at);
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq__dead_letter(bigint[], text, timestamptz) IS 'Internal: moves locked rows to a dead-letter queue (see sql/140_dead_letters.sql).';
REVOKE ALL ON FUNCTION dq__dead_letter(bigint[], text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- Send dead letters back to the queues they died in, due now, with delivery_count 0 (the error
-- stays in last_error for the record), as ordinary messages: the one implementation of dq_redrive,
-- dq_redrive_messages and dq_redrive_matching (sql/168_console.sql). It takes at most max_count dead
-- letters of dead_letter_queue, oldest death first, restricted to those whose id is in ids, whose
-- dead_from is dead_from and whose last_error is last_error (each NULL: any), and returns how many
-- it sent back. Concurrency: candidates are taken FOR UPDATE SKIP LOCKED (concurrent redrives share
-- the work, and a poll or ack in progress is not waited for); a dead letter held by a consumer (lock
-- not expired) is left alone, so its ack still succeeds and it is not handled twice; a dead letter
-- whose key is live again in its queue stays where it is (INSERT .. ON CONFLICT DO NOTHING, and only
-- what was inserted is deleted), so nothing is lost or overwritten. Each dead letter goes back to its
-- own dead_from, even when several share a key. Only rows of dead_letter_queue that are dead letters
-- (dead_from set) are candidates: an id of an ordinary message, or of another queue, is never
-- touched. A redriven parent keeps has_children: it is the same parent (sql/095_dependencies.sql), and
-- its acknowledgement releases the children still waiting for it. A redriven child keeps its release
-- time (released_at), as it keeps created_at and last_error: its parents released it once, and NULL
-- would say it never waited (a new delivery life starts with delivery_count 0 and a new
-- scheduled_at_initially; its history stays). Planned for each call's arguments (plan_cache_mode):
-- with ids the candidates are read by primary key, without them through the dead-letter queue's rows.
SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
CREATE OR REPLACE FUNCTION dq__redrive(dead_letter_queue text, max_count integer, ids bigint[],
                                       dead_from text, last_error text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := dq__clock();
    v_count   integer;
    v_queues  text[];
    v_groups  text[];
    v_settled integer;
BEGIN
    WITH cand AS (
        SELECT c.id, c.dead_from, c.key, c.payload, c.payload_type, c.created_at, c.last_error, c.last_error_at, c.dead_at,
               c.priority, c.message_group, c.expires_at, c.headers, c.has_children, c.released_at
          FROM dq_messages c
         WHERE c.queue = dq__redrive.dead_letter_queue AND c.dead_from IS NOT NULL
           AND (c.lock_token IS NULL OR c.scheduled_at <= v_now)
           AND (dq__redrive.ids IS NULL OR c.id = ANY (dq__redrive.ids))
           AND (dq__redrive.dead_from IS NULL OR c.dead_from = dq__redrive.dead_from)
           AND (dq__redrive.last_error IS NULL OR c.last_error = dq__redrive.last_error)
         ORDER BY c.dead_at, c.id
         LIMIT dq__redrive.max_count
           FOR UPDATE SKIP LOCKED
    ), pick AS (
        -- One dead letter per (source queue, key): two of them (the key died twice) cannot both be
        -- live in the source; the older goes back first, the other on a later redrive.
        SELECT DISTINCT ON (cand.dead_from, cand.key) cand.*
          FROM cand
         ORDER BY cand.dead_from, cand.key, cand.dead_at, cand.id
    ), ins AS (
        INSERT INTO dq_messages AS m
               (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
                delivery_count, last_error, last_error_at, priority, message_group, expires_at, headers, has_children,
                released_at)
        SELECT pick.dead_from, pick.key, pick.payload, pick.payload_type, v_now, v_now, pick.created_at,
               0, pick.last_error, pick.last_error_at, pick.priority, pick.message_group, pick.expires_at, pick.headers,
               pick.has_children, pick.released_at
          FROM pick
         ORDER BY pick.dead_from, pick.key COLLATE "C"
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO NOTHING
        RETURNING m.queue, m.key, m.message_group
    ), gone AS (
        DELETE FROM dq_messages d
         USING pick, ins
         WHERE d.id = pick.id AND ins.queue = pick.dead_from AND ins.key = pick.key
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone), array_agg(ins.queue) FILTER (WHERE ins.message_group IS NOT NULL),
           array_agg(ins.message_group) FILTER (WHERE ins.message_group IS NOT NULL)
      INTO v_count, v_queues, v_groups FROM ins;
    -- A redriven grouped message joins the end of its group in its queue (sql/020_groups.sql).
    IF v_groups IS NOT NULL THEN
        v_settled := dq__settle_groups(v_queues, v_groups);
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq__redrive(text, integer, bigint[], text, text) IS 'Internal: sends up to max_count dead letters of a dead-letter queue (of these ids, this dead_from, this last_error; NULL: any) back to their queues, due now (dq_redrive, dq_redrive_messages, dq_redrive_matching).';
REVOKE ALL ON FUNCTION dq__redrive(text, integer, bigint[], text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- Send up to max_count dead letters back, oldest death first (dq__redrive).
CREATE OR REPLACE FUNCTION dq_redrive(dead_letter_queue text, max_count integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_count   integer;
BEGIN
    v_error := coalesce(dq__name_error('dq_redrive', 'dead_letter_queue', dq_redrive.dead_letter_queue, dq__limit_queue_chars()),
                        dq__range_error('dq_redrive', 'max_count', dq_redrive.max_count, 1, dq__limit_redrive_max_count()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_count := dq__redrive(dq_redrive.dead_letter_queue, dq_redrive.max_count, NULL, NULL, NULL);
    RAISE NOTICE 'dq_redrive: % dead letters of % sent back to their queues', v_count, dq_redrive.dead_letter_queue;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_redrive(text, integer) IS 'dq_redrive(dead_letter_queue text, max_count integer default 1000) -> integer: sends up to max_count dead letters back to the queues they died in, due now, and returns how many. Errors: 22004/22023/22001 dead_letter_queue, 22004/22023 max_count (1..100000).';
REVOKE ALL ON FUNCTION dq_redrive(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_redrive(text, integer) TO dq_admin;


-- The dead letters of a dead-letter queue, for operators (dq_admin may not read dq_messages):
-- oldest death first. A plain read: no lock is taken, nothing changes.
CREATE OR REPLACE FUNCTION dq_dead_letters(dead_letter_queue text, max_rows integer DEFAULT 100)
RETURNS TABLE (key text, dead_from text, dead_from_id bigint, dead_at timestamptz,
               dead_delivery_count integer, delivery_count integer, last_error text,
               last_error_at timestamptz, payload_type text, payload_text text, headers jsonb,
               locked_until timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT  -- reads dq__clock()
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
BEGIN
    v_error := coalesce(dq__name_error('dq_dead_letters', 'dead_letter_queue', dq_dead_letters.dead_letter_queue,
                                                       dq__limit_queue_chars()),
                        dq__range_error('dq_dead_letters', 'max_rows', dq_dead_letters.max_rows, 1,
                                        dq__limit_dead_letters_max_rows()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT m.key, m.dead_from, m.dead_from_id, m.dead_at, m.dead_delivery_count, m.delivery_count,
           m.last_error, m.last_error_at, m.payload_type, dq__payload_text(m.payload), m.headers,
           CASE WHEN m.lock_token IS NOT NULL AND m.scheduled_at > dq__clock() THEN m.scheduled_at END
      FROM dq_messages m
     WHERE m.queue = dq_dead_letters.dead_letter_queue AND m.dead_from IS NOT NULL
     ORDER BY m.dead_at, m.id
     LIMIT dq_dead_letters.max_rows;
END;
$$;
COMMENT ON FUNCTION dq_dead_letters(text, integer) IS 'dq_dead_letters(dead_letter_queue text, max_rows integer default 100) -> the dead letters of the queue, oldest death first, with where and why they died; a plain read. Errors: 22004/22023/22001 dead_letter_queue, 22004/22023 max_rows (1..100000).';
REVOKE ALL ON FUNCTION dq_dead_letters(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_dead_letters(text, integer) TO dq_admin, dq_viewer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
