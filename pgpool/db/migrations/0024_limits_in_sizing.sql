-- description: jobs waiting on a limit are not lag: the hosts publish their code's limits
--   (pgpool_hosts.limits); pgpool_limits_in_force, pgpool_queue_work and
--   pgpool_hosts_wanted count the jobs that wait on a limit apart (waiting_on_limits)

-- The code's limits live in the hosts' handlers (pgpool.Limit), which the database does
-- not see; only operators' overrides are rows (pgpool_limits). Each host writes its own
-- when it registers: a column of its row rather than a table of their own, so they live
-- and go exactly as long as the host's row (pruned with it, deleted at a clean exit) with
-- no expiry of their own to keep, and cost no statement beyond the beat's upsert.
ALTER TABLE pgpool_hosts ADD COLUMN limits jsonb;
COMMENT ON COLUMN pgpool_hosts.limits IS
    'the limits in this host''s code (pgpool.Limit), by kind: {"kind": {"concurrency": N, '
    '"rate": R, "per": seconds, "by": "tenant" or "concurrency_key"}} (a field absent: '
    'none; no by: the kind as a whole); NULL from a pgpool older than schema version 24';

-- Per kind with a limit: the limit in force, as the hosts apply it (pgpool.limits.Override
-- .over): an override's fields over the code's, the code's being the one of the newest
-- registered host that declares it (during a rolling deploy, the new code's). Its use:
-- running jobs holding a slot, rows of the rate's ring used in the last period. What it
-- lets start: `allowance`, the jobs more hosts could start within the fleet's target lag
-- (the free slots, at most the rate over the target lag; NULL: no bound); `room`, whether
-- it lets one start now (a free slot and an unused row), and `room_since`, since when the
-- rate has had an unused row (NULL: no rate, or a row of its ring never used; nor is it
-- kept for a concurrency limit, whose freed slots the hosts are told of at once). A limit
-- counted per tenant or per key (`scoped`: pgpool.Limit(by=), or an override's scope,
-- migration 23) bounds each scope, not the kind: it bounds no start fleet-wide (allowance
-- NULL, room true), and its use counts every scope's slots and rows.
CREATE VIEW pgpool_limits_in_force AS
WITH code AS (
    SELECT DISTINCT ON (c.kind) c.kind, c.lim
    FROM pgpool_hosts AS h CROSS JOIN LATERAL jsonb_each(h.limits) AS c(kind, lim)
    ORDER BY c.kind, h.started_at DESC, h.owner
), limits AS (
    SELECT kind,
           coalesce(o.concurrency, (c.lim ->> 'concurrency')::integer) AS concurrency,
           coalesce(o.rate, (c.lim ->> 'rate')::integer) AS rate,
           coalesce(o.per, (c.lim ->> 'per')::float8, 1) AS per,
           o.kind IS NOT NULL AS overridden,
           coalesce(o.scope, c.lim ->> 'by', 'kind') <> 'kind' AS scoped
    FROM code AS c FULL JOIN pgpool_limits AS o USING (kind)
)
SELECT l.kind, l.concurrency, l.rate, l.per, l.overridden, s.running, t.rate_used,
       -- least() skips NULLs: a field not set bounds nothing (and greatest() would
       -- make a missing concurrency 0, hence the CASE).
       CASE WHEN NOT l.scoped THEN
           least(CASE WHEN l.concurrency IS NOT NULL
                      THEN greatest(l.concurrency - s.running, 0) END,
                 ceil(l.rate * f.target_lag_seconds / l.per)::bigint) END AS allowance,
       l.scoped OR coalesce(s.running < l.concurrency, true)
                   AND coalesce(t.rate_used < l.rate, true) AS room,
       CASE WHEN NOT l.scoped AND t.ring >= l.rate AND isfinite(t.oldest)
            THEN t.oldest + make_interval(secs => l.per) END AS room_since
FROM limits AS l
CROSS JOIN pgpool_fleet AS f
CROSS JOIN LATERAL (
    SELECT count(*) AS running FROM pgpool_jobs AS j
    WHERE j.kind = l.kind AND j.state = 'running' AND j.limit_attempt = j.attempts
) AS s
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE r.used_at > now() - make_interval(secs => l.per))
               AS rate_used,
           count(*) AS ring, min(r.used_at) AS oldest
    FROM pgpool_limit_ticks AS r WHERE r.kind = l.kind AND r.slot <= l.rate
) AS t;
COMMENT ON VIEW pgpool_limits_in_force IS
    'per kind with a limit: the limit in force (an override over the hosts'' code), its '
    'use, the jobs it lets start within the target lag (allowance) and whether it has room now';

