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
SELECT pg_catalog.set_config('search_path', pg_catalog.format('%I, pg_temp', (SELECT u.s FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1)), false) AS install_search_path;

-- Set the head of (queue, message_group) from the messages as they are now, and return the head's
-- due time when the head or its due time changed (the caller wakes waiters with it), else NULL.
-- Called after the caller changed the group's messages, in the same transaction.
-- Concurrency: the upsert locks the group's row (creating it when absent), so settles of one group
-- are serialised, and the reads that follow are new statements under READ COMMITTED: they see
-- every change committed by the previous holder of the lock. A change that is not committed yet is
-- settled by its own transaction when it gets the lock after us.
CREATE OR REPLACE FUNCTION dq__settle_group(queue text, message_group text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_head  bigint;
    v_oprio smallint;
    v_odue  timestamptz;
    v_id    bigint;
    v_prio  smallint;
    v_due   timestamptz;
BEGIN
    -- Lock the group's row, creating it when absent (an upsert only then: it writes a row version).
    SELECT g.head_id, g.priority, g.due_at INTO v_head, v_oprio, v_odue
      FROM dq_groups g
     WHERE g.queue = dq__settle_group.queue AND g.message_group = dq__settle_group.message_group
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO dq_groups AS g (queue, message_group, head_id, priority, due_at)
        VALUES (dq__settle_group.queue, dq__settle_group.message_group, NULL, 0, dq__max_time())
        ON CONFLICT (queue, message_group) DO UPDATE SET head_id = g.head_id
        RETURNING g.head_id, g.priority, g.due_at INTO v_head, v_oprio, v_odue;
    END IF;
    -- The head: the current one when it was delivered or is in flight (it keeps its place), else the
    -- group's first message. One statement: the second branch runs only when the first finds nothing.
    SELECT h.id, h.priority, h.scheduled_at INTO v_id, v_prio, v_due
      FROM ((SELECT m.id, m.priority, m.scheduled_at
               FROM dq_messages m
              WHERE m.id = v_head AND m.queue = dq__settle_group.queue
                AND m.message_group = dq__settle_group.message_group AND m.dead_from IS NULL
                AND (m.delivery_count > 0 OR m.lock_token IS NOT NULL))
            UNION ALL
            (SELECT m.id, m.priority, m.scheduled_at
               FROM dq_messages m
              WHERE m.queue = dq__settle_group.queue AND m.message_group = dq__settle_group.message_group
                AND m.dead_from IS NULL
              ORDER BY m.scheduled_at_initially, m.id
              LIMIT 1)) h
     LIMIT 1;
    IF NOT FOUND THEN
        DELETE FROM dq_groups g
         WHERE g.queue = dq__settle_group.queue AND g.message_group = dq__settle_group.message_group;
        RETURN NULL;
    END IF;
    IF v_id IS DISTINCT FROM v_head OR v_prio <> v_oprio OR v_due <> v_odue THEN
        UPDATE dq_groups g SET head_id = v_id, priority = v_prio, due_at = v_due
         WHERE g.queue = dq__settle_group.queue AND g.message_group = dq__settle_group.message_group;
        RETURN v_due;
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION dq__settle_group(text, text) IS
  'Internal: sets the head of a FIFO group from its messages (locking the group''s dq_groups row); returns the head''s due time when it changed.';
REVOKE ALL ON FUNCTION dq__settle_group(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Settle the groups (queues[i], message_groups[i]) (NULL groups are ignored), each once, in lock
-- order, and wake the waiters of each queue whose head changed (once per queue, with the earliest due
-- time of its new heads). Returns the number of groups settled.
CREATE OR REPLACE FUNCTION dq__settle_groups(queues text[], message_groups text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    r       record;
    v_due   timestamptz;
    v_q     text;         -- the queue of the groups settled so far
    v_first timestamptz;  -- the earliest due time of its new heads
    v_n     integer := 0;
    v_woken boolean;
BEGIN
    FOR r IN SELECT d.q, d.g FROM (SELECT DISTINCT u.q, u.g FROM unnest(queues, message_groups) AS u(q, g)
                                    WHERE u.g IS NOT NULL) d
              ORDER BY d.q COLLATE "C", d.g COLLATE "C" LOOP
        IF r.q IS DISTINCT FROM v_q THEN
            v_woken := dq__wake(v_q, v_first);  -- once per queue (NULL: nobody)
            v_q := r.q;
            v_first := NULL;
        END IF;
        v_due := dq__settle_group(r.q, r.g);
        v_first := least(v_first, v_due);
        v_n := v_n + 1;
    END LOOP;
    v_woken := dq__wake(v_q, v_first);
    RETURN v_n;
END;
$$;
COMMENT ON FUNCTION dq__settle_groups(text[], text[]) IS
  'Internal: dq__settle_group for each distinct (queue, message_group) pair, in lock order, waking waiters when a head changed.';
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
