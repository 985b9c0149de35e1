DROP INDEX IF EXISTS dq_messages_dead_from_idx;
-- CASCADE: with the functions and views of sql/ that use its row type, if any.
DROP TABLE IF EXISTS dq_archive CASCADE;
ALTER TABLE dq_queues DROP CONSTRAINT IF EXISTS dq_queues_retention_positive;
ALTER TABLE dq_queues DROP COLUMN IF EXISTS notify, DROP COLUMN IF EXISTS retention, DROP COLUMN IF EXISTS archive;
