"""Every runtime SQL statement pgpool sends, by name.

The schema itself (DDL) lives in `pgpool.schema` as numbered migrations. Everything here is
parameterised; table names are fixed and resolved through the connection's ``search_path``,
so a deployment can put pgpool in its own schema with ``options=-csearch_path=...``.

Ownership of a running job is the pair (``locked_by``, ``attempts``): the dispatcher id that
claimed it and the attempt number that claim produced. Every statement that changes a
running job checks both, so a dispatcher whose lease expired (and whose job was re-claimed,
possibly by itself) can never ack, retry or extend the newer attempt.

How those checks are written matters for speed. Statistics are gathered while jobs wait,
not while they run, so PostgreSQL estimates "running jobs of this owner" at about one row.
Written as a filter on ``pgpool_jobs`` (``locked_by = %(owner)s``, ``state = 'running'``),
that estimate lets the planner start from those rows and rescan the id list once per row:
quadratic, 200 ms for an ack of 1,000 jobs instead of 6. So the statements that take a
list of ids repeat the owner once per id (``array_fill``) and compare it as a join
condition, with no ``state`` test (``locked_by`` is set exactly while a job runs: the claim
sets it and every way out of running clears it, and so does a cancel, which ends the
attempt's ownership at once: `CANCEL`). Nothing then narrows ``pgpool_jobs`` before the
join, and the plan is one primary-key lookup per id (or one hash join).

Lists of ids and attempts go out as array literals built by `int_array`: psycopg would
adapt a Python list element by element, about 1.7 µs each, most of an ack flush's cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final


def int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, e.g. ``{1,2,3}``, for a ``::bigint[]`` or
    ``::int[]`` parameter (integers need no quoting)."""
    return "{" + ",".join(map(str, values)) + "}"


#: The LISTEN/NOTIFY channel of the installation whose ``pgpool_jobs`` is the table with oid
#: ``{table}``: derived from its schema, so installations in different schemas of one
#: database (and the bench's scratch schema) never wake each other. ``pgpool`` for
#: ``public``, as before channels were per schema (a dispatcher of an older pgpool still
#: hears it); else ``pgpool.<schema>``, or ``pgpool.<md5 of the schema>`` when that would
#: pass the 63 bytes a channel name may have. The payload is the queue with new ready work.
_CHANNEL_OF: Final = """(
    SELECT CASE WHEN n.nspname = 'public' THEN 'pgpool'
                WHEN octet_length(n.nspname) <= 56 THEN 'pgpool.' || n.nspname
                ELSE 'pgpool.' || md5(n.nspname) END
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = {table})"""

#: The channel of the installation ``search_path`` resolves to: an expression, for the
#: statements that notify it; `CHANNEL` selects it, for `LISTEN`.
_OUR_CHANNEL: Final = _CHANNEL_OF.format(table="to_regclass('pgpool_jobs')")
CHANNEL: Final = "SELECT " + _OUR_CHANNEL

# --- enqueue ------------------------------------------------------------------------------

#: Opens the caller's transaction (psycopg begins one lazily), so that pgpool's own
#: ``conn.transaction()`` inside it is a savepoint, not a transaction of its own.
OPEN_TRANSACTION: Final = "SELECT 1"

#: The notification payload that tells every host's stager (`pgpool.stager`) to read the
#: next due time now: a job was scheduled that may be due before the time it knew. No queue
#: name starts with "!".
STAGE: Final = "!stage"

#: One job: ``ready`` when due now, else ``scheduled`` (the stager makes it ready when it is
#: due), so the claim's index holds only due jobs. Notifies the job's queue when it is ready,
#: the stagers (`STAGE`) when it is scheduled. The channel is that of the table the row went
#: into (``tableoid``), at no extra round trip. With a unique key that a live job already
#: holds, no row is inserted and no row returns.
ENQUEUE: Final = """
WITH due AS (
    SELECT coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s))
           AS run_at
), job AS (
    INSERT INTO pgpool_jobs (queue, kind, payload, priority, run_at, state, max_attempts,
                             unique_key, tenant, concurrency_key)
    SELECT %(queue)s, %(kind)s, %(payload)s, %(priority)s, run_at,
           CASE WHEN run_at <= now() THEN 'ready' ELSE 'scheduled' END,
           %(max_attempts)s, %(unique_key)s, %(tenant)s, %(concurrency_key)s
    FROM due
    ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING id, state, tableoid
)
SELECT id, pg_notify(""" + _CHANNEL_OF.format(table="job.tableoid") + """,
                     CASE WHEN state = 'ready' THEN %(queue)s ELSE '""" + STAGE + """' END)
FROM job
"""

#: Bulk insert; rows are written in COPY text format by `pgpool.enqueue`. With a given
#: ``run_at`` the rows go in as scheduled, whether that time has passed or not (COPY cannot
#: compare it with the server's clock): the stager makes the due ones ready at once, woken
#: by `NOTIFY_STAGE`.
COPY_JOBS: Final = (
    "COPY pgpool_jobs (queue, kind, payload, priority, max_attempts, tenant, concurrency_key) "
    "FROM STDIN"
)
COPY_JOBS_AT: Final = (
    "COPY pgpool_jobs (queue, kind, payload, priority, max_attempts, tenant, concurrency_key, "
    "run_at, state) FROM STDIN"
)

#: After a COPY: wake the dispatchers of the installation the rows went to.
NOTIFY: Final = "SELECT pg_notify(" + _OUR_CHANNEL + ", %(queue)s)"
#: After a COPY of scheduled rows: wake the installation's stagers.
NOTIFY_STAGE: Final = "SELECT pg_notify(" + _OUR_CHANNEL + ", '" + STAGE + "')"

# --- dispatcher: claim, heartbeat, ack, reap -----------------------------------------------

#: Format with the channel `CHANNEL` returned, quoted (`pgpool.listener.listen_statement`).
LISTEN: Final = "LISTEN {}"

#: Once per pooled connection of a dispatcher (`pgpool.claimer.configure_connection`): how
#: long its statements may wait for a lock and run (`Lease.lock_timeout`,
#: `Lease.statement_timeout`). Session settings, so no statement pays a round trip for them.
#: A value set on purpose for the connection (the DSN's options or PGOPTIONS, the role, the
#: database) is kept: the operator's choice wins.
SESSION_TIMEOUTS: Final = """
SELECT set_config(name, CASE name WHEN 'lock_timeout' THEN %(lock)s ELSE %(statement)s END,
                  false)
FROM pg_settings
WHERE name IN ('lock_timeout', 'statement_timeout')
  AND source NOT IN ('client', 'user', 'database', 'database user')
"""

#: Once per pooled connection of a dispatcher (`pgpool.claimer.configure_connection`): its
#: statements are written for read committed, whatever the role, the database or the DSN
#: make the default. Under repeatable read or serializable, a claim that meets a job taken
#: since its snapshot, or an ack or a heartbeat that meets a row changed since, fails with
#: a serialization error instead of looking again (read committed's re-check).
READ_COMMITTED: Final = "SET default_transaction_isolation = 'read committed'"

#: Once per pooled connection of a dispatcher: no JIT compilation. Its statements are short;
#: JIT starts where the planner's estimate passes ``jit_above_cost``, and the estimates of a
#: generic plan, made without its parameters' values, can: a claim then spent 35 ms
#: compiling itself, against 1.4 ms to run.
NO_JIT: Final = "SET jit = off"

#: Once per connection of a dispatcher's claim pool (`pgpool.claimer.configure_connection`):
#: the prepared claims are planned once, not at every claim. PostgreSQL keeps re-planning
#: them otherwise (its estimate of a generic plan, which cannot know ``limit``, stays above
#: the custom plans'), and planning the plain claim took 0.7 ms of the 2.7 it cost the
#: server. Both claims' generic plans are tested to read what their custom plans read
#: (tests/test_routing.py, tests/test_plain_claim.py).
GENERIC_PLANS: Final = "SET plan_cache_mode = force_generic_plan"

