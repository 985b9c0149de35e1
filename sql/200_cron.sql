-- Recurring messages (issue 4): seed 003's CronService inside the database.
--
-- An occurrence of a recurring message is an ordinary delayed message whose key is
-- '<key_prefix>/<config_hash>/<epoch milliseconds>'. The unique (queue, key) makes every install
-- idempotent, so any number of installers (pg_cron, CronTicker threads, `pyqueue cron tick`) may
-- run without a leader: the first insert of an occurrence wins, the others are ignored.
--
--  * dq_install_tick / dq_uninstall_tick: seed 003's installTick / uninstallTick.
--  * dq_cron (migrations/0005_cron.sql): named schedules; dq_cron_install, dq_cron_uninstall,
--    dq_cron_pause, dq_cron_resume manage them, dq_cron_tick() installs what is due, the view
--    dq_cron_schedules lists them. The pg_cron job 'dq-cron-tick' calls dq_cron_tick() every minute.
--  * Schedules: 5-field cron (Vixie semantics), 'every <interval>' (multiples of the interval since
--    the Unix epoch), 'daily at HH:MM[:SS][, ...]'; local times in an IANA zone. docs/cron.md.
--
-- DST rules (dq__cron_resolve): a local time that does not exist (spring-forward gap) fires once, at
-- the instant PostgreSQL gives `local AT TIME ZONE zone`: the local time read with the offset in force
-- before the gap, i.e. shifted forward by the gap (02:30 -> 03:30 in America/New_York). A local time
-- that exists twice (fall-back) fires once, at its first (earlier) instant; PostgreSQL itself would
-- pick the later one (docs, appendix B.2), so dq__cron_resolve looks for the earlier one. Two local
-- times that land on one instant (02:30 shifted onto 03:30) are one occurrence: occurrences are
-- instants, collected with DISTINCT, and an instant is a key.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', pg_catalog.format('%I, pg_temp', (SELECT u.s FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1)), false) AS install_search_path;

-- ----------------------------------------------------------------------------- parsing

-- One cron field: a comma list of '*', 'N', 'A-B', each optionally '/STEP', numbers or names.
-- Returns the sorted distinct values. `what` names the field in error messages.
CREATE OR REPLACE FUNCTION dq__cron_field(fn text, field text, what text, lo integer, hi integer, names text[])
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_item  text;
    v_m     text[];
    v_a     integer;
    v_b     integer;
    v_step  integer;
    v_out   integer[] := '{}';
    v_part  text;
    v_vals  integer[];
    v_i     integer;
BEGIN
    FOREACH v_item IN ARRAY string_to_array(field, ',') LOOP
        v_m := regexp_match(v_item, '^(\*|([a-z]{3}|[0-9]{1,4})(-([a-z]{3}|[0-9]{1,4}))?)(/([0-9]{1,4}))?$');
        IF v_m IS NULL THEN
            RAISE EXCEPTION '%: schedule: % field "%" is not a list of values, ranges (a-b) and steps (*/n, a-b/n)',
                fn, what, field USING ERRCODE = '22023';
        END IF;
        v_vals := '{}';
        FOR v_i IN 0 .. 1 LOOP
            v_part := CASE v_i WHEN 0 THEN v_m[2] ELSE v_m[4] END;
            IF v_part IS NULL THEN
                v_vals := v_vals || NULL::integer;
            ELSIF v_part ~ '^[0-9]+$' THEN
                v_vals := v_vals || v_part::integer;
            ELSIF array_position(names, v_part) IS NOT NULL THEN
                v_vals := v_vals || (lo + array_position(names, v_part) - 1);
            ELSE
                RAISE EXCEPTION '%: schedule: % field "%": unknown name "%"', fn, what, field, v_part
                    USING ERRCODE = '22023';
            END IF;
        END LOOP;
        IF v_m[1] = '*' THEN
            v_a := lo;
            v_b := CASE WHEN what = 'day-of-week' THEN 6 ELSE hi END;
        ELSE
            v_a := v_vals[1];
            -- 'a/n' runs to the end of the field (day-of-week: to Saturday, 7 would repeat Sunday).
            v_b := coalesce(v_vals[2], CASE WHEN v_m[6] IS NULL THEN v_a
                                            WHEN what = 'day-of-week' THEN 6 ELSE hi END);
        END IF;
        IF v_a < lo OR v_a > hi OR v_b < lo OR v_b > hi THEN
            RAISE EXCEPTION '%: schedule: % field "%" is out of range %-%', fn, what, field, lo, hi
                USING ERRCODE = '22023';
        END IF;
        IF v_a > v_b THEN
            RAISE EXCEPTION '%: schedule: % field "%": range %-% is backwards', fn, what, field, v_a, v_b
                USING ERRCODE = '22023';
        END IF;
        v_step := coalesce(v_m[6]::integer, 1);
        IF v_step < 1 THEN
            RAISE EXCEPTION '%: schedule: % field "%": step must be at least 1', fn, what, field
                USING ERRCODE = '22023';
        END IF;
        v_out := v_out || ARRAY(SELECT g FROM generate_series(v_a, v_b, v_step) g);
    END LOOP;
    IF what = 'day-of-week' THEN
        v_out := ARRAY(SELECT CASE WHEN x = 7 THEN 0 ELSE x END FROM unnest(v_out) x);  -- 7 is Sunday too
    END IF;
    RETURN ARRAY(SELECT DISTINCT x FROM unnest(v_out) x ORDER BY x);
END;
$$;
COMMENT ON FUNCTION dq__cron_field(text, text, text, integer, integer, text[]) IS
  'Internal: the sorted values of one cron field (lists, ranges, steps, names); 22023 naming schedule on bad syntax.';
