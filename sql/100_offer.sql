-- Offering messages: dq_offer (bytea, jsonb and text payloads) and dq_offer_many.
-- Each is one INSERT .. ON CONFLICT (PostgreSQL manual, INSERT, "ON CONFLICT Clause").
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', pg_catalog.format('%I, pg_temp', (SELECT u.s FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1)), false) AS install_search_path;

-- dq_offer: insert, or replace when the key is present and something differs.
--
-- Concurrency (READ COMMITTED): INSERT .. ON CONFLICT DO UPDATE either inserts or locks the
-- conflicting row and updates it, atomically: concurrent offers of one new key produce exactly
-- one 'created'; the others wait for that row's lock and then see it (PostgreSQL docs, "INSERT
-- ... ON CONFLICT DO UPDATE guarantees an atomic INSERT or UPDATE outcome"). An update clears
-- lock_token, so a consumer still holding the old version cannot acknowledge away the new one
-- (its token no longer matches). An update makes the message an ordinary message of this queue:
-- its last error, the due and claim times of its last delivery and any schedule ownership are
-- cleared. Dead letters are never matched: the unique constraint (queue, key, dead_from_id)
-- NULLS NOT DISTINCT makes an offer conflict only with the queue's ordinary message of that key.
CREATE OR REPLACE FUNCTION dq_offer(
    queue         text,
    key           text,
    payload       bytea,
    scheduled_at  timestamptz DEFAULT now(),
    can_update    boolean DEFAULT true,
    payload_type  text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_type     text;
    v_inserted boolean;
    v_outcome  text;
    v_woken    boolean;
BEGIN
    dq_offer.queue := dq__check_name('dq_offer', 'queue', dq_offer.queue, 100);
    dq_offer.key := dq__check_name('dq_offer', 'key', dq_offer.key, 200);
    IF dq_offer.payload IS NULL THEN
        PERFORM dq__raise_null('dq_offer', 'payload');
    END IF;
    IF dq_offer.scheduled_at IS NULL OR NOT (dq_offer.scheduled_at BETWEEN dq__min_time() AND dq__max_time()) THEN
        PERFORM dq__raise_bad_time('dq_offer', 'scheduled_at', dq_offer.scheduled_at);
    END IF;
    -- No queue's limit is below dq__payload_limit_floor(): a smaller payload needs no configuration read.
    IF octet_length(dq_offer.payload) > dq__payload_limit_floor() THEN
        PERFORM dq__check_payload_size('dq_offer', 'payload', dq_offer.queue, octet_length(dq_offer.payload));
    END IF;
    IF dq_offer.can_update IS NULL THEN
        PERFORM dq__raise_null('dq_offer', 'can_update');
    END IF;
    v_type := dq__check_name('dq_offer', 'payload_type', coalesce(dq_offer.payload_type, 'bytes'), 100);

    IF dq_offer.can_update THEN
        INSERT INTO dq_messages AS m
               (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at)
        VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_type,
                dq_offer.scheduled_at, dq_offer.scheduled_at, now())
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO UPDATE
           SET payload = EXCLUDED.payload,
               payload_type = EXCLUDED.payload_type,
               scheduled_at = EXCLUDED.scheduled_at,
               scheduled_at_initially = EXCLUDED.scheduled_at_initially,
               created_at = EXCLUDED.created_at,
               delivery_count = 0,
               lock_token = NULL,
               last_error = NULL, last_error_at = NULL, due_at = NULL, claimed_at = NULL,
               cron_prefix = NULL
         WHERE m.payload IS DISTINCT FROM EXCLUDED.payload
            OR m.payload_type IS DISTINCT FROM EXCLUDED.payload_type
            OR m.scheduled_at_initially IS DISTINCT FROM EXCLUDED.scheduled_at_initially
        RETURNING (m.xmax = 0) INTO v_inserted;
    ELSE
        INSERT INTO dq_messages AS m
               (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at)
        VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_type,
                dq_offer.scheduled_at, dq_offer.scheduled_at, now())
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO NOTHING
        RETURNING true INTO v_inserted;
    END IF;

    IF v_inserted IS NULL THEN
        RETURN 'ignored';
    END IF;
    v_outcome := CASE WHEN v_inserted THEN 'created' ELSE 'updated' END;
    -- Wake a waiter that would otherwise sleep past this message's due time (sql/010_wait.sql).
    v_woken := dq__wake(dq_offer.queue, dq_offer.scheduled_at);
    RETURN v_outcome;
