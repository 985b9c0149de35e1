-- Shared helpers: input checks (raised only on the error path) and the wake-up channel.
-- Every file under sql/ is re-runnable (CREATE OR REPLACE) and applied in name order in one
-- transaction by the installer (pyqueue.migrate, also run by the yoyo step 9999_sql).

-- Raise the error for a bad queue name. Called only after a cheap inline check failed.
CREATE OR REPLACE FUNCTION dq__raise_bad_name(fn text, param text, value text, max_len integer)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '%: % must not be NULL', fn, param USING ERRCODE = '22004';
    ELSIF value = '' THEN
        RAISE EXCEPTION '%: % must not be empty', fn, param USING ERRCODE = '22023';
    ELSIF char_length(value) > max_len THEN
        RAISE EXCEPTION '%: % is % characters, the limit is %', fn, param, char_length(value), max_len
            USING ERRCODE = '22001';
    END IF;
END;
$$;
COMMENT ON FUNCTION dq__raise_bad_name(text, text, text, integer) IS
  'Internal: raises 22004 (NULL), 22023 (empty) or 22001 (over max_len characters) for a queue or key.';

-- Raise 22004 for a NULL argument.
CREATE OR REPLACE FUNCTION dq__raise_null(fn text, param text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION '%: % must not be NULL', fn, param USING ERRCODE = '22004';
END;
$$;
COMMENT ON FUNCTION dq__raise_null(text, text) IS 'Internal: raises 22004 null_value_not_allowed naming the parameter.';

-- The LISTEN channel of a queue: 'dq_' || md5(queue). Queue names may be 100 characters
-- and contain anything, channel names are identifiers of at most 63 bytes, hence the hash.
CREATE OR REPLACE FUNCTION dq_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, public, pg_temp
AS $$ SELECT 'dq_' || md5(queue) $$;
COMMENT ON FUNCTION dq_channel(text) IS
  'dq_channel(queue text) -> text: the LISTEN channel on which offers wake consumers of this queue (''dq_'' || md5(queue)); the payload is the queue name.';
