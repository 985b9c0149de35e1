-- Rolling back the first step removes the whole install of this schema: the functions,
-- procedures and views of sql/ too (several need this step's types, none works without its table).
DO $$
DECLARE
    v_fn record;
BEGIN
    FOR v_fn IN SELECT c.oid::regclass AS view FROM pg_catalog.pg_class c
                 WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'v' AND c.relname LIKE 'dq\_%'
    LOOP
        EXECUTE format('DROP VIEW IF EXISTS %s CASCADE', v_fn.view);
    END LOOP;
    FOR v_fn IN SELECT p.oid::regprocedure AS sig, p.prokind FROM pg_catalog.pg_proc p
                 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'dq\_%'
                 ORDER BY p.proname = 'dq_now'  -- last: the defaults of others call it
    LOOP
        EXECUTE format('DROP %s %s', CASE v_fn.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, v_fn.sig);
    END LOOP;
END;
$$;
DROP TYPE IF EXISTS dq_message;
DROP TYPE IF EXISTS dq_delivery;
DROP TABLE IF EXISTS dq_messages;
