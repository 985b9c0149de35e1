-- The web console's reads and actions (pyqueue console): a message browser paged by key, a message's
-- detail, dead letters grouped and redriven by selection or filter, making a scheduled message due
-- now, a queue's configuration, the archive's throughput, and the audit log of operator actions.
-- Readers are granted to dq_viewer and dq_admin, writers to dq_admin only. Like every dq_* function
-- they run as the install's owner (SECURITY DEFINER): dq_admin and dq_viewer cannot read the tables.
-- States are classified by dq__message_state (sql/030_deliverable.sql), redrives go through
-- dq__redrive (sql/140_dead_letters.sql): one implementation each.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- A queue's messages in key order, one page at a time: keyset paging by (key, id) through the
-- (queue, key) unique index, whose keys compare bytewise (COLLATE "C", migration 0008), never OFFSET.
-- key_prefix is a range of that index (starts_with, which the planner turns into key >= prefix AND
-- key < the next prefix for a "C" column; no pattern is built from the input). in_state filters by
-- dq__message_state; 'redelivered' is a filter only (delivered more than once and not in flight, its
-- rows say ready, scheduled, held or expired). Each call is planned for its own arguments
-- (plan_cache_mode): the conditions of the states not asked for fold away, and a state whose rows
-- an index of its own finds (in_flight, expired) may be read through it and sorted when it is rare.
-- A state filter otherwise walks the queue in key order until it has max_rows rows: on a queue of
-- millions where the state is rare, that reads every row (measured in bench/console_queries.py).
-- A blocked message (waiting for its parents, sql/095_dependencies.sql) shows the due time and group
-- it gets once released and how many parents it waits for (parents_pending, 0 for the others).
-- A plain read: no lock is taken, nothing changes.
-- The result gained parents_pending: a new return type, so the function is dropped and created
-- again in the installer's transaction.
DROP FUNCTION IF EXISTS dq_browse_messages(text, text, text, text, bigint, integer);
CREATE OR REPLACE FUNCTION dq_browse_messages(queue text, in_state text DEFAULT NULL, key_prefix text DEFAULT NULL,
                                              after_key text DEFAULT NULL, after_id bigint DEFAULT NULL,
                                              max_rows integer DEFAULT 50)
