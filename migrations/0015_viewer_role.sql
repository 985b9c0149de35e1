-- 0015: the read-only role dq_viewer, for dashboards, metrics exporters and people who only look.
-- depends: 0014_vacuum_job
--
-- It may read the queue's figures and messages through granted dq_* functions (dq_metrics,
-- dq_table_health and the view dq_health, dq_queue_stats and dq_stats, dq_list_messages, dq_get,
-- dq_next_due, dq_dead_letters, dq_cron_list and dq_cron_schedules, dq_cron_occurrences; granted in
-- sql/ beside each function) and change nothing. dq_admin is made a member in sql/000_common.sql,
-- with the other memberships. Like the roles of 0006 it belongs to the whole server, so it is
-- created only when absent.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dq_viewer') THEN
        CREATE ROLE dq_viewer NOLOGIN;
    END IF;
END;
$$;

-- dq_table_health names the session that holds back the xmin horizon from pg_stat_activity, which
-- shows another role's sessions' transactions only to superusers and members of pg_read_all_stats
-- (PostgreSQL manual, "The Cumulative Statistics System"). The functions run as the installing role.
DO $$
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
       AND NOT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') THEN
        RAISE NOTICE 'role % is not a member of pg_read_all_stats: dq_health sees the transactions of its own sessions only; GRANT pg_read_all_stats TO % (docs/operations.md, "Table health")',
            quote_ident(current_user), quote_ident(current_user);
    END IF;
END;
$$;
