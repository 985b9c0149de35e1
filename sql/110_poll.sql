-- Polling: dq_poll_many acquires due messages under a visibility timeout.
--
-- Each message gets its own lock token (so one message of a batch can be acknowledged, nacked or
-- extended alone), and the visibility timeout (SQS Developer Guide, "Amazon SQS visibility
-- timeout") is kept in scheduled_at itself, moved forward to now + lock_timeout.
--
-- Concurrency (READ COMMITTED): the first statement locks the candidate rows FOR UPDATE SKIP LOCKED, so
-- concurrent pollers never pick the same row; a row that another transaction changed after our
-- snapshot is re-checked against `scheduled_at <= now` before it is locked (EvalPlanQual), so a
-- row that was just acquired (its scheduled_at moved into the future) is not taken twice.
-- Each delivery records when it was due (due_at, the scheduled_at it replaces) and when it was
-- claimed (claimed_at), for the archive and for lateness.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;
CREATE OR REPLACE FUNCTION dq_poll_many(
    queue         text,
    max_count     integer DEFAULT 1,
    lock_timeout  interval DEFAULT '5 minutes')
RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
-- The statements are planned once per session (generic plans: re-planning cost 0.2-0.3 ms per call).
-- A session that first polls an empty table would keep the plan that is cheapest for an empty
-- table (sequential scan and sort) until the next ANALYZE, and later poll a backlog of 100,000 rows
-- with it (measured by bench/latency.py: 38-160 ms per poll). Disabling sequential scans for these
-- statements leaves the planner only the index plans, which are right at every size. A disabled
-- plan node adds a huge cost, which could reach jit_above_cost and compile a tiny statement for
-- hundreds of milliseconds (seen in tests/core/test_plans.py): JIT is off for this function.
-- A generic plan estimates LIMIT v_want - v_got at a tenth of the queue's rows, and then updated the
-- candidates by a merge join over the whole primary key: 14 ms per poll with 100,000 future messages,
-- 129 ms with 1,000,000 (bench.core's latency table). Every join here takes at most max_count rows
-- (10,000), so merge and hash joins are off: the candidates are updated by id, by index.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_mergejoin = off
SET enable_hashjoin = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_now      timestamptz := dq__clock();
    v_admit    record;
    v_until    timestamptz;
    v_cfg      dq_queues;
    v_want     integer;
    v_slots    integer[];
    v_level    integer := dq__limit_priority_max();
    v_p        integer;          -- the next level of ungrouped messages, and its earliest due time
    v_pdue     timestamptz;
    v_gp       integer;          -- the next level of FIFO groups, and its earliest due time
    v_gdue     timestamptz;
    v_top      integer;          -- the level read: the higher of the two
    v_passed   integer := 0;     -- levels that gave no candidate
    v_ids      bigint[] := '{}';
    v_due      timestamptz[] := '{}';
    v_lids     bigint[];
    v_ldue     timestamptz[];
    v_kept     record;
    v_got      integer;
    v_done     integer;
    v_grouped  boolean := false;  -- some candidate came from dq__poll_level (a group head may be among them)
    v_expiring boolean := false;  -- some ungrouped candidate is past its expires_at
    v_maxcount integer := 0;      -- the highest delivery_count of the ungrouped candidates
    v_direct   boolean;           -- levels of ungrouped messages may be acquired in one statement each
    v_taken    integer := 0;      -- messages acquired (and returned) that way
    v_released integer;           -- children released from the backlog
BEGIN
    v_error := coalesce(
        dq__name_error('dq_poll_many', 'queue', dq_poll_many.queue, dq__limit_queue_chars()),
        dq__range_error('dq_poll_many', 'max_count', dq_poll_many.max_count, 1, dq__limit_poll_max_count()),
        -- The lock expiry, checked by its effect (positive, within the stored range).
        dq__time_after_error('dq_poll_many', 'lock_timeout', dq_poll_many.lock_timeout, v_now, false));
    IF v_error IS NULL THEN
        v_admit := dq__poll_admit(dq_poll_many.queue, dq_poll_many.max_count, dq_poll_many.lock_timeout, v_now);
        v_error := v_admit.error;
    END IF;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    -- Children that acknowledgements left to the release backlog (sql/095_dependencies.sql): one
    -- chunk, whatever queue they are in, before the read, so that children of this queue are
    -- delivered by this poll. An empty backlog costs one probe of its primary key.
    IF EXISTS (SELECT 1 FROM dq_release_backlog b) THEN
        v_released := dq__release_backlog(dq__limit_release_inline());
    END IF;
    IF v_admit.want = 0 THEN
        RETURN;
    END IF;
    v_cfg := v_admit.cfg;
    v_now := v_admit.clock;
    v_want := v_admit.want;
    v_slots := v_admit.slots;
    v_until := v_now + dq_poll_many.lock_timeout;
    -- When no candidate can leave the queue instead of being delivered (the queue has no
    -- max_deliveries, and no message of it has expired: one probe of dq_messages_expires_at_idx), a
    -- level of only ungrouped messages is locked and acquired in one statement, as the plain-SQL
    -- loop of bench/core.py does (measured: 0.5 to 2 us a message less than gathering the candidates
    -- first). Only while nothing was gathered, so the rows still come out highest level first. A
    -- message that expires between the probe and that statement is passed over, not delivered, and
    -- left to the next poll.
    v_direct := v_cfg.max_deliveries IS NULL
                AND NOT EXISTS (SELECT 1 FROM dq_messages d WHERE d.queue = dq_poll_many.queue AND d.expires_at <= v_now);

    -- Candidates, one priority level at a time from the highest. At each level: due ungrouped messages
    -- from dq_messages_ready_idx, and due FIFO groups from dq_groups, whose rows and heads are locked FOR
    -- UPDATE SKIP LOCKED (concurrent pollers never take the same message or group; a row changed after
    -- our snapshot is re-checked on its latest version, so a message just acquired by another poller,
    -- its scheduled_at moved into the future, is not taken twice). Earliest due first within a level.
    -- The next level: both indexes are ordered by priority, then due time, so a level's first entry
    -- is its earliest. At first a skip scan: one probe per level (the first entry of the next level of
    -- either kind), however many messages the level holds; a level whose first entry is not due has
    -- nothing due and is passed over. After 128 levels that gave nothing (levels of future messages,
    -- or of messages other pollers hold), each probe finds the highest level with a due entry at once,
    -- the due time checked on the index entries (no row is read for an entry that is not due), so it
    -- reads the entries of the levels it passes. Measured (bench/controls.py, part 4): a skip-scan
    -- step costs about 8 us and 6 buffers, a passed entry about 30 ns (150 to a page), so 128 steps
    -- cost what passing 30,000 entries does. One probe per level made an empty poll over 65,536
    -- levels of future messages cost 590,000 buffers and over a second (now 3 ms); the due probe
    -- alone would read every future message of the levels above the first due one (100 levels of
    -- 5,000: 15 ms, where the skip scan takes 1 ms). Worst case: more than 128 levels of many future
    -- messages each above the first due one, where the poll reads the index entries below the 128th.
    LOOP
        IF v_passed < 128 THEN
            SELECT u.priority, u.scheduled_at, g.priority, g.due_at INTO v_p, v_pdue, v_gp, v_gdue
              FROM (SELECT) s
              LEFT JOIN LATERAL (
                   SELECT d.priority, d.scheduled_at FROM dq_messages d
                    WHERE d.queue = dq_poll_many.queue AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                      AND d.priority <= v_level
                    ORDER BY d.priority DESC, d.scheduled_at LIMIT 1) u ON true
              LEFT JOIN LATERAL (
                   SELECT g.priority, g.due_at FROM dq_groups g
                    WHERE g.queue = dq_poll_many.queue AND g.priority <= v_level
                    ORDER BY g.priority DESC, g.due_at LIMIT 1) g ON true;
        ELSE
            SELECT u.priority, u.scheduled_at, g.priority, g.due_at INTO v_p, v_pdue, v_gp, v_gdue
              FROM (SELECT) s
              LEFT JOIN LATERAL (
                   SELECT d.priority, d.scheduled_at FROM dq_messages d
                    WHERE d.queue = dq_poll_many.queue AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                      AND d.priority <= v_level AND d.scheduled_at <= v_now
                    ORDER BY d.priority DESC, d.scheduled_at LIMIT 1) u ON true
              LEFT JOIN LATERAL (
                   SELECT g.priority, g.due_at FROM dq_groups g
                    WHERE g.queue = dq_poll_many.queue AND g.priority <= v_level AND g.due_at <= v_now
                    ORDER BY g.priority DESC, g.due_at LIMIT 1) g ON true;
        END IF;
        EXIT WHEN v_p IS NULL AND v_gp IS NULL;
        v_top := greatest(v_p, v_gp);
        v_got := cardinality(v_ids) + v_taken;
        v_lids := NULL;
        v_ldue := NULL;
        IF v_gp = v_top AND v_gdue <= v_now THEN
            -- Due groups at this level (and perhaps ungrouped messages): both, merged by due time.
            SELECT l.ids, l.due INTO v_lids, v_ldue
              FROM dq__poll_level(dq_poll_many.queue, v_top::smallint, v_now, v_want - v_got) l;
            v_grouped := true;
        ELSIF v_p = v_top AND v_pdue <= v_now AND v_direct AND cardinality(v_ids) = 0 THEN
            -- Only ungrouped messages are due at this level, none of them can leave the queue: acquired here.
            RETURN QUERY
            WITH c AS (
                SELECT d.id, d.scheduled_at FROM dq_messages d
                 WHERE d.queue = dq_poll_many.queue AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                   AND d.priority = v_top AND d.scheduled_at <= v_now
                   AND (d.expires_at IS NULL OR d.expires_at > v_now)
                 ORDER BY d.scheduled_at
                 LIMIT v_want - v_got
                   FOR UPDATE SKIP LOCKED
            ), acquired AS (
                UPDATE dq_messages m
                   SET scheduled_at = v_until,
                       lock_token = gen_random_uuid(),
                       delivery_count = m.delivery_count + 1,
                       due_at = c.scheduled_at,
                       claimed_at = v_now
                  FROM c
                 WHERE m.id = c.id
                RETURNING m.id, m.queue, m.key, m.payload, m.payload_type, c.scheduled_at AS due_at,
                          m.scheduled_at_initially, m.created_at, m.delivery_count, m.lock_token,
                          m.scheduled_at AS locked_until, m.claimed_at, m.priority::integer AS priority,
                          m.message_group, m.expires_at, m.headers
            )
            SELECT a.id, a.queue, a.key, a.payload, a.payload_type, a.due_at, a.scheduled_at_initially,
                   a.created_at, a.delivery_count, a.lock_token, a.locked_until, a.claimed_at, a.priority,
                   a.message_group, a.expires_at, a.headers
              FROM acquired a
             ORDER BY a.due_at, a.id;
            GET DIAGNOSTICS v_done = ROW_COUNT;
            v_taken := v_taken + v_done;
        ELSIF v_p = v_top AND v_pdue <= v_now THEN
            -- Only ungrouped messages are due at this level.
            -- What the checks below need comes with the candidates, so a plain poll runs no query for them.
            SELECT array_agg(c.id ORDER BY c.scheduled_at, c.id), array_agg(c.scheduled_at ORDER BY c.scheduled_at, c.id),
                   v_expiring OR coalesce(bool_or(c.expires_at <= v_now), false),
                   greatest(v_maxcount, max(c.delivery_count))
              INTO v_lids, v_ldue, v_expiring, v_maxcount
              FROM (SELECT d.id, d.scheduled_at, d.expires_at, d.delivery_count
                      FROM dq_messages d
                     WHERE d.queue = dq_poll_many.queue AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                       AND d.priority = v_top AND d.scheduled_at <= v_now
                     ORDER BY d.scheduled_at
                     LIMIT v_want - v_got
                       FOR UPDATE SKIP LOCKED) c;
        END IF;
        v_ids := v_ids || coalesce(v_lids, '{}');
        v_due := v_due || coalesce(v_ldue, '{}');
        IF cardinality(v_ids) + v_taken = v_got THEN
            v_passed := v_passed + 1;
        END IF;
        EXIT WHEN cardinality(v_ids) + v_taken >= v_want OR v_top <= dq__limit_priority_min();
        v_level := v_top - 1;
    END LOOP;
    IF cardinality(v_ids) = 0 THEN
        v_ids := NULL;
    END IF;

    -- Expired candidates and those already delivered max_deliveries times leave the queue instead of
    -- being delivered (dq__poll_remove); only a poll whose candidates may hold one looks.
    IF v_ids IS NOT NULL AND (v_expiring OR v_grouped OR v_maxcount >= v_cfg.max_deliveries) THEN
        v_kept := dq__poll_remove(v_ids, v_due, v_cfg, v_now, v_expiring OR v_grouped,
                                  v_grouped OR v_maxcount >= v_cfg.max_deliveries);
        v_ids := v_kept.kept;
        v_due := v_kept.kept_dues;
    END IF;
    IF v_ids IS NULL THEN
        IF v_taken > 0 AND (v_slots IS NOT NULL OR v_cfg.max_in_flight IS NOT NULL) THEN
            v_done := dq__poll_account(dq_poll_many.queue, '{}', v_until, v_now, false, v_slots[1:v_taken],
                                       v_cfg.max_in_flight IS NOT NULL);
        END IF;
        RETURN;
    END IF;

    RETURN QUERY
    WITH acquired AS (
        UPDATE dq_messages m
           SET scheduled_at = v_until,
               lock_token = gen_random_uuid(),
               delivery_count = m.delivery_count + 1,
               due_at = due.due_at,
               claimed_at = v_now
          FROM unnest(v_ids, v_due) WITH ORDINALITY AS due(id, due_at, n)
         WHERE m.id = due.id
        RETURNING m.id, m.queue, m.key, m.payload, m.payload_type, due.due_at,
                  m.scheduled_at_initially, m.created_at, m.delivery_count, m.lock_token,
                  m.scheduled_at AS locked_until, m.claimed_at, m.priority::integer AS priority,
                  m.message_group, m.expires_at, m.headers, due.n
    )
    SELECT a.id, a.queue, a.key, a.payload, a.payload_type, a.due_at, a.scheduled_at_initially,
           a.created_at, a.delivery_count, a.lock_token, a.locked_until, a.claimed_at, a.priority,
           a.message_group, a.expires_at, a.headers
      FROM acquired a
     ORDER BY a.n;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    v_got := v_got + v_taken;
    IF v_grouped OR v_slots IS NOT NULL OR (v_cfg.max_in_flight IS NOT NULL AND v_got > 0) THEN
        v_done := dq__poll_account(dq_poll_many.queue, v_ids, v_until, v_now, v_grouped, v_slots[1:v_got],
                                   v_cfg.max_in_flight IS NOT NULL AND v_got > 0);
    END IF;
END;
$$;
COMMENT ON FUNCTION dq_poll_many(text, integer, interval) IS 'dq_poll_many(queue text, max_count integer default 1, lock_timeout interval default 5 min) -> SETOF dq_delivery: acquires up to max_count due messages as the queue''s controls and FIFO groups allow, each with a fresh lock_token, invisible until locked_until. Errors: 22004 NULL, 22023 max_count out of 1..10000 or lock_timeout not positive, 22008 now + lock_timeout past 9999-12-30.';
REVOKE ALL ON FUNCTION dq_poll_many(text, integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_poll_many(text, integer, interval) TO dq_consumer;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- Admission: what the queue's controls let this poll of queue take at `at` (the clock its arguments
-- were checked at). Returns the queue's configuration (cfg, all NULL for a queue never configured),
-- the poll's clock (clock: read again when the configuration row's lock was waited for), how many
-- messages it may take (want, 0 for none: paused, at its max_in_flight, or no rate token), the rate
-- tokens it took (slots, oldest first; NULL without a rate limit), and error: lock_timeout checked
-- again at the new clock. FIFO groups whose settle was queued while another transaction held their
-- row get their heads before any is delivered (sql/020_groups.sql).
-- No SET clause: it runs only inside dq_poll_many, with its settings (search_path, generic plans,
-- no sequential scan, no JIT), and a SET clause would cost every poll (measured, 1.5 us each).
CREATE OR REPLACE FUNCTION dq__poll_admit(queue text, max_count integer, lock_timeout interval, at timestamptz,
                                          OUT cfg dq_queues, OUT clock timestamptz, OUT want integer,
                                          OUT slots integer[], OUT error jsonb)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_busy  integer;
    v_done  integer;
BEGIN
    clock := at;
    want := max_count;
    -- The queue's controls (one probe; an unconfigured queue has none).
    SELECT q.* INTO cfg FROM dq_queues q WHERE q.queue = dq__poll_admit.queue;
    IF cfg.paused THEN
        want := 0;
        RETURN;
    END IF;
    IF cfg.max_in_flight IS NOT NULL THEN
        -- Concurrency limit. The pollers of the queue take its configuration row's lock in turn (FOR
        -- NO KEY UPDATE, held to the end of the transaction), then count the messages in flight: a new
        -- statement under READ COMMITTED, it sees every acquisition committed by the previous holder,
        -- so the limit holds across all sessions. Acks, nacks and offers do not take this lock.
        SELECT q.* INTO cfg FROM dq_queues q WHERE q.queue = dq__poll_admit.queue FOR NO KEY UPDATE;
        IF cfg.paused THEN
            want := 0;
            RETURN;
        END IF;
        -- That lock may have waited for another poller's transaction: every time this poll stores
        -- (locked_until, claimed_at, rate tokens, archive times) is read after it, or a lock would be
        -- handed out already expired (and the message delivered twice).
        clock := dq__clock();
        error := dq__time_after_error('dq_poll_many', 'lock_timeout', lock_timeout, clock, false);
        IF error IS NOT NULL THEN
            want := 0;
            RETURN;
        END IF;
        IF cfg.max_in_flight IS NOT NULL THEN
            v_busy := dq__in_flight(dq__poll_admit.queue, clock, cfg.max_in_flight);
            want := greatest(least(want, cfg.max_in_flight - v_busy), 0);
            IF want = 0 THEN
                RETURN;
            END IF;
        END IF;
    END IF;
    IF cfg.rate_limit IS NOT NULL THEN
        -- Rate limit, a sliding-window log: the queue has rate_limit rows in dq_rate_tokens, each the
        -- start of one recent delivery; a delivery takes a row whose start is at least rate_period old
        -- and writes its own (the poll's clock) into it (dq__poll_account). Rows are taken FOR UPDATE
        -- SKIP LOCKED and re-checked on their latest version, so each row is used at most once in any
        -- window of rate_period: at most rate_limit deliveries start in any such window, whatever the
        -- number of pollers.
        SELECT array_agg(t.slot ORDER BY t.used_at, t.slot) INTO slots FROM (
            SELECT t.slot, t.used_at FROM dq_rate_tokens t
             WHERE t.queue = dq__poll_admit.queue AND t.used_at <= clock - cfg.rate_period
             ORDER BY t.used_at
             LIMIT want
               FOR UPDATE SKIP LOCKED) t;
        want := coalesce(cardinality(slots), 0);
        IF want = 0 THEN
            RETURN;
        END IF;
    END IF;
    -- Without queued settles due this is one index probe.
    IF EXISTS (SELECT 1 FROM dq_group_settles s WHERE s.queue = dq__poll_admit.queue AND s.due_at <= clock) THEN
        v_done := dq__settle_deferred(dq__poll_admit.queue, clock);
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__poll_admit(text, integer, interval, timestamptz) IS 'Internal: what the queue''s controls (pause, max_in_flight, rate_limit) let a poll take now: (cfg, clock, want, rate token slots, lock_timeout error at the new clock); applies the queued FIFO group settles (dq_poll_many).';
REVOKE ALL ON FUNCTION dq__poll_admit(text, integer, interval, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The candidates ids (due: their due times) of a poll without those that leave the queue instead
-- of being delivered: when expire, those past their expires_at (archived with outcome expired);
-- when dead and the queue has a max_deliveries, those already delivered max_deliveries times, which
-- go to the dead-letter queue (sql/140_dead_letters.sql). Both keep their place in no group
-- (dq__gone settles them). The rest keep their order; both NULL when none is left. The caller holds
-- the candidates' row locks. Called only when a candidate may leave (dq_poll_many).
CREATE OR REPLACE FUNCTION dq__poll_remove(ids bigint[], dues timestamptz[], cfg dq_queues, at timestamptz,
                                           expire boolean, dead boolean,
                                           OUT kept bigint[], OUT kept_dues timestamptz[])
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
DECLARE
    v_gone     dq_messages[];
    v_dead     bigint[];
    v_removed  bigint[];
    v_done     integer;
BEGIN
    kept := ids;
    kept_dues := dues;
    IF expire THEN
        WITH gone AS (
            DELETE FROM dq_messages m WHERE m.id = ANY (ids) AND m.expires_at <= at RETURNING m
        )
        SELECT array_agg(gone.m), array_agg((gone.m).id) INTO v_gone, v_removed FROM gone;
        v_done := dq__gone(v_gone, 'expired', at);
    END IF;
    IF dead AND cfg.max_deliveries IS NOT NULL THEN
        SELECT array_agg(m.id) INTO v_dead FROM dq_messages m
         WHERE m.id = ANY (ids) AND m.delivery_count >= cfg.max_deliveries;
        IF v_dead IS NOT NULL THEN
            v_done := dq__dead_letter(v_dead, cfg.dead_letter_queue, at);
            v_removed := v_removed || v_dead;
        END IF;
    END IF;
    IF v_removed IS NOT NULL THEN
        SELECT array_agg(u.id ORDER BY u.o), array_agg(u.due ORDER BY u.o) INTO kept, kept_dues
          FROM unnest(ids, dues) WITH ORDINALITY AS u(id, due, o)
         WHERE u.id <> ALL (v_removed);
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__poll_remove(bigint[], timestamptz[], dq_queues, timestamptz, boolean, boolean) IS 'Internal: expires (archived as expired) and dead-letters (at max_deliveries) the candidates of a poll that must not be delivered; returns the others, in order (dq_poll_many).';
REVOKE ALL ON FUNCTION dq__poll_remove(bigint[], timestamptz[], dq_queues, timestamptz, boolean, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- What a poll of queue that acquired the messages ids (locked until `until`, at `at`) records besides
-- them: when grouped, the head and due time of each FIFO group whose head it acquired (the head
-- stays; due again when its lock expires); one rate token (slots, oldest first) per delivery; when touch (messages went
-- in flight in a queue with max_in_flight), a new version of the queue's row. Called only when one
-- of them applies (dq_poll_many).
CREATE OR REPLACE FUNCTION dq__poll_account(queue text, ids bigint[], until timestamptz, at timestamptz,
                                            grouped boolean, slots integer[], touch boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF grouped THEN
        -- Each acquired grouped message was its group's head when gathered (the group's row locked by
        -- this poll since) and, in flight now, stays the head. Set, not only checked: a child released
        -- into the group by this poll's own removals (an expired parent, dq__poll_remove) settled the
        -- group before the acquisition, when the head was not delivered yet, and may have put itself
        -- first (an earlier scheduled_at_initially): the group would have had a second message to
        -- deliver while its head is in flight.
        UPDATE dq_groups g SET head_id = m.id, priority = m.priority, due_at = dq__poll_account.until
          FROM dq_messages m
         WHERE m.id = ANY (dq__poll_account.ids) AND m.message_group IS NOT NULL AND m.dead_from IS NULL
           AND g.queue = m.queue AND g.message_group = m.message_group;
    END IF;
    IF slots IS NOT NULL THEN
        UPDATE dq_rate_tokens t SET used_at = dq__poll_account.at
         WHERE t.queue = dq__poll_account.queue AND t.slot = ANY (dq__poll_account.slots);
    END IF;
    IF touch THEN
        -- A poll that put messages in flight writes the queue's row (a new version of it, changing no
        -- value), so that a poller under REPEATABLE READ or SERIALIZABLE whose snapshot predates this
        -- transaction's commit fails to lock the row with 40001 (could not serialize access due to
        -- concurrent update; PostgreSQL manual, 13.2.2 "Repeatable Read Isolation Level") instead of
        -- counting the messages in flight with its older snapshot and exceeding max_in_flight. Under
        -- READ COMMITTED the next poller waits for the row as before and counts with a new snapshot.
        UPDATE dq_queues q SET max_in_flight = q.max_in_flight WHERE q.queue = dq__poll_account.queue;
    END IF;
    RETURN cardinality(ids);
END;
$$;
COMMENT ON FUNCTION dq__poll_account(text, bigint[], timestamptz, timestamptz, boolean, integer[], boolean) IS 'Internal: records a poll''s deliveries in the FIFO groups'' due times, the rate tokens and the queue''s row (dq_poll_many).';
REVOKE ALL ON FUNCTION dq__poll_account(text, bigint[], timestamptz, timestamptz, boolean, integer[], boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- One priority level of a queue that has FIFO groups at it: the due ungrouped messages and the due
-- group heads of priority p, earliest due first, at most max_count, locked (FOR UPDATE SKIP LOCKED:
-- the group rows, then their heads). A locked group whose head is not due (its lock was extended)
-- gets the head's due time; one whose head is gone or no longer in the group is settled again. The
-- caller holds the lock of every group it is given the head of, to the end of its transaction.
CREATE OR REPLACE FUNCTION dq__poll_level(queue text, p smallint, at timestamptz, max_count integer,
                                          OUT ids bigint[], OUT due timestamptz[])
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_groups  text[];
    v_heads   bigint[];
    v_n       integer;
BEGIN
    SELECT array_agg(g.message_group), array_agg(g.head_id) INTO v_groups, v_heads
      FROM (SELECT g.message_group, g.head_id FROM dq_groups g
             WHERE g.queue = dq__poll_level.queue AND g.priority = dq__poll_level.p AND g.due_at <= dq__poll_level.at
             ORDER BY g.due_at
             LIMIT dq__poll_level.max_count
               FOR UPDATE SKIP LOCKED) g;
    WITH heads AS (
        SELECT m.id, m.scheduled_at, m.message_group
          FROM unnest(v_groups, v_heads) AS u(g, h)
          JOIN dq_messages m ON m.id = u.h AND m.message_group = u.g
         WHERE m.queue = dq__poll_level.queue AND m.dead_from IS NULL
           -- A group with a queued settle committed before this statement is settled first (below).
           AND NOT EXISTS (SELECT 1 FROM dq_group_settles s WHERE s.queue = dq__poll_level.queue AND s.message_group = u.g)
           FOR UPDATE OF m SKIP LOCKED
    ), refreshed AS (
        UPDATE dq_groups g SET due_at = h.scheduled_at
          FROM heads h
         WHERE h.scheduled_at > dq__poll_level.at
           AND g.queue = dq__poll_level.queue AND g.message_group = h.message_group
    ), ungrouped AS (
        SELECT d.id, d.scheduled_at
          FROM dq_messages d
         WHERE d.queue = dq__poll_level.queue AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
           AND d.priority = dq__poll_level.p AND d.scheduled_at <= dq__poll_level.at
         ORDER BY d.scheduled_at
         LIMIT dq__poll_level.max_count
           FOR UPDATE SKIP LOCKED
    ), pick AS (
        SELECT c.id, c.scheduled_at FROM (
            SELECT h.id, h.scheduled_at FROM heads h WHERE h.scheduled_at <= dq__poll_level.at
            UNION ALL
            SELECT u.id, u.scheduled_at FROM ungrouped u) c
         ORDER BY c.scheduled_at, c.id
         LIMIT dq__poll_level.max_count
    )
    SELECT array_agg(pick.id ORDER BY pick.scheduled_at, pick.id), array_agg(pick.scheduled_at ORDER BY pick.scheduled_at, pick.id)
      INTO ids, due FROM pick;
    -- Groups whose head is gone or left the group (a repair: every change of a head settles its
    -- group, but a head read by a settle while an update moved it elsewhere can be left behind), and
    -- groups with a queued settle whose head was not picked (we hold their rows: it applies now).
    IF v_groups IS NOT NULL THEN
        SELECT count(*) INTO v_n FROM (
            SELECT dq__settle_group(dq__poll_level.queue, u.g)
              FROM unnest(v_groups, v_heads) AS u(g, h)
             WHERE NOT EXISTS (SELECT 1 FROM dq_messages m
                                WHERE m.id = u.h AND m.queue = dq__poll_level.queue AND m.message_group = u.g
                                  AND m.dead_from IS NULL)
                OR (u.h <> ALL (coalesce(ids, '{}'))
                    AND EXISTS (SELECT 1 FROM dq_group_settles s WHERE s.queue = dq__poll_level.queue AND s.message_group = u.g))
             ORDER BY u.g COLLATE "C") s;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__poll_level(text, smallint, timestamptz, integer) IS 'Internal: the due ungrouped messages and FIFO group heads of one priority level of a queue, locked, earliest due first (dq_poll_many).';
REVOKE ALL ON FUNCTION dq__poll_level(text, smallint, timestamptz, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
