-- Operations: per-queue configuration, purge, releasing locks, archive retention, stats.
-- Every operator function says what it changed with a NOTICE.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- dq_configure_queue gained archive, retention and notify in 0.2: the 0.1 signature is dropped
-- and the new one created in this same transaction (the installer's 9999_sql step), so there is
-- no moment without a dq_configure_queue, and 0.1 calls (queue, max_deliveries, dead_letter_queue)
-- resolve to the new function unchanged.
DROP FUNCTION IF EXISTS dq_configure_queue(text, integer, text);
-- 0.3 adds max_payload_bytes, the same way: calls of the 0.2 form resolve to the new function.
DROP FUNCTION IF EXISTS dq_configure_queue(text, integer, text, boolean, interval, boolean);
-- 0.5 adds max_in_flight, rate_limit and rate_period, the same way.
DROP FUNCTION IF EXISTS dq_configure_queue(text, integer, text, boolean, interval, boolean, integer);
-- clear (the settings to reset to their defaults) is added the same way; with it every setting
-- left NULL keeps its value, max_deliveries and dead_letter_queue included.
DROP FUNCTION IF EXISTS dq_configure_queue(text, integer, text, boolean, interval, boolean, integer, integer, integer, interval);

-- One rule for every setting: a setting not given (NULL) keeps its value; a setting named in
-- clear goes back to its default (that of a queue never configured). max_in_flight => 0 and
-- rate_limit => 0 also clear those two. The new row is built from the row this call locked, and
-- the combinations are checked on it: max_deliveries needs a dead_letter_queue (given now or
-- kept), rate_limit a rate_period, and a rate_period a rate_limit (clearing rate_limit clears
-- its period: the two exist together, a table constraint).
-- Concurrency: the call creates the queue's row if it is missing (INSERT .. ON CONFLICT DO
-- NOTHING, which waits for a concurrent insert of the same queue to end), then locks it FOR NO
-- KEY UPDATE until the transaction ends. Two calls for one queue are thus serialised and each
-- starts from the other's committed row (READ COMMITTED reads the newest version of a row it
-- waited for): a call setting one setting never undoes a concurrent call setting another (under
-- REPEATABLE READ or SERIALIZABLE the second call fails with 40001 instead).
CREATE OR REPLACE FUNCTION dq_configure_queue(
    queue              text,
    max_deliveries     integer DEFAULT NULL,
    dead_letter_queue  text DEFAULT NULL,
    archive            boolean DEFAULT NULL,
    retention          interval DEFAULT NULL,
    notify             boolean DEFAULT NULL,
    max_payload_bytes  integer DEFAULT NULL,
    max_in_flight      integer DEFAULT NULL,
    rate_limit         integer DEFAULT NULL,
    rate_period        interval DEFAULT NULL,
    clear              text[] DEFAULT NULL)
RETURNS dq_queues
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    -- The settings clear may name, in the order of the parameters.
    c_settings constant text[] := ARRAY['max_deliveries', 'dead_letter_queue', 'archive', 'retention', 'notify',
                                        'max_payload_bytes', 'max_in_flight', 'rate_limit', 'rate_period'];
    v_error  jsonb;
    v_clear  text[] := coalesce(dq_configure_queue.clear, '{}');
    v_name   text;
    v_given  text[];
    v_old    dq_queues;
    v_new    dq_queues;
    v_row    dq_queues;
    v_next   text;
    v_chain  text[];
    v_woken  boolean;