#: Tenants that give nothing now (at --tenant-cap, or their first job waiting on a running
#: concurrency key) that `CLAIM`'s walk goes past in each (queue, kind) pair, beyond the
#: ``limit`` that can give a job: a bound on what one claim reads. Each costs about three
#: index descents (finding it, probing its key, the scan of its jobs that finds nothing),
#: more with a backlog of jobs waiting on its key (README "Fairness", "What it costs").
TENANT_SKIPS: Final = 100

#: The ready jobs of the given queues and kinds that need the fair claim: those with a
#: tenant or a concurrency key. Read on the partial index pgpool_jobs_ready_fair, which
#: holds only them: an empty index (a queue that never used either) costs a page per
#: (queue, kind) pair.
_NEED_FAIR: Final = """
        SELECT FROM pgpool_jobs
        WHERE state = 'ready' AND (tenant <> '' OR concurrency_key IS NOT NULL)
          AND queue = ANY(%(queues)s::text[]) AND kind = ANY(%(kinds)s::text[])
"""

#: The plain claim: up to ``limit`` ready jobs of the given queues and kinds, when nothing
#: waiting there has a tenant or a concurrency key (`_NEED_FAIR`, read once): then the fair
#: claim (`CLAIM`) would pick the same jobs, at more than twice the cost. It is the claim a
#: hand-written loop sends, plus that look and ``max_attempts``.
#:
#: - One LATERAL scan per (queue, kind) pair on the ready index, in claim order (priority,
#:   due time, id), stopped by its LIMIT; then the pairs' rows merged in that order. SKIP
#:   LOCKED makes concurrent claimers take disjoint rows; NO KEY UPDATE does not block
#:   foreign keys that reference a job. Rows a scan locked but the batch did not take stay
#:   ready when the statement ends.
#: - A job's ``max_attempts`` is fixed at its first claim from its handler's setting when
#:   the producer left it open, so the reaper (which has no handler registry) can decide
#:   retry-or-dead on its own.
#: - The picked rows are updated by ``id = ANY(ARRAY(...))``, not joined: a generic plan
#:   (`GENERIC_PLANS`) cannot know ``limit``, and joined it would hash the whole table (2 s a
#:   claim with a million jobs queued); an id array is looked up in the primary key in
#:   every plan.
#:
#: Rows (id, kind, queue, attempts, interruptions, max_attempts, payload, seconds since
#: due, tenant, priority), in no order: the claimer puts them in claim order. None when
#: something waiting needs the fair claim, and none when nothing waits: then the claimer
#: claims with `CLAIM`, which tells the two apart.
CLAIM_PLAIN: Final = """
UPDATE pgpool_jobs AS j
SET state = 'running',
    attempts = j.attempts + 1,
    max_attempts = coalesce(j.max_attempts, (%(kind_max_attempts)s::int[])[
        array_position(%(kinds)s::text[], j.kind)]),
    locked_by = %(owner)s,
    claimed_at = now(),
    lease_until = now() + make_interval(secs => %(lease)s),
    started = false
WHERE j.id = ANY(ARRAY(
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(queue) CROSS JOIN unnest(%(kinds)s::text[]) AS k(kind)
    CROSS JOIN LATERAL (
        SELECT p.id, p.priority, p.run_at FROM pgpool_jobs AS p
        WHERE p.state = 'ready' AND p.queue = q.queue AND p.kind = k.kind AND p.tenant = ''
          AND p.run_at <= now() AND p.concurrency_key IS NULL
        ORDER BY p.priority DESC, p.run_at, p.id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE NOT EXISTS (""" + _NEED_FAIR + """)  -- read once: then no scan at all
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s))
RETURNING j.id, j.kind, j.queue, j.attempts, j.interruptions, j.max_attempts, j.payload,
          extract(epoch FROM now() - j.run_at)::float8, j.tenant, j.priority
"""

