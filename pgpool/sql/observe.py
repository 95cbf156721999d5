"""Observation: what ``pgpool status``, the metrics and the dashboard read. Nothing here
writes a job."""

from __future__ import annotations

from typing import Final

# --- status (pgpool.observe) --------------------------------------------------------------

#: First statement of the status transaction: one consistent, read-only snapshot.
STATUS_SNAPSHOT: Final = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

#: Every registered host; ``live`` is false once it is stale (pruned at the next pass);
#: ``counted`` as in `fleet.BUDGET_PEERS`: whether the others still leave it its share.
STATUS_HOSTS: Final = """
SELECT owner, hostname, pid, procs, queues, kinds, lease, started_at, last_seen,
       extract(epoch FROM now() - last_seen)::float8 AS seen_ago,
       last_seen >= now() - make_interval(secs => %(stale_leases)s * lease) AS live,
       last_seen >= now() - make_interval(secs => %(counted_leases)s * lease) AS counted,
       jobs_done, jobs_failed, jobs_claimed, claims_per_sec, max_claims_per_sec,
       claims_share, claims_demand, claim_p99_ms, batch
FROM pgpool_hosts
ORDER BY hostname, started_at, owner
"""

#: Per queue: jobs by state, the age of the oldest job due now that more hosts could start
#: (the lag, seconds; NULL when none is) and the jobs due now that wait on their kind's
#: limit instead (the view ``pgpool_queue_work``, migration 24, which pgpool_hosts_wanted
#: reads too). Shared by `STATUS_QUEUES` and `METRICS_QUEUES`. Due is by ``run_at``, not by
#: state: a scheduled job the stager has not made ready yet is due, and lags.
_JOBS_PER_QUEUE: Final = """
    SELECT queue, ready, scheduled, running, parked, done, lag_seconds AS lag,
           waiting_on_limits
    FROM pgpool_queue_work
"""

#: Per queue: due now, due later, claimed, dead-lettered, parked (see `jobs.PARK`) and
#: parked done (succeeded, their delete refused); the lag (seconds; NULL when none is, see
#: `_JOBS_PER_QUEUE`); dead letters added in the last 24 hours; from the live hosts serving
#: it, their claims per second together and the worst of their claim p99s (ms); and the
#: jobs due now waiting on their kind's limit. Lists every queue that has jobs, dead
#: letters or a registered host serving it.
STATUS_QUEUES: Final = """
WITH jobs AS (""" + _JOBS_PER_QUEUE + """), dead AS (
    SELECT queue, count(*) AS dead,
           count(*) FILTER (WHERE died_at >= now() - interval '24 hours') AS dead_24h
    FROM pgpool_dead GROUP BY queue
), served AS (
    SELECT q.queue,
           sum(h.claims_per_sec) FILTER (WHERE h.live)::float8 AS claims_per_sec,
           max(h.claim_p99_ms) FILTER (WHERE h.live) AS claim_p99_ms
    FROM (SELECT queues, claims_per_sec, claim_p99_ms,
                 last_seen >= now() - make_interval(secs => %(stale_leases)s * lease) AS live
          FROM pgpool_hosts) AS h
    CROSS JOIN LATERAL unnest(h.queues) AS q(queue)
    GROUP BY q.queue
)
SELECT queue, coalesce(ready, 0), coalesce(scheduled, 0), coalesce(running, 0),
       coalesce(dead, 0), coalesce(parked, 0), coalesce(done, 0), lag,
       coalesce(dead_24h, 0), claims_per_sec, claim_p99_ms, coalesce(waiting_on_limits, 0)
FROM jobs FULL JOIN dead USING (queue) FULL JOIN served USING (queue)
ORDER BY queue
"""

#: Autovacuum debt on pgpool_jobs: dead and live tuples, seconds since autovacuum last
#: finished on it (NULL: never), and whether the per-table autovacuum settings the schema
#: sets are still there (a migration or a hand-made ALTER may have reset them).
STATUS_VACUUM: Final = """
SELECT coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
       extract(epoch FROM now() - s.last_autovacuum)::float8,
       coalesce('autovacuum_vacuum_scale_factor=0.02' = ANY(c.reloptions), false)
FROM pg_class AS c LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = to_regclass('pgpool_jobs')
"""

