-- description: scheduled jobs out of the ready index, which is per (queue, kind, tenant);
--   tenants and concurrency keys
-- drain: holds pgpool_jobs exclusively while it moves the waiting jobs to the scheduled
--   state and builds four indexes: every claim, heartbeat and ack waits for as long as that
--   takes (15 s for a million jobs), and hosts abandon their jobs after 0.8 of a lease
--   without a heartbeat

-- NOT VALID, as in migration 5: the new check only widens the old one.
ALTER TABLE pgpool_jobs
    DROP CONSTRAINT pgpool_jobs_state_check,
    ADD CONSTRAINT pgpool_jobs_state_check
        CHECK (state IN ('ready', 'scheduled', 'running', 'done', 'parked')) NOT VALID;
-- '' is the group of jobs without a tenant: NOT NULL keeps the claim's loose index
-- scan over tenants simple (NULLs never compare). COLLATE "C": byte order, cheap.
ALTER TABLE pgpool_jobs
    ADD COLUMN tenant          text COLLATE "C" NOT NULL DEFAULT '',
    ADD COLUMN concurrency_key text;
ALTER TABLE pgpool_dead
    ADD COLUMN tenant          text COLLATE "C" NOT NULL DEFAULT '',
    ADD COLUMN concurrency_key text;
-- The old index goes first, so the conversion does not maintain it.
DROP INDEX pgpool_jobs_ready;
UPDATE pgpool_jobs SET state = 'scheduled' WHERE state = 'ready' AND run_at > now();
-- Per (queue, kind, tenant): a claim reads only the kinds it serves, walks the
-- distinct tenants of each (queue, kind) with a loose index scan and reads each
-- tenant's jobs in claim order. Jobs without a tenant are one group.
CREATE INDEX pgpool_jobs_ready
    ON pgpool_jobs (queue, kind, tenant, priority DESC, run_at, id)
    WHERE state = 'ready';
-- The stager reads the jobs that fall due in order; nothing a heartbeat changes.
CREATE INDEX pgpool_jobs_scheduled ON pgpool_jobs (run_at) WHERE state = 'scheduled';
-- The hard guarantee of concurrency_key: two claims racing for one key cannot both
-- commit. Neither column changes on a heartbeat, so heartbeats stay HOT.
CREATE UNIQUE INDEX pgpool_jobs_key_running ON pgpool_jobs (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;
-- Counts a tenant's running jobs for --tenant-cap (reads at most the cap's worth).
CREATE INDEX pgpool_jobs_tenant_running ON pgpool_jobs (tenant)
    WHERE state = 'running' AND tenant <> '';
COMMENT ON COLUMN pgpool_jobs.state IS
    'ready (due), scheduled (run_at in the future: delayed, or waiting out a retry''s '
    'backoff; the stager makes it ready when due), running, done (succeeded, could '
    'not be deleted), parked (its ack or reap was refused; set it to ready to run it '
    'again)';
COMMENT ON COLUMN pgpool_jobs.tenant IS
    'fairness group set at enqueue ('''' = no tenant, one group): claims interleave '
    'tenants round-robin; pgpool run --tenant-cap caps each one''s running jobs';
COMMENT ON COLUMN pgpool_jobs.concurrency_key IS
    'at most one running job per key across the fleet (pgpool_jobs_key_running)';
