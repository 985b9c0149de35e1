-- 0009: hardening. Bounded timestamps, dead letters that never replace anything, ownership of
-- schedule occurrences, per-queue payload limits, the due time of a delivery, schedule errors.
-- depends: 0008_key_collation

-- Every timestamp the queue stores and returns lies in [0001-01-02, 9999-12-30] UTC: finite, and
-- readable by clients whose date type stops at years 1-9999 (Python's datetime, most drivers), in
-- any time zone (hence a day of margin at each end). Rows written before this step by a release that
-- accepted anything are moved to the nearest bound; the functions (sql/) refuse such values.
DO $$
DECLARE
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['dq_messages', 'dq_archive'] LOOP
        EXECUTE format(
            'UPDATE %I SET scheduled_at = least(greatest(scheduled_at, $1), $2),
                           scheduled_at_initially = least(greatest(scheduled_at_initially, $1), $2)
              WHERE NOT (scheduled_at BETWEEN $1 AND $2) OR NOT (scheduled_at_initially BETWEEN $1 AND $2)', v_table)
        USING timestamptz '0001-01-02 00:00:00+00', timestamptz '9999-12-30 00:00:00+00';
    END LOOP;
END;
$$;
-- Waiters registered for longer than dq_wait now allows (1 hour) are soft state: drop them.
DELETE FROM dq_waiters WHERE wake_at > now() + interval '1 hour';

ALTER TABLE dq_messages
    -- When the current (or last) delivery was due, and when dq_poll_many claimed it. The archive's
    -- scheduled_at is the due time of the last delivery; poll used to overwrite it with the lock expiry.
    ADD COLUMN IF NOT EXISTS due_at               timestamptz NULL,
    ADD COLUMN IF NOT EXISTS claimed_at           timestamptz NULL,
    -- A dead letter starts its dead-letter queue with delivery_count 0; what it had where it died
    -- is kept here for the record.
    ADD COLUMN IF NOT EXISTS dead_delivery_count  integer NULL,
    -- Ownership of schedule occurrences: the key_prefix of the dq_install_tick that created the
    -- message (a named schedule's name). Schedules delete only messages they own; a key that merely
    -- looks like an occurrence key is an ordinary message.
    ADD COLUMN IF NOT EXISTS cron_prefix          text NULL;

-- The bounds are enforced by the functions (the only writers), not by CHECK constraints on
-- dq_messages: measured with 20,000 single dq_offer calls, three such constraints added about 8 us
-- to a 40 us offer (PostgreSQL prepares a table's check expressions for every INSERT statement).

-- Dead letters never replace anything. A dead letter records the id it had in the queue it died
-- in (dead_from_id: ids are never reused, and it is the id of the archive row of its death). The
-- de-duplication key stays one ordinary message per (queue, key) (dead_from_id NULL, equal under
-- NULLS NOT DISTINCT), while dead letters, identified by (queue, key, dead_from_id), never conflict
-- with ordinary messages nor with each other: two queues dead-lettering one key into one dead-letter
-- queue, or one key dying twice, keep every dead letter. Dead letters written before this step get
-- their own id (their origin's is unknown). The constraint keeps its name, so functions of the
-- previous release (ON CONFLICT ON CONSTRAINT dq_messages_queue_key_key) work unchanged during a
-- rolling deploy. The index is rebuilt under an ACCESS EXCLUSIVE lock (a few seconds per million
-- messages); key keeps COLLATE "C", so prefix ranges of (queue, key) still use it.
ALTER TABLE dq_messages ADD COLUMN IF NOT EXISTS dead_from_id bigint NULL;
UPDATE dq_messages SET dead_from_id = id WHERE dead_from IS NOT NULL AND dead_from_id IS NULL;
ALTER TABLE dq_messages DROP CONSTRAINT dq_messages_queue_key_key;
ALTER TABLE dq_messages
    ADD CONSTRAINT dq_messages_queue_key_key UNIQUE NULLS NOT DISTINCT (queue, key, dead_from_id);

-- Occurrences already installed by a named schedule are its own: mark them (exact name and the
-- schedule's current configuration hash, so an ordinary message is never claimed).
UPDATE dq_messages m
   SET cron_prefix = c.name
  FROM dq_cron c
 WHERE m.queue = c.queue
   AND m.dead_from IS NULL
   AND m.key >= (c.name || '/' || c.config_hash || '/') COLLATE "C"
   AND m.key < (c.name || '/' || c.config_hash || '0') COLLATE "C"
   AND substr(m.key, char_length(c.name || '/' || c.config_hash || '/') + 1) ~ '^-?[0-9]+$';

-- Per-queue payload limit (NULL: the default, 1 MiB). SQS's MaximumMessageSize is the model: at
-- least 1 KiB, so an offer of up to 1 KiB never needs to read the queue's configuration.
ALTER TABLE dq_queues ADD COLUMN IF NOT EXISTS max_payload_bytes integer NULL;
ALTER TABLE dq_queues
    ADD CONSTRAINT dq_queues_max_payload_bytes_range CHECK (max_payload_bytes BETWEEN 1024 AND 1073741824);

-- Schedules: the last evaluation error (a tick skips a failing schedule and records it), and the
-- earliest occurrence deleted by dq_cancel/dq_purge that the next tick offers again.
ALTER TABLE dq_cron
    ADD COLUMN IF NOT EXISTS last_error     text NULL,
    ADD COLUMN IF NOT EXISTS last_error_at  timestamptz NULL,
    ADD COLUMN IF NOT EXISTS refill_from    timestamptz NULL;