#: (queue, kind) pairs with jobs due now that no live host both serves and handles.
STATUS_UNHANDLED: Final = """
WITH waiting AS (
    SELECT queue, kind, count(*) AS ready, min(run_at) AS oldest
    FROM pgpool_jobs
    WHERE state IN ('ready', 'scheduled') AND run_at <= now()
    GROUP BY queue, kind
)
SELECT w.queue, w.kind, w.ready, extract(epoch FROM now() - w.oldest)::float8
FROM waiting AS w
WHERE NOT EXISTS (
    SELECT FROM pgpool_hosts AS h
    WHERE w.queue = ANY(h.queues) AND w.kind = ANY(h.kinds)
      AND h.last_seen >= now() - make_interval(secs => %(stale_leases)s * h.lease)
)
ORDER BY w.queue, w.kind
"""

#: Every schedule row: ``declared`` while a host's declaration holds (a schedule removed
#: from every host's code stops being declared within `pgpool.schedules` ``declared_for``).
STATUS_SCHEDULES: Final = """
SELECT s.name, s.cron, s.timezone, s.kind, s.queue, s.catch_up, s.last_tick, s.last_run,
       s.last_run_at, s.declared_until > now(), s.declared_until, h.hostname, now()
FROM pgpool_schedules AS s LEFT JOIN pgpool_hosts AS h ON h.owner = s.declared_by
ORDER BY s.name
"""

#: Groups in progress (pgpool.group): members still to finish, or a callback still to run
#: (it is in ``pgpool_jobs``): how many, and the ``limit`` oldest with their progress and
#: their callback's state, as `pgpool.sql.outcomes.GROUP` gives it. One row, with NULLs
#: for a group when there is none.
STATUS_GROUPS: Final = """
WITH open AS (
    SELECT g.id, g.total, g.done, g.dead, g.created_at FROM pgpool_groups AS g
    WHERE g.completed_at IS NULL OR EXISTS (SELECT FROM pgpool_jobs AS j WHERE j.id = g.id)
)
SELECT n.count, o.id, o.total, o.done, o.dead,
       extract(epoch FROM now() - o.created_at)::float8,
       coalesce((SELECT CASE WHEN state = 'ready' AND run_at > now() THEN 'scheduled'
                             ELSE state END FROM pgpool_jobs WHERE id = o.id),
                (SELECT 'done' FROM pgpool_done WHERE id = o.id),
                (SELECT CASE WHEN reason = 'cancelled' THEN 'cancelled' ELSE 'dead' END
                 FROM pgpool_dead WHERE id = o.id))
FROM (SELECT count(*) FROM open) AS n(count)
LEFT JOIN LATERAL (SELECT * FROM open ORDER BY created_at, id LIMIT %(limit)s) AS o ON true
ORDER BY o.created_at, o.id
"""

#: Per kind with successes kept in ``pgpool_done`` (keep=, --keep-done, groups' members):
#: how many finished in the last hour, counted up to ``cap`` + 1 (the count stays cheap
#: however many are kept), and seconds since the latest finished. The kinds are walked on
#: the (kind, finished_at) index, one probe each, rather than by scanning the table.
STATUS_SUCCEEDED: Final = """
WITH RECURSIVE kinds AS (
    (SELECT kind FROM pgpool_done ORDER BY kind LIMIT 1)
    UNION ALL
    SELECT (SELECT d.kind FROM pgpool_done AS d WHERE d.kind > k.kind ORDER BY d.kind LIMIT 1)
    FROM kinds AS k WHERE k.kind IS NOT NULL
)
SELECT k.kind,
       (SELECT count(*) FROM (SELECT FROM pgpool_done AS d
                              WHERE d.kind = k.kind AND d.finished_at >= now() - interval '1 hour'
                              LIMIT %(cap)s + 1) AS h),
       extract(epoch FROM now() - (SELECT max(d.finished_at) FROM pgpool_done AS d
                                   WHERE d.kind = k.kind))::float8
FROM kinds AS k WHERE k.kind IS NOT NULL
ORDER BY k.kind
"""

# --- metrics (pgpool.host.metrics: the queue's figures, served by one host at a time) -----

#: Become the host that serves the queue metrics, if none is: a session-level lock, held
#: for as long as the scrape connection lives. Keyed like `fleet.BUDGET_LOCK`, on the
#: installation's own table (found through search_path, wherever it is on it), so
#: installations in other schemas have reporters of their own.
METRICS_TAKE_REPORTER: Final = """
SELECT pg_try_advisory_lock(hashtextextended('pgpool.queue-metrics:'
                                             || 'pgpool_jobs'::regclass::oid, 0))
"""

