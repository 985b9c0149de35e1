-- The install: its schema and private schema, the roles' access, the row types' attributes, the
-- queue's clock and the wake-up channel.
--
-- Every file under sql/ is re-runnable (CREATE OR REPLACE) and self-contained: it pins the
-- session's search_path to the install schema (its first statement), creates its functions with
-- that search_path (SET search_path FROM CURRENT), and grants each function beside it. The
-- installer applies the files in name order in one transaction, with the install schema first on
-- the search_path (a file run by hand with psql's default search_path installs into public).
--
-- Privileges. Applications get EXECUTE on the functions of their role and nothing on the tables.
-- Every public dq_* function is SECURITY DEFINER (it runs with its owner's rights, which is how it
-- reaches the tables) with the pinned search_path, so a function or table planted in a schema of
-- the caller's search_path is never used by ours (PostgreSQL manual, CREATE FUNCTION, "Writing
-- SECURITY DEFINER Functions Safely"). Install as a dedicated owner role rather than a superuser:
-- the functions run with its rights.
--
--   dq_producer  offer (dq_offer, dq_offer_many) and cancel (dq_cancel)
--   dq_consumer  poll (dq_poll_many, dq_poll_or_wait, dq_wait, dq_wait_done, dq_channel), finish
--                (dq_ack, dq_nack, dq_extend) and read (dq_get, dq_next_due)
--   dq_viewer    read only: metrics and table health (dq_metrics, dq_table_health, dq_health),
--                stats, lists and reads (dq_queue_stats, dq_stats, dq_list_messages, dq_get,
--                dq_next_due, dq_dead_letters), schedules (dq_cron_list, dq_cron_schedules,
--                dq_cron_occurrences); it may change nothing
--   dq_admin     everything: the three roles above, configuration, redrive, purge, release,
--                retention, schedules (dq_cron_*, dq_install_tick, dq_uninstall_tick)
--
-- Two schemas. The install schema holds the tables and the public API (dq_* functions, procedures
-- and views). Its private schema '<install schema>_internal' (created by migration 0012) holds the
-- internal dq__* helpers, so that psql's \df lists only the API. The helpers are called only from
-- inside our functions (as the owner): no application role may execute them or use that schema.
--
-- The install schema: the first schema of the session's search_path that is not a pg_ schema
-- (pg_catalog, pg_temp_N). Every file starts by pinning the session's search_path to
-- '<install schema>, <install schema>_internal, pg_temp', so the next file finds the same schemas,
-- objects are created in the install schema, and every function captures that value (SET
-- search_path FROM CURRENT): it finds the tables and the helpers. `dq__search_path(internal =>
-- false)`, which ends every file, then re-pins each SECURITY DEFINER function of the install schema
-- to '<install schema>_internal, <install schema>, pg_temp': the private schema first.
--
-- Why the private schema first. An application role may be able to create functions in the install
-- schema: under PostgreSQL 15 the database owner may create in public (owned by pg_database_owner),
-- and on clusters created before 15 (or pg_upgrade'd from them) PUBLIC may. A function it created
-- there with the name and argument types of a helper (dq__now(), dq__name_error(...)) would be
-- found first with the install schema first, and would run inside our SECURITY DEFINER functions
-- with the owner's rights. Only the owner may create in the private schema, and of functions with
-- identical argument types PostgreSQL uses the one met first on the search_path (PostgreSQL manual,
-- 10.3 "Functions", step 1), so a planted twin is never chosen. What the install schema still
-- resolves are our tables, types and public functions, whose names cannot be taken there (a
-- relation or type name is unique in a schema; CREATE FUNCTION of an existing signature fails).
-- Qualifying every internal reference instead would need the schema's name written into every body
-- (the files are installed into any schema as they are, and stay runnable by psql). Overloads with
-- other argument types are candidates wherever they are; every call passes the helper's own argument
-- types, so the exact match wins (tests/install/test_planted.py plants twins and overloads of every helper
-- as a role that may create in the install schema and runs the whole API as each role).
-- pg_catalog is not named: it is then searched first (PostgreSQL manual, 5.9.5 "The Schema Search Path"), and naming it first would make
-- it the schema in which CREATE puts unqualified objects. pg_temp is named last, so temporary objects
-- are never found before ours ("Writing SECURITY DEFINER Functions Safely"). The helpers of each file
-- are created between `SELECT dq__search_path(internal => true)`, which puts the private schema first
-- (so CREATE puts them there), and `SELECT dq__search_path(internal => false)`, which restores the
-- pinned value: every file ends with it.
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- The owner of the install schema may drop and replace any object in it (PostgreSQL manual, DROP
-- TABLE: "only the owner of the table, the owner of the schema, and superuser"): a table replaced by
-- one with a trigger of its own, or a function, would then run inside our SECURITY DEFINER functions
-- with the installing role's rights. So the install schema must be owned by the installing role, by
-- a superuser, or by a role that already has the installing role's rights (a member of it). A schema
-- owned by pg_database_owner (public, under PostgreSQL 15) is owned by the database's owner. Anything
-- else is refused (42501) unless the session sets dq.allow_schema_owner = 'on' (for example
-- PGOPTIONS='-c dq.allow_schema_owner=on'), which accepts that the schema's owner is trusted.
-- pyqueue.migrate runs this block (between the marker lines) before any schema step.
-- install schema owner check: begin
DO $$
DECLARE
    v_owner oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                     WHERE n.nspname = (pg_catalog.current_schemas(false))[1]);
BEGIN
    IF v_owner = 'pg_database_owner'::pg_catalog.regrole THEN
        v_owner := (SELECT d.datdba FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database());
    END IF;
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = v_owner)
       AND NOT pg_catalog.pg_has_role(v_owner, current_user, 'USAGE')
       AND coalesce(pg_catalog.current_setting('dq.allow_schema_owner', true), '') <> 'on' THEN
        RAISE EXCEPTION 'install: schema % is owned by role %, which could drop and replace the queue''s objects and so act with the rights of the installing role %',
            pg_catalog.quote_ident((pg_catalog.current_schemas(false))[1]), v_owner::pg_catalog.regrole, current_user
            USING ERRCODE = '42501',
                  HINT = 'Install into a schema owned by the installing role (CREATE SCHEMA dq AUTHORIZATION '
                         || pg_catalog.quote_ident(current_user) || ', then migrate with --schema dq), install as the schema''s owner, or set dq.allow_schema_owner = on to trust that owner.';
    END IF;
