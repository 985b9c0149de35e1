-- Dependencies: a message offered after others (dq_offer's after) is delivered once each of them is
-- acknowledged.
--
-- A parent is named by (queue, key): the ordinary message with that key in that queue (not a dead
-- letter). An update of it (a re-offer of the key) is the same parent; so is the message that a
-- redrive brings back after it was dead-lettered. A parent that does not exist when its child is
-- offered (never offered, or already acknowledged) is satisfied: the usual race is a parent that
-- finishes before its child is offered, and the child must then not wait for ever. So the offer
-- decides under the parents' row locks (below) which parents it waits for, and an acknowledgement
-- either sees the child's dependency (and releases it) or happened before the offer looked.
--
-- Storage (migration 0017): one dq_dependencies row per (parent queue, parent key, child id) with the
-- child's on_parent_failure; the child is stored blocked: scheduled_at dq__blocked_time() (9999-12-31, after any due time) and no message_group
-- (no poll, group or due-time path ever sees it), parents_pending the number of its rows, release_at
-- and release_group its due time and FIFO group once released. A parent carries has_children: its
-- acknowledgement leaves dq_ack's plain delete and goes through dq__gone, which releases the
-- children. has_children is set on the parent row by an UPDATE (not only a lock) so that an ack that
-- read its plan before the child's offer committed re-checks the row (EvalPlanQual) and sees it.
--
-- What happens when a parent leaves otherwise (dead-lettered, cancelled, expired, purged), chosen per
-- child with on_parent_failure: wait (the default: the child stays blocked by that parent; a
-- dead-lettered parent that is redriven and acknowledged releases it), proceed (as if acknowledged)
-- or dead_letter (the child goes to its own queue's dead-letter queue; a queue without one keeps it
-- waiting). A child that leaves (cancelled, expired, purged, dead-lettered) takes its dependency rows
-- with it. Cycles cannot form: only a new message names parents, and a new message has no children,
-- unless children still wait for an earlier message of its key that left (wait): then the offer walks
-- those descendants and refuses a parent among them.
--
-- Deferred release (migration 0018): an acknowledged parent releases at most
-- dq__limit_release_inline() of its children (the lowest ids) in its own transaction, and wakes their
-- queues, so a consumer idle on a queue gets the first of them at once; the rest is one
-- dq_release_backlog row (parent_queue, parent_key, after_id, up_to): the dependency rows of that name
-- with child ids in (after_id, up_to] stay until released in chunks of the same size by the next
-- dq_poll_many of any queue (when the backlog is not empty) and by the pg_cron job dq-release. A
-- later message of the same name is a new parent: only dependency rows with child ids above the
-- highest up_to of its name are its children (its children are offered after it, so after the
-- acknowledgement that wrote the backlog committed: higher ids). dq_dependencies shows a child of
-- the backlog as blocked by a parent 'releasing'. The other fates of a parent (dead-lettered,
-- cancelled, expired, purged) stay inline: they are not the consumer's hot path.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)

-- The error for a bad after or on_parent_failure of fn (NULL when both are valid). after is NULL, or
-- a JSON array of at most dq__limit_after_parents_max() elements, each a key (a string: a message of
-- the child's own queue) or a [queue, key] pair; the child itself is not a parent.
CREATE OR REPLACE FUNCTION dq__after_error(fn text, queue text, key text, after jsonb, on_parent_failure text)
RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    v_error  jsonb;
    v_e      jsonb;
    v_i      integer := 0;
    v_q      text;
    v_k      text;
BEGIN
    IF on_parent_failure IS NULL THEN
        RETURN dq__null_error(fn, 'on_parent_failure');
    ELSIF on_parent_failure NOT IN ('wait', 'dead_letter', 'proceed') THEN
        RETURN dq__error('22023', format('%s: on_parent_failure must be wait, dead_letter or proceed, not %s',
                                         fn, on_parent_failure));
    END IF;
    IF after IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(after) <> 'array' THEN
        RETURN dq__error('22023', format('%s: after must be a JSON array of keys or [queue, key] pairs, not %s',
                                         fn, jsonb_typeof(after)));
    END IF;
    IF jsonb_array_length(after) > dq__limit_after_parents_max() THEN
        RETURN dq__error('54000', format('%s: after names %s parents, more than %s', fn, jsonb_array_length(after),
                                         dq__limit_after_parents_max()));
    END IF;
    FOR v_e IN SELECT e FROM jsonb_array_elements(after) AS e LOOP
        v_i := v_i + 1;
        IF jsonb_typeof(v_e) = 'string' THEN
            v_q := queue;
            v_k := v_e #>> '{}';
        ELSIF jsonb_typeof(v_e) = 'array' AND jsonb_array_length(v_e) = 2
              AND jsonb_typeof(v_e -> 0) = 'string' AND jsonb_typeof(v_e -> 1) = 'string' THEN
            v_q := v_e ->> 0;
            v_k := v_e ->> 1;
        ELSE
            RETURN dq__error('22023', format('%s: after[%s] must be a key or a [queue, key] pair, not %s',
                                             fn, v_i, v_e));
        END IF;
        v_error := coalesce(dq__name_error(fn, format('after[%s] queue', v_i), v_q, dq__limit_queue_chars()),
                            dq__name_error(fn, format('after[%s] key', v_i), v_k, dq__limit_key_chars()));
        IF v_error IS NOT NULL THEN
            RETURN v_error;
        END IF;
        IF v_q = queue AND v_k = key THEN
            RETURN dq__error('22023', format('%s: after[%s] names the message itself (%s, %s)', fn, v_i, v_q, v_k));
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION dq__after_error(text, text, text, jsonb, text) IS 'Internal: the error for a bad after (a JSON array of keys or [queue, key] pairs, not the message itself, at most dq__limit_after_parents_max()) or on_parent_failure (wait, dead_letter, proceed) of fn; NULL when valid.';
REVOKE ALL ON FUNCTION dq__after_error(text, text, text, jsonb, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Whether children still wait for a message named (queue, key): dependency rows name it (its message
-- left while they waited: dead-lettered and gone, cancelled or expired with `wait`, or acknowledged with
-- children still in the release backlog). A new ordinary message of that name is their parent: an
-- offer stores it with has_children, so that its acknowledgement goes through dq__gone and releases
-- them (dq__resolve leaves the backlog's range to the backlog). A SQL function, inlined into the
-- offers' INSERT: one probe of the dependencies' primary key.
CREATE OR REPLACE FUNCTION dq__waited_for(queue text, key text)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM dq_dependencies d WHERE d.parent_queue = $1 AND d.parent_key = $2)
$$;
COMMENT ON FUNCTION dq__waited_for(text, text) IS 'Internal: whether dependency rows name (queue, key) as a parent (children still wait for a message of that name).';
REVOKE ALL ON FUNCTION dq__waited_for(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The ids of the rows of these parents (queues[i], keys[i]) as of now, ascending: each one's
-- ordinary message and its dead letters (dead_from names the queue it left); NULL when none exists.
-- A plain read (no lock): dq__lock_parents locks them. Index paths only (the caller's settings).
CREATE OR REPLACE FUNCTION dq__parent_row_ids(queues text[], keys text[])
RETURNS bigint[]
LANGUAGE sql STABLE SET search_path FROM CURRENT
AS $$
    SELECT array_agg(r.id ORDER BY r.id) FROM (
        SELECT m.id FROM unnest($1, $2) AS p(q, k)
          JOIN dq_messages m ON m.queue = p.q AND m.key = p.k AND m.dead_from IS NULL
        UNION ALL
        SELECT m.id FROM unnest($1, $2) AS p(q, k)
          JOIN dq_messages m ON m.dead_from = p.q AND m.key = p.k) r
$$;
COMMENT ON FUNCTION dq__parent_row_ids(text[], text[]) IS 'Internal: the ids (ascending) of the ordinary messages and dead letters of these parents (queues[i], keys[i]), as of now; NULL when none exists.';
REVOKE ALL ON FUNCTION dq__parent_row_ids(text[], text[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Lock the rows of these parents (pq[i], pk[i]) FOR KEY SHARE and mark them has_children, for an
-- offer after them (dq__offer_after, whose comment says why). ids: their rows as the caller found
-- them (dq__parent_row_ids). Returns, one element per row locked, its parent's queue and key (lq,
-- lk: a parent may have two rows, its message and a dead letter of it) and whether the row is a
-- dead letter (ld); NULL arrays when no parent exists any more. A row that vanished while we waited
-- (acknowledged, or moved by a dead-letter or a redrive: a new row the locking statement's snapshot
-- cannot see) is looked for again by a new statement, until every parent visible to the latest
-- statement is locked.
-- nowait: take every lock NOWAIT, raising lock_not_available (55P03) when another transaction
-- holds a conflicting one (the caller rolls back to before this call: see dq__offer_after); else
-- wait for each, in id order.
-- The mark is an UPDATE, so that an ack that planned a plain delete re-checks the row, and is one
-- statement for all the rows (one UPDATE a row took 150 ms for 10,000 parents). The rows it updates
-- are first locked FOR NO KEY UPDATE (NOWAIT when nowait), so the UPDATE itself never waits; a row
-- another offer marked meanwhile is re-checked and skipped. Ids in ascending order (the primary key
-- visits the ids of `= ANY` in order; bitmap scans, which visit rows in table order, are off), so
-- that offers that wait (one parent row) do not deadlock with each other.
CREATE OR REPLACE FUNCTION dq__lock_parents(pq text[], pk text[], ids bigint[], nowait boolean,
                                            OUT lq text[], OUT lk text[], OUT ld boolean[])
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids    bigint[] := dq__lock_parents.ids;
    v_seen   bigint[] := '{}';
    v_todo_q text[] := dq__lock_parents.pq;
    v_todo_k text[] := dq__lock_parents.pk;
    v_locked bigint[];
    v_mark   bigint[];
    v_got_q  text[];
    v_got_k  text[];
    v_got_d  boolean[];
BEGIN
    lq := '{}';
    lk := '{}';
    ld := '{}';
    LOOP
        v_seen := v_seen || v_ids;
        IF dq__lock_parents.nowait THEN
            SELECT array_agg(l.id), array_agg(l.q), array_agg(l.k), array_agg(l.d) INTO v_locked, v_got_q, v_got_k, v_got_d
              FROM (SELECT m.id, coalesce(m.dead_from, m.queue) AS q, m.key AS k, m.dead_from IS NOT NULL AS d
                      FROM dq_messages m WHERE m.id = ANY (v_ids) ORDER BY m.id FOR KEY SHARE NOWAIT) l;
            v_mark := ARRAY(SELECT m.id FROM dq_messages m WHERE m.id = ANY (v_locked) AND NOT m.has_children
                             ORDER BY m.id FOR NO KEY UPDATE NOWAIT);
        ELSE
            SELECT array_agg(l.id), array_agg(l.q), array_agg(l.k), array_agg(l.d) INTO v_locked, v_got_q, v_got_k, v_got_d
              FROM (SELECT m.id, coalesce(m.dead_from, m.queue) AS q, m.key AS k, m.dead_from IS NOT NULL AS d
                      FROM dq_messages m WHERE m.id = ANY (v_ids) ORDER BY m.id FOR KEY SHARE) l;
            v_mark := ARRAY(SELECT m.id FROM dq_messages m WHERE m.id = ANY (v_locked) AND NOT m.has_children
                             ORDER BY m.id FOR NO KEY UPDATE);
        END IF;
        IF cardinality(v_mark) > 0 THEN
            UPDATE dq_messages m SET has_children = true WHERE m.id = ANY (v_mark);
        END IF;
        IF v_locked IS NOT NULL THEN
            lq := lq || v_got_q;
            lk := lk || v_got_k;
            ld := ld || v_got_d;
        END IF;
        EXIT WHEN coalesce(cardinality(v_locked), 0) = cardinality(v_ids);
        -- Some row vanished while we waited: look again for the parents not locked yet.
        SELECT array_agg(p.q), array_agg(p.k) INTO v_todo_q, v_todo_k
          FROM unnest(dq__lock_parents.pq, dq__lock_parents.pk) AS p(q, k)
         WHERE NOT EXISTS (SELECT 1 FROM unnest(lq, lk) AS l(q, k) WHERE l.q = p.q AND l.k = p.k);
        EXIT WHEN v_todo_q IS NULL;
        SELECT array_agg(i) INTO v_ids FROM unnest(dq__parent_row_ids(v_todo_q, v_todo_k)) AS i
         WHERE NOT (i = ANY (v_seen));
        EXIT WHEN v_ids IS NULL;
    END LOOP;
    IF cardinality(lq) = 0 THEN
        lq := NULL;
        lk := NULL;
        ld := NULL;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__lock_parents(text[], text[], bigint[], boolean) IS 'Internal: locks the rows (ids, from dq__parent_row_ids) of the parents (pq[i], pk[i]) of an offer FOR KEY SHARE and marks them has_children, NOWAIT when nowait (else waiting in id order); returns the locked rows'' parent queues, keys and whether each is a dead letter (NULL when none is left).';
REVOKE ALL ON FUNCTION dq__lock_parents(text[], text[], bigint[], boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Offer a new message after its parents (after checked by dq__after_error, not empty). Returns
-- outcome NULL when no parent exists (all satisfied: the caller offers an ordinary message), else
-- created, or ignored (the key exists and can_update is false); problem is the error for the caller to
-- raise: 22023 when the key exists and can_update (after applies to a new message), or a parent is
-- a descendant of the message (a cycle through children still waiting for an earlier message of its
-- key).
-- Concurrency (READ COMMITTED): each existing parent row (its ordinary message, or a dead letter of
-- it, which a redrive may bring back) is locked FOR KEY SHARE and marked has_children by an UPDATE
-- (when not marked yet); both hold to the end of the transaction (dq__lock_parents). An ack or
-- dead-letter of a parent (a DELETE) therefore waits for this offer's commit, and its dq__gone, a
-- later statement, sees the dependency rows; an ack that chose dq_ack's plain delete before the mark
-- re-checks the updated row and leaves that path. A parent row that vanished while we waited for its
-- lock (acknowledged: satisfied; or dead-lettered or redriven: DELETE and INSERT of a new row,
-- invisible to the locking statement's snapshot) is looked for again by a new statement, until every
-- parent visible to the latest statement is locked. A parent acknowledged before the first look is
-- satisfied. The child is inserted with ON CONFLICT DO NOTHING: a concurrent offer of the same key
-- that won is reported as for an existing key.
-- Deadlocks: an offer never waits for a parent's lock while it holds another parent's lock taken
-- here. With one parent row, it waits for that row. With more, it takes all of them NOWAIT in a
-- subtransaction; when one is held by another transaction (lock_not_available, 55P03), the
-- subtransaction is rolled back, releasing those it took, and the offer waits for the rows one at a
-- time (each lock given back at once), then tries again. A batch acknowledgement (dq_ack_many) may
-- therefore delete its rows in any order; before, it had to delete in id order, which cost 8% of the
-- poll+ack rate with batches of 100 (tests/workflows/test_lock_order.py has the interleaving).
-- Cost: one subtransaction per offer with more than one parent row (a transaction that makes more
-- than 64 of them overflows the backend's subtransaction cache until it ends; see "Subtransactions"
-- in the PostgreSQL manual).
CREATE OR REPLACE FUNCTION dq__offer_after(queue text, key text, payload bytea, payload_type text,
                                           scheduled_at timestamptz, can_update boolean, priority integer,
                                           message_group text, expires_at timestamptz, headers jsonb,
                                           after jsonb, on_parent_failure text,
                                           OUT outcome text, OUT problem jsonb)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET enable_seqscan = off     -- index paths at every table size (stale statistics after a bulk offer)
SET enable_bitmapscan = off  -- the mark walks the primary key, in id order
AS $$
#variable_conflict use_column
DECLARE
    v_pq       text[];
    v_pk       text[];
    v_lq       text[];
    v_lk       text[];
    v_ld       boolean[];
    v_got_q    text[];
    v_got_k    text[];
    v_ids      bigint[];
    v_id       bigint;
    v_orphans  boolean;
    v_cycle    text;
    v_failed   boolean := false;
    v_dlq      text;
BEGIN
    IF EXISTS (SELECT 1 FROM dq_messages m
                WHERE m.queue = dq__offer_after.queue AND m.key = dq__offer_after.key AND m.dead_from IS NULL) THEN
        IF dq__offer_after.can_update THEN
            problem := dq__error('22023', format('dq_offer: after applies to a new message; %s of queue %s exists '
                                                 '(offer it without after, or cancel it first)',
                                                 dq__offer_after.key, dq__offer_after.queue));
        ELSE
            outcome := 'ignored';
        END IF;
        RETURN;
    END IF;
    SELECT array_agg(p.q ORDER BY p.q COLLATE "C", p.k COLLATE "C"), array_agg(p.k ORDER BY p.q COLLATE "C", p.k COLLATE "C")
      INTO v_pq, v_pk
      FROM (SELECT DISTINCT CASE WHEN jsonb_typeof(e) = 'string' THEN dq__offer_after.queue ELSE e ->> 0 END AS q,
                            CASE WHEN jsonb_typeof(e) = 'string' THEN e #>> '{}' ELSE e ->> 1 END AS k
              FROM jsonb_array_elements(dq__offer_after.after) AS e) p;
    IF v_pq IS NULL THEN
        RETURN;
    END IF;

    -- Children still waiting for an earlier message of this key: the new message is their parent
    -- too (its ack releases them), so none of its own parents may descend from it.
    v_orphans := EXISTS (SELECT 1 FROM dq_dependencies d
                          WHERE d.parent_queue = dq__offer_after.queue AND d.parent_key = dq__offer_after.key);
    IF v_orphans THEN
        WITH RECURSIVE descendant(q, k) AS (
            SELECT m.queue, m.key FROM dq_dependencies d JOIN dq_messages m ON m.id = d.child_id
             WHERE d.parent_queue = dq__offer_after.queue AND d.parent_key = dq__offer_after.key
               AND NOT EXISTS (SELECT 1 FROM dq_release_backlog b  -- an acknowledged message's: released soon
                                WHERE b.parent_queue = d.parent_queue AND b.parent_key = d.parent_key
                                  AND b.up_to >= d.child_id)
            UNION
            SELECT m.queue, m.key FROM descendant s
              JOIN dq_dependencies d ON d.parent_queue = s.q AND d.parent_key = s.k
              JOIN dq_messages m ON m.id = d.child_id
        )
        SELECT format('(%s, %s)', s.q, s.k) INTO v_cycle
          FROM descendant s JOIN unnest(v_pq, v_pk) AS p(q, k) ON p.q = s.q AND p.k = s.k LIMIT 1;
        IF v_cycle IS NOT NULL THEN
            problem := dq__error('22023', format('dq_offer: after names %s, which waits for %s of queue %s: a cycle',
                                                 v_cycle, dq__offer_after.key, dq__offer_after.queue));
            RETURN;
        END IF;
    END IF;

    -- Lock the parents that exist (see Concurrency above).
    v_ids := dq__parent_row_ids(v_pq, v_pk);
    IF cardinality(v_ids) = 1 THEN
        SELECT l.lq, l.lk, l.ld INTO v_lq, v_lk, v_ld FROM dq__lock_parents(v_pq, v_pk, v_ids, false) l;
    ELSE
        WHILE v_ids IS NOT NULL LOOP
            BEGIN
                SELECT l.lq, l.lk, l.ld INTO v_lq, v_lk, v_ld FROM dq__lock_parents(v_pq, v_pk, v_ids, true) l;
                EXIT;
            EXCEPTION WHEN lock_not_available THEN
                NULL;  -- rolled back: this call holds none of the parents' locks
            END;
            -- Wait for each row in turn, the lock given back at once (a subtransaction rolled back):
            -- FOR NO KEY UPDATE waits for whatever conflicts with either lock dq__lock_parents takes.
            FOREACH v_id IN ARRAY v_ids LOOP
                BEGIN
                    PERFORM 1 FROM dq_messages m WHERE m.id = v_id FOR NO KEY UPDATE;
                    RAISE EXCEPTION USING ERRCODE = 'raise_exception';
                EXCEPTION WHEN raise_exception THEN
                    NULL;
                END;
            END LOOP;
            v_ids := dq__parent_row_ids(v_pq, v_pk);
        END LOOP;
    END IF;
    -- A parent found only as a dead letter (no ordinary message of its name) has failed already: the
    -- child's on_parent_failure applies now, as it would have had the child been offered before.
    -- proceed: that parent is satisfied; dead_letter: the child goes to its queue's dead-letter queue
    -- once stored (below); wait: it waits for a redrive. The dead letters are locked (above), so a
    -- redrive of one waits for this offer, and an ordinary message of that name that a plain offer
    -- inserts meanwhile is a later message (as any offer of a key whose message left).
    v_lq := coalesce(v_lq, '{}');
    v_lk := coalesce(v_lk, '{}');
    IF dq__offer_after.on_parent_failure <> 'wait' AND cardinality(v_lq) > 0 THEN
        SELECT array_agg(l.q), array_agg(l.k), bool_or(l.dead_only) INTO v_got_q, v_got_k, v_failed
          FROM (SELECT l.q, l.k, bool_and(l.dead) AS dead_only
                  FROM unnest(v_lq, v_lk, v_ld) AS l(q, k, dead) GROUP BY l.q, l.k) l
         WHERE NOT (l.dead_only AND dq__offer_after.on_parent_failure = 'proceed');
        v_lq := coalesce(v_got_q, '{}');
        v_lk := coalesce(v_got_k, '{}');
        v_failed := coalesce(v_failed, false);
    END IF;
    IF cardinality(v_lq) = 0 THEN
        RETURN;  -- every parent is satisfied
    END IF;

    INSERT INTO dq_messages AS m
           (queue, key, payload, payload_type, scheduled_at, scheduled_at_initially, created_at,
            priority, message_group, expires_at, headers, parents_pending, release_at, release_group, has_children)
    SELECT dq__offer_after.queue, dq__offer_after.key, dq__offer_after.payload, dq__offer_after.payload_type,
           dq__blocked_time(), dq__offer_after.scheduled_at, dq__now(), dq__offer_after.priority, NULL,
           dq__offer_after.expires_at, dq__offer_after.headers, count(DISTINCT (l.q, l.k)),
           dq__offer_after.scheduled_at, dq__offer_after.message_group, v_orphans
      FROM unnest(v_lq, v_lk) AS l(q, k)
    ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key DO NOTHING
    RETURNING m.id INTO v_id;
    IF v_id IS NULL THEN
        IF dq__offer_after.can_update THEN
            problem := dq__error('22023', format('dq_offer: after applies to a new message; %s of queue %s exists',
                                                 dq__offer_after.key, dq__offer_after.queue));
        ELSE
            outcome := 'ignored';
        END IF;
        RETURN;
    END IF;
    -- No ON CONFLICT: the rows name the child just inserted, which no other transaction can name
    -- yet, and DISTINCT merges a parent locked twice (its message and a dead letter of it).
    INSERT INTO dq_dependencies (parent_queue, parent_key, child_id, on_parent_failure)
    SELECT DISTINCT l.q, l.k, v_id, dq__offer_after.on_parent_failure FROM unnest(v_lq, v_lk) AS l(q, k);
    outcome := 'created';
    IF v_failed THEN  -- dead_letter after a parent that is a dead letter: there now, if the queue has one
        SELECT q.dead_letter_queue INTO v_dlq FROM dq_queues q WHERE q.queue = dq__offer_after.queue;
        IF v_dlq IS NOT NULL THEN
            PERFORM dq__dead_letter(ARRAY[v_id], v_dlq, dq__now());
        END IF;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__offer_after(text, text, bytea, text, timestamptz, boolean, integer, text, timestamptz, jsonb, jsonb, text) IS 'Internal: dq_offer of a new message after its parents (see sql/095_dependencies.sql): (outcome NULL when no parent exists, created or ignored; problem: the error to raise).';
REVOKE ALL ON FUNCTION dq__offer_after(text, text, bytea, text, timestamptz, boolean, integer, text, timestamptz, jsonb, jsonb, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Take parents_pending of the children (ids, one element per dependency row gone: a child may
-- appear more than once) down by their count; a child that reaches 0 is released: due at release_at,
-- in release_group. Settles the released children's FIFO groups and wakes their queues' waiters
-- (the queues and earliest due times come from the UPDATE itself: no second read of the rows).
-- Returns how many were released. A released child records when, in released_at (the archive keeps
-- it): dq__clock(), the instant its row is released, the clock the acknowledgements read (dq_ack
-- passes dq__clock() to dq__gone as the time of the outcome); not dq__now(), the start of the
-- transaction, which comes before the parent's acknowledgement in that same transaction and would
-- give every chunk of a long backlog run (the job dq-release, up to 100,000 children) the run's start.
-- So in the archive a child's released_at follows its parent's acked_at.
-- Concurrency: the caller locked the children's rows FOR NO KEY UPDATE in id order (two transactions
-- releasing the same children lock them in the same order) and deleted the dependency rows it counts
-- (DELETE .. RETURNING: a row deleted by another transaction meanwhile is not counted twice).
CREATE OR REPLACE FUNCTION dq__release_children(ids bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET enable_seqscan = off  -- index paths at every table size (stale statistics after a bulk offer)
AS $$
DECLARE
    v_count    integer;
    v_queues   text[];
    v_groups   text[];
    v_dues     timestamptz[];
    v_wq       text[];
    v_wdue     timestamptz[];
    v_settled  integer;
    v_woken    boolean;
    v_i        integer;
BEGIN
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    WITH c AS (
        SELECT u.id, count(*)::integer AS n FROM unnest(dq__release_children.ids) AS u(id) GROUP BY u.id
    ), upd AS (
        UPDATE dq_messages m
           SET parents_pending = greatest(m.parents_pending - c.n, 0),
               scheduled_at = CASE WHEN m.parents_pending <= c.n THEN m.release_at ELSE m.scheduled_at END,
               message_group = CASE WHEN m.parents_pending <= c.n THEN m.release_group ELSE m.message_group END,
               release_at = CASE WHEN m.parents_pending <= c.n THEN NULL ELSE m.release_at END,
               release_group = CASE WHEN m.parents_pending <= c.n THEN NULL ELSE m.release_group END,
               released_at = CASE WHEN m.parents_pending <= c.n THEN dq__clock() ELSE m.released_at END
          FROM c
         WHERE m.id = c.id AND m.parents_pending > 0
        RETURNING m.queue, m.scheduled_at, m.message_group, m.parents_pending = 0 AS released
    ), w AS (
        SELECT upd.queue, min(upd.scheduled_at) AS due FROM upd
         WHERE upd.released AND upd.message_group IS NULL GROUP BY upd.queue
    )
    SELECT count(*) FILTER (WHERE upd.released),
           array_agg(upd.queue) FILTER (WHERE upd.released AND upd.message_group IS NOT NULL),
           array_agg(upd.message_group) FILTER (WHERE upd.released AND upd.message_group IS NOT NULL),
           array_agg(upd.scheduled_at) FILTER (WHERE upd.released AND upd.message_group IS NOT NULL),
           (SELECT array_agg(w.queue ORDER BY w.queue) FROM w),
           (SELECT array_agg(w.due ORDER BY w.queue) FROM w)
      INTO v_count, v_queues, v_groups, v_dues, v_wq, v_wdue
      FROM upd;
    IF v_groups IS NOT NULL THEN
        -- A released grouped child joins its group in order of scheduled_at_initially (sql/020_groups.sql).
        v_settled := dq__settle_groups(v_queues, v_groups, v_dues);
    END IF;
    FOR v_i IN 1 .. coalesce(cardinality(v_wq), 0) LOOP
        v_woken := dq__wake(v_wq[v_i], v_wdue[v_i]);
    END LOOP;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq__release_children(bigint[]) IS 'Internal: takes the children''s parents_pending down by how often each id is given, releasing those that reach 0 (due at release_at, in release_group, released_at the current instant, dq__clock()), their groups settled and waiters woken; returns how many were released. The caller locked the children''s rows in id order.';
REVOKE ALL ON FUNCTION dq__release_children(bigint[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Release children of acknowledged parents: the dependency rows (pq[i], pk[i], children[i]) go, and
-- each child's parents_pending falls by one (dq__release_children). The children's rows are locked
-- first, FOR NO KEY UPDATE in id order, as a leaving child does (its row is deleted before its
-- dependency rows): a child cancelled meanwhile cannot deadlock with this. A dependency row another
-- transaction deleted meanwhile (the child left, or an acknowledgement of a later message of the
-- parent's name took it) is not counted twice (DELETE .. RETURNING). Returns how many children were
-- released. Used by dq__resolve (an acknowledgement) and dq__release_backlog; no SET clause: it runs
-- with theirs.
CREATE OR REPLACE FUNCTION dq__release_pairs(pq text[], pk text[], children bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_release bigint[];
BEGIN
    PERFORM 1 FROM dq_messages m WHERE m.id = ANY (dq__release_pairs.children) ORDER BY m.id FOR NO KEY UPDATE;
    WITH gone AS (
        DELETE FROM dq_dependencies d
         USING unnest(dq__release_pairs.pq, dq__release_pairs.pk, dq__release_pairs.children) AS t(q, k, c)
         WHERE d.parent_queue = t.q AND d.parent_key = t.k AND d.child_id = t.c
        RETURNING d.child_id
    )
    SELECT array_agg(gone.child_id) INTO v_release FROM gone;
    RETURN dq__release_children(v_release);
END;
$$;
COMMENT ON FUNCTION dq__release_pairs(text[], text[], bigint[]) IS 'Internal: releases children of acknowledged parents: deletes the dependency rows (pq[i], pk[i], children[i]), the children''s rows locked first in id order, and takes their parents_pending down (dq__release_children); returns how many were released.';
REVOKE ALL ON FUNCTION dq__release_pairs(text[], text[], bigint[]) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- What follows for dependencies from messages leaving (dq__gone, dq_purge; outcome acked, dead,
-- cancelled, expired or purged). Rows that are children (parents_pending > 0) take their dependency
-- rows with them. Rows that are parents (has_children, ordinary messages): acked releases their
-- children, at most dq__limit_release_inline() of them here (parent by parent in id order, each's
-- lowest child ids first), the rest being recorded in dq_release_backlog (see Deferred release in the header); any
-- other outcome applies each child's on_parent_failure, here, to every child: proceed (as acked),
-- dead_letter (the child goes to its queue's dead-letter queue: dq__dead_letter, which calls dq__gone
-- for it in turn; a queue without one keeps the child waiting), wait (nothing changes: the child
-- stays blocked by this (queue, key); a redriven dead letter of it is the same parent). Only children
-- offered after the parent's name left a backlog count: those of the backlog (ids up to its up_to)
-- belong to the earlier, acknowledged message of that name. Returns how many children were released
-- or dead-lettered.
-- Concurrency: the caller deleted the rows (holding their locks to commit): an offer naming one of
-- them as a parent either locked it before (the caller waited; this later statement sees its
-- dependency rows) or looks after the commit and finds it gone, so the dependency rows of a parent
-- name do not change until the caller commits, and the backlog's up_to (their highest child id) is
-- final; a child offered after a later message of that name gets a higher id. Dependency rows are
-- deleted with DELETE .. RETURNING, so two transactions never count one twice; children are locked
-- in id order before their dependency rows are touched (and FOR UPDATE before they are dead-lettered).
CREATE OR REPLACE FUNCTION dq__resolve(gone dq_messages[], outcome text, at timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET enable_seqscan = off  -- index paths at every table size (stale statistics after a bulk offer)
AS $$
DECLARE
    v_children  bigint[];
    v_pq        text[];
    v_pk        text[];
    v_floor     bigint[];
    v_budget    integer := dq__limit_release_inline();
    v_i         integer;
    v_some      bigint[];
    v_tq        text[] := '{}';
    v_tk        text[] := '{}';
    v_take      bigint[] := '{}';
    v_release   bigint[];
    v_dead      bigint[];
    v_count     integer := 0;
    v_row       record;
    v_moved     integer;
BEGIN
    SELECT array_agg(g.id) FILTER (WHERE g.parents_pending > 0),
           array_agg(g.queue ORDER BY g.id) FILTER (WHERE g.has_children AND g.dead_from IS NULL),
           array_agg(g.key ORDER BY g.id) FILTER (WHERE g.has_children AND g.dead_from IS NULL)
      INTO v_children, v_pq, v_pk
      FROM unnest(dq__resolve.gone) g;
    IF v_children IS NOT NULL THEN
        DELETE FROM dq_dependencies d WHERE d.child_id = ANY (v_children);
    END IF;
    IF v_pq IS NULL THEN
        RETURN 0;
    END IF;
    -- Each parent's floor: the children up to it are an earlier message's, left to its backlog.
    SELECT array_agg(coalesce(b.up_to, 0) ORDER BY p.i) INTO v_floor
      FROM unnest(v_pq, v_pk) WITH ORDINALITY AS p(q, k, i)
      LEFT JOIN LATERAL (SELECT max(b.up_to) AS up_to FROM dq_release_backlog b
                          WHERE b.parent_queue = p.q AND b.parent_key = p.k) b ON true;
    IF dq__resolve.outcome = 'acked' THEN
        -- Up to the budget, in child-id order (the primary key's), parent by parent; the rest of a
        -- parent's children to the backlog, as the range (last one taken, highest child id]. The
        -- children are read in a new statement: it sees every offer that named these parents (an
        -- offer still open holds a parent's lock, which the caller waited for).
        FOR v_i IN 1 .. cardinality(v_pq) LOOP
            SELECT array_agg(s.child_id ORDER BY s.child_id) INTO v_some
              FROM (SELECT d.child_id FROM dq_dependencies d
                     WHERE d.parent_queue = v_pq[v_i] AND d.parent_key = v_pk[v_i] AND d.child_id > v_floor[v_i]
                     ORDER BY d.child_id LIMIT v_budget + 1) s;
            CONTINUE WHEN v_some IS NULL;
            IF cardinality(v_some) > v_budget THEN
                INSERT INTO dq_release_backlog (parent_queue, parent_key, after_id, up_to, acked_at)
                SELECT v_pq[v_i], v_pk[v_i], coalesce(v_some[v_budget], v_floor[v_i]), max(d.child_id), dq__resolve.at
                  FROM dq_dependencies d WHERE d.parent_queue = v_pq[v_i] AND d.parent_key = v_pk[v_i];
                v_some := v_some[1:v_budget];
            END IF;
            v_take := v_take || v_some;
            v_tq := v_tq || array_fill(v_pq[v_i], ARRAY[cardinality(v_some)]);
            v_tk := v_tk || array_fill(v_pk[v_i], ARRAY[cardinality(v_some)]);
            v_budget := v_budget - cardinality(v_some);
        END LOOP;
        v_count := dq__release_pairs(v_tq, v_tk, v_take);
    ELSE
        PERFORM 1 FROM dq_messages m
         WHERE m.id IN (SELECT d.child_id FROM dq_dependencies d JOIN unnest(v_pq, v_pk, v_floor) AS p(q, k, f)
                            ON d.parent_queue = p.q AND d.parent_key = p.k AND d.child_id > p.f)
         ORDER BY m.id FOR NO KEY UPDATE;
        WITH gone AS (
            DELETE FROM dq_dependencies d USING unnest(v_pq, v_pk, v_floor) AS p(q, k, f)
             WHERE d.parent_queue = p.q AND d.parent_key = p.k AND d.child_id > p.f
               AND d.on_parent_failure = 'proceed'
            RETURNING d.child_id
        )
        SELECT array_agg(gone.child_id) INTO v_release FROM gone;
        SELECT array_agg(DISTINCT d.child_id) INTO v_dead
          FROM dq_dependencies d JOIN unnest(v_pq, v_pk, v_floor) AS p(q, k, f)
            ON d.parent_queue = p.q AND d.parent_key = p.k AND d.child_id > p.f
         WHERE d.on_parent_failure = 'dead_letter';
        v_count := dq__release_children(v_release);
    END IF;
    IF v_dead IS NOT NULL THEN
        -- Each child to its own queue's dead-letter queue, its row locked first (id order).
        FOR v_row IN
            SELECT c.queue, q.dead_letter_queue, array_agg(c.id ORDER BY c.id) AS ids
              FROM (SELECT m.id, m.queue FROM dq_messages m
                     WHERE m.id = ANY (v_dead) AND m.parents_pending > 0 AND m.dead_from IS NULL
                     ORDER BY m.id FOR UPDATE) c
              JOIN dq_queues q ON q.queue = c.queue AND q.dead_letter_queue IS NOT NULL
             GROUP BY c.queue, q.dead_letter_queue
             ORDER BY c.queue
        LOOP
            v_moved := dq__dead_letter(v_row.ids, v_row.dead_letter_queue, dq__resolve.at);
            v_count := v_count + v_moved;
        END LOOP;
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq__resolve(dq_messages[], text, timestamptz) IS 'Internal: what follows for dependencies from rows leaving with this outcome: a child''s dependency rows go; an acknowledged parent releases up to dq__limit_release_inline() children and leaves the rest to dq_release_backlog, another outcome applies each child''s on_parent_failure (see sql/095_dependencies.sql); returns how many children were released or dead-lettered.';
REVOKE ALL ON FUNCTION dq__resolve(dq_messages[], text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Release up to max_children children of the backlog, the oldest acknowledgement first, each in
-- child-id order; returns how many children were released (their last parent gone). A child that
-- left meanwhile (cancelled, expired, purged, dead-lettered) took its dependency rows along and is
-- neither counted nor brought back. Called by dq_poll_many (one chunk of dq__limit_release_inline()
-- when the backlog is not empty) and by dq_release_backlog (the job dq-release).
-- Concurrency: each backlog row is taken FOR UPDATE SKIP LOCKED, so two runners at once (polls, the
-- job) never work on the same row, and none waits for another; the children's rows are then locked
-- FOR NO KEY UPDATE in id order before their dependency rows are deleted (DELETE .. RETURNING: a row
-- deleted by another transaction, a leaving child or an acknowledgement of a later message of the
-- parent's name, is not counted twice). The row's after_id moves past what was released, under its lock.
CREATE OR REPLACE FUNCTION dq__release_backlog(max_children integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT
SET enable_seqscan = off  -- index paths at every table size
AS $$
DECLARE
    v_b        record;
    v_ids      bigint[];
    v_left     integer := dq__release_backlog.max_children;
    v_count    integer := 0;
BEGIN
    WHILE v_left > 0 LOOP
        SELECT b.id, b.parent_queue, b.parent_key, b.after_id, b.up_to INTO v_b
          FROM dq_release_backlog b ORDER BY b.id LIMIT 1 FOR UPDATE SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        SELECT array_agg(s.child_id ORDER BY s.child_id) INTO v_ids
          FROM (SELECT d.child_id FROM dq_dependencies d
                 WHERE d.parent_queue = v_b.parent_queue AND d.parent_key = v_b.parent_key
                   AND d.child_id > v_b.after_id AND d.child_id <= v_b.up_to
                 ORDER BY d.child_id LIMIT v_left) s;
        IF coalesce(cardinality(v_ids), 0) < v_left OR v_ids[cardinality(v_ids)] = v_b.up_to THEN
            DELETE FROM dq_release_backlog b WHERE b.id = v_b.id;  -- its range is done
        ELSE
            UPDATE dq_release_backlog b SET after_id = v_ids[cardinality(v_ids)] WHERE b.id = v_b.id;
        END IF;
        CONTINUE WHEN v_ids IS NULL;
        v_count := v_count + dq__release_pairs(array_fill(v_b.parent_queue, ARRAY[cardinality(v_ids)]),
                                               array_fill(v_b.parent_key, ARRAY[cardinality(v_ids)]), v_ids);
        v_left := v_left - cardinality(v_ids);
    END LOOP;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq__release_backlog(integer) IS 'Internal: releases up to max_children children left in dq_release_backlog by acknowledgements (oldest first, FOR UPDATE SKIP LOCKED: concurrent runners take different rows); returns how many were released.';
REVOKE ALL ON FUNCTION dq__release_backlog(integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- Release the children that acknowledgements left to the backlog, up to max_children of them (the
-- job dq-release calls it; so may an operator where pg_cron is not installed and a queue's children
-- are never polled for: any dq_poll_many releases one chunk when the backlog is not empty). One
-- transaction: the children it releases stay locked until it commits. Concurrency: dq__release_backlog.
CREATE OR REPLACE FUNCTION dq_release_backlog(max_children integer DEFAULT 100000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    v_error  jsonb;
BEGIN
    v_error := dq__range_error('dq_release_backlog', 'max_children', dq_release_backlog.max_children, 1,
                               dq__limit_release_backlog_max());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN dq__release_backlog(dq_release_backlog.max_children);
END;
$$;
COMMENT ON FUNCTION dq_release_backlog(integer) IS 'dq_release_backlog(max_children integer default 100000) -> integer: releases up to max_children children whose parents were acknowledged but that the acknowledgement left to the backlog (a parent with more than 500 children), oldest acknowledgement first, and returns how many were released; polls and the pg_cron job dq-release call it too. Errors: 22004/22023 max_children (1..1000000).';
REVOKE ALL ON FUNCTION dq_release_backlog(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_release_backlog(integer) TO dq_admin;

-- A message's dependencies: its parents (relation parent: their state now, absent when acknowledged
-- or gone, dead when only a dead letter of it exists, releasing when it was acknowledged and the
-- child waits in the backlog) and the children waiting for it (relation child, state blocked, or
-- releasing in the backlog). state is dq__message_state's (blocked, in_flight, ready, scheduled,
-- held, expired), dead, absent or releasing. A plain read: no lock is taken, nothing changes.
CREATE OR REPLACE FUNCTION dq_dependencies(queue text, key text)
RETURNS TABLE (relation text, related_queue text, related_key text, state text, on_parent_failure text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT  -- reads dq__clock()
AS $$
#variable_conflict use_column
DECLARE
    v_error  jsonb;
    v_now    timestamptz := dq__clock();
BEGIN
    v_error := coalesce(dq__name_error('dq_dependencies', 'queue', dq_dependencies.queue, dq__limit_queue_chars()),
                        dq__name_error('dq_dependencies', 'key', dq_dependencies.key, dq__limit_key_chars()));
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN QUERY
    SELECT 'parent'::text, d.parent_queue, d.parent_key,
           coalesce((SELECT 'releasing' FROM dq_release_backlog b
                      WHERE b.parent_queue = d.parent_queue AND b.parent_key = d.parent_key AND b.up_to >= d.child_id
                      LIMIT 1),
                     (SELECT dq__message_state(p.lock_token, p.scheduled_at, p.dead_from, p.expires_at,
                                              p.message_group,
                                              EXISTS (SELECT 1 FROM dq_groups g WHERE g.head_id = p.id), v_now)
                       FROM dq_messages p
                      WHERE p.queue = d.parent_queue AND p.key = d.parent_key AND p.dead_from IS NULL),
                    (SELECT 'dead' FROM dq_messages p
                      WHERE p.dead_from = d.parent_queue AND p.key = d.parent_key LIMIT 1),
                    'absent'),
           d.on_parent_failure
      FROM dq_messages c JOIN dq_dependencies d ON d.child_id = c.id
     WHERE c.queue = dq_dependencies.queue AND c.key = dq_dependencies.key AND c.dead_from IS NULL
    UNION ALL
    SELECT 'child'::text, c.queue, c.key,
           CASE WHEN EXISTS (SELECT 1 FROM dq_release_backlog b
                              WHERE b.parent_queue = d.parent_queue AND b.parent_key = d.parent_key
                                AND b.up_to >= d.child_id)
                THEN 'releasing' ELSE 'blocked' END,
           d.on_parent_failure
      FROM dq_dependencies d JOIN dq_messages c ON c.id = d.child_id
     WHERE d.parent_queue = dq_dependencies.queue AND d.parent_key = dq_dependencies.key
     ORDER BY 1 DESC, 2, 3;
END;
$$;
COMMENT ON FUNCTION dq_dependencies(text, text) IS 'dq_dependencies(queue text, key text) -> TABLE (relation text, related_queue text, related_key text, state text, on_parent_failure text): the parents the message waits for (relation parent; state blocked, in_flight, ready, scheduled, held, expired, dead, absent, or releasing: acknowledged, the child is in the release backlog) and the children waiting for it (relation child, state blocked or releasing); a plain read. Errors: 22004/22023/22001 queue or key.';
REVOKE ALL ON FUNCTION dq_dependencies(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_dependencies(text, text) TO dq_consumer, dq_viewer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
