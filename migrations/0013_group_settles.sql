-- 0013: queued settles of FIFO message groups. A change to a group's messages is followed by a settle
-- of the group (sql/020_groups.sql), which needs the group's dq_groups row lock. When another
-- transaction holds that row (a consumer that polled the group's head inside its transaction, or any
-- open transaction that settled the group), the settle does not wait for it: it records the group
-- here, committed with the change, and the next poll or settle that holds the row applies it.
-- depends: 0012_private_schema

-- One row per queued settle, not per group: a unique key would make two transactions that queue a
-- settle of one group wait for each other, which is what this table is for avoiding. due_at is the
-- earliest time the change can make something of the group deliverable (dq_wait wakes then).
CREATE TABLE IF NOT EXISTS dq_group_settles (
    queue          text        NOT NULL,
    message_group  text        NOT NULL,
    due_at         timestamptz NOT NULL
)
WITH (
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX IF NOT EXISTS dq_group_settles_group_idx ON dq_group_settles (queue, message_group);
CREATE INDEX IF NOT EXISTS dq_group_settles_due_at_idx ON dq_group_settles (queue, due_at);
COMMENT ON TABLE dq_group_settles IS
  'FIFO groups whose head must be settled again: changes made while another transaction held the group''s dq_groups row. Maintained by the dq_* functions.';

REVOKE ALL ON dq_group_settles FROM PUBLIC;
