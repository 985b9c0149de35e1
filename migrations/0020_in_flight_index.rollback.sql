-- Rolling back 0020: the index of messages in flight as 0011 created it.
DROP INDEX IF EXISTS dq_messages_in_flight_idx;
CREATE INDEX IF NOT EXISTS dq_messages_in_flight_idx ON dq_messages (queue, scheduled_at)
    WHERE lock_token IS NOT NULL;
