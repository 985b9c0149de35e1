-- Recurring messages, part 5: the tick, which installs what every active schedule lacks. The
-- pg_cron job of sql/250_cron_pg_cron.sql calls it every minute.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    v_now      timestamptz := dq__now();
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
        UPDATE dq_cron c SET last_error = left(v_error, dq__limit_error_chars()), last_error_at = dq__clock()
         WHERE c.name = v_current;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION dq_cron_tick() IS 'dq_cron_tick() -> integer: installs the occurrences every active schedule lacks (run every minute by the pg_cron job dq-cron-tick) and returns how many messages it created. Errors: none of its own: a schedule that fails is skipped with a WARNING and its last_error set.';
REVOKE ALL ON FUNCTION dq_cron_tick() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cron_tick() TO dq_admin;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