#: The fair claim: up to ``limit`` ready jobs of the given queues and kinds, in fair order,
#: when something waiting has a tenant or a concurrency key (else `CLAIM_PLAIN` does it).
#: Locking and the update as in `CLAIM_PLAIN`. Rows in claim order, as `CLAIM_PLAIN`'s but
#: the last: ``plain``, true when nothing it left behind needs the fair claim (the claimer's
#: next claim is the plain one then).
#:
#: One LATERAL scan per (queue, kind) pair and tenant, on the ready index (queue, kind,
#: tenant, priority DESC, run_at, id): each returns rows already in claim order and stops
#: after its LIMIT, however deep the backlog. (``queue = ANY(...)`` would make PostgreSQL
#: sort every due row first: 350 ms instead of 1.4 ms per claim with a million jobs due.)
#: Rows a scan locked but the batch did not take stay ready when the statement ends.
#:
#: Fairness (README "Fairness"; the parts marked "fair:" below):
#: - ``walk``: a loose index scan (one index descent per tenant) lists the tenants with
#:   ready jobs in each pair, starting after the claimer's cursor ``after`` and wrapping
#:   round, until ``limit`` of them can give a job: its cost grows with the number of
#:   tenants waiting, never with any tenant's backlog. Jobs without a tenant are the group
#:   ''. A tenant that gives nothing now does not count (no room under the cap, or its
#:   first job's concurrency key is running, read off the descent's own index entry plus
#:   one probe of pgpool_jobs_key_running), up to `TENANT_SKIPS` of them: without that, a
#:   window of such tenants right after the cursor made every claim come back empty while
#:   other tenants waited. A claim that takes nothing after a walk went past that many
#:   returns one row with no job, naming where that walk stopped (the least far round):
#:   the claimer's next walk starts there.
#: - ``room``: with ``tenant_cap``, how many more of a tenant's jobs may run now (its
#:   running jobs in any queue counted on an index, at most the cap's worth of them).
#: - ``fair``: each tenant's equal share of the batch first; ``spare``: what the others did
#:   not need goes to the tenants that filled their share (a lone tenant gets it all).
#: - ``picked``: round-robin, the first job of every tenant, then the second, ...; priority
#:   orders the jobs within a tenant and breaks ties within a round.
#: - ``concurrency_key``: jobs whose key is running are skipped, and a batch takes at most
#:   one job per key. Two claims racing for one key both see it idle (each statement's
#:   snapshot predates the other's commit), but the unique index pgpool_jobs_key_running
#:   makes the second one fail with a unique violation, rolled back whole: the claimer
#:   tries again (`pgpool.claimer`), and then sees the key running.
#:
#: Jobs not yet due are ``scheduled``, outside the ready index, so they cost a claim nothing
#: (``run_at <= now()`` only guards against a ready row written with a future time by a
#: pgpool older than the scheduled state).
CLAIM: Final = """
WITH RECURSIVE pairs AS (
    SELECT q.queue, k.kind
    FROM unnest(%(queues)s::text[]) AS q(queue) CROSS JOIN unnest(%(kinds)s::text[]) AS k(kind)
), walk AS (  -- fair: the tenants with ready jobs, from the cursor on, wrapping round
    SELECT p.queue, p.kind, f.lowest, f.lowest_key, NULL::text COLLATE "C" AS first,
           %(after)s::text COLLATE "C" AS tenant, 0 AS n, 0 AS skipped, 0 AS room
    FROM pairs AS p  -- n = 0: the cursor, where the walk starts, not a tenant
    CROSS JOIN LATERAL (  -- where the walk wraps round to, found once
        SELECT tenant AS lowest, concurrency_key AS lowest_key FROM pgpool_jobs
        WHERE state = 'ready' AND queue = p.queue AND kind = p.kind
        ORDER BY tenant, priority DESC, run_at, id LIMIT 1) AS f
    UNION ALL
    SELECT t.queue, t.kind, t.lowest, t.lowest_key, coalesce(t.first, x.tenant), x.tenant,
           t.n + 1, t.skipped + CASE  -- a tenant that gives nothing now: go on past it
               WHEN r.room = 0 THEN 1 WHEN x.key IS NULL THEN 0
               WHEN EXISTS (SELECT FROM pgpool_jobs AS k  -- its first job's key runs
                            WHERE k.concurrency_key = x.key AND k.state = 'running') THEN 1
               ELSE 0 END,
           r.room
    FROM walk AS t
    LEFT JOIN LATERAL (  -- the next tenant's first job, in claim order
        SELECT tenant, concurrency_key FROM pgpool_jobs
        WHERE state = 'ready' AND queue = t.queue AND kind = t.kind AND tenant > t.tenant
        ORDER BY tenant, priority DESC, run_at, id LIMIT 1) AS nx ON true
    CROSS JOIN LATERAL (SELECT coalesce(nx.tenant, t.lowest) AS tenant,
        CASE WHEN nx.tenant IS NULL THEN t.lowest_key ELSE nx.concurrency_key END AS key
        ) AS x
    CROSS JOIN LATERAL (SELECT  -- --tenant-cap: how many more of its jobs may run now
        CASE WHEN %(tenant_cap)s::int IS NULL OR x.tenant = '' THEN %(limit)s
             ELSE greatest(0, %(tenant_cap)s::int - (
                 SELECT count(*) FROM (
                     SELECT FROM pgpool_jobs AS r
                     WHERE r.tenant = x.tenant AND r.state = 'running' AND r.tenant <> ''
                     LIMIT %(tenant_cap)s) AS r))::int END AS room
        OFFSET 0) AS r  -- not inlined: its subquery runs once, not per use
    WHERE (t.n = 0 OR x.tenant <> t.first)
      AND t.n - t.skipped < %(limit)s AND t.skipped < """ + str(TENANT_SKIPS) + """
), tenants AS (
    SELECT queue, kind, tenant, room FROM walk WHERE n > 0
), room AS (  -- fair: --tenant-cap, how many more of each tenant's jobs may run now
    SELECT DISTINCT tenant, room FROM tenants
), share AS (  -- fair: the equal share of the batch of each tenant with room
    SELECT ceil(%(limit)s::float8 / greatest(1, count(*)))::int AS share
    FROM room WHERE room > 0
), fair AS MATERIALIZED (
    SELECT c.* FROM tenants AS t JOIN room AS r USING (tenant) CROSS JOIN share AS s
    CROSS JOIN LATERAL (
        SELECT j.id, j.queue, j.kind, j.tenant, j.priority, j.run_at, j.concurrency_key
        FROM pgpool_jobs AS j
        WHERE j.state = 'ready' AND j.queue = t.queue AND j.kind = t.kind
          AND j.tenant = t.tenant AND j.run_at <= now()
          AND NOT EXISTS (SELECT FROM pgpool_jobs AS k  -- concurrency_key: one running
                          WHERE k.concurrency_key = j.concurrency_key
                            AND k.concurrency_key IS NOT NULL AND k.state = 'running')
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT least(s.share, r.room)
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE r.room > 0
), spare AS (  -- fair: the rest of the batch, to the tenants that filled their share
    SELECT c.*
    FROM (SELECT queue, kind, tenant, count(*)::int AS got, array_agg(id) AS ids
          FROM fair GROUP BY queue, kind, tenant) AS f
    JOIN room AS r USING (tenant) CROSS JOIN share AS s
    CROSS JOIN (SELECT count(*)::int AS got FROM fair) AS total
    CROSS JOIN LATERAL (
        SELECT j.id, j.queue, j.kind, j.tenant, j.priority, j.run_at, j.concurrency_key
        FROM pgpool_jobs AS j
        WHERE j.state = 'ready' AND j.queue = f.queue AND j.kind = f.kind
          AND j.tenant = f.tenant AND j.run_at <= now() AND j.id <> ALL(f.ids)
          AND NOT EXISTS (SELECT FROM pgpool_jobs AS k  -- concurrency_key: one running
                          WHERE k.concurrency_key = j.concurrency_key
                            AND k.concurrency_key IS NOT NULL AND k.state = 'running')
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT least(r.room - f.got, %(limit)s - total.got)
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE f.got = least(s.share, r.room) AND f.got < r.room AND total.got < %(limit)s
), one_per_key AS (  -- concurrency_key: at most one job per key in a batch
    SELECT *, row_number() OVER (PARTITION BY concurrency_key
                                 ORDER BY priority DESC, run_at, id) AS key_rank
    FROM (SELECT * FROM fair UNION ALL SELECT * FROM spare) AS candidates
), picked AS (  -- fair: round-robin over tenants, within the cap
    SELECT x.id FROM (
        SELECT id, tenant, priority, run_at,
               row_number() OVER (PARTITION BY tenant ORDER BY priority DESC, run_at, id)
                   AS tenant_rank
        FROM one_per_key WHERE concurrency_key IS NULL OR key_rank = 1
    ) AS x JOIN room AS r USING (tenant)
    WHERE x.tenant_rank <= r.room
    ORDER BY x.tenant_rank, x.priority DESC, x.run_at, x.id
    LIMIT %(limit)s
), plain AS (  -- nothing left that needs the fair claim once this one's jobs are taken
    SELECT NOT EXISTS (""" + _NEED_FAIR + """
          AND id <> ALL(ARRAY(SELECT id FROM picked))) AS plain
), claimed AS (  -- as in CLAIM_PLAIN
    UPDATE pgpool_jobs AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        max_attempts = coalesce(j.max_attempts, k.max_attempts),
        locked_by = %(owner)s,
        claimed_at = now(),
        lease_until = now() + make_interval(secs => %(lease)s),
        started = false
    FROM unnest(%(kinds)s::text[], %(kind_max_attempts)s::int[]) AS k(kind, max_attempts)
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND k.kind = j.kind
    RETURNING j.id, j.kind, j.queue, j.attempts, j.interruptions, j.max_attempts, j.payload,
              extract(epoch FROM now() - j.run_at)::float8 AS waited, j.tenant, j.priority,
              j.run_at
)
SELECT c.id, c.kind, c.queue, c.attempts, c.interruptions, c.max_attempts, c.payload,
       c.waited, coalesce(c.tenant, w.tenant), (SELECT plain FROM plain)
FROM (SELECT coalesce(min(tenant) FILTER (WHERE tenant > %(after)s), min(tenant)) AS tenant
      FROM walk WHERE skipped = """ + str(TENANT_SKIPS) + """) AS w  -- where walks stopped short
LEFT JOIN claimed AS c ON true
WHERE c.id IS NOT NULL OR w.tenant IS NOT NULL  -- nothing claimed: that, in a row with no job
ORDER BY c.priority DESC, c.run_at, c.id  -- claim order: the workers take them in this order
"""

#: Jobs of the given queues and kinds that any host (this one too) is running now, and when
#: the last of their leases ends: a burst host is not drained while any could still come
#: back to it.
RUNNING: Final = """
SELECT count(*), max(lease_until) - now() FROM pgpool_jobs
WHERE state = 'running' AND queue = ANY(%(queues)s::text[]) AND kind = ANY(%(kinds)s::text[])
"""

#: Extend the leases of every job this dispatcher holds, in one statement, and record which
#: attempts have started in a worker (the reaper does not count an attempt that never
#: started). Returns (id, attempt, extended) for each attempt still owned: extended, or
#: owned as of the statement's snapshot but skipped; the caller treats the rest as lost.
#:
#: It never waits for a row lock (SKIP LOCKED): a row another transaction is changing
#: (this host's own ack flush, whose order of locking rows differs, or an application's
#: transaction) is skipped, returned not extended, and judged at the next beat. Waiting
#: could deadlock with the ack flush, or hold every other lease up for ``lock_timeout``.
#: The skipped rows are looked up only among the ids not extended (``NOT IN`` a hashed
#: set): usually none.
HEARTBEAT: Final = """
WITH h AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[],
                         array_fill(%(owner)s::text, ARRAY[cardinality(%(ids)s::bigint[])]),
                         %(started)s::bool[])
                  AS h(id, attempt, owner, started)
), free AS (
    SELECT j.id, h.started
    FROM h JOIN pgpool_jobs AS j
         ON j.id = h.id AND j.attempts = h.attempt AND j.locked_by = h.owner
    FOR NO KEY UPDATE OF j SKIP LOCKED
), extended AS (
    UPDATE pgpool_jobs AS j
    SET lease_until = now() + make_interval(secs => %(lease)s),
        started = j.started OR f.started
    FROM free AS f
    WHERE j.id = f.id
    RETURNING j.id, j.attempts
)
SELECT id, attempts, true FROM extended
UNION ALL
SELECT h.id, h.attempt, false FROM h
WHERE h.id NOT IN (SELECT id FROM extended)
  AND EXISTS (SELECT FROM pgpool_jobs AS j
              WHERE j.id = h.id AND j.attempts = h.attempt AND j.locked_by = h.owner)
"""

