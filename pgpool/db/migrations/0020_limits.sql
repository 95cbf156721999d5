-- description: fleet-wide limits of a kind (pgpool.Limit): the slot a running job of a
--   limited kind holds, held by the database (pgpool_jobs_limit_running)
-- drain: builds one index on pgpool_jobs, holding it against writes while it reads it:
--   every claim, heartbeat and ack waits for as long as that takes (about a second per
--   million jobs)

-- Set by the limited claim only (sql.jobs.CLAIM_LIMITED): the slot, 1..N, and the
-- attempt that took it. A row holds its slot while it runs that attempt: leaving
-- running (an ack, a retry, a hand-back, the reaper) frees it, and so does any later
-- claim, whose attempt is another, so no statement but that claim writes them. NULL
-- for every job of a kind without a limit: no new column to write, and the index's
-- predicate is false for them.
ALTER TABLE pgpool_jobs
    ADD COLUMN limit_slot    integer,
    ADD COLUMN limit_attempt integer;
COMMENT ON COLUMN pgpool_jobs.limit_slot IS
    'the concurrency slot (1..N) of its kind''s pgpool.Limit that the running attempt '
    'limit_attempt holds; NULL for kinds without a limit';
-- The hard guarantee of a concurrency limit: two claims racing for one slot cannot
-- both commit. No column a heartbeat changes, so heartbeats stay HOT.
CREATE UNIQUE INDEX pgpool_jobs_limit_running ON pgpool_jobs (kind, limit_slot)
    WHERE state = 'running' AND limit_attempt = attempts;

-- A rate limit's ring (sql.jobs.CLAIM_LIMITED): R rows per limited kind, each the
-- time one claim last used it. A claim takes a job only with a row last used at
-- least `per` seconds ago, and sets it to now(): each row is used at most once in
-- any window of `per` seconds, so at most R jobs are claimed in one (a sliding
-- window, exact). Claims take rows FOR UPDATE SKIP LOCKED: racing claims take
-- different rows and never wait. The hosts add the rows their kinds' rates need.
CREATE TABLE pgpool_limit_ticks (
    kind    text NOT NULL,
    slot    integer NOT NULL,
    used_at timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (kind, slot)
);
-- No index on used_at: using a row is a HOT update, and the ring does not bloat.
COMMENT ON TABLE pgpool_limit_ticks IS
    'the rings of pgpool.Limit(rate=R, per=s): per kind, R rows, each the last time a '
    'claim took a job with it; a row is used at most once in any window of per seconds';

-- Operators' overrides of the code's limits (`pgpool limits set`, pgpool.ops.set_limit):
-- a row wins over the handler's Limit for its kind until `pgpool limits reset`; a NULL
-- field keeps the code's value. The hosts read it at every control poll.
CREATE TABLE pgpool_limits (
    kind        text PRIMARY KEY,
    concurrency integer CHECK (concurrency > 0),
    rate        integer CHECK (rate > 0),
    per         float8 CHECK (per > 0),
    set_at      timestamptz NOT NULL DEFAULT now(),
    set_by      text NOT NULL DEFAULT session_user,
    CHECK (concurrency IS NOT NULL OR rate IS NOT NULL)
);
COMMENT ON TABLE pgpool_limits IS
    'operators'' overrides of pgpool.Limit, per kind (pgpool limits set/reset); a NULL '
    'field keeps the code''s value';
