-- FIFO message groups.
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
-- dq__settle_group_heads while it holds that row lock (to the end of its transaction). Callers change
-- their messages first (holding those rows' locks) and settle the groups afterwards; the settle reads
-- messages without locking them, so the holder of a group lock never waits for a message lock.
-- dq_poll_many takes group rows and heads with SKIP LOCKED, and so does every settle: no dq_* function
-- waits for another transaction's lock on a dq_groups row. A settle that finds its group's row held
-- (a consumer that polled the group's head inside its transaction, or any open transaction that
-- settled the group, or deleted its row after acknowledging its last message) queues the group in
-- dq_group_settles, committed with its change, instead of waiting for that transaction; the next
-- settle or poll that holds the row applies it (dq__settle_deferred: the poll creates the row again
-- if it was deleted), and dq__poll_level never delivers the head of a group with a queued settle
-- before applying it. So an offer, an ack, a cancel or a purge does not wait for a consumer's
-- transaction because of a group, and two consumers that offer into each other's groups inside their
-- transactions cannot deadlock on them.
-- Why the group's order holds: the holder of a group's row reads the group's messages in a new
-- statement (READ COMMITTED) after taking the row, so it sees every change committed before, queued
-- or not; a change committed after that statement's snapshot is linearised after it, and its queued
-- settle is applied before the group's head is delivered again. One message of a group is in flight
-- at a time because a head is delivered only by the holder of its group's row.
-- What still waits: the insert of a new group's row (the group's first message) waits for another
-- open transaction inserting the same group's row, as two offers of one new key wait for each other
-- (the primary key decides). When settles of that group are queued the inserting transaction may be a
-- poll applying them inside a consumer's transaction: then the wait is bounded to 1 ms and the settle
-- is queued instead (dq__create_group_rows_soon).
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- The settles of earlier releases (without dues and defer): replaced by the signatures below, in this
-- transaction (a call with two arguments would match both).
DROP FUNCTION IF EXISTS dq__settle_group_heads(text[], text[]);
DROP FUNCTION IF EXISTS dq__settle_groups(text[], text[]);
-- Set the heads of the groups (queues[i], message_groups[i]) (NULL groups are ignored, each group
-- once) from their messages as they are now; one row (queue, due) for each group whose head or its
-- due time changed, due being the head's due time (the caller wakes waiters with it), and one for
-- each group whose settle was queued, due being the least of its dues[i] (the earliest time the
-- caller's change can make something of the group deliverable; NULL or missing: now). A group left
-- without messages loses its dq_groups row. Called after the caller changed the groups' messages, in
-- the same transaction. defer false (dq__settle_deferred): a group whose row is held is skipped, not
-- queued.
-- Concurrency: the first statement locks the existing rows of the groups FOR NO KEY UPDATE SKIP
-- LOCKED, in (queue, message_group) order. For the groups it did not lock, a second statement inserts
-- the rows of new groups (no row, no queued settle; ON CONFLICT DO NOTHING, in that order), which
-- waits only for another transaction inserting the same group's row, as two offers of one new key wait
-- for each other. A group without a row but with queued settles is left to a third insert that waits
-- 1 ms at most (dq__create_group_rows_soon): the next poll may be inserting that row inside a
-- consumer's transaction. A group whose row it neither locked nor inserted is held by another
-- transaction: its settle is queued in dq_group_settles (that transaction, or the next poll after it,
-- applies it). The queued settles of the groups it holds are deleted before the messages are read:
-- they were committed before, so the reads, new statements under READ COMMITTED, see their changes
-- (with every change committed by the previous holder of a row). A change that is not committed yet
-- is settled by its own transaction. Queued settles are deleted SKIP LOCKED: one that another open
-- transaction is deleting is left to it (applying a settle twice changes nothing).
CREATE OR REPLACE FUNCTION dq__settle_group_heads(queues text[], message_groups text[],
                                                  dues timestamptz[] DEFAULT NULL, defer boolean DEFAULT true)
RETURNS TABLE (queue text, due timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_q       text[];
    v_g       text[];
    v_h       bigint[];
    v_p       smallint[];
    v_d       timestamptz[];
    v_n       bigint;
    v_queued  boolean;
    v_mq      text[];
    v_mg      text[];
    v_bq      text[];
    v_bg      text[];
BEGIN
    WITH w AS (
        SELECT DISTINCT u.q, u.g
          FROM unnest(dq__settle_group_heads.queues, dq__settle_group_heads.message_groups) AS u(q, g)
         WHERE u.g IS NOT NULL
    ), locked AS (
        -- One primary-key probe per group (LATERAL): a join could be planned, generic plan, as a scan
        -- of every group of the queue. Never waits, so the order of the locks does not matter.
        SELECT g.queue, g.message_group, g.head_id, g.priority, g.due_at
          FROM w
         CROSS JOIN LATERAL (SELECT g.queue, g.message_group, g.head_id, g.priority, g.due_at
                               FROM dq_groups g
                              WHERE g.queue = w.q AND g.message_group = w.g
                                FOR NO KEY UPDATE SKIP LOCKED) g
    )
    SELECT array_agg(l.queue), array_agg(l.message_group), array_agg(l.head_id), array_agg(l.priority),
           array_agg(l.due_at), (SELECT count(*) FROM w), coalesce(bool_or(q.x IS NOT NULL), false)
      INTO v_q, v_g, v_h, v_p, v_d, v_n, v_queued
      FROM locked l
      LEFT JOIN LATERAL (SELECT 1 AS x FROM dq_group_settles s
                          WHERE s.queue = l.queue AND s.message_group = l.message_group LIMIT 1) q ON true;

    IF coalesce(cardinality(v_q), 0) < v_n THEN
        -- The groups not locked: a new group (no row, no queued settle) gets its row here; a group
        -- whose row another transaction holds is busy; a group without a row but with queued settles
        -- is left to the guarded insert below. One statement, one snapshot.
        WITH rest AS (
            SELECT DISTINCT u.q, u.g
              FROM unnest(dq__settle_group_heads.queues, dq__settle_group_heads.message_groups) AS u(q, g)
             WHERE u.g IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM unnest(v_q, v_g) AS h(q, g) WHERE h.q = u.q AND h.g = u.g)
        ), kinds AS (
            -- LATERAL .. LIMIT 1: one index probe per group (an EXISTS here may be planned as a hashed
            -- subplan that reads the whole table).
            SELECT r.q, r.g, hr.x IS NOT NULL AS has_row, hq.x IS NOT NULL AS has_queued
              FROM rest r
              LEFT JOIN LATERAL (SELECT 1 AS x FROM dq_groups x
                                  WHERE x.queue = r.q AND x.message_group = r.g LIMIT 1) hr ON true
              LEFT JOIN LATERAL (SELECT 1 AS x FROM dq_group_settles s
                                  WHERE s.queue = r.q AND s.message_group = r.g LIMIT 1) hq ON true
        ), created AS (
            -- dq__create_group_rows written out: calling it costs 13 us per new group (measured).
            INSERT INTO dq_groups AS g (queue, message_group, head_id, priority, due_at)
            SELECT k.q, k.g, NULL, 0, dq__max_time()
              FROM kinds k
             WHERE NOT k.has_row AND NOT k.has_queued
             ORDER BY k.q COLLATE "C", k.g COLLATE "C"
            ON CONFLICT (queue, message_group) DO NOTHING
            RETURNING g.queue, g.message_group, g.head_id, g.priority, g.due_at
        )
        SELECT v_q || array_agg(c.queue) FILTER (WHERE c.queue IS NOT NULL),
               v_g || array_agg(c.message_group) FILTER (WHERE c.queue IS NOT NULL),
               v_h || array_agg(c.head_id) FILTER (WHERE c.queue IS NOT NULL),
               v_p || array_agg(c.priority) FILTER (WHERE c.queue IS NOT NULL),
               v_d || array_agg(c.due_at) FILTER (WHERE c.queue IS NOT NULL),
               array_agg(k.q) FILTER (WHERE NOT k.has_row AND k.has_queued),
               array_agg(k.g) FILTER (WHERE NOT k.has_row AND k.has_queued),
               -- Busy: a row held by another transaction, or inserted and committed by one after this
               -- statement's snapshot (the insert found it: nothing created).
               array_agg(k.q) FILTER (WHERE c.queue IS NULL AND (k.has_row OR NOT k.has_queued)),
               array_agg(k.g) FILTER (WHERE c.queue IS NULL AND (k.has_row OR NOT k.has_queued))
          INTO v_q, v_g, v_h, v_p, v_d, v_mq, v_mg, v_bq, v_bg
          FROM kinds k
          LEFT JOIN created c ON c.queue = k.q AND c.message_group = k.g;
        IF v_mq IS NOT NULL THEN
            -- No row but queued settles: nothing to settle when the group has no messages (its queued
            -- settles are deleted); otherwise the next poll may be inserting the row now, in a
            -- transaction that can last (a consumer's), so this insert waits 1 ms at most.
            WITH k AS (
                SELECT m.q, m.g, hm.x IS NOT NULL AS has_messages
                  FROM unnest(v_mq, v_mg) AS m(q, g)
                  LEFT JOIN LATERAL (SELECT 1 AS x FROM dq_messages x
                                      WHERE x.queue = m.q AND x.message_group = m.g AND x.dead_from IS NULL
                                      LIMIT 1) hm ON true
            ), moot AS (
                DELETE FROM dq_group_settles s
                 WHERE s.ctid = ANY (ARRAY(
                        SELECT x.ctid FROM k
                         CROSS JOIN LATERAL (SELECT x.ctid FROM dq_group_settles x
                                              WHERE x.queue = k.q AND x.message_group = k.g
                                                FOR UPDATE SKIP LOCKED) x
                         WHERE NOT k.has_messages))
            )
            SELECT array_agg(k.q ORDER BY k.q COLLATE "C", k.g COLLATE "C") FILTER (WHERE k.has_messages),
                   array_agg(k.g ORDER BY k.q COLLATE "C", k.g COLLATE "C") FILTER (WHERE k.has_messages)
              INTO v_mq, v_mg
              FROM k;
        END IF;
        IF v_mq IS NOT NULL THEN
            BEGIN
                WITH c AS (
                    SELECT * FROM dq__create_group_rows_soon(v_mq, v_mg)
                ), cleared AS (
                    DELETE FROM dq_group_settles s
                     WHERE s.ctid = ANY (ARRAY(
                            SELECT x.ctid FROM c
                             CROSS JOIN LATERAL (SELECT x.ctid FROM dq_group_settles x
                                                  WHERE x.queue = c.queue AND x.message_group = c.message_group
                                                    FOR UPDATE SKIP LOCKED) x))
                )
                SELECT v_q || array_agg(c.queue), v_g || array_agg(c.message_group), v_h || array_agg(c.head_id),
                       v_p || array_agg(c.priority), v_d || array_agg(c.due_at),
                       v_bq || array_agg(m.q) FILTER (WHERE c.queue IS NULL),
                       v_bg || array_agg(m.g) FILTER (WHERE c.queue IS NULL)
                  INTO v_q, v_g, v_h, v_p, v_d, v_bq, v_bg
                  FROM unnest(v_mq, v_mg) AS m(q, g)
                  LEFT JOIN c ON c.queue = m.q AND c.message_group = m.g;
            EXCEPTION WHEN lock_not_available THEN
                v_bq := v_bq || v_mq;  -- another transaction is inserting one of these rows
                v_bg := v_bg || v_mg;
            END;
        END IF;
        IF v_bq IS NOT NULL AND dq__settle_group_heads.defer THEN
            -- Held by another transaction: queue the settles (the caller wakes waiters at their due time).
            RETURN QUERY
            INSERT INTO dq_group_settles AS s (queue, message_group, due_at)
            SELECT b.q, b.g,
                   coalesce((SELECT min(u.d)
                               FROM unnest(dq__settle_group_heads.queues, dq__settle_group_heads.message_groups,
                                           dq__settle_group_heads.dues) AS u(q, g, d)
                              WHERE u.q = b.q AND u.g = b.g), dq__clock())
              FROM unnest(v_bq, v_bg) AS b(q, g)
            RETURNING s.queue, s.due_at;
        END IF;
    END IF;
    IF v_q IS NULL THEN
        RETURN;
    END IF;
    IF v_queued THEN
        -- Settles queued for the groups held now are applied by this one (committed before the reads below).
        DELETE FROM dq_group_settles s
         WHERE s.ctid = ANY (ARRAY(
                SELECT x.ctid FROM unnest(v_q, v_g) AS h(q, g)
                 CROSS JOIN LATERAL (SELECT x.ctid FROM dq_group_settles x
                                      WHERE x.queue = h.q AND x.message_group = h.g
                                        FOR UPDATE SKIP LOCKED) x));
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
COMMENT ON FUNCTION dq__settle_group_heads(text[], text[], timestamptz[], boolean) IS 'Internal: sets the heads of FIFO groups from their messages (locking their dq_groups rows, SKIP LOCKED); a group whose row another transaction holds gets a queued settle (dq_group_settles) unless defer is false; returns (queue, due) for each group whose head changed or whose settle was queued.';
REVOKE ALL ON FUNCTION dq__settle_group_heads(text[], text[], timestamptz[], boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Insert the dq_groups rows of new groups (queues[i], message_groups[i]), in (queue, message_group)
-- order, head NULL and never due until dq__settle_group_heads sets the head; returns the rows
-- inserted (a row another transaction inserted and committed meanwhile is left out). Waits for
-- another transaction inserting the same row (the primary key decides), as offers of one new key do.
CREATE OR REPLACE FUNCTION dq__create_group_rows(queues text[], message_groups text[])
RETURNS TABLE (queue text, message_group text, head_id bigint, priority smallint, due_at timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO dq_groups AS g (queue, message_group, head_id, priority, due_at)
    SELECT c.q, c.g, NULL, 0, dq__max_time()
      FROM unnest(dq__create_group_rows.queues, dq__create_group_rows.message_groups) AS c(q, g)
     ORDER BY c.q COLLATE "C", c.g COLLATE "C"
    ON CONFLICT (queue, message_group) DO NOTHING
    RETURNING g.queue, g.message_group, g.head_id, g.priority, g.due_at;
END;
$$;
COMMENT ON FUNCTION dq__create_group_rows(text[], text[]) IS 'Internal: inserts the dq_groups rows of new FIFO groups (head NULL, not due) and returns those inserted.';
REVOKE ALL ON FUNCTION dq__create_group_rows(text[], text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- dq__create_group_rows when settles of the groups are queued, so the next poll may be inserting the
-- same rows inside a consumer's transaction: the wait for it is bounded to 1 ms (lock_timeout, SET
-- below; the caller catches 55P03 lock_not_available and queues its settle instead).
CREATE OR REPLACE FUNCTION dq__create_group_rows_soon(queues text[], message_groups text[])
RETURNS TABLE (queue text, message_group text, head_id bigint, priority smallint, due_at timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET lock_timeout = '1ms'
AS $$
BEGIN
    RETURN QUERY SELECT * FROM dq__create_group_rows($1, $2);
END;
$$;
COMMENT ON FUNCTION dq__create_group_rows_soon(text[], text[]) IS 'Internal: dq__create_group_rows with lock_timeout 1 ms (55P03 when another transaction is inserting one of the rows).';
REVOKE ALL ON FUNCTION dq__create_group_rows_soon(text[], text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- dq__settle_group_heads for one group: the head's due time when it changed (or the settle was
-- queued), else NULL.
CREATE OR REPLACE FUNCTION dq__settle_group(queue text, message_group text)
RETURNS timestamptz
LANGUAGE sql VOLATILE SET search_path FROM CURRENT
AS $$
    SELECT min(s.due) FROM dq__settle_group_heads(ARRAY[$1], ARRAY[$2]) s
$$;
COMMENT ON FUNCTION dq__settle_group(text, text) IS 'Internal: sets the head of a FIFO group from its messages (locking the group''s dq_groups row, or queueing the settle when another transaction holds it); returns the head''s due time when it changed.';
REVOKE ALL ON FUNCTION dq__settle_group(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Settle the groups (queues[i], message_groups[i]) (NULL groups are ignored) with
-- dq__settle_group_heads (dues[i]: the earliest time the caller's change can make something of the
-- group deliverable, for a settle that has to be queued; NULL: now), and wake the waiters of each
-- queue whose heads changed or whose settles were queued (once per queue, with the earliest due
-- time). Returns the number of groups settled or queued.
CREATE OR REPLACE FUNCTION dq__settle_groups(queues text[], message_groups text[], dues timestamptz[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
DECLARE
    r       record;
    v_woken boolean;
BEGIN
    FOR r IN SELECT s.queue, min(s.due) AS due FROM dq__settle_group_heads(queues, message_groups, dues) s
              GROUP BY s.queue LOOP
        v_woken := dq__wake(r.queue, r.due);
    END LOOP;
    RETURN (SELECT count(DISTINCT (u.q, u.g)) FROM unnest(queues, message_groups) AS u(q, g) WHERE u.g IS NOT NULL);
END;
$$;
COMMENT ON FUNCTION dq__settle_groups(text[], text[], timestamptz[]) IS 'Internal: dq__settle_group_heads for each distinct (queue, message_group) pair (dues: when the change can make something deliverable, for a queued settle), waking waiters when a head changed or a settle was queued.';
REVOKE ALL ON FUNCTION dq__settle_groups(text[], text[], timestamptz[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Apply the queued settles of a queue that are due by at (at most 100 groups a call), for each group
-- whose row no other transaction holds. Called by dq_poll_many before it looks for candidates, so a
-- group whose head changed while another transaction held its row is settled before its head is
-- delivered (dq__poll_level also never delivers the head of a group with a queued settle). Returns
-- the number of groups tried (each is settled unless another transaction holds its row).
-- Concurrency: the groups are settled with defer => false: one whose row another transaction holds is
-- skipped and its settles stay queued (they are not locked here: only the holder of a group's row
-- deletes them). Settling a group whose row is gone creates the row, which could wait for another
-- transaction creating it; lock_timeout is 1 ms here (SET below), and a settle that times out is
-- rolled back to its subtransaction: all the groups in one first, then each alone, so the others are
-- settled and the one being created stays queued. So a poll waits at most about 1 ms for it, and only
-- then; without queued settles due, none of this runs.
CREATE OR REPLACE FUNCTION dq__settle_deferred(queue text, at timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET lock_timeout = '1ms'
AS $$
#variable_conflict use_column
DECLARE
    v_groups  text[];
    v_g       text;
    v_done    integer := 0;
    r         record;
    v_woken   boolean;
BEGIN
    BEGIN
        SELECT array_agg(t.message_group ORDER BY t.message_group COLLATE "C") INTO v_groups FROM (
            SELECT DISTINCT s.message_group FROM dq_group_settles s
             WHERE s.queue = dq__settle_deferred.queue AND s.due_at <= dq__settle_deferred.at
             LIMIT 100) t;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0;  -- the table is locked (a migration): the next poll applies them
    END;
    IF v_groups IS NULL THEN
        RETURN 0;
    END IF;
    BEGIN
        FOR r IN SELECT s.queue, min(s.due) AS due
                   FROM dq__settle_group_heads(array_fill(dq__settle_deferred.queue, ARRAY[cardinality(v_groups)]),
                                               v_groups, NULL, false) s
                  GROUP BY s.queue LOOP
            v_woken := dq__wake(r.queue, r.due);
        END LOOP;
        RETURN cardinality(v_groups);
    EXCEPTION WHEN lock_not_available THEN
        NULL;  -- a group's row is being created by another transaction: one group at a time below
    END;
    FOREACH v_g IN ARRAY v_groups LOOP
        BEGIN
            FOR r IN SELECT s.queue, min(s.due) AS due
                       FROM dq__settle_group_heads(ARRAY[dq__settle_deferred.queue], ARRAY[v_g], NULL, false) s
                      GROUP BY s.queue LOOP
                v_woken := dq__wake(r.queue, r.due);
            END LOOP;
            v_done := v_done + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- its settles stay queued
        END;
    END LOOP;
    RETURN v_done;
END;
$$;
COMMENT ON FUNCTION dq__settle_deferred(text, timestamptz) IS 'Internal: applies the queued settles (dq_group_settles) of a queue due by at, for the groups whose dq_groups row no other transaction holds; returns how many groups were tried.';
REVOKE ALL ON FUNCTION dq__settle_deferred(text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Move the due time of a FIFO group whose head is head_id (still in flight or just given back) to due:
-- dq_nack and dq_extend, after changing the head's scheduled_at. The group's row is locked SKIP
-- LOCKED: when another transaction holds it, the change is queued as a settle of the group (due at
-- due) instead, and applied by the next poll or settle that holds the row. Returns whether the row
-- was updated now.
CREATE OR REPLACE FUNCTION dq__set_group_due(queue text, message_group text, head_id bigint, due timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM dq_groups g
      WHERE g.queue = dq__set_group_due.queue AND g.message_group = dq__set_group_due.message_group
        FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        -- A new statement: it sees the row as the previous holder of its lock left it.
        UPDATE dq_groups g SET due_at = dq__set_group_due.due
         WHERE g.queue = dq__set_group_due.queue AND g.message_group = dq__set_group_due.message_group
           AND g.head_id = dq__set_group_due.head_id;
        RETURN FOUND;
    END IF;
    INSERT INTO dq_group_settles (queue, message_group, due_at)
    SELECT g.queue, g.message_group, dq__set_group_due.due FROM dq_groups g
     WHERE g.queue = dq__set_group_due.queue AND g.message_group = dq__set_group_due.message_group
       AND g.head_id = dq__set_group_due.head_id;
    RETURN false;
END;
$$;
COMMENT ON FUNCTION dq__set_group_due(text, text, bigint, timestamptz) IS 'Internal: sets the due time of the FIFO group headed by head_id, or queues a settle of the group when another transaction holds its dq_groups row; returns whether the row was updated.';
REVOKE ALL ON FUNCTION dq__set_group_due(text, text, bigint, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
