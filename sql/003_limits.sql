-- Limits: every bound of the API's arguments, and the queue's time bounds, named once. The checks
-- and every function use these, never the bare numbers. Each is an SQL function with a constant body
-- and no SET clause: PostgreSQL inlines it and folds it to a constant where it is used, so naming a
-- limit costs nothing on the hot paths.
-- dq__limit_<name>() is the limit pyqueue.limits calls <NAME> (tests/install/test_parity.py compares every
-- one of them), except those "checked in SQL only", which the Python side does not check itself.
-- Lengths are in characters (char_length), counts in elements or messages, sizes in bytes.
-- Pin the search_path to the install schema (sql/000_common.sql).
SELECT pg_catalog.set_config('search_path', (SELECT pg_catalog.format('%I, %I, pg_temp', u.s, u.s || '_internal') FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE u.s !~ '^pg_' ORDER BY u.i LIMIT 1), false) AS install_search_path;

SELECT dq__search_path(internal => true);  -- internal helpers: created in the private schema (sql/000_common.sql)
-- The payload limits of earlier versions of this file, named otherwise.
DROP FUNCTION IF EXISTS dq__default_max_payload_bytes();
DROP FUNCTION IF EXISTS dq__payload_limit_floor();

-- ----------------------------------------------------------------------------- names and texts
CREATE OR REPLACE FUNCTION dq__limit_queue_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100 $$;
COMMENT ON FUNCTION dq__limit_queue_chars() IS 'Internal: the longest queue name (and dead-letter queue name): 100 characters.';
REVOKE ALL ON FUNCTION dq__limit_queue_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_key_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 200 $$;
COMMENT ON FUNCTION dq__limit_key_chars() IS 'Internal: the longest message key: 200 characters.';
REVOKE ALL ON FUNCTION dq__limit_key_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_payload_type_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100 $$;
COMMENT ON FUNCTION dq__limit_payload_type_chars() IS 'Internal: the longest payload type tag: 100 characters.';
REVOKE ALL ON FUNCTION dq__limit_payload_type_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_group_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 200 $$;
COMMENT ON FUNCTION dq__limit_group_chars() IS 'Internal: the longest FIFO message group name: 200 characters.';
REVOKE ALL ON FUNCTION dq__limit_group_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_error_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10000 $$;
COMMENT ON FUNCTION dq__limit_error_chars() IS 'Internal: the longest error text of a nack (and of a schedule''s last_error): 10,000 characters.';
REVOKE ALL ON FUNCTION dq__limit_error_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_cron_name_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100 $$;
COMMENT ON FUNCTION dq__limit_cron_name_chars() IS 'Internal: the longest schedule name (the key_prefix of dq_install_tick): 100 characters.';
REVOKE ALL ON FUNCTION dq__limit_cron_name_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_cron_schedule_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 $$;
COMMENT ON FUNCTION dq__limit_cron_schedule_chars() IS 'Internal: the longest schedule expression: 1,000 characters.';
REVOKE ALL ON FUNCTION dq__limit_cron_schedule_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- ----------------------------------------------------------------------------- counts
CREATE OR REPLACE FUNCTION dq__limit_poll_max_count() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10000 $$;
COMMENT ON FUNCTION dq__limit_poll_max_count() IS 'Internal: the most messages one poll acquires: 10,000.';
REVOKE ALL ON FUNCTION dq__limit_poll_max_count() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_offer_many_max_items() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100000 $$;
COMMENT ON FUNCTION dq__limit_offer_many_max_items() IS 'Internal: the most messages one dq_offer_many (or dq_install_tick) call offers: 100,000.';
REVOKE ALL ON FUNCTION dq__limit_offer_many_max_items() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_redrive_max_count() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100000 $$;
COMMENT ON FUNCTION dq__limit_redrive_max_count() IS 'Internal: the most dead letters one dq_redrive call moves: 100,000.';
REVOKE ALL ON FUNCTION dq__limit_redrive_max_count() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_dead_letters_max_rows() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100000 $$;
COMMENT ON FUNCTION dq__limit_dead_letters_max_rows() IS 'Internal: the most rows one dq_dead_letters call returns: 100,000.';
REVOKE ALL ON FUNCTION dq__limit_dead_letters_max_rows() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_occurrences_max_count() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10000 $$;
COMMENT ON FUNCTION dq__limit_occurrences_max_count() IS 'Internal: the most instants one dq_cron_occurrences call returns: 10,000.';
REVOKE ALL ON FUNCTION dq__limit_occurrences_max_count() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_max_in_flight_max() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100000 $$;
COMMENT ON FUNCTION dq__limit_max_in_flight_max() IS 'Internal: the highest concurrency limit (max_in_flight) of a queue: 100,000.';
REVOKE ALL ON FUNCTION dq__limit_max_in_flight_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_rate_limit_max() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100000 $$;
COMMENT ON FUNCTION dq__limit_rate_limit_max() IS 'Internal: the highest rate limit (deliveries per rate_period) of a queue: 100,000.';
REVOKE ALL ON FUNCTION dq__limit_rate_limit_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- ----------------------------------------------------------------------------- priorities, sizes
-- A message's priority is a smallint; dq_poll_many walks the levels from the highest to the lowest.
CREATE OR REPLACE FUNCTION dq__limit_priority_min() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT -32768 $$;
COMMENT ON FUNCTION dq__limit_priority_min() IS 'Internal: the lowest priority: -32768.';
REVOKE ALL ON FUNCTION dq__limit_priority_min() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_priority_max() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 32767 $$;
COMMENT ON FUNCTION dq__limit_priority_max() IS 'Internal: the highest priority: 32767.';
REVOKE ALL ON FUNCTION dq__limit_priority_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_headers_bytes() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 8192 $$;
COMMENT ON FUNCTION dq__limit_headers_bytes() IS 'Internal: the largest headers of a message, as JSON text: 8192 bytes.';
REVOKE ALL ON FUNCTION dq__limit_headers_bytes() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
-- Payload limits. A queue's limit is dq_queues.max_payload_bytes, or the default when it sets none;
-- no queue may set one below the minimum (SQS's MaximumMessageSize has the same floor), so the
-- offers read the configuration only for payloads over it.
CREATE OR REPLACE FUNCTION dq__limit_payload_bytes_default() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1048576 $$;
COMMENT ON FUNCTION dq__limit_payload_bytes_default() IS 'Internal: the payload limit of a queue without max_payload_bytes: 1 MiB.';
REVOKE ALL ON FUNCTION dq__limit_payload_bytes_default() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_payload_bytes_min() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1024 $$;
COMMENT ON FUNCTION dq__limit_payload_bytes_min() IS 'Internal: the smallest max_payload_bytes a queue may have: 1 KiB.';
REVOKE ALL ON FUNCTION dq__limit_payload_bytes_min() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_payload_bytes_max() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1073741824 $$;
COMMENT ON FUNCTION dq__limit_payload_bytes_max() IS 'Internal: the largest max_payload_bytes a queue may have: 1 GiB.';
REVOKE ALL ON FUNCTION dq__limit_payload_bytes_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- ----------------------------------------------------------------------------- durations
CREATE OR REPLACE FUNCTION dq__limit_wait_max() RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '1 hour' $$;
COMMENT ON FUNCTION dq__limit_wait_max() IS 'Internal: the longest wait one dq_wait or dq_poll_or_wait registers: 1 hour.';
REVOKE ALL ON FUNCTION dq__limit_wait_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_rate_period_max() RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '1 day' $$;
COMMENT ON FUNCTION dq__limit_rate_period_max() IS 'Internal: the longest rate_period of a queue: 1 day.';
REVOKE ALL ON FUNCTION dq__limit_rate_period_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_cron_lookahead_max() RETURNS interval LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '366 days' $$;
COMMENT ON FUNCTION dq__limit_cron_lookahead_max() IS 'Internal: the longest lookahead of a schedule: 366 days.';
REVOKE ALL ON FUNCTION dq__limit_cron_lookahead_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- ----------------------------------------------------------------------------- checked in SQL only
CREATE OR REPLACE FUNCTION dq__limit_after_parents_max() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10000 $$;
COMMENT ON FUNCTION dq__limit_after_parents_max() IS 'Internal: the most parents one message is offered after (dq_offer''s after): 10,000.';
REVOKE ALL ON FUNCTION dq__limit_after_parents_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
-- The most children one transaction releases: an acknowledged parent releases this many of its
-- children inline and leaves the rest to the backlog (sql/095_dependencies.sql), which a poll or the
-- job dq-release releases this many at a time. Measured (bench/workflows.py, 10,000 children, warm
-- session): an acknowledgement costs about 12 us a child released (2.5 ms at 200, 17-22 ms at 1,000),
-- and the poll that releases the next chunk delays its own deliveries as much; at 500 the parent's
-- ack took 12 ms and the first child reached an idle consumer 21 ms after it (1,000: 24 and 52 ms;
-- 200: 18 and 19 ms, but all 10,000 children delivered in 1.3 s instead of 0.5-0.7 s).
CREATE OR REPLACE FUNCTION dq__limit_release_inline() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 500 $$;
COMMENT ON FUNCTION dq__limit_release_inline() IS 'Internal: the most children one acknowledgement releases in its own transaction (the rest is released by the backlog, as many per poll): 500.';
REVOKE ALL ON FUNCTION dq__limit_release_inline() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_release_backlog_max() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000000 $$;
COMMENT ON FUNCTION dq__limit_release_backlog_max() IS 'Internal: the largest max_children of dq_release_backlog: 1,000,000.';
REVOKE ALL ON FUNCTION dq__limit_release_backlog_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_config_hash_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 64 $$;
COMMENT ON FUNCTION dq__limit_config_hash_chars() IS 'Internal: the longest config_hash of dq_install_tick: 64 characters.';
REVOKE ALL ON FUNCTION dq__limit_config_hash_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_list_messages_max_rows() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10000 $$;
COMMENT ON FUNCTION dq__limit_list_messages_max_rows() IS 'Internal: the most rows one dq_list_messages call returns: 10,000.';
REVOKE ALL ON FUNCTION dq__limit_list_messages_max_rows() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_prune_batch_max() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000000 $$;
COMMENT ON FUNCTION dq__limit_prune_batch_max() IS 'Internal: the largest batch_size of dq_prune_archive: 1,000,000 rows.';
REVOKE ALL ON FUNCTION dq__limit_prune_batch_max() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

CREATE OR REPLACE FUNCTION dq__limit_audit_actor_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 200 $$;
COMMENT ON FUNCTION dq__limit_audit_actor_chars() IS 'Internal: the longest actor of an audit log entry (dq_audit): 200 characters.';
REVOKE ALL ON FUNCTION dq__limit_audit_actor_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_audit_action_chars() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100 $$;
COMMENT ON FUNCTION dq__limit_audit_action_chars() IS 'Internal: the longest action of an audit log entry (dq_audit): 100 characters.';
REVOKE ALL ON FUNCTION dq__limit_audit_action_chars() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
CREATE OR REPLACE FUNCTION dq__limit_throughput_buckets() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10000 $$;
COMMENT ON FUNCTION dq__limit_throughput_buckets() IS 'Internal: the most buckets one dq_throughput call covers (since / bucket): 10,000.';
REVOKE ALL ON FUNCTION dq__limit_throughput_buckets() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- ----------------------------------------------------------------------------- tuning
-- Not bounds of an argument: how far the queue's own work goes.
-- Counts of dq_queue_stats are exact up to this many rows, estimated beyond (sql/165_stats.sql).
CREATE OR REPLACE FUNCTION dq__stats_exact_limit() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 20000 $$;
COMMENT ON FUNCTION dq__stats_exact_limit() IS 'Internal: counts of dq_queue_stats are exact up to this many rows.';
REVOKE ALL ON FUNCTION dq__stats_exact_limit() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
-- At most this many pending (installed, not yet due) occurrences per schedule (sql/230_cron_schedules.sql).
CREATE OR REPLACE FUNCTION dq__cron_pending_limit() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 10000 $$;
COMMENT ON FUNCTION dq__cron_pending_limit() IS 'Internal: the most pending occurrences a schedule holds (10000).';
REVOKE ALL ON FUNCTION dq__cron_pending_limit() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

-- Occurrences deleted less than this before they are due are not offered again (dq__cron_advance).
CREATE OR REPLACE FUNCTION dq__cron_refill_margin() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '1 minute' $$;
COMMENT ON FUNCTION dq__cron_refill_margin() IS 'Internal: deleted occurrences due within this of the clock are not offered again (1 minute).';
REVOKE ALL ON FUNCTION dq__cron_refill_margin() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;

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
-- The due time of a message blocked by its parents (sql/095_dependencies.sql): after every time a
-- message can be due (dq__max_time()), so no poll ever reaches it, and still readable by clients in
-- any time zone (infinity is not: Python's datetime has no such value).
CREATE OR REPLACE FUNCTION dq__blocked_time() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT timestamptz '9999-12-31 00:00:00+00' $$;
COMMENT ON FUNCTION dq__blocked_time() IS 'Internal: the due time a message blocked by its parents is stored with (9999-12-31 UTC, after dq__max_time()).';
REVOKE ALL ON FUNCTION dq__blocked_time() FROM PUBLIC, dq_producer, dq_consumer, dq_admin;
SELECT dq__search_path(internal => false);
