-- Per-queue configuration: dq_configure_queue. Every operator function says what it changed with a
-- NOTICE.
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
    v_error := dq__name_error('dq_configure_queue', 'queue', dq_configure_queue.queue, dq__limit_queue_chars());
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
       OR char_length(dq_configure_queue.dead_letter_queue) > dq__limit_queue_chars()) THEN
        v_error := dq__name_error('dq_configure_queue', 'dead_letter_queue', dq_configure_queue.dead_letter_queue,
                                  dq__limit_queue_chars());
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
    IF dq_configure_queue.max_payload_bytes NOT BETWEEN dq__limit_payload_bytes_min() AND dq__limit_payload_bytes_max() THEN
        RAISE EXCEPTION 'dq_configure_queue: max_payload_bytes is %, it must be between % and % (or NULL to keep the current limit; the default is %)',
            dq_configure_queue.max_payload_bytes, dq__limit_payload_bytes_min(), dq__limit_payload_bytes_max(),
            dq__limit_payload_bytes_default() USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.max_in_flight NOT BETWEEN 0 AND dq__limit_max_in_flight_max() THEN
        RAISE EXCEPTION 'dq_configure_queue: max_in_flight is %, it must be between 1 and % (0 removes the limit, NULL keeps the current one)',
            dq_configure_queue.max_in_flight, dq__limit_max_in_flight_max() USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.rate_limit NOT BETWEEN 0 AND dq__limit_rate_limit_max() THEN
        RAISE EXCEPTION 'dq_configure_queue: rate_limit is %, it must be between 1 and % (0 removes the limit, NULL keeps the current one)',
            dq_configure_queue.rate_limit, dq__limit_rate_limit_max() USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.rate_period IS NOT NULL THEN
        v_error := dq__time_after_error('dq_configure_queue', 'rate_period', dq_configure_queue.rate_period, dq__now(), false,
                                        dq__limit_rate_period_max());
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
        RAISE EXCEPTION 'dq_configure_queue: rate_limit needs a rate_period (an interval, at most %)',
            dq__interval_text(dq__limit_rate_period_max()) USING ERRCODE = '22023';
    END IF;
    IF dq_configure_queue.rate_period IS NOT NULL AND v_new.rate_limit IS NULL THEN
        RAISE EXCEPTION 'dq_configure_queue: rate_period needs a rate_limit (1 to % deliveries per rate_period)',
            dq__limit_rate_limit_max() USING ERRCODE = '22023';
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

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
