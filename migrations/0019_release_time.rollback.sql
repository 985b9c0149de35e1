-- Rolling back 0019: the release times go. dq_get returns the row type dq_message, whose attribute
-- released_at (added by sql/000_common.sql) goes with the column; the functions of sql/ that read or
-- write the columns are replaced by the next full apply (migrate's rule 4).
ALTER TYPE dq_message DROP ATTRIBUTE IF EXISTS released_at;
ALTER TABLE dq_archive DROP COLUMN IF EXISTS released_at;
ALTER TABLE dq_messages DROP COLUMN IF EXISTS released_at;
