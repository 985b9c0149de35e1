-- 0014: a vacuum of dq_messages the queue schedules itself, when pg_cron is installed in this database.
-- depends: 0013_group_settles
--
-- Every acknowledged message leaves a dead row, and every poll a dead row version and dead index
-- entries (the due-time index key changes). Autovacuum removes them, but only once per
-- autovacuum_naptime (1 minute by default) whatever the table's thresholds, and nothing while a
-- transaction's snapshot holds the xmin horizon: after such a transaction ends, the dead rows it
-- kept stay until autovacuum's next visit, the heap grows meanwhile (no free space is recorded
-- until a vacuum) and every poll walks the dead entries of the due-time index (measured by
-- bench/snapshot.py; see "Routine Vacuuming" in the PostgreSQL manual). This job vacuums the table
-- every 10 seconds (pg_cron 1.5 and later; every minute with older pg_cron, which has no seconds
-- schedules). SKIP_LOCKED: a run that finds the table being vacuumed (by autovacuum) skips it
-- instead of waiting. The job runs as its owner, the installing role, which owns the table.
-- pg_cron's job names are one per database: the install in public uses the plain name, one in
-- another schema suffixes it with '@<schema>'; the table is schema-qualified (the names
-- dq__pg_cron_jobs() of sql/250_cron_pg_cron.sql lists).
DO $$
DECLARE
    v_public  boolean := current_schema() = 'public';
    v_job     text := 'dq-vacuum' || CASE WHEN v_public THEN '' ELSE '@' || current_schema() END;
    v_command text := 'VACUUM (SKIP_LOCKED) ' || quote_ident(current_schema()) || '.dq_messages';
    v_version integer[];
BEGIN
    SELECT string_to_array(split_part(extversion, '-', 1), '.')::integer[] INTO v_version
      FROM pg_catalog.pg_extension WHERE extname = 'pg_cron';
    IF v_version IS NULL THEN
        RAISE NOTICE 'pg_cron is not installed in this database: dq_messages is vacuumed by autovacuum alone; schedule % yourself where dead rows pile up (docs/operations.md)', v_command;
    ELSE
        PERFORM cron.schedule(v_job, CASE WHEN v_version >= '{1,5}' THEN '10 seconds' ELSE '* * * * *' END, v_command);
    END IF;
END;
$$;
