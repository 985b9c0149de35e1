-- Observability: dq_metrics (every queue's figures in one row, for a metrics exporter) and
-- dq_table_health with its view dq_health (the figures of the queue's tables, the xmin horizon and
-- the pg_cron jobs that predict trouble). Both are read-only and granted to dq_viewer (and dq_admin).
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)

-- The archive rows of a queue by outcome (the outcomes dq_archive holds: acked, dead, cancelled,
-- expired). Exact up to up_to rows; beyond, the queue's archive rows are estimated from the
-- planner's statistics (dq__estimated_queue_rows) and split in the proportions of its up_to + 1
-- newest rows (read backwards from dq_archive_queue_acked_at_idx), and approximate is true.
CREATE OR REPLACE FUNCTION dq__archive_counts(queue text, up_to integer,
                                              OUT acked bigint, OUT dead bigint, OUT cancelled bigint,
                                              OUT expired bigint, OUT approximate boolean)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    v_seen   bigint;
    v_scale  double precision;
BEGIN
    SELECT count(*) FILTER (WHERE s.outcome = 'acked'), count(*) FILTER (WHERE s.outcome = 'dead'),
           count(*) FILTER (WHERE s.outcome = 'cancelled'), count(*) FILTER (WHERE s.outcome = 'expired'), count(*)
      INTO acked, dead, cancelled, expired, v_seen
      FROM (SELECT a.outcome FROM dq_archive a WHERE a.queue = queue ORDER BY a.acked_at DESC LIMIT up_to + 1) s;
    approximate := v_seen > up_to;
    IF approximate THEN
        v_scale := greatest(coalesce(dq__estimated_queue_rows('dq_archive'::text, queue), 0), v_seen) / v_seen;
        acked := round(acked * v_scale)::bigint;
        dead := round(dead * v_scale)::bigint;
        cancelled := round(cancelled * v_scale)::bigint;
        expired := round(expired * v_scale)::bigint;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__archive_counts(text, integer) IS 'Internal: a queue''s archive rows by outcome, exact up to up_to rows, else estimated (dq_metrics).';
