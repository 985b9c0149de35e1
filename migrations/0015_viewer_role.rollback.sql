-- Rolling back 0015: dq_viewer loses its privileges in this install (its schema's functions and
-- views, and the schema itself) and is dropped, unless it owns something or still has privileges
-- in another database (roles belong to the whole server): then it is kept, with a notice.
DO $$
DECLARE
    v_role oid := to_regrole('dq_viewer');
    v_obj  record;
BEGIN
    IF v_role IS NULL THEN
        RETURN;
    END IF;
    FOR v_obj IN SELECT p.oid::regprocedure::text AS sig, p.prokind FROM pg_proc p, aclexplode(p.proacl) a
                  WHERE p.pronamespace = current_schema()::regnamespace AND a.grantee = v_role
                  ORDER BY 1
    LOOP
        EXECUTE format('REVOKE ALL ON %s %s FROM dq_viewer',
                       CASE v_obj.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, v_obj.sig);
    END LOOP;
    FOR v_obj IN SELECT c.oid::regclass::text AS rel FROM pg_class c, aclexplode(c.relacl) a
                  WHERE c.relnamespace = current_schema()::regnamespace AND a.grantee = v_role
                  ORDER BY 1
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM dq_viewer', v_obj.rel);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_namespace n, aclexplode(n.nspacl) a
                WHERE n.oid = current_schema()::regnamespace AND a.grantee = v_role) THEN
        EXECUTE format('REVOKE ALL ON SCHEMA %I FROM dq_viewer', current_schema());
    END IF;
    IF EXISTS (SELECT 1 FROM pg_shdepend d WHERE d.refclassid = 'pg_authid'::regclass AND d.refobjid = v_role
                                             AND d.deptype = 'o') THEN
        RAISE NOTICE 'role dq_viewer owns objects: it is kept';
        RETURN;
    END IF;
    BEGIN
        DROP ROLE dq_viewer;
    EXCEPTION WHEN dependent_objects_still_exist OR insufficient_privilege THEN
        RAISE NOTICE 'role dq_viewer is kept: %', SQLERRM;
    END;
END;
$$;
