-- description: an index of the ready jobs that need the fair claim
-- drain: holds pgpool_jobs against writes while it reads the table once to build an index:
--   claims, heartbeats and acks wait for as long as that takes

-- Holds the ready jobs with a tenant or a concurrency key, and only those: a claim
-- looks here first (sql._NEED_FAIR), and when it finds nothing takes the plain claim,
-- which skips the tenant walk, shares, rounds and key checks. A queue that never
-- uses tenants or keys never writes to it.
CREATE INDEX pgpool_jobs_ready_fair ON pgpool_jobs (queue, kind)
    WHERE state = 'ready' AND (tenant <> '' OR concurrency_key IS NOT NULL);
