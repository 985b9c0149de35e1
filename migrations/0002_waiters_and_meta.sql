-- 0002: consumers waiting for wake-ups, and the installer's bookkeeping.
-- depends: 0001_messages

-- Sessions sleeping on LISTEN for a queue, with the time they will wake up by themselves.
-- An offer notifies only when some waiter would otherwise sleep past the new message's due
-- time, so NOTIFY (which takes a database-wide lock at commit) costs nothing when nobody
-- waits. UNLOGGED: this is soft state; after a crash it is empty and waiters re-register.
CREATE UNLOGGED TABLE IF NOT EXISTS dq_waiters (
    queue    text        NOT NULL,
    pid      integer     NOT NULL,
    wake_at  timestamptz NOT NULL,
    PRIMARY KEY (queue, pid)
);
COMMENT ON TABLE dq_waiters IS
  'Sessions waiting on LISTEN for a queue, and until when (see dq_wait). Soft state.';

-- Key/value bookkeeping of the installer (the checksum of the sql/ files applied last).
CREATE TABLE IF NOT EXISTS dq_meta (
    name        text PRIMARY KEY,
    value       text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE dq_meta IS 'Installer bookkeeping (sql_checksum: the sql/ files applied last).';
