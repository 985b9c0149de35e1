-- Argument checks: each returns the error a public function raises for a bad argument, NULL for a
-- good one.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- dq__time_after_error of earlier versions of this file took the limit's text as well.
DROP FUNCTION IF EXISTS dq__time_after_error(text, text, interval, timestamptz, boolean, interval, text);

-- A bad argument is raised by the public function the user called, never by a helper, so the error's
-- CONTEXT names only that function. The helpers below describe the error instead: they return it as
-- jsonb {"sqlstate": ..., "message": ...[, "hint": ...]} (NULL when the value is valid). A function
-- gathers its checks, in the order it reports them, into one v_error and raises it in one place:
--
--     v_error := coalesce(dq__name_error('dq_cancel', 'queue', dq_cancel.queue, dq__limit_queue_chars()),
--                         dq__name_error('dq_cancel', 'key', dq_cancel.key, dq__limit_key_chars()));
--     IF v_error IS NOT NULL THEN
--         RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
--     END IF;
--
-- (where an error may carry a hint, an IF v_error ? 'hint' branch raises it with HINT: PL/pgSQL
-- refuses a NULL option). coalesce evaluates its arguments in order and stops at the first that is
-- not NULL, so a check costs nothing once an earlier one failed; a costly check is wrapped in a CASE
-- that asks for it only when it can fail (dq_offer reads a queue's payload limit only for a payload
-- over the smallest limit). The checks are SQL expressions that PostgreSQL inlines (SQL, no SET
-- clause): a valid value costs the comparisons of the CASE, and the message is built only in its
-- branch, on the error path. PL/pgSQL evaluates the assignment as a simple expression (PERFORM would
-- run a whole query: measured, about 2 us a check).

