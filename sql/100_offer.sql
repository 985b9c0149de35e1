-- Offering messages: dq_offer (bytea, jsonb and text payloads) and dq_offer_many.
-- Each is one INSERT .. ON CONFLICT (PostgreSQL manual, INSERT, "ON CONFLICT Clause").
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- The signatures of 0.4 and earlier (without priority, message_group, expires_at and headers) are
-- dropped and the new ones created in this same transaction (the installer applies sql/ in one),
-- so there is no moment without a dq_offer, and calls of the old forms resolve to the new functions.
DROP FUNCTION IF EXISTS dq_offer(text, text, bytea, timestamptz, boolean, text);
DROP FUNCTION IF EXISTS dq_offer(text, text, jsonb, timestamptz, boolean, text);
DROP FUNCTION IF EXISTS dq_offer(text, text, text, timestamptz, boolean, text);
DROP FUNCTION IF EXISTS dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[]);
-- The signatures without after and on_parent_failure (0.x before dependencies), likewise.
DROP FUNCTION IF EXISTS dq_offer(text, text, bytea, timestamptz, boolean, text, integer, text, timestamptz, jsonb);
DROP FUNCTION IF EXISTS dq_offer(text, text, jsonb, timestamptz, boolean, text, integer, text, timestamptz, jsonb);
DROP FUNCTION IF EXISTS dq_offer(text, text, text, timestamptz, boolean, text, integer, text, timestamptz, jsonb);
DROP FUNCTION IF EXISTS dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text);
-- dq_offer_many and dq_offer_many_counts without afters and on_parent_failures, likewise.
DROP FUNCTION IF EXISTS dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]);
DROP FUNCTION IF EXISTS dq_offer_many_counts(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[]);
-- dq__offer_many returned TABLE (key, outcome) before it returned counts and an array of outcomes.
DROP FUNCTION IF EXISTS dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text, integer[], text[], timestamptz[], jsonb[]);


-- dq_offer: insert, or replace when the key is present and something differs.
--
-- Concurrency (READ COMMITTED): INSERT .. ON CONFLICT DO UPDATE either inserts or locks the
-- conflicting row and updates it, atomically: concurrent offers of one new key produce exactly
-- one 'created'; the others wait for that row's lock and then see it (PostgreSQL docs, "INSERT
-- ... ON CONFLICT DO UPDATE guarantees an atomic INSERT or UPDATE outcome"). An update clears
-- lock_token, so a consumer still holding the old version cannot acknowledge away the new one
-- (its token no longer matches). An update makes the message an ordinary message of this queue:
-- its last error, the due and claim times of its last delivery and any schedule ownership are
-- cleared. Dead letters are never matched: the unique constraint (queue, key, dead_from_id)
-- NULLS NOT DISTINCT makes an offer conflict only with the queue's ordinary message of that key.
-- A grouped message (message_group) is inserted or updated first, then its group is settled
-- (sql/020_groups.sql), and the group it left when an update moved it out of the group it headed.
-- after names parents (sql/095_dependencies.sql): a new message is stored blocked until each parent
-- that exists is acknowledged (dq__offer_after, which locks them); an update of a blocked message
-- keeps it blocked, its new due time and group kept for its release; an update of a released one
-- clears its release time (released_at): like its created_at, it is now that of a new message, which
-- waited for nothing. An offer that changes nothing (the WHERE below) keeps it.
CREATE OR REPLACE FUNCTION dq_offer(
    queue          text,
    key            text,
    payload        bytea,
    scheduled_at   timestamptz DEFAULT dq_now(),
    can_update     boolean DEFAULT true,
    payload_type   text DEFAULT NULL,
    priority       integer DEFAULT 0,
    message_group  text DEFAULT NULL,
    expires_at     timestamptz DEFAULT NULL,
    headers        jsonb DEFAULT NULL,
    after          jsonb DEFAULT NULL,
    on_parent_failure text DEFAULT 'wait')
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_type     text;
    v_inserted boolean;
    v_id       bigint;
    v_outcome  text;
    v_woken    boolean;
    v_left     text;
    v_settled  integer;
    v_blocked  boolean;
    v_after    record;
