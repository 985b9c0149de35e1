-- 0019: when a blocked message was released. released_at is set once the last of its parents'
-- acknowledgements (or a parent's other fate, for a child offered with on_parent_failure proceed)
-- takes it out of the blocked state, by the transaction that releases it (dq__release_children);
-- the archive row of the message keeps it (dq__gone). NULL for a message that never waited.
-- Nullable without a default: adding them rewrites no table (PostgreSQL manual, ALTER TABLE, "Notes").
-- depends: 0018_release_backlog
ALTER TABLE dq_messages ADD COLUMN IF NOT EXISTS released_at timestamptz NULL;
COMMENT ON COLUMN dq_messages.released_at IS
  'When the message''s last parent released it (acknowledged, or another fate of a parent with on_parent_failure proceed); NULL for a message that never waited for parents. Kept by a dead-lettering and a redrive, cleared by an update (a re-offer of its key).';
ALTER TABLE dq_archive ADD COLUMN IF NOT EXISTS released_at timestamptz NULL;
COMMENT ON COLUMN dq_archive.released_at IS
  'When the message''s last parent released it (dq_messages.released_at); NULL for a message that never waited for parents.';
