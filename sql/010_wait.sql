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
-- Liveness: a waiter row outlives a session that died without dq_wait_done. Such a row never causes
-- a notification: dq__wake checks that the backend pid still exists (pg_stat_get_activity), and
-- dq_wait prunes the queue's rows of sessions that are gone. A pid
-- reused by a new session can cause a spurious notification until the row expires (at most the
-- 1 hour that max_wait allows); never a missed one.
-- A wake-up missed by a race (an offer whose statement started before the waiter registered
-- and committed after the waiter looked at dq_next_due) delays that message by at most the
-- waiter's max_wait; it is never lost.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', pg_catalog.format('%I, pg_temp', (SELECT u.s FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1)), false) AS install_search_path;

CREATE OR REPLACE FUNCTION dq_wait(queue text, max_wait interval DEFAULT '5 seconds')
RETURNS interval
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_next  timestamptz;
    v_wake  timestamptz;
BEGIN
    dq_wait.queue := dq__check_name('dq_wait', 'queue', dq_wait.queue, 100);
    v_wake := dq__time_after('dq_wait', 'max_wait', max_wait, v_now, false, interval '1 hour', '1 hour');

    -- Prune this queue's rows left by sessions that are gone. SKIP LOCKED: never wait for another
    -- waiter. Rows of live sessions are never touched, even expired ones: deleting a live waiter's
    -- row while it re-registers would make each wait for the other's delete (a deadlock, seen with
    -- two waiters pruning each other); an expired row wakes nobody anyway.
    DELETE FROM dq_waiters w
     WHERE (w.queue, w.pid) IN (
        SELECT x.queue, x.pid FROM dq_waiters x
         WHERE x.queue = dq_wait.queue AND x.pid <> pg_backend_pid()
           AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(x.pid))
           FOR UPDATE SKIP LOCKED);

    SELECT min(m.scheduled_at) INTO v_next FROM dq_messages m WHERE m.queue = dq_wait.queue;
    v_wake := least(v_wake, v_next);
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
  'dq_wait(queue text, max_wait interval default 5 s) -> interval: registers the calling session (which must LISTEN on dq_channel(queue)) as waiting until the earlier of now + max_wait and the next due message, and returns how long to sleep (0 when a message is due). Also removes the queue''s waiter rows of sessions that no longer exist. Errors: 22004/22023/22001 queue, 22004 max_wait NULL, 22023 max_wait not positive or over 1 hour.';
REVOKE ALL ON FUNCTION dq_wait(text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_wait(text, interval) TO dq_consumer;

CREATE OR REPLACE FUNCTION dq_wait_done(queue text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ DELETE FROM dq_waiters w WHERE w.queue = dq_wait_done.queue AND w.pid = pg_backend_pid() $$;
COMMENT ON FUNCTION dq_wait_done(text) IS
  'dq_wait_done(queue text) -> void: the calling session stops waiting on queue (offers stop notifying on its behalf). Errors: none (a NULL or unknown queue changes nothing). Source: PostgreSQL manual, LISTEN and NOTIFY.';
REVOKE ALL ON FUNCTION dq_wait_done(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_wait_done(text) TO dq_consumer;

-- Wake the waiters of a queue that would sleep past `due`: every statement that makes a message due
-- (dq_offer, dq_offer_many and dq_install_tick through dq__offer_many, dq_nack) calls this with the
-- earliest due time it wrote (NULL: it wrote none, nobody is woken). With nobody waiting (the common
-- case) it costs one probe of a tiny primary-key index; only when a waiter is found are the
-- sessions checked (pg_stat_get_activity(pid) returns no row for a pid that is gone). The two are
-- separate statements: one query with both costs 6 us more per call (measured), the subquery on
-- pg_stat_get_activity being set up even when no row reaches it. Callers assign the result
-- (`v := dq__wake(...)`), which PL/pgSQL evaluates as a simple expression (PERFORM runs a query).
-- No SET clause: it runs only inside the dq_* functions of this install, with their pinned
-- search_path, and a SET clause costs 1.5 us per offer (measured; the whole helper costs about
-- 2 us over the probe written into each caller).
CREATE OR REPLACE FUNCTION dq__wake(queue text, due timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF dq__wake.due IS NULL OR NOT EXISTS (
            SELECT 1 FROM dq_waiters w
             WHERE w.queue = dq__wake.queue AND w.wake_at > greatest(dq__wake.due, clock_timestamp())) THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM dq_waiters w
                WHERE w.queue = dq__wake.queue
                  AND w.wake_at > greatest(dq__wake.due, clock_timestamp())
                  AND EXISTS (SELECT 1 FROM pg_stat_get_activity(w.pid))) THEN
        PERFORM pg_notify(dq_channel(dq__wake.queue), dq__wake.queue);
        RETURN true;
    END IF;
    RETURN false;
END;
$$;
COMMENT ON FUNCTION dq__wake(text, timestamptz) IS
  'Internal: NOTIFY dq_channel(queue) when a live waiter (its session exists) would sleep past due (NULL: nobody); returns whether it notified.';
REVOKE ALL ON FUNCTION dq__wake(text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