BEGIN
    -- Every check in the order its error is reported; the payload limit is read only for a payload
    -- over the smallest limit a queue may have, the controls are checked only when one is set (the
    -- common offer sets none).
    v_error := coalesce(
        dq__name_error('dq_offer', 'queue', dq_offer.queue, dq__limit_queue_chars()),
        dq__name_error('dq_offer', 'key', dq_offer.key, dq__limit_key_chars()),
        CASE WHEN dq_offer.payload IS NULL THEN dq__null_error('dq_offer', 'payload') END,
        dq__time_error('dq_offer', 'scheduled_at', dq_offer.scheduled_at),
        CASE WHEN octet_length(dq_offer.payload) > dq__limit_payload_bytes_min()
             THEN dq__payload_size_error('dq_offer', 'payload', dq_offer.queue, octet_length(dq_offer.payload)) END,
        CASE WHEN dq_offer.can_update IS NULL THEN dq__null_error('dq_offer', 'can_update') END,
        dq__name_error('dq_offer', 'payload_type', coalesce(dq_offer.payload_type, 'bytes'),
                       dq__limit_payload_type_chars()),
        CASE WHEN dq_offer.priority IS DISTINCT FROM 0 OR dq_offer.message_group IS NOT NULL
                  OR dq_offer.expires_at IS NOT NULL OR dq_offer.headers IS NOT NULL
             THEN dq__controls_error('dq_offer', '', dq_offer.priority, dq_offer.message_group,
                                     dq_offer.scheduled_at, dq_offer.expires_at, dq_offer.headers) END,
        CASE WHEN dq_offer.after IS NOT NULL OR dq_offer.on_parent_failure IS DISTINCT FROM 'wait'
             THEN dq__after_error('dq_offer', dq_offer.queue, dq_offer.key, dq_offer.after,
                                  dq_offer.on_parent_failure) END);
    IF v_error ? 'hint' THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
    ELSIF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    v_type := coalesce(dq_offer.payload_type, 'bytes');
    IF jsonb_array_length(dq_offer.after) > 0 THEN
        -- A new message after its parents, stored blocked; when none of them exists, an ordinary
        -- offer (sql/095_dependencies.sql).
        v_after := dq__offer_after(dq_offer.queue, dq_offer.key, dq_offer.payload, v_type, dq_offer.scheduled_at,
                                   dq_offer.can_update, dq_offer.priority, dq_offer.message_group,
                                   dq_offer.expires_at, dq_offer.headers, dq_offer.after, dq_offer.on_parent_failure);
        IF v_after.problem IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = v_after.problem->>'sqlstate', MESSAGE = v_after.problem->>'message';
        ELSIF v_after.outcome IS NOT NULL THEN
            RETURN v_after.outcome;
        END IF;
    END IF;
    IF dq_offer.can_update THEN
        INSERT INTO dq_messages AS m
               (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
                priority, message_group, expires_at, headers, has_children)
        VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_type,
                dq_offer.scheduled_at, dq_offer.scheduled_at, dq__now(),
                dq_offer.priority, dq_offer.message_group, dq_offer.expires_at, dq_offer.headers,
                dq__waited_for(dq_offer.queue, dq_offer.key))
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO UPDATE
           SET payload = EXCLUDED.payload,
               payload_type = EXCLUDED.payload_type,
               scheduled_at = CASE WHEN m.parents_pending > 0 THEN m.scheduled_at ELSE EXCLUDED.scheduled_at END,
               release_at = CASE WHEN m.parents_pending > 0 THEN EXCLUDED.scheduled_at END,
               scheduled_at_initially = EXCLUDED.scheduled_at_initially,
               created_at = EXCLUDED.created_at,
               delivery_count = 0,
               lock_token = NULL,
               last_error = NULL, last_error_at = NULL, due_at = NULL, claimed_at = NULL,
               cron_prefix = NULL, released_at = NULL,
               priority = EXCLUDED.priority,
               message_group = CASE WHEN m.parents_pending > 0 THEN NULL ELSE EXCLUDED.message_group END,
               release_group = CASE WHEN m.parents_pending > 0 THEN EXCLUDED.message_group END,
               expires_at = EXCLUDED.expires_at, headers = EXCLUDED.headers
         WHERE m.payload IS DISTINCT FROM EXCLUDED.payload
            OR m.payload_type IS DISTINCT FROM EXCLUDED.payload_type
            OR m.scheduled_at_initially IS DISTINCT FROM EXCLUDED.scheduled_at_initially
            OR m.priority IS DISTINCT FROM EXCLUDED.priority
            OR (CASE WHEN m.parents_pending > 0 THEN m.release_group ELSE m.message_group END)
                IS DISTINCT FROM EXCLUDED.message_group
            OR m.expires_at IS DISTINCT FROM EXCLUDED.expires_at
            OR m.headers IS DISTINCT FROM EXCLUDED.headers
        RETURNING (m.xmax = 0), m.id, m.parents_pending > 0 INTO v_inserted, v_id, v_blocked;
    ELSE
        INSERT INTO dq_messages AS m
               (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
                priority, message_group, expires_at, headers, has_children)
        VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_type,
                dq_offer.scheduled_at, dq_offer.scheduled_at, dq__now(),
                dq_offer.priority, dq_offer.message_group, dq_offer.expires_at, dq_offer.headers,
                dq__waited_for(dq_offer.queue, dq_offer.key))
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO NOTHING
        RETURNING true, m.id INTO v_inserted, v_id;
    END IF;

    IF v_inserted IS NULL THEN
        RETURN 'ignored';
    END IF;
    v_outcome := CASE WHEN v_inserted THEN 'created' ELSE 'updated' END;
    IF v_blocked THEN
        -- An update of a blocked message (no after): it stays blocked, with the new due time and
        -- group for its release; it is in no group and due for nobody until then.
        RETURN v_outcome;
    END IF;
    IF NOT v_inserted THEN
        -- An update may have moved the message out of a group it headed: that group is settled too.
        SELECT g.message_group INTO v_left FROM dq_groups g
         WHERE g.head_id = v_id AND g.queue = dq_offer.queue AND g.message_group IS DISTINCT FROM dq_offer.message_group;
    END IF;
    IF dq_offer.message_group IS NOT NULL OR v_left IS NOT NULL THEN
        -- Settling wakes waiters when the head changed (sql/020_groups.sql).
        v_settled := dq__settle_groups(ARRAY[dq_offer.queue, dq_offer.queue], ARRAY[dq_offer.message_group, v_left],
                                       ARRAY[dq_offer.scheduled_at, NULL]);
    END IF;
    IF dq_offer.message_group IS NULL THEN
        -- Wake a waiter that would otherwise sleep past this message's due time (sql/010_wait.sql).
        v_woken := dq__wake(dq_offer.queue, dq_offer.scheduled_at);
    END IF;
    RETURN v_outcome;
