-- Bulk reading for exports (the Spark data source, pyqueue.spark): dq_export_messages,
-- dq_export_archive and their _bounds functions.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

-- Application roles have no privilege on the tables; these functions are how a bulk reader gets
-- the rows. Who may read what:
--   dq_export_messages, dq_export_messages_bounds  dq_consumer (and dq_admin, a member of it): the
--       live messages of every queue, as dq_get shows them one key at a time; the lock token is
--       never returned, only whether the message is locked.
--   dq_export_archive, dq_export_archive_bounds    dq_admin: the history of archiving queues.
--
-- A reader splits the id range (archive_id for the archive) into parts: the _bounds function gives
-- the smallest and largest id of the rows that match the filters, then each part reads the rows
-- with id_from <= id < id_to. Both are range scans of the primary key. Filters are a JSON array of
-- [column, operator, value] arrays, for example
--     '[["queue", "=", "emails"], ["scheduled_at", "<", "2030-01-01T00:00:00+00:00"],
--       ["key", "IN", ["a", "b"]], ["dead_from", "IS NOT NULL"]]'
-- They are written into the query as conditions on the table's columns (never as text taken from
-- the input: the column must be one of the result's, the operator one of a fixed list, the value
-- a query parameter cast to the column's type), so PostgreSQL plans them with the id range, and
-- can use any index of the table, as if the caller had written the WHERE clause on the table.
--
-- dq_export_messages and dq_export_archive return a cursor (PL/pgSQL manual, "Returning Cursors"),
-- opened with the function's rights; the caller FETCHes from it in the same transaction. The rows
-- stream as from a SELECT on the table. A set-returning function would collect every row of the
-- range before returning the first (PostgreSQL manual, PL/pgSQL RETURN QUERY): measured with
-- bench/spark.py --runs read (1,000,000 rows, Spark local[2]), that read a whole queue at about
-- 115,000 rows/s, where the cursor, like the former direct SELECT on the table, reads about 160,000.

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- The columns of an export of source (messages: dq_messages, archive: dq_archive), in order: the name
-- a reader and a filter use, its expression over the table aliased m, and its type. The first one is
-- the id the reads are split by. New columns go last: a reader of an earlier release takes the
-- columns it knows by position (pyqueue.spark) and ignores the rest.
CREATE OR REPLACE FUNCTION dq__export_columns(source text)
RETURNS TABLE (name text, expr text, type text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT c.name, c.expr, c.type
      FROM (VALUES ('messages', 1, 'id', 'm.id', 'bigint'),
                    ('messages', 2, 'queue', 'm.queue', 'text'),
                    ('messages', 3, 'key', 'm.key', 'text'),
                    ('messages', 4, 'payload', 'm.payload', 'bytea'),
                    ('messages', 5, 'payload_type', 'm.payload_type', 'text'),
                    ('messages', 6, 'scheduled_at', 'm.scheduled_at', 'timestamptz'),
                    ('messages', 7, 'scheduled_at_initially', 'm.scheduled_at_initially', 'timestamptz'),
                    ('messages', 8, 'delivery_count', 'm.delivery_count', 'integer'),
                    ('messages', 9, 'created_at', 'm.created_at', 'timestamptz'),
                    ('messages', 10, 'locked', '(m.lock_token IS NOT NULL)', 'boolean'),
                    ('messages', 11, 'last_error', 'm.last_error', 'text'),
                    ('messages', 12, 'last_error_at', 'm.last_error_at', 'timestamptz'),
                    ('messages', 13, 'dead_from', 'm.dead_from', 'text'),
                    ('messages', 14, 'dead_at', 'm.dead_at', 'timestamptz'),
                    ('messages', 15, 'released_at', 'm.released_at', 'timestamptz'),
                    ('archive', 1, 'archive_id', 'm.archive_id', 'bigint'),
                    ('archive', 2, 'id', 'm.id', 'bigint'),
                    ('archive', 3, 'queue', 'm.queue', 'text'),
                    ('archive', 4, 'key', 'm.key', 'text'),
                    ('archive', 5, 'payload', 'm.payload', 'bytea'),
                    ('archive', 6, 'payload_type', 'm.payload_type', 'text'),
                    ('archive', 7, 'scheduled_at', 'm.scheduled_at', 'timestamptz'),
                    ('archive', 8, 'scheduled_at_initially', 'm.scheduled_at_initially', 'timestamptz'),
                    ('archive', 9, 'created_at', 'm.created_at', 'timestamptz'),
                    ('archive', 10, 'delivery_count', 'm.delivery_count', 'integer'),
                    ('archive', 11, 'outcome', 'm.outcome', 'text'),
                    ('archive', 12, 'acked_at', 'm.acked_at', 'timestamptz'),
                    ('archive', 13, 'last_error', 'm.last_error', 'text'),
                    ('archive', 14, 'released_at', 'm.released_at', 'timestamptz')) AS c(source, i, name, expr, type)
     WHERE c.source = $1
     ORDER BY c.i
$$;
COMMENT ON FUNCTION dq__export_columns(text) IS 'Internal: the columns (name, expression over m, type) of an export of dq_messages (source messages) or dq_archive, the split id first.';
REVOKE ALL ON FUNCTION dq__export_columns(text) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- The query of one export: its columns (name, expression over the table aliased m, type) and the
-- conditions of the id range and the filters. $1 and $2 are id_from and id_to, $3 the filters.
CREATE OR REPLACE FUNCTION dq__export_query(fn text, source text, filters jsonb, has_from boolean, has_to boolean,
                                            bounds boolean)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_error    jsonb;
    v_table  text;
    v_split  text;
    v_names  text[];
    v_exprs  text[];
    v_types  text[];
    v_where  text[] := ARRAY[]::text[];
    v_filter jsonb;
    v_i      integer := 0;
    v_col    integer;
    v_op     text;
    v_expr   text;
    v_value  text;
BEGIN
    SELECT array_agg(c.name ORDER BY c.i), array_agg(c.expr ORDER BY c.i), array_agg(c.type ORDER BY c.i)
      INTO v_names, v_exprs, v_types
      FROM dq__export_columns(source) WITH ORDINALITY AS c(name, expr, type, i);
    v_table := CASE source WHEN 'messages' THEN 'dq_messages' ELSE 'dq_archive' END;
    v_split := v_exprs[1];
    IF has_from THEN
        v_where := v_where || (v_split || ' >= $1');
    END IF;
    IF has_to THEN
        v_where := v_where || (v_split || ' < $2');
    END IF;
    v_error := CASE WHEN filters IS NULL THEN dq__null_error(fn, 'filters')
                    WHEN jsonb_typeof(filters) <> 'array'
                    THEN dq__error('22023', format('%s: filters is %s, it must be a JSON array of [column, operator, value] '
                                                   'arrays', fn, filters)) END;
    FOR v_filter IN SELECT f FROM jsonb_array_elements(CASE WHEN v_error IS NULL THEN filters END) AS f LOOP
        v_col := array_position(v_names, v_filter ->> 0);
        v_op := v_filter ->> 1;
        v_error := CASE
            WHEN jsonb_typeof(v_filter) <> 'array' OR jsonb_array_length(v_filter) NOT IN (2, 3)
                 OR jsonb_typeof(v_filter -> 0) <> 'string' OR jsonb_typeof(v_filter -> 1) <> 'string'
            THEN dq__error('22023', format('%s: filter %s must be [column, operator, value] or [column, operator]', fn,
                                           v_filter))
            WHEN v_col IS NULL
            THEN dq__error('22023', format('%s: filter %s names no column; the columns are %s', fn, v_filter,
                                           array_to_string(v_names, ', ')))
            WHEN NOT ((v_op IN ('IS NULL', 'IS NOT NULL') AND jsonb_array_length(v_filter) = 2)
                      OR (v_op IN ('=', '<', '<=', '>', '>=') AND jsonb_array_length(v_filter) = 3)
                      OR (v_op = 'IN' AND jsonb_typeof(v_filter -> 2) = 'array'))
            THEN dq__error('22023', format('%s: filter %s is not [column, op, value] with op one of =, <, <=, >, >=, '
                                           '[column, ''IN'', array] or [column, ''IS NULL''|''IS NOT NULL'']', fn, v_filter))
            END;
        EXIT WHEN v_error IS NOT NULL;
        v_expr := v_exprs[v_col];
        v_value := format('($3 -> %s ->> 2)::%s', v_i, v_types[v_col]);
        IF v_op IN ('IS NULL', 'IS NOT NULL') AND jsonb_array_length(v_filter) = 2 THEN
            v_where := v_where || format('%s %s', v_expr, CASE v_op WHEN 'IS NULL' THEN 'IS NULL' ELSE 'IS NOT NULL' END);
        ELSIF v_op IN ('=', '<', '<=', '>', '>=') AND jsonb_array_length(v_filter) = 3 THEN
            -- The operator is written from the fixed list, never copied from the input.
            v_where := v_where || format('%s %s %s', v_expr,
                CASE v_op WHEN '=' THEN '=' WHEN '<' THEN '<' WHEN '<=' THEN '<=' WHEN '>' THEN '>' ELSE '>=' END,
                v_value);
        ELSE
            v_where := v_where || format('%s = ANY (ARRAY(SELECT v::%s FROM jsonb_array_elements_text($3 -> %s -> 2) AS v))',
                                         v_expr, v_types[v_col], v_i);
        END IF;
        v_i := v_i + 1;
    END LOOP;
    IF v_error IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_error->>'sqlstate', MESSAGE = v_error->>'message';
    END IF;
    RETURN format('SELECT %s FROM %I AS m WHERE %s',
                  CASE WHEN bounds THEN format('min(%s), max(%s)', v_split, v_split)
                       ELSE (SELECT string_agg(format('%s AS %I', e, n), ', ' ORDER BY i)
                               FROM unnest(v_exprs, v_names) WITH ORDINALITY AS c(e, n, i)) END,
                  v_table,
                  CASE WHEN cardinality(v_where) = 0 THEN 'true' ELSE array_to_string(v_where, ' AND ') END);
END;
$$;
COMMENT ON FUNCTION dq__export_query(text, text, jsonb, boolean, boolean, boolean) IS 'Internal: the SELECT (or, with bounds, the min and max id) of an export of dq_messages (source messages) or dq_archive, with the id range ($1, $2) and the filters ($3) as conditions on the table. Errors: 22004 filters NULL, 22023 a filter that is not [column, operator, value] with a column of the result and a known operator.';
REVOKE ALL ON FUNCTION dq__export_query(text, text, jsonb, boolean, boolean, boolean) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Open the cursor of an export (dq_export_messages, dq_export_archive), or read its bounds.
CREATE OR REPLACE FUNCTION dq__export_open(fn text, source text, id_from bigint, id_to bigint, filters jsonb)
RETURNS refcursor
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
DECLARE
    v_cursor refcursor;
BEGIN
    OPEN v_cursor NO SCROLL FOR EXECUTE dq__export_query(fn, source, filters, id_from IS NOT NULL, id_to IS NOT NULL, false)
        USING id_from, id_to, filters;
    RETURN v_cursor;
END;
$$;
COMMENT ON FUNCTION dq__export_open(text, text, bigint, bigint, jsonb) IS 'Internal: opens the cursor of an export of source (messages or archive) over id_from <= id < id_to with the filters; returns its name. Errors: those of dq__export_query.';
REVOKE ALL ON FUNCTION dq__export_open(text, text, bigint, bigint, jsonb) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

CREATE OR REPLACE FUNCTION dq__export_bounds(fn text, source text, filters jsonb)
RETURNS TABLE (id_min bigint, id_max bigint)
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY EXECUTE dq__export_query(fn, source, filters, false, false, true) USING NULL::bigint, NULL::bigint, filters;
END;
$$;
COMMENT ON FUNCTION dq__export_bounds(text, text, jsonb) IS 'Internal: one row, the smallest and largest id of the rows of source (messages or archive) that match the filters, both NULL when none. Errors: those of dq__export_query.';
REVOKE ALL ON FUNCTION dq__export_bounds(text, text, jsonb) FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);

