-- Recurring messages, part 1: parsing a schedule and naming a configuration.
--
-- An occurrence of a recurring message is an ordinary delayed message whose key is
-- '<key_prefix>/<config_hash>/<epoch milliseconds>'. The unique (queue, key) makes every install
-- idempotent, so any number of installers (pg_cron, CronTicker threads, `pyqueue cron tick`) may
-- run without a leader: the first insert of an occurrence wins, the others are ignored.
--
-- The files of recurring messages, each using only what the earlier ones define:
--  200_cron_parse        schedule syntax (dq__cron_parse), time zones, the configuration hash
--  210_cron_occurrences  the instants a schedule fires at, with the DST rules (dq_cron_occurrences)
--  220_cron_install_tick occurrence messages of one key prefix (dq_install_tick, dq_uninstall_tick)
--  230_cron_schedules    named schedules (table dq_cron, migrations/0005_cron.sql): dq_cron_install,
--                        dq_cron_uninstall, dq_cron_pause, dq_cron_resume, the view dq_cron_schedules
--  240_cron_tick         dq_cron_tick(), which installs what every schedule lacks
--  250_cron_pg_cron      the pg_cron jobs of an install and the pruning of their run history
--
-- Schedules: 5-field cron (Vixie semantics), 'every <interval>' (multiples of the interval since
-- the Unix epoch), 'daily at HH:MM[:SS][, ...]'; local times in an IANA zone. docs/cron.md.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- ----------------------------------------------------------------------------- parsing

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- One cron field: a comma list of '*', 'N', 'A-B', each optionally '/STEP', numbers or names.
-- Returns the sorted distinct values. `what` names the field in error messages.
CREATE OR REPLACE FUNCTION dq__cron_field(fn text, field text, what text, lo integer, hi integer, names text[])
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT
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
    v_msg   text;  -- what is wrong, raised once below
BEGIN
    FOREACH v_item IN ARRAY string_to_array(field, ',') LOOP
        v_m := regexp_match(v_item, '^(\*|([a-z]{3}|[0-9]{1,4})(-([a-z]{3}|[0-9]{1,4}))?)(/([0-9]{1,4}))?$');
        IF v_m IS NULL THEN
            v_msg := format('%s: schedule: %s field "%s" is not a list of values, ranges (a-b) and steps (*/n, a-b/n)',
                            fn, what, field);
            EXIT;
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
                v_msg := format('%s: schedule: %s field "%s": unknown name "%s"', fn, what, field, v_part);
                EXIT;
            END IF;
        END LOOP;
        EXIT WHEN v_msg IS NOT NULL;
        IF v_m[1] = '*' THEN
            v_a := lo;
            v_b := CASE WHEN what = 'day-of-week' THEN 6 ELSE hi END;
        ELSE
            v_a := v_vals[1];
            -- 'a/n' runs to the end of the field (day-of-week: to Saturday, 7 would repeat Sunday).
            v_b := coalesce(v_vals[2], CASE WHEN v_m[6] IS NULL THEN v_a
                                            WHEN what = 'day-of-week' THEN 6 ELSE hi END);
        END IF;
        v_step := coalesce(v_m[6]::integer, 1);
        v_msg := CASE WHEN v_a < lo OR v_a > hi OR v_b < lo OR v_b > hi
                      THEN format('%s: schedule: %s field "%s" is out of range %s-%s', fn, what, field, lo, hi)
                      WHEN v_a > v_b
                      THEN format('%s: schedule: %s field "%s": range %s-%s is backwards', fn, what, field, v_a, v_b)
                      WHEN v_step < 1
                      THEN format('%s: schedule: %s field "%s": step must be at least 1', fn, what, field) END;
        EXIT WHEN v_msg IS NOT NULL;
        v_out := v_out || ARRAY(SELECT g FROM generate_series(v_a, v_b, v_step) g);
    END LOOP;
    IF v_msg IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = v_msg;
    END IF;
    IF what = 'day-of-week' THEN
        v_out := ARRAY(SELECT CASE WHEN x = 7 THEN 0 ELSE x END FROM unnest(v_out) x);  -- 7 is Sunday too
    END IF;
    RETURN ARRAY(SELECT DISTINCT x FROM unnest(v_out) x ORDER BY x);