BEGIN
    v_error := dq__name_error('dq_configure_queue', 'queue', dq_configure_queue.queue, 100);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    IF array_position(v_clear, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'dq_configure_queue: clear must not contain NULL (it names settings: %)',
            array_to_string(c_settings, ', ') USING ERRCODE = '22004';
    END IF;
    SELECT c INTO v_name FROM unnest(v_clear) AS c WHERE c <> ALL (c_settings) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'dq_configure_queue: clear names %, which is not a setting (the settings: %)',
            quote_literal(left(v_name, 100)), array_to_string(c_settings, ', ') USING ERRCODE = '22023';
    END IF;
    -- The settings given a value; one of them also named in clear is a contradiction.
    v_given := array_remove(ARRAY[
        CASE WHEN dq_configure_queue.max_deliveries IS NOT NULL THEN 'max_deliveries' END,
        CASE WHEN dq_configure_queue.dead_letter_queue IS NOT NULL THEN 'dead_letter_queue' END,
        CASE WHEN dq_configure_queue.archive IS NOT NULL THEN 'archive' END,
        CASE WHEN dq_configure_queue.retention IS NOT NULL THEN 'retention' END,
        CASE WHEN dq_configure_queue.notify IS NOT NULL THEN 'notify' END,
        CASE WHEN dq_configure_queue.max_payload_bytes IS NOT NULL THEN 'max_payload_bytes' END,
        CASE WHEN dq_configure_queue.max_in_flight IS NOT NULL THEN 'max_in_flight' END,
        CASE WHEN dq_configure_queue.rate_limit IS NOT NULL THEN 'rate_limit' END,
        CASE WHEN dq_configure_queue.rate_period IS NOT NULL THEN 'rate_period' END], NULL);
    SELECT c INTO v_name FROM unnest(v_given) AS c WHERE c = ANY (v_clear) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'dq_configure_queue: % is given a value and named in clear; give one or the other', v_name
            USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.max_deliveries < 1 THEN
        RAISE EXCEPTION 'dq_configure_queue: max_deliveries is %, it must be at least 1 (or NULL to keep the current limit)',
            dq_configure_queue.max_deliveries USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.dead_letter_queue IS NOT NULL AND (dq_configure_queue.dead_letter_queue = ''
       OR char_length(dq_configure_queue.dead_letter_queue) > 100) THEN
        v_error := dq__name_error('dq_configure_queue', 'dead_letter_queue', dq_configure_queue.dead_letter_queue, 100);
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    IF dq_configure_queue.dead_letter_queue = dq_configure_queue.queue THEN
        RAISE EXCEPTION 'dq_configure_queue: dead_letter_queue must differ from queue' USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.retention IS NOT NULL THEN
        v_error := dq__time_after_error('dq_configure_queue', 'retention', dq_configure_queue.retention, dq__now(), false);
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
        END IF;
    END IF;
    IF dq_configure_queue.max_payload_bytes NOT BETWEEN dq__payload_limit_floor() AND 1073741824 THEN
        RAISE EXCEPTION 'dq_configure_queue: max_payload_bytes is %, it must be between 1024 and 1073741824 (or NULL to keep the current limit; the default is 1048576)',
            dq_configure_queue.max_payload_bytes USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.max_in_flight NOT BETWEEN 0 AND 100000 THEN
        RAISE EXCEPTION 'dq_configure_queue: max_in_flight is %, it must be between 1 and 100000 (0 removes the limit, NULL keeps the current one)',
            dq_configure_queue.max_in_flight USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.rate_limit NOT BETWEEN 0 AND 100000 THEN
        RAISE EXCEPTION 'dq_configure_queue: rate_limit is %, it must be between 1 and 100000 (0 removes the limit, NULL keeps the current one)',
            dq_configure_queue.rate_limit USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.rate_period IS NOT NULL THEN
        v_error := dq__time_after_error('dq_configure_queue', 'rate_period', dq_configure_queue.rate_period, dq__now(), false,
                               interval '1 day', '1 day');
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
        END IF;
    END IF;
    -- A chain of dead-letter queues must not loop back to this queue: a message would move around
    -- it forever. All changes of dead-letter queues take one transaction-level advisory lock, so two
    -- concurrent calls that would close a loop between them are serialised: the second one (a new
    -- statement snapshot under READ COMMITTED) sees the first one's row and fails.
    IF dq_configure_queue.dead_letter_queue IS NOT NULL THEN
        -- The key is the same for every install in the database: two installs only serialise.
        PERFORM pg_advisory_xact_lock(hashtextextended('dq_configure_queue dead_letter_queue', 0));
        v_chain := ARRAY[dq_configure_queue.queue, dq_configure_queue.dead_letter_queue];
        v_next := dq_configure_queue.dead_letter_queue;
        LOOP
            SELECT q.dead_letter_queue INTO v_next FROM dq_queues q
             WHERE q.queue = v_next AND q.queue <> dq_configure_queue.queue;
            EXIT WHEN v_next IS NULL;
            v_chain := v_chain || v_next;
            IF v_next = dq_configure_queue.queue THEN
                RAISE EXCEPTION 'dq_configure_queue: dead_letter_queue % would make a cycle of dead-letter queues: %',
                    dq_configure_queue.dead_letter_queue, array_to_string(v_chain, ' -> ') USING ERRCODE = '22023';
            END IF;
            EXIT WHEN cardinality(v_chain) > 1000;  -- a loop not through this queue (not created by this function)
        END LOOP;
    END IF;
    -- The queue's row, created with the defaults when missing, then locked (see Concurrency above).
    INSERT INTO dq_queues AS q (queue, updated_at) VALUES (dq_configure_queue.queue, dq__now())
    ON CONFLICT (queue) DO NOTHING;
    SELECT q.* INTO STRICT v_old FROM dq_queues q WHERE q.queue = dq_configure_queue.queue FOR NO KEY UPDATE;
    v_new := v_old;
    v_new.max_deliveries := CASE WHEN 'max_deliveries' = ANY (v_clear) THEN NULL
                                 ELSE coalesce(dq_configure_queue.max_deliveries, v_old.max_deliveries) END;
    v_new.dead_letter_queue := CASE WHEN 'dead_letter_queue' = ANY (v_clear) THEN NULL
                                    ELSE coalesce(dq_configure_queue.dead_letter_queue, v_old.dead_letter_queue) END;
    v_new.archive := CASE WHEN 'archive' = ANY (v_clear) THEN false
                          ELSE coalesce(dq_configure_queue.archive, v_old.archive) END;
    v_new.retention := CASE WHEN 'retention' = ANY (v_clear) THEN NULL
                            ELSE coalesce(dq_configure_queue.retention, v_old.retention) END;
    v_new.notify := CASE WHEN 'notify' = ANY (v_clear) THEN true
                         ELSE coalesce(dq_configure_queue.notify, v_old.notify) END;
    v_new.max_payload_bytes := CASE WHEN 'max_payload_bytes' = ANY (v_clear) THEN NULL
                                    ELSE coalesce(dq_configure_queue.max_payload_bytes, v_old.max_payload_bytes) END;
    v_new.max_in_flight := CASE WHEN 'max_in_flight' = ANY (v_clear) THEN NULL
                                WHEN dq_configure_queue.max_in_flight IS NULL THEN v_old.max_in_flight
                                ELSE nullif(dq_configure_queue.max_in_flight, 0) END;
    v_new.rate_limit := CASE WHEN 'rate_limit' = ANY (v_clear) THEN NULL
                             WHEN dq_configure_queue.rate_limit IS NULL THEN v_old.rate_limit
                             ELSE nullif(dq_configure_queue.rate_limit, 0) END;
    v_new.rate_period := CASE WHEN 'rate_period' = ANY (v_clear) THEN NULL
                              ELSE coalesce(dq_configure_queue.rate_period, v_old.rate_period) END;
    IF v_new.max_deliveries IS NOT NULL AND v_new.dead_letter_queue IS NULL THEN
        IF 'dead_letter_queue' = ANY (v_clear) THEN
            RAISE EXCEPTION 'dq_configure_queue: clear names dead_letter_queue, but max_deliveries stays %: clear max_deliveries too, or give a dead_letter_queue',
                v_new.max_deliveries USING ERRCODE = '22023';
        END IF;
        RAISE EXCEPTION 'dq_configure_queue: max_deliveries needs a dead_letter_queue' USING ERRCODE = '22023';
    END IF;
    IF v_new.rate_limit IS NOT NULL AND v_new.rate_period IS NULL THEN
        IF 'rate_period' = ANY (v_clear) THEN
            RAISE EXCEPTION 'dq_configure_queue: clear names rate_period, but rate_limit stays %: clear rate_limit too, or give a rate_period',
                v_new.rate_limit USING ERRCODE = '22023';
        END IF;
        RAISE EXCEPTION 'dq_configure_queue: rate_limit needs a rate_period (an interval, at most 1 day)'
            USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.rate_period IS NOT NULL AND v_new.rate_limit IS NULL THEN
        RAISE EXCEPTION 'dq_configure_queue: rate_period needs a rate_limit (1 to 100000 deliveries per rate_period)'
            USING ERRCODE = '22023';
    END IF;
    IF v_new.rate_limit IS NULL THEN
        v_new.rate_period := NULL;  -- a rate limit cleared takes its period with it
    END IF;
    UPDATE dq_queues q
       SET max_deliveries = v_new.max_deliveries, dead_letter_queue = v_new.dead_letter_queue,
           archive = v_new.archive, retention = v_new.retention, notify = v_new.notify,
           max_payload_bytes = v_new.max_payload_bytes, max_in_flight = v_new.max_in_flight,
           rate_limit = v_new.rate_limit, rate_period = v_new.rate_period, updated_at = dq__now()
     WHERE q.queue = dq_configure_queue.queue
    RETURNING q.* INTO v_row;
    -- The rate limit's log has exactly rate_limit rows (sql/110_poll.sql). Added rows are free (used
    -- at the earliest time); when the limit shrinks, the rows of the oldest deliveries go, so the
    -- deliveries recorded in the current window are kept. Rows locked by a poll in progress are
    -- waited for (this holds the configuration row's lock, which a poll of a queue with a
    -- concurrency limit takes before any token, and a poll never waits for a token: no cycle).
    IF v_row.rate_limit IS DISTINCT FROM v_old.rate_limit THEN
        DELETE FROM dq_rate_tokens t
         WHERE t.queue = dq_configure_queue.queue
           AND t.slot IN (SELECT k.slot FROM dq_rate_tokens k WHERE k.queue = dq_configure_queue.queue
                           ORDER BY k.used_at DESC, k.slot
                           OFFSET coalesce(v_row.rate_limit, 0));
        INSERT INTO dq_rate_tokens (queue, slot, used_at)
        SELECT dq_configure_queue.queue, s.top + n, dq__min_time()
          FROM (SELECT coalesce(max(t.slot), 0) AS top, count(*) AS have
                  FROM dq_rate_tokens t WHERE t.queue = dq_configure_queue.queue) s
         CROSS JOIN LATERAL generate_series(1, coalesce(v_row.rate_limit, 0) - s.have::integer) AS n;
    END IF;
    -- A limit lifted or raised may let waiting consumers take more at once.
    v_woken := dq__wake_blocked(dq_configure_queue.queue);
    RAISE NOTICE 'dq_configure_queue: queue % configured: max_deliveries %, dead_letter_queue %, archive %, retention %, notify %, max_payload_bytes %, max_in_flight %, rate_limit %',
        v_row.queue, coalesce(v_row.max_deliveries::text, 'unlimited'), coalesce(v_row.dead_letter_queue, 'none'),
        CASE WHEN v_row.archive THEN 'on' ELSE 'off' END, coalesce(v_row.retention::text, 'forever'),
        CASE WHEN v_row.notify THEN 'on' ELSE 'off' END,
        coalesce(v_row.max_payload_bytes::text, 'default'), coalesce(v_row.max_in_flight::text, 'none'),
        coalesce(v_row.rate_limit || ' per ' || v_row.rate_period, 'none');
    RETURN v_row;
