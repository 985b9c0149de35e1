-- 0008: message keys compare bytewise (COLLATE "C").
-- depends: 0007_cron_history

-- Uniqueness does not change: under every deterministic collation two keys are equal only when
-- their bytes are (PostgreSQL docs, 24.2.2.4 "Nondeterministic Collations"). What changes:
--  * the (queue, key) unique index can answer prefix ranges (key >= 'p/' AND key < 'p0'), which
--    dq_install_tick and dq_uninstall_tick use to find one schedule's occurrences without reading
--    the queue's other messages; under a language collation such a range is not a prefix;
--  * key comparisons in that index are a memcmp instead of strcoll (offers get cheaper in
--    databases with a language collation);
--  * ORDER BY key sorts bytewise.
-- Only the collation changes, so the table is not rewritten (ALTER TABLE: "a change of collation
-- ... may not require a table rewrite"), but the unique index is rebuilt under an ACCESS EXCLUSIVE
-- lock: a few seconds per million messages. docs/operations.md ("Upgrading") says so.
ALTER TABLE dq_messages ALTER COLUMN key TYPE text COLLATE "C";