END;
$$;
-- install schema owner check: end

-- The private schema, and the two helpers written with the schemas' names (SQL, no SET clause):
--  * dq__schema() -> text: the name of the install schema, an inlined constant (IMMUTABLE), for the
--    few names that must differ between two installs in one database (dq_channel, the pg_cron jobs)
--    and for code that cannot pin a search_path (dq_prune_archive_all);
--  * dq__search_path(internal boolean) -> text: sets the session's search_path to the private schema
--    first (true) or to the pinned value (false), and returns it; used only by these files.
-- Helpers of earlier releases, which lived in the install schema, are dropped here, in the
-- transaction that replaces their callers (and before any caller is created, so that none finds them).
DO $$
DECLARE
    v_install text := (pg_catalog.current_schemas(false))[1];
    v_private text := (pg_catalog.current_schemas(false))[1] || '_internal';
    v_fn record;
BEGIN
    IF pg_catalog.to_regnamespace(pg_catalog.quote_ident(v_private)) IS NULL THEN
        RAISE EXCEPTION 'sql/000_common.sql: schema % does not exist: apply the migrations first (0012_private_schema)',
            pg_catalog.quote_ident(v_private) USING ERRCODE = '3F000';
    END IF;
    FOR v_fn IN SELECT p.oid::pg_catalog.regprocedure AS sig, p.prokind FROM pg_catalog.pg_proc p
                 WHERE p.pronamespace = pg_catalog.quote_ident(v_install)::pg_catalog.regnamespace
                   AND p.proname LIKE 'dq\_\_%'
    LOOP
        EXECUTE pg_catalog.format('DROP %s %s', CASE v_fn.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, v_fn.sig);
    END LOOP;
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION %I.dq__schema() RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
        v_private, pg_catalog.format('SELECT %L::text', v_install));
    -- dq__search_path(false) also re-pins (ALTER FUNCTION ... SET search_path) every SECURITY
    -- DEFINER function of the install schema that was created with the install schema first (SET
    -- search_path FROM CURRENT) to the private schema first.
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION %I.dq__search_path(internal boolean) RETURNS text LANGUAGE plpgsql VOLATILE AS %L',
        v_private, pg_catalog.format($f$
DECLARE
    v_fn pg_catalog.regprocedure;
BEGIN
    IF NOT internal THEN
        FOR v_fn IN SELECT p.oid FROM pg_catalog.pg_proc p
                     WHERE p.pronamespace = %L::pg_catalog.regnamespace AND p.prosecdef
                       AND %L = ANY (p.proconfig)
                     ORDER BY p.oid
        LOOP
            EXECUTE pg_catalog.format('ALTER FUNCTION %%s SET search_path = %%s', v_fn, %L);
        END LOOP;
    END IF;
    RETURN pg_catalog.set_config('search_path', CASE WHEN internal THEN %L ELSE %L END, false);
END;
$f$,
            pg_catalog.quote_ident(v_install),
            'search_path=' || pg_catalog.format('%I, %I, pg_temp', v_install, v_private),
            pg_catalog.format('%I, %I, pg_temp', v_private, v_install),
            pg_catalog.format('%I, %I, pg_temp', v_private, v_install),
            pg_catalog.format('%I, %I, pg_temp', v_install, v_private)));