CREATE OR REPLACE FUNCTION dq_export_messages(id_from bigint DEFAULT NULL, id_to bigint DEFAULT NULL,
                                              filters jsonb DEFAULT '[]')
RETURNS refcursor
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT dq__export_open('dq_export_messages', 'messages', id_from, id_to, filters) $$;
COMMENT ON FUNCTION dq_export_messages(bigint, bigint, jsonb) IS 'dq_export_messages(id_from bigint, id_to bigint, filters jsonb) -> refcursor: a cursor, open until the end of the transaction, over the live messages with id_from <= id < id_to that match the filters ([column, operator, value] arrays). Errors: 22004 filters NULL, 22023 a bad filter, the cast''s error for a value not of its column''s type.';
REVOKE ALL ON FUNCTION dq_export_messages(bigint, bigint, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_export_messages(bigint, bigint, jsonb) TO dq_consumer;

CREATE OR REPLACE FUNCTION dq_export_messages_bounds(filters jsonb DEFAULT '[]')
RETURNS TABLE (id_min bigint, id_max bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT * FROM dq__export_bounds('dq_export_messages_bounds', 'messages', filters) $$;
COMMENT ON FUNCTION dq_export_messages_bounds(jsonb) IS 'dq_export_messages_bounds(filters jsonb) -> (id_min, id_max): the smallest and largest id of the live messages that match the filters, for splitting a read. Errors: those of dq_export_messages'' filters.';
REVOKE ALL ON FUNCTION dq_export_messages_bounds(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_export_messages_bounds(jsonb) TO dq_consumer;

CREATE OR REPLACE FUNCTION dq_export_archive(id_from bigint DEFAULT NULL, id_to bigint DEFAULT NULL,
                                             filters jsonb DEFAULT '[]')
RETURNS refcursor
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT dq__export_open('dq_export_archive', 'archive', id_from, id_to, filters) $$;
COMMENT ON FUNCTION dq_export_archive(bigint, bigint, jsonb) IS 'dq_export_archive(id_from bigint, id_to bigint, filters jsonb) -> refcursor: a cursor, open until the end of the transaction, over the archive rows with id_from <= archive_id < id_to that match the filters (as dq_export_messages). Errors: those of dq_export_messages.';
REVOKE ALL ON FUNCTION dq_export_archive(bigint, bigint, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_export_archive(bigint, bigint, jsonb) TO dq_admin;

CREATE OR REPLACE FUNCTION dq_export_archive_bounds(filters jsonb DEFAULT '[]')
RETURNS TABLE (id_min bigint, id_max bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
AS $$ SELECT * FROM dq__export_bounds('dq_export_archive_bounds', 'archive', filters) $$;
COMMENT ON FUNCTION dq_export_archive_bounds(jsonb) IS 'dq_export_archive_bounds(filters jsonb) -> (id_min, id_max): the smallest and largest archive_id of the archive rows that match the filters. Errors: those of dq_export_archive''s filters.';
REVOKE ALL ON FUNCTION dq_export_archive_bounds(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dq_export_archive_bounds(jsonb) TO dq_admin;

-- Re-pin the SECURITY DEFINER functions of this file to the private schema first (sql/000_common.sql).
SELECT dq__search_path(internal => false);
