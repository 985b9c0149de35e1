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
SELECT pg_catalog.set_config('search_path', pg_catalog.format('%I, pg_temp', (SELECT u.s FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1)), false) AS install_search_path;
CREATE OR REPLACE FUNCTION dq_poll_many(
    queue         text,
    max_count     integer DEFAULT 1,
    lock_timeout  interval DEFAULT '5 minutes')
RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
-- The statements are planned once per session (generic plans: re-planning cost 0.2-0.3 ms per call).
-- A session that first polls an empty table would keep the plan that is cheapest for an empty
-- table (sequential scan and sort) until the next ANALYZE, and later poll a backlog of 100,000 rows
-- with it (measured by bench/latency.py: 38-160 ms per poll). Disabling sequential scans for these
-- statements leaves the planner only the index plans, which are right at every size. A disabled
-- plan node adds a huge cost, which could reach jit_above_cost and compile a tiny statement for
-- hundreds of milliseconds (seen in tests/test_plans.py): JIT is off for this function.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := clock_timestamp();
    v_ids     bigint[];
    v_due     timestamptz[];
    v_counts  integer[];
    v_max     integer;
    v_dlq     text;
    v_until   timestamptz;
BEGIN
    dq_poll_many.queue := dq__check_name('dq_poll_many', 'queue', dq_poll_many.queue, 100);
    dq_poll_many.max_count := dq__check_range('dq_poll_many', 'max_count', dq_poll_many.max_count, 1, 10000);
    -- The lock expiry, checked by its effect (positive, within the stored range).
    v_until := dq__time_after('dq_poll_many', 'lock_timeout', dq_poll_many.lock_timeout, v_now, false);

    -- Two statements, both planned once and reused (plan_cache_mode = force_generic_plan): with
    -- the due bound and the limit as parameters, a custom plan would be rebuilt on every call
    -- (0.2-0.3 ms of planning, more than the execution), while these generic plans are the ones
    -- wanted at any table size: an index scan on (queue, scheduled_at), then primary-key probes.
    SELECT array_agg(c.id ORDER BY c.scheduled_at, c.id), array_agg(c.scheduled_at ORDER BY c.scheduled_at, c.id),
           array_agg(c.delivery_count ORDER BY c.scheduled_at, c.id)
      INTO v_ids, v_due, v_counts
      FROM (SELECT d.id, d.scheduled_at, d.delivery_count
              FROM dq_messages d
             WHERE d.queue = dq_poll_many.queue
               AND d.scheduled_at <= v_now
             ORDER BY d.scheduled_at
             LIMIT dq_poll_many.max_count
               FOR UPDATE SKIP LOCKED) c;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    -- Dead letters (sql/140_dead_letters.sql): a candidate already delivered max_deliveries times
    -- goes to the dead-letter queue instead of being delivered again; the others are acquired.
    SELECT q.max_deliveries, q.dead_letter_queue INTO v_max, v_dlq
      FROM dq_queues q WHERE q.queue = dq_poll_many.queue;
    IF v_max IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(v_counts) AS n WHERE n >= v_max) THEN
        PERFORM dq__dead_letter(ARRAY(SELECT u.id FROM unnest(v_ids, v_counts) AS u(id, n) WHERE u.n >= v_max),
                                v_dlq, v_now);
        SELECT array_agg(u.id ORDER BY u.o), array_agg(u.due ORDER BY u.o) INTO v_ids, v_due
          FROM unnest(v_ids, v_due, v_counts) WITH ORDINALITY AS u(id, due, n, o)
         WHERE u.n < v_max;
        IF v_ids IS NULL THEN
            RETURN;
        END IF;
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
                  m.scheduled_at AS locked_until, due.n
    )
    SELECT a.id, a.queue, a.key, a.payload, a.payload_type, a.due_at, a.scheduled_at_initially,
           a.created_at, a.delivery_count, a.lock_token, a.locked_until
      FROM acquired a
     ORDER BY a.n;
END;
$$;
COMMENT ON FUNCTION dq_poll_many(text, integer, interval) IS
  'dq_poll_many(queue text, max_count integer 1..10000 default 1, lock_timeout interval > 0 default 5 min) -> SETOF (id, queue, key, payload, payload_type, scheduled_at = due time of this delivery, scheduled_at_initially, created_at, delivery_count (>1 = redelivery), lock_token uuid, locked_until timestamptz): acquires up to max_count due messages, earliest first, FOR UPDATE SKIP LOCKED; each gets a fresh lock token and stays invisible until locked_until; a due message already delivered max_deliveries times (dq_configure_queue) goes to the dead-letter queue instead. Errors: 22004 NULL, 22023 max_count out of range or lock_timeout not positive (by its effect: now + lock_timeout after now), 22008 now + lock_timeout after 9999-12-30. Source: the visibility timeout of Amazon SQS (SQS Developer Guide, "Amazon SQS visibility timeout").';
REVOKE ALL ON FUNCTION dq_poll_many(text, integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_poll_many(text, integer, interval) TO dq_consumer;