END;
$$;
COMMENT ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text) IS
  'dq_offer(queue text <=100 chars, key text <=200 chars, payload bytea <= the queue''s max_payload_bytes (default 1 MiB), scheduled_at timestamptz in 0001-01-02 .. 9999-12-30 UTC default now(), can_update boolean default true, payload_type text default ''bytes'') -> text: ''created'' (new key), ''updated'' (key present, can_update, and payload, payload_type or scheduled_at differ: replaced, delivery_count reset, lock and last error cleared) or ''ignored''. Dead letters in the queue are never matched. Errors: 22004 NULL argument, 22023 empty queue/key, 22001 queue/key too long, 22008 scheduled_at out of range, 54000 payload over the limit; nothing is written on error.';
REVOKE ALL ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text) TO dq_producer;

CREATE OR REPLACE FUNCTION dq_offer(
    queue         text,
    key           text,
    payload       jsonb,
    scheduled_at  timestamptz DEFAULT now(),
    can_update    boolean DEFAULT true,
    payload_type  text DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT dq_offer($1, $2, convert_to($3::text, 'UTF8'), $4, $5, coalesce($6, 'json')) $$;
COMMENT ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text) IS
  'dq_offer with a jsonb payload: stored as its UTF-8 text, payload_type ''json'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text) TO dq_producer;

CREATE OR REPLACE FUNCTION dq_offer(
    queue         text,
    key           text,
    payload       text,
    scheduled_at  timestamptz DEFAULT now(),
    can_update    boolean DEFAULT true,
    payload_type  text DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT dq_offer($1, $2, convert_to($3, 'UTF8'), $4, $5, coalesce($6, 'text')) $$;
COMMENT ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text) IS
  'dq_offer with a text payload (also what an untyped literal resolves to): stored as UTF-8, payload_type ''text'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text) TO dq_producer;