#: The grouped ack of a flush in which every attempt succeeded, the usual one: `ACK`'s
#: first arm alone (deleting a job, guarded by its attempt and owner), at half `ACK`'s cost
#: to the server. The number of jobs deleted is the cursor's rowcount.
ACK_DONE: Final = """
DELETE FROM pgpool_jobs AS j
USING unnest(%(done_ids)s::bigint[], %(done_attempts)s::int[],
             array_fill(%(owner)s::text, ARRAY[cardinality(%(done_ids)s::bigint[])]))
      AS a(id, attempt, owner)
WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
"""

#: One grouped ack: delete succeeded jobs, reschedule failures (scheduled, or ready when
#: their delay is 0), hand back unstarted jobs, return attempts cut off by this host's
#: shutdown (ready now, not counted: ``interruptions`` + 1) and move exhausted jobs to
#: pgpool_dead. Each arm is guarded by ownership. Returns how many rows each arm changed.
#: A hand-back is ready at once and not counted either (``interruptions`` + 1): it keeps
#: ``attempts``, so the next claim's (owner, attempt) is a new one, which the same
#: hand-back sent again (its first answer lost, its commit not) cannot match.
ACK: Final = """
WITH done AS (
    DELETE FROM pgpool_jobs AS j
    USING unnest(%(done_ids)s::bigint[], %(done_attempts)s::int[],
                 array_fill(%(owner)s::text, ARRAY[cardinality(%(done_ids)s::bigint[])]))
          AS a(id, attempt, owner)
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING j.id
), retried AS (
    UPDATE pgpool_jobs AS j
    SET state = CASE WHEN a.delay > 0 THEN 'scheduled' ELSE 'ready' END,
        locked_by = NULL, lease_until = NULL, last_error = a.error,
        run_at = now() + make_interval(secs => a.delay)
    FROM unnest(%(retry_ids)s::bigint[], %(retry_attempts)s::int[],
                array_fill(%(owner)s::text, ARRAY[cardinality(%(retry_ids)s::bigint[])]),
                %(retry_delays)s::float8[], %(retry_errors)s::text[])
         AS a(id, attempt, owner, delay, error)
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING j.id
), released AS (
    UPDATE pgpool_jobs AS j
    SET state = 'ready', locked_by = NULL, lease_until = NULL,
        interruptions = j.interruptions + 1
    FROM unnest(%(release_ids)s::bigint[], %(release_attempts)s::int[],
                array_fill(%(owner)s::text, ARRAY[cardinality(%(release_ids)s::bigint[])]))
         AS a(id, attempt, owner)
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING j.id
), interrupted AS (
    UPDATE pgpool_jobs AS j
    SET state = 'ready', locked_by = NULL, lease_until = NULL, last_error = a.error,
        run_at = now(), interruptions = j.interruptions + 1
    FROM unnest(%(interrupted_ids)s::bigint[], %(interrupted_attempts)s::int[],
                array_fill(%(owner)s::text, ARRAY[cardinality(%(interrupted_ids)s::bigint[])]),
                %(interrupted_errors)s::text[])
         AS a(id, attempt, owner, error)
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING j.id
), buried AS (
    DELETE FROM pgpool_jobs AS j
    USING unnest(%(dead_ids)s::bigint[], %(dead_attempts)s::int[],
                 array_fill(%(owner)s::text, ARRAY[cardinality(%(dead_ids)s::bigint[])]),
                 %(dead_errors)s::text[])
          AS a(id, attempt, owner, error)
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempts, j.interruptions,
              j.max_attempts, j.unique_key, j.created_at, j.tenant, j.concurrency_key,
              a.error
), dead AS (
    INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, interruptions,
                             max_attempts, unique_key, created_at, tenant, concurrency_key,
                             last_error)
    SELECT id, queue, kind, payload, priority, attempts, interruptions, max_attempts,
           unique_key, created_at, tenant, concurrency_key, error
    FROM buried
    RETURNING id
)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM retried),
       (SELECT count(*) FROM released), (SELECT count(*) FROM interrupted),
       (SELECT count(*) FROM dead)
"""

#: Park attempts whose ack the database refused even alone (`pgpool.isolate`): an
#: application's foreign key or trigger, a lock held too long. ``state`` is 'done' for a
#: job that succeeded but could not be deleted (kept; its unique key is freed, as deleting
#: it would have), 'parked' for any other ack; ``reason`` goes to ``last_error``. The claim
#: takes only 'ready' jobs, so neither runs again until someone changes it. An UPDATE of
#: non-key columns: FOR KEY SHARE holders (foreign key checks) do not block it.
PARK: Final = """
UPDATE pgpool_jobs AS j
SET state = a.state, locked_by = NULL, lease_until = NULL, last_error = a.reason,
    unique_key = CASE WHEN a.state = 'done' THEN NULL ELSE j.unique_key END
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[],
            array_fill(%(owner)s::text, ARRAY[cardinality(%(ids)s::bigint[])]),
            %(states)s::text[], %(reasons)s::text[])
     AS a(id, attempt, owner, state, reason)
WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
RETURNING j.id
"""

#: Return jobs whose lease expired (their dispatcher died or lost the database) to ready,
#: or bury them when that attempt was their last. An attempt that never started in a worker
#: (no heartbeat recorded it) does not count, up to ``max_interruptions`` per job; any other
#: expired attempt counts. A cancelled attempt (running, no owner: `CANCEL`) is over once its
#: lease has expired: it is buried as cancelled, with the cancel's trace, whatever attempts
#: it has left. SKIP LOCKED lets every host run this concurrently without two of
#: them handling one row. ``ids`` is NULL, or the only jobs to consider (`pgpool.reaper`
#: isolating a job it cannot return).
REAP: Final = """
WITH expired AS (
    SELECT id FROM pgpool_jobs
    WHERE state = 'running' AND lease_until < now()
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    ORDER BY id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), judged AS (
    SELECT j.id, j.locked_by, j.locked_by IS NULL AS cancelled,
           NOT j.started AND j.interruptions < %(max_interruptions)s AS uncounted,
           j.attempts - j.interruptions < j.max_attempts AS attempts_left
    FROM pgpool_jobs AS j JOIN expired AS e USING (id)
), revived AS (
    UPDATE pgpool_jobs AS j
    SET state = 'ready', run_at = now(), lease_until = NULL, locked_by = NULL,
        interruptions = j.interruptions + CASE WHEN g.uncounted THEN 1 ELSE 0 END,
        last_error = 'lease expired while '
                     || CASE WHEN g.uncounted THEN 'waiting to start on '
                             ELSE 'running on ' END
                     || coalesce(j.locked_by, '?')
    FROM judged AS g
    WHERE j.id = g.id AND NOT g.cancelled AND (g.uncounted OR g.attempts_left)
    RETURNING j.id
), buried AS (
    DELETE FROM pgpool_jobs AS j
    USING judged AS g
    WHERE j.id = g.id AND (g.cancelled OR NOT (g.uncounted OR g.attempts_left))
    RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempts, j.interruptions,
              j.max_attempts, j.unique_key, j.created_at, j.tenant, j.concurrency_key,
              j.locked_by, j.last_error, g.cancelled
), dead AS (
    INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, interruptions,
                             max_attempts, unique_key, created_at, tenant, concurrency_key,
                             last_error, reason)
    SELECT id, queue, kind, payload, priority, attempts, interruptions, max_attempts,
           unique_key, created_at, tenant, concurrency_key,
           CASE WHEN cancelled THEN last_error
                ELSE 'lease expired while running on ' || locked_by END,
           CASE WHEN cancelled THEN 'cancelled' ELSE 'failed' END
    FROM buried
    RETURNING id
)
SELECT (SELECT count(*) FROM revived), (SELECT count(*) FROM dead)
"""

#: The jobs `REAP` would take next, without locking them: the batch the reaper bisects
#: (`pgpool.isolate`) when REAP fails on one of its rows.
REAP_CANDIDATES: Final = """
SELECT id FROM pgpool_jobs
WHERE state = 'running' AND lease_until < now()
ORDER BY id
LIMIT %(limit)s
"""