END;
$$;
SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
COMMENT ON FUNCTION dq__schema() IS 'Internal: the name of the schema this install lives in.';
REVOKE ALL ON FUNCTION dq__schema() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
COMMENT ON FUNCTION dq__search_path(boolean) IS 'Internal: sets the search_path with which the files of sql/ create functions: the private schema first (true), else the install schema first.';
REVOKE ALL ON FUNCTION dq__search_path(boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- ----------------------------------------------------------------------------- the clock
-- Every function of the queue reads the time through these two, never through now() or
-- clock_timestamp() directly:
--  * dq__now() -> timestamptz: the start of the current transaction (now()), for what a transaction
--    writes as one instant: default due times, created_at, updated_at, the cron horizon;
--  * dq__clock() -> timestamptz: the current instant (clock_timestamp()), for what must not lag
--    behind a long transaction: polls, lock deadlines, acknowledgements, waits.
-- Both are SQL with no SET clause, so PostgreSQL inlines them and a call costs what now() costs.
-- In an install they read the server's clock and nothing else: no setting, table or role can shift
-- them. A test suite (as the owner, in a test database) may replace both with bodies that add an
-- offset it controls, to drive lock expiry and schedules without sleeping; an application role can
-- neither replace them (it may not use this schema) nor shadow them (the callers' search_path is
-- pinned, and functions are never looked up in pg_temp).
CREATE OR REPLACE FUNCTION dq__now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT pg_catalog.now() $$;
COMMENT ON FUNCTION dq__now() IS 'Internal: the queue''s clock at the start of the transaction (now()).';
REVOKE ALL ON FUNCTION dq__now() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__clock() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$ SELECT pg_catalog.clock_timestamp() $$;
COMMENT ON FUNCTION dq__clock() IS 'Internal: the queue''s clock at this instant (clock_timestamp()).';
REVOKE ALL ON FUNCTION dq__clock() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

GRANT dq_producer, dq_consumer, dq_viewer TO dq_admin;

-- The composite types the functions return (created by the migrations) gain the attributes of this
-- release here, in the transaction that replaces the functions returning them: a function of the
-- previous release fails (42804) on a row type whose shape changed under it, so the shape changes
-- only together with its functions. Re-running adds nothing; a rollback of the step that added the
-- columns behind them drops them again (migrations/0011_delivery_controls.rollback.sql).
DO $$
DECLARE
    v_attr record;
BEGIN
    FOR v_attr IN SELECT * FROM (VALUES
            (1, 'dq_delivery', 'claimed_at', 'timestamptz'), (2, 'dq_delivery', 'priority', 'integer'),
            (3, 'dq_delivery', 'message_group', 'text'), (4, 'dq_delivery', 'expires_at', 'timestamptz'),
            (5, 'dq_delivery', 'headers', 'jsonb'),
            (6, 'dq_message', 'priority', 'integer'), (7, 'dq_message', 'message_group', 'text'),
            (8, 'dq_message', 'expires_at', 'timestamptz'), (9, 'dq_message', 'headers', 'jsonb'),
            (10, 'dq_stats_row', 'paused', 'boolean'), (11, 'dq_stats_row', 'held', 'bigint'),
            (12, 'dq_stats_row', 'expired', 'bigint'), (13, 'dq_stats_row', 'blocked', 'bigint'),
            (14, 'dq_message', 'released_at', 'timestamptz')) AS a(i, typ, name, datatype)
        ORDER BY a.i
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                        WHERE a.attrelid = pg_catalog.format('%I.%I', dq__schema(), v_attr.typ)::pg_catalog.regclass
                          AND a.attname = v_attr.name AND NOT a.attisdropped) THEN
            EXECUTE pg_catalog.format('ALTER TYPE %I.%I ADD ATTRIBUTE %I %s', dq__schema(), v_attr.typ,
                                      v_attr.name, v_attr.datatype);
        END IF;
    END LOOP;
