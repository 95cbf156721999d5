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