-- dq_offer_many: dq_offer's semantics for each element, set-based: one validation query and
-- one INSERT .. ON CONFLICT for the whole batch; element positions in errors are 1-based.
-- dq__offer_many is the body; fn is the public function its errors name, cron_prefix the owner
-- recorded on the rows it writes (dq_install_tick's key_prefix; NULL for dq_offer_many).
--
-- Concurrency: as dq_offer, per row. Rows are inserted in bytewise key order (COLLATE "C", the
-- key column's collation, whatever the database's), as dead-lettering and redrive insert theirs, so
-- two statements that overlap take their row locks in the same order and do not deadlock.
CREATE OR REPLACE FUNCTION dq__offer_many(
    fn             text,
    queue          text,
    keys           text[],
    payloads       bytea[],
    scheduled_ats  timestamptz[],
    can_update     boolean,
    payload_types  text[],
    cron_prefix    text)
RETURNS TABLE (key text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n          integer := coalesce(cardinality(dq__offer_many.keys), 0);
    v_now        timestamptz := now();
    v_bad_key    bigint;
    v_bad_pay    bigint;
    v_bad_sched  bigint;
    v_bad_type   bigint;
    v_distinct   bigint;
    v_dup        text;
    v_value      text;
    v_keys       text[];
    v_outcomes   text[];
    v_changed_at timestamptz;
    v_bad_time   bigint;
    v_big        bigint;
    v_big_len    integer;
    v_limit      integer;
    v_woken      boolean;
BEGIN
    dq__offer_many.queue := dq__check_name(fn, 'queue', dq__offer_many.queue, 100);
    IF dq__offer_many.keys IS NULL THEN
        PERFORM dq__raise_null(fn, 'keys');
    END IF;
    IF dq__offer_many.payloads IS NULL THEN
        PERFORM dq__raise_null(fn, 'payloads');
    END IF;
    IF dq__offer_many.can_update IS NULL THEN
        PERFORM dq__raise_null(fn, 'can_update');
    END IF;
    IF array_ndims(dq__offer_many.keys) > 1 OR array_ndims(dq__offer_many.payloads) > 1
       OR array_ndims(dq__offer_many.scheduled_ats) > 1 OR array_ndims(dq__offer_many.payload_types) > 1 THEN
        RAISE EXCEPTION '%: arrays must be one-dimensional', fn USING ERRCODE = '22023';
    END IF;
    IF v_n > 100000 THEN
        RAISE EXCEPTION '%: keys has % elements, the limit is 100000', fn, v_n USING ERRCODE = '54000';
    END IF;
    IF coalesce(cardinality(dq__offer_many.payloads), 0) <> v_n THEN
        RAISE EXCEPTION '%: payloads has % elements, keys has %', fn,
            coalesce(cardinality(dq__offer_many.payloads), 0), v_n USING ERRCODE = '22023';
    END IF;
    IF dq__offer_many.scheduled_ats IS NOT NULL AND cardinality(dq__offer_many.scheduled_ats) <> v_n THEN
        RAISE EXCEPTION '%: scheduled_ats has % elements, keys has %', fn,
            cardinality(dq__offer_many.scheduled_ats), v_n USING ERRCODE = '22023';
    END IF;
    IF dq__offer_many.payload_types IS NOT NULL AND cardinality(dq__offer_many.payload_types) <> v_n THEN
        RAISE EXCEPTION '%: payload_types has % elements, keys has %', fn,
            cardinality(dq__offer_many.payload_types), v_n USING ERRCODE = '22023';
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;

    -- One pass over the input for every element check.
    SELECT min(u.i) FILTER (WHERE u.k IS NULL OR u.k = '' OR char_length(u.k) > 200),
           min(u.i) FILTER (WHERE u.p IS NULL),
           min(u.i) FILTER (WHERE dq__offer_many.scheduled_ats IS NOT NULL AND u.s IS NULL),
           min(u.i) FILTER (WHERE u.t = '' OR char_length(u.t) > 100),
           count(DISTINCT u.k),
           min(u.i) FILTER (WHERE NOT (u.s BETWEEN dq__min_time() AND dq__max_time())),
           min(u.i) FILTER (WHERE octet_length(u.p) > dq__payload_limit_floor())
      INTO v_bad_key, v_bad_pay, v_bad_sched, v_bad_type, v_distinct, v_bad_time, v_big
      FROM unnest(dq__offer_many.keys, dq__offer_many.payloads,
                  dq__offer_many.scheduled_ats, dq__offer_many.payload_types)
           WITH ORDINALITY AS u(k, p, s, t, i);

    -- Positions are 1-based ordinals (whatever the arrays' lower bounds); values are read by ordinal.
    IF v_bad_key IS NOT NULL THEN
        SELECT u.k INTO v_value FROM unnest(dq__offer_many.keys) WITH ORDINALITY AS u(k, i) WHERE u.i = v_bad_key;
        PERFORM dq__raise_bad_name(fn, format('keys[%s]', v_bad_key), v_value, 200);
    END IF;
    IF v_bad_pay IS NOT NULL THEN
        PERFORM dq__raise_null(fn, format('payloads[%s]', v_bad_pay));
    END IF;
    IF v_bad_sched IS NOT NULL THEN
        PERFORM dq__raise_null(fn, format('scheduled_ats[%s]', v_bad_sched));
    END IF;
    IF v_bad_time IS NOT NULL THEN
        PERFORM dq__raise_bad_time(fn, format('scheduled_ats[%s]', v_bad_time),
                                   dq__offer_many.scheduled_ats[array_lower(dq__offer_many.scheduled_ats, 1) + v_bad_time - 1]);
    END IF;
    -- Payloads over the floor of every queue's limit: compare with this queue's limit, naming the
    -- first element that is over it.
    IF v_big IS NOT NULL THEN
        v_limit := dq__max_payload_bytes(dq__offer_many.queue);
        SELECT u.i, octet_length(u.p) INTO v_big, v_big_len
          FROM unnest(dq__offer_many.payloads) WITH ORDINALITY AS u(p, i)
         WHERE octet_length(u.p) > v_limit
         ORDER BY u.i LIMIT 1;
        IF FOUND THEN
            PERFORM dq__raise_payload_too_large(fn, format('payloads[%s]', v_big), dq__offer_many.queue, v_big_len, v_limit);
        END IF;
    END IF;
    IF v_bad_type IS NOT NULL THEN
        SELECT u.t INTO v_value FROM unnest(dq__offer_many.payload_types) WITH ORDINALITY AS u(t, i)
         WHERE u.i = v_bad_type;
        PERFORM dq__raise_bad_name(fn, format('payload_types[%s]', v_bad_type), v_value, 100);
    END IF;
    IF v_distinct <> v_n THEN
        SELECT u.k INTO v_dup FROM unnest(dq__offer_many.keys) AS u(k)
         GROUP BY u.k HAVING count(*) > 1 ORDER BY u.k LIMIT 1;
        RAISE EXCEPTION '%: key "%" appears more than once in keys', fn, v_dup
            USING ERRCODE = '22023';
    END IF;

    IF dq__offer_many.can_update THEN
        WITH input AS (
            SELECT u.k, u.p, coalesce(u.s, v_now) AS s, coalesce(u.t, 'bytes') AS t, u.i
              FROM unnest(dq__offer_many.keys, dq__offer_many.payloads,
                          dq__offer_many.scheduled_ats, dq__offer_many.payload_types)
                   WITH ORDINALITY AS u(k, p, s, t, i)
        ), ins AS (
            INSERT INTO dq_messages AS m
                   (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, cron_prefix)
            SELECT dq__offer_many.queue, input.k, input.p, input.t, input.s, input.s, v_now, dq__offer_many.cron_prefix
              FROM input ORDER BY input.k COLLATE "C"
            ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO UPDATE
               SET payload = EXCLUDED.payload,
                   payload_type = EXCLUDED.payload_type,
                   scheduled_at = EXCLUDED.scheduled_at,
                   scheduled_at_initially = EXCLUDED.scheduled_at_initially,
                   created_at = EXCLUDED.created_at,
                   delivery_count = 0,
                   lock_token = NULL,
                   last_error = NULL, last_error_at = NULL, due_at = NULL, claimed_at = NULL,
                   cron_prefix = EXCLUDED.cron_prefix
             WHERE m.payload IS DISTINCT FROM EXCLUDED.payload
                OR m.payload_type IS DISTINCT FROM EXCLUDED.payload_type
                OR m.scheduled_at_initially IS DISTINCT FROM EXCLUDED.scheduled_at_initially
            RETURNING m.key AS k, (m.xmax = 0) AS inserted, m.scheduled_at AS s
        )
        SELECT array_agg(input.k ORDER BY input.i),
               array_agg(CASE WHEN ins.k IS NULL THEN 'ignored' WHEN ins.inserted THEN 'created' ELSE 'updated' END
                         ORDER BY input.i),
               min(ins.s)
          INTO v_keys, v_outcomes, v_changed_at
          FROM input LEFT JOIN ins ON ins.k = input.k;
    ELSE
        WITH input AS (
            SELECT u.k, u.p, coalesce(u.s, v_now) AS s, coalesce(u.t, 'bytes') AS t, u.i
              FROM unnest(dq__offer_many.keys, dq__offer_many.payloads,
                          dq__offer_many.scheduled_ats, dq__offer_many.payload_types)
                   WITH ORDINALITY AS u(k, p, s, t, i)
        ), ins AS (
            INSERT INTO dq_messages AS m
                   (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, cron_prefix)
            SELECT dq__offer_many.queue, input.k, input.p, input.t, input.s, input.s, v_now, dq__offer_many.cron_prefix
              FROM input ORDER BY input.k COLLATE "C"
            ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO NOTHING
            RETURNING m.key AS k, m.scheduled_at AS s
        )
        SELECT array_agg(input.k ORDER BY input.i),
               array_agg(CASE WHEN ins.k IS NULL THEN 'ignored' ELSE 'created' END ORDER BY input.i),
               min(ins.s)
          INTO v_keys, v_outcomes, v_changed_at
          FROM input LEFT JOIN ins ON ins.k = input.k;
    END IF;

    -- Wake a waiter that would sleep past the earliest created/updated message (sql/010_wait.sql);
    -- v_changed_at is NULL when every element was ignored.
    v_woken := dq__wake(dq__offer_many.queue, v_changed_at);
    RETURN QUERY SELECT r.k, r.o FROM unnest(v_keys, v_outcomes) AS r(k, o);
END;
$$;
COMMENT ON FUNCTION dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text) IS
  'Internal: the body of dq_offer_many (fn: the public function named in errors); cron_prefix is recorded as the owner of the rows it creates or updates (dq_install_tick).';
REVOKE ALL ON FUNCTION dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

CREATE OR REPLACE FUNCTION dq_offer_many(
    queue          text,
    keys           text[],
    payloads       bytea[],
    scheduled_ats  timestamptz[] DEFAULT NULL,
    can_update     boolean DEFAULT true,
    payload_types  text[] DEFAULT NULL)
RETURNS TABLE (key text, outcome text)
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT o.key, o.outcome FROM dq__offer_many('dq_offer_many', $1, $2, $3, $4, $5, $6, NULL) AS o $$;
COMMENT ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[]) IS
  'dq_offer_many(queue text, keys text[], payloads bytea[] each <= the queue''s max_payload_bytes (default 1 MiB), scheduled_ats timestamptz[] in 0001-01-02 .. 9999-12-30 UTC, default NULL = now for all, can_update boolean default true, payload_types text[] default NULL = ''bytes'') -> TABLE(key text, outcome text) in input order, outcome as dq_offer. Set-based (one INSERT .. ON CONFLICT, rows in bytewise key order). Errors: 22004 NULL array or element, 22023 unequal lengths or a repeated key, 22001 key too long, 22008 a scheduled_ats element out of range, 54000 over 100000 elements or a payload over the limit; nothing is written on error.';
REVOKE ALL ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[]) TO dq_producer;

