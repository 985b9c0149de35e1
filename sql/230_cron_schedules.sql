-- Recurring messages, part 4: named schedules (table dq_cron, migrations/0005_cron.sql).
-- dq_cron_install, dq_cron_uninstall, dq_cron_pause and dq_cron_resume manage them; each installs or
-- removes the schedule's occurrences at once, through dq_install_tick / dq_uninstall_tick.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
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
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
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
                                              dq__clock() + dq__cron_refill_margin()),
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
COMMENT ON FUNCTION dq__cron_advance(text, timestamptz) IS 'Internal: installs the missing occurrences of one schedule (row locked by the caller) up to now + lookahead or the 10,000th pending occurrence, at least the next one, and those deleted by dq_cancel/dq_purge due more than 1 minute ahead; returns messages created.';
REVOKE ALL ON FUNCTION dq__cron_advance(text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
-- dq_cancel and dq_purge call this before deleting: the named schedules owning future occurrences
-- among the messages about to be deleted (queue, and key unless NULL) record the earliest of them in
-- refill_from, and the next dq_cron_tick offers them again (dq__cron_advance). The schedules' rows
-- are locked in name order before any message is touched, so the caller never holds a message lock
-- while waiting for a schedule (a tick holds the schedule, then the messages: no cycle).
CREATE OR REPLACE FUNCTION dq__cron_note_deleted(queue text, key text)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
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
               AND m.scheduled_at_initially > dq__now()
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
COMMENT ON FUNCTION dq__cron_note_deleted(text, text) IS 'Internal: before dq_cancel/dq_purge delete messages, records in their schedules the earliest future occurrence deleted, for the next tick to offer again.';
REVOKE ALL ON FUNCTION dq__cron_note_deleted(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
-- Store a checked definition under the schedule's name and install its occurrences:
-- 'installed' (a new schedule), 'unchanged' (the same definition: nothing changes), 'lookahead'
-- (the same definition with another lookahead: stored, installing further if longer) or 'replaced'
-- (a new definition replaces every future occurrence of the old one, in this transaction; a paused
-- schedule stays paused, its occurrences removed). The row lock of the schedule (FOR UPDATE, or the
-- insert of a new one) orders this against ticks (which skip a locked schedule) and against other
-- installs, pauses and uninstalls of the same name.
CREATE OR REPLACE FUNCTION dq__cron_store(name text, queue text, schedule text, timezone text, payload bytea,
                                          payload_type text, lookahead interval, config_hash text)
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    r  dq_cron;
BEGIN
    LOOP
        SELECT * INTO r FROM dq_cron c WHERE c.name = name FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO dq_cron (name, queue, schedule, timezone, payload, payload_type, lookahead, config_hash)
        VALUES (name, queue, schedule, timezone, payload, payload_type, lookahead, config_hash)
        ON CONFLICT ON CONSTRAINT dq_cron_pkey DO NOTHING;
        IF FOUND THEN
            PERFORM dq__cron_advance(name, dq__now());
            RETURN 'installed';
        END IF;
    END LOOP;
    IF r.config_hash = config_hash AND r.lookahead = lookahead THEN
        RETURN 'unchanged';
    ELSIF r.config_hash = config_hash THEN
        UPDATE dq_cron c SET lookahead = dq__cron_store.lookahead, updated_at = dq__now() WHERE c.name = name;
        PERFORM dq__cron_advance(name, dq__now());
        RETURN 'lookahead';
    END IF;
    IF r.queue <> queue THEN
        PERFORM dq_uninstall_tick(r.queue, name, NULL);
    END IF;
    UPDATE dq_cron c
       SET queue = dq__cron_store.queue, schedule = dq__cron_store.schedule, timezone = dq__cron_store.timezone,
           payload = dq__cron_store.payload, payload_type = dq__cron_store.payload_type,
           lookahead = dq__cron_store.lookahead, config_hash = dq__cron_store.config_hash, installed_through = NULL,
           last_installed_at = NULL, next_at = NULL, refill_from = NULL, last_error = NULL, last_error_at = NULL,
           updated_at = dq__now()
     WHERE c.name = name;
    IF r.paused THEN
        PERFORM dq_uninstall_tick(queue, name, NULL);
    ELSE
        PERFORM dq__cron_advance(name, dq__now());
    END IF;
    RETURN 'replaced';
END;
$$;
COMMENT ON FUNCTION dq__cron_store(text, text, text, text, bytea, text, interval, text) IS 'Internal: creates or replaces a named schedule and installs its occurrences (dq_cron_install); returns installed, unchanged, lookahead or replaced.';
REVOKE ALL ON FUNCTION dq__cron_store(text, text, text, text, bytea, text, interval, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The next occurrences of a stored schedule, or NULL when it cannot be evaluated (a zone that
-- tzdata no longer has): one broken schedule must not hide the others from dq_cron_schedules (its
-- error is in last_error once a tick has tried it). The exception block costs a subtransaction per
-- schedule listed; this is an operator's read, not a hot path.
CREATE OR REPLACE FUNCTION dq__cron_next(schedule text, timezone text, max_count integer)
RETURNS timestamptz[]
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN dq__cron_between(dq__cron_parse('dq_cron_schedules', schedule), timezone, dq__now(), 'infinity', max_count);
EXCEPTION WHEN data_exception OR invalid_parameter_value THEN
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION dq__cron_next(text, text, integer) IS 'Internal: the next max_count occurrences of a stored schedule after now, NULL when it cannot be evaluated.';
REVOKE ALL ON FUNCTION dq__cron_next(text, text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

CREATE OR REPLACE FUNCTION dq_cron_install(
    name          text,
    queue         text,
    schedule      text,
    payload       bytea,
    timezone      text DEFAULT 'UTC',
    payload_type  text DEFAULT NULL,
    lookahead     interval DEFAULT '1 hour')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_def      record;
    v_type     text;
    v_zone     text;
    v_hash     text;
    v_outcome  text;
BEGIN
    v_type := coalesce(dq_cron_install.payload_type, 'bytes');
    v_error := coalesce(
        dq__name_error('dq_cron_install', 'name', dq_cron_install.name, dq__limit_cron_name_chars()),
        dq__name_error('dq_cron_install', 'queue', dq_cron_install.queue, dq__limit_queue_chars()),
        dq__text_error('dq_cron_install', 'schedule', dq_cron_install.schedule, dq__limit_cron_schedule_chars()),
        CASE WHEN dq_cron_install.payload IS NULL THEN dq__null_error('dq_cron_install', 'payload') END,
        dq__name_error('dq_cron_install', 'payload_type', v_type, dq__limit_payload_type_chars()),
        CASE WHEN dq_cron_install.lookahead > dq__limit_cron_lookahead_max()
             THEN dq__error('22023', format('dq_cron_install: lookahead is %s, it must be positive and at most %s',
                                            dq_cron_install.lookahead, dq__interval_text(dq__limit_cron_lookahead_max())))
             END,
        -- NULL (22004) and positive by its effect (22023).
        dq__time_after_error('dq_cron_install', 'lookahead', dq_cron_install.lookahead, dq__now(), false),
        CASE WHEN octet_length(dq_cron_install.payload) > dq__limit_payload_bytes_min()
             THEN dq__payload_size_error('dq_cron_install', 'payload', dq_cron_install.queue,
                                         octet_length(dq_cron_install.payload)) END);
    -- A JSON payload is stored (and hashed) in jsonb's text form, so the same document installed
    -- from SQL (jsonb) and from a client (compact JSON bytes) is the same definition.
    IF v_error IS NULL AND v_type = 'json' THEN
        BEGIN
            dq_cron_install.payload := convert_to(convert_from(dq_cron_install.payload, 'UTF8')::jsonb::text, 'UTF8');
        EXCEPTION WHEN invalid_text_representation OR character_not_in_repertoire OR untranslatable_character THEN
            v_error := dq__error('22023', format('dq_cron_install: payload is not valid JSON (payload_type json): %s',
                                                 SQLERRM));
        END;
    END IF;
    IF v_error IS NULL THEN
        v_def := dq__cron_definition('dq_cron_install', dq_cron_install.schedule, dq_cron_install.timezone);
        v_error := v_def.error;
    END IF;
    IF v_error ? 'hint' THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
    ELSIF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_zone := v_def.zone;
    v_hash := dq_cron_config_hash(dq_cron_install.queue, dq_cron_install.schedule, v_zone,
                                  dq_cron_install.payload, v_type);

    v_outcome := dq__cron_store(dq_cron_install.name, dq_cron_install.queue, dq_cron_install.schedule, v_zone,
                                dq_cron_install.payload, v_type, dq_cron_install.lookahead, v_hash);
    RAISE NOTICE '%', CASE v_outcome
        WHEN 'installed' THEN format('dq_cron_install: schedule %s installed (queue %s, "%s" in %s)', dq_cron_install.name,
                                     dq_cron_install.queue, dq_cron_install.schedule, v_zone)
        WHEN 'lookahead' THEN format('dq_cron_install: schedule %s unchanged but its lookahead, now %s',
                                     dq_cron_install.name, dq_cron_install.lookahead)
        WHEN 'unchanged' THEN format('dq_cron_install: schedule %s unchanged', dq_cron_install.name)
        ELSE format('dq_cron_install: schedule %s replaced (queue %s, "%s" in %s); its future occurrences are the new '
                    'definition''s', dq_cron_install.name, dq_cron_install.queue, dq_cron_install.schedule, v_zone) END;
    RETURN v_hash;
END;
$$;
COMMENT ON FUNCTION dq_cron_install(text, text, text, bytea, text, text, interval) IS 'dq_cron_install(name, queue, schedule, payload bytea, timezone, payload_type, lookahead) -> text: creates or replaces the named schedule and installs its occurrences up to now + lookahead, and returns its config hash. Errors: 22004 NULL, 22023 bad schedule, timezone or lookahead or a schedule that never fires, 22001 too long, 54000 payload over the queue''s limit.';
REVOKE ALL ON FUNCTION dq_cron_install(text, text, text, bytea, text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_install(text, text, text, bytea, text, text, interval) TO dq_admin;

-- The jsonb and text forms: the bytea form with the payload's UTF-8 text.
CREATE OR REPLACE FUNCTION dq_cron_install(name text, queue text, schedule text, payload jsonb, timezone text DEFAULT 'UTC',
    payload_type text DEFAULT NULL, lookahead interval DEFAULT '1 hour')
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT dq_cron_install($1, $2, $3, convert_to($4::text, 'UTF8'), $5, coalesce($6, 'json'), $7) $$;
COMMENT ON FUNCTION dq_cron_install(text, text, text, jsonb, text, text, interval) IS 'dq_cron_install with a jsonb payload: stored as its UTF-8 text, payload_type ''json'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_cron_install(text, text, text, jsonb, text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_install(text, text, text, jsonb, text, text, interval) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_install(name text, queue text, schedule text, payload text, timezone text DEFAULT 'UTC',
    payload_type text DEFAULT NULL, lookahead interval DEFAULT '1 hour')
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT dq_cron_install($1, $2, $3, convert_to($4, 'UTF8'), $5, coalesce($6, 'text'), $7) $$;
COMMENT ON FUNCTION dq_cron_install(text, text, text, text, text, text, interval) IS 'dq_cron_install with a text payload (also what an untyped literal resolves to): stored as UTF-8, payload_type ''text'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_cron_install(text, text, text, text, text, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_install(text, text, text, text, text, text, interval) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_uninstall(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error   jsonb;
    v_queue   text;
    v_deleted integer;
BEGIN
    v_error := dq__name_error('dq_cron_uninstall', 'name', dq_cron_uninstall.name, dq__limit_cron_name_chars());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    DELETE FROM dq_cron c WHERE c.name = dq_cron_uninstall.name RETURNING c.queue INTO v_queue;
    IF v_queue IS NULL THEN
        RAISE NOTICE 'dq_cron_uninstall: no schedule named %; nothing changed', dq_cron_uninstall.name;
        RETURN false;
    END IF;
    v_deleted := dq_uninstall_tick(v_queue, dq_cron_uninstall.name, NULL);
    RAISE NOTICE 'dq_cron_uninstall: schedule % removed with % future occurrences', dq_cron_uninstall.name, v_deleted;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_cron_uninstall(text) IS 'dq_cron_uninstall(name text) -> boolean: removes the schedule and its future occurrence messages; false when no schedule has that name. Errors: 22004/22023/22001 name.';
REVOKE ALL ON FUNCTION dq_cron_uninstall(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_uninstall(text) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_pause(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error   jsonb;
    v_queue   text;
    v_deleted integer;
BEGIN
    v_error := dq__name_error('dq_cron_pause', 'name', dq_cron_pause.name, dq__limit_cron_name_chars());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    UPDATE dq_cron c
       SET paused = true, installed_through = NULL, last_installed_at = NULL, next_at = NULL, refill_from = NULL,
           updated_at = CASE WHEN c.paused THEN c.updated_at ELSE dq__now() END
     WHERE c.name = dq_cron_pause.name
    RETURNING c.queue INTO v_queue;
    IF v_queue IS NULL THEN
        RAISE NOTICE 'dq_cron_pause: no schedule named %; nothing changed', dq_cron_pause.name;
        RETURN false;
    END IF;
    v_deleted := dq_uninstall_tick(v_queue, dq_cron_pause.name, NULL);
    RAISE NOTICE 'dq_cron_pause: schedule % paused; % future occurrences deleted', dq_cron_pause.name, v_deleted;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_cron_pause(text) IS 'dq_cron_pause(name text) -> boolean: stops the schedule and deletes its future occurrences; false when no schedule has that name. Errors: 22004/22023/22001 name.';
REVOKE ALL ON FUNCTION dq_cron_pause(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_pause(text) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_cron_resume(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_paused boolean;
BEGIN
    v_error := dq__name_error('dq_cron_resume', 'name', dq_cron_resume.name, dq__limit_cron_name_chars());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    SELECT c.paused INTO v_paused FROM dq_cron c WHERE c.name = dq_cron_resume.name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE NOTICE 'dq_cron_resume: no schedule named %; nothing changed', dq_cron_resume.name;
        RETURN false;
    END IF;
    IF v_paused THEN
        UPDATE dq_cron c SET paused = false, updated_at = dq__now() WHERE c.name = dq_cron_resume.name;
        PERFORM dq__cron_advance(dq_cron_resume.name, dq__now());
        RAISE NOTICE 'dq_cron_resume: schedule % resumed from now', dq_cron_resume.name;
    ELSE
        RAISE NOTICE 'dq_cron_resume: schedule % was not paused; nothing changed', dq_cron_resume.name;
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_cron_resume(text) IS 'dq_cron_resume(name text) -> boolean: restarts a paused schedule from now and installs its occurrences; false when no schedule has that name. Errors: 22004/22023/22001 name.';
REVOKE ALL ON FUNCTION dq_cron_resume(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_resume(text) TO dq_admin;


-- The schedules with their next occurrences, for dq_cron_schedules. SECURITY DEFINER (granted to
-- dq_admin): the evaluation calls internal functions that no application role may execute, and a
-- view checks the functions it calls against the role that reads it (PostgreSQL manual, CREATE VIEW).
CREATE OR REPLACE FUNCTION dq_cron_list()
RETURNS TABLE (name text, queue text, schedule text, timezone text, payload_type text, lookahead interval,
               config_hash text, paused boolean, next_occurrences timestamptz[], installed_through timestamptz,
               last_installed_at timestamptz, next_uninstalled_at timestamptz, created_at timestamptz,
               updated_at timestamptz, last_error text, last_error_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
SELECT c.name, c.queue, c.schedule, c.timezone, c.payload_type, c.lookahead, c.config_hash, c.paused,
       CASE WHEN NOT c.paused THEN dq__cron_next(c.schedule, c.timezone, 5) END,
       c.installed_through, c.last_installed_at, c.next_at, c.created_at, c.updated_at, c.last_error, c.last_error_at
  FROM dq_cron c
 ORDER BY c.name
$$;
COMMENT ON FUNCTION dq_cron_list() IS 'dq_cron_list() -> the named schedules (the rows of the view dq_cron_schedules) with their next 5 occurrences and the tick''s bookkeeping. Errors: none.';
REVOKE ALL ON FUNCTION dq_cron_list() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_list() TO dq_admin, dq_viewer;

CREATE OR REPLACE VIEW dq_cron_schedules AS
SELECT l.name, l.queue, l.schedule, l.timezone, l.payload_type, l.lookahead, l.config_hash, l.paused,
       l.next_occurrences, l.installed_through, l.last_installed_at, l.next_uninstalled_at, l.created_at,
       l.updated_at, l.last_error, l.last_error_at
  FROM dq_cron_list() l;
COMMENT ON VIEW dq_cron_schedules IS 'The named schedules (dq_cron_install) with their next 5 occurrences, the tick''s bookkeeping and the last evaluation error.';
-- Reading it is an operator's business (the view runs with its owner's rights): dq_admin and the
-- read-only dq_viewer.
REVOKE ALL ON dq_cron_schedules FROM PUBLIC;
GRANT SELECT ON dq_cron_schedules TO dq_admin, dq_viewer;


-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
