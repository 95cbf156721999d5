-- description: attempts that do not count: interrupted by shutdown, or never started

ALTER TABLE pgpool_jobs
    ADD COLUMN interruptions integer NOT NULL DEFAULT 0,
    ADD COLUMN started       boolean NOT NULL DEFAULT false;
ALTER TABLE pgpool_dead
    ADD COLUMN interruptions integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN pgpool_jobs.attempts IS
    'claims so far (the ownership token with locked_by); the job has used '
    'attempts - interruptions of its max_attempts';
COMMENT ON COLUMN pgpool_jobs.interruptions IS
    'claims not counted against max_attempts: cut off by a dispatcher''s shutdown, '
    'or reaped before they started; at most pgpool.retry.FREE_INTERRUPTIONS';
COMMENT ON COLUMN pgpool_jobs.started IS
    'the current attempt started in a worker, as last recorded by a heartbeat';