#: Park expired jobs the reaper could not return or bury, even alone; ``reason`` says why.
#: Guarded like `REAP`, so a job another host returned meanwhile is left alone.
PARK_EXPIRED: Final = """
UPDATE pgpool_jobs AS j
SET state = 'parked', lease_until = NULL, locked_by = NULL,
    last_error = coalesce('lease expired while running on ' || j.locked_by, j.last_error)
                 || '; ' || a.reason
FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS a(id, reason)
WHERE j.id = a.id AND j.state = 'running' AND j.lease_until < now()
RETURNING j.id
"""

# --- vacuum keeper (pgpool.vacuum): the dead rows claims walk over, removed in time -------

#: Whether this role may vacuum pgpool_jobs: its owner (or a member of the owning role, or
#: a superuser), or, from PostgreSQL 17, a role granted MAINTAIN on it. VACUUM skips a
#: table it may not vacuum with a warning instead of failing, so this is asked first.
CAN_VACUUM: Final = """
SELECT pg_has_role(c.relowner, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END
FROM pg_class AS c WHERE c.oid = 'pgpool_jobs'::regclass
"""

#: pgpool_jobs's dead rows (the server's running estimate, as autovacuum reads it), and
#: whether there are enough to vacuum now: at least ``min_dead``, and at least ``scale``
#: of the live rows.
VACUUM_DUE: Final = """
SELECT n_dead_tup >= greatest(%(min_dead)s, %(scale)s * n_live_tup), n_dead_tup
FROM pg_stat_user_tables WHERE relid = 'pgpool_jobs'::regclass
"""

#: Vacuum pgpool_jobs unless another vacuum (autovacuum's, another host's) has it now.
#: INDEX_CLEANUP ON: the dead index entries are what claims walk over, and the server's
#: default may skip them when the dead rows fill few pages. TRUNCATE OFF: giving back the
#: table's empty tail needs a lock that stops every claim for a moment, and a queue fills
#: those pages again.
VACUUM_JOBS: Final = "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE OFF) pgpool_jobs"
#: On the vacuum's own connection, first: a vacuum cut off part way loses its work.
NO_STATEMENT_TIMEOUT: Final = "SET statement_timeout = 0"

# --- stager (pgpool.stager): scheduled jobs become ready when due ---------------------------

#: Make up to ``limit`` scheduled jobs that are due ready, oldest due first, and wake the
#: hosts of their queues. Reads the scheduled index (run_at) WHERE state = 'scheduled' in
#: order and stops at the batch: its cost follows the jobs due, not the jobs waiting. SKIP
#: LOCKED: every host stages, and two never move one row. Returns how many it made ready,
#: and the seconds until the next scheduled job is due (NULL: none is scheduled), so the
#: stager can sleep until then. ``ids`` is NULL, or the only jobs to consider (the stager
#: isolating a job the database refuses to make ready).
STAGE_DUE: Final = f"""
WITH due AS (
    SELECT id FROM pgpool_jobs
    WHERE state = 'scheduled' AND run_at <= now()
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    ORDER BY run_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), staged AS (
    UPDATE pgpool_jobs AS j SET state = 'ready'
    WHERE j.id = ANY(ARRAY(SELECT id FROM due))  -- a key lookup in any plan: see CLAIM
    RETURNING j.queue
)
SELECT (SELECT count(*) FROM staged),
       (SELECT count(pg_notify({_OUR_CHANNEL}, queue))
        FROM (SELECT DISTINCT queue FROM staged) AS q),
       (SELECT extract(epoch FROM min(run_at) - now())::float8 FROM pgpool_jobs
        WHERE state = 'scheduled' AND run_at > now())
"""

#: The jobs `STAGE_DUE` would take next, without locking them: the batch the stager
#: bisects (`pgpool.isolate`) when STAGE_DUE fails on one of its rows.
STAGE_CANDIDATES: Final = """
SELECT id FROM pgpool_jobs
WHERE state = 'scheduled' AND run_at <= now()
ORDER BY run_at
LIMIT %(limit)s
"""

#: Park due scheduled jobs the database refused to make ready (an application's trigger or
#: constraint); ``reason`` goes to ``last_error``. Returns the ids parked.
PARK_SCHEDULED: Final = """
UPDATE pgpool_jobs AS j
SET state = 'parked', last_error = a.reason
FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS a(id, reason)
WHERE j.id = a.id AND j.state = 'scheduled'
RETURNING j.id
"""

# --- host registry ----------------------------------------------------------------------

#: Register a dispatcher, or record that it is alive. An upsert, so a host whose row was
#: pruned while it was cut off from the database reappears at its next beat; ``started_at``
#: is the first registration's time, kept across both. Runs in the budget transaction
#: (`BUDGET_LOCK`), with the share and demand that beat worked out.
HOST_UPSERT: Final = """
INSERT INTO pgpool_hosts AS h (owner, hostname, pid, procs, queues, kinds, lease,
                               started_at, last_seen, jobs_done, jobs_failed, jobs_claimed,
                               claims_per_sec, max_claims_per_sec, claims_share,
                               claims_demand, claim_p99_ms, batch)
VALUES (%(owner)s, %(hostname)s, %(pid)s, %(procs)s, %(queues)s::text[], %(kinds)s::text[],
        %(lease)s, coalesce(%(started_at)s::timestamptz, now()), now(),
        %(jobs_done)s, %(jobs_failed)s, %(jobs_claimed)s,
        %(claims_per_sec)s, %(max_claims_per_sec)s, %(claims_share)s, %(claims_demand)s,
        %(claim_p99_ms)s, %(batch)s)
ON CONFLICT (owner) DO UPDATE
SET last_seen = now(), jobs_done = excluded.jobs_done, jobs_failed = excluded.jobs_failed,
    jobs_claimed = excluded.jobs_claimed, claims_per_sec = excluded.claims_per_sec,
    max_claims_per_sec = excluded.max_claims_per_sec, claims_share = excluded.claims_share,
    claims_demand = excluded.claims_demand, claim_p99_ms = excluded.claim_p99_ms,
    batch = excluded.batch
RETURNING h.started_at
"""

# --- the fleet's claim budget (pgpool.budget) ------------------------------------------------

#: Serialises the hosts' budget beats, so that no two hosts grow into the same free share.
#: Keyed on the installation's pgpool_fleet table: installations in other schemas of the
#: database never wait on each other. An advisory lock, so it needs no write privilege.
BUDGET_LOCK: Final = """
SELECT pg_advisory_xact_lock(hashtextextended('pgpool.budget:' || 'pgpool_fleet'::regclass::oid,
                                              0))
"""

#: How long the rest of this transaction waits for a lock (``ms``: milliseconds, as text).
#: A set_config, not SET LOCAL: SET takes no parameters.
LOCK_TIMEOUT: Final = "SELECT set_config('lock_timeout', %(ms)s, true)"

#: The fleet's budget, NULL when `FLEET_SET` set none (each host then uses its own).
FLEET_BUDGET: Final = "SELECT max_claims_per_sec FROM pgpool_fleet"

#: The other hosts the budget is shared with: those beaten within ``counted_leases`` of
#: their own lease (about two beats; a crashed host stops counting after that, long
#: before it is pruned). NULLs come from rows of a pgpool older than schema version 4.
BUDGET_PEERS: Final = """
SELECT claims_demand, claims_share FROM pgpool_hosts
WHERE owner <> %(owner)s
  AND last_seen >= now() - make_interval(secs => %(counted_leases)s * lease)
"""

#: Set the fleet's budget (``pgpool budget set``), or clear it with NULL. An upsert, so a
#: deleted row comes back. The hosts read it at their next beat.
FLEET_SET: Final = """
INSERT INTO pgpool_fleet AS f (singleton, max_claims_per_sec, updated_at)
VALUES (true, %(max_claims_per_sec)s, now())
ON CONFLICT (singleton) DO UPDATE
SET max_claims_per_sec = excluded.max_claims_per_sec, updated_at = now()
"""

#: The fleet's budget and when it was last set (no row: never set).
FLEET_SHOW: Final = "SELECT max_claims_per_sec, updated_at FROM pgpool_fleet"

