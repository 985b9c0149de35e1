-- 0003: per-queue configuration, and what a dead letter carries.
-- depends: 0002_waiters_and_meta

-- One row per configured queue; a queue without a row has the defaults (no delivery limit).
-- Later settings (archive, retention, notifications: the operations issue) are added as columns.
CREATE TABLE IF NOT EXISTS dq_queues (
    queue              text PRIMARY KEY,
    max_deliveries     integer NULL,   -- NULL: unlimited
    dead_letter_queue  text NULL,
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dq_queues_queue_length CHECK (char_length(queue) BETWEEN 1 AND 100),
    CONSTRAINT dq_queues_dlq_length CHECK (char_length(dead_letter_queue) BETWEEN 1 AND 100),
    CONSTRAINT dq_queues_dlq_not_self CHECK (dead_letter_queue <> queue),
    CONSTRAINT dq_queues_max_deliveries_positive CHECK (max_deliveries >= 1),
    CONSTRAINT dq_queues_limit_needs_dlq CHECK (max_deliveries IS NULL OR dead_letter_queue IS NOT NULL)
);
COMMENT ON TABLE dq_queues IS 'Per-queue configuration (dq_configure_queue); unconfigured queues use the defaults.';

-- The last failure of a message (dq_nack's error text, or the expiry of its lock), and, for a
-- dead letter, the queue it died in and when. NULL columns without defaults: adding them is instant.
ALTER TABLE dq_messages
    ADD COLUMN IF NOT EXISTS last_error     text NULL,
    ADD COLUMN IF NOT EXISTS last_error_at  timestamptz NULL,
    ADD COLUMN IF NOT EXISTS dead_from      text NULL,
    ADD COLUMN IF NOT EXISTS dead_at        timestamptz NULL;

-- dq_nack gains an error parameter (sql/120_ack.sql): CREATE OR REPLACE cannot add a parameter
-- to the old signature, and both side by side would make two-argument calls ambiguous.
DROP FUNCTION IF EXISTS dq_nack(uuid, interval);