-- An error as the callers raise it.
CREATE OR REPLACE FUNCTION dq__error(sqlstate text, message text)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$ SELECT jsonb_build_object('sqlstate', sqlstate, 'message', message) $$;
COMMENT ON FUNCTION dq__error(text, text) IS 'Internal: an error for the public function to raise: {"sqlstate": ..., "message": ...}.';
REVOKE ALL ON FUNCTION dq__error(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- 22004 for a NULL argument (the caller found it NULL).
CREATE OR REPLACE FUNCTION dq__null_error(fn text, param text)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$ SELECT dq__error('22004', format('%s: %s must not be NULL', fn, param)) $$;
COMMENT ON FUNCTION dq__null_error(text, text) IS 'Internal: the 22004 null_value_not_allowed error naming the parameter.';
REVOKE ALL ON FUNCTION dq__null_error(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A queue name, key or other name: not NULL (22004), not empty (22023), at most max_len characters (22001).
CREATE OR REPLACE FUNCTION dq__name_error(fn text, param text, value text, max_len integer)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN value IS NULL THEN dq__null_error(fn, param)
                WHEN value = '' THEN dq__error('22023', format('%s: %s must not be empty', fn, param))
                WHEN char_length(value) > max_len
                THEN dq__error('22001', format('%s: %s is %s characters, the limit is %s', fn, param,
                                               char_length(value), max_len)) END
$$;
COMMENT ON FUNCTION dq__name_error(text, text, text, integer) IS 'Internal: NULL when value is not NULL, not empty and at most max_len characters; else the 22004, 22023 or 22001 error naming fn and param.';
REVOKE ALL ON FUNCTION dq__name_error(text, text, text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A text that may be empty: not NULL (22004), at most max_len characters (22001).
CREATE OR REPLACE FUNCTION dq__text_error(fn text, param text, value text, max_len integer)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN value IS NULL OR char_length(value) > max_len THEN dq__name_error(fn, param, value, max_len) END
$$;
COMMENT ON FUNCTION dq__text_error(text, text, text, integer) IS 'Internal: NULL when value is not NULL and at most max_len characters; else the 22004 or 22001 error naming fn and param.';
REVOKE ALL ON FUNCTION dq__text_error(text, text, text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A count or size: not NULL (22004), between lo and hi inclusive (22023).
CREATE OR REPLACE FUNCTION dq__range_error(fn text, param text, value bigint, lo bigint, hi bigint)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN value IS NULL THEN dq__null_error(fn, param)
                WHEN value < lo OR value > hi
                THEN dq__error('22023', format('%s: %s is %s, it must be between %s and %s', fn, param, value, lo, hi)) END
$$;
COMMENT ON FUNCTION dq__range_error(text, text, bigint, bigint, bigint) IS 'Internal: NULL when value is not NULL and in [lo, hi]; else the 22004 or 22023 error naming fn and param.';
REVOKE ALL ON FUNCTION dq__range_error(text, text, bigint, bigint, bigint) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;


-- A timestamp argument: not NULL (22004), within the stored range (22008). NULL when valid.
CREATE OR REPLACE FUNCTION dq__time_error(fn text, param text, value timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN value IS NULL THEN dq__null_error(fn, param)
                WHEN NOT (value BETWEEN dq__min_time() AND dq__max_time())
                THEN dq__error('22008', format('%s: %s is %s, it must be a finite time between 0001-01-02 and 9999-12-30 UTC',
                                               fn, param, value)) END
$$;
COMMENT ON FUNCTION dq__time_error(text, text, timestamptz) IS 'Internal: NULL for a time in 0001-01-02 .. 9999-12-30 UTC; else the 22004 (NULL) or 22008 datetime_field_overflow error naming the parameter.';
REVOKE ALL ON FUNCTION dq__time_error(text, text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A limit of time as messages say it: '1 hour', '1 day', '366 days' (whatever the IntervalStyle).
CREATE OR REPLACE FUNCTION dq__interval_text(value interval)
RETURNS text
LANGUAGE sql STABLE  -- interval's text depends on IntervalStyle
AS $$
    SELECT CASE WHEN value = make_interval(days => extract(day FROM value)::integer) AND extract(day FROM value) > 0
                THEN extract(day FROM value)::integer || CASE WHEN extract(day FROM value) = 1 THEN ' day' ELSE ' days' END
                WHEN value = make_interval(hours => extract(hour FROM value)::integer) AND extract(hour FROM value) > 0
                THEN extract(hour FROM value)::integer || CASE WHEN extract(hour FROM value) = 1 THEN ' hour' ELSE ' hours' END
                ELSE value::text END
$$;
COMMENT ON FUNCTION dq__interval_text(interval) IS 'Internal: a whole number of days or hours as words (''1 hour'', ''366 days''), else the interval''s text.';
REVOKE ALL ON FUNCTION dq__interval_text(interval) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- An interval applied to a time: base + value, checked by its effect rather than by comparing the
-- interval with zero: an interval with months is not a fixed length ('1 mon -29 days' compares as
-- positive but lands in the past on 31 January; PostgreSQL manual, 9.9 "Date/Time Functions and
-- Operators"). NULL when base + value is valid, which the caller then computes; else 22004 for
-- NULL, 22023 when base + value is before base (or equal, unless allow_zero) or after base +
-- max_value, 22008 when it would leave the stored range. Each field of the interval is bounded
-- first, so the addition itself cannot overflow.
CREATE OR REPLACE FUNCTION dq__time_after_error(fn text, param text, value interval, base timestamptz,
                                                allow_zero boolean, max_value interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SET search_path FROM CURRENT
AS $$
DECLARE
    v_at timestamptz;
BEGIN
    IF value IS NULL THEN
        RETURN dq__null_error(fn, param);
    END IF;
    IF abs(extract(year FROM value)) > 10000 OR abs(extract(day FROM value)) > 3660000
       OR abs(extract(hour FROM value)) > 87660000 THEN
        IF value >= interval '0' THEN
            RETURN dq__error('22008', format('%s: %s is %s, now + %s would be after 9999-12-30 UTC', fn, param, value, param));
        END IF;
        v_at := NULL;  -- hugely negative: reported as negative below
    ELSE
        v_at := base + value;
    END IF;
    IF v_at IS NULL OR v_at < base OR (v_at = base AND NOT allow_zero) THEN
        RETURN dq__error('22023', format('%s: %s is %s, it must %s: now + %s must be %s now', fn, param, value,
            CASE WHEN allow_zero THEN 'not be negative' ELSE 'be positive' END, param,
            CASE WHEN allow_zero THEN 'at or after' ELSE 'after' END));
    END IF;
    IF max_value IS NOT NULL AND v_at > base + max_value THEN
        RETURN dq__error('22023', format('%s: %s is %s, the limit is %s', fn, param, value, dq__interval_text(max_value)));
    END IF;
    IF v_at > dq__max_time() THEN
        RETURN dq__error('22008', format('%s: %s is %s, now + %s would be after 9999-12-30 UTC', fn, param, value, param));
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION dq__time_after_error(text, text, interval, timestamptz, boolean, interval) IS 'Internal: NULL when base + value is valid; else the error: 22004 NULL, 22023 before base (or at it unless allow_zero) or past max_value, 22008 past 9999-12-30 UTC.';
REVOKE ALL ON FUNCTION dq__time_after_error(text, text, interval, timestamptz, boolean, interval) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
