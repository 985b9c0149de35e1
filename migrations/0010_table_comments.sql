-- 0010: the comment users see on dq_messages (\dt+) names behaviour only.
COMMENT ON TABLE dq_messages IS
  'Live delayed messages, one per (queue, key) outside dead-letter queues. Use the dq_* functions; do not write this table directly.';
