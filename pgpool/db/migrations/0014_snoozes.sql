-- description: snoozes: runs a handler put off (pgpool.Snooze), not counted as attempts

-- A constant default: a catalog change, no table rewrite.
ALTER TABLE pgpool_jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
ALTER TABLE pgpool_dead ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN pgpool_jobs.attempts IS
    'claims so far (the ownership token with locked_by); the job has used '
    'attempts - interruptions - snoozes of its max_attempts';
COMMENT ON COLUMN pgpool_jobs.snoozes IS
    'claims whose handler raised pgpool.Snooze: not counted against max_attempts; '
    'at most pgpool.retry.MAX_SNOOZES, after which a snooze counts as a failure';
COMMENT ON COLUMN pgpool_dead.reason IS
    'why the job is here: failed (its last attempt failed, its lease expired, or its '
    'handler''s Retry does not retry the error), cancelled (pgpool cancel, or its '
    'handler raised pgpool.Cancel) or discarded (its handler raised pgpool.Discard); '
    'last_error says more';
