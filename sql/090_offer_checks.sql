-- The checks of an offer: controls (priority, message group, expiry, headers), the payload limit
-- of a queue, and the whole input of dq_offer_many. Each returns the first error as jsonb (NULL
-- when valid) for the public function to raise (sql/005_checks.sql).
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

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
                WHEN octet_length(value::text) > dq__limit_headers_bytes()
                THEN dq__error('54000', format('%s: %s is %s bytes, the limit is %s', fn, param, octet_length(value::text),
                                               dq__limit_headers_bytes())) END
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
        dq__range_error(fn, CASE WHEN suffix = '' THEN 'priority' ELSE 'priorities' || suffix END, priority,
                        dq__limit_priority_min(), dq__limit_priority_max()),
        CASE WHEN message_group IS NOT NULL
             THEN dq__name_error(fn, CASE WHEN suffix = '' THEN 'message_group' ELSE 'message_groups' || suffix END,
                                 message_group, dq__limit_group_chars()) END,
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
    v_error := dq__name_error(fn, 'queue', dq__offer_many_error.queue, dq__limit_queue_chars());
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
    IF v_n > dq__limit_offer_many_max_items() THEN
        RETURN dq__error('54000', format('%s: keys has %s elements, the limit is %s', fn, v_n, dq__limit_offer_many_max_items()));
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
    SELECT min(u.i) FILTER (WHERE u.k IS NULL OR u.k = '' OR char_length(u.k) > dq__limit_key_chars()),
           min(u.i) FILTER (WHERE u.p IS NULL),
           min(u.i) FILTER (WHERE dq__offer_many_error.scheduled_ats IS NOT NULL AND u.s IS NULL),
           min(u.i) FILTER (WHERE u.t = '' OR char_length(u.t) > dq__limit_payload_type_chars()),
           count(DISTINCT u.k),
           min(u.i) FILTER (WHERE NOT (u.s BETWEEN dq__min_time() AND dq__max_time())),
           min(u.i) FILTER (WHERE octet_length(u.p) > dq__limit_payload_bytes_min())
      INTO v_bad_key, v_bad_pay, v_bad_sched, v_bad_type, v_distinct, v_bad_time, v_big
      FROM unnest(dq__offer_many_error.keys, dq__offer_many_error.payloads,
                  dq__offer_many_error.scheduled_ats, dq__offer_many_error.payload_types)
           WITH ORDINALITY AS u(k, p, s, t, i);

    -- Positions are 1-based ordinals (whatever the arrays' lower bounds); values are read by ordinal.
    IF v_bad_key IS NOT NULL THEN
        SELECT u.k INTO v_value FROM unnest(dq__offer_many_error.keys) WITH ORDINALITY AS u(k, i) WHERE u.i = v_bad_key;
        v_error := dq__name_error(fn, format('keys[%s]', v_bad_key), v_value, dq__limit_key_chars());
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
        v_error := dq__name_error(fn, format('payload_types[%s]', v_bad_type), v_value, dq__limit_payload_type_chars());
        RETURN v_error;
    END IF;
    IF v_controls THEN
        -- The first element whose controls are wrong is checked again by dq__controls_error, which
        -- describes its error.
        SELECT u.i INTO v_bad_ctl
          FROM unnest(dq__offer_many_error.keys, dq__offer_many_error.scheduled_ats, dq__offer_many_error.priorities,
                      dq__offer_many_error.message_groups, dq__offer_many_error.expires_ats, dq__offer_many_error.headers)
               WITH ORDINALITY AS u(k, s, p, g, e, h, i)
         WHERE (dq__offer_many_error.priorities IS NOT NULL AND (u.p IS NULL OR u.p NOT BETWEEN dq__limit_priority_min() AND dq__limit_priority_max()))
            OR u.g = '' OR char_length(u.g) > dq__limit_group_chars()
            OR NOT (u.e BETWEEN dq__min_time() AND dq__max_time()) OR u.e <= coalesce(u.s, v_now)
            OR jsonb_typeof(u.h) <> 'object' OR octet_length(u.h::text) > dq__limit_headers_bytes()
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


-- The payload limit of a queue, in bytes.
CREATE OR REPLACE FUNCTION dq__max_payload_bytes(queue text)
RETURNS integer
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT coalesce((SELECT q.max_payload_bytes FROM dq_queues q WHERE q.queue = $1), dq__limit_payload_bytes_default())
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
