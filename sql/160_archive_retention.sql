-- Archive retention: dq_prune_archive and the procedure of the pg_cron job, dq_prune_archive_all.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- Retention: archive rows older than their queue's retention, oldest first, at most
-- batch_size per call (one short transaction; the index (queue, acked_at) finds them).
CREATE OR REPLACE FUNCTION dq_prune_archive(batch_size integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_error    jsonb;
    v_count integer;
BEGIN
    v_error := dq__range_error('dq_prune_archive', 'batch_size', dq_prune_archive.batch_size, 1,
                               dq__limit_prune_batch_max());
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    DELETE FROM dq_archive a
     WHERE a.archive_id IN (
        SELECT old.archive_id
          FROM dq_queues q
         CROSS JOIN LATERAL (
            SELECT x.archive_id FROM dq_archive x
             WHERE x.queue = q.queue AND x.acked_at < dq__now() - q.retention
             ORDER BY x.acked_at
             LIMIT dq_prune_archive.batch_size) old
         WHERE q.retention IS NOT NULL
         LIMIT dq_prune_archive.batch_size);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION dq_prune_archive(integer) IS 'dq_prune_archive(batch_size integer default 10000) -> integer: deletes up to batch_size archive rows older than their queue''s retention and returns how many. Errors: 22004/22023 batch_size (1..1000000).';
REVOKE ALL ON FUNCTION dq_prune_archive(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_prune_archive(integer) TO dq_admin;

-- The retention job (pg_cron 'dq-archive-prune'): batches of batch_size, each committed on its
-- own, so no lock or transaction is held long, until nothing is left or max_batches is reached.
-- A procedure that COMMITs can have neither SET clauses nor SECURITY DEFINER (PostgreSQL manual,
-- CREATE PROCEDURE and "Transaction Management"): it runs with its caller's rights and calls
-- dq_prune_archive qualified with the install schema, which is the SECURITY DEFINER part.
DO $do$
BEGIN
    -- Written with the install schema's name (format: %I is the schema, %% a literal %): a
    -- procedure that commits cannot pin a search_path.
    EXECUTE pg_catalog.format($f$
CREATE OR REPLACE PROCEDURE dq_prune_archive_all(batch_size integer DEFAULT 10000, max_batches integer DEFAULT 100)
LANGUAGE plpgsql
AS $$
DECLARE
    v_deleted integer;
    v_total   bigint := 0;
BEGIN
    FOR i IN 1 .. coalesce(max_batches, 100) LOOP
        v_deleted := %I.dq_prune_archive(batch_size);
        v_total := v_total + v_deleted;
        COMMIT;
        EXIT WHEN v_deleted < batch_size;
    END LOOP;
    IF v_total > 0 THEN
        RAISE NOTICE 'dq_prune_archive_all: deleted %% archive rows past their retention', v_total;
    END IF;
END;
$$
$f$, dq__schema());
END;
$do$;
COMMENT ON PROCEDURE dq_prune_archive_all(integer, integer) IS 'CALL dq_prune_archive_all(batch_size integer default 10000, max_batches integer default 100): dq_prune_archive in batches, committing after each (the pg_cron job dq-archive-prune). Errors: those of dq_prune_archive; 2D000 inside a transaction block.';
REVOKE ALL ON PROCEDURE dq_prune_archive_all(integer, integer) FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE dq_prune_archive_all(integer, integer) TO dq_admin;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