END;
$$;
COMMENT ON FUNCTION dq_configure_queue(text, integer, text, boolean, interval, boolean, integer, integer, integer, interval, text[]) IS
  'dq_configure_queue(queue text, max_deliveries integer >= 1, dead_letter_queue text (not the queue itself, not a chain leading back to it; required with max_deliveries, given now or set before), archive boolean, retention interval > 0, notify boolean, max_payload_bytes integer 1024..1073741824, max_in_flight integer 1..100000 (at most that many messages of the queue in flight at once, across all consumers; 0: no limit), rate_limit integer 1..100000 (at most that many deliveries start in any window of rate_period, across all consumers; 0: no limit), rate_period interval > 0, at most 1 day (required with a rate_limit, given now or set before), clear text[] (settings to reset to their defaults: any of max_deliveries, dead_letter_queue, archive, retention, notify, max_payload_bytes, max_in_flight, rate_limit (with its rate_period), rate_period)) -> dq_queues: sets the queue''s configuration. A setting left NULL keeps its value; one named in clear goes back to its default. An unconfigured queue has no delivery limit, no archive (rows kept forever once archived), notifications on, a 1 MiB payload limit and no concurrency or rate limit. Lowering max_in_flight does not take back messages already in flight. Errors: 22004/22023/22001 queue or dead_letter_queue; 22004 a NULL in clear; 22023 an unknown name in clear, a setting both given and cleared, max_deliveries < 1, max_deliveries without a dead_letter_queue (given or kept), dead_letter_queue = queue or a cycle of dead-letter queues, retention <= 0, max_payload_bytes, max_in_flight, rate_limit or rate_period out of range, rate_limit without rate_period or rate_period without rate_limit; 22008 now + retention or rate_period past 9999-12-30. Nothing is written on error. Concurrency: the queue''s row is created if missing and locked FOR NO KEY UPDATE, so concurrent calls are serialised and each keeps what the other set; changes of dead-letter queues are serialised by an advisory lock. Source: redrive policy and MaximumMessageSize (SQS Developer Guide).';
