-- 0011: delivery controls. Per message: priority, FIFO message group, expiry, headers. Per queue:
-- a concurrency limit (max_in_flight), a rate limit (rate_limit per rate_period) and pause.
-- depends: 0010_table_comments

-- New columns: a constant default or NULL, so adding them rewrites nothing (PostgreSQL manual,
-- ALTER TABLE, "Notes"). Their bounds are checked by the functions, the only writers (as for the
-- timestamps of 0009: a CHECK constraint costs every INSERT).
ALTER TABLE dq_messages
    ADD COLUMN IF NOT EXISTS priority       smallint    NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS message_group  text        NULL,
    ADD COLUMN IF NOT EXISTS expires_at     timestamptz NULL,
    ADD COLUMN IF NOT EXISTS headers        jsonb       NULL;

-- The poll of ungrouped messages (dead letters count as ungrouped: a dead-letter queue delivers
-- each on its own): by priority, highest first, then due time. Grouped messages are delivered
-- through dq_groups, one group head at a time, so they are not in this index. Built under a
-- SHARE lock (writes wait; about a second per million messages).
CREATE INDEX IF NOT EXISTS dq_messages_ready_idx ON dq_messages (queue, priority DESC, scheduled_at)
    WHERE message_group IS NULL OR dead_from IS NOT NULL;
-- The rest of the messages (grouped ordinary messages) by due time, for stats; with the index above,
-- every message is in exactly one index by (queue, ..., scheduled_at), as before this step (measured:
-- a second such index on every row cost 2.7 us per offered row, 16% of a batched offer).
CREATE INDEX IF NOT EXISTS dq_messages_grouped_idx ON dq_messages (queue, scheduled_at)
    WHERE message_group IS NOT NULL AND dead_from IS NULL;
DROP INDEX IF EXISTS dq_messages_queue_scheduled_at_idx;
-- A group's messages in delivery order: the first is its next head.
CREATE INDEX IF NOT EXISTS dq_messages_group_idx ON dq_messages (queue, message_group, scheduled_at_initially, id)
    WHERE message_group IS NOT NULL AND dead_from IS NULL;
-- Messages in flight by queue and lock expiry: the concurrency limit counts them.
CREATE INDEX IF NOT EXISTS dq_messages_in_flight_idx ON dq_messages (queue, scheduled_at)
    WHERE lock_token IS NOT NULL;
-- Messages that can expire, by queue and expiry (stats, and removal of expired messages).
CREATE INDEX IF NOT EXISTS dq_messages_expires_at_idx ON dq_messages (queue, expires_at)
    WHERE expires_at IS NOT NULL;

-- One row per non-empty FIFO group of a queue: its head (the message it delivers next), with the
-- head's priority and the time it can be delivered (due_at: its scheduled_at, which is its lock
-- expiry while it is in flight). The row's lock serialises every change of the group's head.
CREATE TABLE IF NOT EXISTS dq_groups (
    queue          text        NOT NULL,
    message_group  text        NOT NULL,
    head_id        bigint      NULL,
    priority       smallint    NOT NULL DEFAULT 0,
    due_at         timestamptz NOT NULL,
    PRIMARY KEY (queue, message_group)
)
WITH (
    fillfactor = 70,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX IF NOT EXISTS dq_groups_poll_idx ON dq_groups (queue, priority DESC, due_at);
CREATE INDEX IF NOT EXISTS dq_groups_due_at_idx ON dq_groups (queue, due_at);
CREATE INDEX IF NOT EXISTS dq_groups_head_id_idx ON dq_groups (head_id);
COMMENT ON TABLE dq_groups IS
  'FIFO message groups with messages: the message each delivers next. Maintained by the dq_* functions.';

-- The rate limit's sliding-window log: rate_limit rows per rate-limited queue, each the start time
-- of one recent delivery. A delivery takes a row last used at least rate_period ago.
CREATE TABLE IF NOT EXISTS dq_rate_tokens (
    queue    text        NOT NULL,
    slot     integer     NOT NULL,
    used_at  timestamptz NOT NULL,
    PRIMARY KEY (queue, slot)
)
WITH (fillfactor = 50);
CREATE INDEX IF NOT EXISTS dq_rate_tokens_used_at_idx ON dq_rate_tokens (queue, used_at);
COMMENT ON TABLE dq_rate_tokens IS
  'Rate limits: the start times of the last rate_limit deliveries of each rate-limited queue. Maintained by the dq_* functions.';

ALTER TABLE dq_queues
    ADD COLUMN IF NOT EXISTS max_in_flight  integer  NULL,   -- NULL: no limit
    ADD COLUMN IF NOT EXISTS rate_limit     integer  NULL,   -- NULL: no limit
    ADD COLUMN IF NOT EXISTS rate_period    interval NULL,
    ADD COLUMN IF NOT EXISTS paused         boolean  NOT NULL DEFAULT false;
ALTER TABLE dq_queues
    ADD CONSTRAINT dq_queues_max_in_flight_range CHECK (max_in_flight BETWEEN 1 AND 100000),
    ADD CONSTRAINT dq_queues_rate_limit_range CHECK (rate_limit BETWEEN 1 AND 100000),
    ADD CONSTRAINT dq_queues_rate_period_positive CHECK (rate_period > interval '0'),
    ADD CONSTRAINT dq_queues_rate_complete CHECK ((rate_limit IS NULL) = (rate_period IS NULL));

-- A waiter that must not be woken by offers before not_before (paused queue, concurrency limit
-- reached, no rate token yet): see dq_wait.
ALTER TABLE dq_waiters ADD COLUMN IF NOT EXISTS not_before timestamptz NULL;

ALTER TABLE dq_archive
    ADD COLUMN IF NOT EXISTS priority       smallint    NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS message_group  text        NULL,
    ADD COLUMN IF NOT EXISTS expires_at     timestamptz NULL,
    ADD COLUMN IF NOT EXISTS headers        jsonb       NULL;
ALTER TABLE dq_archive DROP CONSTRAINT IF EXISTS dq_archive_outcome;
ALTER TABLE dq_archive
    ADD CONSTRAINT dq_archive_outcome CHECK (outcome IN ('acked', 'dead', 'cancelled', 'expired'));

-- The row shapes gain the new values (and a delivery its claim time), but not here: they are the
-- result types of the functions of sql/, and the old functions (RETURNS SETOF dq_delivery, …) fail
-- with 42804 on a changed shape. sql/000_common.sql adds the attributes in the transaction that
-- replaces those functions, so old workers keep working between this step and that one.

REVOKE ALL ON dq_groups, dq_rate_tokens FROM PUBLIC;
