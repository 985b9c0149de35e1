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

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- The settings clear may name, in the order of dq_configure_queue's parameters.
CREATE OR REPLACE FUNCTION dq__configure_settings() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ARRAY['max_deliveries', 'dead_letter_queue', 'archive', 'retention', 'notify', 'max_payload_bytes',
                   'max_in_flight', 'rate_limit', 'rate_period'] $$;
COMMENT ON FUNCTION dq__configure_settings() IS 'Internal: the names of the settings dq_configure_queue''s clear may name.';
REVOKE ALL ON FUNCTION dq__configure_settings() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The first error of dq_configure_queue's arguments taken one by one (given: the settings given, a
-- value or NULL, as a row of dq_queues; clear: the settings named in clear), NULL when there is none.
CREATE OR REPLACE FUNCTION dq__configure_error(given dq_queues, clear text[])
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_settings  text[] := dq__configure_settings();
    v_unknown   text := (SELECT c FROM unnest(clear) AS c WHERE c <> ALL (v_settings) LIMIT 1);
    -- A setting given a value and also named in clear is a contradiction.
    v_both      text := (SELECT c FROM unnest(array_remove(ARRAY[
                             CASE WHEN given.max_deliveries IS NOT NULL THEN 'max_deliveries' END,
                             CASE WHEN given.dead_letter_queue IS NOT NULL THEN 'dead_letter_queue' END,
                             CASE WHEN given.archive IS NOT NULL THEN 'archive' END,
                             CASE WHEN given.retention IS NOT NULL THEN 'retention' END,
                             CASE WHEN given.notify IS NOT NULL THEN 'notify' END,
                             CASE WHEN given.max_payload_bytes IS NOT NULL THEN 'max_payload_bytes' END,
                             CASE WHEN given.max_in_flight IS NOT NULL THEN 'max_in_flight' END,
                             CASE WHEN given.rate_limit IS NOT NULL THEN 'rate_limit' END,
                             CASE WHEN given.rate_period IS NOT NULL THEN 'rate_period' END], NULL)) AS c
                          WHERE c = ANY (clear) LIMIT 1);
BEGIN
    RETURN coalesce(
        dq__name_error('dq_configure_queue', 'queue', given.queue, dq__limit_queue_chars()),
        CASE WHEN array_position(clear, NULL) IS NOT NULL
             THEN dq__error('22004', format('dq_configure_queue: clear must not contain NULL (it names settings: %s)',
                                            array_to_string(v_settings, ', '))) END,
        CASE WHEN v_unknown IS NOT NULL
             THEN dq__error('22023', format('dq_configure_queue: clear names %s, which is not a setting (the settings: %s)',
                                            quote_literal(left(v_unknown, 100)), array_to_string(v_settings, ', '))) END,
        CASE WHEN v_both IS NOT NULL
             THEN dq__error('22023', format('dq_configure_queue: %s is given a value and named in clear; give one or the '
                                            'other', v_both)) END,
        CASE WHEN given.max_deliveries < 1
             THEN dq__error('22023', format('dq_configure_queue: max_deliveries is %s, it must be at least 1 (or NULL to '
                                            'keep the current limit)', given.max_deliveries)) END,
        CASE WHEN given.dead_letter_queue IS NOT NULL
             THEN dq__name_error('dq_configure_queue', 'dead_letter_queue', given.dead_letter_queue,
                                 dq__limit_queue_chars()) END,
        CASE WHEN given.dead_letter_queue = given.queue
             THEN dq__error('22023', 'dq_configure_queue: dead_letter_queue must differ from queue') END,
        CASE WHEN given.retention IS NOT NULL
             THEN dq__time_after_error('dq_configure_queue', 'retention', given.retention, dq__now(), false) END,
        CASE WHEN given.max_payload_bytes NOT BETWEEN dq__limit_payload_bytes_min() AND dq__limit_payload_bytes_max()
             THEN dq__error('22023', format('dq_configure_queue: max_payload_bytes is %s, it must be between %s and %s (or '
                                            'NULL to keep the current limit; the default is %s)', given.max_payload_bytes,
                                            dq__limit_payload_bytes_min(), dq__limit_payload_bytes_max(),
                                            dq__limit_payload_bytes_default())) END,
        CASE WHEN given.max_in_flight NOT BETWEEN 0 AND dq__limit_max_in_flight_max()
             THEN dq__error('22023', format('dq_configure_queue: max_in_flight is %s, it must be between 1 and %s (0 '
                                            'removes the limit, NULL keeps the current one)', given.max_in_flight,
                                            dq__limit_max_in_flight_max())) END,
        CASE WHEN given.rate_limit NOT BETWEEN 0 AND dq__limit_rate_limit_max()
             THEN dq__error('22023', format('dq_configure_queue: rate_limit is %s, it must be between 1 and %s (0 removes '
                                            'the limit, NULL keeps the current one)', given.rate_limit,
                                            dq__limit_rate_limit_max())) END,
        CASE WHEN given.rate_period IS NOT NULL
             THEN dq__time_after_error('dq_configure_queue', 'rate_period', given.rate_period, dq__now(), false,
                                       dq__limit_rate_period_max()) END);
