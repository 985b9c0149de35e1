-- Rolling back 0016: the audit log goes, with its rows. dq_audit_entries returns the table's row
-- type and cannot exist without it: it is dropped here (the next full apply creates it again);
-- dq_audit stays (migrate's rule 4) and fails with 42P01 until then.
DROP FUNCTION IF EXISTS dq_audit_entries(bigint, integer);
DROP TABLE IF EXISTS dq_audit_log;
