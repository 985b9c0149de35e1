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
COMMENT ON FUNCTION dq__headers_error(text, text, jsonb) IS 'Internal: NULL for NULL or a JSON object of at most 8192 bytes; else the 22023 (not a JSON object) or 54000 (over 8192 bytes) error naming the parameter.';
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
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
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
COMMENT ON FUNCTION dq__controls_error(text, text, integer, text, timestamptz, timestamptz, jsonb) IS 'Internal: NULL when priority, message_group, expires_at and headers of an offer are valid; else the first error (22004, 22023, 22001, 22008, 54000 naming the parameter).';
REVOKE ALL ON FUNCTION dq__controls_error(text, text, integer, text, timestamptz, timestamptz, jsonb) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The payload limit of a queue, in bytes.
CREATE OR REPLACE FUNCTION dq__max_payload_bytes(queue text)
RETURNS integer
LANGUAGE sql STABLE SET search_path FROM CURRENT
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
COMMENT ON FUNCTION dq__payload_too_large_error(text, text, text, integer, integer) IS 'Internal: the 54000 program_limit_exceeded error (with a hint) for a payload over its queue''s limit.';
REVOKE ALL ON FUNCTION dq__payload_too_large_error(text, text, text, integer, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- NULL when size (bytes) is within the queue's limit, else the 54000 error. Called only for
-- payloads over the floor (it reads the queue's configuration).
CREATE OR REPLACE FUNCTION dq__payload_size_error(fn text, param text, queue text, size integer)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_limit integer := dq__max_payload_bytes(queue);
BEGIN
    RETURN CASE WHEN size > v_limit THEN dq__payload_too_large_error(fn, param, queue, size, v_limit) END;
END;
$$;
COMMENT ON FUNCTION dq__payload_size_error(text, text, text, integer) IS 'Internal: NULL when a payload of size bytes is within the queue''s max_payload_bytes (default 1 MiB), else the 54000 program_limit_exceeded error.';
REVOKE ALL ON FUNCTION dq__payload_size_error(text, text, text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The arrays of a dq_offer_many call as a whole: queue, NULL arrays, dimensions, the number of
-- items, and lengths equal to that of keys. The first error, NULL when there is none.
CREATE OR REPLACE FUNCTION dq__offer_many_shape_error(
    fn text, queue text, keys text[], payloads bytea[], scheduled_ats timestamptz[], can_update boolean,
    payload_types text[], priorities integer[], message_groups text[], expires_ats timestamptz[], headers jsonb[])
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_n      integer := coalesce(cardinality(keys), 0);
    -- The arrays that must be as long as keys, in the order of the parameters, and their lengths.
    v_names  CONSTANT text[] := ARRAY['payloads', 'scheduled_ats', 'payload_types', 'priorities', 'message_groups',
                                      'expires_ats', 'headers'];
    v_lens   integer[] := ARRAY[coalesce(cardinality(payloads), 0), cardinality(scheduled_ats), cardinality(payload_types),
                                cardinality(priorities), cardinality(message_groups), cardinality(expires_ats),
                                cardinality(headers)];
    v_error  jsonb;
BEGIN
    v_error := coalesce(
        dq__name_error(fn, 'queue', queue, dq__limit_queue_chars()),
        CASE WHEN keys IS NULL THEN dq__null_error(fn, 'keys') END,
        CASE WHEN payloads IS NULL THEN dq__null_error(fn, 'payloads') END,
        CASE WHEN can_update IS NULL THEN dq__null_error(fn, 'can_update') END,
        CASE WHEN array_ndims(keys) > 1 OR array_ndims(payloads) > 1 OR array_ndims(scheduled_ats) > 1
                  OR array_ndims(payload_types) > 1 OR array_ndims(priorities) > 1 OR array_ndims(message_groups) > 1
                  OR array_ndims(expires_ats) > 1 OR array_ndims(headers) > 1
             THEN dq__error('22023', format('%s: arrays must be one-dimensional', fn)) END,
        CASE WHEN v_n > dq__limit_offer_many_max_items()
             THEN dq__error('54000', format('%s: keys has %s elements, the limit is %s', fn, v_n,
                                            dq__limit_offer_many_max_items())) END);
    FOR i IN 1 .. cardinality(v_names) LOOP
        EXIT WHEN v_error IS NOT NULL;
        IF v_lens[i] <> v_n THEN
            v_error := dq__error('22023', format('%s: %s has %s elements, keys has %s', fn, v_names[i], v_lens[i], v_n));
        END IF;
    END LOOP;
    RETURN v_error;
END;
$$;
COMMENT ON FUNCTION dq__offer_many_shape_error(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) IS 'Internal: the first error of the arrays of a dq_offer_many call as a whole (NULL arrays, dimensions, count, lengths), NULL when none.';
REVOKE ALL ON FUNCTION dq__offer_many_shape_error(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The first element of a dq_offer_many call whose controls are wrong, described by
-- dq__controls_error (elements named by their 1-based ordinal), NULL when there is none; `at` is
-- the due time of an element without one.
CREATE OR REPLACE FUNCTION dq__offer_many_controls_error(fn text, scheduled_ats timestamptz[], priorities integer[],
                                                         message_groups text[], expires_ats timestamptz[],
                                                         headers jsonb[], at timestamptz)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
-- Not SQL: PL/pgSQL keeps the query's plan from one call to the next (an SQL function plans it each call).
AS $$
BEGIN
    RETURN (
        SELECT dq__controls_error(fn, format('[%s]', u.i), CASE WHEN priorities IS NULL THEN 0 ELSE u.p END, u.g,
                                  coalesce(u.s, at), u.e, u.h)
          FROM unnest(scheduled_ats, priorities, message_groups, expires_ats, headers)
               WITH ORDINALITY AS u(s, p, g, e, h, i)
         WHERE (priorities IS NOT NULL
                AND (u.p IS NULL OR u.p NOT BETWEEN dq__limit_priority_min() AND dq__limit_priority_max()))
            OR u.g = '' OR char_length(u.g) > dq__limit_group_chars()
            OR NOT (u.e BETWEEN dq__min_time() AND dq__max_time()) OR u.e <= coalesce(u.s, at)
            OR jsonb_typeof(u.h) <> 'object' OR octet_length(u.h::text) > dq__limit_headers_bytes()
         ORDER BY u.i LIMIT 1);
END;
$$;
COMMENT ON FUNCTION dq__offer_many_controls_error(text, timestamptz[], integer[], text[], timestamptz[], jsonb[], timestamptz) IS 'Internal: the error of the first element of a dq_offer_many call with a wrong priority, message group, expiry or headers, NULL when none.';
REVOKE ALL ON FUNCTION dq__offer_many_controls_error(text, timestamptz[], integer[], text[], timestamptz[], jsonb[], timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The first element of payloads over the queue's payload limit, as the 54000 error, NULL when none.
CREATE OR REPLACE FUNCTION dq__offer_many_payload_error(fn text, queue text, payloads bytea[])
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_limit  integer := dq__max_payload_bytes(queue);
BEGIN
    RETURN (SELECT dq__payload_too_large_error(fn, format('payloads[%s]', u.i), queue, octet_length(u.p), v_limit)
              FROM unnest(payloads) WITH ORDINALITY AS u(p, i)
             WHERE octet_length(u.p) > v_limit
             ORDER BY u.i LIMIT 1);
END;
$$;
COMMENT ON FUNCTION dq__offer_many_payload_error(text, text, bytea[]) IS 'Internal: the 54000 error (with a hint) of the first payload of a dq_offer_many call over its queue''s limit, NULL when none.';
REVOKE ALL ON FUNCTION dq__offer_many_payload_error(text, text, bytea[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The first error of a dq_offer_many call (or of dq_install_tick's occurrences, fn), NULL when there
-- is none: the arrays as a whole, then every element check in one pass over the arrays; element
-- positions are 1-based ordinals, values are read by ordinal (whatever the arrays' lower bounds). The
-- public function raises it, so the error's context names only the function the user called. The
-- queue's payload limit is read only for payloads over the smallest limit a queue may have, the
-- controls are checked only when some are given.
-- Valid input takes the short path: one expression for the arrays as a whole and one pass over the
-- elements that counts the suspicious ones (and the distinct keys) without building any error; the
-- checks that name the first error run only when that pass finds something (measured: the short
-- path halves the cost of the checks of a batch of 100).
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
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    v_error      jsonb;
    v_n          integer := coalesce(cardinality(keys), 0);
    v_bad_key    bigint;
    v_bad_pay    bigint;
    v_bad_sched  bigint;
    v_bad_type   bigint;
    v_distinct   bigint;
    v_dup        text;
    v_bad_time   bigint;
    v_big        bigint;
    v_suspect    bigint;
BEGIN
    -- The short path: the arrays' shape as one expression (NULL or false: the checks below find the error).
    IF queue <> '' AND char_length(queue) <= dq__limit_queue_chars() AND can_update IS NOT NULL
       AND array_ndims(keys) = 1 AND v_n <= dq__limit_offer_many_max_items()
       AND array_ndims(payloads) = 1 AND cardinality(payloads) = v_n
       AND (scheduled_ats IS NULL OR (array_ndims(scheduled_ats) = 1 AND cardinality(scheduled_ats) = v_n))
       AND (payload_types IS NULL OR (array_ndims(payload_types) = 1 AND cardinality(payload_types) = v_n))
       AND (priorities IS NULL OR (array_ndims(priorities) = 1 AND cardinality(priorities) = v_n))
       AND (message_groups IS NULL OR (array_ndims(message_groups) = 1 AND cardinality(message_groups) = v_n))
       AND (expires_ats IS NULL OR (array_ndims(expires_ats) = 1 AND cardinality(expires_ats) = v_n))
       AND (headers IS NULL OR (array_ndims(headers) = 1 AND cardinality(headers) = v_n)) THEN
        SELECT count(*) FILTER (WHERE u.k IS NULL OR u.k = '' OR char_length(u.k) > dq__limit_key_chars()
                                      OR u.p IS NULL OR octet_length(u.p) > dq__limit_payload_bytes_min()
                                      OR (scheduled_ats IS NOT NULL
                                          AND (u.s IS NULL OR NOT (u.s BETWEEN dq__min_time() AND dq__max_time())))
                                      OR u.t = '' OR char_length(u.t) > dq__limit_payload_type_chars()),
               count(DISTINCT u.k COLLATE "C")
          INTO v_suspect, v_distinct
          FROM unnest(keys, payloads, scheduled_ats, payload_types) AS u(k, p, s, t);
        IF v_suspect = 0 AND v_distinct = v_n THEN
            RETURN CASE WHEN priorities IS NOT NULL OR message_groups IS NOT NULL OR expires_ats IS NOT NULL
                             OR headers IS NOT NULL
                        THEN dq__offer_many_controls_error(fn, scheduled_ats, priorities, message_groups, expires_ats,
                                                           headers, dq__now()) END;
        END IF;
    END IF;
    -- The checks that name the first error, in the order they are reported.
    v_error := dq__offer_many_shape_error(fn, queue, keys, payloads, scheduled_ats, can_update, payload_types,
                                          priorities, message_groups, expires_ats, headers);
    IF v_error IS NOT NULL OR v_n = 0 THEN
        RETURN v_error;
    END IF;
    SELECT min(u.i) FILTER (WHERE u.k IS NULL OR u.k = '' OR char_length(u.k) > dq__limit_key_chars()),
           min(u.i) FILTER (WHERE u.p IS NULL),
           min(u.i) FILTER (WHERE scheduled_ats IS NOT NULL AND u.s IS NULL),
           min(u.i) FILTER (WHERE u.t = '' OR char_length(u.t) > dq__limit_payload_type_chars()),
           count(DISTINCT u.k),
           min(u.i) FILTER (WHERE NOT (u.s BETWEEN dq__min_time() AND dq__max_time())),
           min(u.i) FILTER (WHERE octet_length(u.p) > dq__limit_payload_bytes_min())
      INTO v_bad_key, v_bad_pay, v_bad_sched, v_bad_type, v_distinct, v_bad_time, v_big
      FROM unnest(keys, payloads, scheduled_ats, payload_types) WITH ORDINALITY AS u(k, p, s, t, i);
    IF v_distinct <> v_n THEN
        SELECT u.k INTO v_dup FROM unnest(keys) AS u(k) GROUP BY u.k HAVING count(*) > 1 ORDER BY u.k LIMIT 1;
    END IF;
    RETURN coalesce(
        CASE WHEN v_bad_key IS NOT NULL
             THEN dq__name_error(fn, format('keys[%s]', v_bad_key), keys[array_lower(keys, 1) + v_bad_key - 1],
                                 dq__limit_key_chars()) END,
        CASE WHEN v_bad_pay IS NOT NULL THEN dq__null_error(fn, format('payloads[%s]', v_bad_pay)) END,
        CASE WHEN v_bad_sched IS NOT NULL THEN dq__null_error(fn, format('scheduled_ats[%s]', v_bad_sched)) END,
        CASE WHEN v_bad_time IS NOT NULL
             THEN dq__time_error(fn, format('scheduled_ats[%s]', v_bad_time),
                                 scheduled_ats[array_lower(scheduled_ats, 1) + v_bad_time - 1]) END,
        CASE WHEN v_big IS NOT NULL THEN dq__offer_many_payload_error(fn, queue, payloads) END,
        CASE WHEN v_bad_type IS NOT NULL
             THEN dq__name_error(fn, format('payload_types[%s]', v_bad_type),
                                 payload_types[array_lower(payload_types, 1) + v_bad_type - 1],
                                 dq__limit_payload_type_chars()) END,
        CASE WHEN priorities IS NOT NULL OR message_groups IS NOT NULL OR expires_ats IS NOT NULL OR headers IS NOT NULL
             THEN dq__offer_many_controls_error(fn, scheduled_ats, priorities, message_groups, expires_ats, headers,
                                                dq__now()) END,
        CASE WHEN v_dup IS NOT NULL
             THEN dq__error('22023', format('%s: key "%s" appears more than once in keys', fn, v_dup)) END);
END;
$$;
COMMENT ON FUNCTION dq__offer_many_error(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) IS 'Internal: the first error of a dq_offer_many (or dq_install_tick, fn) input as {"sqlstate", "message"[, "hint"]}, NULL when the input is valid.';
REVOKE ALL ON FUNCTION dq__offer_many_error(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
