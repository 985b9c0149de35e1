-- 0017: dependencies between messages (a child offered `after` parents is delivered once every parent
-- is acknowledged). A parent is named by (queue, key): the ordinary message of that key in that queue,
-- the same parent across updates and across a dead-lettering and redrive. Written by dq_offer and by
-- what follows from a parent's or a child's leaving (dq__gone, dq_purge); read by dq_dependencies.
-- depends: 0016_console
CREATE TABLE IF NOT EXISTS dq_dependencies (
    parent_queue       text   NOT NULL,
    parent_key         text   NOT NULL,
    child_id           bigint NOT NULL,
    on_parent_failure  text   NOT NULL DEFAULT 'wait',
    PRIMARY KEY (parent_queue, parent_key, child_id),
    CONSTRAINT dq_dependencies_on_parent_failure CHECK (on_parent_failure IN ('wait', 'dead_letter', 'proceed'))
);
-- A child's own dependencies (it leaves: they go with it; dq_dependencies lists its parents).
CREATE INDEX IF NOT EXISTS dq_dependencies_child_id_idx ON dq_dependencies (child_id);
COMMENT ON TABLE dq_dependencies IS
  'Parents not yet acknowledged of blocked messages: one row per (parent queue, parent key, child message). Use dq_offer(after => ...) and dq_dependencies; do not write this table directly.';
REVOKE ALL ON dq_dependencies FROM PUBLIC;

-- A blocked child is stored with scheduled_at 9999-12-31 (after any due time) and no message_group
-- (no poll, group or due-time index path ever delivers it) and parents_pending > 0; on release it gets release_at and
-- release_group. has_children marks a message some child waits for: its acknowledgement leaves the
-- plain-delete fast path (dq_ack) and releases the children. Fast defaults: no table rewrite.
ALTER TABLE dq_messages
    ADD COLUMN IF NOT EXISTS parents_pending  integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS release_at       timestamptz NULL,
    ADD COLUMN IF NOT EXISTS release_group    text        NULL,
    ADD COLUMN IF NOT EXISTS has_children     boolean     NOT NULL DEFAULT false;
COMMENT ON COLUMN dq_messages.parents_pending IS
  'How many parents of this message are not yet acknowledged; > 0: blocked (not deliverable).';
COMMENT ON COLUMN dq_messages.release_at IS
  'A blocked message''s due time once its last parent is acknowledged.';
COMMENT ON COLUMN dq_messages.release_group IS
  'A blocked message''s FIFO message group, joined once its last parent is acknowledged.';
COMMENT ON COLUMN dq_messages.has_children IS
  'Some message was offered after this one (its acknowledgement releases them).';