#: A clean exit: remove this dispatcher's own row.
HOST_DELETE: Final = "DELETE FROM pgpool_hosts WHERE owner = %(owner)s"

#: Remove hosts not seen for ``stale_leases`` of their own leases. SKIP LOCKED: every host
#: prunes, and a row being beaten right now is alive anyway. Their jobs are the reaper's.
HOST_PRUNE: Final = """
DELETE FROM pgpool_hosts
WHERE owner IN (
    SELECT owner FROM pgpool_hosts
    WHERE last_seen < now() - make_interval(secs => %(stale_leases)s * lease)
    FOR UPDATE SKIP LOCKED
)
RETURNING owner
"""

#: Whether a live host serves ``queue`` and has a handler for ``kind`` (`pgpool enqueue`'s
#: notice that a job will wait); live as in `STATUS_HOSTS`.
KIND_SERVED: Final = """
SELECT EXISTS (
    SELECT FROM pgpool_hosts
    WHERE %(queue)s = ANY(queues) AND %(kind)s = ANY(kinds)
      AND last_seen >= now() - make_interval(secs => %(stale_leases)s * lease)
)
"""

# --- periodic jobs (pgpool.schedules) ----------------------------------------------------------

#: A dispatcher's schedules, declared (or declared again) every beat interval: the definition
#: for `pgpool status`, and who declared it until when. A new row starts at ``now()``: its
#: first tick is the first after it was first declared. ``last_tick`` is never touched here.
PERIODIC_DECLARE: Final = """
INSERT INTO pgpool_schedules AS s (name, cron, timezone, kind, queue, catch_up, last_tick,
                                   declared_by, declared_until)
SELECT d.name, d.cron, d.timezone, d.kind, d.queue, d.catch_up, now(), %(owner)s,
       now() + make_interval(secs => %(seconds)s)
FROM unnest(%(names)s::text[], %(crons)s::text[], %(zones)s::text[], %(kinds)s::text[],
            %(queues)s::text[], %(catch_ups)s::int[])
     AS d(name, cron, timezone, kind, queue, catch_up)
ORDER BY d.name
ON CONFLICT (name) DO UPDATE
SET cron = excluded.cron, timezone = excluded.timezone, kind = excluded.kind,
    queue = excluded.queue, catch_up = excluded.catch_up,
    declared_by = excluded.declared_by, declared_until = excluded.declared_until
"""

#: The schedules' last handled tick and the database's clock (every host computes ticks from
#: this one clock); ``other`` is the owner of another live host when it declared the row
#: last, with its definition, to spot hosts running different code.
PERIODIC_STATE: Final = """
SELECT name, last_tick,
       CASE WHEN declared_by <> %(owner)s AND declared_until > now() THEN declared_by END,
       ARRAY[cron, timezone, kind, queue], now()
FROM pgpool_schedules WHERE name = ANY(%(names)s::text[]) ORDER BY name
"""

#: First statement of a host's transaction that enqueues a schedule's ticks: lock its row, or
#: get nothing while another host's transaction holds it (enqueueing the same ticks, or
#: declaring), instead of waiting on the lock; it looks again shortly.
PERIODIC_LOCK: Final = """
SELECT last_tick FROM pgpool_schedules WHERE name = %(name)s FOR NO KEY UPDATE SKIP LOCKED
"""

#: The exactly-once guarantee: in the transaction that enqueues the ticks, compare-and-set
#: ``last_tick`` from the value this host read to the latest due tick. Ticks move it only
#: forward, and each tick is enqueued only by the transaction that moved it past that tick.
PERIODIC_ADVANCE: Final = """
UPDATE pgpool_schedules
SET last_tick = %(tick)s, last_run = %(tick)s, last_run_at = now()
WHERE name = %(name)s AND last_tick = %(seen)s AND %(tick)s > last_tick
RETURNING name
"""

# --- status ---------------------------------------------------------------------------------

#: First statement of the status transaction: one consistent, read-only snapshot.
STATUS_SNAPSHOT: Final = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

#: Every registered host; ``live`` is false once it is stale (pruned at the next pass);
#: ``counted`` as in `BUDGET_PEERS`: whether the others still leave it its share.
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

#: Per queue: jobs by state, and the age of the oldest job due now (the lag, seconds;
#: NULL when none is). Shared by `STATUS_QUEUES` and `METRICS_QUEUES`. Due is by
#: ``run_at``, not by state: a scheduled job the stager has not made ready yet is due, and
#: lags.
_JOBS_PER_QUEUE: Final = """
    SELECT queue,
           count(*) FILTER (WHERE state IN ('ready', 'scheduled') AND run_at <= now()) AS ready,
           count(*) FILTER (WHERE state IN ('ready', 'scheduled') AND run_at > now())
               AS scheduled,
           count(*) FILTER (WHERE state = 'running')                   AS running,
           count(*) FILTER (WHERE state = 'parked')                    AS parked,
           count(*) FILTER (WHERE state = 'done')                      AS done,
           extract(epoch FROM now() - min(run_at) FILTER (
               WHERE state IN ('ready', 'scheduled') AND run_at <= now()))::float8 AS lag
    FROM pgpool_jobs
    GROUP BY queue
"""

#: Per queue: due now, due later, claimed, dead-lettered, parked (see `PARK`) and kept
#: done; the age of the oldest job due now (the lag, seconds; NULL when none is); dead
#: letters added in the last 24 hours; and, from the live hosts serving it, their claims per
#: second together and the worst of their claim p99s (ms). Lists every queue that has jobs,
#: dead letters or a registered host serving it.
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
       coalesce(dead_24h, 0), claims_per_sec, claim_p99_ms
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

# --- metrics (pgpool.metrics: the queue's figures, served by one host at a time) ------------

#: Become the host that serves the queue metrics, if none is: a session-level lock, held
#: for as long as the scrape connection lives. Keyed like `BUDGET_LOCK`, on the
#: installation's own table (found through search_path, wherever it is on it), so
#: installations in other schemas have reporters of their own.
METRICS_TAKE_REPORTER: Final = """
SELECT pg_try_advisory_lock(hashtextextended('pgpool.queue-metrics:'
                                             || 'pgpool_jobs'::regclass::oid, 0))
"""

