-- 0001: the live messages table: one row per live message, in snake_case with PostgreSQL types.
-- depends:

CREATE TABLE IF NOT EXISTS dq_messages (
    id                      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue                   text        NOT NULL,
    key                     text        NOT NULL,
    payload                 bytea       NOT NULL,
    payload_type            text        NOT NULL,
    scheduled_at            timestamptz NOT NULL,
    scheduled_at_initially  timestamptz NOT NULL,
    lock_token              uuid        NULL,
    delivery_count          integer     NOT NULL DEFAULT 0,
    created_at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dq_messages_queue_length CHECK (char_length(queue) BETWEEN 1 AND 100),
    CONSTRAINT dq_messages_key_length CHECK (char_length(key) BETWEEN 1 AND 200),
    CONSTRAINT dq_messages_payload_type_length CHECK (char_length(payload_type) BETWEEN 1 AND 100),
    CONSTRAINT dq_messages_delivery_count_nonnegative CHECK (delivery_count >= 0),
    -- The de-duplication key: one live message per (queue, key). A constraint, so the
    -- functions name it in ON CONFLICT ON CONSTRAINT.
    CONSTRAINT dq_messages_queue_key_key UNIQUE (queue, key)
)
-- A queue table is all churn: every message is inserted, updated at least once (poll moves
-- scheduled_at forward and stamps a lock token) and deleted. Storage settings for that:
--  * fillfactor 70 leaves room on each page so the new version of a polled row usually
--    lands on the same page (fewer pages touched, less bloat spreading);
--  * autovacuum triggers on 1000 dead rows + 1% of the table instead of the default 20%:
--    a small live table with a large flow of dead rows must be vacuumed often, or the
--    poll's index scan walks over dead entries (a queue table must stay small to stay fast);
--  * no cost delay, so a vacuum of this table finishes quickly instead of sleeping;
--  * analyze often, so the planner keeps seeing how many rows are due.
WITH (
    fillfactor = 70,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- The poll: due messages of one queue, earliest first.
CREATE INDEX IF NOT EXISTS dq_messages_queue_scheduled_at_idx ON dq_messages (queue, scheduled_at);
-- Acknowledge / nack / extend by lock token; partial, since most rows carry none.
CREATE INDEX IF NOT EXISTS dq_messages_lock_token_idx ON dq_messages (lock_token) WHERE lock_token IS NOT NULL;

COMMENT ON TABLE dq_messages IS
  'Live delayed messages. Use the dq_* functions; do not write this table directly.';

-- Row shapes returned by the functions (their public contract: changing one is a migration).
-- dq_poll_many's rows: one delivery of a message, with its lock token.
CREATE TYPE dq_delivery AS (
    id                      bigint,
    queue                   text,
    key                     text,
    payload                 bytea,
    payload_type            text,
    scheduled_at            timestamptz,  -- the time this delivery was due
    scheduled_at_initially  timestamptz,
    created_at              timestamptz,
    delivery_count          integer,      -- > 1 means a redelivery
    lock_token              uuid,
    locked_until            timestamptz
);
-- dq_get's row: a message as stored, without its lock token.
CREATE TYPE dq_message AS (
    id                      bigint,
    queue                   text,
    key                     text,
    payload                 bytea,
    payload_type            text,
    scheduled_at            timestamptz,
    scheduled_at_initially  timestamptz,
    created_at              timestamptz,
    delivery_count          integer,
    locked_until            timestamptz   -- NULL unless in flight
);
