-- Offering messages: dq_offer (bytea, jsonb and text payloads) and dq_offer_many.
-- Each is one INSERT .. ON CONFLICT (PostgreSQL manual, INSERT, "ON CONFLICT Clause").
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- The signatures of 0.4 and earlier (without priority, message_group, expires_at and headers) are
-- dropped and the new ones created in this same transaction (the installer applies sql/ in one),
-- so there is no moment without a dq_offer, and calls of the old forms resolve to the new functions.
DROP FUNCTION IF EXISTS dq_offer(text, text, bytea, timestamptz, boolean, text);
DROP FUNCTION IF EXISTS dq_offer(text, text, jsonb, timestamptz, boolean, text);
DROP FUNCTION IF EXISTS dq_offer(text, text, text, timestamptz, boolean, text);
DROP FUNCTION IF EXISTS dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[]);
DROP FUNCTION IF EXISTS dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text);

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- Headers: a JSON object of at most 8 KiB (its text form, in bytes), for metadata such as trace
-- context (W3C traceparent). NULL when valid (or NULL); else 22023 for another JSON value, 54000
-- beyond the limit.
CREATE OR REPLACE FUNCTION dq__headers_error(fn text, param text, value jsonb)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN jsonb_typeof(value) <> 'object'
                THEN dq__error('22023', format('%s: %s is a JSON %s, it must be a JSON object', fn, param, jsonb_typeof(value)))
                WHEN octet_length(value::text) > 8192
                THEN dq__error('54000', format('%s: %s is %s bytes, the limit is 8192', fn, param, octet_length(value::text))) END
$$;
COMMENT ON FUNCTION dq__headers_error(text, text, jsonb) IS
  'Internal: NULL for NULL or a JSON object of at most 8192 bytes; else the 22023 (not a JSON object) or 54000 (over 8192 bytes) error naming the parameter.';
