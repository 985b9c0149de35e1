-- Privileges (applied last, after every function exists; re-applied with the functions).
--
-- Least privilege: applications get EXECUTE on the functions of their role and nothing on the
-- tables. Every public dq_* function is SECURITY DEFINER (it runs with its owner's rights, which
-- is how it reaches the tables) with the pinned search_path it was created with, so a function
-- or table planted in a schema of the caller's search_path is never used by ours. That is set
-- here for all of them, so a new function cannot forget it. Internal dq__* helpers are called
-- only from inside our functions (as the owner) and are executable by no application role.
-- Install as a dedicated owner role rather than a superuser: the functions run with its rights.
--
--   dq_producer  offer (dq_offer, dq_offer_many) and cancel (dq_cancel)
--   dq_consumer  poll (dq_poll_many, dq_poll_or_wait, dq_wait, dq_wait_done, dq_channel), finish
--                (dq_ack, dq_nack, dq_extend) and read (dq_get, dq_next_due)
--   dq_admin     everything: both roles above, configuration, redrive, purge, release, stats,
--                retention, schedules (dq_cron_*, dq_install_tick, dq_uninstall_tick)
DO $$
DECLARE
    v_fn        record;
    v_kind      text;
    v_producer  text[] := ARRAY['dq_offer', 'dq_offer_many', 'dq_cancel'];
    v_consumer  text[] := ARRAY['dq_poll_many', 'dq_poll_or_wait', 'dq_wait', 'dq_wait_done', 'dq_channel',
                                'dq_ack', 'dq_nack', 'dq_extend', 'dq_get', 'dq_next_due'];
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure AS sig, p.proname, p.prokind
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'public' AND p.proname LIKE 'dq\_%'
    LOOP
        v_kind := CASE v_fn.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END;
        EXECUTE format('REVOKE ALL ON %s %s FROM PUBLIC', v_kind, v_fn.sig);
        -- Internals are executable by no application role (releases before 0.3 granted two of them
        -- to dq_admin for dq_cron_schedules, which now reads through the SECURITY DEFINER dq_cron_list).
        IF v_fn.proname LIKE 'dq\_\_%' THEN
            EXECUTE format('REVOKE ALL ON %s %s FROM dq_producer, dq_consumer, dq_admin', v_kind, v_fn.sig);
            CONTINUE;
        END IF;
        IF v_fn.prokind = 'f' THEN  -- a procedure that commits cannot be SECURITY DEFINER
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER', v_fn.sig);
        END IF;
        IF v_fn.proname = ANY (v_producer) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO dq_producer', v_fn.sig);
        ELSIF v_fn.proname = ANY (v_consumer) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO dq_consumer', v_fn.sig);
        ELSE
            EXECUTE format('GRANT EXECUTE ON %s %s TO dq_admin', v_kind, v_fn.sig);
        END IF;
    END LOOP;
END;
$$;
GRANT dq_producer, dq_consumer TO dq_admin;
-- The views run with their owner's rights; reading them is an operator's business.
REVOKE ALL ON dq_stats FROM PUBLIC;
GRANT SELECT ON dq_stats TO dq_admin;
REVOKE ALL ON dq_cron_schedules FROM PUBLIC;
GRANT SELECT ON dq_cron_schedules TO dq_admin;