REVOKE ALL ON FUNCTION dq_configure_queue(text, integer, text, boolean, interval, boolean, integer, integer, integer, interval, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_configure_queue(text, integer, text, boolean, interval, boolean, integer, integer, integer, interval, text[]) TO dq_admin;

-- Pause and resume. A paused queue delivers nothing (dq_poll_many and dq_poll_or_wait return no
-- message); offers, acks, nacks, extends, cancels and schedules work as usual, and messages in
-- flight keep their locks. Waiting consumers sleep through the pause (dq_wait does not let offers
-- wake them) and are woken by dq_resume_queue at once.
-- Concurrency: one INSERT .. ON CONFLICT DO UPDATE of the queue's configuration row. A poll that
-- read the row before the pause committed may still deliver its batch.
CREATE OR REPLACE FUNCTION dq_pause_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_was boolean;
BEGIN
    v_error := dq__name_error('dq_pause_queue', 'queue', dq_pause_queue.queue, 100);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    SELECT q.paused INTO v_was FROM dq_queues q WHERE q.queue = dq_pause_queue.queue FOR NO KEY UPDATE;
    INSERT INTO dq_queues AS q (queue, paused, updated_at) VALUES (dq_pause_queue.queue, true, dq__now())
    ON CONFLICT (queue) DO UPDATE SET paused = true, updated_at = EXCLUDED.updated_at
     WHERE NOT q.paused;
    IF coalesce(v_was, false) THEN
        RETURN false;
    END IF;
    RAISE NOTICE 'dq_pause_queue: queue % is paused', dq_pause_queue.queue;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_pause_queue(text) IS
  'dq_pause_queue(queue text) -> boolean: pauses the queue (true; false when it was already paused): no message is delivered until dq_resume_queue; offers, acks, nacks and extends keep working and messages in flight keep their locks. Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_pause_queue(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_pause_queue(text) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_resume_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
BEGIN
    v_error := dq__name_error('dq_resume_queue', 'queue', dq_resume_queue.queue, 100);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    UPDATE dq_queues q SET paused = false, updated_at = dq__now()
     WHERE q.queue = dq_resume_queue.queue AND q.paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Every consumer waiting on the queue polls again (delivered at commit).
    PERFORM pg_notify(dq_channel(dq_resume_queue.queue), dq_resume_queue.queue);
    RAISE NOTICE 'dq_resume_queue: queue % is resumed', dq_resume_queue.queue;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_resume_queue(text) IS
  'dq_resume_queue(queue text) -> boolean: resumes a paused queue (true; false when it was not paused) and wakes its waiting consumers at once (NOTIFY dq_channel(queue) at commit). Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_resume_queue(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_resume_queue(text) TO dq_admin;

-- Delete every message of a queue. Not archived: a purge is not an outcome of the messages.
-- In-flight messages are deleted too (their holders' acks then return false). Future occurrences
-- of named schedules are offered again by the next dq_cron_tick (sql/200_cron.sql). Concurrency:
-- one DELETE; rows locked by a poll in progress are deleted once that transaction ends.
CREATE OR REPLACE FUNCTION dq_purge(queue text, confirm boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_count   bigint;
    v_settled integer;
    v_woken   boolean;
BEGIN
    v_error := dq__name_error('dq_purge', 'queue', dq_purge.queue, 100);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    IF dq_purge.confirm IS DISTINCT FROM true THEN
        RAISE EXCEPTION 'dq_purge: confirm must be true to delete every message of queue %', dq_purge.queue
            USING ERRCODE = '22023', HINT = format('SELECT dq_purge(%L, confirm => true)', dq_purge.queue);
    END IF;
    PERFORM dq__cron_note_deleted(dq_purge.queue, NULL);
    DELETE FROM dq_messages m WHERE m.queue = dq_purge.queue;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    -- Each group is settled rather than its row deleted: a message offered meanwhile (committed after
    -- the DELETE's snapshot) keeps a head (sql/020_groups.sql).
    SELECT dq__settle_groups(array_agg(g.queue), array_agg(g.message_group)) INTO v_settled
      FROM dq_groups g WHERE g.queue = dq_purge.queue;
    v_woken := dq__wake_blocked(dq_purge.queue);  -- in-flight messages are gone: their slots are free
    RAISE NOTICE 'dq_purge: deleted % messages of queue %', v_count, dq_purge.queue;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_purge(text, boolean) IS
  'dq_purge(queue text, confirm boolean default false) -> bigint: deletes every message of the queue, in flight or not, without archiving, and returns how many (NOTICE); future occurrences of named schedules come back at the next dq_cron_tick. Errors: 22004/22023/22001 queue; 22023 unless confirm => true (nothing deleted). Source: PurgeQueue (SQS Developer Guide).';
REVOKE ALL ON FUNCTION dq_purge(text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_purge(text, boolean) TO dq_admin;

-- After a known crash of every consumer: make the queue's in-flight messages due now instead of
-- waiting for their locks to expire. delivery_count is kept (the crashed deliveries count).
-- Concurrency: rows locked by a poll or an ack in progress are skipped (SKIP LOCKED): they are
-- not stranded; a holder that is still alive loses its lock (its ack returns false).
CREATE OR REPLACE FUNCTION dq_release_locks(queue text)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_count   integer;
    v_woken   boolean;
    v_groups  text[];
    v_settled integer;
BEGIN
    v_error := dq__name_error('dq_release_locks', 'queue', dq_release_locks.queue, 100);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    WITH held AS (
        SELECT m.id FROM dq_messages m
         WHERE m.lock_token IS NOT NULL AND m.queue = dq_release_locks.queue
         ORDER BY m.id
           FOR UPDATE SKIP LOCKED
    )
    , released AS (
        UPDATE dq_messages m SET lock_token = NULL, scheduled_at = dq__clock()
          FROM held WHERE m.id = held.id
        RETURNING m.id, m.message_group, m.scheduled_at, m.dead_from IS NOT NULL AS dead
    )
    SELECT count(*), array_agg(r.message_group) FILTER (WHERE r.message_group IS NOT NULL AND NOT r.dead)
      INTO v_count, v_groups FROM released r;
    -- A released group head keeps its place, due now: its group is settled (or the settle queued
    -- when another transaction holds the group's row, sql/020_groups.sql).
    IF v_groups IS NOT NULL THEN
        v_settled := dq__settle_groups(array_fill(dq_release_locks.queue, ARRAY[cardinality(v_groups)]), v_groups);
    END IF;
    v_woken := dq__wake(dq_release_locks.queue, dq__clock());
    v_woken := dq__wake_blocked(dq_release_locks.queue);
    RAISE NOTICE 'dq_release_locks: released % locks of queue % (due now)', v_count, dq_release_locks.queue;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_release_locks(text) IS
  'dq_release_locks(queue text) -> integer: makes every in-flight message of the queue due now (lock tokens cleared, delivery_count kept) and returns how many (NOTICE); for use after a known crash of the consumers. Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_release_locks(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_release_locks(text) TO dq_admin;

-- Retention: archive rows older than their queue's retention, oldest first, at most
-- batch_size per call (one short transaction; the index (queue, acked_at) finds them).
CREATE OR REPLACE FUNCTION dq_prune_archive(batch_size integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_count integer;
BEGIN
    v_error := dq__range_error('dq_prune_archive', 'batch_size', dq_prune_archive.batch_size, 1, 1000000);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    DELETE FROM dq_archive a
     WHERE a.archive_id IN (
        SELECT old.archive_id
          FROM dq_queues q
         CROSS JOIN LATERAL (
            SELECT x.archive_id FROM dq_archive x
             WHERE x.queue = q.queue AND x.acked_at < dq__now() - q.retention
             ORDER BY x.acked_at
             LIMIT dq_prune_archive.batch_size) old
         WHERE q.retention IS NOT NULL
         LIMIT dq_prune_archive.batch_size);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_prune_archive(integer) IS
  'dq_prune_archive(batch_size integer 1..1000000 default 10000) -> integer: deletes up to batch_size archive rows older than their queue''s retention, in one transaction, and returns how many. Errors: 22004/22023 batch_size. See dq_prune_archive_all for the pg_cron job.';
REVOKE ALL ON FUNCTION dq_prune_archive(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_prune_archive(integer) TO dq_admin;

-- The retention job (pg_cron 'dq-archive-prune'): batches of batch_size, each committed on its
-- own, so no lock or transaction is held long, until nothing is left or max_batches is reached.
-- A procedure that COMMITs can have neither SET clauses nor SECURITY DEFINER (PostgreSQL manual,
-- CREATE PROCEDURE and "Transaction Management"): it runs with its caller's rights and calls
-- dq_prune_archive qualified with the install schema, which is the SECURITY DEFINER part.
DO $do$
BEGIN
    -- Written with the install schema's name (format: %I is the schema, %% a literal %): a
    -- procedure that commits cannot pin a search_path.
    EXECUTE pg_catalog.format($f$
CREATE OR REPLACE PROCEDURE dq_prune_archive_all(batch_size integer DEFAULT 10000, max_batches integer DEFAULT 100)
LANGUAGE plpgsql
AS $$
DECLARE
    v_deleted integer;
    v_total   bigint := 0;
BEGIN
    FOR i IN 1 .. coalesce(max_batches, 100) LOOP
        v_deleted := %I.dq_prune_archive(batch_size);
        v_total := v_total + v_deleted;
        COMMIT;
        EXIT WHEN v_deleted < batch_size;
    END LOOP;
    IF v_total > 0 THEN
        RAISE NOTICE 'dq_prune_archive_all: deleted %% archive rows past their retention', v_total;
    END IF;
END;
$$
$f$, dq__schema());
END;
$do$;
COMMENT ON PROCEDURE dq_prune_archive_all(integer, integer) IS
  'CALL dq_prune_archive_all(batch_size integer default 10000, max_batches integer default 100): prunes the archive by retention in batches, committing after each (run by the pg_cron job dq-archive-prune; call it on its own, not inside a transaction block). Errors: those of dq_prune_archive (22004/22023 batch_size); 2D000 invalid_transaction_termination when called inside a transaction block. Source: PostgreSQL manual, CREATE PROCEDURE and "Transaction Management".';
REVOKE ALL ON PROCEDURE dq_prune_archive_all(integer, integer) FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE dq_prune_archive_all(integer, integer) TO dq_admin;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- Stats. Counting a million index entries takes hundreds of milliseconds, so each count is exact
-- up to dq__stats_exact_limit() rows and estimated beyond it (the column approximate says so):
--  * a live count past the limit comes from the planner's statistics of dq_messages (rows of the
--    queue from pg_stats' most common values times reltuples, minus the other, exact, figures;
--    split by the scheduled_at histogram when both ready and scheduled are past the limit);
--  * an archive count past the limit is extrapolated from the time the limit-th newest row was
--    acknowledged.
CREATE OR REPLACE FUNCTION dq__stats_exact_limit() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 20000 $$;
COMMENT ON FUNCTION dq__stats_exact_limit() IS 'Internal: counts of dq_queue_stats are exact up to this many rows.';
REVOKE ALL ON FUNCTION dq__stats_exact_limit() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Rows of one queue according to the planner's statistics (NULL when there are none yet).
CREATE OR REPLACE FUNCTION dq__estimated_rows(queue text, due_fraction_of boolean)
RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_tuples  double precision;
    v_vals    text[];
    v_freqs   real[];
    v_ndist   real;
    v_bounds  timestamptz[];
    v_pos     integer;
    v_share   double precision;
BEGIN
    SELECT greatest(c.reltuples, 0) INTO v_tuples FROM pg_class c WHERE c.oid = 'dq_messages'::regclass;
    SELECT s.most_common_vals::text::text[], s.most_common_freqs, s.n_distinct INTO v_vals, v_freqs, v_ndist
      FROM pg_stats s WHERE s.schemaname = dq__schema() AND s.tablename = 'dq_messages' AND s.attname = 'queue';
    IF NOT FOUND OR v_tuples IS NULL THEN
        RETURN NULL;
    END IF;
    v_pos := array_position(v_vals, dq__estimated_rows.queue);
    IF v_pos IS NOT NULL THEN
        v_share := v_freqs[v_pos];
    ELSE
        v_share := (1 - coalesce((SELECT sum(f) FROM unnest(v_freqs) f), 0))
                 / greatest(CASE WHEN v_ndist < 0 THEN -v_ndist * v_tuples ELSE v_ndist END
                            - coalesce(array_length(v_vals, 1), 0), 1);
    END IF;
    IF NOT due_fraction_of THEN
        RETURN v_tuples * v_share;
    END IF;
    SELECT s.histogram_bounds::text::timestamptz[] INTO v_bounds
      FROM pg_stats s WHERE s.schemaname = dq__schema() AND s.tablename = 'dq_messages' AND s.attname = 'scheduled_at';
    IF v_bounds IS NULL OR array_length(v_bounds, 1) < 2 THEN
        RETURN v_tuples * v_share / 2;
    END IF;
    RETURN v_tuples * v_share
         * (width_bucket(dq__now(), v_bounds) - 0.5) / (array_length(v_bounds, 1) - 1)::double precision;
END;
$$;
COMMENT ON FUNCTION dq__estimated_rows(text, boolean) IS
  'Internal: planner-statistics estimate of a queue''s rows (all, or the due share), for dq_queue_stats past its exact limit.';
REVOKE ALL ON FUNCTION dq__estimated_rows(text, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

CREATE OR REPLACE FUNCTION dq_queue_stats(queue text)
RETURNS dq_stats_row
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_q        text := dq_queue_stats.queue;
    v_error    jsonb := dq__name_error('dq_queue_stats', 'queue', dq_queue_stats.queue, 100);
    v_limit    integer := dq__stats_exact_limit();
    v_now      timestamptz := dq__clock();
    v_due      bigint;   -- due now: ready, including expired locks (they are redelivered)
    v_future   bigint;   -- not due: scheduled and in flight
    v_approx   boolean := false;
    v_archive  boolean;
    v_est      double precision;
    v_tenth    timestamptz;
    v_groups   bigint;
    r          dq_stats_row;
BEGIN
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    r.queue := v_q;
    -- Each message is in one of two indexes by due time: ungrouped messages (and dead letters) in
    -- dq_messages_ready_idx, read one priority level at a time (dq__levels), grouped messages in
    -- dq_messages_grouped_idx. Every count reads at most v_limit + 1 entries of each.
    SELECT count(*) INTO v_due FROM (
        SELECT 1 FROM dq__levels(v_q) AS l(p)
         CROSS JOIN LATERAL (SELECT 1 FROM dq_messages d
                              WHERE d.queue = v_q AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                                AND d.priority = l.p AND d.scheduled_at <= v_now LIMIT v_limit + 1) x
        UNION ALL
        (SELECT 1 FROM dq_messages m
          WHERE m.queue = v_q AND m.message_group IS NOT NULL AND m.dead_from IS NULL AND m.scheduled_at <= v_now
          LIMIT v_limit + 1)
        LIMIT v_limit + 1) s;
    SELECT count(*) INTO v_future FROM (
        SELECT 1 FROM dq__levels(v_q) AS l(p)
         CROSS JOIN LATERAL (SELECT 1 FROM dq_messages d
                              WHERE d.queue = v_q AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                                AND d.priority = l.p AND d.scheduled_at > v_now LIMIT v_limit + 1) x
        UNION ALL
        (SELECT 1 FROM dq_messages m
          WHERE m.queue = v_q AND m.message_group IS NOT NULL AND m.dead_from IS NULL AND m.scheduled_at > v_now
          LIMIT v_limit + 1)
        LIMIT v_limit + 1) s;
    -- In flight: held under a lock that has not expired (the partial index on lock_token).
    SELECT count(*), count(*) FILTER (WHERE m.delivery_count > 1) INTO r.in_flight, r.redelivered
      FROM dq_messages m WHERE m.lock_token IS NOT NULL AND m.queue = v_q AND m.scheduled_at > v_now;
    SELECT count(*) INTO r.dead FROM (
        SELECT 1 FROM dq_messages m WHERE m.dead_from = v_q LIMIT v_limit + 1) s;
    IF r.dead > v_limit THEN
        v_approx := true;  -- dead letters of one origin: no estimate finer than "more than the limit"
    END IF;
    IF v_due > v_limit OR v_future > v_limit THEN
        v_approx := true;
        IF v_due > v_limit AND v_future > v_limit THEN
            v_est := dq__estimated_rows(v_q, true);
            v_due := greatest(v_limit + 1, coalesce(v_est, 0)::bigint);
            v_future := greatest(v_limit + 1, (coalesce(dq__estimated_rows(v_q, false), 0) - v_due)::bigint);
        ELSIF v_due > v_limit THEN
            v_due := greatest(v_limit + 1, (coalesce(dq__estimated_rows(v_q, false), 0) - v_future)::bigint);
        ELSE
            v_future := greatest(v_limit + 1, (coalesce(dq__estimated_rows(v_q, false), 0) - v_due)::bigint);
        END IF;
    END IF;
    r.ready := v_due;
    r.scheduled := greatest(v_future - r.in_flight, 0);
    SELECT v_now - min(x.at) INTO r.oldest_ready_age FROM (
        SELECT (SELECT d.scheduled_at FROM dq_messages d
                 WHERE d.queue = v_q AND (d.message_group IS NULL OR d.dead_from IS NOT NULL) AND d.priority = l.p
                 ORDER BY d.scheduled_at LIMIT 1) AS at
          FROM dq__levels(v_q) AS l(p)
        UNION ALL
        SELECT min(m.scheduled_at) FROM dq_messages m
         WHERE m.queue = v_q AND m.message_group IS NOT NULL AND m.dead_from IS NULL) x
     WHERE x.at <= v_now;
    SELECT min(x.at) INTO r.next_due FROM (
        SELECT (SELECT d.scheduled_at FROM dq_messages d
                 WHERE d.queue = v_q AND (d.message_group IS NULL OR d.dead_from IS NOT NULL) AND d.priority = l.p
                   AND d.scheduled_at > v_now AND d.lock_token IS NULL
                 ORDER BY d.scheduled_at LIMIT 1) AS at
          FROM dq__levels(v_q) AS l(p)
        UNION ALL
        SELECT min(m.scheduled_at) FROM dq_messages m
         WHERE m.queue = v_q AND m.message_group IS NOT NULL AND m.dead_from IS NULL
           AND m.scheduled_at > v_now AND m.lock_token IS NULL) x;
    SELECT q.archive, coalesce(q.paused, false) INTO v_archive, r.paused FROM dq_queues q WHERE q.queue = v_q;
    r.paused := coalesce(r.paused, false);
    -- Held: messages of FIFO groups behind their group's head (counted in ready or scheduled too).
    SELECT count(*) INTO r.held FROM (
        SELECT 1 FROM dq_messages m
         WHERE m.queue = v_q AND m.message_group IS NOT NULL AND m.dead_from IS NULL LIMIT v_limit + 1) s;
    IF r.held > 0 THEN
        SELECT count(*) INTO v_groups FROM dq_groups g WHERE g.queue = v_q;
        IF r.held > v_limit THEN
            v_approx := true;
        END IF;
        r.held := greatest(r.held - v_groups, 0);
    END IF;
    -- Expired: past expires_at and not removed yet (a poll that reaches them removes them).
    SELECT count(*) INTO r.expired FROM (
        SELECT 1 FROM dq_messages m WHERE m.queue = v_q AND m.expires_at <= v_now LIMIT v_limit + 1) s;
    IF r.expired > v_limit THEN
        v_approx := true;
    END IF;
    IF coalesce(v_archive, false) THEN
        SELECT count(*) INTO r.acked_last_minute FROM (
            SELECT 1 FROM dq_archive a WHERE a.queue = v_q AND a.acked_at > v_now - interval '1 minute'
               AND a.outcome = 'acked' LIMIT v_limit + 1) s;
        SELECT count(*) INTO r.acked_last_hour FROM (
            SELECT 1 FROM dq_archive a WHERE a.queue = v_q AND a.acked_at > v_now - interval '1 hour'
               AND a.outcome = 'acked' LIMIT v_limit + 1) s;
        IF r.acked_last_hour > v_limit THEN
            -- Extrapolate from how long the newest v_limit acknowledgements took.
            v_approx := true;
            SELECT a.acked_at INTO v_tenth FROM dq_archive a
             WHERE a.queue = v_q AND a.outcome = 'acked' ORDER BY a.acked_at DESC OFFSET v_limit - 1 LIMIT 1;
            IF r.acked_last_minute > v_limit THEN
                r.acked_last_minute := (v_limit * 60 / greatest(extract(epoch FROM v_now - v_tenth), 0.001))::bigint;
            END IF;
            r.acked_last_hour := (v_limit * 3600 / greatest(extract(epoch FROM v_now - v_tenth), 0.001))::bigint;
        END IF;
    END IF;
    r.approximate := v_approx;
    RETURN r;
END;
$$;
COMMENT ON FUNCTION dq_queue_stats(text) IS
  'dq_queue_stats(queue text) -> one row: ready (due now, expired locks included), scheduled (future, unlocked), in_flight (locked, lock not expired), redelivered (in flight with delivery_count > 1), dead (dead letters that died in this queue), oldest_ready_age interval, next_due timestamptz, acked_last_minute / acked_last_hour (from the archive; NULL when the queue does not archive), approximate (true when a count passed the exact limit of 20000 rows and was estimated), paused boolean, held (messages of FIFO groups waiting behind their group''s first message; also counted in ready or scheduled), expired (past expires_at, not removed yet; a poll that reaches them removes them). Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_queue_stats(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_queue_stats(text) TO dq_admin;

-- One row per queue: every queue with messages (found by a skip scan of the (queue, scheduled_at)
-- index, one probe per queue, not a scan of the table) and every configured queue.
CREATE OR REPLACE VIEW dq_stats AS
WITH RECURSIVE live AS (
    SELECT (SELECT m.queue FROM dq_messages m ORDER BY m.queue LIMIT 1) AS queue
    UNION ALL
    SELECT (SELECT m.queue FROM dq_messages m WHERE m.queue > live.queue ORDER BY m.queue LIMIT 1)
      FROM live WHERE live.queue IS NOT NULL
), names AS (
    SELECT live.queue FROM live WHERE live.queue IS NOT NULL
    UNION
    SELECT q.queue FROM dq_queues q
)
SELECT s.*
  FROM names
 CROSS JOIN LATERAL dq_queue_stats(names.queue) s
 ORDER BY s.queue;
COMMENT ON VIEW dq_stats IS
  'One row per queue (dq_queue_stats): ready, scheduled, in_flight, redelivered, dead, oldest_ready_age, next_due, acked_last_minute, acked_last_hour, approximate, paused, held, expired.';
-- Reading it is an operator's business (the view runs with its owner's rights).
REVOKE ALL ON dq_stats FROM PUBLIC;
GRANT SELECT ON dq_stats TO dq_admin;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
