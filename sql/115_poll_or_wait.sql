-- dq_poll_or_wait: the waiting consumer's whole cycle in one statement.
--
-- It ends the caller's previous wait (its dq_waiters row), polls like dq_poll_many, and when
-- nothing was acquired registers the caller as waiting (like dq_wait) and returns one row whose id
-- is NULL and whose wake_in says how long to sleep on LISTEN before calling again. So an idle
-- consumer costs one statement per wake-up (its own timer, at most max_wait apart, or a
-- notification), not three. Concurrency: as dq_poll_many and dq_wait (same statements).
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;
-- 0.5 returns the delivery controls' columns (and claimed_at): a new return type, so the function
-- is dropped and created again in the installer's transaction.
DROP FUNCTION IF EXISTS dq_poll_or_wait(text, integer, interval, interval);
CREATE OR REPLACE FUNCTION dq_poll_or_wait(
    queue         text,
    max_count     integer DEFAULT 1,
    lock_timeout  interval DEFAULT '5 minutes',
    max_wait      interval DEFAULT '5 seconds')
RETURNS TABLE (
    id                      bigint,
    key                     text,
    payload                 bytea,
    payload_type            text,
    scheduled_at            timestamptz,
    scheduled_at_initially  timestamptz,
    created_at              timestamptz,
    delivery_count          integer,
    lock_token              uuid,
    locked_until            timestamptz,
    claimed_at              timestamptz,
    priority                integer,
    message_group           text,
    expires_at              timestamptz,
    headers                 jsonb,
    wake_in                 interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    v_error    jsonb;
    v_count integer;
    v_q     text := $1;
BEGIN
    -- max_wait is checked on every call, not only when nothing was acquired (dq_wait's rule).
    v_error := dq__time_after_error('dq_poll_or_wait', 'max_wait', $4, dq__clock(), false, dq__limit_wait_max());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    DELETE FROM dq_waiters w WHERE w.queue = v_q AND w.pid = pg_backend_pid();
    RETURN QUERY
    SELECT d.id, d.key, d.payload, d.payload_type, d.scheduled_at, d.scheduled_at_initially, d.created_at,
           d.delivery_count, d.lock_token, d.locked_until, d.claimed_at, d.priority, d.message_group,
           d.expires_at, d.headers, NULL::interval
      FROM dq_poll_many(v_q, $2, $3) AS d;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count = 0 THEN
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::bytea, NULL::text, NULL::timestamptz, NULL::timestamptz,
               NULL::timestamptz, NULL::integer, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::integer,
               NULL::text, NULL::timestamptz, NULL::jsonb, dq_wait(v_q, $4);
    END IF;
END;
$$;
COMMENT ON FUNCTION dq_poll_or_wait(text, integer, interval, interval) IS 'dq_poll_or_wait(queue, max_count, lock_timeout, max_wait interval default 5 s) -> the rows of dq_poll_many (wake_in NULL), or, when nothing was acquired, one row with id NULL and wake_in: how long to sleep on LISTEN dq_channel(queue), the session registered as by dq_wait. Errors: those of dq_poll_many and dq_wait.';
REVOKE ALL ON FUNCTION dq_poll_or_wait(text, integer, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_poll_or_wait(text, integer, interval, interval) TO dq_consumer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