#: Per queue: due now, due later, claimed, parked, parked done, the lag (seconds; NULL when
#: none is, see `_JOBS_PER_QUEUE`), dead-lettered by reason (``pgpool_dead.reason``, as a
#: JSON object), whether it is paused, and the jobs due now waiting on their kind's limit.
METRICS_QUEUES: Final = """
WITH jobs AS (""" + _JOBS_PER_QUEUE + """), dead AS (
    SELECT queue, jsonb_object_agg(reason, n) AS dead
    FROM (SELECT queue, reason, count(*) AS n FROM pgpool_dead GROUP BY queue, reason) AS d
    GROUP BY queue
), paused AS (
    SELECT queue, true AS paused FROM pgpool_paused
)
SELECT queue, coalesce(ready, 0), coalesce(scheduled, 0), coalesce(running, 0),
       coalesce(parked, 0), coalesce(done, 0), lag, coalesce(dead, '{}'),
       coalesce(paused, false), coalesce(waiting_on_limits, 0)
FROM jobs FULL JOIN dead USING (queue) FULL JOIN paused USING (queue)
ORDER BY queue
"""

#: Live hosts, their claims per second together, and the budget in force: the fleet's
#: (`pgpool budget set`), else the largest any live host runs with.
METRICS_FLEET: Final = """
SELECT count(*), coalesce(sum(claims_per_sec), 0)::float8,
       coalesce((SELECT max_claims_per_sec FROM pgpool_fleet), max(max_claims_per_sec),
                'NaN')::float8
FROM pgpool_hosts
WHERE last_seen >= now() - make_interval(secs => %(stale_leases)s * lease)
"""

#: Autovacuum debt of the jobs table: dead and live tuples, seconds since its last
#: autovacuum (NaN: never).
METRICS_VACUUM: Final = """
SELECT coalesce(n_dead_tup, 0), coalesce(n_live_tup, 0),
       coalesce(extract(epoch FROM now() - last_autovacuum)::float8, 'NaN')
FROM pg_stat_user_tables
WHERE relid = to_regclass('pgpool_jobs')
"""

# --- the xmin horizon (pgpool.horizon: what holds back vacuum of pgpool's tables) ---------

#: What may hold back vacuum of pgpool's tables, the oldest first: the rows a vacuum may
#: not remove are those that died after the oldest of these (PostgreSQL's rule for a table
#: that is not a catalog). ``kind``:
#:
#: - ``backend``: a session of this database with a transaction id or a snapshot
#:   (``backend_xid``, ``backend_xmin``); not this one, not a walsender (its standby's
#:   feedback is ``standby``), not a lazy VACUUM (the server leaves those out of the
#:   horizon: they are the ones in pg_stat_progress_vacuum);
#: - ``standby``: a standby's hot_standby_feedback, through a walsender with no slot, of any
#:   database;
#: - ``slot``: a replication slot of any database, by its ``xmin`` (a physical slot a
#:   standby's feedback reached); by its ``catalog_xmin`` alone (a logical slot), it holds
#:   back the system catalogs only, and ``holds`` says so;
#: - ``prepared``: a prepared transaction of this database.
#:
#: ``age_xids`` is its age in transactions (``age()``), ``age_seconds`` in time where the
#: server keeps one: a transaction's start, a prepared transaction's ``prepared``, an
#: inactive slot's ``inactive_since`` (PostgreSQL 17+, read through to_jsonb so that older
#: servers answer NULL); a standby's feedback and an active slot carry none. ``ending`` is
#: the statement that ends it (NULL for a standby's feedback: that is the standby's own
#: setting). The ``limit`` oldest of each ``holds``.
HORIZON_HOLDERS: Final = """
WITH holders AS (
    SELECT 'backend' AS kind, 'tables' AS holds,
           greatest(age(a.backend_xid), age(a.backend_xmin)) AS age_xids,
           extract(epoch FROM now() - a.xact_start)::float8 AS age_seconds,
           a.pid, a.usename::text AS usename, a.application_name,
           host(a.client_addr) AS client_addr, a.state,
           extract(epoch FROM now() - a.query_start)::float8 AS query_seconds,
           split_part(a.query, E'\\n', 1) AS query, NULL::text AS name,
           NULL::text AS slot_type, format('SELECT pg_terminate_backend(%%s)', a.pid) AS ending
    FROM pg_stat_activity AS a
    WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
      AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
      AND a.backend_type <> 'walsender'
      AND NOT EXISTS (SELECT FROM pg_stat_progress_vacuum AS v WHERE v.pid = a.pid)
    UNION ALL
    SELECT 'standby', 'tables', age(r.backend_xmin), NULL, r.pid, r.usename::text,
           r.application_name, host(r.client_addr), r.state, NULL, NULL, NULL, NULL, NULL
    FROM pg_stat_replication AS r
    WHERE r.backend_xmin IS NOT NULL
    UNION ALL
    SELECT 'slot', CASE WHEN s.xmin IS NOT NULL THEN 'tables' ELSE 'catalogs' END,
           age(coalesce(s.xmin, s.catalog_xmin)),
           extract(epoch FROM now() - (to_jsonb(s) ->> 'inactive_since')::timestamptz)::float8,
           s.active_pid, r.usename::text, r.application_name, host(r.client_addr),
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL, NULL,
           s.slot_name::text, s.slot_type,
           format('SELECT pg_drop_replication_slot(%%L)', s.slot_name)
    FROM pg_replication_slots AS s LEFT JOIN pg_stat_replication AS r ON r.pid = s.active_pid
    WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared', 'tables', age(p.transaction),
           extract(epoch FROM now() - p.prepared)::float8, NULL, p.owner::text, NULL, NULL,
           NULL, NULL, NULL, p.gid, NULL, format('ROLLBACK PREPARED %%L', p.gid)
    FROM pg_prepared_xacts AS p
    WHERE p.database = current_database()
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY holds
                                 ORDER BY age_xids DESC, age_seconds DESC NULLS LAST) AS n
    FROM holders
)
SELECT kind, holds, age_xids, age_seconds, pid, usename, application_name, client_addr,
       state, query_seconds, query, name, slot_type, ending
FROM ranked
WHERE n <= %(limit)s
ORDER BY holds DESC, n
"""

