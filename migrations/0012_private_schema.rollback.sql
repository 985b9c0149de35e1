-- Rolling back 0012: the helpers go back into the install schema (where earlier releases kept
-- them), so the functions of sql/ keep working (a schema missing from their pinned search_path is
-- skipped), and the private schema is dropped. The next full apply moves them again.
DO $$
DECLARE
    v_private oid := to_regnamespace(quote_ident(current_schema() || '_internal'));
    v_fn record;
BEGIN
    IF v_private IS NULL THEN
        RETURN;
    END IF;
    FOR v_fn IN SELECT p.oid::regprocedure AS sig, p.prokind FROM pg_catalog.pg_proc p WHERE p.pronamespace = v_private
    LOOP
        EXECUTE format('ALTER %s %s SET SCHEMA %I', CASE v_fn.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                       v_fn.sig, current_schema());
    END LOOP;
    EXECUTE format('DROP SCHEMA %s', v_private::regnamespace);
END;
$$;