#: Per queue: due now, due later, claimed, parked, kept as done, the age of the oldest job
#: due now (seconds; NULL when none is), dead-lettered, and whether it is paused.
METRICS_QUEUES: Final = """
WITH jobs AS (""" + _JOBS_PER_QUEUE + """), dead AS (
    SELECT queue, count(*) AS dead FROM pgpool_dead GROUP BY queue
), paused AS (
    SELECT queue, true AS paused FROM pgpool_paused
)
SELECT queue, coalesce(ready, 0), coalesce(scheduled, 0), coalesce(running, 0),
       coalesce(parked, 0), coalesce(done, 0), lag, coalesce(dead, 0),
       coalesce(paused, false)
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

# --- grants (pgpool.grants) -----------------------------------------------------------------

#: Templates for psycopg.sql: ``{tables}`` are schema-qualified, ``{role}`` an identifier,
#: ``{privileges}`` one of pgpool.grants' fixed lists.
REVOKE_TABLES: Final = "REVOKE ALL ON {tables} FROM {role}"
GRANT_SCHEMA: Final = "GRANT USAGE ON SCHEMA {schema} TO {role}"
GRANT_TABLES: Final = "GRANT {privileges} ON {tables} TO {role}"

#: The schema pgpool_jobs resolves to through the connection's search_path (NULL: none),
#: and whether this role may grant on it: its owner, a member of the owner's role or a
#: superuser. (GRANT and REVOKE from anyone else only warn that nothing was granted.)
INSTALLED_SCHEMA: Final = """
SELECT n.nspname, pg_has_role(c.relowner, 'USAGE')
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass('pgpool_jobs')
"""

# --- schema bookkeeping ---------------------------------------------------------------------

#: Every schema of the database holding tables named ``pgpool_*``: its name, its place on
#: the session's effective ``search_path`` (1-based; NULL when not on it) and those tables.
#: pgpool is installed where ``pgpool_schema_version`` is (`pgpool.schema.locate`). Views
#: and foreign tables count: an unqualified name would resolve to them just the same.
INSTALLATIONS: Final = r"""
SELECT n.nspname::text, p.pos::int, array_agg(c.relname::text ORDER BY c.relname)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN unnest(current_schemas(false)) WITH ORDINALITY AS p(name, pos) ON p.name = n.nspname
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relname LIKE 'pgpool\_%'
GROUP BY n.nspname, p.pos
ORDER BY p.pos NULLS LAST, n.nspname
"""

#: Where a new installation goes: the first existing schema on ``search_path``.
CURRENT_SCHEMA: Final = "SELECT current_schema()"

#: The migration transaction's session settings, to restore them at its end: SET LOCAL in a
#: savepoint (`migrate` inside the caller's transaction) would outlive the savepoint.
MIGRATE_SAVED: Final = "SELECT current_setting('search_path'), current_setting('lock_timeout')"
#: For the migration's transaction only (``is_local``): run the DDL in the installation's
#: schema, whatever schema the session's ``search_path`` would create tables in.
MIGRATE_SEARCH_PATH: Final = "SELECT set_config('search_path', %(search_path)s, true)"
#: One migration at a time per schema; installations in different schemas never wait on
#: each other. Taken before `MIGRATE_LOCK_TIMEOUT`: waiting here blocks nobody else.
MIGRATE_LOCK: Final = (
    "SELECT pg_advisory_xact_lock(hashtext('pgpool.migrate:' || current_schema()))"
)
#: A DDL waiting for ACCESS EXCLUSIVE makes every later statement on that table (claims,
#: heartbeats, acks) queue behind it: give up after this long, and retry later.
MIGRATE_LOCK_TIMEOUT: Final = "SELECT set_config('lock_timeout', %(lock_timeout)s, true)"
#: Put back what `MIGRATE_SAVED` read, at the end of the migration's transaction.
MIGRATE_RESTORE: Final = """
SELECT set_config('search_path', %(search_path)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true)
"""
#: Record one applied migration.
MIGRATE_RECORD: Final = (
    "INSERT INTO pgpool_schema_version (version, description) VALUES (%s, %s)"
)
#: Sessions holding locks on pgpool's tables in schema ``schema``: named when `migrate`
#: gives up, so the operator knows which to end.
LOCK_HOLDERS: Final = r"""
SELECT DISTINCT l.pid FROM pg_locks AS l
JOIN pg_class AS c ON c.oid = l.relation
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE l.granted AND l.pid <> pg_backend_pid() AND n.nspname = %(schema)s
  AND c.relname LIKE 'pgpool\_%%'
ORDER BY 1
"""

SCHEMA_VERSION: Final = "SELECT coalesce(max(version), 0) FROM pgpool_schema_version"

# --- operators: inspect, repair and steer (pgpool.ops) ----------------------------------------

#: The payload of the notification that tells every host to re-read `CONTROL_POLL` now (a
#: queue was paused or resumed, a job cancelled). No queue name starts with "!".
CONTROL: Final = "!control"
NOTIFY_CONTROL: Final = f"SELECT pg_notify({_OUR_CHANNEL}, '{CONTROL}')"

#: What a host polls (and re-reads on a `CONTROL` notification): the paused queues, and a
#: digest of the cancelled attempts still in flight (running rows with no owner, `CANCEL`),
#: whose change makes the host check its jobs at once. A set, not a high-water mark: a
#: cancel shows in it as soon as it commits, whatever order cancels commit in. (The latest
#: ``died_at`` missed a cancel made in a transaction that started before an earlier-committed
#: one: now() is the transaction's start; a sequence would miss it the same way, nextval
#: order is not commit order.) The set is read on the running index (``locked_by IS
#: NULL``), and holds only cancels whose lease has not run out yet.
CONTROL_POLL: Final = """
SELECT ARRAY(SELECT queue FROM pgpool_paused ORDER BY queue),
       (SELECT md5(string_agg(id::text, ',' ORDER BY id)) FROM pgpool_jobs
        WHERE state = 'running' AND locked_by IS NULL)
"""

# The summary line of a stored error: its last non-blank line, which for a handler's
# exception is "ExceptionType: message" (the traceback's first line says nothing).
_ERROR_LINE = r"substring(rtrim(coalesce(last_error, ''), E' \n\r\t') from '[^\n]*$')"

#: A dead job's error signature, by which ``pgpool dead list --group`` counts: the error's
#: summary line with every hex word (0x1f, ab12cd) and then every run of digits made "#",
#: at most 200 characters. Jobs that failed the same way share it though the ids, counts,
#: pids or addresses in their messages differ.
SIGNATURE: Final = (
    r"left(regexp_replace(regexp_replace(" + _ERROR_LINE
    + r", '0[xX][0-9a-fA-F]+|\m[0-9a-fA-F]*[0-9][0-9a-fA-F]*\M', '#', 'g'),"
    r" '[0-9]+', '#', 'g'), 200)"
)

# A job's state as operators see it: ready (due), scheduled (due later: delayed or waiting
# out a retry's backoff), running, or parked / done (its ack or reap was refused: see
# `PARK`). Due is by ``run_at``: a scheduled job the stager has not staged yet is ready, a
# ready row an older pgpool wrote with a future time is scheduled.
_JOB_STATE = ("CASE WHEN state IN ('running', 'parked', 'done') THEN state "
              "WHEN run_at > now() THEN 'scheduled' ELSE 'ready' END")

# The columns `pgpool.ops` reads of a live job, in `ops.Job` order.
_JOB_COLUMNS = f"""
    id, kind, queue, {_JOB_STATE} AS op_state, attempts, max_attempts, priority, run_at,
    extract(epoch FROM lease_until - now())::float8, locked_by, nullif({_ERROR_LINE}, ''),
    created_at,
    CASE WHEN %(full)s THEN last_error END, CASE WHEN %(payload)s THEN payload END
"""

#: Live jobs, filtered (a NULL filter matches all), oldest first; one more than ``limit``,
#: so the caller can say that more are left. ``after_*`` is a keyset cursor on (run_at, id),
#: the listing's order, for the next page (the dashboard's).
JOBS_LIST: Final = f"""
SELECT {_JOB_COLUMNS} FROM pgpool_jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(state)s::text IS NULL OR {_JOB_STATE} = %(state)s)
  AND (%(older_than)s::float8 IS NULL
       OR created_at < now() - make_interval(secs => %(older_than)s))
  AND (%(after_run_at)s::timestamptz IS NULL
       OR (run_at, id) > (%(after_run_at)s::timestamptz, %(after_id)s::bigint))