-- Per queue: its jobs by state, and of those due now (ready, or scheduled and due: the
-- stager makes them ready), those that wait on their kind's limit (`waiting_on_limits`:
-- past its allowance, given to the kind's queues in name order) and the lag: the age of
-- the oldest due job more hosts could start. A kind whose limit has no room now adds
-- nothing to the lag; one whose rate has room counts from when it had (a job held back
-- by the rate until then did not lag). What `pgpool status`, /metrics and
-- pgpool_hosts_wanted read.
CREATE VIEW pgpool_queue_work AS
WITH kinds AS (
    SELECT queue, kind,
           count(*) FILTER (WHERE state IN ('ready', 'scheduled') AND run_at <= now()) AS ready,
           count(*) FILTER (WHERE state IN ('ready', 'scheduled') AND run_at > now())
               AS scheduled,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'parked') AS parked,
           count(*) FILTER (WHERE state = 'done') AS done,
           min(run_at) FILTER (WHERE state IN ('ready', 'scheduled') AND run_at <= now())
               AS oldest
    FROM pgpool_jobs
    GROUP BY queue, kind
), judged AS (
    SELECT k.queue, k.ready, k.scheduled, k.running, k.parked, k.done,
           CASE WHEN l.allowance IS NULL THEN 0
                ELSE k.ready - least(k.ready, greatest(0, l.allowance - (
                         sum(k.ready) OVER (PARTITION BY k.kind ORDER BY k.queue) - k.ready)))
           END AS waiting,
           -- greatest() skips a NULL room_since: the rate had room all along.
           CASE WHEN l.kind IS NULL THEN k.oldest
                WHEN l.room THEN greatest(k.oldest, l.room_since)
           END AS lags_since
    FROM kinds AS k LEFT JOIN pgpool_limits_in_force AS l USING (kind)
)
SELECT queue, sum(ready)::bigint AS ready, sum(scheduled)::bigint AS scheduled,
       sum(running)::bigint AS running, sum(parked)::bigint AS parked,
       sum(done)::bigint AS done, sum(waiting)::bigint AS waiting_on_limits,
       extract(epoch FROM now() - min(lags_since))::float8 AS lag_seconds
FROM judged
GROUP BY queue;
COMMENT ON VIEW pgpool_queue_work IS
    'per queue: jobs by state (ready: due now), those of them waiting on their kind''s '
    'limit, and the lag: the age of the oldest due job more hosts could start';

-- As in 0022, with the backlog counting only what more hosts could start:
--
--   hosts_wanted = ceil((claims/s x job time
--                        + (ready - waiting_on_limits) x job time / target lag) / procs)
--
-- and the lag of pgpool_queue_work. CREATE OR REPLACE, its columns as they were and one
-- more at the end: the grants made on the view (KEDA's role) stay.
CREATE OR REPLACE VIEW pgpool_hosts_wanted AS
WITH serving AS (
    SELECT q.queue, count(*) AS hosts, avg(h.procs)::float8 AS procs,
           avg(h.job_seconds)::float8 AS job_seconds,
           coalesce(sum(h.claims_per_sec), 0)::float8 AS claims_per_sec
    FROM pgpool_hosts AS h CROSS JOIN LATERAL unnest(h.queues) AS q(queue)
    WHERE h.last_seen >= now() - make_interval(secs => h.lease * 2 / 3)
    GROUP BY q.queue
)
SELECT w.queue, w.ready, w.running, coalesce(w.lag_seconds, 0) AS lag_seconds,
       coalesce(s.hosts, 0) AS hosts, s.procs, s.job_seconds, s.claims_per_sec,
       f.target_lag_seconds,
       CASE WHEN w.ready + w.running = 0 THEN 0
            ELSE greatest(1, coalesce(ceil(
                (s.claims_per_sec * s.job_seconds
                 + (w.ready - w.waiting_on_limits) * s.job_seconds / f.target_lag_seconds)
                / s.procs)::bigint, 1))
       END AS hosts_wanted,
       w.waiting_on_limits
FROM pgpool_queue_work AS w
LEFT JOIN serving AS s ON s.queue = w.queue
CROSS JOIN pgpool_fleet AS f;
COMMENT ON VIEW pgpool_hosts_wanted IS
    'per queue: ready and running jobs, lag, the live hosts serving it and what they '
    'measured, the hosts it wants for pgpool_fleet.target_lag_seconds (KEDA reads it), '
    'and the ready jobs waiting on their kind''s limit, which it does not count';
