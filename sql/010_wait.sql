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
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

CREATE OR REPLACE FUNCTION dq_wait(queue text, max_wait interval DEFAULT '5 seconds')
RETURNS interval
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_now         timestamptz := dq__clock();
    v_next        timestamptz;
    v_wake        timestamptz;
    v_not_before  timestamptz;
    v_cfg         dq_queues;
    v_busy        integer;
    v_token       timestamptz;
BEGIN
    v_error := coalesce(dq__name_error('dq_wait', 'queue', dq_wait.queue, dq__limit_queue_chars()),
                        dq__time_after_error('dq_wait', 'max_wait', max_wait, v_now, false, dq__limit_wait_max()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_wake := v_now + max_wait;

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

    -- The next moment something can be delivered: the next due message or group head, unless the
    -- queue's controls hold it back. not_before is when offers may start to matter: a waiter is not
    -- notified by an offer before it (dq__wake), only by what lifts the control (dq_resume_queue, or
    -- the end of a delivery in a queue at its concurrency limit).
    v_next := dq__next_deliverable(dq_wait.queue);
    SELECT q.* INTO v_cfg FROM dq_queues q WHERE q.queue = dq_wait.queue;
    IF v_cfg.paused THEN
        v_next := NULL;
        v_not_before := dq__max_time();
    ELSE
        IF v_cfg.max_in_flight IS NOT NULL THEN
            v_busy := dq__in_flight(dq_wait.queue, v_now, v_cfg.max_in_flight);
            IF v_busy >= v_cfg.max_in_flight THEN
                -- Full: a slot frees when a delivery ends (its ack or nack notifies) or a lock expires.
                SELECT min(m.scheduled_at) INTO v_next FROM dq_messages m
                 WHERE m.queue = dq_wait.queue AND m.lock_token IS NOT NULL AND m.delivery_count > 0
                   AND m.scheduled_at > v_now;
                v_not_before := dq__max_time();
            END IF;
        END IF;
        IF v_cfg.rate_limit IS NOT NULL THEN
            -- The next rate token: the oldest recorded delivery start plus rate_period.
            SELECT t.used_at + v_cfg.rate_period INTO v_token
              FROM dq_rate_tokens t WHERE t.queue = dq_wait.queue ORDER BY t.used_at LIMIT 1;
            IF v_token > v_now AND v_next IS NOT NULL THEN  -- with nothing due, the token does not matter
                v_next := greatest(v_next, v_token);
                v_not_before := greatest(v_not_before, v_token);
            END IF;
        END IF;
    END IF;
    v_wake := least(v_wake, v_next);
    -- A queue configured with notify => false is never notified: its waiters do not register, so
    -- offers find nobody to wake and the waiters sleep until their own timer.
    IF coalesce(v_cfg.notify, true) THEN
        INSERT INTO dq_waiters AS w (queue, pid, wake_at, not_before)
        VALUES (dq_wait.queue, pg_backend_pid(), v_wake, v_not_before)
        ON CONFLICT (queue, pid) DO UPDATE SET wake_at = EXCLUDED.wake_at, not_before = EXCLUDED.not_before;
    END IF;
    RETURN greatest(v_wake - v_now, interval '0');
END;
$$;
COMMENT ON FUNCTION dq_wait(text, interval) IS 'dq_wait(queue text, max_wait interval default 5 s) -> interval: registers the calling session, which must LISTEN on dq_channel(queue), as waiting, and returns how long to sleep: until the next moment a message can be delivered (the queue''s controls included), at most max_wait. Errors: 22004/22023/22001 queue; 22004 max_wait NULL, 22023 max_wait not positive or over 1 hour, 22008 now + max_wait past 9999-12-30.';
REVOKE ALL ON FUNCTION dq_wait(text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_wait(text, interval) TO dq_consumer;

CREATE OR REPLACE FUNCTION dq_wait_done(queue text)
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ DELETE FROM dq_waiters w WHERE w.queue = dq_wait_done.queue AND w.pid = pg_backend_pid() $$;
COMMENT ON FUNCTION dq_wait_done(text) IS 'dq_wait_done(queue text) -> void: the calling session stops waiting on queue (offers stop notifying on its behalf). Errors: none.';
REVOKE ALL ON FUNCTION dq_wait_done(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_wait_done(text) TO dq_consumer;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
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
             WHERE w.queue = dq__wake.queue
               AND w.wake_at > greatest(dq__wake.due, dq__clock(), coalesce(w.not_before, dq__min_time()))) THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM dq_waiters w
                WHERE w.queue = dq__wake.queue
                  AND w.wake_at > greatest(dq__wake.due, dq__clock(), coalesce(w.not_before, dq__min_time()))
                  AND EXISTS (SELECT 1 FROM pg_stat_get_activity(w.pid))) THEN
        PERFORM pg_notify(dq_channel(dq__wake.queue), dq__wake.queue);
        RETURN true;
    END IF;
    RETURN false;
END;
$$;
COMMENT ON FUNCTION dq__wake(text, timestamptz) IS 'Internal: NOTIFY dq_channel(queue) when a live waiter (its session exists) would sleep past due (NULL: nobody) and past its not_before; returns whether it notified.';
REVOKE ALL ON FUNCTION dq__wake(text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Wake the live waiters of a queue that a control held back (not_before set by dq_wait): a delivery
-- ended in a queue with a concurrency limit. With nobody waiting it costs one probe of dq_waiters'
-- primary key.
CREATE OR REPLACE FUNCTION dq__wake_blocked(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM dq_waiters w
                WHERE w.queue = dq__wake_blocked.queue AND w.not_before IS NOT NULL
                  AND EXISTS (SELECT 1 FROM pg_stat_get_activity(w.pid))) THEN
        PERFORM pg_notify(dq_channel(dq__wake_blocked.queue), dq__wake_blocked.queue);
        RETURN true;
    END IF;
    RETURN false;
END;
$$;
COMMENT ON FUNCTION dq__wake_blocked(text) IS 'Internal: NOTIFY dq_channel(queue) when the queue has a live waiter held back by a control (not_before set); returns whether it notified.';
REVOKE ALL ON FUNCTION dq__wake_blocked(text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