END;
$$;
COMMENT ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) IS 'dq_offer(queue, key, payload bytea, scheduled_at, can_update, payload_type, priority, message_group, expires_at, headers, after, on_parent_failure) -> text: offers one message: ''created'' (a new key), ''updated'' (can_update and something differs: replaced) or ''ignored''. after (a JSON array of keys of this queue or [queue, key] pairs) makes a new message wait until each of those messages that exists is acknowledged (one that does not exist, never offered or already acknowledged, is satisfied); on_parent_failure (wait, dead_letter, proceed) says what happens when a parent is dead-lettered, cancelled, expired or purged instead. Errors: 22004 NULL, 22023 empty or out of range (and after on an existing key, a cycle, the message itself), 22001 too long, 22008 a time out of range, 54000 payload, headers or after over the limit; nothing is written on error.';
REVOKE ALL ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, bytea, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) TO dq_producer;

-- The jsonb and text forms: the bytea form with the payload's UTF-8 text ("payload overloads" in docs/api.md).
CREATE OR REPLACE FUNCTION dq_offer(queue text, key text, payload jsonb, scheduled_at timestamptz DEFAULT dq_now(),
    can_update boolean DEFAULT true, payload_type text DEFAULT NULL, priority integer DEFAULT 0,
    message_group text DEFAULT NULL, expires_at timestamptz DEFAULT NULL, headers jsonb DEFAULT NULL,
    after jsonb DEFAULT NULL, on_parent_failure text DEFAULT 'wait')
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT dq_offer($1, $2, convert_to($3::text, 'UTF8'), $4, $5, coalesce($6, 'json'), $7, $8, $9, $10, $11, $12) $$;
COMMENT ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) IS 'dq_offer with a jsonb payload: stored as its UTF-8 text, payload_type ''json'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) TO dq_producer;

CREATE OR REPLACE FUNCTION dq_offer(queue text, key text, payload text, scheduled_at timestamptz DEFAULT dq_now(),
    can_update boolean DEFAULT true, payload_type text DEFAULT NULL, priority integer DEFAULT 0,
    message_group text DEFAULT NULL, expires_at timestamptz DEFAULT NULL, headers jsonb DEFAULT NULL,
    after jsonb DEFAULT NULL, on_parent_failure text DEFAULT 'wait')
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT dq_offer($1, $2, convert_to($3, 'UTF8'), $4, $5, coalesce($6, 'text'), $7, $8, $9, $10, $11, $12) $$;
COMMENT ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) IS 'dq_offer with a text payload (also what an untyped literal resolves to): stored as UTF-8, payload_type ''text'' unless given. Same result and errors as the bytea form.';
REVOKE ALL ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer(text, text, text, timestamptz, boolean, text, integer, text, timestamptz, jsonb, jsonb, text) TO dq_producer;


SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)

-- dq_offer_many: dq_offer's semantics for each element, set-based: one validation query and
-- one INSERT .. ON CONFLICT for the whole batch; element positions in errors are 1-based.
-- dq__offer_many is the body, for input that dq__offer_many_error found valid (its callers check
-- first and raise), shared by dq_offer_many, dq_offer_many_counts and dq_install_tick: fn is the
-- public function calling, cron_prefix the owner recorded on the rows it writes (dq_install_tick's
-- key_prefix; NULL otherwise). It returns how many elements were created, updated and ignored and,
-- when with_outcomes, each element's outcome in input order; outcomes is NULL when every element
-- was created (the common batch: the caller pairs keys with 'created' without a second pass).
--
-- Concurrency: as dq_offer, per row. Rows are inserted in bytewise key order (COLLATE "C", the
-- key column's collation, whatever the database's), as dead-lettering and redrive insert theirs, so
-- two statements that overlap take their row locks in the same order and do not deadlock. The
-- groups of grouped rows are settled after the insert, in (queue, message_group) order.
CREATE OR REPLACE FUNCTION dq__offer_many(
    fn              text,
    queue           text,
    keys            text[],
    payloads        bytea[],
    scheduled_ats   timestamptz[],
    can_update      boolean,
    payload_types   text[],
    cron_prefix     text,
    priorities      integer[],
    message_groups  text[],
    expires_ats     timestamptz[],
    headers         jsonb[],
    with_outcomes   boolean,
    OUT created     bigint,
    OUT updated     bigint,
    OUT ignored     bigint,
    OUT outcomes    text[])
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n            integer := coalesce(cardinality(dq__offer_many.keys), 0);
    v_waited       boolean;
    v_now          timestamptz := dq__now();
    v_changed_at   timestamptz;
    v_woken        boolean;
    v_groups       text[];
    v_group_dues   timestamptz[];
    v_updated_ids  bigint[];
    v_updated_keys text[];
    v_created_keys text[];
    v_settled      integer;
