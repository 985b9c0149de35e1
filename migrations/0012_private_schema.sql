-- 0012: a private schema for the internal helpers. The public API (dq_* functions, procedures and
-- views) stays in the install schema; the helpers (dq__*) move to the schema '<install>_internal',
-- so that psql's \df in a session with the install schema on its search_path lists only the API.
-- The functions of sql/ create the helpers there and drop those of earlier releases from the install
-- schema in the same transaction that replaces their callers (so an old release's functions keep
-- working until then). No application role gets any privilege on it: the public functions reach the
-- helpers through their pinned search_path and run as their owner (SECURITY DEFINER).
-- depends: 0011_delivery_controls
DO $$
DECLARE
    v_install text := current_schema();
    v_private text := current_schema() || '_internal';
BEGIN
    IF v_install IS NULL THEN
        RAISE EXCEPTION '0012_private_schema: no install schema (current_schema() is NULL)' USING ERRCODE = '3F000';
    END IF;
    -- PostgreSQL truncates longer identifiers (NAMEDATALEN 64): two installs could then share one.
    IF octet_length(v_private) > 63 THEN
        RAISE EXCEPTION '0012_private_schema: the install schema name is % bytes, the limit is 54 (its private schema % must fit in 63 bytes)',
            octet_length(v_install), quote_ident(v_private) USING ERRCODE = '42622';
    END IF;
    -- A schema of that name that holds tables is not ours (for example another install).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = v_private AND c.relkind IN ('r', 'p', 'v', 'm')) THEN
        RAISE EXCEPTION '0012_private_schema: schema % exists and holds tables; it cannot be the private schema of %',
            quote_ident(v_private), quote_ident(v_install) USING ERRCODE = '42P06';
    END IF;
    EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', v_private);
    -- A new schema grants nothing to PUBLIC; say so explicitly for a schema that existed (empty).
    EXECUTE format('REVOKE ALL ON SCHEMA %I FROM PUBLIC', v_private);
    EXECUTE format('COMMENT ON SCHEMA %I IS %L', v_private,
                   format('Internal helpers of the delayed queue installed in schema %s (not an API: called only by its dq_* functions).',
                          quote_ident(v_install)));
END;
$$;
