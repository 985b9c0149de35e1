-- 0004: per-queue operations settings and the history archive.
-- depends: 0003_queues_and_dead_letters

-- Settings of the operations issue, next to the delivery limit of 0003. Defaults keep an
-- unconfigured queue as it was: no archive, notifications on.
ALTER TABLE dq_queues
    ADD COLUMN IF NOT EXISTS archive    boolean  NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS retention  interval NULL,   -- NULL: archive rows are kept forever
    ADD COLUMN IF NOT EXISTS notify     boolean  NOT NULL DEFAULT true;
ALTER TABLE dq_queues
    ADD CONSTRAINT dq_queues_retention_positive CHECK (retention > interval '0');

-- Messages that left the live table of an archiving queue: acknowledged, dead-lettered (a copy:
-- the dead letter itself lives on in its dead-letter queue) or cancelled. Append-only; rows
-- older than the queue's retention are pruned in bounded batches. archive_id orders rows by
-- arrival and splits reads into ranges; id is the message's id in dq_messages.
CREATE TABLE IF NOT EXISTS dq_archive (
    archive_id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                      bigint      NOT NULL,
    queue                   text        NOT NULL,
    key                     text        NOT NULL,
    payload                 bytea       NOT NULL,
    payload_type            text        NOT NULL,
    scheduled_at            timestamptz NOT NULL,  -- when its last delivery was due
    scheduled_at_initially  timestamptz NOT NULL,
    created_at              timestamptz NOT NULL,
    delivery_count          integer     NOT NULL,
    outcome                 text        NOT NULL,
    acked_at                timestamptz NOT NULL,  -- when it left the live table (any outcome)
    last_error              text        NULL,
    CONSTRAINT dq_archive_outcome CHECK (outcome IN ('acked', 'dead', 'cancelled'))
)
-- Insert-only with batched deletes at the old end: no fillfactor room needed; vacuum after the
-- pruning deletes, and for the visibility map of an insert-only table.
WITH (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_insert_scale_factor = 0.05
);
-- Stats (acknowledgements in the last minute / hour) and retention, both per queue by time.
CREATE INDEX IF NOT EXISTS dq_archive_queue_acked_at_idx ON dq_archive (queue, acked_at);
COMMENT ON TABLE dq_archive IS
  'History of archiving queues (dq_configure_queue archive => true): acknowledged, dead and cancelled messages. Pruned by retention.';

-- Dead letters by the queue they died in (dq_stats' dead column).
CREATE INDEX IF NOT EXISTS dq_messages_dead_from_idx ON dq_messages (dead_from) WHERE dead_from IS NOT NULL;
