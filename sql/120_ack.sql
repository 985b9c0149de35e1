-- Finishing a delivery: acknowledge (delete), negative acknowledge (give back), extend (heartbeat).
--
-- All three find the row by its lock token. poll gives every delivery a fresh token, and an
-- update by dq_offer clears it, so a token names exactly one delivery of one version of one
-- message: a stale token (lock expired and re-acquired, message re-offered, already
-- acknowledged) matches no row and changes nothing (seed 000's race-safe acknowledge).
-- A lock that expired but that no poll has taken over since is still held by its token: the late
-- holder's ack, nack or extend then succeeds (the work was done, nobody else has the message),
-- as in seed 000, where the delete matches as long as the row is still the one that was locked.
-- Concurrency: a concurrent poll or offer that changed the row makes our statement re-check
-- `lock_token = $1` on the new row version (EvalPlanQual), which then fails.

CREATE OR REPLACE FUNCTION dq_ack(lock_token uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF dq_ack.lock_token IS NULL THEN
        PERFORM dq__raise_null('dq_ack', 'lock_token');
    END IF;
    DELETE FROM dq_messages m WHERE m.lock_token = dq_ack.lock_token;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION dq_ack(uuid) IS
  'dq_ack(lock_token uuid) -> boolean: deletes the message still held under this token; false for a stale token (nothing deleted). Errors: 22004 NULL. Source: seed 000 race-safe acknowledge.';

CREATE OR REPLACE FUNCTION dq_ack(lock_tokens uuid[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count integer;
BEGIN
    IF dq_ack.lock_tokens IS NULL THEN
        PERFORM dq__raise_null('dq_ack', 'lock_tokens');
    END IF;
    DELETE FROM dq_messages m WHERE m.lock_token = ANY (dq_ack.lock_tokens);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_ack(uuid[]) IS
  'dq_ack(lock_tokens uuid[]) -> integer: deletes the messages still held under these tokens and returns how many; stale tokens delete nothing. Errors: 22004 NULL array.';

CREATE OR REPLACE FUNCTION dq_nack(lock_token uuid, delay interval DEFAULT '0')
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queue text;
    v_at    timestamptz;
BEGIN
    IF dq_nack.lock_token IS NULL THEN
        PERFORM dq__raise_null('dq_nack', 'lock_token');
    END IF;
    IF dq_nack.delay IS NULL THEN
        PERFORM dq__raise_null('dq_nack', 'delay');
    END IF;
    IF dq_nack.delay < interval '0' THEN
        RAISE EXCEPTION 'dq_nack: delay is %, it must not be negative', dq_nack.delay USING ERRCODE = '22023';
    END IF;
    UPDATE dq_messages m
       SET scheduled_at = clock_timestamp() + dq_nack.delay,
           lock_token = NULL
     WHERE m.lock_token = dq_nack.lock_token
    RETURNING m.queue, m.scheduled_at INTO v_queue, v_at;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM dq_waiters w
                WHERE w.queue = v_queue AND w.wake_at > greatest(v_at, clock_timestamp())) THEN
        PERFORM pg_notify(dq_channel(v_queue), v_queue);
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_nack(uuid, interval) IS
  'dq_nack(lock_token uuid, delay interval >= 0 default 0) -> boolean: gives the message back, visible again at now + delay, keeping its delivery_count; false for a stale token. Errors: 22004 NULL, 22023 negative delay. Source: seed 002 reject.';

CREATE OR REPLACE FUNCTION dq_extend(lock_token uuid, lock_timeout interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_until timestamptz;
BEGIN
    IF dq_extend.lock_token IS NULL THEN
        PERFORM dq__raise_null('dq_extend', 'lock_token');
    END IF;
    IF dq_extend.lock_timeout IS NULL THEN
        PERFORM dq__raise_null('dq_extend', 'lock_timeout');
    END IF;
    IF dq_extend.lock_timeout <= interval '0' THEN
        RAISE EXCEPTION 'dq_extend: lock_timeout is %, it must be positive', dq_extend.lock_timeout
            USING ERRCODE = '22023';
    END IF;
    UPDATE dq_messages m
       SET scheduled_at = clock_timestamp() + dq_extend.lock_timeout
     WHERE m.lock_token = dq_extend.lock_token
    RETURNING m.scheduled_at INTO v_until;
    RETURN v_until;
END;
$$;
COMMENT ON FUNCTION dq_extend(uuid, interval) IS
  'dq_extend(lock_token uuid, lock_timeout interval > 0) -> timestamptz: heartbeat; the message stays invisible until the returned now + lock_timeout; NULL when the token no longer holds the message. Errors: 22004 NULL, 22023 lock_timeout not positive. Source: seed 004 heartbeats.';