-- Payload limits. A queue's limit is dq_queues.max_payload_bytes, or 1 MiB when it sets none; no
-- queue may set one below 1 KiB (SQS's MaximumMessageSize has the same floor), so the offers read
-- the configuration only for payloads over 1 KiB. The constants are inlined (SQL, IMMUTABLE, no SET).
CREATE OR REPLACE FUNCTION dq__default_max_payload_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1048576 $$;
COMMENT ON FUNCTION dq__default_max_payload_bytes() IS 'Internal: the payload limit of a queue without max_payload_bytes (1 MiB).';
REVOKE ALL ON FUNCTION dq__default_max_payload_bytes() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__payload_limit_floor() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1024 $$;
COMMENT ON FUNCTION dq__payload_limit_floor() IS 'Internal: the smallest max_payload_bytes a queue may have (1 KiB).';
REVOKE ALL ON FUNCTION dq__payload_limit_floor() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The payload limit of a queue, in bytes.
CREATE OR REPLACE FUNCTION dq__max_payload_bytes(queue text)
RETURNS integer
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT coalesce((SELECT q.max_payload_bytes FROM dq_queues q WHERE q.queue = $1), dq__default_max_payload_bytes())
$$;
COMMENT ON FUNCTION dq__max_payload_bytes(text) IS 'Internal: the payload limit of a queue (max_payload_bytes, default 1 MiB).';
REVOKE ALL ON FUNCTION dq__max_payload_bytes(text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- 54000 naming the payload (param), its size and the queue's limit, all in bytes.
CREATE OR REPLACE FUNCTION dq__raise_payload_too_large(fn text, param text, queue text, size integer, max_bytes integer)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION '%: % is % bytes, the limit of queue % is % bytes', fn, param, size, queue, max_bytes
        USING ERRCODE = '54000',
              HINT = 'Store large data elsewhere and offer a reference, or raise the limit with dq_configure_queue(queue, max_payload_bytes => ...).';
END;
$$;
COMMENT ON FUNCTION dq__raise_payload_too_large(text, text, text, integer, integer) IS
  'Internal: raises 54000 program_limit_exceeded for a payload over its queue''s limit.';
REVOKE ALL ON FUNCTION dq__raise_payload_too_large(text, text, text, integer, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- 54000 when size (bytes) is over the queue's limit. Called only for payloads over the floor.
CREATE OR REPLACE FUNCTION dq__check_payload_size(fn text, param text, queue text, size integer)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_limit integer := dq__max_payload_bytes(queue);
BEGIN
    IF size > v_limit THEN
        PERFORM dq__raise_payload_too_large(fn, param, queue, size, v_limit);
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__check_payload_size(text, text, text, integer) IS
  'Internal: raises 54000 program_limit_exceeded when a payload of size bytes is over the queue''s max_payload_bytes (default 1 MiB).';
REVOKE ALL ON FUNCTION dq__check_payload_size(text, text, text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
