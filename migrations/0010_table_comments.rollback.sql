-- The comment is left as it is: it describes the table in every release.
SELECT 1;
