-- 0016: the audit log of the web console (pyqueue console): who did what, when, to which queue, and
-- how it ended. Written by dq_audit and read by dq_audit_entries (sql/168_console.sql), newest first
-- by id. Append-only; nothing prunes it (a row is a few hundred bytes per operator action).
-- depends: 0015_viewer_role
CREATE TABLE IF NOT EXISTS dq_audit_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL,
    actor    text        NOT NULL,
    action   text        NOT NULL,
    queue    text        NULL,
    target   text        NULL,
    details  jsonb       NULL,
    outcome  text        NOT NULL,
    CONSTRAINT dq_audit_log_actor_length CHECK (char_length(actor) BETWEEN 1 AND 200),
    CONSTRAINT dq_audit_log_action_length CHECK (char_length(action) BETWEEN 1 AND 100),
    CONSTRAINT dq_audit_log_queue_length CHECK (char_length(queue) BETWEEN 1 AND 100),
    CONSTRAINT dq_audit_log_target_length CHECK (char_length(target) <= 10000),
    CONSTRAINT dq_audit_log_outcome_length CHECK (char_length(outcome) BETWEEN 1 AND 10000)
);
COMMENT ON TABLE dq_audit_log IS
  'Operator actions taken through the web console (dq_audit), newest first by id (dq_audit_entries). Append-only.';
-- No direct access for anyone but the owner: dq_audit writes it, dq_audit_entries reads it.
REVOKE ALL ON dq_audit_log FROM PUBLIC;
