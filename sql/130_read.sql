-- Reading and removing by key: dq_cancel, dq_cancel_waiting, dq_get, dq_next_due; dq_list_messages for operators.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- Payload bytes as text for people: the bytes decoded as UTF-8 when they are valid UTF-8 (JSON and
-- text payloads), else '\x' and their hex digits (what psql shows for bytea). The decode is tried
-- in a block with an exception handler (a subtransaction per call: for reading a few rows only).
CREATE OR REPLACE FUNCTION dq__payload_text(payload bytea)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN pg_catalog.convert_from(payload, 'UTF8');
EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
    RETURN '\x' || pg_catalog.encode(payload, 'hex');
END;
$$;
COMMENT ON FUNCTION dq__payload_text(bytea) IS 'Internal: a payload as text: decoded as UTF-8 when valid, else \x and hex digits.';
REVOKE ALL ON FUNCTION dq__payload_text(bytea) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- dq_cancel deletes every message of the queue with this key: the ordinary message and any dead
-- letters that share the key. A deleted future occurrence of a named schedule is offered again by
-- the next dq_cron_tick (dq__cron_note_deleted, sql/230_cron_schedules.sql): cancelling an occurrence does not
-- skip it; pause the schedule for that. dq_cancel_waiting deletes them only when no consumer holds
-- any of them. dq__cancel is the one implementation of both; it returns 'cancelled', 'absent' (no
-- message with this key) or 'in_flight' (in_flight false and a consumer holds one: nothing deleted).
-- Concurrency: with in_flight true, a plain DELETE by (queue, key); if a poller holds the row lock it
-- waits for that transaction, then deletes whatever version is current (a cancelled message in
-- flight is gone: its holder's ack then returns false). With in_flight false the key's rows are
-- first locked (FOR UPDATE, waiting likewise for a poll, ack or nack in progress) and their latest
-- versions read on the clock after that wait: a message a poll took meanwhile is seen held and
-- stays; while this transaction holds the locks no poll can take them (polls skip locked rows). The
-- schedule is marked before any message lock is taken, so this never holds a message lock while
-- waiting for a schedule's row (a refused cancel may leave a mark: the tick's offer of an occurrence
-- that still exists changes nothing).
SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
CREATE OR REPLACE FUNCTION dq__cancel(queue text, key text, in_flight boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_gone     dq_messages[];
    v_archived integer;
BEGIN
    PERFORM dq__cron_note_deleted(dq__cancel.queue, dq__cancel.key);
    IF NOT dq__cancel.in_flight THEN
        PERFORM 1 FROM dq_messages m WHERE m.queue = dq__cancel.queue AND m.key = dq__cancel.key
         ORDER BY m.id FOR UPDATE;
        IF EXISTS (SELECT 1 FROM dq_messages m
                    WHERE m.queue = dq__cancel.queue AND m.key = dq__cancel.key
                      AND m.lock_token IS NOT NULL AND m.scheduled_at > dq__clock()) THEN
            RETURN 'in_flight';
        END IF;
    END IF;
    WITH gone AS (
        DELETE FROM dq_messages m WHERE m.queue = dq__cancel.queue AND m.key = dq__cancel.key RETURNING m
    )
    SELECT array_agg(gone.m) INTO v_gone FROM gone;
    v_archived := dq__gone(v_gone, 'cancelled', dq__clock());
    RETURN CASE WHEN v_gone IS NULL THEN 'absent' ELSE 'cancelled' END;
END;
$$;
COMMENT ON FUNCTION dq__cancel(text, text, boolean) IS 'Internal: deletes the messages with this key in the queue (in flight too, or only when none is held), archived as cancelled; returns cancelled, absent or in_flight (dq_cancel, dq_cancel_waiting).';
REVOKE ALL ON FUNCTION dq__cancel(text, text, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

CREATE OR REPLACE FUNCTION dq_cancel(queue text, key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
BEGIN
    v_error := coalesce(dq__name_error('dq_cancel', 'queue', dq_cancel.queue, dq__limit_queue_chars()),
                        dq__name_error('dq_cancel', 'key', dq_cancel.key, dq__limit_key_chars()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN dq__cancel(dq_cancel.queue, dq_cancel.key, true) = 'cancelled';
END;
$$;
COMMENT ON FUNCTION dq_cancel(text, text) IS 'dq_cancel(queue text, key text) -> boolean: deletes the messages with this key in the queue, in flight or not, dead letters included (archived as cancelled when the queue archives); false when there is none. Errors: 22004/22023/22001 queue or key.';
REVOKE ALL ON FUNCTION dq_cancel(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cancel(text, text) TO dq_producer;

-- Cancel only what is still waiting: a task runner's "cancel unless it started" (dq__cancel with
-- in_flight false; its concurrency comment says what is waited for).
CREATE OR REPLACE FUNCTION dq_cancel_waiting(queue text, key text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
BEGIN
    v_error := coalesce(dq__name_error('dq_cancel_waiting', 'queue', dq_cancel_waiting.queue, dq__limit_queue_chars()),
                        dq__name_error('dq_cancel_waiting', 'key', dq_cancel_waiting.key, dq__limit_key_chars()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN dq__cancel(dq_cancel_waiting.queue, dq_cancel_waiting.key, false);
END;
$$;
COMMENT ON FUNCTION dq_cancel_waiting(text, text) IS 'dq_cancel_waiting(queue text, key text) -> text: deletes the messages with this key in the queue (archived as cancelled when the queue archives) unless a consumer holds one (lock not expired): returns cancelled, in_flight (nothing deleted) or absent. Waits for a poll, ack or nack of them in progress. Errors: 22004/22023/22001 queue or key.';
REVOKE ALL ON FUNCTION dq_cancel_waiting(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_cancel_waiting(text, text) TO dq_producer;

CREATE OR REPLACE FUNCTION dq_get(queue text, key text)
RETURNS SETOF dq_message
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT  -- reads dq__clock()
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
BEGIN
    v_error := coalesce(dq__name_error('dq_get', 'queue', dq_get.queue, dq__limit_queue_chars()),
                        dq__name_error('dq_get', 'key', dq_get.key, dq__limit_key_chars()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT m.id, m.queue, m.key, m.payload, m.payload_type, m.scheduled_at, m.scheduled_at_initially,
           m.created_at, m.delivery_count,
           CASE WHEN m.lock_token IS NOT NULL AND m.scheduled_at > dq__clock()
                THEN m.scheduled_at END,
           m.priority::integer, m.message_group, m.expires_at, m.headers, m.released_at
      FROM dq_messages m
     WHERE m.queue = dq_get.queue AND m.key = dq_get.key
     ORDER BY m.dead_at NULLS FIRST, m.id;
END;
$$;
COMMENT ON FUNCTION dq_get(text, text) IS 'dq_get(queue text, key text) -> SETOF dq_message: the messages with this key, the ordinary one first, then dead letters (released_at: when its parents released it, NULL when it never waited for any); a plain read, no lock. Errors: 22004/22023/22001 queue or key.';
REVOKE ALL ON FUNCTION dq_get(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_get(text, text) TO dq_consumer, dq_viewer;

-- The messages of a queue for operators (dq_admin may not read dq_messages): by due time, at
-- most max_rows, optionally of one state. A plain read: no lock is taken, nothing changes. It sorts
-- the queue's rows of that state (an index gives them by priority first): on a queue of millions,
-- a second or more. A blocked message (waiting for its parents, sql/095_dependencies.sql) comes
-- last, with the due time and group it gets once released and how many parents it waits for
-- (parents_pending, 0 for the others); a released one, when its parents released it (released_at).
-- The result gained parents_pending and released_at: a new return type, so the function is dropped
-- and created again in the installer's transaction.
DROP FUNCTION IF EXISTS dq_list_messages(text, text, integer);
CREATE OR REPLACE FUNCTION dq_list_messages(queue text, in_state text DEFAULT NULL, max_rows integer DEFAULT 100)
RETURNS TABLE (key text, state text, scheduled_at timestamptz, delivery_count integer,
               locked_until timestamptz, last_error text, last_error_at timestamptz,
               created_at timestamptz, priority integer, message_group text, dead_from text,
               payload_type text, payload_text text, parents_pending integer, released_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT  -- reads dq__clock()
AS $$
#variable_conflict use_column
DECLARE
    v_error jsonb;
    v_now   timestamptz := dq__clock();
BEGIN
    v_error := coalesce(
        dq__name_error('dq_list_messages', 'queue', dq_list_messages.queue, dq__limit_queue_chars()),
        dq__range_error('dq_list_messages', 'max_rows', dq_list_messages.max_rows, 1, dq__limit_list_messages_max_rows()),
        CASE WHEN dq_list_messages.in_state NOT IN ('ready', 'scheduled', 'in_flight', 'redelivered', 'blocked')
             THEN dq__error('22023', format('dq_list_messages: in_state is "%s", it must be ready, scheduled, in_flight, '
                                            'redelivered, blocked or NULL (all)', left(dq_list_messages.in_state, 40))) END);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT m.key, s.state, CASE WHEN s.state = 'blocked' THEN m.release_at ELSE m.scheduled_at END,
           m.delivery_count, CASE WHEN s.state = 'in_flight' THEN m.scheduled_at END,
           m.last_error, m.last_error_at, m.created_at, m.priority::integer,
           CASE WHEN s.state = 'blocked' THEN m.release_group ELSE m.message_group END, m.dead_from,
           m.payload_type, dq__payload_text(m.payload), m.parents_pending, m.released_at
      FROM dq_messages m
     CROSS JOIN LATERAL (SELECT dq__timing_state(m.lock_token, m.scheduled_at, v_now) AS state) s
     WHERE m.queue = dq_list_messages.queue
       AND (dq_list_messages.in_state IS NULL OR s.state = dq_list_messages.in_state
            OR (dq_list_messages.in_state = 'redelivered' AND m.delivery_count > 1))
     ORDER BY m.scheduled_at, m.id
     LIMIT dq_list_messages.max_rows;
END;
$$;
COMMENT ON FUNCTION dq_list_messages(text, text, integer) IS 'dq_list_messages(queue text, in_state text default NULL, max_rows integer default 100) -> the queue''s messages by due time, of one state (ready, scheduled, in_flight, redelivered, blocked: waiting for parents, listed last with the due time and group they get once released and their parents_pending) or all, payloads as text, released_at when parents released the message (NULL: it never waited); a plain read. Errors: 22004/22023/22001 queue, 22004/22023 max_rows (1..10000), 22023 in_state.';
REVOKE ALL ON FUNCTION dq_list_messages(text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_list_messages(text, text, integer) TO dq_admin, dq_viewer;

CREATE OR REPLACE FUNCTION dq_next_due(queue text)
RETURNS timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_next timestamptz;
BEGIN
    v_error := dq__name_error('dq_next_due', 'queue', dq_next_due.queue, dq__limit_queue_chars());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_next := dq__next_deliverable(dq_next_due.queue);
    RETURN v_next;
END;
$$;
COMMENT ON FUNCTION dq_next_due(text) IS 'dq_next_due(queue text) -> timestamptz: when the next message of the queue becomes visible (of a FIFO group only its head counts), NULL when there is none; pause and limits aside. Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_next_due(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_next_due(text) TO dq_consumer, dq_viewer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
