-- Wake-ups: LISTEN/NOTIFY with a notification horizon.
--
-- Rule: a consumer about to sleep calls dq_wait(queue, max_wait) on its LISTENing session; it
-- records (queue, its backend pid, wake_at) in dq_waiters, where wake_at is the earlier of
-- now + max_wait and the queue's next due time, and gets back how long to sleep. A committed
-- offer (or nack) whose message is due before some waiter's wake_at (and wake_at is still in
-- the future) sends pg_notify(dq_channel(queue), queue) once: identical notifications in one
-- transaction are coalesced by PostgreSQL, so a transaction notifies a queue at most once.
-- Far-future messages notify nobody: the waiter's own timer finds them. With no waiter, or
-- only busy consumers (their wake_at has passed), an offer costs one probe of a tiny
-- primary-key index and no NOTIFY (NOTIFY takes a database-wide lock at commit).
-- A wake-up missed by a race (an offer whose statement started before the waiter registered
-- and committed after the waiter looked at dq_next_due) delays that message by at most the
-- waiter's max_wait; it is never lost.

CREATE OR REPLACE FUNCTION dq_wait(queue text, max_wait interval DEFAULT '5 seconds')
RETURNS interval
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_next  timestamptz;
    v_wake  timestamptz;
BEGIN
    IF dq_wait.queue IS NULL OR dq_wait.queue = '' OR char_length(dq_wait.queue) > 100 THEN
        PERFORM dq__raise_bad_name('dq_wait', 'queue', dq_wait.queue, 100);
    END IF;
    IF max_wait IS NULL THEN
        PERFORM dq__raise_null('dq_wait', 'max_wait');
    END IF;
    IF max_wait <= interval '0' THEN
        RAISE EXCEPTION 'dq_wait: max_wait is %, it must be positive', max_wait USING ERRCODE = '22023';
    END IF;

    SELECT min(m.scheduled_at) INTO v_next FROM dq_messages m WHERE m.queue = dq_wait.queue;
    v_wake := least(v_now + max_wait, v_next);
    -- A queue configured with notify => false is never notified: its waiters do not register, so
    -- offers find nobody to wake and the waiters sleep until their own timer.
    IF NOT EXISTS (SELECT 1 FROM dq_queues q WHERE q.queue = dq_wait.queue AND NOT q.notify) THEN
        INSERT INTO dq_waiters AS w (queue, pid, wake_at)
        VALUES (dq_wait.queue, pg_backend_pid(), v_wake)
        ON CONFLICT (queue, pid) DO UPDATE SET wake_at = EXCLUDED.wake_at;
    END IF;
    RETURN greatest(v_wake - v_now, interval '0');
END;
$$;
COMMENT ON FUNCTION dq_wait(text, interval) IS
  'dq_wait(queue text, max_wait interval default 5 s) -> interval: registers the calling session (which must LISTEN on dq_channel(queue)) as waiting until the earlier of now + max_wait and the next due message, and returns how long to sleep (0 when a message is due). Errors: 22004/22023/22001 queue, 22004/22023 max_wait.';

CREATE OR REPLACE FUNCTION dq_wait_done(queue text)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public, pg_temp
AS $$ DELETE FROM dq_waiters w WHERE w.queue = dq_wait_done.queue AND w.pid = pg_backend_pid() $$;
COMMENT ON FUNCTION dq_wait_done(text) IS
  'dq_wait_done(queue text) -> void: the calling session stops waiting on queue (offers stop notifying on its behalf).';
