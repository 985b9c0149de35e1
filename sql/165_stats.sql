-- Stats: dq_queue_stats and the view dq_stats.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- Stats. Counting a million index entries takes hundreds of milliseconds, so each count is exact
-- up to dq__stats_exact_limit() rows and estimated beyond it (the column approximate says so):
--  * a live count past the limit comes from the planner's statistics of dq_messages (rows of the
--    queue from pg_stats' most common values times reltuples, minus the other, exact, figures;
--    split by the scheduled_at histogram when both ready and scheduled are past the limit);
--  * an archive count past the limit is extrapolated from the time the limit-th newest row was
--    acknowledged.

-- Rows of one queue in a table of the install with a column queue (dq_messages, dq_archive)
-- according to the planner's statistics: the table's reltuples times the queue's share of the column
-- (its most-common-values frequency, else an even share of the rest); NULL when there are none yet.
CREATE OR REPLACE FUNCTION dq__estimated_queue_rows(tablename text, queue text)
RETURNS double precision
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_tuples  double precision;
    v_vals    text[];
    v_freqs   real[];
    v_ndist   real;
    v_pos     integer;
    v_share   double precision;
BEGIN
    SELECT greatest(c.reltuples, 0) INTO v_tuples FROM pg_class c
     WHERE c.oid = to_regclass(format('%I.%I', dq__schema(), dq__estimated_queue_rows.tablename));
    SELECT s.most_common_vals::text::text[], s.most_common_freqs, s.n_distinct INTO v_vals, v_freqs, v_ndist
      FROM pg_stats s
     WHERE s.schemaname = dq__schema() AND s.tablename = dq__estimated_queue_rows.tablename AND s.attname = 'queue';
    IF NOT FOUND OR v_tuples IS NULL THEN
        RETURN NULL;
    END IF;
    v_pos := array_position(v_vals, dq__estimated_queue_rows.queue);
    IF v_pos IS NOT NULL THEN
        v_share := v_freqs[v_pos];
    ELSE
        v_share := (1 - coalesce((SELECT sum(f) FROM unnest(v_freqs) f), 0))
                 / greatest(CASE WHEN v_ndist < 0 THEN -v_ndist * v_tuples ELSE v_ndist END
                            - coalesce(array_length(v_vals, 1), 0), 1);
    END IF;
    RETURN v_tuples * v_share;
END;
$$;
COMMENT ON FUNCTION dq__estimated_queue_rows(text, text) IS 'Internal: planner-statistics estimate of a queue''s rows in dq_messages or dq_archive (dq_queue_stats and dq_metrics past the exact limit).';
REVOKE ALL ON FUNCTION dq__estimated_queue_rows(text, text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Rows of one queue in dq_messages according to the planner's statistics, all or the due share (by
-- the scheduled_at histogram); NULL when there are none yet.
CREATE OR REPLACE FUNCTION dq__estimated_rows(queue text, due_fraction_of boolean)
RETURNS double precision
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_rows    double precision := dq__estimated_queue_rows('dq_messages'::text, dq__estimated_rows.queue);
    v_bounds  timestamptz[];
BEGIN
    IF v_rows IS NULL OR NOT due_fraction_of THEN
        RETURN v_rows;
    END IF;
    SELECT s.histogram_bounds::text::timestamptz[] INTO v_bounds
      FROM pg_stats s WHERE s.schemaname = dq__schema() AND s.tablename = 'dq_messages' AND s.attname = 'scheduled_at';
    IF v_bounds IS NULL OR array_length(v_bounds, 1) < 2 THEN
        RETURN v_rows / 2;
    END IF;
    RETURN v_rows * (width_bucket(dq__now(), v_bounds) - 0.5) / (array_length(v_bounds, 1) - 1)::double precision;
