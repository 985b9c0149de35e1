-- Recurring messages, part 2: the instants at which a parsed schedule fires.
--
-- DST rules (dq__cron_resolve): a local time that does not exist (spring-forward gap) fires once, at
-- the instant PostgreSQL gives `local AT TIME ZONE zone`: the local time read with the offset in force
-- before the gap, i.e. shifted forward by the gap (02:30 -> 03:30 in America/New_York). A local time
-- that exists twice (fall-back) fires once, at its first (earlier) instant; PostgreSQL itself would
-- pick the later one (PostgreSQL manual, appendix B.2), so dq__cron_resolve looks for the earlier one. Two local
-- times that land on one instant (02:30 shifted onto 03:30) are one occurrence: occurrences are
-- instants, collected with DISTINCT, and an instant is a key.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;
-- ----------------------------------------------------------------------------- evaluation

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- The zone's UTC offset at an instant (local wall-clock time minus UTC). No SET clause, so it is
-- inlined where the evaluation compares offsets a day or two apart to find a transition.
CREATE OR REPLACE FUNCTION dq__cron_offset(at timestamptz, timezone text)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ($1 AT TIME ZONE $2) - ($1 AT TIME ZONE 'UTC') $$;
COMMENT ON FUNCTION dq__cron_offset(timestamptz, text) IS 'Internal: the UTC offset of timezone at an instant (local time minus UTC).';
REVOKE ALL ON FUNCTION dq__cron_offset(timestamptz, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The instant of a local time in a zone, by the DST rules at the top of this file. Away from a
-- transition (the offsets a day before and a day after agree) it is `local AT TIME ZONE zone`.
CREATE OR REPLACE FUNCTION dq__cron_resolve(local timestamp, timezone text)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT
AS $$
DECLARE
    v_t       timestamptz := local AT TIME ZONE timezone;
    v_before  interval := dq__cron_offset(v_t - interval '1 day', timezone);
    v_after   interval := dq__cron_offset(v_t + interval '1 day', timezone);
    v_first   timestamptz;
BEGIN
    IF v_before = v_after THEN
        RETURN v_t;
    END IF;
    -- Near a transition: the earliest instant that reads as `local` in the zone (the first of an
    -- ambiguous pair); none exists in a gap, where PostgreSQL's shifted instant stands.
    SELECT min(c.at) INTO v_first
      FROM (VALUES (v_t), ((local - v_before) AT TIME ZONE 'UTC'), ((local - v_after) AT TIME ZONE 'UTC')) AS c(at)
     WHERE (c.at AT TIME ZONE timezone) = local;
    RETURN coalesce(v_first, v_t);
END;
$$;
COMMENT ON FUNCTION dq__cron_resolve(timestamp, text) IS 'Internal: the instant of a local time in a zone: a nonexistent (gap) time is shifted forward by the gap (PostgreSQL''s AT TIME ZONE), an ambiguous (fall-back) time is its earlier instant.';
REVOKE ALL ON FUNCTION dq__cron_resolve(timestamp, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The occurrences of a parsed schedule in (after, until], earliest first, at most max_count.
-- 'every': arithmetic on multiples of the period. 'cron'/'daily': walks local days from the day of
-- `after` (months not in the schedule are skipped whole), and for a matching day resolves only the
-- times of day whose local timestamp can land in the window (a 3-hour margin is added only where an
-- offset change is within a day of an end), so a tick over a one-minute window resolves one or two
-- local times, and a yearly schedule's next occurrence costs about a dozen month steps. With an
-- infinite `until` the walk stops after 50 years.
CREATE OR REPLACE FUNCTION dq__cron_between(spec dq_cron_spec, timezone text, after timestamptz,
                                            until timestamptz, max_count integer)
RETURNS timestamptz[]
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_out     timestamptz[] := '{}';
    v_first   bigint;
    v_last    bigint;
    v_lo      timestamp;
    v_hi      timestamp;
    v_day     date;
    v_end     date;
    v_dom_ok  boolean;
    v_dow_ok  boolean;
    v_d0      timestamptz;
    v_d1      timestamptz;
BEGIN
    IF max_count < 1 OR until <= after THEN
        RETURN v_out;
    END IF;
    IF spec.kind = 'every' THEN
        v_first := floor(extract(epoch FROM after) * 1000 / spec.period_ms)::bigint + 1;
        v_last := least(v_first + max_count - 1,
                        floor(extract(epoch FROM least(until, dq__max_time())) * 1000 / spec.period_ms)::bigint);
        RETURN ARRAY(SELECT timestamptz '1970-01-01 00:00:00+00' + (k * spec.period_ms) * interval '1 millisecond'
                       FROM generate_series(v_first, v_last) k ORDER BY k);
    END IF;

    v_lo := after AT TIME ZONE timezone;
    IF dq__cron_offset(after - interval '1 day', timezone) <> dq__cron_offset(after + interval '1 day', timezone) THEN
        v_lo := v_lo - interval '3 hours';
    END IF;
    IF isfinite(until) THEN
        v_hi := until AT TIME ZONE timezone;
        IF dq__cron_offset(until - interval '1 day', timezone) <> dq__cron_offset(until + interval '1 day', timezone) THEN
            v_hi := v_hi + interval '3 hours';
        END IF;
        v_end := v_hi::date;
    ELSE
        v_hi := 'infinity';
        v_end := (v_lo + interval '50 years')::date;
    END IF;

    v_day := v_lo::date;
    WHILE v_day <= v_end LOOP
        IF NOT (extract(month FROM v_day)::integer = ANY (spec.months)) THEN
            v_day := (date_trunc('month', v_day) + interval '1 month')::date;
            CONTINUE;
        END IF;
        v_dom_ok := extract(day FROM v_day)::integer = ANY (spec.doms);
        v_dow_ok := extract(dow FROM v_day)::integer = ANY (spec.dows);
        -- Vixie cron's day rule (dq__cron_parse): both when either field starts with *, else either.
        IF ((spec.dom_star OR spec.dow_star) AND v_dom_ok AND v_dow_ok)
           OR (NOT (spec.dom_star OR spec.dow_star) AND (v_dom_ok OR v_dow_ok)) THEN
            v_d0 := (v_day - 1)::timestamp AT TIME ZONE timezone;
            v_d1 := (v_day + 2)::timestamp AT TIME ZONE timezone;
            IF dq__cron_offset(v_d0, timezone) = dq__cron_offset(v_d1, timezone) THEN
                -- No offset change from the day before to the day after: every local time of the
                -- day exists once, dq__cron_resolve is plain AT TIME ZONE and keeps the order of
                -- the times, so only the first ones still needed are resolved, in one statement.
                v_out := v_out || ARRAY(
                    SELECT (v_day + t) AT TIME ZONE timezone
                      FROM unnest(spec.times) AS t
                     WHERE v_day + t >= v_lo AND v_day + t <= v_hi
                       AND (v_day + t) AT TIME ZONE timezone > after
                       AND (v_day + t) AT TIME ZONE timezone <= until
                     ORDER BY t
                     LIMIT max_count - cardinality(v_out));
                EXIT WHEN cardinality(v_out) >= max_count;
                v_day := v_day + 1;
                CONTINUE;
            END IF;
            v_out := v_out || ARRAY(
                SELECT r.at
                  FROM (SELECT DISTINCT dq__cron_resolve(v_day + t, timezone) AS at
                          FROM unnest(spec.times) AS t
                         WHERE v_day + t >= v_lo AND v_day + t <= v_hi) r
                 WHERE r.at > after AND r.at <= until
                 ORDER BY r.at);
            EXIT WHEN cardinality(v_out) >= max_count;
        END IF;
        v_day := v_day + 1;
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT x FROM unnest(v_out) x WHERE x <= dq__max_time() ORDER BY x LIMIT max_count);
END;
$$;
COMMENT ON FUNCTION dq__cron_between(dq_cron_spec, text, timestamptz, timestamptz, integer) IS 'Internal: the occurrences of a parsed schedule in (after, until], earliest first, at most max_count (an infinite until searches 50 years); never after 9999-12-30 UTC.';
REVOKE ALL ON FUNCTION dq__cron_between(dq_cron_spec, text, timestamptz, timestamptz, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- An upper bound of the occurrences of a schedule in any window of length `span`: one per period
-- for 'every'; for 'cron' and 'daily', the times of a day over every local date the window can
-- touch (a window of n days touches at most n + 2 dates, DST days being 23 to 25 hours long).
CREATE OR REPLACE FUNCTION dq__cron_max_in(spec dq_cron_spec, span interval)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN ($1).kind = 'every'
                THEN ceil(extract(epoch FROM $2) * 1000 / ($1).period_ms)::bigint
                ELSE cardinality(($1).times)::bigint * (ceil(extract(epoch FROM $2) / 86400)::bigint + 2) END
$$;
COMMENT ON FUNCTION dq__cron_max_in(dq_cron_spec, interval) IS 'Internal: an upper bound of the occurrences of a parsed schedule in any window of length span.';
REVOKE ALL ON FUNCTION dq__cron_max_in(dq_cron_spec, interval) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

CREATE OR REPLACE FUNCTION dq_cron_occurrences(
    schedule   text,
    timezone   text DEFAULT 'UTC',
    after      timestamptz DEFAULT dq_now(),
    until      timestamptz DEFAULT 'infinity',
    max_count  integer DEFAULT 10)
RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error  jsonb;
    v_def    record;
BEGIN
    v_error := coalesce(
        dq__text_error('dq_cron_occurrences', 'schedule', dq_cron_occurrences.schedule, dq__limit_cron_schedule_chars()),
        CASE WHEN dq_cron_occurrences.after IS NULL THEN dq__null_error('dq_cron_occurrences', 'after') END,
        CASE WHEN dq_cron_occurrences.until IS NULL THEN dq__null_error('dq_cron_occurrences', 'until') END,
        dq__time_error('dq_cron_occurrences', 'after', dq_cron_occurrences.after),
        CASE WHEN dq_cron_occurrences.until <> 'infinity'
                  AND NOT (dq_cron_occurrences.until BETWEEN dq__min_time() AND dq__max_time())
             THEN dq__error('22008', format('dq_cron_occurrences: until is %s, it must be ''infinity'' or a finite time '
                                            'between 0001-01-02 and 9999-12-30 UTC', dq_cron_occurrences.until)) END,
        dq__range_error('dq_cron_occurrences', 'max_count', dq_cron_occurrences.max_count, 1,
                        dq__limit_occurrences_max_count()));
    IF v_error IS NULL THEN
        -- The schedule and the zone, refused as dq_cron_install refuses them (a schedule that never
        -- fires included; an empty window of one that fires is just empty).
        v_def := dq__cron_definition('dq_cron_occurrences', dq_cron_occurrences.schedule, dq_cron_occurrences.timezone);
        v_error := v_def.error;
    END IF;
    IF v_error ? 'hint' THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
    ELSIF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY SELECT x FROM unnest(dq__cron_between(v_def.spec, v_def.zone, dq_cron_occurrences.after,
                                                        dq_cron_occurrences.until, dq_cron_occurrences.max_count)) x;
END;
$$;
COMMENT ON FUNCTION dq_cron_occurrences(text, text, timestamptz, timestamptz, integer) IS 'dq_cron_occurrences(schedule, timezone, after, until, max_count) -> SETOF timestamptz: the instants at which the schedule fires in (after, until], earliest first; changes nothing. Errors: 22004 NULL, 22023 bad schedule, timezone or max_count or a schedule that never fires, 22001 schedule too long, 22008 after or until out of range.';
REVOKE ALL ON FUNCTION dq_cron_occurrences(text, text, timestamptz, timestamptz, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_occurrences(text, text, timestamptz, timestamptz, integer) TO dq_admin, dq_viewer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);