BEGIN
    created := 0;
    updated := 0;
    ignored := 0;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    -- A new message whose key children still wait for is their parent (dq__waited_for): looked up
    -- per row only when some child waits at all (one probe for the batch otherwise).
    v_waited := EXISTS (SELECT 1 FROM dq_dependencies);

    -- One statement writes the batch and sums up what it wrote from the rows it returns (never a
    -- join back to the input): the counts, the earliest due time of the ungrouped rows (to wake a
    -- waiter), the groups written to and their due times (to settle them), the rows updated (whose
    -- old group may need settling) and, for the outcomes, the keys created and updated.
    IF dq__offer_many.can_update THEN
        WITH ins AS (
            INSERT INTO dq_messages AS m
                   (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, cron_prefix,
                    priority, message_group, expires_at, headers, has_children)
            SELECT dq__offer_many.queue, u.k, u.p, coalesce(u.t, 'bytes'), coalesce(u.s, v_now), coalesce(u.s, v_now),
                   v_now, dq__offer_many.cron_prefix, coalesce(u.pr, 0), u.g, u.e, u.h,
                   CASE WHEN v_waited THEN dq__waited_for(dq__offer_many.queue, u.k) ELSE false END
              FROM unnest(dq__offer_many.keys, dq__offer_many.payloads,
                          dq__offer_many.scheduled_ats, dq__offer_many.payload_types,
                          dq__offer_many.priorities, dq__offer_many.message_groups,
                          dq__offer_many.expires_ats, dq__offer_many.headers) AS u(k, p, s, t, pr, g, e, h)
             ORDER BY u.k COLLATE "C"
            ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO UPDATE
               SET payload = EXCLUDED.payload,
                   payload_type = EXCLUDED.payload_type,
                   scheduled_at = CASE WHEN m.parents_pending > 0 THEN m.scheduled_at ELSE EXCLUDED.scheduled_at END,
               release_at = CASE WHEN m.parents_pending > 0 THEN EXCLUDED.scheduled_at END,
                   scheduled_at_initially = EXCLUDED.scheduled_at_initially,
                   created_at = EXCLUDED.created_at,
                   delivery_count = 0,
                   lock_token = NULL,
                   last_error = NULL, last_error_at = NULL, due_at = NULL, claimed_at = NULL,
                   cron_prefix = EXCLUDED.cron_prefix, released_at = NULL,
                   priority = EXCLUDED.priority,
               message_group = CASE WHEN m.parents_pending > 0 THEN NULL ELSE EXCLUDED.message_group END,
               release_group = CASE WHEN m.parents_pending > 0 THEN EXCLUDED.message_group END,
                   expires_at = EXCLUDED.expires_at, headers = EXCLUDED.headers
             WHERE m.payload IS DISTINCT FROM EXCLUDED.payload
                OR m.payload_type IS DISTINCT FROM EXCLUDED.payload_type
                OR m.scheduled_at_initially IS DISTINCT FROM EXCLUDED.scheduled_at_initially
                OR m.priority IS DISTINCT FROM EXCLUDED.priority
                OR (CASE WHEN m.parents_pending > 0 THEN m.release_group ELSE m.message_group END)
                IS DISTINCT FROM EXCLUDED.message_group
                OR m.expires_at IS DISTINCT FROM EXCLUDED.expires_at
                OR m.headers IS DISTINCT FROM EXCLUDED.headers
            RETURNING m.key AS k, (m.xmax = 0) AS inserted, m.scheduled_at AS s, m.id, m.message_group AS g
        )
        SELECT count(*) FILTER (WHERE ins.inserted), count(*) FILTER (WHERE NOT ins.inserted),
               min(ins.s) FILTER (WHERE ins.g IS NULL),
               array_agg(ins.g) FILTER (WHERE ins.g IS NOT NULL),
               array_agg(ins.s) FILTER (WHERE ins.g IS NOT NULL),
               array_agg(ins.id) FILTER (WHERE NOT ins.inserted),
               array_agg(ins.k) FILTER (WHERE NOT ins.inserted),
               array_agg(ins.k) FILTER (WHERE ins.inserted AND dq__offer_many.with_outcomes)
          INTO created, updated, v_changed_at, v_groups, v_group_dues, v_updated_ids, v_updated_keys, v_created_keys
          FROM ins;
    ELSE
        WITH ins AS (
            INSERT INTO dq_messages AS m
                   (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at, cron_prefix,
                    priority, message_group, expires_at, headers, has_children)
            SELECT dq__offer_many.queue, u.k, u.p, coalesce(u.t, 'bytes'), coalesce(u.s, v_now), coalesce(u.s, v_now),
                   v_now, dq__offer_many.cron_prefix, coalesce(u.pr, 0), u.g, u.e, u.h,
                   CASE WHEN v_waited THEN dq__waited_for(dq__offer_many.queue, u.k) ELSE false END
              FROM unnest(dq__offer_many.keys, dq__offer_many.payloads,
                          dq__offer_many.scheduled_ats, dq__offer_many.payload_types,
                          dq__offer_many.priorities, dq__offer_many.message_groups,
                          dq__offer_many.expires_ats, dq__offer_many.headers) AS u(k, p, s, t, pr, g, e, h)
             ORDER BY u.k COLLATE "C"
            ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO NOTHING
            RETURNING m.key AS k, m.scheduled_at AS s, m.message_group AS g
        )
        SELECT count(*),
               min(ins.s) FILTER (WHERE ins.g IS NULL),
               array_agg(ins.g) FILTER (WHERE ins.g IS NOT NULL),
               array_agg(ins.s) FILTER (WHERE ins.g IS NOT NULL),
               array_agg(ins.k) FILTER (WHERE dq__offer_many.with_outcomes)
          INTO created, v_changed_at, v_groups, v_group_dues, v_created_keys
          FROM ins;
    END IF;
    ignored := v_n - created - updated;

    -- Groups: those written to (due when their earliest written row is), and those that updated
    -- messages headed before the update moved them to another group (due now); each is settled once,
    -- in lock order (sql/020_groups.sql).
    IF v_updated_ids IS NOT NULL THEN
        v_groups := v_groups || ARRAY(SELECT g.message_group FROM dq_groups g
                                       WHERE g.head_id = ANY (v_updated_ids) AND g.queue = dq__offer_many.queue);
    END IF;
    IF v_groups IS NOT NULL THEN
        v_settled := dq__settle_groups(array_fill(dq__offer_many.queue, ARRAY[cardinality(v_groups)]), v_groups,
                                       v_group_dues);
    END IF;
    -- Wake a waiter that would sleep past the earliest created/updated ungrouped message
    -- (sql/010_wait.sql); v_changed_at is NULL when there is none.
    v_woken := dq__wake(dq__offer_many.queue, v_changed_at);

    -- The outcomes in input order, when some element was not created (keys are distinct: checked).
    IF dq__offer_many.with_outcomes AND created <> v_n THEN
        SELECT array_agg(CASE WHEN c.k IS NOT NULL THEN 'created' WHEN d.k IS NOT NULL THEN 'updated' ELSE 'ignored' END
                         ORDER BY u.i)
          INTO outcomes
          FROM unnest(dq__offer_many.keys) WITH ORDINALITY AS u(k, i)
          LEFT JOIN unnest(v_created_keys) AS c(k) ON c.k = u.k
          LEFT JOIN unnest(v_updated_keys) AS d(k) ON d.k = u.k;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text, integer[], text[], timestamptz[], jsonb[], boolean) IS 'Internal: the body of dq_offer_many and dq_offer_many_counts (fn: the public function named in errors): the numbers of elements created, updated and ignored, and with with_outcomes each outcome in input order (NULL when all were created); cron_prefix is recorded as the owner of the rows it creates or updates (dq_install_tick).';
