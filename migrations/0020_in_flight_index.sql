-- 0020: the index of messages in flight also requires delivery_count > 0 (a message with a lock
-- token has been delivered at least once: dq_poll_many sets both, and nothing else sets a token).
-- With the predicate `lock_token IS NOT NULL` alone, any statement that looks a lock token up
-- (`lock_token = $1`, which implies it) could be planned as a scan of this index from end to end,
-- and was after an ANALYZE that saw nothing in flight: every acknowledgement then read every message
-- in flight. `lock_token = $1` does not imply `delivery_count > 0`, so such statements can use only
-- the lock-token index now (PostgreSQL manual, "Partial Indexes": a partial index is used only when
-- the query's WHERE clause implies its predicate). The readers that count messages in flight (sql/)
-- name both conditions.
-- The index holds only the messages in flight, but building it reads the table, under a SHARE lock
-- (offers, polls and acknowledgements wait meanwhile; PostgreSQL manual, CREATE INDEX).
-- depends: 0019_release_time
DROP INDEX IF EXISTS dq_messages_in_flight_idx;
CREATE INDEX IF NOT EXISTS dq_messages_in_flight_idx ON dq_messages (queue, scheduled_at)
    WHERE lock_token IS NOT NULL AND delivery_count > 0;
