-- description: a rate's ring is at most 64 rows, each counting the jobs it let start in
--   its episode (pgpool_limit_ticks.n), so that a claim writes one row per 50 jobs of a
--   high rate, not 50, and a tenant's ring is 64 rows, not R

-- A rate of R is a ring of min(R, 64) rows (pgpool.sql.jobs.RING_MAX). A row lets `cap`
-- jobs start in an episode (R over the rows, the first R mod 64 one more: the caps add up
-- to R). A claim may take a row whose episode is over (last used `per` seconds ago or
-- more: n starts again from 0) or top it up while n < cap (a claim whose now() is not
-- before the row's last use); either way it sets used_at to now() and n to the jobs the
-- episode let start. An episode starts no job once its row is full, its jobs start no
-- earlier than its first, and the row's next episode begins `per` seconds after its last
-- job, so any window of `per` seconds holds jobs of one episode per row at most: at most
-- R jobs, still an exact bound. A rate of 64 or less is one job a row, as before.
-- The rows there are each stood for one job; new rows, never used, for none.
ALTER TABLE pgpool_limit_ticks ADD COLUMN n integer NOT NULL DEFAULT 1 CHECK (n >= 0);
ALTER TABLE pgpool_limit_ticks ALTER COLUMN n SET DEFAULT 0;
COMMENT ON COLUMN pgpool_limit_ticks.n IS
    'the jobs this row let start in its episode, the last of them at used_at (a rate of '
    'R: a ring of min(R, 64) rows, each letting R/64 start in an episode)';

-- Rings of more than 64 rows fold onto their first 64: row s keeps the rows s, s + 64,
-- s + 128, ... (as many as its cap), their last use and how many of them were ever
-- used. The window in progress is then counted in full, and the next ones run free.
WITH folded AS (
    SELECT kind, scope, (slot - 1) % 64 + 1 AS slot, max(used_at) AS used_at,
           count(*) FILTER (WHERE isfinite(used_at))::int AS n
    FROM pgpool_limit_ticks
    WHERE (kind, scope) IN (SELECT kind, scope FROM pgpool_limit_ticks WHERE slot > 64)
    GROUP BY kind, scope, (slot - 1) % 64 + 1
), gone AS (
    DELETE FROM pgpool_limit_ticks WHERE slot > 64
)
UPDATE pgpool_limit_ticks AS t SET used_at = f.used_at, n = f.n
FROM folded AS f WHERE t.kind = f.kind AND t.scope = f.scope AND t.slot = f.slot;

-- The limits in force, as in 0024, with a rate's use the jobs its rings' rows let start in
-- the last period (their n), and room since the first of its rows had room: a full row
-- `per` after its last use, a row not full since its last use.
CREATE OR REPLACE VIEW pgpool_limits_in_force AS
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
       CASE WHEN NOT l.scoped AND t.ring >= least(l.rate, 64) AND isfinite(t.oldest)
            THEN t.oldest + make_interval(secs => l.per) END AS room_since
FROM limits AS l
CROSS JOIN pgpool_fleet AS f
CROSS JOIN LATERAL (
    SELECT count(*) AS running FROM pgpool_jobs AS j
    WHERE j.kind = l.kind AND j.state = 'running' AND j.limit_attempt = j.attempts
) AS s
CROSS JOIN LATERAL (
    SELECT coalesce(sum(r.n) FILTER (WHERE r.used_at > now() - make_interval(secs => l.per)),
                    0) AS rate_used,
           count(*) AS ring,
           min(CASE WHEN r.n < l.rate / least(l.rate, 64)
                                + (r.slot <= l.rate % least(l.rate, 64))::int
                    THEN r.used_at - make_interval(secs => l.per)
                    ELSE r.used_at END) AS oldest
    FROM pgpool_limit_ticks AS r
    WHERE r.kind = l.kind AND r.slot <= least(l.rate, 64)
) AS t;
COMMENT ON VIEW pgpool_limits_in_force IS
    'per kind with a limit: the limit in force (an override over the hosts'' code), its '
    'use, the jobs it lets start within the target lag (allowance) and whether it has room now';