ORDER BY run_at, id
LIMIT %(limit)s + 1
"""

#: Live jobs by id.
JOBS_BY_ID: Final = f"SELECT {_JOB_COLUMNS} FROM pgpool_jobs WHERE id = ANY(%(ids)s::bigint[])"

# The filter every dead-job statement shares (a NULL parameter matches all); ``after_*``
# is a keyset cursor on (died_at, id), the order replays and purges go in.
_DEAD_FILTER = f"""
    (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    AND (%(kind)s::text IS NULL OR kind = %(kind)s)
    AND (%(error)s::text IS NULL OR strpos(coalesce(last_error, ''), %(error)s) > 0)
    AND (%(signature)s::text IS NULL OR {SIGNATURE} = %(signature)s)
    AND (%(reason)s::text IS NULL OR reason = %(reason)s)
    AND (%(since)s::float8 IS NULL OR died_at >= now() - make_interval(secs => %(since)s))
    AND (%(older_than)s::float8 IS NULL
         OR died_at < now() - make_interval(secs => %(older_than)s))
    AND (%(after_died)s::timestamptz IS NULL
         OR (died_at, id) > (%(after_died)s::timestamptz, %(after_id)s::bigint))
"""

# The columns `pgpool.ops` reads of a dead job, in `ops.DeadJob` order.
_DEAD_COLUMNS = f"""
    id, kind, queue, reason, attempts, max_attempts, priority, died_at, created_at,
    {SIGNATURE}, nullif({_ERROR_LINE}, ''), CASE WHEN %(full)s THEN last_error END,
    CASE WHEN %(payload)s THEN payload END
"""

#: Dead jobs, newest first; one more than ``limit`` (see `JOBS_LIST`).
DEAD_LIST: Final = f"""
SELECT {_DEAD_COLUMNS} FROM pgpool_dead
WHERE {_DEAD_FILTER}
ORDER BY died_at DESC, id DESC
LIMIT %(limit)s + 1
"""

#: Dead jobs counted by (kind, error signature), the largest group first: the triage view.
DEAD_GROUPS: Final = f"""
SELECT kind, {SIGNATURE} AS signature, count(*), min(died_at), max(died_at), min(id)
FROM pgpool_dead
WHERE {_DEAD_FILTER}
GROUP BY 1, 2
ORDER BY 3 DESC, 1, 2
LIMIT %(limit)s + 1
"""

#: How many dead jobs match (a dry run of a replay or purge), at most ``limit``.
DEAD_COUNT: Final = f"""
SELECT count(*) FROM (SELECT FROM pgpool_dead WHERE {_DEAD_FILTER} LIMIT %(limit)s) AS d
"""

#: Which of these ids are dead jobs (to explain why a live-job command did not find them).
DEAD_IDS: Final = "SELECT id FROM pgpool_dead WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id"

#: Move up to ``limit`` matching dead jobs back to ready, oldest death first: same id,
#: attempts from 0, due now; the last error is kept for reference. One whose unique key a
#: live job holds stays dead (ON CONFLICT). SKIP LOCKED: two replays never move one job
#: twice. Wakes the hosts of each queue. Returns how many were picked and moved, and the
#: (died_at, id) cursor of the last picked, from which the next batch goes on.
REPLAY_DEAD: Final = f"""
WITH picked AS (
    SELECT id, died_at FROM pgpool_dead
    WHERE {_DEAD_FILTER}
    ORDER BY died_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), revived AS (
    INSERT INTO pgpool_jobs (id, queue, kind, payload, priority, max_attempts, unique_key,
                             last_error, created_at, tenant, concurrency_key)
    OVERRIDING SYSTEM VALUE
    SELECT d.id, d.queue, d.kind, d.payload, d.priority, d.max_attempts, d.unique_key,
           d.last_error, d.created_at, d.tenant, d.concurrency_key
    FROM pgpool_dead AS d JOIN picked USING (id)
    ON CONFLICT DO NOTHING
    RETURNING id, queue
), gone AS (
    DELETE FROM pgpool_dead AS d USING revived WHERE d.id = revived.id RETURNING d.id
), last AS (
    SELECT died_at, id FROM picked ORDER BY died_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM picked), (SELECT count(*) FROM gone),
       (SELECT died_at FROM last), (SELECT id FROM last),
       (SELECT count(pg_notify({_OUR_CHANNEL}, queue))
        FROM (SELECT DISTINCT queue FROM revived) AS q)
"""

#: Delete up to ``limit`` matching dead jobs, oldest death first (a purge's or the
#: retention's batch): bounded, so no delete holds many locks or leaves a vacuum storm.
#: No FOR UPDATE: it needs UPDATE on the table, which the worker role (which prunes) does
#: not have. A row another purge deletes first is waited for, then skipped.
PURGE_DEAD: Final = f"""
WITH doomed AS (
    SELECT id FROM pgpool_dead
    WHERE {_DEAD_FILTER}
    ORDER BY died_at, id
    LIMIT %(limit)s
), gone AS (
    DELETE FROM pgpool_dead AS d USING doomed WHERE d.id = doomed.id RETURNING d.id
)
SELECT count(*) FROM gone
"""

#: Taken by the retention pass, per schema: of all live hosts, the one that gets it prunes,
#: the others skip this pass. Held until that batch's transaction ends.
RETENTION_LOCK: Final = (
    "SELECT pg_try_advisory_xact_lock(hashtext('pgpool.retention:' || current_schema()))"
)

#: Lock live jobs by id and say what each is doing and who runs it (NULL for a running job:
#: cancelled already), before a cancel changes any. FOR UPDATE: the cancel may delete them.
CANCEL_LOCK: Final = f"""
SELECT id, {_JOB_STATE}, locked_by FROM pgpool_jobs WHERE id = ANY(%(ids)s::bigint[])
ORDER BY id
FOR UPDATE
"""

_CANCELLED_AT = ("'cancelled by operator at ' "
                 """|| to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS"Z"')""")

#: Cancel live jobs (`CANCEL_LOCK` first; never a job kept as done): a waiting one moves to
#: pgpool_dead with reason 'cancelled' and a last_error that says when and what it was
#: doing. A running one loses its owner at once but keeps its row, state running, until its
#: lease ends: its attempt may run until then (its host stops it at its next heartbeat, sent
#: at once after `NOTIFY_CONTROL`, but a frozen host's worker runs on until its lease
#: fence), so the unique indexes on its keys still hold. Its heartbeat and ack match no
#: row (they need the owner), and when the lease has expired, `REAP` buries it as
#: cancelled. Returns how many were dead-lettered and how many stopped.
CANCEL: Final = f"""
WITH gone AS (
    DELETE FROM pgpool_jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('ready', 'scheduled', 'parked')
    RETURNING id, queue, kind, payload, priority, attempts, max_attempts, unique_key,
              created_at, tenant, concurrency_key, {_JOB_STATE} AS op_state
), dead AS (
    INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, max_attempts,
                             unique_key, created_at, tenant, concurrency_key, reason,
                             last_error)
    SELECT id, queue, kind, payload, priority, attempts, max_attempts, unique_key,
           created_at, tenant, concurrency_key, 'cancelled',
           {_CANCELLED_AT} || ' while ' || op_state
    FROM gone
    RETURNING id
), stopped AS (
    UPDATE pgpool_jobs
    SET locked_by = NULL,
        last_error = {_CANCELLED_AT} || ' while running attempt ' || attempts || ' on '
                     || locked_by
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running' AND locked_by IS NOT NULL
    RETURNING id
)
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM stopped)
"""

#: Lock live jobs by id and say what each is doing (a retry's first step).
JOBS_LOCK: Final = f"""
SELECT id, {_JOB_STATE} FROM pgpool_jobs WHERE id = ANY(%(ids)s::bigint[])
ORDER BY id
FOR NO KEY UPDATE
"""

#: Make scheduled jobs (delayed, or waiting out a retry's backoff) and parked jobs ready and
#: due now, and wake their queues' hosts. Returns the ids changed.
RETRY_NOW: Final = f"""
WITH due AS (
    UPDATE pgpool_jobs SET state = 'ready', run_at = now()
    WHERE id = ANY(%(ids)s::bigint[])
      AND (state IN ('parked', 'scheduled') OR (state = 'ready' AND run_at > now()))
    RETURNING id, queue
)
SELECT id, (SELECT count(pg_notify({_OUR_CHANNEL}, queue))
            FROM (SELECT DISTINCT queue FROM due) AS q)
FROM due ORDER BY id
"""

#: Whether any job, dead job, registered host or pause names this queue. The cheap tests
#: first (the ready index, the small tables): only a name none of them knows scans the rest.
QUEUE_KNOWN: Final = """
SELECT EXISTS (SELECT FROM pgpool_jobs WHERE queue = %(queue)s AND state = 'ready')
    OR EXISTS (SELECT FROM pgpool_hosts WHERE %(queue)s = ANY(queues))
    OR EXISTS (SELECT FROM pgpool_paused WHERE queue = %(queue)s)
    OR EXISTS (SELECT FROM pgpool_jobs WHERE queue = %(queue)s)
    OR EXISTS (SELECT FROM pgpool_dead WHERE queue = %(queue)s)
"""

#: Pause a queue; returns a row only if it was not paused already.
PAUSE: Final = """
INSERT INTO pgpool_paused (queue) VALUES (%(queue)s) ON CONFLICT DO NOTHING RETURNING queue
"""

#: Resume a queue; returns a row only if it was paused. Wakes its hosts.
RESUME: Final = f"""
WITH gone AS (DELETE FROM pgpool_paused WHERE queue = %(queue)s RETURNING queue)
SELECT queue, pg_notify({_OUR_CHANNEL}, queue) FROM gone
"""

#: The paused queues and since when.
PAUSED: Final = "SELECT queue, paused_at FROM pgpool_paused ORDER BY queue"