END;
$$;
COMMENT ON FUNCTION dq__cron_field(text, text, text, integer, integer, text[]) IS 'Internal: the sorted values of one cron field (lists, ranges, steps, names); 22023 naming schedule on bad syntax.';
REVOKE ALL ON FUNCTION dq__cron_field(text, text, text, integer, integer, text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- 'every <interval>' (what follows 'every '): the parsed schedule, or NULL and what is wrong.
CREATE OR REPLACE FUNCTION dq__cron_parse_every(fn text, every text, OUT spec dq_cron_spec, OUT error text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT
AS $$
DECLARE
    v_iv  interval;
    v_ms  numeric;
BEGIN
    BEGIN
        v_iv := every::interval;
    EXCEPTION WHEN data_exception THEN
        error := format('%s: schedule: "every" needs an interval such as ''15 minutes'', got "%s"', fn, left(every, 60));
        RETURN;
    END;
    v_ms := extract(epoch FROM v_iv) * 1000;
    error := CASE WHEN extract(year FROM v_iv) <> 0 OR extract(month FROM v_iv) <> 0
                  THEN format('%s: schedule: "every %s" has months or years, which have no fixed length (use a cron '
                              'expression)', fn, every)
                  WHEN v_ms <= 0 THEN format('%s: schedule: "every %s" is not positive', fn, every)
                  WHEN v_ms < 1000 OR v_ms <> trunc(v_ms)
                  THEN format('%s: schedule: "every %s" must be at least 1 second and a whole number of milliseconds',
                              fn, every) END;
    IF error IS NULL THEN
        spec.kind := 'every';
        spec.period_ms := v_ms::bigint;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__cron_parse_every(text, text) IS 'Internal: the parsed schedule of ''every <interval>'' (given what follows ''every ''), or NULL and the message of what is wrong.';
REVOKE ALL ON FUNCTION dq__cron_parse_every(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- 'daily at HH:MM[:SS][, ...]' (what follows 'daily at '): the parsed schedule, or NULL and what is wrong.
CREATE OR REPLACE FUNCTION dq__cron_parse_daily(fn text, times text, OUT spec dq_cron_spec, OUT error text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT
AS $$
DECLARE
    v_item   text;
    v_m      text[];
    v_times  interval[] := '{}';
BEGIN
    FOREACH v_item IN ARRAY string_to_array(times, ',') LOOP
        v_m := regexp_match(btrim(v_item), '^([0-9]{1,2}):([0-9]{2})(:([0-9]{2}))?$');
        IF v_m IS NULL OR v_m[1]::integer > 23 OR v_m[2]::integer > 59 OR coalesce(v_m[4]::integer, 0) > 59 THEN
            error := format('%s: schedule: "daily at" needs times HH:MM or HH:MM:SS (00:00 to 23:59:59), got "%s"',
                            fn, left(btrim(v_item), 40));
            RETURN;
        END IF;
        v_times := v_times || make_interval(hours => v_m[1]::integer, mins => v_m[2]::integer,
                                            secs => coalesce(v_m[4]::integer, 0));
    END LOOP;
    spec.kind := 'daily';
    spec.months := ARRAY(SELECT generate_series(1, 12));
    spec.doms := ARRAY(SELECT generate_series(1, 31));
    spec.dows := ARRAY(SELECT generate_series(0, 6));
    spec.dom_star := true;
    spec.dow_star := true;
    spec.times := ARRAY(SELECT DISTINCT t FROM unnest(v_times) t ORDER BY t);
END;
$$;
COMMENT ON FUNCTION dq__cron_parse_daily(text, text) IS 'Internal: the parsed schedule of ''daily at HH:MM[:SS][, ...]'' (given what follows ''daily at ''), or NULL and the message of what is wrong.';
REVOKE ALL ON FUNCTION dq__cron_parse_daily(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A schedule's parsed form (type dq_cron_spec, migrations/0005_cron.sql). 22023 naming `schedule`
-- and what is wrong; `fn` is the public function reported in the message.
CREATE OR REPLACE FUNCTION dq__cron_parse(fn text, schedule text)
RETURNS dq_cron_spec
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT
AS $$
DECLARE
    v_s       text := lower(btrim(regexp_replace(schedule, '\s+', ' ', 'g')));
    v_f       text[];
    v_spec    dq_cron_spec;
    v_part    record;
    v_msg     text;  -- what is wrong, raised once below
    v_hours   integer[];
    v_minutes integer[];
BEGIN
    IF left(v_s, 1) = '@' THEN
        v_s := CASE v_s
                   WHEN '@hourly' THEN '0 * * * *'
                   WHEN '@daily' THEN '0 0 * * *'
                   WHEN '@midnight' THEN '0 0 * * *'
                   WHEN '@weekly' THEN '0 0 * * 0'
                   WHEN '@monthly' THEN '0 0 1 * *'
                   WHEN '@yearly' THEN '0 0 1 1 *'
                   WHEN '@annually' THEN '0 0 1 1 *'
               END;  -- NULL: not a macro
    END IF;
    IF v_s = '' THEN
        v_msg := format('%s: schedule must not be empty', fn);
    ELSIF v_s IS NULL THEN
        v_msg := format('%s: schedule: unknown macro "%s" (use @hourly, @daily, @weekly, @monthly, @yearly or '
                        '@annually)', fn, left(btrim(schedule), 40));
    ELSIF v_s LIKE 'every %' THEN
        v_part := dq__cron_parse_every(fn, substr(v_s, 7));
        v_spec := v_part.spec;
        v_msg := v_part.error;
    ELSIF v_s LIKE 'daily at %' THEN
        v_part := dq__cron_parse_daily(fn, substr(v_s, 10));
        v_spec := v_part.spec;
        v_msg := v_part.error;
    ELSE
        v_f := string_to_array(v_s, ' ');
        IF cardinality(v_f) <> 5 THEN
            v_msg := format('%s: schedule "%s" has %s fields; a cron expression has 5 (minute hour day-of-month month '
                            'day-of-week), or use @daily, "every <interval>", "daily at HH:MM"', fn,
                            left(btrim(schedule), 60), cardinality(v_f));
        ELSE
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
        END IF;
    END IF;
    IF v_msg IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = v_msg;
    END IF;
    RETURN v_spec;
END;
$$;
COMMENT ON FUNCTION dq__cron_parse(text, text) IS 'Internal: parses a schedule (5-field cron, @macros, every <interval>, daily at HH:MM[:SS][, ...]) into dq_cron_spec; 22023 naming schedule on bad syntax.';
REVOKE ALL ON FUNCTION dq__cron_parse(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The canonical IANA name of a zone (as listed by pg_timezone_names, matched case-insensitively).
-- POSIX strings ('UTC+3', 'EST5EDT,M3.2.0,M11.1.0') and abbreviations ('PST') are not zones.
-- pg_timezone_names reads every zone file (50-80 ms a call), so only installs and previews call
-- this, and a name stored by an earlier install (checked then, and canonical) or 'UTC' is taken
-- as it is: installing 1,000 schedules in a few zones reads the zone files a few times.
CREATE OR REPLACE FUNCTION dq__cron_zone(fn text, timezone text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_error    jsonb;
    v_name text;
BEGIN
    IF timezone = 'UTC' OR EXISTS (SELECT 1 FROM dq_cron c WHERE c.timezone = dq__cron_zone.timezone) THEN
        RETURN timezone;
    END IF;
    IF char_length(timezone) BETWEEN 1 AND 100 THEN  -- no zone's name is longer
        SELECT z.name INTO v_name FROM pg_timezone_names z
         WHERE lower(z.name) = lower(timezone) ORDER BY z.name = timezone DESC, z.name LIMIT 1;
    END IF;
    IF v_name IS NULL THEN
        v_error := CASE WHEN timezone IS NULL THEN dq__null_error(fn, 'timezone')
                        ELSE dq__error('22023', format('%s: timezone "%s" is not an IANA time zone name (such as UTC or '
                                                       'Europe/Berlin)', fn, left(timezone, 100))) END;
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN v_name;
END;
$$;
COMMENT ON FUNCTION dq__cron_zone(text, text) IS 'Internal: the canonical IANA name of timezone (pg_timezone_names, case-insensitive); 22004 NULL, 22023 unknown.';
REVOKE ALL ON FUNCTION dq__cron_zone(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A definition given to a public function (dq_cron_install, dq_cron_occurrences): the parsed
-- schedule and the canonical zone, or the first error (class 22: 22004, 22023, 22001) as
-- {"sqlstate", "message"[, "hint"]} for that function to raise itself, so the error's context
-- names only the function the user called. The parser raises deep inside its helpers; the block
-- with an exception handler is a subtransaction without writes (no transaction id is assigned),
-- entered only by installs and previews. A schedule that never fires (no occurrence in the next
-- 50 years, such as 30 February) is an error too (22023).
CREATE OR REPLACE FUNCTION dq__cron_definition(fn text, schedule text, timezone text,
                                               OUT spec dq_cron_spec, OUT zone text, OUT error jsonb)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_state text;
    v_msg   text;
    v_hint  text;
BEGIN
    BEGIN
        spec := dq__cron_parse(fn, schedule);
        zone := dq__cron_zone(fn, timezone);
    EXCEPTION WHEN data_exception THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
        spec := NULL;
        zone := NULL;
        error := jsonb_strip_nulls(jsonb_build_object('sqlstate', v_state, 'message', v_msg, 'hint', nullif(v_hint, '')));
        RETURN;
    END;
    IF cardinality(dq__cron_between(spec, zone, dq__now(), 'infinity', 1)) = 0 THEN
        spec := NULL;
        zone := NULL;
        error := dq__error('22023', format('%s: schedule "%s" never fires (no occurrence in the next 50 years)', fn,
                                           left(schedule, 60)));
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__cron_definition(text, text, text) IS 'Internal: (spec, zone, NULL) for a valid schedule and timezone that fires, else (NULL, NULL, the error as {"sqlstate", "message"[, "hint"]}) naming fn.';
REVOKE ALL ON FUNCTION dq__cron_definition(text, text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);


-- The configuration hash of a definition: 16 hex digits of SHA-256 over a length-prefixed encoding
-- of queue, the schedule (lower case, whitespace collapsed), the zone, payload_type and payload (a
-- json payload in jsonb's text form: key order and spacing do not count).
-- The lookahead is not part of it: it changes how far ahead occurrences are materialised, not
-- which instants exist or what they carry, so changing it must not replace installed messages.
CREATE OR REPLACE FUNCTION dq_cron_config_hash(queue text, schedule text, timezone text, payload bytea, payload_type text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT SECURITY DEFINER SET search_path FROM CURRENT
-- STRICT: NULL for a NULL argument (format() would hash it as '').
AS $$
    SELECT left(encode(sha256(convert_to(format('dq-cron-v1|%s:%s|%s:%s|%s:%s|%s:%s|',
                    char_length($1), $1,
                    char_length(lower(btrim(regexp_replace($2, '\s+', ' ', 'g')))),
                    lower(btrim(regexp_replace($2, '\s+', ' ', 'g'))),
                    char_length($3), $3, char_length($5), $5), 'UTF8')
                    || CASE WHEN $5 = 'json' THEN convert_to(convert_from($4, 'UTF8')::jsonb::text, 'UTF8') ELSE $4 END),
               'hex'), 16)
$$;
COMMENT ON FUNCTION dq_cron_config_hash(text, text, text, bytea, text) IS 'dq_cron_config_hash(queue, schedule, timezone, payload, payload_type) -> text: the config hash of a schedule''s definition, 16 hex digits of SHA-256; NULL when an argument is NULL. Errors: 22P02/22021 for a json payload that is not UTF-8 JSON.';
REVOKE ALL ON FUNCTION dq_cron_config_hash(text, text, text, bytea, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_config_hash(text, text, text, bytea, text) TO dq_admin;


-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