END;
$$;
COMMENT ON FUNCTION dq__configure_error(dq_queues, text[]) IS 'Internal: the first error of dq_configure_queue''s arguments (each setting alone, and clear), NULL when none.';
REVOKE ALL ON FUNCTION dq__configure_error(dq_queues, text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A chain of dead-letter queues must not loop back to queue: a message would move around it
-- forever. NULL, or the 22023 error naming the chain that dead_letter_queue would close. All changes
-- of dead-letter queues take one transaction-level advisory lock (here, to the end of the caller's
-- transaction), so two concurrent calls that would close a loop between them are serialised: the
-- second one (a new statement snapshot under READ COMMITTED) sees the first one's row and fails.
CREATE OR REPLACE FUNCTION dq__dead_letter_cycle_error(queue text, dead_letter_queue text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
DECLARE
    v_chain  text[] := ARRAY[queue, dead_letter_queue];
    v_next   text := dead_letter_queue;
BEGIN
    -- The key is the same for every install in the database: two installs only serialise.
    PERFORM pg_advisory_xact_lock(hashtextextended('dq_configure_queue dead_letter_queue', 0));
    LOOP
        SELECT q.dead_letter_queue INTO v_next FROM dq_queues q
         WHERE q.queue = v_next AND q.queue <> dq__dead_letter_cycle_error.queue;
        EXIT WHEN v_next IS NULL;
        v_chain := v_chain || v_next;
        IF v_next = queue THEN
            RETURN dq__error('22023', format('dq_configure_queue: dead_letter_queue %s would make a cycle of dead-letter '
                                             'queues: %s', dead_letter_queue, array_to_string(v_chain, ' -> ')));
        END IF;
        EXIT WHEN cardinality(v_chain) > 1000;  -- a loop not through this queue (not created by dq_configure_queue)
    END LOOP;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION dq__dead_letter_cycle_error(text, text) IS 'Internal: NULL, or the 22023 error when dead_letter_queue would close a cycle of dead-letter queues through queue (takes the advisory lock of such changes).';
REVOKE ALL ON FUNCTION dq__dead_letter_cycle_error(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The configuration row that old becomes (given: the settings given, NULL when not; clear: the
-- settings reset to their defaults, those of a queue never configured; max_in_flight => 0 and
-- rate_limit => 0 clear those two), and the first error of the combination: max_deliveries needs
-- a dead_letter_queue (given now or kept), rate_limit a rate_period, and a rate_period a rate_limit
-- (clearing rate_limit clears its period: the two exist together, a table constraint).
CREATE OR REPLACE FUNCTION dq__configure_merge(old dq_queues, given dq_queues, clear text[],
                                               OUT merged dq_queues, OUT error jsonb)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
BEGIN
    merged := old;
    merged.max_deliveries := CASE WHEN 'max_deliveries' = ANY (clear) THEN NULL
                                  ELSE coalesce(given.max_deliveries, old.max_deliveries) END;
    merged.dead_letter_queue := CASE WHEN 'dead_letter_queue' = ANY (clear) THEN NULL
                                     ELSE coalesce(given.dead_letter_queue, old.dead_letter_queue) END;
    merged.archive := CASE WHEN 'archive' = ANY (clear) THEN false ELSE coalesce(given.archive, old.archive) END;
    merged.retention := CASE WHEN 'retention' = ANY (clear) THEN NULL ELSE coalesce(given.retention, old.retention) END;
    merged.notify := CASE WHEN 'notify' = ANY (clear) THEN true ELSE coalesce(given.notify, old.notify) END;
    merged.max_payload_bytes := CASE WHEN 'max_payload_bytes' = ANY (clear) THEN NULL
                                     ELSE coalesce(given.max_payload_bytes, old.max_payload_bytes) END;
    merged.max_in_flight := CASE WHEN 'max_in_flight' = ANY (clear) THEN NULL
                                 WHEN given.max_in_flight IS NULL THEN old.max_in_flight
                                 ELSE nullif(given.max_in_flight, 0) END;
    merged.rate_limit := CASE WHEN 'rate_limit' = ANY (clear) THEN NULL
                              WHEN given.rate_limit IS NULL THEN old.rate_limit
                              ELSE nullif(given.rate_limit, 0) END;
    merged.rate_period := CASE WHEN 'rate_period' = ANY (clear) THEN NULL
                               WHEN merged.rate_limit IS NULL THEN NULL  -- a rate limit cleared takes its period
                               ELSE coalesce(given.rate_period, old.rate_period) END;
    error := CASE
        WHEN merged.max_deliveries IS NOT NULL AND merged.dead_letter_queue IS NULL AND 'dead_letter_queue' = ANY (clear)
        THEN dq__error('22023', format('dq_configure_queue: clear names dead_letter_queue, but max_deliveries stays %s: '
                                       'clear max_deliveries too, or give a dead_letter_queue', merged.max_deliveries))
        WHEN merged.max_deliveries IS NOT NULL AND merged.dead_letter_queue IS NULL
        THEN dq__error('22023', 'dq_configure_queue: max_deliveries needs a dead_letter_queue')
        WHEN merged.rate_limit IS NOT NULL AND merged.rate_period IS NULL AND 'rate_period' = ANY (clear)
        THEN dq__error('22023', format('dq_configure_queue: clear names rate_period, but rate_limit stays %s: clear '
                                       'rate_limit too, or give a rate_period', merged.rate_limit))
        WHEN merged.rate_limit IS NOT NULL AND merged.rate_period IS NULL
        THEN dq__error('22023', format('dq_configure_queue: rate_limit needs a rate_period (an interval, at most %s)',
                                       dq__interval_text(dq__limit_rate_period_max())))
        WHEN given.rate_period IS NOT NULL AND merged.rate_limit IS NULL
        THEN dq__error('22023', format('dq_configure_queue: rate_period needs a rate_limit (1 to %s deliveries per '
                                       'rate_period)', dq__limit_rate_limit_max())) END;
END;
$$;
COMMENT ON FUNCTION dq__configure_merge(dq_queues, dq_queues, text[]) IS 'Internal: the configuration row old becomes with the settings given and cleared, and the first error of the combination (22023), NULL when none.';
REVOKE ALL ON FUNCTION dq__configure_merge(dq_queues, dq_queues, text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The rate limit's log of a queue (sql/110_poll.sql) gets exactly rate_limit rows (none for NULL).
-- Added rows are free (used at the earliest time); when the limit shrinks, the rows of the oldest
-- deliveries go, so the deliveries recorded in the current window are kept. Rows locked by a poll in
-- progress are waited for: the caller holds the configuration row's lock, which a poll of a queue
-- with a concurrency limit takes before any token, and a poll never waits for a token (no cycle).
CREATE OR REPLACE FUNCTION dq__rate_tokens_resize(queue text, rate_limit integer)
RETURNS void
LANGUAGE sql VOLATILE SET search_path FROM CURRENT
AS $$
    DELETE FROM dq_rate_tokens t
     WHERE t.queue = $1
       AND t.slot IN (SELECT k.slot FROM dq_rate_tokens k WHERE k.queue = $1
                       ORDER BY k.used_at DESC, k.slot
                       OFFSET coalesce($2, 0));
    INSERT INTO dq_rate_tokens (queue, slot, used_at)
    SELECT $1, s.top + n, dq__min_time()
      FROM (SELECT coalesce(max(t.slot), 0) AS top, count(*) AS have FROM dq_rate_tokens t WHERE t.queue = $1) s
     CROSS JOIN LATERAL generate_series(1, coalesce($2, 0) - s.have::integer) AS n;
$$;
COMMENT ON FUNCTION dq__rate_tokens_resize(text, integer) IS 'Internal: gives a queue''s rate limit log (dq_rate_tokens) exactly rate_limit rows, keeping those of the newest deliveries.';
REVOKE ALL ON FUNCTION dq__rate_tokens_resize(text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- dq_configure_queue. One rule for every setting: a setting not given (NULL) keeps its value; a
-- setting named in clear goes back to its default (that of a queue never configured). The new row
-- is built from the row this call locked, and the combinations are checked on it
-- (dq__configure_merge).
-- Concurrency: the call creates the queue's row if it is missing (INSERT .. ON CONFLICT DO
-- NOTHING, which waits for a concurrent insert of the same queue to end), then locks it FOR NO
-- KEY UPDATE until the transaction ends. Two calls for one queue are thus serialised and each
-- starts from the other's committed row (READ COMMITTED reads the newest version of a row it
-- waited for): a call setting one setting never undoes a concurrent call setting another (under
-- REPEATABLE READ or SERIALIZABLE the second call fails with 40001 instead). Changes of
-- dead-letter queues are also serialised among themselves (dq__dead_letter_cycle_error).
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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_clear  text[] := coalesce(dq_configure_queue.clear, '{}');
    v_given  dq_queues;  -- the settings given (NULL: not given)
    v_error  jsonb;
    v_old    dq_queues;
    v_merge  record;
    v_row    dq_queues;
    v_woken  boolean;
BEGIN
    v_given.queue := dq_configure_queue.queue;
    v_given.max_deliveries := dq_configure_queue.max_deliveries;
    v_given.dead_letter_queue := dq_configure_queue.dead_letter_queue;
    v_given.archive := dq_configure_queue.archive;
    v_given.retention := dq_configure_queue.retention;
    v_given.notify := dq_configure_queue.notify;
    v_given.max_payload_bytes := dq_configure_queue.max_payload_bytes;
    v_given.max_in_flight := dq_configure_queue.max_in_flight;
    v_given.rate_limit := dq_configure_queue.rate_limit;
    v_given.rate_period := dq_configure_queue.rate_period;
    v_error := dq__configure_error(v_given, v_clear);
    IF v_error IS NULL AND dq_configure_queue.dead_letter_queue IS NOT NULL THEN
        v_error := dq__dead_letter_cycle_error(dq_configure_queue.queue, dq_configure_queue.dead_letter_queue);
    END IF;
    IF v_error IS NULL THEN
        -- The queue's row, created with the defaults when missing, then locked (see Concurrency above).
        INSERT INTO dq_queues AS q (queue, updated_at) VALUES (dq_configure_queue.queue, dq__now())
        ON CONFLICT (queue) DO NOTHING;
        SELECT q.* INTO STRICT v_old FROM dq_queues q WHERE q.queue = dq_configure_queue.queue FOR NO KEY UPDATE;
        v_merge := dq__configure_merge(v_old, v_given, v_clear);
        v_error := v_merge.error;
    END IF;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    UPDATE dq_queues q
       SET max_deliveries = (v_merge.merged).max_deliveries, dead_letter_queue = (v_merge.merged).dead_letter_queue,
           archive = (v_merge.merged).archive, retention = (v_merge.merged).retention, notify = (v_merge.merged).notify,
           max_payload_bytes = (v_merge.merged).max_payload_bytes, max_in_flight = (v_merge.merged).max_in_flight,
           rate_limit = (v_merge.merged).rate_limit, rate_period = (v_merge.merged).rate_period, updated_at = dq__now()
     WHERE q.queue = dq_configure_queue.queue
    RETURNING q.* INTO v_row;
    IF v_row.rate_limit IS DISTINCT FROM v_old.rate_limit THEN
        PERFORM dq__rate_tokens_resize(dq_configure_queue.queue, v_row.rate_limit);
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
COMMENT ON FUNCTION dq_configure_queue(text, integer, text, boolean, interval, boolean, integer, integer, integer, interval, text[]) IS 'dq_configure_queue(queue, max_deliveries, dead_letter_queue, archive, retention, notify, max_payload_bytes, max_in_flight, rate_limit, rate_period, clear) -> dq_queues: sets the queue''s configuration: a setting left NULL keeps its value, one named in clear goes back to its default. Errors: 22004 NULL, 22023 a setting out of range or a bad combination, 22001 too long, 22008 now + retention or rate_period past 9999-12-30; nothing is written on error.';
REVOKE ALL ON FUNCTION dq_configure_queue(text, integer, text, boolean, interval, boolean, integer, integer, integer, interval, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_configure_queue(text, integer, text, boolean, interval, boolean, integer, integer, integer, interval, text[]) TO dq_admin;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
