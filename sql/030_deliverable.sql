-- What a consumer may be given next: the priority levels of a queue, the earliest time a message can
-- be delivered, and how many messages are in flight (dq_poll_many, dq_wait, dq_next_due, dq_queue_stats).
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- The priority levels of a queue's ungrouped messages (and dead letters), highest first: a skip scan
-- of dq_messages_ready_idx, one index probe per level, however many messages a level holds. Used to
-- read that index one level at a time (its order is priority, then due time).
CREATE OR REPLACE FUNCTION dq__levels(queue text)
RETURNS SETOF smallint
LANGUAGE sql STABLE SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
    WITH RECURSIVE levels(p) AS (
        SELECT (SELECT d.priority FROM dq_messages d
                 WHERE d.queue = $1 AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                 ORDER BY d.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT d.priority FROM dq_messages d
                 WHERE d.queue = $1 AND (d.message_group IS NULL OR d.dead_from IS NOT NULL) AND d.priority < levels.p
                 ORDER BY d.priority DESC LIMIT 1)
          FROM levels WHERE levels.p IS NOT NULL
    )
    SELECT levels.p FROM levels WHERE levels.p IS NOT NULL
$$;
COMMENT ON FUNCTION dq__levels(text) IS 'Internal: the distinct priorities of a queue''s ungrouped messages and dead letters, highest first (a skip scan).';
REVOKE ALL ON FUNCTION dq__levels(text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- When the next message of a queue can be delivered as far as its messages go (pause and limits
-- aside): the earliest due time of its ungrouped messages and of its groups' heads, in-flight
-- messages counting at their lock expiry. NULL when there is none. The ungrouped messages are read
-- one priority level at a time for the first 128 levels (a skip scan of dq_messages_ready_idx: a
-- level's first entry is its earliest, so a large backlog at one level costs one index probe), then
-- in one pass over the index entries of the levels below the 128th (about 30 ns an entry, no row
-- read): one probe per level made every dq_wait of a queue with 65,536 levels of future messages
-- cost 281 ms, where this costs a few ms (the same bound as dq_poll_many's level walk).
CREATE OR REPLACE FUNCTION dq__next_deliverable(queue text)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
    WITH RECURSIVE levels(p, t, n) AS (
        SELECT f.priority, f.scheduled_at, 1
          FROM (SELECT d.priority, d.scheduled_at FROM dq_messages d
                 WHERE d.queue = $1 AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                 ORDER BY d.priority DESC, d.scheduled_at LIMIT 1) f
        UNION ALL
        SELECT f.priority, f.scheduled_at, levels.n + 1
          FROM levels
         CROSS JOIN LATERAL (SELECT d.priority, d.scheduled_at FROM dq_messages d
                              WHERE d.queue = $1 AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                                AND d.priority < levels.p
                              ORDER BY d.priority DESC, d.scheduled_at LIMIT 1) f
         WHERE levels.n < 128
    )
    -- A message blocked by its parents (sql/095_dependencies.sql) is stored due at dq__blocked_time(): never.
    SELECT nullif(least(
        (SELECT min(levels.t) FROM levels),
        (SELECT min(d.scheduled_at) FROM dq_messages d
          WHERE d.queue = $1 AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
            AND d.priority < (SELECT levels.p FROM levels WHERE levels.n = 128)),
        (SELECT g.due_at FROM dq_groups g WHERE g.queue = $1 ORDER BY g.due_at LIMIT 1),
        (SELECT s.due_at FROM dq_group_settles s WHERE s.queue = $1 ORDER BY s.due_at LIMIT 1)), dq__blocked_time())
$$;
COMMENT ON FUNCTION dq__next_deliverable(text) IS 'Internal: the earliest time a message of the queue can be delivered (ungrouped messages and group heads; locks count at their expiry), pause and limits aside; NULL when none.';
REVOKE ALL ON FUNCTION dq__next_deliverable(text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- How many messages of a queue are in flight at a time (a lock token, the lock not expired), counted
-- up to up_to (the concurrency limit: more need not be counted), from dq_messages_in_flight_idx,
-- whose predicate (a lock token, delivered at least once: migration 0020) the WHERE clause names.
-- Used by dq_poll_many (under the configuration row's lock) and dq_wait. VOLATILE: its query takes a
-- snapshot of its own, so a poll that waited for the configuration row's lock counts every
-- acquisition committed by the previous holder.
CREATE OR REPLACE FUNCTION dq__in_flight(queue text, at timestamptz, up_to integer)
RETURNS integer
LANGUAGE sql VOLATILE SET search_path FROM CURRENT
AS $$
    SELECT count(*)::integer FROM (
        SELECT 1 FROM dq_messages m
         WHERE m.queue = $1 AND m.lock_token IS NOT NULL AND m.delivery_count > 0 AND m.scheduled_at > $2
         LIMIT $3) s
$$;
COMMENT ON FUNCTION dq__in_flight(text, timestamptz, integer) IS 'Internal: the number of messages of a queue in flight at a time (lock not expired), counted up to up_to.';
REVOKE ALL ON FUNCTION dq__in_flight(text, timestamptz, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
-- The state of a message, written once for every reader that names states (dq_list_messages,
-- dq_browse_messages, dq_message_detail). Both are SQL expressions PostgreSQL inlines (SQL, no SET
-- clause): they cost what the CASE costs, on any number of rows.
-- By time: in_flight (held under a lock that has not expired), else ready (due) or scheduled. A
-- message whose lock expired is ready: the next poll delivers it again.
CREATE OR REPLACE FUNCTION dq__timing_state(lock_token uuid, scheduled_at timestamptz, at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN lock_token IS NOT NULL AND scheduled_at > at THEN 'in_flight'
                WHEN scheduled_at <= at THEN 'ready'
                WHEN scheduled_at >= dq__blocked_time() THEN 'blocked'
                ELSE 'scheduled' END
$$;
COMMENT ON FUNCTION dq__timing_state(uuid, timestamptz, timestamptz) IS 'Internal: in_flight, ready, blocked (stored due at dq__blocked_time(): waiting for parents) or scheduled at `at` (the timing states of dq_list_messages).';
REVOKE ALL ON FUNCTION dq__timing_state(uuid, timestamptz, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Every state, the first that applies: in_flight; dead (a dead letter, in its dead-letter queue);
-- blocked (waiting for its parents, sql/095_dependencies.sql: stored due at dq__blocked_time(), the
-- only rows due that late; its expiry is checked once it is released); expired (past expires_at,
-- not removed yet: a poll that reaches it removes it); held (a message of a FIFO group that is not
-- its group's head: head is whether dq_groups names it, which the caller reads); else ready or
-- scheduled by time (dq__timing_state).
CREATE OR REPLACE FUNCTION dq__message_state(lock_token uuid, scheduled_at timestamptz, dead_from text,
                                             expires_at timestamptz, message_group text, head boolean,
                                             at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN lock_token IS NOT NULL AND scheduled_at > at THEN 'in_flight'
                WHEN dead_from IS NOT NULL THEN 'dead'
                WHEN scheduled_at >= dq__blocked_time() THEN 'blocked'
                WHEN expires_at <= at THEN 'expired'
                WHEN message_group IS NOT NULL AND NOT coalesce(head, false) THEN 'held'
                ELSE dq__timing_state(lock_token, scheduled_at, at) END
$$;
COMMENT ON FUNCTION dq__message_state(uuid, timestamptz, text, timestamptz, text, boolean, timestamptz) IS 'Internal: in_flight, dead, blocked, expired, held, ready or scheduled at `at` (dq_browse_messages, dq_message_detail, dq_dependencies).';
REVOKE ALL ON FUNCTION dq__message_state(uuid, timestamptz, text, timestamptz, text, boolean, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
