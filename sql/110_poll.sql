-- Polling: dq_poll_many acquires due messages under a visibility timeout.
--
-- Seed 003's tryPollMany, with two changes: each message gets its own lock token (so one
-- message of a batch can be acknowledged, nacked or extended alone), and the visibility
-- timeout is the seed's own trick, moving scheduled_at forward to now + lock_timeout.
--
-- Concurrency (READ COMMITTED): the CTE locks the candidate rows FOR UPDATE SKIP LOCKED, so
-- concurrent pollers never pick the same row; a row that another transaction changed after our
-- snapshot is re-checked against `scheduled_at <= now` before it is locked (EvalPlanQual), so a
-- row that was just acquired (its scheduled_at moved into the future) is not taken twice.
CREATE OR REPLACE FUNCTION dq_poll_many(
    queue         text,
    max_count     integer DEFAULT 1,
    lock_timeout  interval DEFAULT '5 minutes')
RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF dq_poll_many.queue IS NULL OR dq_poll_many.queue = '' OR char_length(dq_poll_many.queue) > 100 THEN
        PERFORM dq__raise_bad_name('dq_poll_many', 'queue', dq_poll_many.queue, 100);
    END IF;
    IF dq_poll_many.max_count IS NULL THEN
        PERFORM dq__raise_null('dq_poll_many', 'max_count');
    END IF;
    IF dq_poll_many.max_count < 1 OR dq_poll_many.max_count > 10000 THEN
        RAISE EXCEPTION 'dq_poll_many: max_count is %, it must be between 1 and 10000', dq_poll_many.max_count
            USING ERRCODE = '22023';
    END IF;
    IF dq_poll_many.lock_timeout IS NULL THEN
        PERFORM dq__raise_null('dq_poll_many', 'lock_timeout');
    END IF;
    IF dq_poll_many.lock_timeout <= interval '0' THEN
        RAISE EXCEPTION 'dq_poll_many: lock_timeout is %, it must be positive', dq_poll_many.lock_timeout
            USING ERRCODE = '22023';
    END IF;

    RETURN QUERY
    WITH due AS (
        SELECT c.id, c.scheduled_at
          FROM dq_messages c
         WHERE c.queue = dq_poll_many.queue
           AND c.scheduled_at <= v_now
         ORDER BY c.scheduled_at
         LIMIT dq_poll_many.max_count
           FOR UPDATE SKIP LOCKED
    ), acquired AS (
        UPDATE dq_messages m
           SET scheduled_at = v_now + dq_poll_many.lock_timeout,
               lock_token = gen_random_uuid(),
               delivery_count = m.delivery_count + 1
          FROM due
         WHERE m.id = due.id
        RETURNING m.id, m.queue, m.key, m.payload, m.payload_type, due.scheduled_at AS due_at,
                  m.scheduled_at_initially, m.created_at, m.delivery_count, m.lock_token,
                  m.scheduled_at AS locked_until
    )
    SELECT a.id, a.queue, a.key, a.payload, a.payload_type, a.due_at, a.scheduled_at_initially,
           a.created_at, a.delivery_count, a.lock_token, a.locked_until
      FROM acquired a
     ORDER BY a.due_at, a.id;
END;
$$;
COMMENT ON FUNCTION dq_poll_many(text, integer, interval) IS
  'dq_poll_many(queue text, max_count integer 1..10000 default 1, lock_timeout interval > 0 default 5 min) -> SETOF (id, queue, key, payload, payload_type, scheduled_at = due time of this delivery, scheduled_at_initially, created_at, delivery_count (>1 = redelivery), lock_token uuid, locked_until timestamptz): acquires up to max_count due messages, earliest first, FOR UPDATE SKIP LOCKED; each gets a fresh lock token and stays invisible until locked_until. Errors: 22004 NULL, 22023 max_count or lock_timeout out of range. Source: seed 003 tryPollMany, seed 000 visibility timeout.';