REVOKE ALL ON FUNCTION dq__headers_error(text, text, jsonb) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The checks of the per-message controls, shared by dq_offer and dq__offer_many: priority in
-- -32768..32767 (22004 NULL, 22023 outside), message_group NULL or 1..200 characters (22023 empty,
-- 22001 longer), expires_at NULL or in the stored range (22008) and after scheduled_at (22023),
-- headers NULL or a JSON object of at most 8192 bytes (22023, 54000). suffix is appended to
-- each parameter name in errors ('' or '[i]' for an element of dq_offer_many's arrays). NULL when
-- every control is valid, else the first error.
CREATE OR REPLACE FUNCTION dq__controls_error(fn text, suffix text, priority integer, message_group text,
                                              scheduled_at timestamptz, expires_at timestamptz, headers jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_param text := CASE WHEN suffix = '' THEN 'expires_at' ELSE 'expires_ats' || suffix END;
BEGIN
    RETURN coalesce(
        dq__range_error(fn, CASE WHEN suffix = '' THEN 'priority' ELSE 'priorities' || suffix END, priority, -32768, 32767),
        CASE WHEN message_group IS NOT NULL
             THEN dq__name_error(fn, CASE WHEN suffix = '' THEN 'message_group' ELSE 'message_groups' || suffix END,
                                 message_group, 200) END,
        CASE WHEN expires_at IS NOT NULL THEN dq__time_error(fn, v_param, expires_at) END,
        CASE WHEN expires_at <= scheduled_at
             THEN dq__error('22023', format('%s: %s is %s, it must be after scheduled_at (%s)', fn, v_param, expires_at,
                                            scheduled_at)) END,
        dq__headers_error(fn, CASE WHEN suffix = '' THEN 'headers' ELSE 'headers' || suffix END, headers));
END;
$$;
COMMENT ON FUNCTION dq__controls_error(text, text, integer, text, timestamptz, timestamptz, jsonb) IS
  'Internal: NULL when priority, message_group, expires_at and headers of an offer are valid; else the first error (22004, 22023, 22001, 22008, 54000 naming the parameter).';
REVOKE ALL ON FUNCTION dq__controls_error(text, text, integer, text, timestamptz, timestamptz, jsonb) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

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
-- A grouped message (message_group) is inserted or updated first, then its group is settled
-- (sql/020_groups.sql), and the group it left when an update moved it out of the group it headed.
CREATE OR REPLACE FUNCTION dq_offer(
    queue          text,
    key            text,
    payload        bytea,
    scheduled_at   timestamptz DEFAULT dq_now(),
    can_update     boolean DEFAULT true,
    payload_type   text DEFAULT NULL,
    priority       integer DEFAULT 0,
    message_group  text DEFAULT NULL,
    expires_at     timestamptz DEFAULT NULL,
    headers        jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_type     text;
    v_inserted boolean;
    v_id       bigint;
    v_outcome  text;
    v_woken    boolean;
    v_left     text;
    v_settled  integer;
BEGIN
    v_error := coalesce(dq__name_error('dq_offer', 'queue', dq_offer.queue, 100),
                        dq__name_error('dq_offer', 'key', dq_offer.key, 200));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    IF dq_offer.payload IS NULL THEN
        v_error := dq__null_error('dq_offer', 'payload');
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    IF dq_offer.scheduled_at IS NULL OR NOT (dq_offer.scheduled_at BETWEEN dq__min_time() AND dq__max_time()) THEN
        v_error := dq__time_error('dq_offer', 'scheduled_at', dq_offer.scheduled_at);
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    -- No queue's limit is below dq__payload_limit_floor(): a smaller payload needs no configuration read.
    IF octet_length(dq_offer.payload) > dq__payload_limit_floor() THEN
        v_error := dq__payload_size_error('dq_offer', 'payload', dq_offer.queue, octet_length(dq_offer.payload));
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
        END IF;
    END IF;
    IF dq_offer.can_update IS NULL THEN
        v_error := dq__null_error('dq_offer', 'can_update');
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_error := dq__name_error('dq_offer', 'payload_type', coalesce(dq_offer.payload_type, 'bytes'), 100);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_type := coalesce(dq_offer.payload_type, 'bytes');
    -- The controls are checked only when one is set (the common offer sets none).
    IF dq_offer.priority IS DISTINCT FROM 0 OR dq_offer.message_group IS NOT NULL
       OR dq_offer.expires_at IS NOT NULL OR dq_offer.headers IS NOT NULL THEN
        v_error := dq__controls_error('dq_offer', '', dq_offer.priority, dq_offer.message_group,
                                      dq_offer.scheduled_at, dq_offer.expires_at, dq_offer.headers);
        IF v_error IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
        END IF;
    END IF;

    IF dq_offer.can_update THEN
        INSERT INTO dq_messages AS m
               (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
                priority, message_group, expires_at, headers)
        VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_type,
                dq_offer.scheduled_at, dq_offer.scheduled_at, dq__now(),
                dq_offer.priority, dq_offer.message_group, dq_offer.expires_at, dq_offer.headers)
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO UPDATE
           SET payload = EXCLUDED.payload,
               payload_type = EXCLUDED.payload_type,
               scheduled_at = EXCLUDED.scheduled_at,
               scheduled_at_initially = EXCLUDED.scheduled_at_initially,
               created_at = EXCLUDED.created_at,
               delivery_count = 0,
               lock_token = NULL,
               last_error = NULL, last_error_at = NULL, due_at = NULL, claimed_at = NULL,
               cron_prefix = NULL,
               priority = EXCLUDED.priority, message_group = EXCLUDED.message_group,
               expires_at = EXCLUDED.expires_at, headers = EXCLUDED.headers
         WHERE m.payload IS DISTINCT FROM EXCLUDED.payload
            OR m.payload_type IS DISTINCT FROM EXCLUDED.payload_type
            OR m.scheduled_at_initially IS DISTINCT FROM EXCLUDED.scheduled_at_initially
            OR m.priority IS DISTINCT FROM EXCLUDED.priority
            OR m.message_group IS DISTINCT FROM EXCLUDED.message_group
            OR m.expires_at IS DISTINCT FROM EXCLUDED.expires_at
            OR m.headers IS DISTINCT FROM EXCLUDED.headers
        RETURNING (m.xmax = 0), m.id INTO v_inserted, v_id;
    ELSE
        INSERT INTO dq_messages AS m
               (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
                priority, message_group, expires_at, headers)
        VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_type,
                dq_offer.scheduled_at, dq_offer.scheduled_at, dq__now(),
                dq_offer.priority, dq_offer.message_group, dq_offer.expires_at, dq_offer.headers)
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO NOTHING
        RETURNING true, m.id INTO v_inserted, v_id;
    END IF;

    IF v_inserted IS NULL THEN
        RETURN 'ignored';
    END IF;
    v_outcome := CASE WHEN v_inserted THEN 'created' ELSE 'updated' END;
    IF NOT v_inserted THEN
        -- An update may have moved the message out of a group it headed: that group is settled too.
        SELECT g.message_group INTO v_left FROM dq_groups g
         WHERE g.head_id = v_id AND g.queue = dq_offer.queue AND g.message_group IS DISTINCT FROM dq_offer.message_group;
    END IF;
    IF dq_offer.message_group IS NOT NULL OR v_left IS NOT NULL THEN
        -- Settling wakes waiters when the head changed (sql/020_groups.sql).
        v_settled := dq__settle_groups(ARRAY[dq_offer.queue, dq_offer.queue], ARRAY[dq_offer.message_group, v_left],
                                       ARRAY[dq_offer.scheduled_at, NULL]);
    END IF;
    IF dq_offer.message_group IS NULL THEN
        -- Wake a waiter that would otherwise sleep past this message's due time (sql/010_wait.sql).
        v_woken := dq__wake(dq_offer.queue, dq_offer.scheduled_at);
    END IF;
    RETURN v_outcome;
END;
$$;
COMMENT ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text, integer, text, timestamptz, jsonb) IS
  'dq_offer(queue text <=100 chars, key text <=200 chars, payload bytea <= the queue''s max_payload_bytes (default 1 MiB), scheduled_at timestamptz in 0001-01-02 .. 9999-12-30 UTC default dq_now(), can_update boolean default true, payload_type text default ''bytes'', priority integer -32768..32767 default 0 (higher first among due messages), message_group text <=200 chars default NULL (FIFO group: its messages are delivered one at a time, in order), expires_at timestamptz default NULL (after scheduled_at; never delivered after it), headers jsonb object <= 8192 bytes default NULL) -> text: ''created'' (new key), ''updated'' (key present, can_update, and any of payload, payload_type, scheduled_at, priority, message_group, expires_at, headers differ: replaced, delivery_count reset, lock and last error cleared) or ''ignored''. Dead letters in the queue are never matched. Errors: 22004 NULL argument, 22023 empty queue/key/message_group, priority out of range, expires_at not after scheduled_at or headers not a JSON object, 22001 queue/key/message_group too long, 22008 scheduled_at or expires_at out of range, 54000 payload or headers over the limit; nothing is written on error. Source: message groups and message timers (SQS Developer Guide).';
