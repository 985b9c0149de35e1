-- Recurring messages, part 3: the occurrence messages of one key prefix in a queue
-- (dq_install_tick, dq_uninstall_tick), offered through dq_offer_many's body (sql/100_offer.sql).
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;
-- ----------------------------------------------------------------------------- install_tick

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- Is `key` an occurrence key of key_prefix: '<key_prefix>/<hash without slash>/<epoch ms>'? A prefix
-- 'a' does not claim the keys of a prefix 'a/b' (their rest has two slashes).
-- No SET clause, so that PostgreSQL inlines it into the DELETEs of dq_install_tick and
-- dq_uninstall_tick (a SET clause makes every row a function call: 15 us each, 0.6 s of a tick
-- of 1,000 schedules). It calls only pg_catalog functions, which are found first whatever the
-- caller's search_path (PostgreSQL docs, 5.9.5 "The Schema Search Path").
CREATE OR REPLACE FUNCTION dq__cron_key_hash(key text, key_prefix text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN left($1, char_length($2) + 1) = $2 || '/'
                 AND substr($1, char_length($2) + 2) ~ '^[^/]+/-?[0-9]+$'
                THEN split_part(substr($1, char_length($2) + 2), '/', 1) END
$$;
COMMENT ON FUNCTION dq__cron_key_hash(text, text) IS 'Internal: the config hash of an occurrence key <key_prefix>/<hash>/<epoch ms>, or NULL when key is not one of key_prefix.';
REVOKE ALL ON FUNCTION dq__cron_key_hash(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Common argument checks of dq_install_tick and dq_uninstall_tick: the first error, NULL when none
-- (the caller raises it, so the error's context names the function the user called).
DROP FUNCTION IF EXISTS dq__cron_check_prefix(text, text, text, text, boolean);
CREATE OR REPLACE FUNCTION dq__cron_prefix_error(fn text, queue text, key_prefix text, config_hash text,
                                                 hash_required boolean)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(dq__name_error(fn, 'queue', queue, dq__limit_queue_chars()),
                    dq__name_error(fn, 'key_prefix', key_prefix, dq__limit_cron_name_chars()),
                    CASE WHEN config_hash IS NULL AND hash_required THEN dq__null_error(fn, 'config_hash') END,
                    CASE WHEN config_hash = '' OR char_length(config_hash) > dq__limit_config_hash_chars()
                         THEN dq__name_error(fn, 'config_hash', config_hash, dq__limit_config_hash_chars()) END,
                    CASE WHEN strpos(config_hash, '/') > 0
                         THEN dq__error('22023', format('%s: config_hash must not contain "/"', fn)) END)
$$;
COMMENT ON FUNCTION dq__cron_prefix_error(text, text, text, text, boolean) IS 'Internal: NULL, or the 22004/22023/22001 error for queue (<=100), key_prefix (<=100), config_hash (<=64, no "/").';
REVOKE ALL ON FUNCTION dq__cron_prefix_error(text, text, text, text, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The first error of dq_install_tick's arguments, NULL when none (the caller raises it). The
-- occurrences themselves (keys, payload limits) are checked with dq_offer_many's checks later.
CREATE OR REPLACE FUNCTION dq__install_tick_error(queue text, key_prefix text, config_hash text,
                                                  scheduled_ats timestamptz[], payloads bytea[], payload_type text,
                                                  can_update boolean)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    c_fn     CONSTANT text := 'dq_install_tick';
    v_n      integer := coalesce(cardinality(scheduled_ats), 0);
    v_error  jsonb;
    v_null   bigint;
    v_range  bigint;
    v_pay    bigint;
    v_dup    bigint;
BEGIN
    v_error := coalesce(
        dq__cron_prefix_error(c_fn, queue, key_prefix, config_hash, true),
        CASE WHEN scheduled_ats IS NULL THEN dq__null_error(c_fn, 'scheduled_ats') END,
        CASE WHEN payloads IS NULL THEN dq__null_error(c_fn, 'payloads') END,
        CASE WHEN can_update IS NULL THEN dq__null_error(c_fn, 'can_update') END,
        dq__name_error(c_fn, 'payload_type', coalesce(payload_type, 'bytes'), dq__limit_payload_type_chars()),
        CASE WHEN array_ndims(scheduled_ats) > 1 OR array_ndims(payloads) > 1
             THEN dq__error('22023', 'dq_install_tick: arrays must be one-dimensional') END,
        CASE WHEN v_n > dq__limit_offer_many_max_items()
             THEN dq__error('54000', format('dq_install_tick: scheduled_ats has %s elements, the limit is %s', v_n,
                                            dq__limit_offer_many_max_items())) END,
        CASE WHEN coalesce(cardinality(payloads), 0) <> v_n
             THEN dq__error('22023', format('dq_install_tick: payloads has %s elements, scheduled_ats has %s',
                                            coalesce(cardinality(payloads), 0), v_n)) END);
    IF v_error IS NOT NULL OR v_n = 0 THEN
        RETURN v_error;
    END IF;
    -- Element positions are 1-based ordinals. One key per millisecond: two times in one millisecond
    -- would be one key.
    SELECT min(u.i) FILTER (WHERE u.s IS NULL),
           min(u.i) FILTER (WHERE NOT (u.s BETWEEN dq__min_time() AND dq__max_time())),
           max(u.i) FILTER (WHERE u.c > 1)
      INTO v_null, v_range, v_dup
      FROM (SELECT u.s, u.i, count(*) OVER (PARTITION BY floor(extract(epoch FROM u.s) * 1000)) AS c
              FROM unnest(scheduled_ats) WITH ORDINALITY AS u(s, i)) u;
    SELECT min(u.i) INTO v_pay FROM unnest(payloads) WITH ORDINALITY AS u(p, i) WHERE u.p IS NULL;
    RETURN coalesce(
        CASE WHEN v_null IS NOT NULL THEN dq__null_error(c_fn, format('scheduled_ats[%s]', v_null)) END,
        CASE WHEN v_range IS NOT NULL
             THEN dq__time_error(c_fn, format('scheduled_ats[%s]', v_range),
                                 scheduled_ats[array_lower(scheduled_ats, 1) + v_range - 1]) END,
        CASE WHEN v_pay IS NOT NULL THEN dq__null_error(c_fn, format('payloads[%s]', v_pay)) END,
        CASE WHEN v_dup IS NOT NULL
             THEN dq__error('22023', format('dq_install_tick: scheduled_ats[%s] repeats an earlier time (keys have '
                                            'millisecond resolution)', v_dup)) END);
END;
$$;
COMMENT ON FUNCTION dq__install_tick_error(text, text, text, timestamptz[], bytea[], text, boolean) IS 'Internal: the first error of dq_install_tick''s arguments (22004, 22023, 22001, 22008, 54000), NULL when none.';
REVOKE ALL ON FUNCTION dq__install_tick_error(text, text, text, timestamptz[], bytea[], text, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Delete the future occurrences of key_prefix in queue: the messages this prefix created
-- (cron_prefix = key_prefix: ownership is recorded on each message, never guessed from its key, so
-- an ordinary message keyed like an occurrence is never touched) that are still future
-- (scheduled_at_initially after the transaction's dq__now()) and not in flight (no lock token), of
-- a hash other than except_hash (NULL: any) and equal to only_hash (NULL: any). A message in flight
-- is left to its consumer (deleting it would make its ack fail and its work invisible), and an
-- occurrence already due is left to be delivered: it has happened. Returns how many were deleted.
-- Installers of one (queue, key_prefix) are serialised by a transaction-level advisory lock, taken
-- here, so two installs with different hashes cannot both keep their messages: the second one's
-- DELETE (a new statement snapshot under READ COMMITTED) sees and removes the first one's. Keyed by
-- (queue, key_prefix) only, as in earlier releases (a deploy's old and new functions must exclude
-- each other); installs in two schemas share the key and only serialise.
CREATE OR REPLACE FUNCTION dq__cron_delete_future(queue text, key_prefix text, except_hash text, only_hash text)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_count    integer;
    v_related  dq_messages[];
    v_resolved integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('dq_install_tick' || chr(1) || dq__cron_delete_future.queue
                                                   || chr(1) || dq__cron_delete_future.key_prefix, 0));
    WITH gone AS (
    DELETE FROM dq_messages m
     WHERE m.queue = dq__cron_delete_future.queue
       AND m.key >= (dq__cron_delete_future.key_prefix || '/') COLLATE "C"  -- this prefix's keys only: a range of
       AND m.key < (dq__cron_delete_future.key_prefix || '0') COLLATE "C"   -- the (queue, key) index ('0' follows '/')
       AND m.dead_from_id IS NULL
       AND m.cron_prefix = dq__cron_delete_future.key_prefix
       AND m.scheduled_at > dq__now()
       AND m.scheduled_at_initially > dq__now()
       AND m.lock_token IS NULL
       AND dq__cron_key_hash(m.key, dq__cron_delete_future.key_prefix) IS NOT NULL
       AND (dq__cron_delete_future.except_hash IS NULL
            OR dq__cron_key_hash(m.key, dq__cron_delete_future.key_prefix) <> dq__cron_delete_future.except_hash)
       AND (dq__cron_delete_future.only_hash IS NULL
            OR dq__cron_key_hash(m.key, dq__cron_delete_future.key_prefix) = dq__cron_delete_future.only_hash)
    RETURNING m.has_children OR m.parents_pending > 0 AS related,
              CASE WHEN m.has_children OR m.parents_pending > 0 THEN m END AS r
    )
    SELECT count(*), array_agg(gone.r) FILTER (WHERE gone.related) INTO v_count, v_related FROM gone;
    -- An occurrence some message was offered after: its children follow their on_parent_failure as
    -- for a cancelled parent (sql/095_dependencies.sql).
    IF v_related IS NOT NULL THEN
        v_resolved := dq__resolve(v_related, 'cancelled', dq__clock());
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq__cron_delete_future(text, text, text, text) IS 'Internal: deletes the future, not-in-flight occurrence messages key_prefix created in queue, of a hash other than except_hash and equal to only_hash (NULL: any), under the prefix''s advisory lock; returns how many.';
REVOKE ALL ON FUNCTION dq__cron_delete_future(text, text, text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- dq_install_tick: the occurrences of one key prefix, installed in one transaction.
--
--  1. The future occurrences of other hashes go (dq__cron_delete_future, which also serialises the
--     installers of one (queue, key_prefix)).
--  2. Times still held by an in-flight message of another hash are not offered again under this
--     hash: one message per (prefix, instant), so a definition change never runs an instant twice.
--  3. The rest goes through dq_offer_many's body (its INSERT .. ON CONFLICT, its checks and its
--     wake-up NOTIFY rule), recording key_prefix as the owner, with can_update false: an existing
--     key is ignored, so installing again changes nothing.
CREATE OR REPLACE FUNCTION dq_install_tick(
    queue          text,
    key_prefix     text,
    config_hash    text,
    scheduled_ats  timestamptz[],
    payloads       bytea[],
    payload_type   text DEFAULT NULL,
    can_update     boolean DEFAULT false)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_type     text := coalesce(dq_install_tick.payload_type, 'bytes');
    v_held     timestamptz[];
    v_keys     text[];
    v_times    timestamptz[];
    v_pays     bytea[];
    v_deleted  integer;
    v_created  integer;
BEGIN
    v_error := dq__install_tick_error(dq_install_tick.queue, dq_install_tick.key_prefix, dq_install_tick.config_hash,
                                      dq_install_tick.scheduled_ats, dq_install_tick.payloads,
                                      dq_install_tick.payload_type, dq_install_tick.can_update);
    IF v_error IS NULL THEN
        v_deleted := dq__cron_delete_future(dq_install_tick.queue, dq_install_tick.key_prefix,
                                            dq_install_tick.config_hash, NULL);
        IF cardinality(dq_install_tick.scheduled_ats) = 0 THEN
            RETURN 0;
        END IF;
        SELECT array_agg(m.scheduled_at_initially) INTO v_held
          FROM dq_messages m
         WHERE m.lock_token IS NOT NULL
           AND m.queue = dq_install_tick.queue
           AND m.key >= (dq_install_tick.key_prefix || '/') COLLATE "C"
           AND m.key < (dq_install_tick.key_prefix || '0') COLLATE "C"
           AND m.dead_from_id IS NULL
           AND m.cron_prefix = dq_install_tick.key_prefix
           AND m.scheduled_at_initially = ANY (dq_install_tick.scheduled_ats)
           AND dq__cron_key_hash(m.key, dq_install_tick.key_prefix) <> dq_install_tick.config_hash;
        SELECT array_agg(dq_install_tick.key_prefix || '/' || dq_install_tick.config_hash || '/'
                         || floor(extract(epoch FROM u.s) * 1000)::bigint::text ORDER BY u.i),
               array_agg(u.s ORDER BY u.i), array_agg(u.p ORDER BY u.i)
          INTO v_keys, v_times, v_pays
          FROM unnest(dq_install_tick.scheduled_ats, dq_install_tick.payloads) WITH ORDINALITY AS u(s, p, i)
         WHERE v_held IS NULL OR NOT (u.s = ANY (v_held));
        IF v_keys IS NULL THEN
            RETURN 0;
        END IF;
        v_error := dq__offer_many_error('dq_install_tick', dq_install_tick.queue, v_keys, v_pays, v_times,
                                        dq_install_tick.can_update, array_fill(v_type, ARRAY[cardinality(v_keys)]));
    END IF;
    IF v_error ? 'hint' THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
    ELSIF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    SELECT o.created INTO v_created
      FROM dq__offer_many('dq_install_tick', dq_install_tick.queue, v_keys, v_pays, v_times, dq_install_tick.can_update,
                          array_fill(v_type, ARRAY[cardinality(v_keys)]), dq_install_tick.key_prefix, NULL, NULL, NULL,
                          NULL, false) o;
    RETURN v_created;
END;
$$;
COMMENT ON FUNCTION dq_install_tick(text, text, text, timestamptz[], bytea[], text, boolean) IS 'dq_install_tick(queue, key_prefix, config_hash, scheduled_ats, payloads, payload_type, can_update) -> integer: replaces the future occurrences of other hashes that key_prefix created in the queue by key_prefix/config_hash/<epoch ms>, one per time, and returns how many it created. Errors: 22004 NULL, 22023 invalid, 22001 too long, 22008 a time out of range, 54000 over 100000 times or a payload over the queue''s limit.';
REVOKE ALL ON FUNCTION dq_install_tick(text, text, text, timestamptz[], bytea[], text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_install_tick(text, text, text, timestamptz[], bytea[], text, boolean) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_uninstall_tick(queue text, key_prefix text, config_hash text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
BEGIN
    v_error := dq__cron_prefix_error('dq_uninstall_tick', dq_uninstall_tick.queue, dq_uninstall_tick.key_prefix,
                                  dq_uninstall_tick.config_hash, false);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN dq__cron_delete_future(dq_uninstall_tick.queue, dq_uninstall_tick.key_prefix, NULL,
                                  dq_uninstall_tick.config_hash);
END;
$$;
COMMENT ON FUNCTION dq_uninstall_tick(text, text, text) IS 'dq_uninstall_tick(queue text, key_prefix text, config_hash text default NULL = every hash) -> integer: deletes the future, not-in-flight occurrence messages that dq_install_tick created for key_prefix in the queue, and returns how many. Errors: 22004 NULL, 22023 empty or a / in config_hash, 22001 too long.';
REVOKE ALL ON FUNCTION dq_uninstall_tick(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_uninstall_tick(text, text, text) TO dq_admin;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