RETURNS TABLE (id bigint, key text, state text, scheduled_at timestamptz, delivery_count integer,
               locked_until timestamptz, last_error text, last_error_at timestamptz, created_at timestamptz,
               priority integer, message_group text, dead_from text, expires_at timestamptz, payload_type text,
               payload_bytes integer, parents_pending integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT  -- reads dq__clock()
SET plan_cache_mode = force_custom_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    v_now   timestamptz := dq__clock();
BEGIN
    v_error := coalesce(
        dq__name_error('dq_browse_messages', 'queue', dq_browse_messages.queue, dq__limit_queue_chars()),
        CASE WHEN dq_browse_messages.in_state NOT IN ('ready', 'scheduled', 'in_flight', 'redelivered', 'dead', 'held', 'expired', 'blocked')
             THEN dq__error('22023', format('dq_browse_messages: in_state is "%s", it must be ready, scheduled, in_flight, '
                                            'redelivered, dead, held, expired, blocked or NULL (all)', left(dq_browse_messages.in_state, 40))) END,
        CASE WHEN dq_browse_messages.key_prefix IS NOT NULL
             THEN dq__text_error('dq_browse_messages', 'key_prefix', dq_browse_messages.key_prefix, dq__limit_key_chars()) END,
        CASE WHEN dq_browse_messages.after_key IS NOT NULL
             THEN dq__text_error('dq_browse_messages', 'after_key', dq_browse_messages.after_key, dq__limit_key_chars()) END,
        CASE WHEN (dq_browse_messages.after_key IS NULL) <> (dq_browse_messages.after_id IS NULL)
             THEN dq__error('22023', format('dq_browse_messages: %s is NULL but %s is not: give after_key and after_id together (the key and id of the last row of the previous page) or neither',
                                            CASE WHEN dq_browse_messages.after_key IS NULL THEN 'after_key' ELSE 'after_id' END,
                                            CASE WHEN dq_browse_messages.after_key IS NULL THEN 'after_id' ELSE 'after_key' END)) END,
        dq__range_error('dq_browse_messages', 'max_rows', dq_browse_messages.max_rows, 1, dq__limit_list_messages_max_rows()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT m.id, m.key, s.state, CASE WHEN s.state = 'blocked' THEN m.release_at ELSE m.scheduled_at END,
           m.delivery_count, CASE WHEN s.state = 'in_flight' THEN m.scheduled_at END,
           m.last_error, m.last_error_at, m.created_at, m.priority::integer,
           CASE WHEN s.state = 'blocked' THEN m.release_group ELSE m.message_group END, m.dead_from,
           m.expires_at, m.payload_type, octet_length(m.payload), m.parents_pending
      FROM dq_messages m
      -- Whether the message heads its FIFO group: one primary-key probe of dq_groups (none for an
      -- ungrouped message: a NULL key matches no entry).
      LEFT JOIN LATERAL (SELECT true AS head FROM dq_groups g
                          WHERE g.queue = m.queue AND g.message_group = m.message_group AND g.head_id = m.id) h ON true
     CROSS JOIN LATERAL (SELECT dq__message_state(m.lock_token, m.scheduled_at, m.dead_from, m.expires_at,
                                                  m.message_group, h.head, v_now) AS state) s
     WHERE m.queue = dq_browse_messages.queue
       AND (dq_browse_messages.key_prefix IS NULL OR starts_with(m.key, dq_browse_messages.key_prefix))
       AND (dq_browse_messages.after_key IS NULL
            OR (m.key >= dq_browse_messages.after_key
                AND (m.key > dq_browse_messages.after_key OR m.id > dq_browse_messages.after_id)))
       AND (dq_browse_messages.in_state IS NULL OR s.state = dq_browse_messages.in_state
            OR (dq_browse_messages.in_state = 'redelivered' AND m.delivery_count > 1 AND s.state <> 'in_flight'))
       -- What each state implies of the columns, so that an index of the state can be used (each
       -- line folds to true for the other states).
       AND (dq_browse_messages.in_state IS DISTINCT FROM 'in_flight'
            OR (m.lock_token IS NOT NULL AND m.delivery_count > 0 AND m.scheduled_at > v_now))
       AND (dq_browse_messages.in_state IS DISTINCT FROM 'expired' OR m.expires_at <= v_now)
       AND (dq_browse_messages.in_state IS DISTINCT FROM 'dead' OR m.dead_from IS NOT NULL)
       AND (dq_browse_messages.in_state IS DISTINCT FROM 'held' OR (m.message_group IS NOT NULL AND m.dead_from IS NULL))
       AND (dq_browse_messages.in_state IS DISTINCT FROM 'blocked' OR m.scheduled_at >= dq__blocked_time())
       AND (dq_browse_messages.in_state IS DISTINCT FROM 'redelivered' OR m.delivery_count > 1)
     ORDER BY m.key, m.id
     LIMIT dq_browse_messages.max_rows;
END;
$$;
COMMENT ON FUNCTION dq_browse_messages(text, text, text, text, bigint, integer) IS 'dq_browse_messages(queue text, in_state text default NULL, key_prefix text default NULL, after_key text default NULL, after_id bigint default NULL, max_rows integer default 50) -> TABLE (id, key, state, scheduled_at, delivery_count, locked_until, last_error, last_error_at, created_at, priority, message_group, dead_from, expires_at, payload_type, payload_bytes, parents_pending): the queue''s messages in (key, id) order (keys compared bytewise), after (after_key, after_id) when given, with keys starting with key_prefix, of one state (ready, scheduled, in_flight, dead, held, expired, blocked; redelivered: delivered more than once, not in flight) or all; payload_bytes is the payload''s size in bytes; a blocked message (waiting for parents_pending parents) shows the due time and group it gets once released. A plain read. Errors: 22004/22023/22001 queue, 22023 in_state, 22001 key_prefix or after_key over 200 characters, 22023 after_key without after_id or the reverse, 22004/22023 max_rows (1..10000).';
REVOKE ALL ON FUNCTION dq_browse_messages(text, text, text, text, bigint, integer) FROM PUBLIC;
-- Read-only: operators and the viewer role.
GRANT EXECUTE ON FUNCTION dq_browse_messages(text, text, text, text, bigint, integer) TO dq_admin, dq_viewer;

-- One message of a queue by id, with its payload cut to max_payload_bytes (the full size in
-- payload_bytes) and every column an operator looks at. A plain read: no lock is taken. The
-- arguments are in_queue and message_id: PostgreSQL refuses an argument named like a result column
-- (queue, id). A blocked message shows the due time and group it gets once released and how many
-- parents it waits for (parents_pending; dq_dependencies names them); a released one, when its
-- parents released it (released_at).
-- The result gained parents_pending and released_at: a new return type, so the function is
-- dropped and created again in the installer's transaction.
DROP FUNCTION IF EXISTS dq_message_detail(text, bigint, integer);
CREATE OR REPLACE FUNCTION dq_message_detail(in_queue text, message_id bigint, max_payload_bytes integer DEFAULT 65536)
RETURNS TABLE (id bigint, queue text, key text, state text, payload bytea, payload_bytes integer, payload_type text,
               headers jsonb, priority integer, message_group text, delivery_count integer, last_error text,
               last_error_at timestamptz, scheduled_at timestamptz, scheduled_at_initially timestamptz,
               created_at timestamptz, locked_until timestamptz, expires_at timestamptz, dead_from text,
               dead_at timestamptz, parents_pending integer, released_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT  -- reads dq__clock()
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    v_now   timestamptz := dq__clock();
BEGIN
    v_error := coalesce(
        dq__name_error('dq_message_detail', 'in_queue', dq_message_detail.in_queue, dq__limit_queue_chars()),
        CASE WHEN dq_message_detail.message_id IS NULL THEN dq__null_error('dq_message_detail', 'message_id') END,
        dq__range_error('dq_message_detail', 'max_payload_bytes', dq_message_detail.max_payload_bytes, 0,
                        dq__limit_payload_bytes_max()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT m.id, m.queue, m.key, s.state, substring(m.payload FROM 1 FOR dq_message_detail.max_payload_bytes),
           octet_length(m.payload), m.payload_type, m.headers, m.priority::integer,
           CASE WHEN s.state = 'blocked' THEN m.release_group ELSE m.message_group END,
           m.delivery_count, m.last_error, m.last_error_at,
           CASE WHEN s.state = 'blocked' THEN m.release_at ELSE m.scheduled_at END, m.scheduled_at_initially,
           m.created_at, CASE WHEN s.state = 'in_flight' THEN m.scheduled_at END, m.expires_at, m.dead_from,
           m.dead_at, m.parents_pending, m.released_at
      FROM dq_messages m
      LEFT JOIN LATERAL (SELECT true AS head FROM dq_groups g
                          WHERE g.queue = m.queue AND g.message_group = m.message_group AND g.head_id = m.id) h ON true
     CROSS JOIN LATERAL (SELECT dq__message_state(m.lock_token, m.scheduled_at, m.dead_from, m.expires_at,
                                                  m.message_group, h.head, v_now) AS state) s
     WHERE m.id = dq_message_detail.message_id AND m.queue = dq_message_detail.in_queue;
END;
$$;
COMMENT ON FUNCTION dq_message_detail(text, bigint, integer) IS 'dq_message_detail(in_queue text, message_id bigint, max_payload_bytes integer default 65536) -> TABLE (id, queue, key, state, payload, payload_bytes, payload_type, headers, priority, message_group, delivery_count, last_error, last_error_at, scheduled_at, scheduled_at_initially, created_at, locked_until, expires_at, dead_from, dead_at, parents_pending, released_at): the message with this id in the queue (no row when there is none), payload cut to its first max_payload_bytes bytes, payload_bytes its full size in bytes, state as dq_browse_messages says it (a blocked message: the due time and group it gets once released, parents_pending the parents it waits for, named by dq_dependencies; released_at: when its parents released it, NULL when it never waited). A plain read. Errors: 22004/22023/22001 in_queue, 22004 message_id, 22004/22023 max_payload_bytes (0..1073741824).';
REVOKE ALL ON FUNCTION dq_message_detail(text, bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_message_detail(text, bigint, integer) TO dq_admin, dq_viewer;

-- The dead letters of a dead-letter queue grouped by the queue they died in and their last error,
-- largest group first. A plain read of the queue's rows (no lock).
CREATE OR REPLACE FUNCTION dq_dead_letter_groups(dead_letter_queue text, max_rows integer DEFAULT 100)
RETURNS TABLE (dead_from text, last_error text, messages bigint, oldest_dead_at timestamptz,
               newest_dead_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
BEGIN
    v_error := coalesce(
        dq__name_error('dq_dead_letter_groups', 'dead_letter_queue', dq_dead_letter_groups.dead_letter_queue,
                       dq__limit_queue_chars()),
        dq__range_error('dq_dead_letter_groups', 'max_rows', dq_dead_letter_groups.max_rows, 1,
                        dq__limit_dead_letters_max_rows()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT m.dead_from, m.last_error, count(*), min(m.dead_at), max(m.dead_at)
      FROM dq_messages m
     WHERE m.queue = dq_dead_letter_groups.dead_letter_queue AND m.dead_from IS NOT NULL
     GROUP BY m.dead_from, m.last_error
     ORDER BY count(*) DESC, m.dead_from, m.last_error NULLS FIRST
     LIMIT dq_dead_letter_groups.max_rows;
END;
$$;
COMMENT ON FUNCTION dq_dead_letter_groups(text, integer) IS 'dq_dead_letter_groups(dead_letter_queue text, max_rows integer default 100) -> TABLE (dead_from, last_error, messages, oldest_dead_at, newest_dead_at): the queue''s dead letters counted by the queue they died in and their last error, largest group first, at most max_rows groups. A plain read. Errors: 22004/22023/22001 dead_letter_queue, 22004/22023 max_rows (1..100000).';
REVOKE ALL ON FUNCTION dq_dead_letter_groups(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_dead_letter_groups(text, integer) TO dq_admin, dq_viewer;

-- How many dead letters dq_redrive_matching with this filter would send back now, before its
-- max_count: those dq__redrive takes (not held by a consumer) less those it leaves (a key live in
-- its queue; of one key that died twice, one per call). A plain read under the statement's
-- snapshot: a concurrent poll or offer can change the figure before the redrive runs.
CREATE OR REPLACE FUNCTION dq_count_dead_letters(dead_letter_queue text, dead_from text DEFAULT NULL,
                                                 last_error text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT  -- reads dq__clock()
SET plan_cache_mode = force_custom_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    v_now   timestamptz := dq__clock();
BEGIN
    v_error := coalesce(
        dq__name_error('dq_count_dead_letters', 'dead_letter_queue', dq_count_dead_letters.dead_letter_queue,
                       dq__limit_queue_chars()),
        CASE WHEN dq_count_dead_letters.dead_from IS NOT NULL
             THEN dq__name_error('dq_count_dead_letters', 'dead_from', dq_count_dead_letters.dead_from, dq__limit_queue_chars()) END,
        CASE WHEN dq_count_dead_letters.last_error IS NOT NULL
             THEN dq__text_error('dq_count_dead_letters', 'last_error', dq_count_dead_letters.last_error, dq__limit_error_chars()) END);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN (
        SELECT count(*) FROM (
            SELECT DISTINCT c.dead_from, c.key
              FROM dq_messages c
             WHERE c.queue = dq_count_dead_letters.dead_letter_queue AND c.dead_from IS NOT NULL
               AND (c.lock_token IS NULL OR c.scheduled_at <= v_now)
               AND (dq_count_dead_letters.dead_from IS NULL OR c.dead_from = dq_count_dead_letters.dead_from)
               AND (dq_count_dead_letters.last_error IS NULL OR c.last_error = dq_count_dead_letters.last_error)
               AND NOT EXISTS (SELECT 1 FROM dq_messages o
                                WHERE o.queue = c.dead_from AND o.key = c.key AND o.dead_from_id IS NULL)) s);
END;
$$;
COMMENT ON FUNCTION dq_count_dead_letters(text, text, text) IS 'dq_count_dead_letters(dead_letter_queue text, dead_from text default NULL, last_error text default NULL) -> bigint: how many dead letters dq_redrive_matching with the same filter (NULL: any) would send back now, before its max_count: not those held by a consumer, nor those whose key is live in their queue, one per key that died twice. A plain read. Errors: 22004/22023/22001 dead_letter_queue, 22023/22001 dead_from, 22001 last_error over 10000 characters.';
REVOKE ALL ON FUNCTION dq_count_dead_letters(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_count_dead_letters(text, text, text) TO dq_admin, dq_viewer;

-- Redrive exactly these dead letters (their id as dq_browse_messages and dq_message_detail give it;
-- not dq_dead_letters' dead_from_id, the id each had in its source queue): dq__redrive restricted to
-- the ids, which locks them FOR UPDATE SKIP LOCKED (a dead
-- letter a consumer holds or an ack in progress is skipped, never waited for) and leaves a dead
-- letter whose key is live in its queue where it is. An id that is not a dead letter of this queue
-- is ignored: no ordinary message and no other queue's row is touched.
CREATE OR REPLACE FUNCTION dq_redrive_messages(dead_letter_queue text, ids bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    v_count integer := 0;
BEGIN
    v_error := coalesce(
        dq__name_error('dq_redrive_messages', 'dead_letter_queue', dq_redrive_messages.dead_letter_queue, dq__limit_queue_chars()),
        CASE WHEN dq_redrive_messages.ids IS NULL THEN dq__null_error('dq_redrive_messages', 'ids')
             WHEN array_ndims(dq_redrive_messages.ids) > 1
             THEN dq__error('22023', 'dq_redrive_messages: ids must be a one-dimensional array')
             WHEN cardinality(dq_redrive_messages.ids) > dq__limit_redrive_max_count()
             THEN dq__error('54000', format('dq_redrive_messages: ids has %s elements, the limit is %s',
                                            cardinality(dq_redrive_messages.ids), dq__limit_redrive_max_count())) END);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    IF cardinality(dq_redrive_messages.ids) > 0 THEN
        v_count := dq__redrive(dq_redrive_messages.dead_letter_queue, cardinality(dq_redrive_messages.ids),
                               dq_redrive_messages.ids, NULL, NULL);
    END IF;
    RAISE NOTICE 'dq_redrive_messages: % dead letters of % sent back to their queues', v_count,
        dq_redrive_messages.dead_letter_queue;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_redrive_messages(text, bigint[]) IS 'dq_redrive_messages(dead_letter_queue text, ids bigint[]) -> integer: sends the dead letters of the queue with these ids back to the queues they died in, due now, as dq_redrive does, and returns how many; ids of other messages are ignored, a dead letter held by a consumer or whose key is live in its queue stays. Errors: 22004/22023/22001 dead_letter_queue, 22004 ids, 22023 ids not one-dimensional, 54000 ids over 100000 elements.';
REVOKE ALL ON FUNCTION dq_redrive_messages(text, bigint[]) FROM PUBLIC;
-- An action: operators only.
GRANT EXECUTE ON FUNCTION dq_redrive_messages(text, bigint[]) TO dq_admin;

-- Redrive the dead letters matching a filter (dead_from: the queue they died in; last_error: their
-- last error exactly; NULL: any), at most max_count, oldest death first: dq__redrive, with its
-- locking (FOR UPDATE SKIP LOCKED, never waiting for a consumer).
CREATE OR REPLACE FUNCTION dq_redrive_matching(dead_letter_queue text, dead_from text DEFAULT NULL,
                                               last_error text DEFAULT NULL, max_count integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    v_count integer;
BEGIN
    v_error := coalesce(
        dq__name_error('dq_redrive_matching', 'dead_letter_queue', dq_redrive_matching.dead_letter_queue, dq__limit_queue_chars()),
        CASE WHEN dq_redrive_matching.dead_from IS NOT NULL
             THEN dq__name_error('dq_redrive_matching', 'dead_from', dq_redrive_matching.dead_from, dq__limit_queue_chars()) END,
        CASE WHEN dq_redrive_matching.last_error IS NOT NULL
             THEN dq__text_error('dq_redrive_matching', 'last_error', dq_redrive_matching.last_error, dq__limit_error_chars()) END,
        dq__range_error('dq_redrive_matching', 'max_count', dq_redrive_matching.max_count, 1, dq__limit_redrive_max_count()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_count := dq__redrive(dq_redrive_matching.dead_letter_queue, dq_redrive_matching.max_count, NULL,
                           dq_redrive_matching.dead_from, dq_redrive_matching.last_error);
    RAISE NOTICE 'dq_redrive_matching: % dead letters of % sent back to their queues', v_count,
        dq_redrive_matching.dead_letter_queue;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_redrive_matching(text, text, text, integer) IS 'dq_redrive_matching(dead_letter_queue text, dead_from text default NULL, last_error text default NULL, max_count integer default 1000) -> integer: sends up to max_count dead letters of the queue that died in dead_from with exactly this last_error (NULL: any) back to their queues, due now, as dq_redrive does, and returns how many. Errors: 22004/22023/22001 dead_letter_queue, 22023/22001 dead_from, 22001 last_error over 10000 characters, 22004/22023 max_count (1..100000).';
REVOKE ALL ON FUNCTION dq_redrive_matching(text, text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_redrive_matching(text, text, text, integer) TO dq_admin;

-- Make a scheduled message due now, as an offer that moves its due time would: its priority and
-- group stay, a grouped message's group is settled (its head's due time follows; a message behind
-- its head still waits for the head) and waiting consumers are woken. Only a message that is not
-- due yet, not in flight, not a dead letter and not blocked by parents (dq_offer's after): false otherwise, or when the queue has no such key
-- (a message not due yet has not expired: an offer's expires_at is after its due time). Its first due time (scheduled_at_initially, the order of its group) is kept.
-- Concurrency (READ COMMITTED): one UPDATE by (queue, key) whose conditions are checked again on
-- the row's latest version after any wait for its lock. A poller holding the row (it became due
-- meanwhile) is waited for, and the message, then in flight, is left alone; a concurrent re-offer
-- is waited for and its new version made due if it is still scheduled; an ack or cancel leaves no
-- row. Polls skip the row while it is locked here (SKIP LOCKED). The group settle takes its group's
-- row SKIP LOCKED or queues the settle (sql/020_groups.sql), so this never waits for a consumer's
-- transaction because of a group.
CREATE OR REPLACE FUNCTION dq_make_due(queue text, key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error   jsonb;
    v_now     timestamptz := dq__clock();
    v_group   text;
    v_settled integer;
    v_woken   boolean;
BEGIN
    v_error := coalesce(dq__name_error('dq_make_due', 'queue', dq_make_due.queue, dq__limit_queue_chars()),
                        dq__name_error('dq_make_due', 'key', dq_make_due.key, dq__limit_key_chars()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    UPDATE dq_messages m
       SET scheduled_at = v_now
     WHERE m.queue = dq_make_due.queue AND m.key = dq_make_due.key AND m.dead_from_id IS NULL
       AND m.dead_from IS NULL AND m.lock_token IS NULL AND m.scheduled_at > v_now AND m.parents_pending = 0
    RETURNING m.message_group INTO v_group;
    IF NOT FOUND THEN
        RAISE NOTICE 'dq_make_due: queue % has no scheduled message with key % (not due yet, not in flight, not a dead letter, not blocked by parents)',
            dq_make_due.queue, dq_make_due.key;
        RETURN false;
    END IF;
    IF v_group IS NOT NULL THEN
        -- Settling wakes waiters when the head changed (sql/020_groups.sql).
        v_settled := dq__settle_groups(ARRAY[dq_make_due.queue], ARRAY[v_group], ARRAY[v_now]);
    ELSE
        -- Wake a waiter that would otherwise sleep past now (sql/010_wait.sql).
        v_woken := dq__wake(dq_make_due.queue, v_now);
    END IF;
    RAISE NOTICE 'dq_make_due: message % of queue % is due now', dq_make_due.key, dq_make_due.queue;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_make_due(text, text) IS 'dq_make_due(queue text, key text) -> boolean: the queue''s scheduled message with this key (not due yet, not in flight, not a dead letter) becomes due now, keeping its priority and its place in its FIFO group, and waiting consumers are woken; false when there is no such message. Errors: 22004/22023/22001 queue or key.';
REVOKE ALL ON FUNCTION dq_make_due(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_make_due(text, text) TO dq_admin;

-- A queue's configuration row, or the defaults of a queue never configured (dq_configure_queue's
-- defaults; updated_at NULL says it was never configured). A plain read.
CREATE OR REPLACE FUNCTION dq_queue_config(queue text)
RETURNS dq_queues
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    r       dq_queues;
BEGIN
    v_error := dq__name_error('dq_queue_config', 'queue', dq_queue_config.queue, dq__limit_queue_chars());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    SELECT q.* INTO r FROM dq_queues q WHERE q.queue = dq_queue_config.queue;
    IF NOT FOUND THEN
        -- The column defaults of dq_queues (migrations 0003, 0004, 0009, 0011); the rest NULL.
        r.queue := dq_queue_config.queue;
        r.archive := false;
        r.notify := true;
        r.paused := false;
    END IF;
    RETURN r;
END;
$$;
COMMENT ON FUNCTION dq_queue_config(text) IS 'dq_queue_config(queue text) -> dq_queues: the queue''s configuration (max_deliveries, dead_letter_queue, archive, retention, notify, max_payload_bytes (NULL: 1048576 bytes), max_in_flight, rate_limit, rate_period, paused), or the defaults of a queue never configured (updated_at NULL). A plain read. Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_queue_config(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_queue_config(text) TO dq_admin, dq_viewer;

-- The queue's archive rows that left in the last `since`, counted by outcome per bucket of
-- `bucket` (buckets aligned on the Unix epoch, date_bin), one row per bucket with at least one row,
-- oldest first. Only queues that archive have rows (dq_configure_queue archive => true). A range of
-- the (queue, acked_at) index; a plain read.
CREATE OR REPLACE FUNCTION dq_throughput(queue text, since interval DEFAULT '1 hour', bucket interval DEFAULT '1 minute')
RETURNS TABLE (bucket_start timestamptz, acked bigint, dead bigint, expired bigint, cancelled bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    v_now   timestamptz := dq__clock();
BEGIN
    v_error := coalesce(
        dq__name_error('dq_throughput', 'queue', dq_throughput.queue, dq__limit_queue_chars()),
        CASE WHEN dq_throughput.since IS NULL THEN dq__null_error('dq_throughput', 'since')
             WHEN dq_throughput.since <= interval '0'
             THEN dq__error('22023', format('dq_throughput: since is %s, it must be positive', dq_throughput.since)) END,
        CASE WHEN dq_throughput.bucket IS NULL THEN dq__null_error('dq_throughput', 'bucket')
             WHEN extract(month FROM dq_throughput.bucket) <> 0 OR extract(year FROM dq_throughput.bucket) <> 0
             THEN dq__error('22023', format('dq_throughput: bucket is %s, it must be given in days, hours, minutes or seconds (no months)',
                                            dq_throughput.bucket))
             WHEN dq_throughput.bucket < interval '1 second'
             THEN dq__error('22023', format('dq_throughput: bucket is %s, it must be at least 1 second', dq_throughput.bucket)) END);
    IF v_error IS NULL
       AND extract(epoch FROM v_now - (v_now - dq_throughput.since)) / extract(epoch FROM dq_throughput.bucket)
           > dq__limit_throughput_buckets() THEN
        v_error := dq__error('54000', format('dq_throughput: since %s is %s buckets of %s, the limit is %s buckets',
                                             dq_throughput.since,
                                             ceil(extract(epoch FROM v_now - (v_now - dq_throughput.since))
                                                  / extract(epoch FROM dq_throughput.bucket)),
                                             dq_throughput.bucket, dq__limit_throughput_buckets()));
    END IF;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT b.start, count(*) FILTER (WHERE a.outcome = 'acked'), count(*) FILTER (WHERE a.outcome = 'dead'),
           count(*) FILTER (WHERE a.outcome = 'expired'), count(*) FILTER (WHERE a.outcome = 'cancelled')
      FROM dq_archive a
     CROSS JOIN LATERAL (SELECT date_bin(dq_throughput.bucket, a.acked_at, timestamptz '1970-01-01 00:00:00+00') AS start) b
     WHERE a.queue = dq_throughput.queue AND a.acked_at > v_now - dq_throughput.since
     GROUP BY b.start
     ORDER BY b.start;
END;
$$;
COMMENT ON FUNCTION dq_throughput(text, interval, interval) IS 'dq_throughput(queue text, since interval default ''1 hour'', bucket interval default ''1 minute'') -> TABLE (bucket_start, acked, dead, expired, cancelled): the queue''s archived messages that left in the last since, counted by outcome per bucket (aligned on the Unix epoch), one row per bucket with at least one, oldest first; only archiving queues have any. A plain read. Errors: 22004/22023/22001 queue, 22004/22023 since (positive), 22004/22023 bucket (1 second or more, no months), 54000 over 10000 buckets.';
REVOKE ALL ON FUNCTION dq_throughput(text, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_throughput(text, interval, interval) TO dq_admin, dq_viewer;

-- Record an operator action in the audit log (at: the queue's clock) and return its id. A plain
-- INSERT: the identity column orders entries, and concurrent writers never wait for each other.
CREATE OR REPLACE FUNCTION dq_audit(actor text, action text, queue text, target text, details jsonb, outcome text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    v_id    bigint;
BEGIN
    v_error := coalesce(
        dq__name_error('dq_audit', 'actor', dq_audit.actor, dq__limit_audit_actor_chars()),
        dq__name_error('dq_audit', 'action', dq_audit.action, dq__limit_audit_action_chars()),
        CASE WHEN dq_audit.queue IS NOT NULL
             THEN dq__name_error('dq_audit', 'queue', dq_audit.queue, dq__limit_queue_chars()) END,
        CASE WHEN dq_audit.target IS NOT NULL
             THEN dq__text_error('dq_audit', 'target', dq_audit.target, dq__limit_error_chars()) END,
        dq__headers_error('dq_audit', 'details', dq_audit.details),
        dq__name_error('dq_audit', 'outcome', dq_audit.outcome, dq__limit_error_chars()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    INSERT INTO dq_audit_log AS l (at, actor, action, queue, target, details, outcome)
    VALUES (dq__clock(), dq_audit.actor, dq_audit.action, dq_audit.queue, dq_audit.target, dq_audit.details,
            dq_audit.outcome)
    RETURNING l.id INTO v_id;
    RAISE NOTICE 'dq_audit: entry % recorded (% by %)', v_id, dq_audit.action, dq_audit.actor;
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION dq_audit(text, text, text, text, jsonb, text) IS 'dq_audit(actor text, action text, queue text, target text, details jsonb, outcome text) -> bigint: records an operator action in dq_audit_log (at: now) and returns its id; queue, target and details may be NULL. Errors: 22004/22023/22001 actor (200 characters), action (100), outcome (10000); 22023/22001 queue; 22001 target over 10000 characters; 22023 details not a JSON object, 54000 details over 8192 bytes.';
REVOKE ALL ON FUNCTION dq_audit(text, text, text, text, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_audit(text, text, text, text, jsonb, text) TO dq_admin;

-- The audit log, newest first, max_rows entries with an id below before_id (NULL: the newest):
-- keyset paging backwards through the primary key. A plain read.
CREATE OR REPLACE FUNCTION dq_audit_entries(before_id bigint DEFAULT NULL, max_rows integer DEFAULT 50)
RETURNS SETOF dq_audit_log
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
BEGIN
    v_error := dq__range_error('dq_audit_entries', 'max_rows', dq_audit_entries.max_rows, 1, dq__limit_list_messages_max_rows());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT l.* FROM dq_audit_log l
     WHERE l.id < coalesce(dq_audit_entries.before_id, 9223372036854775807)
     ORDER BY l.id DESC
     LIMIT dq_audit_entries.max_rows;
END;
$$;
COMMENT ON FUNCTION dq_audit_entries(bigint, integer) IS 'dq_audit_entries(before_id bigint default NULL, max_rows integer default 50) -> SETOF dq_audit_log: the audit log, newest first, the entries with an id below before_id (NULL: from the newest). A plain read. Errors: 22004/22023 max_rows (1..10000).';
REVOKE ALL ON FUNCTION dq_audit_entries(bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_audit_entries(bigint, integer) TO dq_admin, dq_viewer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
