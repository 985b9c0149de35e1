-- Rolling back 0013: the queued settles go with their table. The functions of sql/ stay (migrate's
-- rule 4: their bodies are resolved when called); those that use the table (polls, waits and the
-- settles of grouped messages) fail with 42P01 until the next full apply, or the previous release's
-- functions, replace them. A queued settle dropped here leaves its group as the last settle left it
-- (an earlier head, or no row) until the next change of the group settles it: roll back when the
-- table is empty.
DROP TABLE IF EXISTS dq_group_settles;
