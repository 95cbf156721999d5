-- description: the fleet's maintenance leader (one lease row, with a fencing token); hosts'
--   job times and the hosts each queue wants (pgpool_hosts_wanted)

-- One row per elected role ('maintenance': the reaper, the stager, the vacuum keeper,
-- retention and the pruning of stale hosts, run by one host for the whole fleet;
-- pgpool.host.parts.leader). holder is the leading dispatcher's owner until
-- expires_at; token grows by one at every change of holder, and every statement of
-- the elected parts runs in a transaction that first locks this row FOR SHARE with
-- its token and an unexpired lease, so a successor (which must update the row) can
-- only take over between two of them, and a deposed leader's next one finds the
-- token changed.
CREATE TABLE pgpool_leader (
    role        text        PRIMARY KEY,
    holder      text,
    token       bigint      NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz
);
COMMENT ON TABLE pgpool_leader IS
    'pgpool fleet leadership: who runs the fleet''s maintenance (holder, a dispatcher''s '
    'owner) until expires_at; token counts the changes of holder (a fencing token).';
INSERT INTO pgpool_leader (role) VALUES ('maintenance');

-- What a fleet that sizes itself reads (pgpool_hosts_wanted): each host's measured
-- job time, and the lag the fleet is sized for.
ALTER TABLE pgpool_hosts ADD COLUMN job_seconds float8 CHECK (job_seconds > 0);
COMMENT ON COLUMN pgpool_hosts.job_seconds IS
    'seconds a job takes in a worker on this host (a moving average), at its last beat; '
    'NULL before its first job';
ALTER TABLE pgpool_fleet ADD COLUMN target_lag_seconds float8 NOT NULL DEFAULT 60
    CHECK (target_lag_seconds > 0 AND target_lag_seconds < 'Infinity');
COMMENT ON COLUMN pgpool_fleet.target_lag_seconds IS
    'the lag pgpool_hosts_wanted sizes the fleet for: a backlog of ready jobs is to be '
    'started within this many seconds';

-- Per queue: its ready jobs (due now), running jobs and lag (the age of the oldest job
-- due now), the live hosts serving it (beaten within two thirds of their lease, as the
-- claim budget counts them), their mean --procs, mean measured job time and claims/s,
-- and the hosts it wants:
--
--   hosts_wanted = ceil((claims/s x job time + ready x job time / target lag) / procs)
--
-- the hosts that keep up with the jobs arriving (claims/s x job time busy workers),
-- plus those that start the backlog within the target lag; at least one while any job
-- is ready or running (a fleet scaled to zero starts a first host, which measures the
-- job time), none when nothing is. Without a measured job time a queue with work wants
-- one host: the first measures it.
CREATE VIEW pgpool_hosts_wanted AS
WITH work AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'ready' AND run_at <= now()) AS ready,
           count(*) FILTER (WHERE state = 'running') AS running,
           extract(epoch FROM now() - min(run_at) FILTER (
               WHERE state IN ('ready', 'scheduled') AND run_at <= now()))::float8 AS lag
    FROM pgpool_jobs
    GROUP BY queue
), serving AS (
    SELECT q.queue, count(*) AS hosts, avg(h.procs)::float8 AS procs,
           avg(h.job_seconds)::float8 AS job_seconds,
           coalesce(sum(h.claims_per_sec), 0)::float8 AS claims_per_sec
    FROM pgpool_hosts AS h CROSS JOIN LATERAL unnest(h.queues) AS q(queue)
    WHERE h.last_seen >= now() - make_interval(secs => h.lease * 2 / 3)
    GROUP BY q.queue
)
SELECT w.queue, w.ready, w.running, coalesce(w.lag, 0) AS lag_seconds,
       coalesce(s.hosts, 0) AS hosts, s.procs, s.job_seconds, s.claims_per_sec,
       f.target_lag_seconds,
       CASE WHEN w.ready + w.running = 0 THEN 0
            ELSE greatest(1, coalesce(ceil(
                (s.claims_per_sec * s.job_seconds
                 + w.ready * s.job_seconds / f.target_lag_seconds) / s.procs)::bigint, 1))
       END AS hosts_wanted
FROM work AS w
LEFT JOIN serving AS s ON s.queue = w.queue
CROSS JOIN pgpool_fleet AS f;
COMMENT ON VIEW pgpool_hosts_wanted IS
    'per queue: ready and running jobs, lag, the live hosts serving it and what they '
    'measured, and the hosts it wants for pgpool_fleet.target_lag_seconds (KEDA reads it)';
