-- description: limits per tenant or per concurrency key (pgpool.Limit(by=...)): the scope
--   a running job's slot is in, the scope of each rate ring, an override's by
-- drain: builds two indexes on pgpool_jobs, holding it against writes while it reads it:
--   every claim, heartbeat and ack waits for as long as that takes (about two seconds per
--   million jobs)

-- Set by the limited claims only (sql.jobs.CLAIM_LIMITED, CLAIM_SCOPED), with
-- limit_slot and limit_attempt: for a limit by tenant or by concurrency key, the scope
-- whose slot the running attempt holds, 'tenant:' || tenant or 'key:' || the key ('' for
-- a job without one: those share a scope); NULL for a kind-wide limit. The prefix keeps
-- the scopes of the two ways apart, so a claim sees slots held under another `by` (a
-- change of the limit) with two range probes. No column a heartbeat changes.
ALTER TABLE pgpool_jobs ADD COLUMN limit_scope text COLLATE "C";
COMMENT ON COLUMN pgpool_jobs.limit_scope IS
    'the scope (tenant:T or key:K) whose concurrency slot limit_slot the running attempt '
    'limit_attempt holds, for a pgpool.Limit(by=...); NULL for a kind-wide limit';
-- Slots are numbered within their scope: the kind-wide index leaves the scoped rows out
-- (each tenant has its own slot 1), and the scoped one holds one running job per
-- (kind, scope, slot): two claims racing for a scope's slot cannot both commit.
CREATE UNIQUE INDEX pgpool_jobs_limit_scoped_running
    ON pgpool_jobs (kind, limit_scope, limit_slot)
    WHERE state = 'running' AND limit_attempt = attempts AND limit_scope IS NOT NULL;
DROP INDEX pgpool_jobs_limit_running;
CREATE UNIQUE INDEX pgpool_jobs_limit_running ON pgpool_jobs (kind, limit_slot)
    WHERE state = 'running' AND limit_attempt = attempts AND limit_scope IS NULL;

-- A ring per scope: a kind-wide limit's ring is the scope '' (the rows already there);
-- a scoped limit's rings are made by its claims for the scopes they find waiting, and
-- the maintenance leader deletes a ring unused for a day (pgpool.host.parts.retention:
-- no window is longer, so a ring unused that long is as good as a new one).
ALTER TABLE pgpool_limit_ticks ADD COLUMN scope text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE pgpool_limit_ticks DROP CONSTRAINT pgpool_limit_ticks_pkey;
ALTER TABLE pgpool_limit_ticks ADD PRIMARY KEY (kind, scope, slot);
COMMENT ON COLUMN pgpool_limit_ticks.scope IS
    'the ring''s scope: '''' for a kind-wide rate, tenant:T or key:K for a rate by tenant '
    'or by concurrency key';

-- An operator's override of what a kind's limit is counted per (pgpool.Limit's by):
-- 'kind' (the kind as a whole), 'tenant' or 'concurrency_key'; NULL keeps the code's.
-- An override may change only that.
ALTER TABLE pgpool_limits ADD COLUMN scope text
    CHECK (scope IN ('kind', 'tenant', 'concurrency_key'));
ALTER TABLE pgpool_limits DROP CONSTRAINT pgpool_limits_check;
ALTER TABLE pgpool_limits ADD CHECK (concurrency IS NOT NULL OR rate IS NOT NULL
                                     OR scope IS NOT NULL);
COMMENT ON COLUMN pgpool_limits.scope IS
    'kind, tenant or concurrency_key: what the limit is counted per (pgpool.Limit(by=)); '
    'NULL keeps the code''s';
