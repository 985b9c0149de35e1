ALTER TABLE dq_messages DROP COLUMN IF EXISTS dead_at, DROP COLUMN IF EXISTS dead_from,
    DROP COLUMN IF EXISTS last_error_at, DROP COLUMN IF EXISTS last_error;
-- CASCADE: with the functions of sql/ that return its row type (dq_configure_queue).
DROP TABLE IF EXISTS dq_queues CASCADE;