#: The oldest transaction id that holds back vacuum of pgpool's tables, as text (NULL: none
#: this role can see): of the holders `HORIZON_HOLDERS` lists as ``tables``, the oldest
#: ``backend_xid`` or ``backend_xmin``, standby ``backend_xmin``, slot ``xmin`` or prepared
#: transaction. While it is the same, a vacuum can remove none of the rows that died since
#: the last one (the vacuum keeper, `pgpool.host.parts.vacuum`).
HORIZON_XID: Final = """
SELECT x::text FROM (
    SELECT unnest(ARRAY[a.backend_xid, a.backend_xmin]) AS x FROM pg_stat_activity AS a
    WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
      AND a.backend_type <> 'walsender'
      AND NOT EXISTS (SELECT FROM pg_stat_progress_vacuum AS v WHERE v.pid = a.pid)
    UNION ALL
    SELECT backend_xmin FROM pg_stat_replication
    UNION ALL
    SELECT xmin FROM pg_replication_slots
    UNION ALL
    SELECT transaction FROM pg_prepared_xacts WHERE database = current_database()
) AS h
WHERE x IS NOT NULL
ORDER BY age(x) DESC
LIMIT 1
"""

#: Sessions of this database whose activity this role may not read (their transaction,
#: snapshot and query are NULL to it without pg_read_all_stats): one of them may hold the
#: horizon unseen.
HORIZON_HIDDEN: Final = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND query = '<insufficient privilege>'
"""

#: pgpool's tables (``tables``, by name, found through search_path) that exist: dead and
#: live rows, seconds since a VACUUM (the vacuum keeper's, or an operator's) and an
#: autovacuum last finished on each (NULL: never), and how many of each there were.
TABLES_VACUUM: Final = """
SELECT t.name, coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
       extract(epoch FROM now() - s.last_vacuum)::float8,
       extract(epoch FROM now() - s.last_autovacuum)::float8,
       coalesce(s.vacuum_count, 0), coalesce(s.autovacuum_count, 0)
FROM unnest(%(tables)s::text[]) WITH ORDINALITY AS t(name, i)
JOIN pg_stat_user_tables AS s ON s.relid = to_regclass(t.name)
ORDER BY t.i
"""

#: The worst claim p99 (ms) of the live hosts: what the held horizon costs a claim now.
HORIZON_CLAIM_P99: Final = """
SELECT max(claim_p99_ms) FROM pgpool_hosts
WHERE last_seen >= now() - make_interval(secs => %(stale_leases)s * lease)
"""