REVOKE ALL ON FUNCTION dq__archive_counts(text, integer) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The smallest size a B-tree index could have with its current entries (as after REINDEX), in bytes;
-- NULL while its table has never been vacuumed or analyzed (no statistics). The entries: the index's
-- reltuples at its last vacuum or analyze, scaled by the table's live rows since (pg_stat). Each
-- entry: an 8-byte index tuple header plus the average width of its columns (pg_stats), rounded up
-- to 8 bytes, plus a 4-byte line pointer; entries with equal keys of a non-unique index share one
-- tuple whose posting list holds 6 bytes per entry (deduplication, PostgreSQL 13 and later; the
-- distinct keys are at most the product of the columns' n_distinct, each thinned for a partial
-- index as in a random subset of the table's rows). Leaf pages hold 8152 bytes (8 kB less the page
-- header and B-tree trailer) packed full, plus one parent entry per leaf page and the metapage.
-- Alignment padding between columns, null bitmaps and the fillfactor (REINDEX fills leaf pages to
-- 90%) are left out, so the estimate stays below what REINDEX builds (PostgreSQL manual, "B-Tree
-- Indexes", "Deduplication").
CREATE OR REPLACE FUNCTION dq__index_minimum_bytes(index oid)
RETURNS double precision
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_ix       record;
    v_entries  double precision;
    v_share    double precision;
    v_width    double precision;
    v_keys     double precision;
    v_tuple    double precision;
    v_bytes    double precision;
    v_page     double precision := current_setting('block_size')::double precision - 24 - 16;
    v_leaf     double precision;
BEGIN
    SELECT x.indrelid, x.indisunique, x.indnkeyatts, x.indkey::int2[]::integer[] AS keys,
           greatest(i.reltuples, 0) AS entries, t.reltuples AS table_rows, t.relname::text AS table_name
      INTO v_ix
      FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
     WHERE x.indexrelid = dq__index_minimum_bytes.index;
    IF NOT FOUND OR v_ix.table_rows < 0 THEN
        RETURN NULL;
    END IF;
    v_entries := CASE WHEN v_ix.table_rows > 0
                      THEN v_ix.entries * pg_stat_get_live_tuples(v_ix.indrelid) / v_ix.table_rows
                      ELSE 0 END;
    v_share := CASE WHEN v_ix.table_rows > 0 THEN least(v_ix.entries / v_ix.table_rows, 1) ELSE 1 END;
    -- Widths of every stored column (key and INCLUDE), distinct keys of the key columns.
    SELECT sum(coalesce(s.avg_width, nullif(a.attlen, -1), 16)),
           exp(sum(ln(greatest(CASE WHEN k.i > v_ix.indnkeyatts THEN 1
                                    WHEN s.n_distinct IS NULL OR s.n_distinct = 0 THEN v_entries
                                    WHEN v_share >= 1 THEN d.n
                                    ELSE d.n * (1 - exp(greatest(ln(1 - v_share) * greatest(v_ix.table_rows, 1) / d.n, -700)))
                                    END, 1))))
      INTO v_width, v_keys
      FROM unnest(v_ix.keys) WITH ORDINALITY AS k(attnum, i)
      LEFT JOIN pg_attribute a ON a.attrelid = v_ix.indrelid AND a.attnum = k.attnum AND k.attnum > 0
      LEFT JOIN pg_stats s ON s.schemaname = dq__schema() AND s.tablename = v_ix.table_name
                          AND s.attname = a.attname
      CROSS JOIN LATERAL (SELECT greatest(CASE WHEN s.n_distinct < 0 THEN -s.n_distinct * v_ix.table_rows
                                               ELSE s.n_distinct END, 1)::double precision AS n) d;
    v_tuple := ceil((8 + coalesce(v_width, 0)) / 8) * 8 + 4;
    IF v_ix.indisunique THEN
        v_bytes := v_entries * v_tuple;
    ELSE
        -- A posting list holds at most about a third of a page of 6-byte entries.
        v_keys := least(greatest(v_keys, ceil(v_entries / floor(v_page / 3 / 6))), v_entries);
        v_bytes := v_keys * v_tuple + (v_entries - v_keys) * 6;
    END IF;
    v_leaf := ceil(v_bytes / v_page);
    RETURN (v_leaf + ceil(v_leaf * v_tuple / v_page) + 1) * current_setting('block_size')::double precision;
END;
$$;
COMMENT ON FUNCTION dq__index_minimum_bytes(oid) IS 'Internal: the estimated size in bytes of a B-tree index rebuilt with its current entries; NULL before its table has statistics (dq_table_health).';
REVOKE ALL ON FUNCTION dq__index_minimum_bytes(oid) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- A timestamp as Unix epoch seconds (NULL stays NULL) and as text for a person ('never' for NULL).
CREATE OR REPLACE FUNCTION dq__epoch(at timestamptz)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT extract(epoch FROM at)::double precision $$;
COMMENT ON FUNCTION dq__epoch(timestamptz) IS 'Internal: a timestamp as Unix epoch seconds (dq_metrics, dq_table_health).';
REVOKE ALL ON FUNCTION dq__epoch(timestamptz) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

-- One row per queue (the queues of dq_stats: every queue with messages and every configured one)
-- with its counts, its delivery controls and what they use, and its archive by outcome: what a
-- metrics exporter scrapes. Cheap at any size: the counts are those of dq_queue_stats (exact up to
-- 20,000 rows, estimated beyond), the archive's too (dq__archive_counts), and the rest are index
-- probes. A plain read under the caller's snapshot (STABLE): no lock beyond ACCESS SHARE, so it never
-- blocks and is never blocked by producers, consumers or vacuum; its figures are as of the
-- statement's start, like dq_stats'.
-- The result gained blocked (messages waiting for their parents): a new return type, so the
-- function is dropped and created again in the installer's transaction.
DROP FUNCTION IF EXISTS dq_metrics();
CREATE OR REPLACE FUNCTION dq_metrics()
RETURNS TABLE (queue text, ready bigint, scheduled bigint, in_flight bigint, redelivered bigint, dead bigint,
               expired bigint, held bigint, blocked bigint, paused boolean, oldest_ready_age_seconds double precision,
               next_due timestamptz, approximate boolean, is_dead_letter_queue boolean, max_in_flight integer,
               rate_limit integer, rate_limit_period_seconds double precision, rate_limit_used bigint,
               archive boolean, acked_last_minute bigint, acked_last_hour bigint, archived_acked bigint,
               archived_dead bigint, archived_cancelled bigint, archived_expired bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := dq__clock();
    v_limit  integer := dq__stats_exact_limit();
BEGIN
    RETURN QUERY
    SELECT s.queue, s.ready, s.scheduled, s.in_flight, s.redelivered, s.dead, s.expired, s.held, s.blocked, s.paused,
           extract(epoch FROM s.oldest_ready_age)::double precision, s.next_due,
           s.approximate OR coalesce(a.approximate, false),
           EXISTS (SELECT 1 FROM dq_queues d WHERE d.dead_letter_queue = s.queue),
           q.max_in_flight, q.rate_limit, extract(epoch FROM q.rate_period)::double precision,
           -- Deliveries in the current window: the rate-limit log's rows used within rate_period.
           CASE WHEN q.rate_limit IS NOT NULL THEN
               (SELECT count(*) FROM dq_rate_tokens t WHERE t.queue = s.queue AND t.used_at > v_now - q.rate_period) END,
           coalesce(q.archive, false), s.acked_last_minute, s.acked_last_hour,
           a.acked, a.dead, a.cancelled, a.expired
      FROM dq_stats s
      LEFT JOIN dq_queues q ON q.queue = s.queue
      -- Archive counts only for archiving queues (a one-time filter before the call).
      LEFT JOIN LATERAL (SELECT c.* FROM dq__archive_counts(s.queue, v_limit) c WHERE q.archive) a ON true
     ORDER BY s.queue;
END;
$$;
COMMENT ON FUNCTION dq_metrics() IS 'dq_metrics() -> SETOF (queue, ready, scheduled, in_flight, redelivered, dead, expired, held, blocked, paused, oldest_ready_age_seconds, next_due, approximate, is_dead_letter_queue, max_in_flight, rate_limit, rate_limit_period_seconds, rate_limit_used, archive, acked_last_minute, acked_last_hour, archived_acked, archived_dead, archived_cancelled, archived_expired): one row per queue of dq_stats, counts in messages, ages and periods in seconds; counts past 20000 rows are estimated (approximate); archive figures NULL unless the queue archives. A plain read (STABLE, no lock taken beyond ACCESS SHARE). Errors: none.';
REVOKE ALL ON FUNCTION dq_metrics() FROM PUBLIC;
-- Read-only figures: the viewer role of dashboards and exporters, and operators.
GRANT EXECUTE ON FUNCTION dq_metrics() TO dq_admin, dq_viewer;

-- The health of the install, one row per figure: see the runbook (docs/operations.md, "Table health")
-- for what each means and what to do. status is 'warning' past the thresholds given as arguments
-- (their defaults are the documented ones; the view dq_health uses them), else 'ok'; advice says
-- what to do about a warning. SECURITY DEFINER: it reads the statistics of the queue's tables
-- (pg_stat, pg_stats), the transactions of other sessions (pg_stat_activity: the owner needs
-- pg_read_all_stats for those of other roles, else a warning says so) and pg_cron's run history of
-- the owner's jobs. A plain read: catalogs and statistics only, no lock on a queue table.
CREATE OR REPLACE FUNCTION dq_table_health(
    xmin_horizon_age  interval DEFAULT '5 minutes',
    dead_tuples       bigint DEFAULT 10000,
    dead_tuple_ratio  double precision DEFAULT 0.2,
    vacuum_age        interval DEFAULT '1 hour',
    index_bloat_ratio double precision DEFAULT 2)
RETURNS TABLE (component text, name text, figure text, value double precision, shown text, status text, advice text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_error     jsonb;
    v_now       timestamptz := dq__clock();
    v_autovac   boolean := current_setting('autovacuum')::boolean;
    v_sees_all  boolean := (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
                           OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE');
BEGIN
    v_error := coalesce(
        CASE WHEN xmin_horizon_age IS NULL THEN dq__null_error('dq_table_health', 'xmin_horizon_age')
             WHEN xmin_horizon_age < interval '0'
             THEN dq__error('22023', format('dq_table_health: xmin_horizon_age is %s, it must not be negative', xmin_horizon_age)) END,
        CASE WHEN dead_tuples IS NULL THEN dq__null_error('dq_table_health', 'dead_tuples')
             WHEN dead_tuples < 0
             THEN dq__error('22023', format('dq_table_health: dead_tuples is %s, it must not be negative', dead_tuples)) END,
        CASE WHEN dead_tuple_ratio IS NULL THEN dq__null_error('dq_table_health', 'dead_tuple_ratio')
             WHEN NOT dead_tuple_ratio BETWEEN 0 AND 1
             THEN dq__error('22023', format('dq_table_health: dead_tuple_ratio is %s, it must be between 0 and 1', dead_tuple_ratio)) END,
        CASE WHEN vacuum_age IS NULL THEN dq__null_error('dq_table_health', 'vacuum_age')
             WHEN vacuum_age < interval '0'
             THEN dq__error('22023', format('dq_table_health: vacuum_age is %s, it must not be negative', vacuum_age)) END,
        CASE WHEN index_bloat_ratio IS NULL THEN dq__null_error('dq_table_health', 'index_bloat_ratio')
             WHEN NOT index_bloat_ratio >= 1
             THEN dq__error('22023', format('dq_table_health: index_bloat_ratio is %s, it must be at least 1', index_bloat_ratio)) END);
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;

    -- The queue's tables: pg_stat's counters and vacuum times (PostgreSQL manual, pg_stat_all_tables).
    RETURN QUERY
    WITH t AS (
        SELECT n.tab, n.i, c.oid,
               pg_stat_get_live_tuples(c.oid)::double precision AS live,
               pg_stat_get_dead_tuples(c.oid)::double precision AS dead,
               greatest(pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)) AS vacuumed,
               pg_stat_get_last_autovacuum_time(c.oid) AS autovacuumed,
               pg_stat_get_last_autoanalyze_time(c.oid) AS autoanalyzed,
               pg_stat_get_mod_since_analyze(c.oid)::double precision AS modified,
               pg_table_size(c.oid)::double precision AS bytes,
               v_autovac AND coalesce((SELECT o.option_value::boolean FROM pg_options_to_table(c.reloptions) o
                                        WHERE o.option_name = 'autovacuum_enabled'), true) AS autovacuum_on
          FROM unnest(ARRAY['dq_messages', 'dq_groups', 'dq_rate_tokens', 'dq_archive', 'dq_group_settles'])
               WITH ORDINALITY AS n(tab, i)
          JOIN pg_class c ON c.oid = to_regclass(format('%I.%I', dq__schema(), n.tab))
    ), r AS (
        SELECT t.*, CASE WHEN t.live + t.dead > 0 THEN t.dead / (t.live + t.dead) ELSE 0 END AS ratio
          FROM t
    ), w AS (
        SELECT r.*, r.dead >= dead_tuples AND r.ratio > dead_tuple_ratio AS piling FROM r
    )
    SELECT 'table'::text, w.tab, f.figure, f.value, f.shown,
           CASE WHEN f.warn THEN 'warning' ELSE 'ok' END, CASE WHEN f.warn THEN f.advice END
      FROM w CROSS JOIN LATERAL (VALUES
        (1, 'live_tuples', w.live, w.live::bigint::text, false, NULL),
        (2, 'dead_tuples', w.dead, w.dead::bigint::text, w.piling,
         'Dead rows pile up: look at the xmin_horizon rows (a long transaction keeps them), then at autovacuum (pg_stat_progress_vacuum) and the dq-vacuum job, and VACUUM (VERBOSE) the table to see what it cannot remove.'),
        (3, 'dead_tuple_ratio', w.ratio, round(w.ratio::numeric * 100, 1)::text || '%', w.piling,
         'Dead rows are a large share of the table: look at the xmin_horizon rows (a long transaction keeps them), then at autovacuum (pg_stat_progress_vacuum) and the dq-vacuum job.'),
        (4, 'last_vacuum_timestamp_seconds', dq__epoch(w.vacuumed), coalesce(w.vacuumed::text, 'never'),
         w.dead >= dead_tuples AND (w.vacuumed IS NULL OR w.vacuumed < v_now - vacuum_age),
         'Dead rows wait for a vacuum that has not come: check that autovacuum runs (autovacuum_max_workers busy on other tables?) and the dq-vacuum job, or VACUUM the table.'),
        (5, 'last_autovacuum_timestamp_seconds', dq__epoch(w.autovacuumed), coalesce(w.autovacuumed::text, 'never'),
         NOT w.autovacuum_on,
         'Autovacuum is off for this table (the autovacuum setting or the table''s autovacuum_enabled): turn it on, a queue table needs it.'),
        (6, 'last_autoanalyze_timestamp_seconds', dq__epoch(w.autoanalyzed), coalesce(w.autoanalyzed::text, 'never'),
         w.modified > greatest(w.live, dq__stats_exact_limit()),
         'More rows changed since the last analyze than the table holds, so the planner''s statistics (and dq_stats'' estimates past 20,000 rows) are stale: ANALYZE the table and check that autovacuum runs.'),
        (7, 'size_bytes', w.bytes, pg_size_pretty(w.bytes::bigint), false, NULL)
      ) AS f(j, figure, value, shown, warn, advice)
     ORDER BY w.i, f.j;

    -- Their indexes: size against the estimated minimum (dq__index_minimum_bytes).
    RETURN QUERY
    WITH x AS (
        SELECT i.relname::text AS ix, pg_relation_size(i.oid)::double precision AS bytes,
               dq__index_minimum_bytes(i.oid) AS least_bytes
          FROM unnest(ARRAY['dq_messages', 'dq_groups', 'dq_rate_tokens', 'dq_archive', 'dq_group_settles']) AS n(tab)
          JOIN pg_index ix ON ix.indrelid = to_regclass(format('%I.%I', dq__schema(), n.tab))
          JOIN pg_class i ON i.oid = ix.indexrelid
    ), w AS (
        SELECT x.*, x.bytes > index_bloat_ratio * x.least_bytes AND x.bytes - x.least_bytes > 16 * 1024 * 1024 AS bloated
          FROM x
    )
    SELECT 'index'::text, w.ix, f.figure, f.value, f.shown,
           CASE WHEN f.warn THEN 'warning' ELSE 'ok' END, CASE WHEN f.warn THEN f.advice END
      FROM w CROSS JOIN LATERAL (VALUES
        (1, 'size_bytes', w.bytes, pg_size_pretty(w.bytes::bigint), coalesce(w.bloated, false),
         'The index is much larger than its entries need (dead entries, pages split and left half empty): REINDEX INDEX CONCURRENTLY it, and look at what keeps vacuum from cleaning it (the xmin_horizon rows).'),
        (2, 'estimated_minimum_bytes', w.least_bytes,
         coalesce(pg_size_pretty(w.least_bytes::bigint), 'unknown until the table is analyzed'), false, NULL)
      ) AS f(j, figure, value, shown, warn, advice)
     ORDER BY w.ix, f.j;

    -- The xmin horizon of this database: what keeps vacuum from removing dead rows (PostgreSQL
    -- manual, "Routine Vacuuming"): transactions and snapshots of its sessions (and of WAL senders
    -- with hot_standby_feedback), its prepared transactions, and replication slots. The caller's
    -- own session is left out.
    RETURN QUERY
    WITH h AS (
        SELECT greatest(age(a.backend_xid), age(a.backend_xmin))::double precision AS xids,
               v_now - coalesce(a.xact_start, a.query_start, a.backend_start) AS held,
               format('pid %s (%s, application_name %s, %s)', a.pid, coalesce(a.state, 'no state'),
                      quote_literal(coalesce(a.application_name, '')), a.backend_type) AS holder
          FROM pg_stat_activity a
         WHERE (a.datname = current_database() OR a.backend_type = 'walsender')
           AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL) AND a.pid <> pg_backend_pid()
        UNION ALL
        SELECT age(p.transaction)::double precision, v_now - p.prepared,
               format('prepared transaction %s (owner %s)', quote_literal(p.gid), p.owner)
          FROM pg_prepared_xacts p WHERE p.database = current_database()
        UNION ALL
        SELECT age(s.xmin)::double precision, NULL::interval,
               format('replication slot %s (%s, %s)', s.slot_name, s.slot_type,
                      CASE WHEN s.active THEN 'active' ELSE 'inactive' END)
          FROM pg_replication_slots s WHERE s.xmin IS NOT NULL
    ), oldest AS (
        SELECT (SELECT h.held FROM h WHERE h.held IS NOT NULL ORDER BY h.held DESC LIMIT 1) AS held,
               (SELECT h.holder FROM h WHERE h.held IS NOT NULL ORDER BY h.held DESC LIMIT 1) AS held_by,
               (SELECT h.xids FROM h ORDER BY h.xids DESC NULLS LAST LIMIT 1) AS xids,
               (SELECT h.holder FROM h ORDER BY h.xids DESC NULLS LAST LIMIT 1) AS xids_by
    )
    SELECT 'xmin_horizon'::text, NULL::text, f.figure, f.value, f.shown,
           CASE WHEN f.warn THEN 'warning' ELSE 'ok' END, CASE WHEN f.warn THEN f.advice END
      FROM oldest o CROSS JOIN LATERAL (VALUES
        (1, 'age_seconds', coalesce(extract(epoch FROM o.held)::double precision, 0),
         CASE WHEN o.held_by IS NULL THEN 'nothing holds it'
              ELSE format('%s s, held by %s', round(extract(epoch FROM o.held)::numeric, 1), o.held_by) END
         || CASE WHEN v_sees_all THEN '' ELSE ' (sessions of other roles not seen)' END,
         o.held > xmin_horizon_age OR NOT v_sees_all,
         CASE WHEN v_sees_all
              THEN 'A transaction has been open for long and every dead row of the queue''s tables since its start stays: end it (pg_terminate_backend(pid) if it is idle in transaction) and fix the client that leaves it open; idle_in_transaction_session_timeout bounds such sessions (docs/operations.md, "Bloat and vacuum").'
              ELSE format('The install''s owner %s cannot see the transactions of other roles: GRANT pg_read_all_stats TO %s.',
                          quote_ident(current_user), quote_ident(current_user)) END),
        (2, 'age_transactions', coalesce(o.xids, 0),
         CASE WHEN o.xids_by IS NULL THEN 'nothing holds it'
              ELSE format('%s transactions, held by %s', o.xids::bigint, o.xids_by) END,
         coalesce(o.xids, 0) > current_setting('autovacuum_freeze_max_age')::double precision / 2,
         'The oldest transaction holding the horizon is half of autovacuum_freeze_max_age old: end it, or drop the replication slot that holds it, before anti-wraparound vacuums start.')
      ) AS f(j, figure, value, shown, warn, advice)
     ORDER BY f.j;

    -- The pg_cron jobs of this install (dq__pg_cron_jobs), when pg_cron is installed here.
    IF to_regclass('cron.job_run_details') IS NOT NULL THEN
        RETURN QUERY
        WITH j AS (
            SELECT o.jobname, c.jobid, c.active,
                   (SELECT array_agg(d.start_time ORDER BY d.runid DESC) FROM (
                        SELECT d.runid, d.start_time FROM cron.job_run_details d
                         WHERE d.jobid = c.jobid AND d.start_time IS NOT NULL ORDER BY d.runid DESC LIMIT 2) d) AS starts,
                   (SELECT d.status || coalesce(': ' || left(d.return_message, 200), '') FROM cron.job_run_details d
                     WHERE d.jobid = c.jobid AND d.status IN ('succeeded', 'failed') ORDER BY d.runid DESC LIMIT 1) AS last_run
              FROM dq__pg_cron_jobs() o
              JOIN cron.job c ON c.jobname = o.jobname AND c.database = current_database()
        ), fails AS (
            SELECT d.jobid, count(*)::double precision AS n FROM cron.job_run_details d
             WHERE d.status = 'failed' AND d.start_time > v_now - interval '1 hour' GROUP BY d.jobid
        )
        SELECT 'cron_job'::text, j.jobname, f.figure, f.value, f.shown,
               CASE WHEN f.warn THEN 'warning' ELSE 'ok' END, CASE WHEN f.warn THEN f.advice END
          FROM j LEFT JOIN fails ON fails.jobid = j.jobid
         CROSS JOIN LATERAL (VALUES
            (1, 'last_start_timestamp_seconds', dq__epoch(j.starts[1]), coalesce(j.starts[1]::text, 'never'),
             NOT j.active OR j.starts[1] < v_now - (3 * (j.starts[1] - j.starts[2]) + interval '1 minute'),
             CASE WHEN NOT j.active THEN 'The job is inactive: SELECT cron.alter_job(jobid, active => true) for it (cron.job).'
                  ELSE 'pg_cron has not started the job for three of its periods: check that pg_cron runs (shared_preload_libraries, cron.database_name, the server log) and its max_running_jobs.' END),
            (2, 'last_run_failed', CASE WHEN j.last_run LIKE 'failed%' THEN 1 ELSE 0 END::double precision,
             coalesce(j.last_run, 'no finished run'), j.last_run LIKE 'failed%',
             'The job''s last run failed: read its return_message in cron.job_run_details, fix the cause, and watch the next run.'),
            (3, 'failures_last_hour', coalesce(fails.n, 0), coalesce(fails.n, 0)::bigint::text, coalesce(fails.n, 0) > 0,
             'The job failed in the last hour: read the return_message of its failed runs in cron.job_run_details.')
          ) AS f(j, figure, value, shown, warn, advice)
         ORDER BY j.jobname, f.j;
    END IF;
END;
$$;
COMMENT ON FUNCTION dq_table_health(interval, bigint, double precision, interval, double precision) IS 'dq_table_health(xmin_horizon_age interval default 5 minutes, dead_tuples bigint default 10000, dead_tuple_ratio double precision default 0.2, vacuum_age interval default 1 hour, index_bloat_ratio double precision default 2) -> SETOF (component, name, figure, value, shown, status, advice): one row per health figure of the queue''s tables (live and dead tuples, dead ratio, last vacuum, autovacuum and autoanalyze as Unix epoch seconds, size in bytes), their indexes (size and estimated minimum in bytes), the xmin horizon (age in seconds and transactions, and its holder) and this install''s pg_cron jobs (last start, last run failed, failures in the last hour); status ''warning'' past the thresholds, with advice. Reads statistics and catalogs only, no lock on a queue table. Errors: 22004 NULL threshold, 22023 threshold out of range.';
REVOKE ALL ON FUNCTION dq_table_health(interval, bigint, double precision, interval, double precision) FROM PUBLIC;
-- Read-only figures: the viewer role of dashboards and exporters, and operators.
GRANT EXECUTE ON FUNCTION dq_table_health(interval, bigint, double precision, interval, double precision) TO dq_admin, dq_viewer;

CREATE OR REPLACE VIEW dq_health AS
SELECT h.component, h.name, h.figure, h.value, h.shown, h.status, h.advice FROM dq_table_health() h;
COMMENT ON VIEW dq_health IS 'The health of the install with the default thresholds: dq_table_health().';
-- Reading it is an operator's business (the view runs with its owner's rights, and checks
-- dq_table_health against the reader): dq_admin and the read-only dq_viewer.
REVOKE ALL ON dq_health FROM PUBLIC;
GRANT SELECT ON dq_health TO dq_admin, dq_viewer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
