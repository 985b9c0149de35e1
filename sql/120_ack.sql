-- Finishing a delivery: acknowledge (delete), negative acknowledge (give back), extend (heartbeat).
--
-- All three find the row by its lock token. poll gives every delivery a fresh token, and an
-- update by dq_offer clears it, so a token names exactly one delivery of one version of one
-- message: a stale token (lock expired and re-acquired, message re-offered, already
-- acknowledged) matches no row and changes nothing.
-- A lock that expired but that no poll has taken over since is still held by its token: the late
-- holder's ack, nack or extend then succeeds (the work was done, nobody else has the message):
-- the delete matches as long as the row is still the one that was locked.
-- Concurrency: a concurrent poll or offer that changed the row makes our statement re-check
-- `lock_token = $1` on the new row version (EvalPlanQual), which then fails.
-- Plans: PL/pgSQL may cache a generic plan made while the table was empty (sequential scan) and
-- keep it after the table grew (tests/core/test_plans.py); sequential scans are off in these functions,
-- so the lock-token index is used at every size, and JIT with them (see sql/110_poll.sql). dq_ack and
-- dq_ack_many also turn sorts and bitmap scans off (see them below); the helpers they call run with
-- these settings too.
-- Leaving: an acknowledged row is handed to dq__gone (archive, FIFO group, concurrency limit) in the
-- same transaction as its delete, unless dq__gone has nothing to do for it (dq__gone_queues).
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- Messages that leave the queue. Every statement that deletes messages for good except dq_purge
-- (acknowledged, cancelled, expired, dead-lettered) hands the deleted rows to dq__gone in the same
-- transaction (the acknowledgements only the rows for which it has something to do: grouped rows
-- and rows of the queues of dq__gone_queues), which does what follows from their leaving:
--  * the archive: rows of a queue configured with archive => true go to dq_archive, committed with
--    the delete or not at all. An archive row keeps the message's id, queue, key, payload,
--    payload_type, scheduled_at_initially, created_at, delivery_count, last_error, priority,
--    message_group, expires_at, headers and released_at (when its parents released it, NULL when
--    it never waited: sql/095_dependencies.sql); scheduled_at is when its last delivery was due
--    (due_at, else its scheduled_at), acked_at the time of the outcome;
--  * FIFO groups: the groups of grouped rows are settled (sql/020_groups.sql), so the next message
--    of a group becomes deliverable;
--  * concurrency limits: in a queue with max_in_flight, consumers waiting for a free slot are woken;
--  * dependencies: an acknowledged parent releases its children, another outcome applies their
--    on_parent_failure, and a blocked child takes its dependency rows along (dq__resolve).
-- Callers collect the rows with DELETE .. RETURNING m (the whole row) and assign the result
-- (`v := dq__gone(...)`), which PL/pgSQL evaluates as a simple expression. The queue's configuration
-- is read once, in the statement that archives. Plans are generic: called from dq_ack
-- (enable_seqscan off) a custom plan was re-made on every call (45 us).
DROP FUNCTION IF EXISTS dq__archive(dq_messages[], text, timestamptz);
SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
CREATE OR REPLACE FUNCTION dq__gone(gone dq_messages[], outcome text, at timestamptz, grouped boolean DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_count    integer;
    v_limited  text[];
    v_queues   text[];
    v_groups   text[];
    v_settled  integer;
    v_woken    boolean;
    v_q        text;
    v_resolved integer;
BEGIN
    IF gone IS NULL THEN
        RETURN 0;
    END IF;
    -- Dependencies first (sql/095_dependencies.sql): children released or failed, a leaving child's
    -- dependency rows deleted; only for rows that are parents or blocked children.
    IF EXISTS (SELECT 1 FROM unnest(dq__gone.gone) g WHERE g.has_children OR g.parents_pending > 0) THEN
        v_resolved := dq__resolve(dq__gone.gone, dq__gone.outcome, dq__gone.at);
    END IF;
    WITH cfg AS (
        SELECT q.queue, q.archive, q.max_in_flight FROM dq_queues q
         WHERE q.queue IN (SELECT g.queue FROM unnest(dq__gone.gone) g)
    ), ins AS (
        INSERT INTO dq_archive (id, queue, key, payload, payload_type, scheduled_at, scheduled_at_initially,
                                created_at, delivery_count, outcome, acked_at, last_error,
                                priority, message_group, expires_at, headers, released_at)
        SELECT g.id, g.queue, g.key, g.payload, g.payload_type, coalesce(g.due_at, g.scheduled_at), g.scheduled_at_initially,
               g.created_at, g.delivery_count, dq__gone.outcome, dq__gone.at, g.last_error,
               g.priority, g.message_group, g.expires_at, g.headers, g.released_at
          FROM unnest(dq__gone.gone) g JOIN cfg ON cfg.queue = g.queue AND cfg.archive
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM ins), array_agg(cfg.queue) FILTER (WHERE cfg.max_in_flight IS NOT NULL)
      INTO v_count, v_limited FROM cfg;
    IF grouped IS DISTINCT FROM false THEN  -- the caller may know that none of the rows was grouped
        SELECT array_agg(g.queue), array_agg(g.message_group) INTO v_queues, v_groups
          FROM unnest(dq__gone.gone) g WHERE g.message_group IS NOT NULL AND g.dead_from IS NULL;
        IF v_groups IS NOT NULL THEN
            v_settled := dq__settle_groups(v_queues, v_groups);
        END IF;
    END IF;
    IF v_limited IS NOT NULL THEN
        FOREACH v_q IN ARRAY v_limited LOOP
            v_woken := dq__wake_blocked(v_q);
        END LOOP;
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq__gone(dq_messages[], text, timestamptz, boolean) IS 'Internal: what follows from deleted rows leaving the queue: archived with outcome (acked, cancelled, expired, dead) at the given time when their queue archives, their FIFO groups settled (grouped false: the caller knows none was grouped), waiters of queues with a concurrency limit woken, dependencies resolved (dq__resolve); returns how many were archived.';
REVOKE ALL ON FUNCTION dq__gone(dq_messages[], text, timestamptz, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The queues whose leaving messages need dq__gone whatever their group: those that archive or limit
-- the messages in flight ('{}' when none does). An acknowledgement does not hand dq__gone the other
-- ungrouped rows (dq_ack, dq_ack_many). PL/pgSQL, whose plan is kept for the session: a SQL
-- function that is not inlined is parsed and planned again in every transaction (measured, 20 us).
CREATE OR REPLACE FUNCTION dq__gone_queues()
RETURNS text[]
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_queues text[];
BEGIN
    SELECT coalesce(array_agg(q.queue), '{}') INTO v_queues FROM dq_queues q WHERE q.archive OR q.max_in_flight IS NOT NULL;
    RETURN v_queues;
END;
$$;
COMMENT ON FUNCTION dq__gone_queues() IS 'Internal: the queues whose deleted messages dq__gone must see whatever their group (they archive or limit messages in flight).';
REVOKE ALL ON FUNCTION dq__gone_queues() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The ids of the messages held under these lock tokens (in token order; none for a stale token), by a
-- plain read: callers (dq_nack, dq_extend, dq_release) lock or update the rows by primary key and
-- check the token again on the row they lock (`(m.lock_token = ...) IS TRUE`), so that after
-- waiting for a transaction that changed the row its latest version must still hold the token
-- (EvalPlanQual). The ORDER BY lock_token, with sorts off, keeps the lock-token index whatever the
-- statistics say (written before migration 0020 made it the only index such a lookup can use;
-- tests/core/test_plans.py). Its own settings: the callers' plans keep theirs.
CREATE OR REPLACE FUNCTION dq__held_ids(lock_tokens uuid[])
RETURNS bigint[]
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
BEGIN
    RETURN ARRAY(SELECT l.id FROM dq_messages l WHERE l.lock_token = ANY (dq__held_ids.lock_tokens) ORDER BY l.lock_token);
END;
$$;
COMMENT ON FUNCTION dq__held_ids(uuid[]) IS 'Internal: the ids of the messages held under these lock tokens (a plain read, through the lock-token index at every size); callers check the token again on the rows they lock or delete.';
REVOKE ALL ON FUNCTION dq__held_ids(uuid[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- Acknowledging: a DELETE by lock token, through the lock-token index, the only index whose
-- predicate `lock_token = $1` implies (dq_messages_in_flight_idx also requires delivery_count > 0,
-- migration 0020: before, an ANALYZE that saw nothing in flight made the plans scan it from end to
-- end, about 1 ms a statement at 10,000 in flight; tests/core/test_plans.py). A row a concurrent
-- transaction changed is re-checked on its latest version (it must still hold the token). The rows
-- are deleted in whatever order the index gives: an offer after several parents takes their locks
-- NOWAIT and never waits while it holds one (sql/095_dependencies.sql), so no order is needed
-- against it (tests/workflows/test_lock_order.py).
-- RETURNING gives dq__gone the whole row only when it has something to do (grouped, of a queue of
-- dq__gone_queues, or a parent: has_children, which an offer sets by an UPDATE of the row, so a
-- delete that waited for that offer sees it on the row's latest version); collecting whole rows for
-- every message cost 0.7-1.7 us a message (measured with batches of 100). dq_ack_many first deletes
-- the rows that need nothing by a plain statement (see there).
-- dq_ack is written out beside its twin dq_ack_many: delegating to it costs 22 us per ack
-- (measured: 29 -> 51 us).
CREATE OR REPLACE FUNCTION dq_ack(lock_token uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_gone     dq_messages[];
    v_grouped  boolean;
    v_archived integer;
    v_special  text[];
BEGIN
    IF dq_ack.lock_token IS NULL THEN
        v_error := dq__null_error('dq_ack', 'lock_token');
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_special := dq__gone_queues();
    DELETE FROM dq_messages m WHERE m.lock_token = dq_ack.lock_token
    RETURNING CASE WHEN (m.message_group IS NOT NULL AND m.dead_from IS NULL) OR m.queue = ANY (v_special)
                        OR m.has_children
                   THEN ARRAY[m] END,
              m.message_group IS NOT NULL
         INTO v_gone, v_grouped;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_gone IS NOT NULL THEN
        v_archived := dq__gone(v_gone, 'acked', dq__clock(), v_grouped);
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION dq_ack(uuid) IS 'dq_ack(lock_token uuid) -> boolean: deletes the message still held under this token (archived as acked when its queue archives); false for a stale token. Errors: 22004 NULL.';
REVOKE ALL ON FUNCTION dq_ack(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_ack(uuid) TO dq_consumer;

-- The batch acknowledge was an overload dq_ack(uuid[]) before dq_ack_many: with both, a quoted
-- token (SELECT dq_ack('6f1c…')) matched either and failed as "not unique". Removed here, in the
-- transaction that creates dq_ack_many, so a database never has neither.
DROP FUNCTION IF EXISTS dq_ack(uuid[]);
CREATE OR REPLACE FUNCTION dq_ack_many(lock_tokens uuid[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_gone     dq_messages[];
    v_grouped  boolean;
    v_archived integer;
    v_special  text[];
    v_count    integer;
    v_plain    integer;
BEGIN
    IF dq_ack_many.lock_tokens IS NULL THEN
        v_error := dq__null_error('dq_ack_many', 'lock_tokens');
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    -- See above dq_ack. First the rows that need nothing from dq__gone (ungrouped, of a queue that
    -- neither archives nor limits messages in flight, not a parent), by a plain delete, as the
    -- plain-SQL baseline deletes: collecting even an empty RETURNING for each row cost 1.4 us a
    -- message more (measured, batches of 100). A row an offer marked as a parent while this waited
    -- for it is re-checked on its latest version and left to the second statement. The rest (and
    -- stale or repeated tokens: then the second finds nothing) go through it. The queues' settings
    -- are read by this statement's snapshot, as dq__gone reads them.
    v_special := dq__gone_queues();
    DELETE FROM dq_messages m
     WHERE m.lock_token = ANY (dq_ack_many.lock_tokens)
       AND (m.message_group IS NULL OR m.dead_from IS NOT NULL) AND m.queue <> ALL (v_special)
       AND NOT m.has_children;
    GET DIAGNOSTICS v_plain = ROW_COUNT;
    IF v_plain = cardinality(dq_ack_many.lock_tokens) THEN
        RETURN v_plain;
    END IF;
    WITH gone AS (
        DELETE FROM dq_messages m WHERE m.lock_token = ANY (dq_ack_many.lock_tokens)
        RETURNING CASE WHEN (m.message_group IS NOT NULL AND m.dead_from IS NULL) OR m.queue = ANY (v_special)
                            OR m.has_children
                       THEN m END AS m,
                  m.message_group IS NOT NULL AS g
    )
    SELECT count(*), array_agg(gone.m) FILTER (WHERE (gone.m).id IS NOT NULL),  -- not `m IS NOT NULL`: false
           bool_or(gone.g) FILTER (WHERE (gone.m).id IS NOT NULL)                -- when any column is NULL
      INTO v_count, v_gone, v_grouped FROM gone;
    IF v_gone IS NOT NULL THEN
        v_archived := dq__gone(v_gone, 'acked', dq__clock(), v_grouped);
    END IF;
    RETURN v_plain + v_count;
END;
$$;
COMMENT ON FUNCTION dq_ack_many(uuid[]) IS 'dq_ack_many(lock_tokens uuid[]) -> integer: dq_ack for each token, in one statement; returns how many messages were deleted. Errors: 22004 NULL array.';
REVOKE ALL ON FUNCTION dq_ack_many(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_ack_many(uuid[]) TO dq_consumer;

-- The negative acknowledgement, written once for dq_nack, dq_nack_outcome and dq_dead_letter: fn
-- names the caller in error messages. Returns where the message went (outcome 'retried', due again
-- at due; 'dead_lettered', moved to dead_letter_queue at the queue's max_deliveries, or at once when
-- give_up; 'stale', the token holds no message) or problem, the error for the caller to raise. No SET
-- clause: it runs only inside those three, with their settings (pinned search_path, no sequential
-- scan, no JIT). give_up was added with dq_dead_letter: the 4-argument version is dropped in the
-- transaction that creates this one.
SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
DROP FUNCTION IF EXISTS dq__nack(text, uuid, interval, text);
CREATE OR REPLACE FUNCTION dq__nack(fn text, lock_token uuid, delay interval, error text, give_up boolean,
                                   OUT outcome text, OUT due timestamptz, OUT dead_letter_queue text,
                                   OUT problem jsonb)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_ids    bigint[];
    v_id     bigint;
    v_queue  text;
    v_at     timestamptz;
    v_count  integer;
    v_max    integer;
    v_dlq    text;
    v_now    timestamptz;
    v_woken  boolean;
    v_group  text;
    v_dead   boolean;
    v_limit  integer;
    v_set    boolean;
    v_moved  integer;
BEGIN
    v_now := dq__clock();
    problem := coalesce(
        CASE WHEN dq__nack.lock_token IS NULL THEN dq__null_error(fn, 'lock_token') END,
        dq__time_after_error(fn, 'delay', dq__nack.delay, v_now, true),
        CASE WHEN char_length(dq__nack.error) > dq__limit_error_chars()
             THEN dq__text_error(fn, 'error', dq__nack.error, dq__limit_error_chars()) END);
    IF problem IS NOT NULL THEN
        RETURN;
    END IF;
    outcome := 'stale';
    -- The row lock first (FOR UPDATE waits for a transaction holding the message, then re-checks the
    -- token on the row's latest version: after a concurrent ack or a new poll it matches no row), then
    -- the clock: a wait does not move the stored due time and error time into the past. The delay is
    -- checked again at that time.
    -- The row found by dq__held_ids, its token checked again after the wait.
    v_ids := dq__held_ids(ARRAY[dq__nack.lock_token]);
    SELECT m.id, m.queue INTO v_id, v_queue FROM dq_messages m
     WHERE m.id = ANY (v_ids) AND (m.lock_token = dq__nack.lock_token) IS TRUE FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_now := dq__clock();
    SELECT q.max_deliveries, q.dead_letter_queue, q.max_in_flight INTO v_max, v_dlq, v_limit
      FROM dq_queues q WHERE q.queue = v_queue;
    problem := coalesce(
        dq__time_after_error(fn, 'delay', dq__nack.delay, v_now, true),
        -- A queue without a dead-letter queue has no delivery limit either (the constraint
        -- dq_queues_limit_needs_dlq): none of its messages is ever dead-lettered, so giving up
        -- changes nothing there and says so; the caller still holds the message (ack or nack it).
        CASE WHEN give_up AND v_dlq IS NULL
             THEN dq__error('55000', format('%s: queue %s has no dead_letter_queue (dq_configure_queue sets one); '
                                            'the message is still held under its lock token', fn, v_queue)) END);
    IF problem IS NOT NULL THEN
        outcome := NULL;
        RETURN;
    END IF;
    v_at := v_now + dq__nack.delay;
    UPDATE dq_messages m
       SET scheduled_at = v_at,
           lock_token = NULL,
           last_error = coalesce(dq__nack.error, m.last_error),
           last_error_at = CASE WHEN dq__nack.error IS NOT NULL THEN v_now ELSE m.last_error_at END
     WHERE m.id = v_id AND (m.lock_token = dq__nack.lock_token) IS TRUE
    RETURNING m.id, m.queue, m.scheduled_at, m.delivery_count, m.message_group, m.dead_from IS NOT NULL
         INTO v_id, v_queue, v_at, v_count, v_group, v_dead;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- At the delivery limit, or when the caller gives up: dead-letter now rather than after the
    -- delay (sql/140_dead_letters.sql).
    IF give_up OR v_count >= v_max THEN
        v_moved := dq__dead_letter(ARRAY[v_id], v_dlq, dq__clock());
        outcome := 'dead_lettered';
        dead_letter_queue := v_dlq;
        RETURN;
    END IF;
    IF v_group IS NOT NULL AND NOT v_dead THEN
        -- The message keeps its place at the head of its group, due again at v_at (queued when
        -- another transaction holds the group's row: sql/020_groups.sql).
        v_set := dq__set_group_due(v_queue, v_group, v_id, v_at);
    END IF;
    IF v_limit IS NOT NULL THEN
        v_woken := dq__wake_blocked(v_queue);  -- a slot is free
    END IF;
    v_woken := dq__wake(v_queue, v_at);
    outcome := 'retried';
    due := v_at;
END;
$$;
COMMENT ON FUNCTION dq__nack(text, uuid, interval, text, boolean) IS 'Internal: the negative acknowledgement of dq_nack, dq_nack_outcome and dq_dead_letter (give_up: dead-letter now): (outcome retried | dead_lettered | stale, due, dead_letter_queue, problem: the error to raise, naming fn).';
REVOKE ALL ON FUNCTION dq__nack(text, uuid, interval, text, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- Kept for the workers of earlier releases (an upgrade does not stop them): dq_nack_outcome, but
-- only whether the token held the message.
CREATE OR REPLACE FUNCTION dq_nack(lock_token uuid, delay interval DEFAULT '0', error text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_done  record;
BEGIN
    v_done := dq__nack('dq_nack', dq_nack.lock_token, dq_nack.delay, dq_nack.error, false);
    IF v_done.problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_done.problem->>'sqlstate', MESSAGE = v_done.problem->>'message';
    END IF;
    RETURN v_done.outcome <> 'stale';
END;
$$;
COMMENT ON FUNCTION dq_nack(uuid, interval, text) IS 'dq_nack(lock_token uuid, delay interval default 0, error text default NULL) -> boolean: gives the message back, due again at now + delay with error as its last_error, or moves it to the dead-letter queue at the queue''s max_deliveries; false for a stale token (dq_nack_outcome says which). Errors: 22004 NULL, 22023 delay negative, 22008 now + delay past 9999-12-30, 22001 error over 10000 characters.';
REVOKE ALL ON FUNCTION dq_nack(uuid, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_nack(uuid, interval, text) TO dq_consumer;

-- dq_nack that says where the message went, so a worker logs it without reading the message again.
-- Safe with a concurrent ack, extend, nack or poll of the same message: the row lock (see dq__nack).
CREATE OR REPLACE FUNCTION dq_nack_outcome(lock_token uuid, delay interval DEFAULT '0', error text DEFAULT NULL)
RETURNS TABLE (outcome text, due timestamptz, dead_letter_queue text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_done  record;
BEGIN
    v_done := dq__nack('dq_nack_outcome', dq_nack_outcome.lock_token, dq_nack_outcome.delay, dq_nack_outcome.error,
                      false);
    IF v_done.problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_done.problem->>'sqlstate', MESSAGE = v_done.problem->>'message';
    END IF;
    RETURN QUERY SELECT v_done.outcome, v_done.due, v_done.dead_letter_queue;
END;
$$;
COMMENT ON FUNCTION dq_nack_outcome(uuid, interval, text) IS 'dq_nack_outcome(lock_token uuid, delay interval default 0, error text default NULL) -> TABLE (outcome text, due timestamptz, dead_letter_queue text), one row: dq_nack, saying where the message went: retried (due again at due), dead_lettered (moved to dead_letter_queue at the queue''s max_deliveries) or stale (the token holds no message). Errors: as dq_nack.';
REVOKE ALL ON FUNCTION dq_nack_outcome(uuid, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_nack_outcome(uuid, interval, text) TO dq_consumer;

-- Give up on a message now: move it to its queue's dead-letter queue as dq_nack does at the queue's
-- max_deliveries (dq__dead_letter: the same archive row, FIFO group settled, max_in_flight waiters
-- woken), whatever its delivery_count, for a consumer whose own retry policy is exhausted. Safe with a
-- concurrent ack, extend, nack or poll of the same message: the row lock of dq__nack (FOR UPDATE
-- re-checks the token on the row's latest version; the clock is read after it). A queue without a
-- dead-letter queue has no delivery limit, so nothing is ever dead-lettered there: 55000, nothing
-- changes, and the caller still holds the message.
CREATE OR REPLACE FUNCTION dq_dead_letter(lock_token uuid, error text DEFAULT NULL)
RETURNS TABLE (outcome text, dead_letter_queue text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_done  record;
BEGIN
    v_done := dq__nack('dq_dead_letter', dq_dead_letter.lock_token, '0', dq_dead_letter.error, true);
    IF v_done.problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_done.problem->>'sqlstate', MESSAGE = v_done.problem->>'message';
    END IF;
    RETURN QUERY SELECT v_done.outcome, v_done.dead_letter_queue;
END;
$$;
COMMENT ON FUNCTION dq_dead_letter(uuid, text) IS 'dq_dead_letter(lock_token uuid, error text default NULL) -> TABLE (outcome text, dead_letter_queue text), one row: moves the message held under this token to its queue''s dead-letter queue now, with error as its last_error, as dq_nack does at max_deliveries (archived as dead when the queue archives): dead_lettered (moved to dead_letter_queue) or stale (the token holds no message). Errors: 22004 NULL lock_token, 22001 error over 10000 characters, 55000 the queue has no dead_letter_queue (nothing changes).';
REVOKE ALL ON FUNCTION dq_dead_letter(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_dead_letter(uuid, text) TO dq_consumer;

CREATE OR REPLACE FUNCTION dq_extend(lock_token uuid, lock_timeout interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_until timestamptz;
    v_ids   bigint[];
    v_id    bigint;
    v_queue text;
    v_group text;
    v_dead  boolean;
    v_set   boolean;
BEGIN
    v_error := coalesce(
        CASE WHEN dq_extend.lock_token IS NULL THEN dq__null_error('dq_extend', 'lock_token') END,
        dq__time_after_error('dq_extend', 'lock_timeout', dq_extend.lock_timeout, dq__clock(), false));
    IF v_error IS NULL THEN
        -- Safe with concurrent calls: the row lock (FOR UPDATE re-checks the token on the row's
        -- latest version after a wait; a stale token matches no row), taken before the clock is read,
        -- so a wait for another transaction does not shorten the new lock (checked again then).
        v_ids := dq__held_ids(ARRAY[dq_extend.lock_token]);
        SELECT m.id INTO v_id FROM dq_messages m
         WHERE m.id = ANY (v_ids) AND (m.lock_token = dq_extend.lock_token) IS TRUE FOR UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        v_error := dq__time_after_error('dq_extend', 'lock_timeout', dq_extend.lock_timeout, dq__clock(), false);
    END IF;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_until := dq__clock() + dq_extend.lock_timeout;
    UPDATE dq_messages m
       SET scheduled_at = v_until
     WHERE m.id = v_id AND (m.lock_token = dq_extend.lock_token) IS TRUE
    RETURNING m.scheduled_at, m.id, m.queue, m.message_group, m.dead_from IS NOT NULL
         INTO v_until, v_id, v_queue, v_group, v_dead;
    IF v_group IS NOT NULL AND NOT v_dead THEN
        -- The head of a FIFO group: its group is due again when the new lock expires (as in dq_nack;
        -- the message row is locked first, then the group row, SKIP LOCKED: when another transaction
        -- holds it the change is queued, sql/020_groups.sql).
        v_set := dq__set_group_due(v_queue, v_group, v_id, v_until);
    END IF;
    RETURN v_until;
END;
$$;
COMMENT ON FUNCTION dq_extend(uuid, interval) IS 'dq_extend(lock_token uuid, lock_timeout interval) -> timestamptz: keeps the message invisible until the returned now + lock_timeout (a heartbeat); NULL when the token no longer holds it. Errors: 22004 NULL, 22023 lock_timeout not positive, 22008 now + lock_timeout past 9999-12-30.';
REVOKE ALL ON FUNCTION dq_extend(uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_extend(uuid, interval) TO dq_consumer;

-- Give back deliveries whose handling never started (a stopping worker's messages polled ahead):
-- SQS's ChangeMessageVisibility to 0, with the receive not counted. Each message is due again at
-- the due time it was claimed at (due_at; never later than now), so it keeps its place among the
-- due messages, and its delivery_count is restored: a delivery that never reached a handler does not
-- bring the message closer to its dead-letter queue. A FIFO group head stays the head, due again
-- at once; a queue with max_in_flight has the slot free again. The rate limit's tokens the poll took
-- stay spent. Safe with a concurrent ack, nack, extend or release of the same tokens: the row locks,
-- taken in id order (FOR UPDATE waits for a transaction holding a message, then re-checks the token
-- on the row's latest version: after an ack or a new poll it matches no row), before the clock is read.
CREATE OR REPLACE FUNCTION dq_release(lock_tokens uuid[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error   jsonb;
    v_ids     bigint[];
    v_now     timestamptz;
    v_row     record;
    v_count   integer := 0;
    v_queues  text[] := '{}';
    v_queue   text;
    v_set     boolean;
    v_woken   boolean;
BEGIN
    IF dq_release.lock_tokens IS NULL THEN
        v_error := dq__null_error('dq_release', 'lock_tokens');
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_ids := dq__held_ids(dq_release.lock_tokens);
    SELECT array_agg(l.id) INTO v_ids FROM (
        SELECT m.id FROM dq_messages m
         WHERE m.id = ANY (v_ids) AND (m.lock_token = ANY (dq_release.lock_tokens)) IS TRUE
         ORDER BY m.id FOR UPDATE) l;
    v_now := dq__clock();
    FOR v_row IN
        UPDATE dq_messages m
           SET scheduled_at = least(coalesce(m.due_at, v_now), v_now),
               lock_token = NULL,
               delivery_count = greatest(m.delivery_count - 1, 0)
         WHERE m.id = ANY (v_ids) AND (m.lock_token = ANY (dq_release.lock_tokens)) IS TRUE
        RETURNING m.id, m.queue, m.scheduled_at, m.message_group, m.dead_from IS NOT NULL AS dead
    LOOP
        v_count := v_count + 1;
        IF v_row.message_group IS NOT NULL AND NOT v_row.dead THEN
            -- The head of a FIFO group: its group is due again with it (queued when another
            -- transaction holds the group's row, sql/020_groups.sql).
            v_set := dq__set_group_due(v_row.queue, v_row.message_group, v_row.id, v_row.scheduled_at);
        END IF;
        IF NOT v_row.queue = ANY (v_queues) THEN
            v_queues := v_queues || v_row.queue;
        END IF;
    END LOOP;
    FOREACH v_queue IN ARRAY v_queues LOOP
        IF EXISTS (SELECT 1 FROM dq_queues q WHERE q.queue = v_queue AND q.max_in_flight IS NOT NULL) THEN
            v_woken := dq__wake_blocked(v_queue);  -- a slot is free
        END IF;
        v_woken := dq__wake(v_queue, v_now);
    END LOOP;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_release(uuid[]) IS 'dq_release(lock_tokens uuid[]) -> integer: gives back the messages still held under these tokens whose handling never started (a stopping consumer''s messages polled ahead): due again at once at the due time they were claimed at, their delivery not counted (delivery_count restored), FIFO group heads and max_in_flight slots freed, waiting consumers woken; returns how many were released (stale tokens are skipped). Errors: 22004 NULL array.';
REVOKE ALL ON FUNCTION dq_release(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_release(uuid[]) TO dq_consumer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