END;
$$;
COMMENT ON FUNCTION dq__estimated_rows(text, boolean) IS 'Internal: planner-statistics estimate of a queue''s rows (all, or the due share), for dq_queue_stats past its exact limit.';
REVOKE ALL ON FUNCTION dq__estimated_rows(text, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Live messages of a queue due in (after, until], counted up to up_to: each of the two indexes by due
-- time is read for at most up_to entries (ungrouped messages and dead letters in
-- dq_messages_ready_idx, one priority level at a time (dq__levels); grouped messages in
-- dq_messages_grouped_idx).
CREATE OR REPLACE FUNCTION dq__stats_due_count(queue text, after timestamptz, until timestamptz, up_to integer)
RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
BEGIN
    RETURN (SELECT count(*) FROM (
        SELECT 1 FROM dq__levels(queue) AS l(p)
         CROSS JOIN LATERAL (SELECT 1 FROM dq_messages d
                              WHERE d.queue = queue AND (d.message_group IS NULL OR d.dead_from IS NOT NULL)
                                AND d.priority = l.p AND d.scheduled_at > after AND d.scheduled_at <= until
                              LIMIT up_to) x
        UNION ALL
        (SELECT 1 FROM dq_messages m
          WHERE m.queue = queue AND m.message_group IS NOT NULL AND m.dead_from IS NULL
            AND m.scheduled_at > after AND m.scheduled_at <= until
          LIMIT up_to)
        LIMIT up_to) s);
END;
$$;
COMMENT ON FUNCTION dq__stats_due_count(text, timestamptz, timestamptz, integer) IS 'Internal: the live messages of a queue due in (after, until], counted up to up_to (dq_queue_stats).';
REVOKE ALL ON FUNCTION dq__stats_due_count(text, timestamptz, timestamptz, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- How long the oldest due message of a queue has waited at `at` (NULL: none is due), and the
-- earliest due time after `at` of a message not in flight (NULL: none).
CREATE OR REPLACE FUNCTION dq__stats_times(queue text, at timestamptz,
                                           OUT oldest_ready_age interval, OUT next_due timestamptz)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
BEGIN
    SELECT at - min(x.t) INTO oldest_ready_age FROM (
        SELECT (SELECT d.scheduled_at FROM dq_messages d
                 WHERE d.queue = queue AND (d.message_group IS NULL OR d.dead_from IS NOT NULL) AND d.priority = l.p
                 ORDER BY d.scheduled_at LIMIT 1) AS t
          FROM dq__levels(queue) AS l(p)
        UNION ALL
        SELECT min(m.scheduled_at) FROM dq_messages m
         WHERE m.queue = queue AND m.message_group IS NOT NULL AND m.dead_from IS NULL) x
     WHERE x.t <= at;
    SELECT min(x.t) INTO next_due FROM (
        SELECT (SELECT d.scheduled_at FROM dq_messages d
                 WHERE d.queue = queue AND (d.message_group IS NULL OR d.dead_from IS NOT NULL) AND d.priority = l.p
                   AND d.scheduled_at > at AND d.lock_token IS NULL AND d.scheduled_at < dq__blocked_time()
                 ORDER BY d.scheduled_at LIMIT 1) AS t
          FROM dq__levels(queue) AS l(p)
        UNION ALL
        SELECT min(m.scheduled_at) FROM dq_messages m
         WHERE m.queue = queue AND m.message_group IS NOT NULL AND m.dead_from IS NULL
           AND m.scheduled_at > at AND m.lock_token IS NULL) x;
END;
$$;
COMMENT ON FUNCTION dq__stats_times(text, timestamptz) IS 'Internal: the age of the oldest due message of a queue and the due time of the next one not in flight (dq_queue_stats).';
REVOKE ALL ON FUNCTION dq__stats_times(text, timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Acknowledgements of a queue in the minute and the hour before `at`, from its archive: exact up to
-- up_to rows, beyond that extrapolated from how long the newest up_to acknowledgements took
-- (approximate).
CREATE OR REPLACE FUNCTION dq__stats_acked(queue text, at timestamptz, up_to integer,
                                           OUT last_minute bigint, OUT last_hour bigint, OUT approximate boolean)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    v_tenth  timestamptz;
BEGIN
    approximate := false;
    SELECT count(*) INTO last_minute FROM (
        SELECT 1 FROM dq_archive a WHERE a.queue = queue AND a.acked_at > at - interval '1 minute'
           AND a.outcome = 'acked' LIMIT up_to + 1) s;
    SELECT count(*) INTO last_hour FROM (
        SELECT 1 FROM dq_archive a WHERE a.queue = queue AND a.acked_at > at - interval '1 hour'
           AND a.outcome = 'acked' LIMIT up_to + 1) s;
    IF last_hour > up_to THEN
        approximate := true;
        SELECT a.acked_at INTO v_tenth FROM dq_archive a
         WHERE a.queue = queue AND a.outcome = 'acked' ORDER BY a.acked_at DESC OFFSET up_to - 1 LIMIT 1;
        IF last_minute > up_to THEN
            last_minute := (up_to * 60 / greatest(extract(epoch FROM at - v_tenth), 0.001))::bigint;
        END IF;
        last_hour := (up_to * 3600 / greatest(extract(epoch FROM at - v_tenth), 0.001))::bigint;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__stats_acked(text, timestamptz, integer) IS 'Internal: a queue''s acknowledgements in the last minute and hour from its archive, exact up to up_to rows, else extrapolated (dq_queue_stats).';
REVOKE ALL ON FUNCTION dq__stats_acked(text, timestamptz, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

CREATE OR REPLACE FUNCTION dq_queue_stats(queue text)
RETURNS dq_stats_row
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_q        text := dq_queue_stats.queue;
    v_error    jsonb := dq__name_error('dq_queue_stats', 'queue', dq_queue_stats.queue, dq__limit_queue_chars());
    v_limit    integer := dq__stats_exact_limit();
    v_now      timestamptz := dq__clock();
    v_due      bigint;   -- due now: ready, including expired locks (they are redelivered)
    v_future   bigint;   -- not due: scheduled and in flight
    v_blocked  bigint;   -- waiting for parents (due at dq__blocked_time(), after every due time)
    v_approx   boolean := false;
    v_archive  boolean;
    v_est      double precision;
    v_acked    record;
    v_groups   bigint;
    r          dq_stats_row;
BEGIN
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    r.queue := v_q;
    v_due := dq__stats_due_count(v_q, '-infinity', v_now, v_limit + 1);
    v_future := dq__stats_due_count(v_q, v_now, dq__max_time(), v_limit + 1);
    -- Blocked: children waiting for their parents (sql/095_dependencies.sql), stored due at
    -- dq__blocked_time(), the only rows due after dq__max_time(): the same index ranges, past it.
    -- Counted up to the limit + 1 (no estimate finer than "more than the limit").
    v_blocked := dq__stats_due_count(v_q, dq__max_time(), 'infinity', v_limit + 1);
    IF v_blocked > v_limit THEN
        v_approx := true;
    END IF;
    r.blocked := v_blocked;
    -- In flight: held under a lock that has not expired (dq_messages_in_flight_idx), counted
    -- up to the limit + 1 like the others (redelivered: of those counted).
    SELECT count(*), count(*) FILTER (WHERE s.delivery_count > 1) INTO r.in_flight, r.redelivered
      FROM (SELECT m.delivery_count FROM dq_messages m
             WHERE m.lock_token IS NOT NULL AND m.delivery_count > 0 AND m.queue = v_q AND m.scheduled_at > v_now
             LIMIT v_limit + 1) s;
    IF r.in_flight > v_limit THEN
        v_approx := true;  -- no estimate finer than "more than the limit", as for dead letters
    END IF;
    SELECT count(*) INTO r.dead FROM (
        SELECT 1 FROM dq_messages m WHERE m.dead_from = v_q LIMIT v_limit + 1) s;
    IF r.dead > v_limit THEN
        v_approx := true;  -- dead letters of one origin: no estimate finer than "more than the limit"
    END IF;
    IF v_due > v_limit OR v_future > v_limit THEN
        v_approx := true;
        IF v_due > v_limit AND v_future > v_limit THEN
            v_est := dq__estimated_rows(v_q, true);
            v_due := greatest(v_limit + 1, coalesce(v_est, 0)::bigint);
            v_future := greatest(v_limit + 1,
                                 (coalesce(dq__estimated_rows(v_q, false), 0) - v_due - v_blocked)::bigint);
        ELSIF v_due > v_limit THEN
            v_due := greatest(v_limit + 1,
                              (coalesce(dq__estimated_rows(v_q, false), 0) - v_future - v_blocked)::bigint);
        ELSE
            v_future := greatest(v_limit + 1,
                                 (coalesce(dq__estimated_rows(v_q, false), 0) - v_due - v_blocked)::bigint);
        END IF;
    END IF;
    r.ready := v_due;
    r.scheduled := greatest(v_future - r.in_flight, 0);
    SELECT s.oldest_ready_age, s.next_due INTO r.oldest_ready_age, r.next_due FROM dq__stats_times(v_q, v_now) s;
    SELECT q.archive, coalesce(q.paused, false) INTO v_archive, r.paused FROM dq_queues q WHERE q.queue = v_q;
    r.paused := coalesce(r.paused, false);
    -- Held: messages of FIFO groups behind their group's head (counted in ready or scheduled too).
    SELECT count(*) INTO r.held FROM (
        SELECT 1 FROM dq_messages m
         WHERE m.queue = v_q AND m.message_group IS NOT NULL AND m.dead_from IS NULL LIMIT v_limit + 1) s;
    IF r.held > 0 THEN
        SELECT count(*) INTO v_groups FROM dq_groups g WHERE g.queue = v_q;
        IF r.held > v_limit THEN
            v_approx := true;
        END IF;
        r.held := greatest(r.held - v_groups, 0);
    END IF;
    -- Expired: past expires_at and not removed yet (a poll that reaches them removes them); not a
    -- blocked message (its expiry is checked once it is released).
    SELECT count(*) INTO r.expired FROM (
        SELECT 1 FROM dq_messages m WHERE m.queue = v_q AND m.expires_at <= v_now
           AND m.scheduled_at < dq__blocked_time() LIMIT v_limit + 1) s;
    IF r.expired > v_limit THEN
        v_approx := true;
    END IF;
    IF coalesce(v_archive, false) THEN
        v_acked := dq__stats_acked(v_q, v_now, v_limit);
        r.acked_last_minute := v_acked.last_minute;
        r.acked_last_hour := v_acked.last_hour;
        v_approx := v_approx OR v_acked.approximate;
    END IF;
    r.approximate := v_approx;
    RETURN r;
END;
$$;
COMMENT ON FUNCTION dq_queue_stats(text) IS 'dq_queue_stats(queue text) -> dq_stats_row: the queue''s counts (ready, scheduled, in flight, redelivered, dead, held, expired, blocked: waiting for parents, in none of ready, scheduled or expired; acknowledged in the last minute and hour), oldest_ready_age, next_due and paused; counts past 20000 rows are estimated (approximate; in flight, redelivered, dead, held, expired and blocked then stop at 20001). Errors: 22004/22023/22001 queue.';
REVOKE ALL ON FUNCTION dq_queue_stats(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_queue_stats(text) TO dq_admin, dq_viewer;

-- One row per queue: every queue with messages (found by a skip scan of the (queue, scheduled_at)
-- index, one probe per queue, not a scan of the table) and every configured queue.
CREATE OR REPLACE VIEW dq_stats AS
WITH RECURSIVE live AS (
    SELECT (SELECT m.queue FROM dq_messages m ORDER BY m.queue LIMIT 1) AS queue
    UNION ALL
    SELECT (SELECT m.queue FROM dq_messages m WHERE m.queue > live.queue ORDER BY m.queue LIMIT 1)
      FROM live WHERE live.queue IS NOT NULL
), names AS (
    SELECT live.queue FROM live WHERE live.queue IS NOT NULL
    UNION
    SELECT q.queue FROM dq_queues q
)
SELECT s.*
  FROM names
 CROSS JOIN LATERAL dq_queue_stats(names.queue) s
 ORDER BY s.queue;
COMMENT ON VIEW dq_stats IS 'One row per queue: dq_queue_stats of every queue with messages and every configured queue.';
-- Reading it is an operator's business (the view runs with its owner's rights): dq_admin and the
-- read-only dq_viewer.
REVOKE ALL ON dq_stats FROM PUBLIC;
GRANT SELECT ON dq_stats TO dq_admin, dq_viewer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