REVOKE ALL ON FUNCTION dq__cron_field(text, text, text, integer, integer, text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A schedule's parsed form (type dq_cron_spec, migrations/0005_cron.sql). 22023 naming `schedule`
-- and what is wrong; `fn` is the public function reported in the message.
CREATE OR REPLACE FUNCTION dq__cron_parse(fn text, schedule text)
RETURNS dq_cron_spec
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_s       text := lower(btrim(regexp_replace(schedule, '\s+', ' ', 'g')));
    v_f       text[];
    v_spec    dq_cron_spec;
    v_iv      interval;
    v_ms      numeric;
    v_item    text;
    v_m       text[];
    v_times   interval[] := '{}';
    v_hours   integer[];
    v_minutes integer[];
BEGIN
    IF v_s = '' THEN
        RAISE EXCEPTION '%: schedule must not be empty', fn USING ERRCODE = '22023';
    END IF;
    IF left(v_s, 1) = '@' THEN
        v_s := CASE v_s
                   WHEN '@hourly' THEN '0 * * * *'
                   WHEN '@daily' THEN '0 0 * * *'
                   WHEN '@midnight' THEN '0 0 * * *'
                   WHEN '@weekly' THEN '0 0 * * 0'
                   WHEN '@monthly' THEN '0 0 1 * *'
                   WHEN '@yearly' THEN '0 0 1 1 *'
                   WHEN '@annually' THEN '0 0 1 1 *'
               END;
        IF v_s IS NULL THEN
            RAISE EXCEPTION '%: schedule: unknown macro "%" (use @hourly, @daily, @weekly, @monthly, @yearly or @annually)',
                fn, left(btrim(schedule), 40) USING ERRCODE = '22023';
        END IF;
    END IF;

    IF v_s LIKE 'every %' THEN
        BEGIN
            v_iv := substr(v_s, 7)::interval;
        EXCEPTION WHEN data_exception THEN
            RAISE EXCEPTION '%: schedule: "every" needs an interval such as ''15 minutes'', got "%"',
                fn, left(substr(v_s, 7), 60) USING ERRCODE = '22023';
        END;
        IF extract(year FROM v_iv) <> 0 OR extract(month FROM v_iv) <> 0 THEN
            RAISE EXCEPTION '%: schedule: "every %" has months or years, which have no fixed length (use a cron expression)',
                fn, substr(v_s, 7) USING ERRCODE = '22023';
        END IF;
        v_ms := extract(epoch FROM v_iv) * 1000;
        IF v_ms <= 0 THEN
            RAISE EXCEPTION '%: schedule: "every %" is not positive', fn, substr(v_s, 7) USING ERRCODE = '22023';
        END IF;
        IF v_ms < 1000 OR v_ms <> trunc(v_ms) THEN
            RAISE EXCEPTION '%: schedule: "every %" must be at least 1 second and a whole number of milliseconds',
                fn, substr(v_s, 7) USING ERRCODE = '22023';
        END IF;
        v_spec.kind := 'every';
        v_spec.period_ms := v_ms::bigint;
        RETURN v_spec;
    END IF;

    IF v_s LIKE 'daily at %' THEN
        FOREACH v_item IN ARRAY string_to_array(substr(v_s, 10), ',') LOOP
            v_m := regexp_match(btrim(v_item), '^([0-9]{1,2}):([0-9]{2})(:([0-9]{2}))?$');
            IF v_m IS NULL OR v_m[1]::integer > 23 OR v_m[2]::integer > 59 OR coalesce(v_m[4]::integer, 0) > 59 THEN
                RAISE EXCEPTION '%: schedule: "daily at" needs times HH:MM or HH:MM:SS (00:00 to 23:59:59), got "%"',
                    fn, left(btrim(v_item), 40) USING ERRCODE = '22023';
            END IF;
            v_times := v_times || make_interval(hours => v_m[1]::integer, mins => v_m[2]::integer,
                                                secs => coalesce(v_m[4]::integer, 0));
        END LOOP;
        v_spec.kind := 'daily';
        v_spec.months := ARRAY(SELECT generate_series(1, 12));
        v_spec.doms := ARRAY(SELECT generate_series(1, 31));
        v_spec.dows := ARRAY(SELECT generate_series(0, 6));
        v_spec.dom_star := true;
        v_spec.dow_star := true;
        v_spec.times := ARRAY(SELECT DISTINCT t FROM unnest(v_times) t ORDER BY t);
        RETURN v_spec;
    END IF;

    v_f := string_to_array(v_s, ' ');
    IF cardinality(v_f) <> 5 THEN
        RAISE EXCEPTION '%: schedule "%" has % fields; a cron expression has 5 (minute hour day-of-month month day-of-week), or use @daily, "every <interval>", "daily at HH:MM"',
            fn, left(btrim(schedule), 60), cardinality(v_f) USING ERRCODE = '22023';
    END IF;
    v_minutes := dq__cron_field(fn, v_f[1], 'minute', 0, 59, '{}');
    v_hours := dq__cron_field(fn, v_f[2], 'hour', 0, 23, '{}');
    v_spec.kind := 'cron';
    v_spec.doms := dq__cron_field(fn, v_f[3], 'day-of-month', 1, 31, '{}');
    v_spec.months := dq__cron_field(fn, v_f[4], 'month', 1, 12,
                                    '{jan,feb,mar,apr,may,jun,jul,aug,sep,oct,nov,dec}');
    v_spec.dows := dq__cron_field(fn, v_f[5], 'day-of-week', 0, 7, '{sun,mon,tue,wed,thu,fri,sat}');
    -- Vixie cron: a day field "starting with *" counts as unrestricted; when neither is, a day
    -- matching either field matches, otherwise both must match.
    v_spec.dom_star := left(v_f[3], 1) = '*';
    v_spec.dow_star := left(v_f[5], 1) = '*';
    v_spec.times := ARRAY(SELECT make_interval(hours => h, mins => m)
                            FROM unnest(v_hours) h, unnest(v_minutes) m ORDER BY h, m);
    RETURN v_spec;
END;
$$;
COMMENT ON FUNCTION dq__cron_parse(text, text) IS
  'Internal: parses a schedule (5-field cron, @macros, every <interval>, daily at HH:MM[:SS][, ...]) into dq_cron_spec; 22023 naming schedule on bad syntax.';
REVOKE ALL ON FUNCTION dq__cron_parse(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The canonical IANA name of a zone (as listed by pg_timezone_names, matched case-insensitively).
-- POSIX strings ('UTC+3', 'EST5EDT,M3.2.0,M11.1.0') and abbreviations ('PST') are not zones.
-- pg_timezone_names reads every zone file (50-80 ms a call), so only installs and previews call
-- this, and a name stored by an earlier install (checked then, and canonical) or 'UTC' is taken
-- as it is: installing 1,000 schedules in a few zones reads the zone files a few times.
CREATE OR REPLACE FUNCTION dq__cron_zone(fn text, timezone text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_name text;
BEGIN
    IF timezone IS NULL THEN
        PERFORM dq__raise_null(fn, 'timezone');
    END IF;
    IF timezone = 'UTC' OR EXISTS (SELECT 1 FROM dq_cron c WHERE c.timezone = dq__cron_zone.timezone) THEN
        RETURN timezone;
    END IF;
    IF char_length(timezone) BETWEEN 1 AND 100 THEN
        SELECT z.name INTO v_name FROM pg_timezone_names z
         WHERE lower(z.name) = lower(timezone) ORDER BY z.name = timezone DESC, z.name LIMIT 1;
    END IF;
    IF v_name IS NULL THEN
        RAISE EXCEPTION '%: timezone "%" is not an IANA time zone name (such as UTC or Europe/Berlin)',
            fn, left(timezone, 100) USING ERRCODE = '22023';
    END IF;
    RETURN v_name;
END;
$$;
COMMENT ON FUNCTION dq__cron_zone(text, text) IS
  'Internal: the canonical IANA name of timezone (pg_timezone_names, case-insensitive); 22004 NULL, 22023 unknown.';
REVOKE ALL ON FUNCTION dq__cron_zone(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- ----------------------------------------------------------------------------- evaluation

-- The zone's UTC offset at an instant (local wall-clock time minus UTC). No SET clause, so it is
-- inlined where the evaluation compares offsets a day or two apart to find a transition.
CREATE OR REPLACE FUNCTION dq__cron_offset(at timestamptz, timezone text)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ($1 AT TIME ZONE $2) - ($1 AT TIME ZONE 'UTC') $$;
COMMENT ON FUNCTION dq__cron_offset(timestamptz, text) IS
  'Internal: the UTC offset of timezone at an instant (local time minus UTC).';
REVOKE ALL ON FUNCTION dq__cron_offset(timestamptz, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The instant of a local time in a zone, by the DST rules at the top of this file. Away from a
-- transition (the offsets a day before and a day after agree) it is `local AT TIME ZONE zone`.
CREATE OR REPLACE FUNCTION dq__cron_resolve(local timestamp, timezone text)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT
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
COMMENT ON FUNCTION dq__cron_resolve(timestamp, text) IS
  'Internal: the instant of a local time in a zone: a nonexistent (gap) time is shifted forward by the gap (PostgreSQL''s AT TIME ZONE), an ambiguous (fall-back) time is its earlier instant.';
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
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
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
COMMENT ON FUNCTION dq__cron_between(dq_cron_spec, text, timestamptz, timestamptz, integer) IS
  'Internal: the occurrences of a parsed schedule in (after, until], earliest first, at most max_count (an infinite until searches 50 years); never after 9999-12-30 UTC.';
REVOKE ALL ON FUNCTION dq__cron_between(dq_cron_spec, text, timestamptz, timestamptz, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_occurrences(
    schedule   text,
    timezone   text DEFAULT 'UTC',
    after      timestamptz DEFAULT now(),
    until      timestamptz DEFAULT 'infinity',
    max_count  integer DEFAULT 10)
RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_spec  dq_cron_spec;
    v_zone  text;
BEGIN
    IF dq_cron_occurrences.schedule IS NULL THEN
        PERFORM dq__raise_null('dq_cron_occurrences', 'schedule');
    END IF;
    IF char_length(dq_cron_occurrences.schedule) > 1000 THEN
        RAISE EXCEPTION 'dq_cron_occurrences: schedule is % characters, the limit is 1000',
            char_length(dq_cron_occurrences.schedule) USING ERRCODE = '22001';
    END IF;
    IF dq_cron_occurrences.after IS NULL THEN
        PERFORM dq__raise_null('dq_cron_occurrences', 'after');
    END IF;
    IF dq_cron_occurrences.until IS NULL THEN
        PERFORM dq__raise_null('dq_cron_occurrences', 'until');
    END IF;
    IF NOT (dq_cron_occurrences.after BETWEEN dq__min_time() AND dq__max_time()) THEN
        PERFORM dq__raise_bad_time('dq_cron_occurrences', 'after', dq_cron_occurrences.after);
    END IF;
    IF dq_cron_occurrences.until <> 'infinity'
       AND NOT (dq_cron_occurrences.until BETWEEN dq__min_time() AND dq__max_time()) THEN
        RAISE EXCEPTION 'dq_cron_occurrences: until is %, it must be ''infinity'' or a finite time between 0001-01-02 and 9999-12-30 UTC',
            dq_cron_occurrences.until USING ERRCODE = '22008';
    END IF;
    IF dq_cron_occurrences.max_count IS NULL THEN
        PERFORM dq__raise_null('dq_cron_occurrences', 'max_count');
    END IF;
    IF dq_cron_occurrences.max_count < 1 OR dq_cron_occurrences.max_count > 10000 THEN
        RAISE EXCEPTION 'dq_cron_occurrences: max_count is %, it must be between 1 and 10000',
            dq_cron_occurrences.max_count USING ERRCODE = '22023';
    END IF;
    v_spec := dq__cron_parse('dq_cron_occurrences', dq_cron_occurrences.schedule);
    v_zone := dq__cron_zone('dq_cron_occurrences', dq_cron_occurrences.timezone);
    RETURN QUERY SELECT x FROM unnest(dq__cron_between(v_spec, v_zone, dq_cron_occurrences.after,
                                                       dq_cron_occurrences.until, dq_cron_occurrences.max_count)) x;
END;
$$;
COMMENT ON FUNCTION dq_cron_occurrences(text, text, timestamptz, timestamptz, integer) IS
  'dq_cron_occurrences(schedule text <=1000 chars, timezone text IANA name default ''UTC'', after timestamptz default now(), until timestamptz default infinity (then at most 50 years ahead), max_count integer 1..10000 default 10) -> SETOF timestamptz: the instants at which the schedule fires in (after, until], earliest first, by the rules of docs/cron.md (DST gap: shifted forward; ambiguous: first instant). Changes nothing; never returns a time after 9999-12-30 UTC. Errors: 22004 NULL, 22023 bad schedule/timezone/max_count, 22008 after (or a finite until) outside 0001-01-02 .. 9999-12-30 UTC, 22001 schedule too long.';
REVOKE ALL ON FUNCTION dq_cron_occurrences(text, text, timestamptz, timestamptz, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_occurrences(text, text, timestamptz, timestamptz, integer) TO dq_admin;

-- The configuration hash of a definition: 16 hex digits of SHA-256 over a length-prefixed encoding
-- of queue, the schedule (lower case, whitespace collapsed), the zone, payload_type and payload.
-- The lookahead is not part of it: it changes how far ahead occurrences are materialised, not
-- which instants exist or what they carry, so changing it must not replace installed messages.
CREATE OR REPLACE FUNCTION dq_cron_config_hash(queue text, schedule text, timezone text, payload bytea, payload_type text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT left(encode(sha256(convert_to(format('dq-cron-v1|%s:%s|%s:%s|%s:%s|%s:%s|',
                    char_length($1), $1,
                    char_length(lower(btrim(regexp_replace($2, '\s+', ' ', 'g')))),
                    lower(btrim(regexp_replace($2, '\s+', ' ', 'g'))),
                    char_length($3), $3, char_length($5), $5), 'UTF8') || $4), 'hex'), 16)
$$;
COMMENT ON FUNCTION dq_cron_config_hash(text, text, text, bytea, text) IS
  'dq_cron_config_hash(queue, schedule, timezone, payload, payload_type) -> text: 16 hex digits of SHA-256 over the definition (schedule case- and whitespace-normalised; lookahead excluded). NULL when an argument is NULL.';
REVOKE ALL ON FUNCTION dq_cron_config_hash(text, text, text, bytea, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_config_hash(text, text, text, bytea, text) TO dq_admin;

-- ----------------------------------------------------------------------------- install_tick

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
COMMENT ON FUNCTION dq__cron_key_hash(text, text) IS
  'Internal: the config hash of an occurrence key <key_prefix>/<hash>/<epoch ms>, or NULL when key is not one of key_prefix.';
REVOKE ALL ON FUNCTION dq__cron_key_hash(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Common argument checks of dq_install_tick and dq_uninstall_tick.
CREATE OR REPLACE FUNCTION dq__cron_check_prefix(fn text, queue text, key_prefix text, config_hash text, hash_required boolean)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF queue IS NULL OR queue = '' OR char_length(queue) > 100 THEN
        PERFORM dq__raise_bad_name(fn, 'queue', queue, 100);
    END IF;
    IF key_prefix IS NULL OR key_prefix = '' OR char_length(key_prefix) > 100 THEN
        PERFORM dq__raise_bad_name(fn, 'key_prefix', key_prefix, 100);
    END IF;
    IF config_hash IS NULL AND hash_required THEN
        PERFORM dq__raise_null(fn, 'config_hash');
    END IF;
    IF config_hash = '' OR char_length(config_hash) > 64 THEN
        PERFORM dq__raise_bad_name(fn, 'config_hash', config_hash, 64);
    END IF;
    IF strpos(config_hash, '/') > 0 THEN
        RAISE EXCEPTION '%: config_hash must not contain "/"', fn USING ERRCODE = '22023';
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__cron_check_prefix(text, text, text, text, boolean) IS
  'Internal: 22004/22023/22001 for queue (<=100), key_prefix (<=100), config_hash (<=64, no "/").';
REVOKE ALL ON FUNCTION dq__cron_check_prefix(text, text, text, text, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- dq_install_tick: seed 003's installTick in one transaction.
--
--  1. Installers of one (queue, key_prefix) are serialised by a transaction-level advisory lock, so
--     two installs with different hashes cannot both keep their messages: the second one's DELETE
--     (a new statement snapshot under READ COMMITTED) sees and removes the first one's.
--  2. Messages this prefix created (cron_prefix = key_prefix: ownership is recorded on each
--     message, never guessed from its key, so an ordinary message keyed like an occurrence is never
--     touched) with another hash are deleted when they are still future occurrences
--     (scheduled_at_initially after the transaction's now()) and not in flight (no lock token). A
--     message in flight is left to its consumer (deleting it would make its ack fail and its work
--     invisible), and an occurrence already due is left to be delivered: it has happened.
--  3. Times still held by an in-flight message of another hash are not offered again under this
--     hash: one message per (prefix, instant), so a definition change never runs an instant twice.
--  4. The rest goes through dq_offer_many's body (its INSERT .. ON CONFLICT, its checks and its
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
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n        integer := coalesce(cardinality(dq_install_tick.scheduled_ats), 0);
    v_type     text := coalesce(dq_install_tick.payload_type, 'bytes');
    v_bad      bigint;
    v_dup      bigint;
    v_held     timestamptz[];
    v_keys     text[];
    v_times    timestamptz[];
    v_pays     bytea[];
    v_created  integer;
BEGIN
    PERFORM dq__cron_check_prefix('dq_install_tick', dq_install_tick.queue, dq_install_tick.key_prefix,
                                  dq_install_tick.config_hash, true);
    IF dq_install_tick.scheduled_ats IS NULL THEN
        PERFORM dq__raise_null('dq_install_tick', 'scheduled_ats');
    END IF;
    IF dq_install_tick.payloads IS NULL THEN
        PERFORM dq__raise_null('dq_install_tick', 'payloads');
    END IF;
    IF dq_install_tick.can_update IS NULL THEN
        PERFORM dq__raise_null('dq_install_tick', 'can_update');
    END IF;
    IF v_type = '' OR char_length(v_type) > 100 THEN
        PERFORM dq__raise_bad_name('dq_install_tick', 'payload_type', v_type, 100);
    END IF;
    IF array_ndims(dq_install_tick.scheduled_ats) > 1 OR array_ndims(dq_install_tick.payloads) > 1 THEN
        RAISE EXCEPTION 'dq_install_tick: arrays must be one-dimensional' USING ERRCODE = '22023';
    END IF;
    IF v_n > 100000 THEN
        RAISE EXCEPTION 'dq_install_tick: scheduled_ats has % elements, the limit is 100000', v_n USING ERRCODE = '54000';
    END IF;
    IF coalesce(cardinality(dq_install_tick.payloads), 0) <> v_n THEN
        RAISE EXCEPTION 'dq_install_tick: payloads has % elements, scheduled_ats has %',
            coalesce(cardinality(dq_install_tick.payloads), 0), v_n USING ERRCODE = '22023';
    END IF;
    SELECT min(u.i) FILTER (WHERE u.s IS NULL) INTO v_bad
      FROM unnest(dq_install_tick.scheduled_ats) WITH ORDINALITY AS u(s, i);
    IF v_bad IS NOT NULL THEN
        PERFORM dq__raise_null('dq_install_tick', format('scheduled_ats[%s]', v_bad));
    END IF;
    SELECT min(u.i) INTO v_bad FROM unnest(dq_install_tick.scheduled_ats) WITH ORDINALITY AS u(s, i)
     WHERE NOT (u.s BETWEEN dq__min_time() AND dq__max_time());
    IF v_bad IS NOT NULL THEN
        PERFORM dq__raise_bad_time('dq_install_tick', format('scheduled_ats[%s]', v_bad),
                                   dq_install_tick.scheduled_ats[array_lower(dq_install_tick.scheduled_ats, 1) + v_bad - 1]);
    END IF;
    SELECT min(u.i) INTO v_bad FROM unnest(dq_install_tick.payloads) WITH ORDINALITY AS u(p, i) WHERE u.p IS NULL;
    IF v_bad IS NOT NULL THEN
        PERFORM dq__raise_null('dq_install_tick', format('payloads[%s]', v_bad));
    END IF;
    -- One key per millisecond: two times in one millisecond would be one key.
    SELECT max(u.i) INTO v_dup
      FROM (SELECT u.i, count(*) OVER (PARTITION BY floor(extract(epoch FROM u.s) * 1000)) AS c
              FROM unnest(dq_install_tick.scheduled_ats) WITH ORDINALITY AS u(s, i)) u
     WHERE u.c > 1;
    IF v_dup IS NOT NULL THEN
        RAISE EXCEPTION 'dq_install_tick: scheduled_ats[%] repeats an earlier time (keys have millisecond resolution)', v_dup
            USING ERRCODE = '22023';
    END IF;

    PERFORM pg_advisory_xact_lock(hashtextextended('dq_install_tick' || chr(1) || dq_install_tick.queue
                                                   || chr(1) || dq_install_tick.key_prefix, 0));

    DELETE FROM dq_messages m
     WHERE m.queue = dq_install_tick.queue
       AND m.key >= (dq_install_tick.key_prefix || '/') COLLATE "C"  -- this prefix's keys only: a range
       AND m.key < (dq_install_tick.key_prefix || '0') COLLATE "C"   -- of the (queue, key) index ('0' follows '/')
       AND m.dead_from_id IS NULL
       AND m.cron_prefix = dq_install_tick.key_prefix          -- only messages this prefix created
       AND m.scheduled_at > now()
       AND m.scheduled_at_initially > now()
       AND m.lock_token IS NULL
       AND dq__cron_key_hash(m.key, dq_install_tick.key_prefix) <> dq_install_tick.config_hash;

    IF v_n = 0 THEN
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

    SELECT count(*) FILTER (WHERE o.outcome = 'created') INTO v_created
      FROM dq__offer_many('dq_install_tick', dq_install_tick.queue, v_keys, v_pays, v_times, dq_install_tick.can_update,
                          array_fill(v_type, ARRAY[cardinality(v_keys)]), dq_install_tick.key_prefix) o;
    RETURN v_created;
END;
$$;
COMMENT ON FUNCTION dq_install_tick(text, text, text, timestamptz[], bytea[], text, boolean) IS
  'dq_install_tick(queue text <=100, key_prefix text <=100, config_hash text <=64 without "/", scheduled_ats timestamptz[] <=100000 distinct milliseconds, payloads bytea[] same length, payload_type text default ''bytes'', can_update boolean default false) -> integer messages created: in one transaction, deletes the future, not-in-flight messages of other hashes that this key_prefix created in the queue (never other messages, whatever their keys), then offers key_prefix/config_hash/<epoch ms> for each time as dq_offer_many does, recording key_prefix as their owner (insert-if-absent unless can_update; an instant still held in flight by another hash is skipped). Installers of one (queue, key_prefix) serialise on an advisory lock. Call under READ COMMITTED. Errors: 22004 NULL, 22023 empty/invalid/unequal lengths/repeated millisecond, 22008 a time outside 0001-01-02 .. 9999-12-30 UTC, 22001 too long, 54000 over 100000 times or a payload over the queue''s limit.';
REVOKE ALL ON FUNCTION dq_install_tick(text, text, text, timestamptz[], bytea[], text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_install_tick(text, text, text, timestamptz[], bytea[], text, boolean) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_uninstall_tick(queue text, key_prefix text, config_hash text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_count integer;
BEGIN
    PERFORM dq__cron_check_prefix('dq_uninstall_tick', dq_uninstall_tick.queue, dq_uninstall_tick.key_prefix,
                                  dq_uninstall_tick.config_hash, false);
    PERFORM pg_advisory_xact_lock(hashtextextended('dq_install_tick' || chr(1) || dq_uninstall_tick.queue
                                                   || chr(1) || dq_uninstall_tick.key_prefix, 0));
    DELETE FROM dq_messages m
     WHERE m.queue = dq_uninstall_tick.queue
       AND m.key >= (dq_uninstall_tick.key_prefix || '/') COLLATE "C"  -- a range of the (queue, key) index
       AND m.key < (dq_uninstall_tick.key_prefix || '0') COLLATE "C"
       AND m.dead_from_id IS NULL
       AND m.cron_prefix = dq_uninstall_tick.key_prefix        -- only messages this prefix created
       AND m.scheduled_at > now()
       AND m.scheduled_at_initially > now()
       AND m.lock_token IS NULL
       AND dq__cron_key_hash(m.key, dq_uninstall_tick.key_prefix) IS NOT NULL
       AND (dq_uninstall_tick.config_hash IS NULL
            OR dq__cron_key_hash(m.key, dq_uninstall_tick.key_prefix) = dq_uninstall_tick.config_hash);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_uninstall_tick(text, text, text) IS
  'dq_uninstall_tick(queue text, key_prefix text, config_hash text default NULL = every hash) -> integer messages deleted: the future (not yet due), not-in-flight occurrence messages key_prefix/<hash>/<epoch ms> of the queue that dq_install_tick created for this key_prefix (never other messages). Occurrences already due or in flight are left to their consumers. Errors: 22004 NULL, 22023 empty or "/" in config_hash, 22001 too long.';
REVOKE ALL ON FUNCTION dq_uninstall_tick(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_uninstall_tick(text, text, text) TO dq_admin;

-- ----------------------------------------------------------------------------- named schedules

-- Install what a schedule lacks, as of p_now: the occurrences after installed_through up to
-- p_now + lookahead (at most 10000 per call: the next tick continues), and always the next
-- occurrence after p_now. The caller holds the schedule's row lock. Occurrences missed while no
-- tick ran for longer than the lookahead are not back-filled (they would all fire at once, late).
--
-- Bound: a schedule has at most dq__cron_pending_limit() (10,000) pending occurrences. When the
-- lookahead could hold more (at most cardinality(times) a local day, or one per period), the window
-- ends at the 10,000th occurrence after p_now instead of p_now + lookahead, and each tick tops it up.
--
-- Refill: dq_cancel and dq_purge record in refill_from the earliest future occurrence of this
-- schedule they deleted (dq__cron_note_deleted). The window from there is offered again (insert if
-- absent), except occurrences due within dq__cron_refill_margin() (1 minute) of the clock: an
-- occurrence that is already due may have been delivered and acknowledged (a delivered occurrence
-- leaves no trace), and only the margin guarantees that this insert cannot come after such a
-- delivery (the insert would have to be delayed past the margin).
CREATE OR REPLACE FUNCTION dq__cron_advance(p_name text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    r          dq_cron;
    v_spec     dq_cron_spec;
    v_from     timestamptz;
    v_to       timestamptz;
    v_window   timestamptz[];
    v_times    timestamptz[];
    v_refill   timestamptz[] := '{}';
    v_n        integer;
    v_through  timestamptz;
    v_created  integer := 0;
    c_limit    CONSTANT integer := dq__cron_pending_limit();
BEGIN
    SELECT * INTO r FROM dq_cron c WHERE c.name = p_name;
    IF NOT FOUND OR r.paused THEN
        RETURN 0;
    END IF;
    v_spec := dq__cron_parse('dq_cron_tick', r.schedule);
    v_to := p_now + r.lookahead;
    v_from := greatest(r.installed_through, p_now);
    IF dq__cron_max_in(v_spec, r.lookahead) > c_limit THEN
        -- The first c_limit occurrences after p_now; the window ends at the last of them when there
        -- are that many. What is still to install is their part after v_from (v_from >= p_now).
        v_window := dq__cron_between(v_spec, r.timezone, p_now, v_to, c_limit);
        v_to := coalesce(v_window[c_limit], v_to);
        v_times := ARRAY(SELECT t FROM unnest(v_window) t WHERE t > v_from ORDER BY t);
    ELSE
        v_times := dq__cron_between(v_spec, r.timezone, v_from, v_to, c_limit);
    END IF;
    IF cardinality(v_times) = 0 AND (r.last_installed_at IS NULL OR r.last_installed_at <= p_now) THEN
        v_times := dq__cron_between(v_spec, r.timezone, v_from, 'infinity', 1);
    END IF;
    v_n := cardinality(v_times);
    v_through := CASE WHEN v_n = c_limit THEN v_times[v_n] ELSE greatest(v_from, v_to, v_times[v_n]) END;
    IF r.refill_from IS NOT NULL AND r.installed_through IS NOT NULL THEN
        v_refill := dq__cron_between(v_spec, r.timezone,
                                     greatest(r.refill_from - interval '1 microsecond',
                                              clock_timestamp() + dq__cron_refill_margin()),
                                     least(r.installed_through, v_to), c_limit);
    END IF;
    v_times := ARRAY(SELECT DISTINCT t FROM unnest(v_refill || v_times) t ORDER BY t);
    v_n := cardinality(v_times);
    IF v_n > 0 THEN
        v_created := dq_install_tick(r.queue, r.name, r.config_hash, v_times,
                                     array_fill(r.payload, ARRAY[v_n]), r.payload_type, false);
    END IF;
    UPDATE dq_cron c
       SET installed_through = v_through,
           last_installed_at = greatest(r.last_installed_at, v_times[v_n]),
           next_at = coalesce((dq__cron_between(v_spec, r.timezone, v_through, 'infinity', 1))[1], 'infinity'),
           refill_from = NULL,
           last_error = NULL,
           last_error_at = NULL
     WHERE c.name = p_name;
    RETURN v_created;
END;
$$;
COMMENT ON FUNCTION dq__cron_advance(text, timestamptz) IS
  'Internal: installs the missing occurrences of one schedule (row locked by the caller) up to now + lookahead or the 10,000th pending occurrence, at least the next one, and those deleted by dq_cancel/dq_purge due more than 1 minute ahead; returns messages created.';
REVOKE ALL ON FUNCTION dq__cron_advance(text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- At most this many pending (installed, not yet due) occurrences per schedule.
CREATE OR REPLACE FUNCTION dq__cron_pending_limit() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10000 $$;
COMMENT ON FUNCTION dq__cron_pending_limit() IS 'Internal: the most pending occurrences a schedule holds (10000).';
REVOKE ALL ON FUNCTION dq__cron_pending_limit() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Occurrences deleted less than this before they are due are not offered again (see dq__cron_advance).
CREATE OR REPLACE FUNCTION dq__cron_refill_margin() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '1 minute' $$;
COMMENT ON FUNCTION dq__cron_refill_margin() IS 'Internal: deleted occurrences due within this of the clock are not offered again (1 minute).';
REVOKE ALL ON FUNCTION dq__cron_refill_margin() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

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
COMMENT ON FUNCTION dq__cron_max_in(dq_cron_spec, interval) IS
  'Internal: an upper bound of the occurrences of a parsed schedule in any window of length span.';
REVOKE ALL ON FUNCTION dq__cron_max_in(dq_cron_spec, interval) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- dq_cancel and dq_purge call this before deleting: the named schedules owning future occurrences
-- among the messages about to be deleted (queue, and key unless NULL) record the earliest of them in
-- refill_from, and the next dq_cron_tick offers them again (dq__cron_advance). The schedules' rows
-- are locked in name order before any message is touched, so the caller never holds a message lock
-- while waiting for a schedule (a tick holds the schedule, then the messages: no cycle).
CREATE OR REPLACE FUNCTION dq__cron_note_deleted(queue text, key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_names  text[];
    v_froms  timestamptz[];
BEGIN
    SELECT array_agg(o.cron_prefix ORDER BY o.cron_prefix), array_agg(o.first ORDER BY o.cron_prefix)
      INTO v_names, v_froms
      FROM (SELECT m.cron_prefix, min(m.scheduled_at_initially) AS first
              FROM dq_messages m
             WHERE m.queue = dq__cron_note_deleted.queue
               AND (dq__cron_note_deleted.key IS NULL OR m.key = dq__cron_note_deleted.key)
               AND m.cron_prefix IS NOT NULL
               AND m.scheduled_at_initially > now()
             GROUP BY m.cron_prefix) o;
    IF v_names IS NULL THEN
        RETURN;
    END IF;
    PERFORM 1 FROM dq_cron c
     WHERE c.name = ANY (v_names) AND c.queue = dq__cron_note_deleted.queue
     ORDER BY c.name
       FOR NO KEY UPDATE;
    UPDATE dq_cron c
       SET refill_from = least(coalesce(c.refill_from, d.first), d.first)
      FROM unnest(v_names, v_froms) AS d(name, first)
     WHERE c.name = d.name AND c.queue = dq__cron_note_deleted.queue AND NOT c.paused;
END;
$$;
COMMENT ON FUNCTION dq__cron_note_deleted(text, text) IS
  'Internal: before dq_cancel/dq_purge delete messages, records in their schedules the earliest future occurrence deleted, for the next tick to offer again.';
REVOKE ALL ON FUNCTION dq__cron_note_deleted(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_install(
    name          text,
    queue         text,
    schedule      text,
    payload       bytea,
    timezone      text DEFAULT 'UTC',
    payload_type  text DEFAULT NULL,
    lookahead     interval DEFAULT '1 hour')
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_type  text := coalesce(dq_cron_install.payload_type, 'bytes');
    v_spec  dq_cron_spec;
    v_zone  text;
    v_hash  text;
    r       dq_cron;
BEGIN
    IF dq_cron_install.name IS NULL OR dq_cron_install.name = '' OR char_length(dq_cron_install.name) > 100 THEN
        PERFORM dq__raise_bad_name('dq_cron_install', 'name', dq_cron_install.name, 100);
    END IF;
    IF dq_cron_install.queue IS NULL OR dq_cron_install.queue = '' OR char_length(dq_cron_install.queue) > 100 THEN
        PERFORM dq__raise_bad_name('dq_cron_install', 'queue', dq_cron_install.queue, 100);
    END IF;
    IF dq_cron_install.schedule IS NULL THEN
        PERFORM dq__raise_null('dq_cron_install', 'schedule');
    END IF;
    IF char_length(dq_cron_install.schedule) > 1000 THEN
        RAISE EXCEPTION 'dq_cron_install: schedule is % characters, the limit is 1000',
            char_length(dq_cron_install.schedule) USING ERRCODE = '22001';
    END IF;
    IF dq_cron_install.payload IS NULL THEN
        PERFORM dq__raise_null('dq_cron_install', 'payload');
    END IF;
    IF v_type = '' OR char_length(v_type) > 100 THEN
        PERFORM dq__raise_bad_name('dq_cron_install', 'payload_type', v_type, 100);
    END IF;
    IF dq_cron_install.lookahead > interval '366 days' THEN
        RAISE EXCEPTION 'dq_cron_install: lookahead is %, it must be positive and at most 366 days',
            dq_cron_install.lookahead USING ERRCODE = '22023';
    END IF;
    -- NULL (22004) and positive by its effect (22023).
    PERFORM dq__time_after('dq_cron_install', 'lookahead', dq_cron_install.lookahead, now(), false);
    IF octet_length(dq_cron_install.payload) > dq__payload_limit_floor() THEN
        PERFORM dq__check_payload_size('dq_cron_install', 'payload', dq_cron_install.queue,
                                       octet_length(dq_cron_install.payload));
    END IF;
    v_spec := dq__cron_parse('dq_cron_install', dq_cron_install.schedule);
    v_zone := dq__cron_zone('dq_cron_install', dq_cron_install.timezone);
    IF cardinality(dq__cron_between(v_spec, v_zone, now(), 'infinity', 1)) = 0 THEN
        RAISE EXCEPTION 'dq_cron_install: schedule "%" never fires (no occurrence in the next 50 years)',
            left(dq_cron_install.schedule, 60) USING ERRCODE = '22023';
    END IF;
    v_hash := dq_cron_config_hash(dq_cron_install.queue, dq_cron_install.schedule, v_zone,
                                  dq_cron_install.payload, v_type);

    -- The row lock of the schedule orders this against ticks (which skip a locked schedule) and
    -- against other installs, pauses and uninstalls of the same name.
    LOOP
        SELECT * INTO r FROM dq_cron c WHERE c.name = dq_cron_install.name FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO dq_cron (name, queue, schedule, timezone, payload, payload_type, lookahead, config_hash)
        VALUES (dq_cron_install.name, dq_cron_install.queue, dq_cron_install.schedule, v_zone,
                dq_cron_install.payload, v_type, dq_cron_install.lookahead, v_hash)
        ON CONFLICT ON CONSTRAINT dq_cron_pkey DO NOTHING;
        IF FOUND THEN
            PERFORM dq__cron_advance(dq_cron_install.name, now());
            RETURN v_hash;
        END IF;
    END LOOP;

    IF r.config_hash = v_hash THEN
        -- Same definition: nothing changes, except a new lookahead (installing further if longer).
        IF r.lookahead <> dq_cron_install.lookahead THEN
            UPDATE dq_cron c SET lookahead = dq_cron_install.lookahead, updated_at = now()
             WHERE c.name = dq_cron_install.name;
            PERFORM dq__cron_advance(dq_cron_install.name, now());
        END IF;
        RETURN v_hash;
    END IF;

    -- A new definition replaces every future occurrence of the old one, in this transaction.
    IF r.queue <> dq_cron_install.queue THEN
        PERFORM dq_uninstall_tick(r.queue, dq_cron_install.name, NULL);
    END IF;
    UPDATE dq_cron c
       SET queue = dq_cron_install.queue, schedule = dq_cron_install.schedule, timezone = v_zone,
           payload = dq_cron_install.payload, payload_type = v_type, lookahead = dq_cron_install.lookahead,
           config_hash = v_hash, installed_through = NULL, last_installed_at = NULL, next_at = NULL,
           refill_from = NULL, last_error = NULL, last_error_at = NULL, updated_at = now()
     WHERE c.name = dq_cron_install.name;
    IF r.paused THEN
        PERFORM dq_uninstall_tick(dq_cron_install.queue, dq_cron_install.name, NULL);
    ELSE
        PERFORM dq__cron_advance(dq_cron_install.name, now());
    END IF;
    RETURN v_hash;
END;
$$;
COMMENT ON FUNCTION dq_cron_install(text, text, text, bytea, text, text, interval) IS
  'dq_cron_install(name text <=100, queue text <=100, schedule text <=1000 (cron, @macro, every <interval>, daily at HH:MM[:SS][, ...]), payload bytea, timezone text IANA default ''UTC'', payload_type text default ''bytes'', lookahead interval (0, 366 days] default 1 hour) -> text config hash: creates or replaces the named schedule and installs its occurrences up to now + lookahead (at least the next one) as messages <name>/<hash>/<epoch ms> owned by the schedule (at most 10,000 pending: the window ends at the 10,000th occurrence when the lookahead would hold more). The same definition again changes nothing (a new lookahead only is stored); a changed one replaces every future occurrence it owns in this transaction (never other messages); a paused schedule stays paused. Errors: 22004 NULL, 22023 bad schedule/timezone/lookahead or never fires, 22001 too long, 54000 payload over the queue''s max_payload_bytes.';
REVOKE ALL ON FUNCTION dq_cron_install(text, text, text, bytea, text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_install(text, text, text, bytea, text, text, interval) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_install(
    name          text,
    queue         text,
    schedule      text,
    payload       jsonb,
    timezone      text DEFAULT 'UTC',
    payload_type  text DEFAULT NULL,
    lookahead     interval DEFAULT '1 hour')
RETURNS text
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT dq_cron_install($1, $2, $3, convert_to($4::text, 'UTF8'), $5, coalesce($6, 'json'), $7) $$;
COMMENT ON FUNCTION dq_cron_install(text, text, text, jsonb, text, text, interval) IS
  'dq_cron_install with a jsonb payload: stored as its UTF-8 text, payload_type ''json'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_cron_install(text, text, text, jsonb, text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_install(text, text, text, jsonb, text, text, interval) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_install(
    name          text,
    queue         text,
    schedule      text,
    payload       text,
    timezone      text DEFAULT 'UTC',
    payload_type  text DEFAULT NULL,
    lookahead     interval DEFAULT '1 hour')
RETURNS text
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT dq_cron_install($1, $2, $3, convert_to($4, 'UTF8'), $5, coalesce($6, 'text'), $7) $$;
COMMENT ON FUNCTION dq_cron_install(text, text, text, text, text, text, interval) IS
  'dq_cron_install with a text payload (also what an untyped literal resolves to): stored as UTF-8, payload_type ''text'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_cron_install(text, text, text, text, text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_install(text, text, text, text, text, text, interval) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_uninstall(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_queue text;
BEGIN
    IF dq_cron_uninstall.name IS NULL OR dq_cron_uninstall.name = '' OR char_length(dq_cron_uninstall.name) > 100 THEN
        PERFORM dq__raise_bad_name('dq_cron_uninstall', 'name', dq_cron_uninstall.name, 100);
    END IF;
    DELETE FROM dq_cron c WHERE c.name = dq_cron_uninstall.name RETURNING c.queue INTO v_queue;
    IF v_queue IS NULL THEN
        RETURN false;
    END IF;
    PERFORM dq_uninstall_tick(v_queue, dq_cron_uninstall.name, NULL);
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_cron_uninstall(text) IS
  'dq_cron_uninstall(name text) -> boolean: removes the schedule and its future (not yet due, not in flight) occurrence messages; false when no schedule has that name. Errors: 22004/22023/22001 name.';
REVOKE ALL ON FUNCTION dq_cron_uninstall(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_uninstall(text) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_pause(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_queue text;
BEGIN
    IF dq_cron_pause.name IS NULL OR dq_cron_pause.name = '' OR char_length(dq_cron_pause.name) > 100 THEN
        PERFORM dq__raise_bad_name('dq_cron_pause', 'name', dq_cron_pause.name, 100);
    END IF;
    UPDATE dq_cron c
       SET paused = true, installed_through = NULL, last_installed_at = NULL, next_at = NULL, refill_from = NULL,
           updated_at = CASE WHEN c.paused THEN c.updated_at ELSE now() END
     WHERE c.name = dq_cron_pause.name
    RETURNING c.queue INTO v_queue;
    IF v_queue IS NULL THEN
        RETURN false;
    END IF;
    PERFORM dq_uninstall_tick(v_queue, dq_cron_pause.name, NULL);
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_cron_pause(text) IS
  'dq_cron_pause(name text) -> boolean: stops the schedule and deletes its future (not yet due, not in flight) occurrences; occurrences falling while paused are never installed. false when no schedule has that name. Errors: 22004/22023/22001 name.';
REVOKE ALL ON FUNCTION dq_cron_pause(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_pause(text) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_resume(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_paused boolean;
BEGIN
    IF dq_cron_resume.name IS NULL OR dq_cron_resume.name = '' OR char_length(dq_cron_resume.name) > 100 THEN
        PERFORM dq__raise_bad_name('dq_cron_resume', 'name', dq_cron_resume.name, 100);
    END IF;
    SELECT c.paused INTO v_paused FROM dq_cron c WHERE c.name = dq_cron_resume.name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_paused THEN
        UPDATE dq_cron c SET paused = false, updated_at = now() WHERE c.name = dq_cron_resume.name;
        PERFORM dq__cron_advance(dq_cron_resume.name, now());
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_cron_resume(text) IS
  'dq_cron_resume(name text) -> boolean: restarts a paused schedule from now (no catch-up of what fell while paused) and installs its occurrences at once; true for an active schedule too (nothing changes); false when no schedule has that name. Errors: 22004/22023/22001 name.';
REVOKE ALL ON FUNCTION dq_cron_resume(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_resume(text) TO dq_admin;

-- dq_cron_tick: install what every active schedule lacks.
--
-- Cheap when there is nothing to do: a schedule needs work only when its next uninstalled occurrence
-- (next_at) falls within now + lookahead, or when its last installed occurrence has passed (so that
-- at least the next one is always installed), or when dq_cancel/dq_purge deleted some of its future
-- occurrences (refill_from); that is one comparison per row, no evaluation.
-- Concurrency: the schedules needing work are locked FOR NO KEY UPDATE SKIP LOCKED, so concurrent
-- ticks never wait for each other nor fail: each schedule is advanced by exactly one of them, and a
-- schedule being changed by dq_cron_install/pause/uninstall is skipped (that call installs itself).
-- Even without the locks an occurrence could not be offered twice: its key is unique per queue.
-- Call it under READ COMMITTED (the default; pg_cron's jobs do).
-- Isolation: one schedule that fails (a time zone tzdata no longer has, a payload over a lowered
-- limit) does not stop the others. The whole pass runs in one subtransaction (not one per schedule:
-- more than 64 subtransactions in a transaction slow every session's snapshots); when a schedule
-- fails, the pass is rolled back, the schedule is recorded (WARNING, last_error, last_error_at) and
-- the pass runs again without it. A later tick tries it again; success clears last_error.
CREATE OR REPLACE FUNCTION dq_cron_tick()
RETURNS integer
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now      timestamptz := now();
    v_name     text;
    v_current  text;
    v_failed   text[] := '{}';
    v_created  integer;
    v_error    text;
BEGIN
    LOOP
        v_created := 0;
        v_current := NULL;
        BEGIN
            FOR v_name IN
                SELECT c.name FROM dq_cron c
                 WHERE NOT c.paused
                   AND (c.next_at IS NULL
                        OR c.next_at <= v_now + c.lookahead
                        OR (c.last_installed_at <= v_now AND c.next_at < 'infinity')
                        OR c.refill_from IS NOT NULL)
                   AND NOT (c.name = ANY (v_failed))
                 ORDER BY c.name
                   FOR NO KEY UPDATE SKIP LOCKED
            LOOP
                v_current := v_name;
                v_created := v_created + dq__cron_advance(v_name, v_now);
                v_current := NULL;
            END LOOP;
            RETURN v_created;
        EXCEPTION WHEN OTHERS THEN
            IF v_current IS NULL THEN
                RAISE;  -- not a schedule's failure
            END IF;
            GET STACKED DIAGNOSTICS v_error = MESSAGE_TEXT;
            v_failed := v_failed || v_current;
        END;
        RAISE WARNING 'dq_cron_tick: schedule % failed and was skipped: %', v_current, v_error;
        UPDATE dq_cron c SET last_error = left(v_error, 10000), last_error_at = clock_timestamp()
         WHERE c.name = v_current;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION dq_cron_tick() IS
  'dq_cron_tick() -> integer messages created: for every active schedule, installs its occurrences in (now, now + lookahead] not yet installed (at most 10,000 pending per schedule; the next call continues), always at least the next one, and again those deleted by dq_cancel/dq_purge that are due more than 1 minute ahead. A schedule that fails is skipped with a WARNING and its last_error set; the others are installed. Concurrent calls never block each other nor duplicate an occurrence (FOR NO KEY UPDATE SKIP LOCKED; unique keys). Run every minute by the pg_cron job dq-cron-tick. Call under READ COMMITTED.';
REVOKE ALL ON FUNCTION dq_cron_tick() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_tick() TO dq_admin;

-- The next occurrences of a stored schedule, or NULL when it cannot be evaluated (a zone that
-- tzdata no longer has): one broken schedule must not hide the others from dq_cron_schedules (its
-- error is in last_error once a tick has tried it). The exception block costs a subtransaction per
-- schedule listed; this is an operator's read, not a hot path.
CREATE OR REPLACE FUNCTION dq__cron_next(schedule text, timezone text, max_count integer)
RETURNS timestamptz[]
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN dq__cron_between(dq__cron_parse('dq_cron_schedules', schedule), timezone, now(), 'infinity', max_count);
EXCEPTION WHEN data_exception OR invalid_parameter_value THEN
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION dq__cron_next(text, text, integer) IS
  'Internal: the next max_count occurrences of a stored schedule after now, NULL when it cannot be evaluated.';
REVOKE ALL ON FUNCTION dq__cron_next(text, text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The schedules with their next occurrences, for dq_cron_schedules. SECURITY DEFINER (granted to
-- dq_admin): the evaluation calls internal functions that no application role may execute, and a
-- view checks the functions it calls against the role that reads it (PostgreSQL manual, CREATE VIEW).
CREATE OR REPLACE FUNCTION dq_cron_list()
RETURNS TABLE (name text, queue text, schedule text, timezone text, payload_type text, lookahead interval,
               config_hash text, paused boolean, next_occurrences timestamptz[], installed_through timestamptz,
               last_installed_at timestamptz, next_uninstalled_at timestamptz, created_at timestamptz,
               updated_at timestamptz, last_error text, last_error_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
SELECT c.name, c.queue, c.schedule, c.timezone, c.payload_type, c.lookahead, c.config_hash, c.paused,
       CASE WHEN NOT c.paused THEN dq__cron_next(c.schedule, c.timezone, 5) END,
       c.installed_through, c.last_installed_at, c.next_at, c.created_at, c.updated_at, c.last_error, c.last_error_at
  FROM dq_cron c
 ORDER BY c.name
$$;
COMMENT ON FUNCTION dq_cron_list() IS
  'dq_cron_list() -> the named schedules (the rows of the view dq_cron_schedules): definition, paused, next 5 occurrences after now (NULL when paused), the tick''s bookkeeping and the last evaluation error. Role dq_admin.';
REVOKE ALL ON FUNCTION dq_cron_list() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_list() TO dq_admin;

CREATE OR REPLACE VIEW dq_cron_schedules AS
SELECT l.name, l.queue, l.schedule, l.timezone, l.payload_type, l.lookahead, l.config_hash, l.paused,
       l.next_occurrences, l.installed_through, l.last_installed_at, l.next_uninstalled_at, l.created_at,
       l.updated_at, l.last_error, l.last_error_at
  FROM dq_cron_list() l;
COMMENT ON VIEW dq_cron_schedules IS
  'The named schedules (dq_cron_install) with their next 5 occurrences after now (NULL when paused or when the schedule cannot be evaluated), the tick''s bookkeeping (installed_through, last_installed_at, next_uninstalled_at) and the last evaluation error (last_error, last_error_at; cleared by the next successful tick).';
-- Reading it is an operator's business (the view runs with its owner's rights).
REVOKE ALL ON dq_cron_schedules FROM PUBLIC;
GRANT SELECT ON dq_cron_schedules TO dq_admin;

-- pg_cron hygiene. pg_cron writes one cron.job_run_details row per run and never deletes any
-- (pg_cron issue 416; "cron.log_run" turns logging off server-wide, losing the record of failures).
-- dq-cron-tick alone adds 1,440 rows a day. This deletes the rows of the jobs our migrations
-- register (dq-cron-tick, dq-archive-prune, dq-cron-prune-history) that ended more than `keep`
-- ago; other jobs' rows are left alone. Migration 0007 runs it daily through the pg_cron job
-- dq-cron-prune-history, so our jobs keep at most `keep` of history (about 10,300 rows at 7 days).
-- Rows of a run that never ended (the server stopped mid-run) count from their start_time.
-- Safe to run concurrently: two runs delete disjoint or already-deleted rows (a DELETE skips rows
-- deleted by a concurrent committed transaction under READ COMMITTED). SECURITY DEFINER (as the
-- migrating role, owner of the jobs: pg_cron's row security shows a role its own runs).
CREATE OR REPLACE FUNCTION dq_cron_prune_run_details(keep interval DEFAULT '7 days')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_count bigint;
BEGIN
    IF keep IS NULL THEN
        PERFORM dq__raise_null('dq_cron_prune_run_details', 'keep');
    END IF;
    IF keep < interval '0' THEN
        RAISE EXCEPTION 'dq_cron_prune_run_details: keep is %, it must not be negative', keep
            USING ERRCODE = '22023';
    END IF;
    IF to_regclass('cron.job_run_details') IS NULL THEN
        RAISE NOTICE 'dq_cron_prune_run_details: pg_cron is not installed in this database; nothing to prune';
        RETURN 0;
    END IF;
    DELETE FROM cron.job_run_details d
     USING cron.job j
     WHERE d.jobid = j.jobid
       AND j.jobname IN ('dq-cron-tick', 'dq-archive-prune', 'dq-cron-prune-history')
       AND coalesce(d.end_time, d.start_time) < now() - keep;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_cron_prune_run_details(interval) IS
  'dq_cron_prune_run_details(keep interval >= 0 default 7 days) -> bigint rows deleted: deletes cron.job_run_details rows of our pg_cron jobs (dq-cron-tick, dq-archive-prune, dq-cron-prune-history) that ended more than keep ago; other jobs'' rows are untouched. Returns 0 with a NOTICE when pg_cron is not installed here. Run daily by the pg_cron job dq-cron-prune-history (migration 0007). Errors: 22004 keep NULL, 22023 keep negative. Source: pg_cron issue 416 (job_run_details grows without bound).';
REVOKE ALL ON FUNCTION dq_cron_prune_run_details(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_prune_run_details(interval) TO dq_admin;