END;
$$;
-- The roles reach the functions through the install schema (never the private one). Not granted
-- when every role already may use it (PUBLIC has USAGE, as on public by default), so an install in
-- public adds no ACL entry.
DO $$
BEGIN
    IF NOT pg_catalog.has_schema_privilege('public', dq__schema(), 'USAGE') THEN
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO dq_producer, dq_consumer, dq_admin, dq_viewer', dq__schema());
    END IF;
END;
$$;

-- The LISTEN channel of a queue: 'dq_' || md5(queue). Queue names may be 100 characters
-- and contain anything, channel names are identifiers of at most 63 bytes, hence the hash.
-- Channels are per database: an install outside public hashes its schema's quoted name with the
-- queue ('dq_' || md5('"schema".' || queue); quote_ident makes the pair unambiguous), so two
-- installs in one database never wake each other's consumers; public keeps the plain hash, the
-- channel of earlier releases, so consumers and producers of two releases meet during a deploy.
CREATE OR REPLACE FUNCTION dq_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY DEFINER SET search_path FROM CURRENT
AS $$
    SELECT 'dq_' || md5(CASE WHEN dq__schema() = 'public' THEN queue ELSE quote_ident(dq__schema()) || '.' || queue END)
$$;
COMMENT ON FUNCTION dq_channel(text) IS 'dq_channel(queue text) -> text: the LISTEN channel on which offers wake the consumers of queue (''dq_'' and an md5 hash of the queue, and of the schema outside public); NULL for a NULL queue. Errors: none.';
REVOKE ALL ON FUNCTION dq_channel(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_channel(text) TO dq_consumer, dq_viewer;

-- The queue's time, for clients: the default due time of an offer, and the base to which the Python
-- client adds a delay. Every role that offers, polls or reads schedules may execute it (the defaults
-- of dq_offer, dq_offer_many and dq_cron_occurrences call it as the caller).
CREATE OR REPLACE FUNCTION dq_now()
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT dq__now() $$;
COMMENT ON FUNCTION dq_now() IS 'dq_now() -> timestamptz: the queue''s time, the start of the current transaction as now(), which is the default scheduled_at of dq_offer and dq_offer_many. Errors: none.';
REVOKE ALL ON FUNCTION dq_now() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_now() TO dq_producer, dq_consumer, dq_viewer;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
