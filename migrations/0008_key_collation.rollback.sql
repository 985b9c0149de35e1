ALTER TABLE dq_messages ALTER COLUMN key TYPE text COLLATE "default";
