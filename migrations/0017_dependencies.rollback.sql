-- Rolling back 0017: dependencies go, with their rows. dq_dependencies(queue, key) reads the table and
-- cannot work without it: dropped here (the next full apply creates it again, migrate's rule 4).
-- Blocked messages become ordinary messages, due when they would have been released; the groups
-- they join are queued for a settle (the next poll of their queue applies it, sql/020_groups.sql).
DROP FUNCTION IF EXISTS dq_dependencies(text, text);
WITH released AS (
    UPDATE dq_messages SET scheduled_at = release_at, message_group = release_group WHERE parents_pending > 0
    RETURNING queue, message_group, scheduled_at
)
INSERT INTO dq_group_settles (queue, message_group, due_at)
SELECT r.queue, r.message_group, min(r.scheduled_at) FROM released r
 WHERE r.message_group IS NOT NULL
 GROUP BY r.queue, r.message_group;
ALTER TABLE dq_messages DROP COLUMN IF EXISTS has_children, DROP COLUMN IF EXISTS release_group,
    DROP COLUMN IF EXISTS release_at, DROP COLUMN IF EXISTS parents_pending;
DROP TABLE IF EXISTS dq_dependencies;
