ALTER TABLE dq_cron DROP COLUMN IF EXISTS refill_from, DROP COLUMN IF EXISTS last_error_at,
    DROP COLUMN IF EXISTS last_error;
ALTER TABLE dq_queues DROP CONSTRAINT IF EXISTS dq_queues_max_payload_bytes_range;
ALTER TABLE dq_queues DROP COLUMN IF EXISTS max_payload_bytes;
-- Dead letters sharing (queue, key) with another message cannot all be kept under the old
-- constraint: refuse to roll back rather than delete any (redrive, handle or cancel them first).
DO $$
DECLARE
    v_n bigint;
BEGIN
    SELECT count(*) INTO v_n FROM (SELECT 1 FROM dq_messages GROUP BY queue, key HAVING count(*) > 1) s;
    IF v_n > 0 THEN
        RAISE EXCEPTION '0009_hardening rollback: % keys are held by several messages of one queue (dead letters); handle them first', v_n
            USING ERRCODE = '55000';
    END IF;
END;
$$;
ALTER TABLE dq_messages DROP CONSTRAINT IF EXISTS dq_messages_queue_key_key;
ALTER TABLE dq_messages ADD CONSTRAINT dq_messages_queue_key_key UNIQUE (queue, key);
ALTER TABLE dq_messages DROP COLUMN IF EXISTS dead_from_id, DROP COLUMN IF EXISTS cron_prefix, DROP COLUMN IF EXISTS dead_delivery_count,
    DROP COLUMN IF EXISTS claimed_at, DROP COLUMN IF EXISTS due_at;