REVOKE ALL ON FUNCTION dq__offer_many(text, text, text[], bytea[], timestamptz[], boolean, text[], text, integer[], text[], timestamptz[], jsonb[], boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The first error of the afters and on_parent_failures of a dq_offer_many call (fn), whose other
-- arrays dq__offer_many_error found valid; NULL when there is none. Each element follows dq_offer's
-- rules (dq__after_error, the error prefixed with the element: "afters[3]: after[2] ..."), a NULL
-- element of on_parent_failures is wait, and an element may name only elements before it in the
-- batch (so a batch cannot hold a cycle): the order in which dq__offer_many_after offers them.
CREATE OR REPLACE FUNCTION dq__offer_many_after_error(fn text, queue text, keys text[], afters jsonb[],
                                                      on_parent_failures text[])
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    v_n      integer := coalesce(cardinality(keys), 0);
    v_error  jsonb;
    v_row    record;
BEGIN
    IF array_ndims(afters) > 1 OR array_ndims(on_parent_failures) > 1 THEN
        RETURN dq__error('22023', format('%s: arrays must be one-dimensional', fn));
    ELSIF cardinality(afters) <> v_n THEN
        RETURN dq__error('22023', format('%s: afters has %s elements, keys has %s', fn, cardinality(afters), v_n));
    ELSIF cardinality(on_parent_failures) <> v_n THEN
        RETURN dq__error('22023', format('%s: on_parent_failures has %s elements, keys has %s', fn,
                                         cardinality(on_parent_failures), v_n));
    END IF;
    FOR v_row IN
        SELECT u.k, u.a, u.o, u.i FROM unnest(keys, afters, on_parent_failures) WITH ORDINALITY AS u(k, a, o, i)
         WHERE u.a IS NOT NULL OR u.o IS NOT NULL ORDER BY u.i
    LOOP
        IF v_row.o NOT IN ('wait', 'dead_letter', 'proceed') THEN
            RETURN dq__error('22023', format('%s: on_parent_failures[%s] must be wait, dead_letter or proceed, not %s',
                                             fn, v_row.i, v_row.o));
        END IF;
        v_error := dq__after_error(format('%s: afters[%s]', fn, v_row.i), queue, v_row.k, v_row.a, 'wait');
        IF v_error IS NOT NULL THEN
            RETURN v_error;
        END IF;
    END LOOP;
    -- A parent in the batch (a key, or a [queue, key] pair of this queue) at or after its child.
    RETURN (SELECT dq__error('22023', format('%s: afters[%s] names %s (keys[%s]), which comes later in the batch: '
                                             'an element may name only elements before it', fn, a.i, k.k, k.j))
              FROM unnest(afters) WITH ORDINALITY AS a(a, i)
              CROSS JOIN LATERAL jsonb_array_elements(a.a) AS e(e)
              JOIN unnest(keys) WITH ORDINALITY AS k(k, j)
                ON k.k = CASE WHEN jsonb_typeof(e.e) = 'string' THEN e.e #>> '{}' ELSE e.e ->> 1 END
               AND (jsonb_typeof(e.e) = 'string' OR e.e ->> 0 = queue)
             WHERE a.a IS NOT NULL AND k.j > a.i
             ORDER BY a.i, k.j LIMIT 1);
END;
$$;
COMMENT ON FUNCTION dq__offer_many_after_error(text, text, text[], jsonb[], text[]) IS 'Internal: the first error of the afters and on_parent_failures of a dq_offer_many call (dq_offer''s rules per element; a parent in the batch must come before its child), NULL when valid.';
REVOKE ALL ON FUNCTION dq__offer_many_after_error(text, text, text[], jsonb[], text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- dq_offer_many of a batch some of whose elements name parents (afters, checked by
-- dq__offer_many_after_error): the elements without parents first, set-based (dq__offer_many, as a
-- batch without afters), then each element with parents in input order as dq_offer offers it
-- (dq__offer_after, or an ordinary dq_offer when none of its parents exists). An element names
-- only elements before it, so a parent in the batch is offered before its child looks for it.
-- Returns what dq__offer_many returns, outcomes always given.
-- Concurrency: as dq_offer_many for the first part, as dq_offer per element after: each element
-- locks its parents (FOR KEY SHARE, sql/095_dependencies.sql) and inserts its row, in input order,
-- not in key order: two batches that offer the same new keys with parents in different orders at
-- the same time can deadlock (PostgreSQL detects it and fails one with 40P01; retry it).
CREATE OR REPLACE FUNCTION dq__offer_many_after(
    fn                 text,
    queue              text,
    keys               text[],
    payloads           bytea[],
    scheduled_ats      timestamptz[],
    can_update         boolean,
    payload_types      text[],
    priorities         integer[],
    message_groups     text[],
    expires_ats        timestamptz[],
    headers            jsonb[],
    afters             jsonb[],
    on_parent_failures text[],
    OUT created        bigint,
    OUT updated        bigint,
    OUT ignored        bigint,
    OUT outcomes       text[])
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := dq__now();
    v_pos      bigint[];
    v_k        text[];
    v_p        bytea[];
    v_s        timestamptz[];
    v_t        text[];
    v_pr       integer[];
    v_g        text[];
    v_e        timestamptz[];
    v_h        jsonb[];
    v_plain    text[];
    v_row      record;
    v_after    record;
    v_apos     bigint[] := '{}';
    v_aout     text[] := '{}';
    v_outcome  text;
BEGIN
    SELECT array_agg(u.i ORDER BY u.i), array_agg(u.k ORDER BY u.i), array_agg(u.p ORDER BY u.i),
           array_agg(coalesce(u.s, v_now) ORDER BY u.i), array_agg(u.t ORDER BY u.i), array_agg(u.pr ORDER BY u.i),
           array_agg(u.g ORDER BY u.i), array_agg(u.e ORDER BY u.i), array_agg(u.h ORDER BY u.i)
      INTO v_pos, v_k, v_p, v_s, v_t, v_pr, v_g, v_e, v_h
      FROM unnest(dq__offer_many_after.keys, dq__offer_many_after.payloads, dq__offer_many_after.scheduled_ats,
                  dq__offer_many_after.payload_types, dq__offer_many_after.priorities,
                  dq__offer_many_after.message_groups, dq__offer_many_after.expires_ats,
                  dq__offer_many_after.headers, dq__offer_many_after.afters)
           WITH ORDINALITY AS u(k, p, s, t, pr, g, e, h, a, i)
     WHERE coalesce(jsonb_array_length(u.a), 0) = 0;
    IF v_pos IS NOT NULL THEN
        v_plain := (dq__offer_many(dq__offer_many_after.fn, dq__offer_many_after.queue, v_k, v_p, v_s,
                                   dq__offer_many_after.can_update, v_t, NULL, v_pr, v_g, v_e, v_h, true)).outcomes;
    END IF;
    FOR v_row IN
        SELECT u.i, u.k, u.p, coalesce(u.s, v_now) AS s, coalesce(u.t, 'bytes') AS t, coalesce(u.pr, 0) AS pr,
               u.g, u.e, u.h, u.a, coalesce(u.o, 'wait') AS o
          FROM unnest(dq__offer_many_after.keys, dq__offer_many_after.payloads, dq__offer_many_after.scheduled_ats,
                      dq__offer_many_after.payload_types, dq__offer_many_after.priorities,
                      dq__offer_many_after.message_groups, dq__offer_many_after.expires_ats,
                      dq__offer_many_after.headers, dq__offer_many_after.afters,
                      dq__offer_many_after.on_parent_failures)
               WITH ORDINALITY AS u(k, p, s, t, pr, g, e, h, a, o, i)
         WHERE jsonb_array_length(u.a) > 0
         ORDER BY u.i
    LOOP
        v_after := dq__offer_after(dq__offer_many_after.queue, v_row.k, v_row.p, v_row.t, v_row.s,
                                   dq__offer_many_after.can_update, v_row.pr, v_row.g, v_row.e, v_row.h, v_row.a,
                                   v_row.o);
        IF v_after.problem IS NOT NULL THEN
            -- dq__offer_after words its errors for dq_offer: name this function and the element instead.
            RAISE EXCEPTION USING ERRCODE = v_after.problem->>'sqlstate',
                  MESSAGE = regexp_replace(v_after.problem->>'message', '^dq_offer: ',
                                           format('%s: keys[%s]: ', dq__offer_many_after.fn, v_row.i));
        END IF;
        v_outcome := coalesce(v_after.outcome,
                              -- none of its parents exists: an ordinary offer
                              dq_offer(dq__offer_many_after.queue, v_row.k, v_row.p, v_row.s,
                                       dq__offer_many_after.can_update, v_row.t, v_row.pr, v_row.g, v_row.e,
                                       v_row.h));
        v_apos := v_apos || v_row.i;
        v_aout := v_aout || v_outcome;
    END LOOP;
    SELECT count(*) FILTER (WHERE x.o = 'created'), count(*) FILTER (WHERE x.o = 'updated'),
           count(*) FILTER (WHERE x.o = 'ignored'), array_agg(x.o ORDER BY x.i)
      INTO created, updated, ignored, outcomes
      FROM (SELECT u.i, coalesce(u.o, 'created') AS o FROM unnest(v_pos, v_plain) AS u(i, o)
             WHERE u.i IS NOT NULL
            UNION ALL
            SELECT u.i, u.o FROM unnest(v_apos, v_aout) AS u(i, o)) x;
END;
$$;
COMMENT ON FUNCTION dq__offer_many_after(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) IS 'Internal: dq_offer_many of a batch with parents (afters): the elements without parents set-based, then each with parents in input order as dq_offer offers it; counts and outcomes in input order.';
REVOKE ALL ON FUNCTION dq__offer_many_after(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The body of dq_offer_many and dq_offer_many_counts (fn names the caller in errors): every check,
-- the first failing one returned as problem (the caller raises it) with nothing written, then the
-- batch: dq__offer_many_after when an element has parents, else the set-based dq__offer_many
-- (outcomes only when with_outcomes; the counts always). Concurrency: theirs.
CREATE OR REPLACE FUNCTION dq__offer_many_checked(
    fn                 text,
    queue              text,
    keys               text[],
    payloads           bytea[],
    scheduled_ats      timestamptz[],
    can_update         boolean,
    payload_types      text[],
    priorities         integer[],
    message_groups     text[],
    expires_ats        timestamptz[],
    headers            jsonb[],
    afters             jsonb[],
    on_parent_failures text[],
    with_outcomes      boolean,
    OUT created        bigint,
    OUT updated        bigint,
    OUT ignored        bigint,
    OUT outcomes       text[],
    OUT problem        jsonb)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    problem := coalesce(
        dq__offer_many_error(fn, queue, keys, payloads, scheduled_ats, can_update, payload_types, priorities,
                             message_groups, expires_ats, headers),
        CASE WHEN afters IS NOT NULL OR on_parent_failures IS NOT NULL
             THEN dq__offer_many_after_error(fn, queue, keys, afters, on_parent_failures) END);
    IF problem IS NOT NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(afters) AS a(a) WHERE jsonb_array_length(a.a) > 0) THEN
        SELECT o.created, o.updated, o.ignored, o.outcomes INTO created, updated, ignored, outcomes
          FROM dq__offer_many_after(fn, queue, keys, payloads, scheduled_ats, can_update, payload_types, priorities,
                                    message_groups, expires_ats, headers, afters, on_parent_failures) AS o;
    ELSE
        SELECT o.created, o.updated, o.ignored, o.outcomes INTO created, updated, ignored, outcomes
          FROM dq__offer_many(fn, queue, keys, payloads, scheduled_ats, can_update, payload_types, NULL, priorities,
                              message_groups, expires_ats, headers, with_outcomes) AS o;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__offer_many_checked(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[], boolean) IS 'Internal: the checks and the batch of dq_offer_many and dq_offer_many_counts (fn names the caller): (created, updated, ignored, outcomes in input order when with_outcomes or any element has parents; or problem, the error to raise, with nothing written).';
REVOKE ALL ON FUNCTION dq__offer_many_checked(text, text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[], boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- afters (one JSON array per element, as dq_offer's after, or NULL) and on_parent_failures (NULL
-- elements: wait) make elements wait for others; an element may name elements before it in the
-- same call (a graph offered at once). A batch with parents takes dq__offer_many_after (elements
-- without parents stay on the set-based path); one without (afters NULL or every element NULL or
-- empty) is exactly the batch without them.
CREATE OR REPLACE FUNCTION dq_offer_many(
    queue              text,
    keys               text[],
    payloads           bytea[],
    scheduled_ats      timestamptz[] DEFAULT NULL,
    can_update         boolean DEFAULT true,
    payload_types      text[] DEFAULT NULL,
    priorities         integer[] DEFAULT NULL,
    message_groups     text[] DEFAULT NULL,
    expires_ats        timestamptz[] DEFAULT NULL,
    headers            jsonb[] DEFAULT NULL,
    afters             jsonb[] DEFAULT NULL,
    on_parent_failures text[] DEFAULT NULL)
RETURNS TABLE (key text, outcome text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_outcomes text[];
    v_error    jsonb;
BEGIN
    SELECT o.outcomes, o.problem INTO v_outcomes, v_error
      FROM dq__offer_many_checked('dq_offer_many', dq_offer_many.queue, dq_offer_many.keys, dq_offer_many.payloads,
                                  dq_offer_many.scheduled_ats, dq_offer_many.can_update, dq_offer_many.payload_types,
                                  dq_offer_many.priorities, dq_offer_many.message_groups, dq_offer_many.expires_ats,
                                  dq_offer_many.headers, dq_offer_many.afters, dq_offer_many.on_parent_failures,
                                  true) AS o;
    IF v_error ? 'hint' THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
    ELSIF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    -- No outcomes: every element was created. unnest pads the shorter (or NULL) array with NULLs.
    RETURN QUERY SELECT u.k, coalesce(u.o, 'created') FROM unnest(dq_offer_many.keys, v_outcomes) AS u(k, o);
END;
$$;
COMMENT ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) IS 'dq_offer_many(queue, keys, payloads, scheduled_ats, can_update, payload_types, priorities, message_groups, expires_ats, headers, afters, on_parent_failures) -> TABLE(key, outcome): dq_offer for each element, in one statement, outcomes in input order. afters[i] is element i''s after (a JSON array of keys or [queue, key] pairs, or NULL), on_parent_failures[i] its on_parent_failure (NULL: wait); an element may name elements before it in the same call, never after it (so no cycle). Errors: as dq_offer, naming the element (keys[3], afters[2]), and 22023 unequal lengths, a repeated key or a parent later in the batch, 54000 over 100000 elements; nothing is written on error.';
REVOKE ALL ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_offer_many(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) TO dq_producer;

-- dq_offer_many_counts: dq_offer_many for callers that read only how many elements were created,
-- updated and ignored (bulk producers such as the Spark writer): the same body, checks and errors,
-- without building a row per element. Concurrency: as dq_offer_many.
CREATE OR REPLACE FUNCTION dq_offer_many_counts(
    queue              text,
    keys               text[],
    payloads           bytea[],
    scheduled_ats      timestamptz[] DEFAULT NULL,
    can_update         boolean DEFAULT true,
    payload_types      text[] DEFAULT NULL,
    priorities         integer[] DEFAULT NULL,
    message_groups     text[] DEFAULT NULL,
    expires_ats        timestamptz[] DEFAULT NULL,
    headers            jsonb[] DEFAULT NULL,
    afters             jsonb[] DEFAULT NULL,
    on_parent_failures text[] DEFAULT NULL)
RETURNS TABLE (created bigint, updated bigint, ignored bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error  jsonb;
BEGIN
    SELECT o.created, o.updated, o.ignored, o.problem INTO dq_offer_many_counts.created, dq_offer_many_counts.updated,
                                                           dq_offer_many_counts.ignored, v_error
      FROM dq__offer_many_checked('dq_offer_many_counts', dq_offer_many_counts.queue, dq_offer_many_counts.keys,
                                  dq_offer_many_counts.payloads, dq_offer_many_counts.scheduled_ats,
                                  dq_offer_many_counts.can_update, dq_offer_many_counts.payload_types,
                                  dq_offer_many_counts.priorities, dq_offer_many_counts.message_groups,
                                  dq_offer_many_counts.expires_ats, dq_offer_many_counts.headers,
                                  dq_offer_many_counts.afters, dq_offer_many_counts.on_parent_failures, false) AS o;
    IF v_error ? 'hint' THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message', HINT = v_error->>'hint';
    ELSIF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN NEXT;
END;
$$;
COMMENT ON FUNCTION dq_offer_many_counts(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) IS 'dq_offer_many_counts(queue, keys, payloads, scheduled_ats, can_update, payload_types, priorities, message_groups, expires_ats, headers, afters, on_parent_failures) -> TABLE(created, updated, ignored): dq_offer_many returning one row of counts instead of a row per element. Errors: as dq_offer_many; nothing is written on error.';
REVOKE ALL ON FUNCTION dq_offer_many_counts(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) FROM PUBLIC;
-- dq_producer offers, like dq_offer_many.
GRANT EXECUTE ON FUNCTION dq_offer_many_counts(text, text[], bytea[], timestamptz[], boolean, text[], integer[], text[], timestamptz[], jsonb[], jsonb[], text[]) TO dq_producer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
