-- FIFO message groups and what a consumer may be given next.
--
-- Messages of one queue that share a message_group are delivered one at a time, in order of
-- scheduled_at_initially, then id (the order they were offered in), like the message groups of
-- Amazon SQS FIFO queues (SQS Developer Guide, "Using the message group ID with Amazon SQS FIFO
-- queues"). Each non-empty group has a row in dq_groups naming its head: the one message of the
-- group that dq_poll_many may deliver, with the head's priority and due time. The head is the
-- group's first message, except that a head that has been delivered (delivery_count > 0) or is in
-- flight keeps its place until it leaves the group (acknowledged, cancelled, expired, dead-lettered,
-- or re-offered into another group): a nack, with or without a delay, keeps the group waiting for it.
-- Ungrouped messages and dead letters (a dead-letter queue delivers each dead letter on its own) are
-- polled from the index dq_messages_ready_idx and never wait for a group.
--
-- Locking. The row of a group in dq_groups is its lock: every change of a group's head is made by
-- dq__settle_group, which holds that row lock to the end of the transaction. Callers change their
-- messages first (holding those rows' locks) and settle the groups afterwards, several groups in
-- (queue, message_group) order; dq__settle_group reads messages without locking them, so the holder
-- of a group lock never waits for a message lock. dq_poll_many takes group rows and heads with SKIP
-- LOCKED (it never waits for either), so it cannot close a cycle of waits with them.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- Set the heads of the groups (queues[i], message_groups[i]) (NULL groups are ignored, each group
-- once) from their messages as they are now; one row (queue, due) for each group whose head or its
-- due time changed, due being the head's due time (the caller wakes waiters with it). A group left
-- without messages loses its dq_groups row. Called after the caller changed the groups' messages, in
-- the same transaction.
-- Concurrency: one upsert locks every group's row in (queue, message_group) order, creating the
-- missing ones (its rows are inserted or locked in the order of its SELECT; an existing row gets a
-- same-valued update, a heap-only tuple), so settles of a group are serialised and two settles of
-- several groups lock them in the same order. The reads that follow are new statements under READ
-- COMMITTED: they see every change committed by the previous holder of a lock. A change that is not
-- committed yet is settled by its own transaction when it gets the lock after us.
CREATE OR REPLACE FUNCTION dq__settle_group_heads(queues text[], message_groups text[])
RETURNS TABLE (queue text, due timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_q  text[];
    v_g  text[];
    v_h  bigint[];
    v_p  smallint[];
    v_d  timestamptz[];
BEGIN
    WITH locked AS (
        INSERT INTO dq_groups AS g (queue, message_group, head_id, priority, due_at)
        SELECT d.q, d.g, NULL, 0, dq__max_time()
          FROM (SELECT DISTINCT u.q, u.g FROM unnest(dq__settle_group_heads.queues, dq__settle_group_heads.message_groups) AS u(q, g)
                 WHERE u.g IS NOT NULL) d
         ORDER BY d.q COLLATE "C", d.g COLLATE "C"
        ON CONFLICT (queue, message_group) DO UPDATE SET head_id = g.head_id
        RETURNING g.queue, g.message_group, g.head_id, g.priority, g.due_at
    )
    SELECT array_agg(l.queue), array_agg(l.message_group), array_agg(l.head_id), array_agg(l.priority), array_agg(l.due_at)
      INTO v_q, v_g, v_h, v_p, v_d
      FROM locked l;
    IF v_q IS NULL THEN
        RETURN;
    END IF;
    -- Each head: the current one when it was delivered or is in flight (it keeps its place), else
    -- the group's first message (the second branch runs only when the first finds nothing).
    RETURN QUERY
    WITH h AS (
        SELECT g.q, g.g, g.h AS old_head, g.p AS old_prio, g.d AS old_due, n.id, n.priority, n.scheduled_at
          FROM unnest(v_q, v_g, v_h, v_p, v_d) AS g(q, g, h, p, d)
          LEFT JOIN LATERAL (
              (SELECT m.id, m.priority, m.scheduled_at
                 FROM dq_messages m
                WHERE m.id = g.h AND m.queue = g.q AND m.message_group = g.g AND m.dead_from IS NULL
                  AND (m.delivery_count > 0 OR m.lock_token IS NOT NULL))
              UNION ALL
              (SELECT m.id, m.priority, m.scheduled_at
                 FROM dq_messages m
                WHERE m.queue = g.q AND m.message_group = g.g AND m.dead_from IS NULL
                ORDER BY m.scheduled_at_initially, m.id
                LIMIT 1)
              LIMIT 1) n ON true
    ), emptied AS (
        DELETE FROM dq_groups x USING h
         WHERE h.id IS NULL AND x.queue = h.q AND x.message_group = h.g
    )
    UPDATE dq_groups x SET head_id = h.id, priority = h.priority, due_at = h.scheduled_at
      FROM h
     WHERE h.id IS NOT NULL
       AND (h.id IS DISTINCT FROM h.old_head OR h.priority <> h.old_prio OR h.scheduled_at <> h.old_due)
       AND x.queue = h.q AND x.message_group = h.g
    RETURNING x.queue, x.due_at;
END;
$$;
COMMENT ON FUNCTION dq__settle_group_heads(text[], text[]) IS
  'Internal: sets the heads of FIFO groups from their messages (locking their dq_groups rows in order); returns (queue, due) for each group whose head changed.';
REVOKE ALL ON FUNCTION dq__settle_group_heads(text[], text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- dq__settle_group_heads for one group: the head's due time when it changed, else NULL.
CREATE OR REPLACE FUNCTION dq__settle_group(queue text, message_group text)
RETURNS timestamptz
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    SELECT min(s.due) FROM dq__settle_group_heads(ARRAY[$1], ARRAY[$2]) s
$$;
COMMENT ON FUNCTION dq__settle_group(text, text) IS
  'Internal: sets the head of a FIFO group from its messages (locking the group''s dq_groups row); returns the head''s due time when it changed.';
REVOKE ALL ON FUNCTION dq__settle_group(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Settle the groups (queues[i], message_groups[i]) (NULL groups are ignored) with
-- dq__settle_group_heads, and wake the waiters of each queue whose heads changed (once per queue,
-- with the earliest due time of its new heads). Returns the number of groups settled.
CREATE OR REPLACE FUNCTION dq__settle_groups(queues text[], message_groups text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    r       record;
    v_woken boolean;
BEGIN
    FOR r IN SELECT s.queue, min(s.due) AS due FROM dq__settle_group_heads(queues, message_groups) s
              GROUP BY s.queue LOOP
        v_woken := dq__wake(r.queue, r.due);
    END LOOP;
    RETURN (SELECT count(DISTINCT (u.q, u.g)) FROM unnest(queues, message_groups) AS u(q, g) WHERE u.g IS NOT NULL);
END;
$$;
COMMENT ON FUNCTION dq__settle_groups(text[], text[]) IS
  'Internal: dq__settle_group_heads for each distinct (queue, message_group) pair, waking waiters when a head changed.';
REVOKE ALL ON FUNCTION dq__settle_groups(text[], text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The priority levels of a queue's ungrouped messages (and dead letters), highest first: a skip scan
-- of dq_messages_ready_idx, one index probe per level, however many messages a level holds. Used to
-- read that index one level at a time (its order is priority, then due time).
CREATE OR REPLACE FUNCTION dq__levels(queue text)
RETURNS SETOF smallint
LANGUAGE sql STABLE
SET search_path FROM CURRENT
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
COMMENT ON FUNCTION dq__levels(text) IS
  'Internal: the distinct priorities of a queue''s ungrouped messages and dead letters, highest first (a skip scan).';
REVOKE ALL ON FUNCTION dq__levels(text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- When the next message of a queue can be delivered as far as its messages go (pause and limits
-- aside): the earliest due time of its ungrouped messages and of its groups' heads, in-flight
-- messages counting at their lock expiry. NULL when there is none. The ungrouped messages are read
-- one priority level at a time (dq__levels), so a large backlog at one level costs one index probe.
CREATE OR REPLACE FUNCTION dq__next_deliverable(queue text)
RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
    SELECT least(
        (SELECT min((SELECT d.scheduled_at FROM dq_messages d
                      WHERE d.queue = $1 AND (d.message_group IS NULL OR d.dead_from IS NOT NULL) AND d.priority = l.p
                      ORDER BY d.scheduled_at LIMIT 1))
           FROM dq__levels($1) AS l(p)),
        (SELECT g.due_at FROM dq_groups g WHERE g.queue = $1 ORDER BY g.due_at LIMIT 1))
$$;
COMMENT ON FUNCTION dq__next_deliverable(text) IS
  'Internal: the earliest time a message of the queue can be delivered (ungrouped messages and group heads; locks count at their expiry), pause and limits aside; NULL when none.';
REVOKE ALL ON FUNCTION dq__next_deliverable(text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- How many messages of a queue are in flight at a time (a lock token, the lock not expired), counted
-- up to up_to (the concurrency limit: more need not be counted), from dq_messages_in_flight_idx.
-- Used by dq_poll_many (under the configuration row's lock) and dq_wait. VOLATILE: its query takes a
-- snapshot of its own, so a poll that waited for the configuration row's lock counts every
-- acquisition committed by the previous holder.
CREATE OR REPLACE FUNCTION dq__in_flight(queue text, at timestamptz, up_to integer)
RETURNS integer
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    SELECT count(*)::integer FROM (
        SELECT 1 FROM dq_messages m
         WHERE m.queue = $1 AND m.lock_token IS NOT NULL AND m.scheduled_at > $2
         LIMIT $3) s
$$;
COMMENT ON FUNCTION dq__in_flight(text, timestamptz, integer) IS
  'Internal: the number of messages of a queue in flight at a time (lock not expired), counted up to up_to.';
REVOKE ALL ON FUNCTION dq__in_flight(text, timestamptz, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