REVOKE ALL ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text, integer, text, timestamptz, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text, integer, text, timestamptz, jsonb) TO dq_producer;

CREATE OR REPLACE FUNCTION dq_offer(
    queue          text,
    key            text,
    payload        jsonb,
    scheduled_at   timestamptz DEFAULT dq_now(),
    can_update     boolean DEFAULT true,
    payload_type   text DEFAULT NULL,
    priority       integer DEFAULT 0,
    message_group  text DEFAULT NULL,
    expires_at     timestamptz DEFAULT NULL,
    headers        jsonb DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT dq_offer($1, $2, convert_to($3::text, 'UTF8'), $4, $5, coalesce($6, 'json'), $7, $8, $9, $10) $$;
COMMENT ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text, integer, text, timestamptz, jsonb) IS
  'dq_offer with a jsonb payload: stored as its UTF-8 text, payload_type ''json'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text, integer, text, timestamptz, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text, integer, text, timestamptz, jsonb) TO dq_producer;

CREATE OR REPLACE FUNCTION dq_offer(
    queue          text,
    key            text,
    payload        text,
    scheduled_at   timestamptz DEFAULT dq_now(),
    can_update     boolean DEFAULT true,
    payload_type   text DEFAULT NULL,
    priority       integer DEFAULT 0,
    message_group  text DEFAULT NULL,
    expires_at     timestamptz DEFAULT NULL,
    headers        jsonb DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT dq_offer($1, $2, convert_to($3, 'UTF8'), $4, $5, coalesce($6, 'text'), $7, $8, $9, $10) $$;
COMMENT ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text, integer, text, timestamptz, jsonb) IS
  'dq_offer with a text payload (also what an untyped literal resolves to): stored as UTF-8, payload_type ''text'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text, integer, text, timestamptz, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text, integer, text, timestamptz, jsonb) TO dq_producer;


SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- The first error of a dq_offer_many call, NULL when there is none: every check of the input, in one
-- pass over the arrays (element positions are 1-based ordinals). The public function raises it, so
-- the error's context names only the function the user called. Reads the queue's payload limit
-- only for payloads over the floor of every queue's limit.
CREATE OR REPLACE FUNCTION dq__offer_many_error(
    fn              text,
    queue           text,
    keys            text[],
    payloads        bytea[],
    scheduled_ats   timestamptz[],
    can_update      boolean,
    payload_types   text[] DEFAULT NULL,
    priorities      integer[] DEFAULT NULL,
    message_groups  text[] DEFAULT NULL,
    expires_ats     timestamptz[] DEFAULT NULL,
    headers         jsonb[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error      jsonb;
    v_n          integer := coalesce(cardinality(dq__offer_many_error.keys), 0);
    v_now        timestamptz := dq__now();
    v_bad_key    bigint;
    v_bad_pay    bigint;
    v_bad_sched  bigint;
    v_bad_type   bigint;
    v_distinct   bigint;
    v_dup        text;
    v_value      text;
    v_bad_time   bigint;
    v_big        bigint;
    v_big_len    integer;
    v_limit      integer;
    v_controls   boolean;
    v_bad_ctl    bigint;
    r            record;
BEGIN
    v_error := dq__name_error(fn, 'queue', dq__offer_many_error.queue, 100);
    IF v_error IS NOT NULL THEN
        RETURN v_error;
    END IF;
    IF dq__offer_many_error.keys IS NULL THEN
        v_error := dq__null_error(fn, 'keys');
        RETURN v_error;
    END IF;
    IF dq__offer_many_error.payloads IS NULL THEN
        v_error := dq__null_error(fn, 'payloads');
        RETURN v_error;
    END IF;
    IF dq__offer_many_error.can_update IS NULL THEN
        v_error := dq__null_error(fn, 'can_update');
        RETURN v_error;
    END IF;
    IF array_ndims(dq__offer_many_error.keys) > 1 OR array_ndims(dq__offer_many_error.payloads) > 1
       OR array_ndims(dq__offer_many_error.scheduled_ats) > 1 OR array_ndims(dq__offer_many_error.payload_types) > 1
       OR array_ndims(dq__offer_many_error.priorities) > 1 OR array_ndims(dq__offer_many_error.message_groups) > 1
       OR array_ndims(dq__offer_many_error.expires_ats) > 1 OR array_ndims(dq__offer_many_error.headers) > 1 THEN
        RETURN dq__error('22023', format('%s: arrays must be one-dimensional', fn));
    END IF;
    IF v_n > 100000 THEN
        RETURN dq__error('54000', format('%s: keys has %s elements, the limit is 100000', fn, v_n));
    END IF;
    IF coalesce(cardinality(dq__offer_many_error.payloads), 0) <> v_n THEN
        RETURN dq__error('22023', format('%s: payloads has %s elements, keys has %s', fn,
            coalesce(cardinality(dq__offer_many_error.payloads), 0), v_n));
    END IF;
    FOR r IN SELECT * FROM (VALUES
            ('scheduled_ats', cardinality(dq__offer_many_error.scheduled_ats)),
            ('payload_types', cardinality(dq__offer_many_error.payload_types)),
            ('priorities', cardinality(dq__offer_many_error.priorities)),
            ('message_groups', cardinality(dq__offer_many_error.message_groups)),
            ('expires_ats', cardinality(dq__offer_many_error.expires_ats)),
            ('headers', cardinality(dq__offer_many_error.headers))) AS a(name, n)
             WHERE a.n IS NOT NULL AND a.n <> v_n LOOP
        RETURN dq__error('22023', format('%s: %s has %s elements, keys has %s', fn, r.name, r.n, v_n));
    END LOOP;
    IF v_n = 0 THEN
        RETURN NULL;
    END IF;
    v_controls := dq__offer_many_error.priorities IS NOT NULL OR dq__offer_many_error.message_groups IS NOT NULL
               OR dq__offer_many_error.expires_ats IS NOT NULL OR dq__offer_many_error.headers IS NOT NULL;

    -- One pass over the input for every element check.
    SELECT min(u.i) FILTER (WHERE u.k IS NULL OR u.k = '' OR char_length(u.k) > 200),
           min(u.i) FILTER (WHERE u.p IS NULL),
           min(u.i) FILTER (WHERE dq__offer_many_error.scheduled_ats IS NOT NULL AND u.s IS NULL),
           min(u.i) FILTER (WHERE u.t = '' OR char_length(u.t) > 100),
           count(DISTINCT u.k),
           min(u.i) FILTER (WHERE NOT (u.s BETWEEN dq__min_time() AND dq__max_time())),
           min(u.i) FILTER (WHERE octet_length(u.p) > dq__payload_limit_floor())
      INTO v_bad_key, v_bad_pay, v_bad_sched, v_bad_type, v_distinct, v_bad_time, v_big
      FROM unnest(dq__offer_many_error.keys, dq__offer_many_error.payloads,
                  dq__offer_many_error.scheduled_ats, dq__offer_many_error.payload_types)
           WITH ORDINALITY AS u(k, p, s, t, i);

    -- Positions are 1-based ordinals (whatever the arrays' lower bounds); values are read by ordinal.
    IF v_bad_key IS NOT NULL THEN
        SELECT u.k INTO v_value FROM unnest(dq__offer_many_error.keys) WITH ORDINALITY AS u(k, i) WHERE u.i = v_bad_key;
        v_error := dq__name_error(fn, format('keys[%s]', v_bad_key), v_value, 200);
        RETURN v_error;
    END IF;
    IF v_bad_pay IS NOT NULL THEN
        v_error := dq__null_error(fn, format('payloads[%s]', v_bad_pay));
        RETURN v_error;
    END IF;
    IF v_bad_sched IS NOT NULL THEN
        v_error := dq__null_error(fn, format('scheduled_ats[%s]', v_bad_sched));
        RETURN v_error;
    END IF;
    IF v_bad_time IS NOT NULL THEN
        v_error := dq__time_error(fn, format('scheduled_ats[%s]', v_bad_time),
                                   dq__offer_many_error.scheduled_ats[array_lower(dq__offer_many_error.scheduled_ats, 1) + v_bad_time - 1]);
        RETURN v_error;
    END IF;
    -- Payloads over the floor of every queue's limit: compare with this queue's limit, naming the
    -- first element that is over it.
    IF v_big IS NOT NULL THEN
        v_limit := dq__max_payload_bytes(dq__offer_many_error.queue);
        SELECT u.i, octet_length(u.p) INTO v_big, v_big_len
          FROM unnest(dq__offer_many_error.payloads) WITH ORDINALITY AS u(p, i)
         WHERE octet_length(u.p) > v_limit
         ORDER BY u.i LIMIT 1;
        IF FOUND THEN
            v_error := dq__payload_too_large_error(fn, format('payloads[%s]', v_big), dq__offer_many_error.queue, v_big_len, v_limit);
            RETURN v_error;
        END IF;
    END IF;
    IF v_bad_type IS NOT NULL THEN
        SELECT u.t INTO v_value FROM unnest(dq__offer_many_error.payload_types) WITH ORDINALITY AS u(t, i)
         WHERE u.i = v_bad_type;
        v_error := dq__name_error(fn, format('payload_types[%s]', v_bad_type), v_value, 100);
        RETURN v_error;
    END IF;
    IF v_controls THEN
        -- The first element whose controls are wrong is checked again by dq__controls_error, which
        -- describes its error.
        SELECT u.i INTO v_bad_ctl
          FROM unnest(dq__offer_many_error.keys, dq__offer_many_error.scheduled_ats, dq__offer_many_error.priorities,
                      dq__offer_many_error.message_groups, dq__offer_many_error.expires_ats, dq__offer_many_error.headers)
               WITH ORDINALITY AS u(k, s, p, g, e, h, i)
         WHERE (dq__offer_many_error.priorities IS NOT NULL AND (u.p IS NULL OR u.p NOT BETWEEN -32768 AND 32767))
            OR u.g = '' OR char_length(u.g) > 200
            OR NOT (u.e BETWEEN dq__min_time() AND dq__max_time()) OR u.e <= coalesce(u.s, v_now)
            OR jsonb_typeof(u.h) <> 'object' OR octet_length(u.h::text) > 8192
         ORDER BY u.i LIMIT 1;
        IF FOUND THEN
            v_error := dq__controls_error(fn, format('[%s]', v_bad_ctl),
                                       CASE WHEN dq__offer_many_error.priorities IS NULL THEN 0
                                            ELSE dq__offer_many_error.priorities[array_lower(dq__offer_many_error.priorities, 1) + v_bad_ctl - 1] END,
                                       dq__offer_many_error.message_groups[array_lower(dq__offer_many_error.message_groups, 1) + v_bad_ctl - 1],
                                       coalesce(dq__offer_many_error.scheduled_ats[array_lower(dq__offer_many_error.scheduled_ats, 1) + v_bad_ctl - 1], v_now),
                                       dq__offer_many_error.expires_ats[array_lower(dq__offer_many_error.expires_ats, 1) + v_bad_ctl - 1],
                                       dq__offer_many_error.headers[array_lower(dq__offer_many_error.headers, 1) + v_bad_ctl - 1]);
            RETURN v_error;
        END IF;
    END IF;
    IF v_distinct <> v_n THEN
        SELECT u.k INTO v_dup FROM unnest(dq__offer_many_error.keys) AS u(k)
         GROUP BY u.k HAVING count(*) > 1 ORDER BY u.k LIMIT 1;
        RETURN dq__error('22023', format('%s: key "%s" appears more than once in keys', fn, v_dup));
    END IF;

    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION dq__offer_many_error(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) IS
  'Internal: the first error of a dq_offer_many (or dq_install_tick, fn) input as {"sqlstate", "message"[, "hint"]}, NULL when the input is valid.';
REVOKE ALL ON FUNCTION dq__offer_many_error(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- dq_offer_many: dq_offer's semantics for each element, set-based: one validation query and
-- one INSERT .. ON CONFLICT for the whole batch; element positions in errors are 1-based.
-- dq__offer_many is the body, for input that dq__offer_many_error found valid (its callers check
-- first and raise); fn is the public function calling, cron_prefix the owner recorded on the rows
-- it writes (dq_install_tick's key_prefix; NULL for dq_offer_many).
--
-- Concurrency: as dq_offer, per row. Rows are inserted in bytewise key order (COLLATE "C", the
-- key column's collation, whatever the database's), as dead-lettering and redrive insert theirs, so
-- two statements that overlap take their row locks in the same order and do not deadlock. The
-- groups of grouped rows are settled after the insert, in (queue, message_group) order.
CREATE OR REPLACE FUNCTION dq__offer_many(
    fn              text,
    queue           text,
    keys            text[],
    payloads        bytea[],
    scheduled_ats   timestamptz[],
    can_update      boolean,
    payload_types   text[],
    cron_prefix     text,
    priorities      integer[] DEFAULT NULL,
    message_groups  text[] DEFAULT NULL,
    expires_ats     timestamptz[] DEFAULT NULL,
    headers         jsonb[] DEFAULT NULL)
RETURNS TABLE (key text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n          integer := coalesce(cardinality(dq__offer_many.keys), 0);
    v_now        timestamptz := dq__now();
    v_keys       text[];
    v_outcomes   text[];
    v_changed_at timestamptz;
    v_woken      boolean;
    v_groups     text[];
    v_group_dues timestamptz[];
    v_updated    bigint[];
    v_settled    integer;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;

    IF dq__offer_many.can_update THEN
        WITH input AS (
            SELECT u.k, u.p, coalesce(u.s, v_now) AS s, coalesce(u.t, 'bytes') AS t, u.i,
                   coalesce(u.pr, 0) AS pr, u.g, u.e, u.h
              FROM unnest(dq__offer_many.keys, dq__offer_many.payloads,
                          dq__offer_many.scheduled_ats, dq__offer_many.payload_types,
                          dq__offer_many.priorities, dq__offer_many.message_groups,
                          dq__offer_many.expires_ats, dq__offer_many.headers)
                   WITH ORDINALITY AS u(k, p, s, t, pr, g, e, h, i)
        ), ins AS (
            INSERT INTO dq_messages AS m
                   (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, cron_prefix,
                    priority, message_group, expires_at, headers)
            SELECT dq__offer_many.queue, input.k, input.p, input.t, input.s, input.s, v_now, dq__offer_many.cron_prefix,
                   input.pr, input.g, input.e, input.h
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
                   cron_prefix = EXCLUDED.cron_prefix,
                   priority = EXCLUDED.priority, message_group = EXCLUDED.message_group,
                   expires_at = EXCLUDED.expires_at, headers = EXCLUDED.headers
             WHERE m.payload IS DISTINCT FROM EXCLUDED.payload
                OR m.payload_type IS DISTINCT FROM EXCLUDED.payload_type
                OR m.scheduled_at_initially IS DISTINCT FROM EXCLUDED.scheduled_at_initially
                OR m.priority IS DISTINCT FROM EXCLUDED.priority
                OR m.message_group IS DISTINCT FROM EXCLUDED.message_group
                OR m.expires_at IS DISTINCT FROM EXCLUDED.expires_at
                OR m.headers IS DISTINCT FROM EXCLUDED.headers
            RETURNING m.key AS k, (m.xmax = 0) AS inserted, m.scheduled_at AS s, m.id, m.message_group AS g
        )
        SELECT array_agg(input.k ORDER BY input.i),
               array_agg(CASE WHEN ins.k IS NULL THEN 'ignored' WHEN ins.inserted THEN 'created' ELSE 'updated' END
                         ORDER BY input.i),
               min(ins.s) FILTER (WHERE ins.g IS NULL),
               array_agg(ins.g) FILTER (WHERE ins.g IS NOT NULL),
               array_agg(ins.s) FILTER (WHERE ins.g IS NOT NULL),
               array_agg(ins.id) FILTER (WHERE NOT ins.inserted)
          INTO v_keys, v_outcomes, v_changed_at, v_groups, v_group_dues, v_updated
          FROM input LEFT JOIN ins ON ins.k = input.k;
    ELSE
        WITH input AS (
            SELECT u.k, u.p, coalesce(u.s, v_now) AS s, coalesce(u.t, 'bytes') AS t, u.i,
                   coalesce(u.pr, 0) AS pr, u.g, u.e, u.h
              FROM unnest(dq__offer_many.keys, dq__offer_many.payloads,
                          dq__offer_many.scheduled_ats, dq__offer_many.payload_types,
                          dq__offer_many.priorities, dq__offer_many.message_groups,
                          dq__offer_many.expires_ats, dq__offer_many.headers)
                   WITH ORDINALITY AS u(k, p, s, t, pr, g, e, h, i)
        ), ins AS (
            INSERT INTO dq_messages AS m
                   (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, cron_prefix,
                    priority, message_group, expires_at, headers)
            SELECT dq__offer_many.queue, input.k, input.p, input.t, input.s, input.s, v_now, dq__offer_many.cron_prefix,
                   input.pr, input.g, input.e, input.h
              FROM input ORDER BY input.k COLLATE "C"
            ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO NOTHING
            RETURNING m.key AS k, m.scheduled_at AS s, m.message_group AS g
        )
        SELECT array_agg(input.k ORDER BY input.i),
               array_agg(CASE WHEN ins.k IS NULL THEN 'ignored' ELSE 'created' END ORDER BY input.i),
               min(ins.s) FILTER (WHERE ins.g IS NULL),
               array_agg(ins.g) FILTER (WHERE ins.g IS NOT NULL),
               array_agg(ins.s) FILTER (WHERE ins.g IS NOT NULL)
          INTO v_keys, v_outcomes, v_changed_at, v_groups, v_group_dues
          FROM input LEFT JOIN ins ON ins.k = input.k;
    END IF;

    -- Groups: those written to (due when their earliest written row is), and those that updated
    -- messages headed before the update moved them to another group (due now); each is settled once,
    -- in lock order (sql/020_groups.sql).
    IF v_updated IS NOT NULL THEN
        v_groups := v_groups || ARRAY(SELECT g.message_group FROM dq_groups g
                                       WHERE g.head_id = ANY (v_updated) AND g.queue = dq__offer_many.queue);
    END IF;
    IF v_groups IS NOT NULL THEN
        v_settled := dq__settle_groups(array_fill(dq__offer_many.queue, ARRAY[cardinality(v_groups)]), v_groups,
                                       v_group_dues);
    END IF;
    -- Wake a waiter that would sleep past the earliest created/updated ungrouped message
    -- (sql/010_wait.sql); v_changed_at is NULL when there is none.
    v_woken := dq__wake(dq__offer_many.queue, v_changed_at);
    RETURN QUERY SELECT r.k, r.o FROM unnest(v_keys, v_outcomes) AS r(k, o);
END;
$$;
COMMENT ON FUNCTION dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text, integer[], text[], timestamptz[], jsonb[]) IS
  'Internal: the body of dq_offer_many (fn: the public function named in errors); cron_prefix is recorded as the owner of the rows it creates or updates (dq_install_tick).';
REVOKE ALL ON FUNCTION dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text, integer[], text[], timestamptz[], jsonb[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

CREATE OR REPLACE FUNCTION dq_offer_many(
    queue           text,
    keys            text[],
    payloads        bytea[],
    scheduled_ats   timestamptz[] DEFAULT NULL,
    can_update      boolean DEFAULT true,
    payload_types   text[] DEFAULT NULL,
    priorities      integer[] DEFAULT NULL,
    message_groups  text[] DEFAULT NULL,
    expires_ats     timestamptz[] DEFAULT NULL,
    headers         jsonb[] DEFAULT NULL)
RETURNS TABLE (key text, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
BEGIN
    v_error := dq__offer_many_error('dq_offer_many', dq_offer_many.queue, dq_offer_many.keys, dq_offer_many.payloads,
                                    dq_offer_many.scheduled_ats, dq_offer_many.can_update, dq_offer_many.payload_types,
                                    dq_offer_many.priorities, dq_offer_many.message_groups, dq_offer_many.expires_ats,
                                    dq_offer_many.headers);
    IF v_error ? 'hint' THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
    ELSIF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY SELECT o.key, o.outcome
      FROM dq__offer_many('dq_offer_many', dq_offer_many.queue, dq_offer_many.keys, dq_offer_many.payloads,
                          dq_offer_many.scheduled_ats, dq_offer_many.can_update, dq_offer_many.payload_types, NULL,
                          dq_offer_many.priorities, dq_offer_many.message_groups, dq_offer_many.expires_ats,
                          dq_offer_many.headers) AS o;
END;
$$;
COMMENT ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) IS
  'dq_offer_many(queue text, keys text[], payloads bytea[] each <= the queue''s max_payload_bytes (default 1 MiB), scheduled_ats timestamptz[] in 0001-01-02 .. 9999-12-30 UTC, default NULL = now for all, can_update boolean default true, payload_types text[] default NULL = ''bytes'', priorities integer[] default NULL = 0, message_groups text[] default NULL = none, expires_ats timestamptz[] default NULL = none, headers jsonb[] default NULL = none) -> TABLE(key text, outcome text) in input order, outcome and element rules as dq_offer. Set-based (one INSERT .. ON CONFLICT, rows in bytewise key order). Errors: 22004 NULL array or element, 22023 unequal lengths, a repeated key or a bad control (as dq_offer), 22001 key or message group too long, 22008 a scheduled_ats or expires_ats element out of range, 54000 over 100000 elements or a payload or headers over the limit; errors name the element (keys[3]); nothing is written on error.';
REVOKE ALL ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) TO dq_producer;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
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

-- 54000 naming the payload (param), its size and the queue's limit, all in bytes, with a hint.
CREATE OR REPLACE FUNCTION dq__payload_too_large_error(fn text, param text, queue text, size integer, max_bytes integer)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT dq__error('54000', format('%s: %s is %s bytes, the limit of queue %s is %s bytes', fn, param, size, queue, max_bytes))
           || jsonb_build_object('hint', 'Store large data elsewhere and offer a reference, or raise the limit with dq_configure_queue(queue, max_payload_bytes => ...).')
$$;
COMMENT ON FUNCTION dq__payload_too_large_error(text, text, text, integer, integer) IS
  'Internal: the 54000 program_limit_exceeded error (with a hint) for a payload over its queue''s limit.';
REVOKE ALL ON FUNCTION dq__payload_too_large_error(text, text, text, integer, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- NULL when size (bytes) is within the queue's limit, else the 54000 error. Called only for
-- payloads over the floor (it reads the queue's configuration).
CREATE OR REPLACE FUNCTION dq__payload_size_error(fn text, param text, queue text, size integer)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_limit integer := dq__max_payload_bytes(queue);
BEGIN
    RETURN CASE WHEN size > v_limit THEN dq__payload_too_large_error(fn, param, queue, size, v_limit) END;
END;
$$;
COMMENT ON FUNCTION dq__payload_size_error(text, text, text, integer) IS
  'Internal: NULL when a payload of size bytes is within the queue''s max_payload_bytes (default 1 MiB), else the 54000 program_limit_exceeded error.';
REVOKE ALL ON FUNCTION dq__payload_size_error(text, text, text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
