-- Limits: the time bounds of the queue and the payload limits. Each is an SQL function with a
-- constant body and no SET clause: PostgreSQL inlines it and folds it to a constant where it is
-- used, so naming a limit costs nothing on the hot paths.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- ----------------------------------------------------------------------------- time bounds
-- Every timestamp the queue stores or returns lies in [dq__min_time(), dq__max_time()]: finite, and
-- within years 1-9999 with a day of margin, so that every client can read it in any time zone
-- (Python's datetime and most drivers stop at 9999-12-31). Every function that writes a time checks
-- it (no CHECK constraint: measured, it costs a fifth of a single dq_offer; see migration 0009).
-- These two are inlined and folded to constants (SQL, IMMUTABLE, no SET clause).
CREATE OR REPLACE FUNCTION dq__min_time() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT timestamptz '0001-01-02 00:00:00+00' $$;
COMMENT ON FUNCTION dq__min_time() IS 'Internal: the earliest timestamp the queue stores (0001-01-02 UTC).';
REVOKE ALL ON FUNCTION dq__min_time() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__max_time() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT timestamptz '9999-12-30 00:00:00+00' $$;
COMMENT ON FUNCTION dq__max_time() IS 'Internal: the latest timestamp the queue stores (9999-12-30 UTC).';
REVOKE ALL ON FUNCTION dq__max_time() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Payload limits. A queue's limit is dq_queues.max_payload_bytes, or 1 MiB when it sets none; no
-- queue may set one below 1 KiB (SQS's MaximumMessageSize has the same floor), so the offers read
-- the configuration only for payloads over 1 KiB. The constants are inlined (SQL, IMMUTABLE, no SET).
CREATE OR REPLACE FUNCTION dq__default_max_payload_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1048576 $$;
COMMENT ON FUNCTION dq__default_max_payload_bytes() IS 'Internal: the payload limit of a queue without max_payload_bytes (1 MiB).';
REVOKE ALL ON FUNCTION dq__default_max_payload_bytes() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__payload_limit_floor() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1024 $$;
COMMENT ON FUNCTION dq__payload_limit_floor() IS 'Internal: the smallest max_payload_bytes a queue may have (1 KiB).';
REVOKE ALL ON FUNCTION dq__payload_limit_floor() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
