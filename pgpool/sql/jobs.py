"""The job protocol: enqueue, claim, heartbeat, ack, reap and stage, and the vacuum keeper
that keeps claims from walking over dead rows.

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
attempt's ownership at once: `pgpool.sql.ops.CANCEL`). Nothing then narrows ``pgpool_jobs``
before the join, and the plan is one primary-key lookup per id (or one hash join).

Lists of ids and attempts go out as array literals built by `pgpool.sql.common.int_array`:
psycopg would adapt a Python list element by element, about 1.7 µs each, most of an ack
flush's cost.
"""

from __future__ import annotations

from typing import Final

from .common import (
    CHANNEL_OF,
    COUNT_MEMBERS,
    NOTIFY_CALLED,
    OUR_CHANNEL,
    STAGE,
    notify_finished,
)

# --- enqueue ------------------------------------------------------------------------------

#: Opens the caller's transaction (psycopg begins one lazily), so that pgpool's own
#: ``conn.transaction()`` inside it is a savepoint, not a transaction of its own.
OPEN_TRANSACTION: Final = "SELECT 1"

#: One job: ``ready`` when due now, else ``scheduled`` (the stager makes it ready when it is
#: due), so the claim's index holds only due jobs. Notifies the job's queue when it is ready,
#: the stagers (`common.STAGE`) when it is scheduled. The channel is that of the table the row went
#: into (``tableoid``), at no extra round trip. With a unique key that a live job already
#: holds, no row is inserted and no row returns. The SQL function ``pgpool_enqueue``
#: (migration 16) does the same: keep the two in step (tests/db/test_sql_enqueue.py
#: compares).
ENQUEUE: Final = """
WITH due AS (
    SELECT coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s))
           AS run_at
), job AS (
    INSERT INTO pgpool_jobs (queue, kind, payload, priority, run_at, state, max_attempts,
                             unique_key, tenant, concurrency_key, meta)
    SELECT %(queue)s, %(kind)s, %(payload)s, %(priority)s, run_at,
           CASE WHEN run_at <= now() THEN 'ready' ELSE 'scheduled' END,
           %(max_attempts)s, %(unique_key)s, %(tenant)s, %(concurrency_key)s, %(meta)s
    FROM due
    ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING id, state, tableoid
)
SELECT id, pg_notify(""" + CHANNEL_OF.format(table="job.tableoid") + """,
                     CASE WHEN state = 'ready' THEN %(queue)s ELSE '""" + STAGE + """' END)
FROM job
"""

#: One job through the SQL function ``pgpool_enqueue``, for drivers other than psycopg 3
#: (`pgpool.enqueue.function_params`): plain parameters, each cast, so that drivers which
#: send them untyped (psycopg2) or type them from the statement (asyncpg) agree.
_FUNCTION_OPTIONS: Final = """
    queue => CAST(%(queue)s AS text), priority => CAST(%(priority)s AS integer),
    run_at => CAST(%(run_at)s AS timestamptz),
    delay => make_interval(secs => CAST(%(delay)s AS double precision)),
    unique_key => CAST(%(unique_key)s AS text),
    max_attempts => CAST(%(max_attempts)s AS integer), tenant => CAST(%(tenant)s AS text),
    concurrency_key => CAST(%(concurrency_key)s AS text)"""
#: The payload limit the SQL functions apply (the setting ``pgpool.max_payload_bytes``, for
#: the transaction) made this process's (`pgpool.enqueue.max_payload_bytes`), so that a
#: payload `pgpool.enqueue` would take is taken: a FROM clause, evaluated before the select
#: list that calls the function (a subquery with a volatile function is not flattened).
_PAYLOAD_LIMIT: Final = """
FROM (SELECT set_config('pgpool.max_payload_bytes', CAST(%(max_payload_bytes)s AS text), true)
     ) AS payload_limit"""
ENQUEUE_BY_FUNCTION: Final = """
SELECT pgpool_enqueue(CAST(%(kind)s AS text), CAST(%(payload)s AS jsonb),""" + \
    _FUNCTION_OPTIONS + ")" + _PAYLOAD_LIMIT

#: A group (`pgpool.groups`), through the SQL function ``pgpool_enqueue_group`` (migration
#: 18): its callback, waiting (or ready at once for a group of no members), whose id is the
#: group's; its members, the payloads one JSON array, each with that ``group_id``; and the
#: group's row. All or none, in the caller's transaction (or an ack's: a handler's
#: follow-up group); the function wakes the hosts. It runs as the tables' owner, so that a
#: producer needs no right to write ``group_id`` or ``pgpool_groups``; it checks the
#: payloads as ``pgpool_enqueue`` does (`_PAYLOAD_LIMIT`). Returns the group's id. Each
#: parameter is cast, so that drivers which send them untyped (psycopg2) or type
#: them from the statement (asyncpg) agree.
ENQUEUE_GROUP: Final = """
SELECT pgpool_enqueue_group(
    CAST(%(kind)s AS text), CAST(%(payloads)s AS jsonb), CAST(%(queue)s AS text),
    CAST(%(priority)s AS integer), CAST(%(run_at)s AS timestamptz),
    CAST(%(max_attempts)s AS integer), CAST(%(tenant)s AS text),
    CAST(%(concurrency_key)s AS text),
    CAST(%(then_kind)s AS text), CAST(%(then_payload)s AS jsonb), CAST(%(then_queue)s AS text),
    CAST(%(then_priority)s AS integer), CAST(%(then_max_attempts)s AS integer),
    CAST(%(then_tenant)s AS text), CAST(%(then_concurrency_key)s AS text))""" + _PAYLOAD_LIMIT

#: Many jobs of one kind, the payloads one JSON array, for drivers other than psycopg 3
#: (`pgpool.enqueue.array_params`): the rows `COPY_JOBS` or `COPY_JOBS_AT` would insert,
#: and the wake-up `NOTIFY` or `NOTIFY_STAGE` would send (their queue's hosts, or the
#: stagers for jobs scheduled for later), in one statement; how many went in. Each
#: parameter is cast, as in `ENQUEUE_GROUP`. As with COPY, the checks are made in Python
#: before: calling ``pgpool_enqueue`` once per payload instead ran about 7 times slower.
ENQUEUE_ARRAY: Final = """
WITH job AS (
    INSERT INTO pgpool_jobs (queue, kind, payload, priority, run_at, state, max_attempts,
                             tenant, concurrency_key)
    SELECT CAST(%(queue)s AS text), CAST(%(kind)s AS text), payload,
           CAST(%(priority)s AS integer), coalesce(CAST(%(run_at)s AS timestamptz), now()),
           CASE WHEN CAST(%(run_at)s AS timestamptz) IS NULL THEN 'ready'
                ELSE 'scheduled' END,
           CAST(%(max_attempts)s AS integer), CAST(%(tenant)s AS text),
           CAST(%(concurrency_key)s AS text)
    FROM jsonb_array_elements(CAST(%(payloads)s AS jsonb)) AS payload
    RETURNING 1
), inserted AS (
    SELECT count(*) AS n FROM job
)
SELECT n, CASE WHEN n > 0 THEN pg_notify(""" + OUR_CHANNEL + """,
                                         CASE WHEN CAST(%(run_at)s AS timestamptz) IS NULL
                                              THEN CAST(%(queue)s AS text)
                                              ELSE '""" + STAGE + """' END) END
FROM inserted
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
#: `COPY_JOBS` and `COPY_JOBS_AT` for jobs that carry a trace context: each row ends with
#: its ``meta`` (`pgpool.tracing`). Untraced jobs do without: their ``meta`` is NULL.
COPY_JOBS_META: Final = (
    "COPY pgpool_jobs (queue, kind, payload, priority, max_attempts, tenant, concurrency_key, "
    "meta) FROM STDIN"
)
COPY_JOBS_AT_META: Final = (
    "COPY pgpool_jobs (queue, kind, payload, priority, max_attempts, tenant, concurrency_key, "
    "run_at, state, meta) FROM STDIN"
)

#: After a COPY: wake the dispatchers of the installation the rows went to.
NOTIFY: Final = "SELECT pg_notify(" + OUR_CHANNEL + ", %(queue)s)"
#: After a COPY of scheduled rows: wake the installation's stagers.
NOTIFY_STAGE: Final = "SELECT pg_notify(" + OUR_CHANNEL + ", '" + STAGE + "')"
#: Wake the hosts of each of ``payloads`` (queues, or `STAGE`): a host handed jobs back,
#: or scheduled retries that the leader's stager must know of.
NOTIFY_MANY: Final = ("SELECT count(pg_notify(" + OUR_CHANNEL + ", p)) "
                      "FROM unnest(%(payloads)s::text[]) AS p")

# --- dispatcher: claim, heartbeat, ack, reap ----------------------------------------------

#: Once per pooled connection of a dispatcher (`pgpool.host.claimer.configure_connection`): how
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

#: Once per pooled connection of a dispatcher (`pgpool.host.claimer.configure_connection`): its
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

#: Once per connection of a dispatcher's claim pool (`pgpool.host.claimer.configure_connection`):
#: the prepared claims are planned once, not at every claim. PostgreSQL keeps re-planning
#: them otherwise (its estimate of a generic plan, which cannot know ``limit``, stays above
#: the custom plans'), and planning the plain claim took 0.7 ms of the 2.7 it cost the
#: server. Both claims' generic plans are tested to read what their custom plans read
#: (tests/db/test_routing.py, tests/db/test_plain_claim.py).
GENERIC_PLANS: Final = "SET plan_cache_mode = force_generic_plan"

#: Once per connection of a dispatcher's claim pool, with `GENERIC_PLANS`: no sequential
#: scan and no bitmap scan where a plain index scan can do. A generic plan is made once,
#: from the statistics of that moment, and kept until they change. Made while the table
#: held next to nothing (a host that started on an idle queue), every claim read the whole
#: table when a burst came: 20,002 rows through a Seq Scan for a claim of 1,000, until
#: autovacuum analyzed the table or the vacuum keeper vacuumed it; with sequential scans
#: off, the fair claim read them all through a Bitmap Index Scan instead when the table's
#: pages had held more rows before. Every claim reads in index order, as far as its LIMIT
#: takes it; a statement with no index path still reads its table as before.
INDEX_SCANS: Final = "SET enable_seqscan = off; SET enable_bitmapscan = off"

#: Tenants that give nothing now (at --tenant-cap, or their first job waiting on a running
#: concurrency key) that `CLAIM`'s walk goes past in each (queue, kind) pair, beyond the
#: ``limit`` that can give a job: a bound on what one claim reads. Each costs about three
#: index descents (finding it, probing its key, the scan of its jobs that finds nothing),
#: more with a backlog of jobs waiting on its key (docs/concepts/claim.md).
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

#: A claimed job's run_at as the claims return it: microseconds since the epoch, which the
#: claimer loads at a seventh of a timestamp's cost, compares, and sends back as a cursor
#: (exact: extract returns numeric from PostgreSQL 14 on). Format with ``table``.
_RUN_AT_US: Final = "(extract(epoch FROM {table}.run_at) * 1000000)::int8"

#: That the concurrency key of a ready job ``{p}`` is not running (a job with a key waits
#: while one of its key runs): probed on pgpool_jobs_key_running by the key, job by job, and
#: only for a job with a key (under OR, the NOT EXISTS is not pulled up into a join). As an
#: anti join, the generic plan read every entry of that index once per claim, dead ones
#: included: with a pinned xmin horizon, every keyed job claimed since (1,846 pages a fair
#: claim with 30,000 such jobs of another kind, against 520).
_KEY_IDLE: Final = """({p}.concurrency_key IS NULL OR NOT EXISTS (
              SELECT FROM pgpool_jobs AS k  -- concurrency_key: one running
              WHERE k.concurrency_key = {p}.concurrency_key
                AND k.concurrency_key IS NOT NULL AND k.state = 'running'))"""

#: One scan of a (queue, kind) pair from its cursor ``a`` on (see `CLAIM_PLAIN`): the
#: ready jobs of queue ``q.queue`` and kind ``{kind}`` without a tenant or a concurrency key
#: whose priority is ``{cond}``, in claim order; SKIP LOCKED, ``{limit}`` at most. Format
#: with those, ``order`` and ``n`` (the alias).
_PAIR_SCAN: Final = """SELECT * FROM (
            SELECT p.id, p.priority, p.run_at FROM pgpool_jobs AS p
            WHERE p.state = 'ready' AND p.queue = q.queue AND p.kind = {kind}
              AND p.tenant = '' AND p.run_at <= now() AND p.concurrency_key IS NULL
              AND {cond}
            ORDER BY {order}
            LIMIT {limit}
            FOR NO KEY UPDATE SKIP LOCKED) AS s{n}"""


def _from_cursor(n: str, kind: str, limit: str) -> str:
    """The scans of a (queue, kind) pair from its cursor, as `CLAIM_PLAIN` describes them:
    the cursor ``a`` of pair number ``n`` (1.., queues outer and kinds inner, of the
    ``after_*`` parameters), and up to ``limit`` jobs of ``kind`` (and queue ``q.queue``)
    in claim order, ``c`` (id, priority, run_at); two FROM items, for after a comma or
    CROSS JOIN."""
    return """LATERAL (
        SELECT (%(after_priorities)s::int[])[{n}] AS priority,
               timestamptz 'epoch'
                   + (%(after_run_at_us)s::int8[])[{n}] * interval '1 microsecond'
                   AS run_at,
               (%(after_ids)s::bigint[])[{n}] AS id,
               coalesce((%(after_priorities)s::int[])[{n}] - 1, 2147483647) AS upto
    ) AS a
    -- With no cursor (NULL), the first two scans compare with NULL: the index is not read
    -- at all, and the third reads every priority (upto, the highest there is).
    CROSS JOIN LATERAL (
        {higher}
        UNION ALL
        {same}
        UNION ALL
        {lower}
        LIMIT {limit}
    ) AS c""".format(
        n=n, limit=limit,
        higher=_PAIR_SCAN.format(cond="p.priority > a.priority", kind=kind, limit=limit,
                                 order="p.priority DESC, p.run_at, p.id", n=1),
        same=_PAIR_SCAN.format(
            cond="p.priority = a.priority AND (p.run_at, p.id) > (a.run_at, a.id)",
            kind=kind, limit=limit, order="p.run_at, p.id", n=2),
        lower=_PAIR_SCAN.format(cond="p.priority <= a.upto", kind=kind, limit=limit,
                                order="p.priority DESC, p.run_at, p.id", n=3))


#: What every claim (`CLAIM_PLAIN`, `CLAIM`, the limited ones) writes on the rows it takes
#: (``j``): running its next attempt, under ``owner``'s lease from now, not yet started;
#: ``max_attempts`` fixed from ``default`` (the handler's setting) when the producer left it
#: open. Format with ``default``.
_CLAIM_SET: Final = """state = 'running',
    attempts = j.attempts + 1,
    max_attempts = coalesce(j.max_attempts, {default}),
    locked_by = %(owner)s,
    claimed_at = now(),
    lease_until = now() + make_interval(secs => %(lease)s),
    started = false"""

#: The plain claim: up to ``limit`` ready jobs of the given queues and kinds, when nothing
#: waiting there has a tenant or a concurrency key (`_NEED_FAIR`, read once): then the fair
#: claim (`CLAIM`) would pick the same jobs, at more than twice the cost. It is the claim a
#: hand-written loop sends, plus that look, ``max_attempts`` and a cursor.
#:
#: - One LATERAL scan per (queue, kind) pair on the ready index, in claim order (priority,
#:   due time, id), stopped by its LIMIT; then the pairs' rows merged by priority, then
#:   in turns across the pairs (each one's first job, then each one's second...), then due
#:   time and id: a flood of one kind does not fill the batch ahead of another's. SKIP
#:   LOCKED makes concurrent claimers take disjoint rows; NO KEY UPDATE does not block
#:   foreign keys that reference a job. Rows a scan locked but the batch did not take stay
#:   ready when the statement ends.
#: - The cursor: each pair's scan starts after the claim-order key (priority, run_at, id)
#:   ``after_priorities``, ``after_run_at_us``, ``after_ids`` give it (one per pair, queues
#:   outer and kinds inner; NULL, or NULL arrays: from the start, a sweep, which reads
#:   what a claim without cursors would). The index
#:   entries of jobs claimed since the table was last vacuumed lie before it: dead rows,
#:   which a claim from the start walks over one by one, and which nothing can remove
#:   while a long transaction pins the xmin horizon (a claim from the start then costs more
#:   with every job claimed; issue 32). Three scans, chained in claim order and read only
#:   as far as the batch needs (an Append under the LIMIT): higher priorities from the
#:   start (usually none), the cursor's own priority after the cursor, lower priorities
#:   from the start. What the cursor skips is left to sweeps (`pgpool.host.claimer`).
#: - A job's ``max_attempts`` is fixed at its first claim from its handler's setting when
#:   the producer left it open, so the reaper (which has no handler registry) can decide
#:   retry-or-dead on its own.
#: - The picked rows are updated by ``id = ANY(ARRAY(...))``, not joined: a generic plan
#:   (`GENERIC_PLANS`) cannot know ``limit``, and joined it would hash the whole table (2 s a
#:   claim with a million jobs queued); an id array is looked up in the primary key in
#:   every plan.
#:
#: Rows (id, kind, queue, attempts, interruptions, max_attempts, payload, seconds since
#: due, tenant, priority, snoozes, meta, group_id, run_at in µs: `_RUN_AT_US`), in no
#: order: the claimer puts them in claim order.
#: None when something waiting needs the fair claim, and none when nothing waits: then the
#: claimer claims with `CLAIM`, which tells the two apart.
def _plain_claim(turns: bool, pair_limit: str = "%(limit)s") -> str:
    """`CLAIM_PLAIN`, or with ``turns`` false `CLAIM_PLAIN_ONE`: the same without the turns,
    for a host of one (queue, kind) pair; ``pair_limit``: the most each pair gives."""
    ranked = ("""CROSS JOIN LATERAL (  -- turn: the job's place in its pair, within its priority
        SELECT c.id, c.priority, c.run_at,
               row_number() OVER (PARTITION BY c.priority ORDER BY c.run_at, c.id) AS turn
        FROM """ + _from_cursor("pair.n", "k.kind", pair_limit) + """
    ) AS c""") if turns else "CROSS JOIN " + _from_cursor("pair.n", "k.kind", pair_limit)
    return """
UPDATE pgpool_jobs AS j
SET """ + _CLAIM_SET.format(default="""(%(kind_max_attempts)s::int[])[
        array_position(%(kinds)s::text[], j.kind)]""") + """
WHERE j.id = ANY(ARRAY(
    SELECT c.id
    FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(queue, qn)
    CROSS JOIN unnest(%(kinds)s::text[]) WITH ORDINALITY AS k(kind, kn)
    CROSS JOIN LATERAL (
        SELECT (q.qn - 1) * cardinality(%(kinds)s::text[]) + k.kn AS n
    ) AS pair
    """ + ranked + """
    WHERE NOT EXISTS (""" + _NEED_FAIR + """)  -- read once: then no scan at all
    ORDER BY c.priority DESC, """ + ("c.turn, " if turns else "") + """c.run_at, c.id
    LIMIT %(limit)s))
RETURNING j.id, j.kind, j.queue, j.attempts, j.interruptions, j.max_attempts, j.payload,
          extract(epoch FROM now() - j.run_at)::float8, j.tenant, j.priority, j.snoozes,
          j.meta, j.group_id, """ + _RUN_AT_US.format(table="j") + """
"""


CLAIM_PLAIN: Final = _plain_claim(turns=True)
#: `CLAIM_PLAIN` for a host of one (queue, kind) pair: no turns to take, and without their
#: window a claim of 50 costs 25 µs less (3.6% of the statement, measured interleaved).
CLAIM_PLAIN_ONE: Final = _plain_claim(turns=False)
#: A prompt claim (`pgpool.host.scheduler`): `CLAIM_PLAIN` of one job per (queue, kind)
#: pair at most, however many one pair has waiting (``limit``: the pairs).
CLAIM_PROMPT: Final = _plain_claim(turns=False, pair_limit="1")

#: Whether anything waiting in the given queues and kinds needs the fair claim: asked after
#: a plain claim that took nothing, instead of running the fair claim blindly (which reads
#: from the start, over every dead entry a pinned horizon keeps).
NEEDS_FAIR: Final = "SELECT EXISTS (" + _NEED_FAIR + ")"

#: `CLAIM_PLAIN`'s cursor parameters for a sweep: every pair from the start.
SWEEP: Final = {"after_priorities": None, "after_run_at_us": None, "after_ids": None}

#: The ready jobs of the given queues and kinds with a concurrency key, on the partial index
#: pgpool_jobs_ready_keyed (migration 27), which holds only them. While one waits, the
#: fair claim reads every tenant from the start, not from its cursor: a job passed over
#: while its key ran would lie behind the cursor of a tenant whose later jobs were taken.
_KEYED_WAITING: Final = """
        SELECT FROM pgpool_jobs
        WHERE state = 'ready' AND concurrency_key IS NOT NULL
          AND queue = ANY(%(queues)s::text[]) AND kind = ANY(%(kinds)s::text[])
"""

#: What the fair claim's scans (``fair``, ``spare``) take of each job, ``j``.
_FAIR_COLUMNS: Final = ("j.id, j.queue, j.kind, j.tenant, j.priority, j.run_at, "
                        "j.concurrency_key")


def _tenant_from_cursor(c: str, columns: str, limit: str, where: str = "",
                        lock: str = "", higher: bool = True) -> str:
    """The ready jobs ``j`` of tenant ``{c}.tenant`` in the pair (``{c}.queue``,
    ``{c}.kind``) that also meet ``where``, in claim order from the tenant's cursor
    (``{c}.cur_priority``, ``{c}.cur_run_at``, ``{c}.cur_id``; NULL: from the start), up to
    ``limit``: ``columns`` of each, every scan with ``lock``. The three scans of
    `_from_cursor`, chained in claim order, on the ready index's range of the tenant; but
    the first (higher priorities than the cursor's, from the start) unless ``higher``."""
    def scan(cond: str, order: str, n: int) -> str:
        return ("SELECT * FROM (\n            SELECT " + columns + " FROM pgpool_jobs AS j\n"
                "            WHERE j.state = 'ready' AND j.queue = " + c + ".queue"
                " AND j.kind = " + c + ".kind\n"
                "              AND j.tenant = " + c + ".tenant AND j.run_at <= now()\n"
                "              AND " + cond + (" AND " + where if where else "") + "\n"
                "            ORDER BY " + order + "\n            LIMIT " + limit + lock
                + ") AS s" + str(n))
    by_priority = "j.priority DESC, j.run_at, j.id"
    return ("\n        "
            + (scan("j.priority > " + c + ".cur_priority", by_priority, 1)
               + "\n        UNION ALL\n        " if higher else "")
            + scan("j.priority = " + c + ".cur_priority AND (j.run_at, j.id) > ("
                   + c + ".cur_run_at, " + c + ".cur_id)", "j.run_at, j.id", 2)
            + "\n        UNION ALL\n        "
            + scan("j.priority <= coalesce(" + c + ".cur_priority - 1, 2147483647)",
                   by_priority, 3)
            + "\n        LIMIT " + limit)


def _tenant_from_start(c: str, columns: str, limit: str, where: str = "",
                       lock: str = "") -> str:
    """`_tenant_from_cursor` for a sweep: one scan of the tenant's range from its start."""
    return ("\n        SELECT " + columns + " FROM pgpool_jobs AS j\n"
            "        WHERE j.state = 'ready' AND j.queue = " + c + ".queue AND j.kind = "
            + c + ".kind\n          AND j.tenant = " + c + ".tenant AND j.run_at <= now()"
            + ("\n          AND " + where if where else "")
            + "\n        ORDER BY j.priority DESC, j.run_at, j.id\n        LIMIT " + limit
            + lock.replace(" FOR", "\n        FOR"))


#: The walks' room of tenant ``x.tenant`` under ``--tenant-cap`` (``r.room``): how many
#: more of its jobs may run now (its running jobs counted on an index, at most the cap's
#: worth), or ``limit`` when not counted (no cap, jobs without a tenant, or ``{none}``).
_TENANT_ROOM: Final = """\
    CROSS JOIN LATERAL (SELECT  -- --tenant-cap: how many more of its jobs may run now
        CASE WHEN %(tenant_cap)s::int IS NULL OR x.tenant = ''{none} THEN %(limit)s
             ELSE greatest(0, %(tenant_cap)s::int - (
                 SELECT count(*) FROM (
                     SELECT FROM pgpool_jobs AS r
                     WHERE r.tenant = x.tenant AND r.state = 'running' AND r.tenant <> ''
                     LIMIT %(tenant_cap)s) AS r))::int END AS room
        OFFSET 0) AS r  -- not inlined: its subquery runs once, not per use
"""

#: The fair claim's walk over tenants (see `CLAIM`), as a sweep reads them: each pair's
#: tenants from the start of its range of the ready index, one descent each.
_WALK_FROM_START: Final = """WITH RECURSIVE pairs AS (
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
""" + _TENANT_ROOM.format(none="") + """\
    WHERE (t.n = 0 OR x.tenant <> t.first)
      AND t.n - t.skipped < %(limit)s AND t.skipped < """ + str(TENANT_SKIPS) + """
"""

#: The walk from the tenants' cursors (see `CLAIM`): a tenant with a cursor is reached by a
#: probe from it (``k``, ``kj``), one without by a descent bounded by the next one with
#: (``g``). ``pos`` is where the next step looks from (inclusive: after tenant T, T || chr(1),
#: which no other name falls between in byte order), ``ki`` the next cursor's place in the
#: ``cursor_*`` arrays; past the pair's last tenant the walk wraps round once to its first
#: (``wrapped``), and ends at the first tenant it visited before that, or at the end.
_WALK_FROM_CURSORS: Final = """WITH RECURSIVE pairs AS (
    SELECT q.queue, k.kind, (q.qn - 1) * cardinality(%(kinds)s::text[]) + k.kn AS pn
    FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(queue, qn)
    CROSS JOIN unnest(%(kinds)s::text[]) WITH ORDINALITY AS k(kind, kn)
), known AS (  -- cursors: the tenants with one, by pair (pn) and in tenant order (i)
    SELECT c.pn, c.tenant COLLATE "C" AS tenant, c.i
    FROM unnest(%(cursor_pairs)s::int[], %(cursor_tenants)s::text[])
        WITH ORDINALITY AS c(pn, tenant, i)
    WHERE NOT EXISTS (""" + _KEYED_WAITING + """)  -- read once: then no cursors
), walk AS (  -- fair: the tenants with ready jobs, from the cursor on, wrapping round
    SELECT p.queue, p.kind, p.pn, x.k0, x.ki,
           (%(after)s::text || chr(1)) COLLATE "C" AS pos, false AS wrapped,
           NULL::text COLLATE "C" AS first, NULL::text COLLATE "C" AS tenant,
           0 AS n, 0 AS skipped, 0 AS room, false AS has_job, NULL::int AS cur_priority,
           NULL::timestamptz AS cur_run_at, NULL::bigint AS cur_id
    FROM pairs AS p  -- n = 0: where the walk starts, not a tenant
    CROSS JOIN LATERAL (  -- the pair's first cursor, and its first after the claimer's
        SELECT min(c.i)::int AS k0,
               min(c.i) FILTER (WHERE c.tenant > %(after)s::text COLLATE "C")::int AS ki
        FROM known AS c WHERE c.pn = p.pn) AS x
    UNION ALL
    SELECT t.queue, t.kind, t.pn, t.k0,
           CASE WHEN x.tenant IS NULL THEN t.k0 WHEN x.known THEN t.ki + 1 ELSE t.ki END,
           CASE WHEN x.tenant IS NULL THEN '' ELSE x.tenant || chr(1) END COLLATE "C",
           t.wrapped OR x.tenant IS NULL,
           CASE WHEN t.wrapped THEN t.first ELSE coalesce(t.first, x.tenant) END COLLATE "C",
           x.tenant COLLATE "C", t.n + (x.tenant IS NOT NULL)::int,
           t.skipped + CASE  -- a tenant that gives nothing now: go on past it
               WHEN x.tenant IS NULL THEN 0 WHEN NOT x.has_job OR r.room = 0 THEN 1
               WHEN x.key IS NULL THEN 0
               WHEN EXISTS (SELECT FROM pgpool_jobs AS k  -- its first job's key runs
                            WHERE k.concurrency_key = x.key AND k.state = 'running') THEN 1
               ELSE 0 END,
           r.room, x.has_job, x.cur_priority, x.cur_run_at, x.cur_id
    FROM walk AS t
    LEFT JOIN LATERAL (  -- the next tenant with a cursor, and its cursor
        SELECT (%(cursor_tenants)s::text[])[t.ki] COLLATE "C" AS tenant,
               (%(cursor_priorities)s::int[])[t.ki] AS cur_priority,
               timestamptz 'epoch' + (%(cursor_run_at_us)s::int8[])[t.ki]
                   * interval '1 microsecond' AS cur_run_at,
               (%(cursor_ids)s::bigint[])[t.ki] AS cur_id
        WHERE (%(cursor_pairs)s::int[])[t.ki] = t.pn) AS k ON true
    LEFT JOIN LATERAL (  -- the next tenant without one, before k: one index descent
        -- Bounded by k's name, it stops at k's first entry without reading its row (dead,
        -- with a pinned horizon, as all of k's before its cursor).
        SELECT * FROM (
            SELECT tenant, concurrency_key FROM pgpool_jobs
            WHERE state = 'ready' AND queue = t.queue AND kind = t.kind AND tenant >= t.pos
              AND tenant < k.tenant  -- with no k, NULL: not read at all
            ORDER BY tenant, priority DESC, run_at, id LIMIT 1) AS g1
        UNION ALL
        SELECT * FROM (
            SELECT tenant, concurrency_key FROM pgpool_jobs
            WHERE state = 'ready' AND queue = t.queue AND kind = t.kind AND tenant >= t.pos
              AND k.tenant IS NULL
            ORDER BY tenant, priority DESC, run_at, id LIMIT 1) AS g2
        LIMIT 1) AS g ON true
    LEFT JOIN LATERAL (  -- else k's first job, from its cursor
        SELECT true AS found, j.concurrency_key
        FROM (SELECT t.queue, t.kind, k.tenant, k.cur_priority, k.cur_run_at, k.cur_id) AS kc
        CROSS JOIN LATERAL (""" + _tenant_from_cursor("kc", "j.concurrency_key", "1",
                                                      higher=False) + """
        ) AS j
        WHERE g.tenant IS NULL AND k.tenant IS NOT NULL) AS kj ON true
    CROSS JOIN LATERAL (SELECT coalesce(g.tenant, k.tenant) AS tenant,
        g.tenant IS NULL AND k.tenant IS NOT NULL AS known,
        g.tenant IS NOT NULL OR kj.found IS NOT NULL AS has_job,
        CASE WHEN g.tenant IS NULL THEN kj.concurrency_key ELSE g.concurrency_key END AS key,
        CASE WHEN g.tenant IS NULL THEN k.cur_priority END AS cur_priority,
        CASE WHEN g.tenant IS NULL THEN k.cur_run_at END AS cur_run_at,
        CASE WHEN g.tenant IS NULL THEN k.cur_id END AS cur_id
        ) AS x
""" + _TENANT_ROOM.format(none=" OR NOT x.has_job") + """\
    WHERE t.n - t.skipped < %(limit)s AND t.skipped < """ + str(TENANT_SKIPS) + """
      AND (x.tenant IS NOT NULL OR NOT t.wrapped)  -- past the last once round: the end
      AND NOT coalesce(t.wrapped AND x.tenant >= t.first, false)  -- round to the first
      -- (first: the first tenant before the wrap; none there, the walk ends at the end)
"""

#: The tenants the scans read (see `CLAIM`): those the walk visited, with their cursors.
_TENANTS_FROM_START: Final = """
    SELECT queue, kind, tenant, room, NULL::int AS cur_priority,
           NULL::timestamptz AS cur_run_at, NULL::bigint AS cur_id
    FROM walk WHERE n > 0"""
_TENANTS_FROM_CURSORS: Final = """
    SELECT queue, kind, tenant, room, cur_priority, cur_run_at, cur_id
    FROM walk WHERE tenant IS NOT NULL AND has_job"""


#: The fair claim: up to ``limit`` ready jobs of the given queues and kinds, in fair order,
#: when something waiting has a tenant or a concurrency key (else `CLAIM_PLAIN` does it).
#: Locking and the update as in `CLAIM_PLAIN`. Rows in claim order, as `CLAIM_PLAIN`'s, and
#: a fifteenth: ``plain``, true when nothing it left behind needs the fair claim (the
#: claimer's next claim is the plain one then). A claim that takes nothing returns one row
#: with no job, its ``plain``, and where a walk that went past `TENANT_SKIPS` tenants
#: stopped (else NULL).
#:
#: One LATERAL scan per (queue, kind) pair and tenant, on the ready index (queue, kind,
#: tenant, priority DESC, run_at, id): each returns rows already in claim order and stops
#: after its LIMIT, however deep the backlog. (``queue = ANY(...)`` would make PostgreSQL
#: sort every due row first: 350 ms instead of 1.4 ms per claim with a million jobs due.)
#: Rows a scan locked but the batch did not take stay ready when the statement ends.
#:
#: Cursors, as `CLAIM_PLAIN`'s but per tenant: ``cursor_tenants`` (in tenant order within
#: each pair, ``cursor_pairs`` numbering the pairs as `CLAIM_PLAIN` does) with the
#: claim-order key of the last job the claimer took from each (``cursor_priorities``,
#: ``cursor_run_at_us``, ``cursor_ids``), in `CLAIM_CURSORS` (a sweep is `CLAIM`). The walk
#: reaches a tenant with a cursor by a probe from its cursor, and one without by an index
#: descent bounded by the next tenant with one, so that it never lands on a dead head of
#: entries it has claimed past; the scans read each tenant from its cursor the same way.
#: While a job with a concurrency key waits (`_KEYED_WAITING`, read once), no cursor is
#: used: a keyed job passed over while its key ran lies behind a cursor.
#:
#: Fairness (docs/guides/fairness.md, docs/concepts/claim.md; the parts marked "fair:" below):
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
#:   tries again (`pgpool.host.claimer`), and then sees the key running.
#:
#: Jobs not yet due are ``scheduled``, outside the ready index, so they cost a claim nothing
#: (``run_at <= now()`` only guards against a ready row written with a future time by a
#: pgpool older than the scheduled state).
def _fair_claim(share: str, fair_from: str, spare_from: str, picked_join: str,
                picked_order: str, cursors: bool) -> str:
    """The fair claim's statement: `CLAIM`, or `CLAIM_CPU`, which differ in how the batch
    is shared (``share``: its CTEs), what each (queue, kind, tenant)'s scans are driven by
    (``fair_from``, and ``spare_from`` for the rest of the batch: rows ``t`` or ``f`` with
    its ``queue``, ``kind`` and ``tenant``, ``r.room`` and ``s.share``; ``f`` also with
    ``got`` and ``ids``, what it took) and the order the batch is picked in
    (``picked_order``, over ``x``, the candidates, and what ``picked_join`` joins). With
    ``cursors``, the walk and the scans read each tenant from its cursor (`CLAIM_CURSORS`);
    else from the start, as a sweep does."""
    walk, tenants = ((_WALK_FROM_CURSORS, _TENANTS_FROM_CURSORS) if cursors
                     else (_WALK_FROM_START, _TENANTS_FROM_START))
    scan = _tenant_from_cursor if cursors else _tenant_from_start
    return """
""" + walk + """), tenants AS (""" + tenants + """
), room AS (  -- fair: --tenant-cap, how many more of each tenant's jobs may run now
    SELECT DISTINCT tenant, room FROM tenants
), """ + share + """
), fair AS MATERIALIZED (
    SELECT c.* FROM """ + fair_from + """
    CROSS JOIN LATERAL (""" + scan(
        "t", _FAIR_COLUMNS, "least(s.share, r.room)", _KEY_IDLE.format(p="j"),
        " FOR NO KEY UPDATE SKIP LOCKED") + """
    ) AS c
    WHERE r.room > 0
), spare AS (  -- fair: the rest of the batch, to the tenants that filled their share
    SELECT c.*
    FROM """ + spare_from + """
    CROSS JOIN (SELECT count(*)::int AS got FROM fair) AS total
    CROSS JOIN LATERAL (""" + scan(
        "f", _FAIR_COLUMNS, "least(r.room - f.got, %(limit)s - total.got)",
        "j.id <> ALL(f.ids) AND " + _KEY_IDLE.format(p="j"),
        " FOR NO KEY UPDATE SKIP LOCKED") + """
    ) AS c
    WHERE f.got = least(s.share, r.room) AND f.got < r.room AND total.got < %(limit)s
), one_per_key AS (  -- concurrency_key: at most one job per key in a batch
    SELECT *, row_number() OVER (PARTITION BY concurrency_key
                                 ORDER BY priority DESC, run_at, id) AS key_rank
    FROM (SELECT * FROM fair UNION ALL SELECT * FROM spare) AS candidates
), picked AS (  -- fair: round-robin over tenants, within the cap; in a tenant, by
    -- priority, then its (queue, kind) pairs in turns (as CLAIM_PLAIN's), then due time
    SELECT x.id, x.tenant <> '' OR x.concurrency_key IS NOT NULL AS fair FROM (
        SELECT id, tenant, concurrency_key, priority, run_at,
               row_number() OVER (PARTITION BY tenant
                                  ORDER BY priority DESC, turn, run_at, id) AS tenant_rank
        FROM (SELECT *, row_number() OVER (PARTITION BY tenant, queue, kind, priority
                                           ORDER BY run_at, id) AS turn
              FROM one_per_key WHERE concurrency_key IS NULL OR key_rank = 1) AS k
    ) AS x JOIN room AS r USING (tenant)""" + picked_join + """
    WHERE x.tenant_rank <= r.room
    ORDER BY """ + picked_order + """, x.priority DESC, x.run_at, x.id
    LIMIT %(limit)s
), plain AS (  -- nothing left that needs the fair claim once this one's jobs are taken
    -- Not looked for when a full batch took some that need it (more are most likely
    -- left): with a pinned horizon the look walks the dead entries of every job with a
    -- tenant claimed since, and a backlog's claims would pay for it at every claim.
    SELECT CASE WHEN EXISTS (SELECT FROM picked WHERE fair)
                     AND (SELECT count(*) FROM picked) = %(limit)s THEN false
                ELSE NOT EXISTS (""" + _NEED_FAIR + """
                    AND id <> ALL(ARRAY(SELECT id FROM picked))) END AS plain
), claimed AS (  -- as in CLAIM_PLAIN
    UPDATE pgpool_jobs AS j
    SET """ + _CLAIM_SET.format(default="k.max_attempts") + """
    FROM unnest(%(kinds)s::text[], %(kind_max_attempts)s::int[]) AS k(kind, max_attempts)
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND k.kind = j.kind
    RETURNING j.id, j.kind, j.queue, j.attempts, j.interruptions, j.max_attempts, j.payload,
              extract(epoch FROM now() - j.run_at)::float8 AS waited, j.tenant, j.priority,
              j.run_at, j.snoozes, j.meta, j.group_id
)
SELECT c.id, c.kind, c.queue, c.attempts, c.interruptions, c.max_attempts, c.payload,
       c.waited, coalesce(c.tenant, w.tenant), c.priority, c.snoozes, c.meta, c.group_id,
       """ + _RUN_AT_US.format(table="c") + """, (SELECT plain FROM plain)
FROM (SELECT coalesce(min(tenant) FILTER (WHERE tenant > %(after)s), min(tenant)) AS tenant
      FROM walk WHERE skipped = """ + str(TENANT_SKIPS) + """) AS w  -- where walks stopped short
LEFT JOIN claimed AS c ON true  -- nothing claimed: a row with no job, and where walks stopped
ORDER BY c.priority DESC, c.run_at, c.id  -- claim order: the workers take them in this order
"""


_BY_COUNT: Final[dict[str, str]] = dict(
    share="""share AS (  -- fair: the equal share of the batch of each tenant with room
    SELECT ceil(%(limit)s::float8 / greatest(1, count(*)))::int AS share
    FROM room WHERE room > 0""",
    fair_from="tenants AS t JOIN room AS r USING (tenant) CROSS JOIN share AS s",
    spare_from="""(SELECT c.queue, c.kind, c.tenant, t.cur_priority, t.cur_run_at, t.cur_id,
                 count(*)::int AS got, array_agg(c.id) AS ids
          FROM fair AS c JOIN tenants AS t USING (queue, kind, tenant)
          GROUP BY c.queue, c.kind, c.tenant, t.cur_priority, t.cur_run_at, t.cur_id) AS f
    JOIN room AS r USING (tenant) CROSS JOIN share AS s""",
    picked_join="", picked_order="x.tenant_rank")
CLAIM: Final = _fair_claim(**_BY_COUNT, cursors=False)
#: `CLAIM` from the tenants' cursors (see `CLAIM`).
CLAIM_CURSORS: Final = _fair_claim(**_BY_COUNT, cursors=True)

#: Seconds of CPU usage (`RECORD_CPU`) that `CLAIM_CPU` weighs: the recent window
#: fairness by CPU time evens out over. Usage is recorded in buckets of `CPU_BUCKET`
#: seconds; the maintenance leader deletes those past `CPU_KEPT` (`PRUNE_CPU`).
CPU_WINDOW: Final = 30
CPU_BUCKET: Final = 5
CPU_KEPT: Final = 2 * CPU_WINDOW
#: The least CPU seconds `CLAIM_CPU` expects of a job, whatever its tenant's jobs measured:
#: a tenant of jobs that use no CPU (they wait on I/O) would otherwise take whole batches.
MIN_JOB_CPU: Final = 0.0001
#: A tenant's running jobs that `CLAIM_CPU` counts at most (on pgpool_jobs_tenant_running):
#: a bound on what one claim reads.
RUNNING_COUNTED: Final = 1000

#: The fair claim by CPU time (``pgpool run --fair-by cpu``): `CLAIM`, but the batch is
#: shared between the tenants with room so that their expected CPU evens out
#: (docs/guides/fairness.md, "Fairness by CPU time"), from the usage every host records
#: (`RECORD_CPU`):
#:
#: - ``used``: a tenant's CPU seconds over the last `CPU_WINDOW` seconds, fleet-wide, and
#:   per attempt (its jobs' mean); and its running jobs, counted on
#:   pgpool_jobs_tenant_running (not those of '', which that index leaves out).
#: - ``cost``: what one of its jobs is expected to use: its mean, or the others' for a
#:   tenant not measured yet, at least `MIN_JOB_CPU`; and its load, the CPU it used plus
#:   its running jobs' expected CPU (which no usage records yet).
#: - ``ahead``: how far its load is ahead of the least loaded tenant's, at most what the
#:   batch gives each tenant when it evens out their CPU (``limit / sum(1 / mean)``): the
#:   tenant furthest behind takes about one and a half times its even share of the batch's
#:   CPU, not the whole batch (unless the others' jobs are too long for what is left).
#: - ``share``: the tenant's r-th job would start when its load reaches ``ahead + (r - 1)
#:   x mean``; the batch's ``limit`` earliest such starts, over every tenant, are the
#:   shares. So a tenant's share of jobs is inversely proportional to its mean, and the
#:   tenants furthest behind go first.
#: - ``spare``: what the tenants did not fill goes to any tenant with room, a share of 0
#:   included (a batch is never left short while a job could run), and ``picked`` takes
#:   the candidates in the order of those starts.
_BY_CPU: Final[dict[str, str]] = dict(
    share="""used AS (  -- cpu: each tenant's recent CPU, per attempt, and running jobs
    SELECT r.tenant, r.room, coalesce(u.cpu, 0) AS cpu, u.mean, n.running
    FROM room AS r
    CROSS JOIN LATERAL (
        SELECT sum(c.cpu) AS cpu, sum(c.cpu) / nullif(sum(c.attempts), 0) AS mean
        FROM pgpool_tenant_cpu AS c
        WHERE c.tenant = r.tenant
          AND c.bucket > now() - make_interval(secs => """ + str(CPU_WINDOW) + """)) AS u
    CROSS JOIN LATERAL (
        SELECT count(*) AS running FROM (
            SELECT FROM pgpool_jobs AS j
            WHERE j.tenant = r.tenant AND j.state = 'running' AND j.tenant <> ''
            LIMIT """ + str(RUNNING_COUNTED) + """) AS j) AS n
    WHERE r.room > 0
), cost AS (  -- cpu: a job's expected CPU, and the tenant's load
    SELECT u.tenant, u.room, x.mean, u.cpu + u.running * x.mean AS load
    FROM used AS u CROSS JOIN LATERAL (
        SELECT greatest(coalesce(u.mean, (SELECT avg(mean) FROM used), 0),
                        """ + str(MIN_JOB_CPU) + """) AS mean) AS x
), ahead AS (  -- cpu: how far ahead of the least loaded, at most one batch's even share
    SELECT c.tenant, c.room, c.mean, least(c.load - b.lowest, b.even) AS ahead
    FROM cost AS c CROSS JOIN (
        SELECT min(load) AS lowest, %(limit)s::float8 / sum(1 / mean) AS even FROM cost) AS b
), starts AS (  -- cpu: the batch's earliest job starts, counted per tenant
    SELECT a.tenant, count(s.tenant)::int AS share
    FROM ahead AS a LEFT JOIN (
        SELECT a.tenant FROM ahead AS a
        CROSS JOIN LATERAL generate_series(1, least(a.room, %(limit)s)) AS r(n)
        ORDER BY a.ahead + (r.n - 1) * a.mean, a.tenant
        LIMIT %(limit)s) AS s USING (tenant)
    GROUP BY a.tenant
), share AS MATERIALIZED (  -- cpu: per (queue, kind, tenant) with room, its share
    -- One relation that the scans are driven by: joined to the walk's tenants in them,
    -- the scans ran for every pair of rows (the CTEs' estimates are a row or so each).
    SELECT t.queue, t.kind, t.tenant, t.room, t.cur_priority, t.cur_run_at, t.cur_id, x.share
    FROM tenants AS t JOIN starts AS x USING (tenant)""",
    fair_from="""share AS t  -- r and s: where the scans read the room and share
    CROSS JOIN LATERAL (SELECT t.room) AS r(room)
    CROSS JOIN LATERAL (SELECT t.share) AS s(share)""",
    spare_from="""(SELECT t.queue, t.kind, t.tenant, t.room, t.share, t.cur_priority,
                 t.cur_run_at, t.cur_id, count(c.id)::int AS got,
                 coalesce(array_agg(c.id) FILTER (WHERE c.id IS NOT NULL), '{}') AS ids
          FROM share AS t LEFT JOIN fair AS c USING (queue, kind, tenant)
          GROUP BY t.queue, t.kind, t.tenant, t.room, t.share, t.cur_priority, t.cur_run_at,
                   t.cur_id) AS f
    CROSS JOIN LATERAL (SELECT f.room) AS r(room)
    CROSS JOIN LATERAL (SELECT f.share) AS s(share)""",
    picked_join=" JOIN ahead AS a USING (tenant)",
    picked_order="a.ahead + (x.tenant_rank - 1) * a.mean")
CLAIM_CPU: Final = _fair_claim(**_BY_CPU, cursors=False)
#: `CLAIM_CPU` from the tenants' cursors (see `CLAIM`).
CLAIM_CPU_CURSORS: Final = _fair_claim(**_BY_CPU, cursors=True)

#: Add what each tenant's attempts used to the current bucket (`CPU_BUCKET` seconds) of
#: pgpool_tenant_cpu: ``tenants`` with their ``cpu`` seconds and ``attempts``, the sums of
#: one ack flush (`pgpool.host.completer`). In tenant order, so that two hosts' upserts
#: lock the rows they share in the same order and never deadlock.
RECORD_CPU: Final = """
INSERT INTO pgpool_tenant_cpu AS u (tenant, bucket, cpu, attempts)
SELECT t.tenant,
       to_timestamp(floor(extract(epoch FROM now()) / """ + str(CPU_BUCKET) + """)
                    * """ + str(CPU_BUCKET) + """),
       t.cpu, t.attempts
FROM unnest(%(tenants)s::text[], %(cpu)s::float8[], %(attempts)s::int8[])
    AS t(tenant, cpu, attempts)
ORDER BY t.tenant
ON CONFLICT (tenant, bucket) DO UPDATE
SET cpu = u.cpu + excluded.cpu, attempts = u.attempts + excluded.attempts
"""

#: Delete up to ``limit`` buckets of pgpool_tenant_cpu older than `CPU_KEPT` seconds (run
#: by the maintenance leader's retention): how many.
PRUNE_CPU: Final = """
WITH old AS (
    SELECT tenant, bucket FROM pgpool_tenant_cpu
    WHERE bucket < now() - make_interval(secs => """ + str(CPU_KEPT) + """)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM pgpool_tenant_cpu AS c USING old
    WHERE c.tenant = old.tenant AND c.bucket = old.bucket
    RETURNING 1
)
SELECT count(*) FROM gone
"""

#: Tenants the scoped claim (`CLAIM_SCOPED`) walks in each (queue, kind) pair at most: a
#: bound on what one claim reads, about four index descents each.
SCOPE_WALK: Final = 100
#: Rows of new rings one scoped claim writes at most (past one ring): a ring is
#: `RING_MAX` rows at most, and a claim meets `SCOPE_WALK` tenants walked and those of the
#: keys it meets, so this bounds a claim that meets many new keys. The scopes left get
#: theirs from the next claims.
RING_ROWS: Final = 10_000

#: Rows a rate's ring has at most: a rate of R is min(R, RING_MAX) rows, and each row lets
#: ``cap`` jobs start in an episode (`_TICK_CAP`), the caps adding up to R. One row a job up
#: to RING_MAX, so that small rates are exact to the job; above, a claim of 50 writes one
#: or a few rows, not 50, and a tenant's ring is 64 rows, not 100,000.
RING_MAX: Final = 64

#: The rows of a rate ``{l}.rate``'s ring (`RING_MAX`).
_RING: Final = "least({l}.rate, " + str(RING_MAX) + ")"

#: How many jobs a row ``{t}`` of the ring of ``{l}`` lets start in one episode: R over the
#: rows, the first R mod rows one more, so that the ring's caps add up to R.
_TICK_CAP: Final = ("({l}.rate / " + _RING + " + ({t}.slot <= {l}.rate %% " + _RING
                    + ")::int)")

#: Whether a row ``{t}`` of ``{l}``'s ring's episode is over: last used ``per`` seconds ago.
_TICK_OVER: Final = "{t}.used_at <= now() - make_interval(secs => {l}.per)"

#: Whether a row ``{t}`` of ``{l}``'s ring lets a job start now: its episode is over, or has
#: room left (a row is topped up, and its episode runs on, until it holds its cap) and
#: was last used no later than this claim's now(): a claim whose transaction began before
#: the episode's last (or first) job must not join it, or its jobs could fall in the
#: window of the row's previous episode, and its stamp would move the row back in time.
_TICK_FREE: Final = ("(" + _TICK_OVER + " OR ({t}.n < " + _TICK_CAP
                     + " AND {t}.used_at <= now()))")

#: How many jobs a row ``{t}`` of ``{l}``'s ring lets start now (0 or more when free).
_TICK_ROOM: Final = ("CASE WHEN " + _TICK_OVER + " THEN " + _TICK_CAP + " ELSE "
                     + _TICK_CAP + " - {t}.n END")


def _tick(fragment: str, l: str = "l", t: str = "t") -> str:  # noqa: E741 (SQL aliases)
    """One of the rings' fragments, for the limit alias ``l`` and the row alias ``t``."""
    return fragment.replace("{l}", l).replace("{t}", t)


#: A running job holds a slot of its kind's concurrency limit: written with the predicate
#: of the unique indexes pgpool_jobs_limit_running and _scoped_running, whose entries are
#: exactly those jobs. Format with ``r`` (the alias).
_HOLDS_SLOT: Final = "{r}.state = 'running' AND {r}.limit_attempt = {r}.attempts"

#: Ends a NOT EXISTS on the slots' unique indexes, so that it stays a probe per row, on the
#: index's whole key: pulled up into an anti join, the generic plan read every entry of
#: the kind once per claim, dead ones included, and a pinned xmin horizon keeps the entry
#: of every slot a job ever held (2,852 pages a claim after 30,000 jobs).
_PROBE_EACH: Final = "OFFSET 0"

#: The free slots of a limit ``l`` (its kind, ``concurrency`` and random ``start``), up to
#: ``n``: numbers 1..N tried from the start on, wrapping round, each probed on the unique
#: index of its scope (``in_scope``: the condition on ``limit_scope``). Format with
#: ``in_scope`` and ``n``.
_PROBED_SLOTS: Final = """
        SELECT s.slot FROM (
            SELECT (l.start + generate_series(0, l.concurrency - 1)) %% l.concurrency + 1
                   AS slot) AS s
        WHERE NOT EXISTS (SELECT FROM pgpool_jobs AS r
                          WHERE r.kind = l.kind AND r.limit_scope {in_scope}
                            AND r.limit_slot = s.slot AND """ + _HOLDS_SLOT.format(r="r") + """
                          """ + _PROBE_EACH + """)
        LIMIT {n}"""

#: The free slots of each row of ``source`` (alias ``l``: its kind, ``concurrency``, the
#: random ``start``, and ``scope`` when ``scoped``), up to ``n`` of them, numbered 1.. in
#: ``rank``: numbers 1..N tried from the random start on, wrapping round, each probed on
#: the unique index of its scope, in the select list (a set-returning function there is
#: read lazily and stopped by the LIMIT; in FROM it would list all N first). A row without
#: a concurrency limit: ``n`` NULL slots.
_FREE_SLOTS: Final = """
    SELECT l.kind{scope}, f.slot, row_number() OVER (PARTITION BY l.kind{scope}) AS rank
    FROM {source} AS l
    CROSS JOIN LATERAL (""" + _PROBED_SLOTS + """) AS f
    WHERE l.concurrency IS NOT NULL
    UNION ALL
    SELECT l.kind{scope}, NULL, generate_series(1, {n}) FROM {source} AS l
    WHERE l.concurrency IS NULL"""

#: How many rows of a ring ``l`` give ``{n}`` jobs: ``n`` over its rows' smallest cap,
#: rounded up (one row a job for a ring of caps 1), and one more when a row holds more than
#: one job: the first row read may be part used. (Without it, a claim of 50 under
#: ``rate=100_000`` came back short once in 31, its row nearly spent, and its claim loop
#: then waited for work.)
_ROWS_FOR: Final = ("(({n} + l.rate / " + _tick(_RING) + " - 1) / (l.rate / " + _tick(_RING)
                    + ") + (l.rate / " + _tick(_RING) + " > 1)::int)")

#: The room of each ``source`` row's rate ring (``ring``: its scope), for up to ``n`` jobs,
#: numbered 1.. in ``rank``: one row per job, each with ``slot``, the ring's row that lets
#: it start, and ``base``, that row's count before this claim (0 for a row whose episode
#: is over). The ring's free rows (`_TICK_FREE`) are read in slot order from the random
#: ``tick_start`` on, wrapping round (two scans chained on the primary key, read only as
#: far as they take), as many as ``n`` jobs need when each row is free whole (one row a
#: job for a ring of caps 1), locked SKIP LOCKED. A row without a rate: ``n`` NULL rows.
_FREE_TICKS: Final = """
    SELECT l.kind{scope}, t.slot, t.base, row_number() OVER (PARTITION BY l.kind{scope}) AS rank
    FROM {source} AS l
    CROSS JOIN LATERAL (
        SELECT t.slot, CASE WHEN """ + _tick(_TICK_OVER) + """ THEN 0 ELSE t.n END AS base,
               generate_series(1, least(""" + _tick(_TICK_ROOM) + """, {n})) AS job
        FROM (
            SELECT * FROM (
                SELECT t.slot, t.used_at, t.n FROM pgpool_limit_ticks AS t
                WHERE t.kind = l.kind AND t.scope = {ring}
                  AND t.slot >= l.tick_start AND t.slot <= """ + _tick(_RING) + """
                  AND """ + _tick(_TICK_FREE) + """
                ORDER BY t.slot
                LIMIT """ + _ROWS_FOR + """
                FOR UPDATE SKIP LOCKED) AS upper
            UNION ALL
            SELECT * FROM (
                SELECT t.slot, t.used_at, t.n FROM pgpool_limit_ticks AS t
                WHERE t.kind = l.kind AND t.scope = {ring} AND t.slot < l.tick_start
                  AND """ + _tick(_TICK_FREE) + """
                ORDER BY t.slot
                LIMIT """ + _ROWS_FOR + """
                FOR UPDATE SKIP LOCKED) AS lower
            LIMIT """ + _ROWS_FOR + """) AS t
        LIMIT {n}) AS t  -- the rows read may give more: numbered, sorted and left unused
    WHERE l.rate IS NOT NULL
    UNION ALL
    SELECT l.kind{scope}, NULL, NULL, generate_series(1, {n}) FROM {source} AS l
    WHERE l.rate IS NULL"""

#: The rows of the rings a limited claim used (``picked``: kind, scope, tick, base; tick
#: NULL for a kind without a rate), in ``taken`` with how many jobs each let start, and
#: ``used``: each stamped now() with its count (never back in time: `_TICK_FREE`). Goes
#: after ``picked`` in a WITH list. Format with ``rows``: how ``used`` finds them
#: (`_TAKEN_ROWS`, `_TAKEN_KIND_WIDE`).
_TICKS_USED: Final = """taken AS MATERIALIZED (
    SELECT kind, scope, tick, min(base) AS base, count(*)::int AS jobs FROM picked
    WHERE tick IS NOT NULL GROUP BY kind, scope, tick
), used AS (
    UPDATE pgpool_limit_ticks AS t SET used_at = now(), n = p.base + p.jobs
    {rows}
)"""

#: `_TICKS_USED`'s rows by key through arrays, as the jobs are (`_CLAIM_PICKED_SCOPED`): joined
#: to the ring instead, a generic plan hashed the whole ring at every claim.
_TAKEN_ROWS: Final = """FROM unnest(ARRAY(SELECT kind FROM taken ORDER BY kind, scope, tick),
                ARRAY(SELECT scope FROM taken ORDER BY kind, scope, tick),
                ARRAY(SELECT tick FROM taken ORDER BY kind, scope, tick),
                ARRAY(SELECT base FROM taken ORDER BY kind, scope, tick),
                ARRAY(SELECT jobs FROM taken ORDER BY kind, scope, tick))
        AS p(kind, scope, tick, base, jobs)
    WHERE t.kind = p.kind AND t.scope = p.scope AND t.slot = p.tick"""

#: `_TICKS_USED`'s rows when they are all of the kind-wide scope (`CLAIM_LIMITED`): joined
#: to ``taken``, bounded to that scope and the rows taken, so no plan reads a ring whole
#: (nor the per-tenant rings). Five sorted arrays cost a claim of 50 more than its update.
_TAKEN_KIND_WIDE: Final = """FROM taken AS p
    WHERE t.kind = p.kind AND t.scope = '' AND t.slot = p.tick
      AND t.slot = ANY(ARRAY(SELECT tick FROM taken))"""

#: `_TICKS_USED` for `CLAIM_LIMITED_PLAIN`, which may grant its host tokens
#: (`pgpool.host.grant`): a claim that came back full, its ring's last row taken with room
#: left for another claim of ``limit`` or more, grants up to ``grant`` jobs of that room
#: (0: none asked for) to start by ``now() + hold``, and stamps the row then, not now:
#: every job of the row's episode starts by its stamp, so its next episode (``per``
#: seconds after the stamp) shares no window with them. The tokens count in the row's
#: ``n`` as if they had started. Only the last row taken can have room left: a claim
#: fills its rows in order.
_TICKS_GRANTING: Final = """counted AS MATERIALIZED (
    SELECT kind, tick AS slot, min(base) AS base, count(*)::int AS jobs FROM picked
    WHERE tick IS NOT NULL GROUP BY kind, tick
), taken AS MATERIALIZED (
    SELECT c.kind, c.slot AS tick, c.base, c.jobs,
           CASE WHEN r.room >= %(limit)s AND (SELECT count(*) FROM picked) = %(limit)s
                THEN least(r.room, %(grant)s) ELSE 0 END AS granted
    FROM counted AS c JOIN lim AS l USING (kind)
    CROSS JOIN LATERAL (SELECT """ + _tick(_TICK_CAP, t="c") + """ - c.base - c.jobs AS room) AS r
), used AS (
    UPDATE pgpool_limit_ticks AS t
    SET used_at = CASE WHEN p.granted > 0 THEN now() + make_interval(secs => %(hold)s)
                       ELSE now() END,
        n = p.base + p.jobs + p.granted
    """ + _TAKEN_KIND_WIDE + """
)"""

#: The last two columns of each row of `CLAIM_LIMITED_PLAIN`: the tokens it granted its
#: host (`_TICKS_GRANTING`, 0 for none) and until when (the server's clock), which the
#: host's `CLAIM_GRANTED` sends back.
_GRANTED: Final = """,
          (SELECT coalesce(sum(granted), 0)::int FROM taken),
          now() + make_interval(secs => %(hold)s)
"""

#: What the update of a limited claim's jobs returns, as `CLAIM_PLAIN`'s.
_PICKED_ROWS: Final = """
RETURNING j.id, j.kind, j.queue, j.attempts, j.interruptions, j.max_attempts, j.payload,
          extract(epoch FROM now() - j.run_at)::float8, j.tenant, j.priority, j.snoozes,
          j.meta, j.group_id, """ + _RUN_AT_US.format(table="j")

#: The update of the jobs a kind-wide limited claim picked (``picked``: id, slot, NULL for
#: none, and max_attempts, the handler's from ``lim``), as `CLAIM_PLAIN`'s: the slot and
#: the attempt that holds it are written on the row, which is in the slots' unique index
#: while it runs that attempt and leaves it however it stops running. The rows are found
#: by ``id = ANY`` of the picked ids, one row of arrays sorted by id in the outer side: in
#: any plan one primary-key scan, as `CLAIM_PLAIN`'s; each row's slot and max_attempts are
#: at its id's place in them, found by binary search (``width_bucket``). Joined to
#: ``picked`` instead, a generic plan that guessed few rows rescanned the jobs once per
#: job (14 ms more for a claim of 1,000); through per-id key lookups, it cost 1.4 ms more.
#: Slot 0 stands for none: a NULL in an array makes each look-up in it walk from the start.
_CLAIM_PICKED: Final = """UPDATE pgpool_jobs AS j
SET """ + _CLAIM_SET.format(default="a.maxes[width_bucket(j.id, a.ids)]") + """,
    limit_slot = nullif(a.slots[width_bucket(j.id, a.ids)], 0),
    limit_attempt = CASE WHEN a.slots[width_bucket(j.id, a.ids)] > 0 THEN j.attempts + 1 END,
    limit_scope = NULL
FROM (SELECT array_agg(id ORDER BY id) AS ids,
             array_agg(coalesce(slot, 0) ORDER BY id) AS slots,
             array_agg(max_attempts ORDER BY id) AS maxes
      FROM picked) AS a
WHERE j.id = ANY(a.ids)""" + _PICKED_ROWS

#: `_CLAIM_PICKED` for a claim by tenant or by key (``picked`` has the ``scope`` each slot
#: is in): unnested from arrays sorted by id, each id looked up in the primary key in any
#: plan. (A scope is text: looked up by its place in an array of them, each look-up would
#: walk the array from the start.)
_CLAIM_PICKED_SCOPED: Final = """UPDATE pgpool_jobs AS j
SET """ + _CLAIM_SET.format(default="p.max_attempts") + """,
    limit_slot = p.slot,
    limit_attempt = CASE WHEN p.slot IS NOT NULL THEN j.attempts + 1 END,
    limit_scope = CASE WHEN p.slot IS NOT NULL THEN p.scope END
FROM unnest(ARRAY(SELECT id FROM picked ORDER BY id), ARRAY(SELECT slot FROM picked ORDER BY id),
            ARRAY(SELECT scope FROM picked ORDER BY id),
            ARRAY(SELECT max_attempts FROM picked ORDER BY id))
     AS p(id, slot, scope, max_attempts)
WHERE j.id = p.id""" + _PICKED_ROWS

#: That no running job of a kind-wide limit ``l``'s kind holds a slot above its
#: concurrency (the limit was lowered while they ran), nor a slot of a scope (its limit was
#: per tenant or per key while they started: `CLAIM_SCOPED`): until they are done, a free
#: slot below the limit is no proof of room.
_SLOTS_CLEAR: Final = """(
    NOT EXISTS (SELECT FROM pgpool_jobs AS r  -- a slot above a lowered limit
                WHERE r.kind = l.kind AND r.limit_scope IS NULL
                  AND r.limit_slot > l.concurrency AND """ + _HOLDS_SLOT.format(r="r") + """
                """ + _PROBE_EACH + """)
    AND NOT EXISTS (SELECT FROM pgpool_jobs AS r  -- a slot of a scope
                    WHERE r.kind = l.kind AND r.limit_scope IS NOT NULL
                      AND """ + _HOLDS_SLOT.format(r="r") + """ """ + _PROBE_EACH + """))"""

#: `_NEED_FAIR` for the kinds with a kind-wide limit (``limited_kinds``).
_LIMITED_NEED_FAIR: Final = _NEED_FAIR.replace("%(kinds)s", "%(limited_kinds)s")

#: The ready jobs a kind-wide limited claim may take (``candidates``: id, kind, priority,
#: run_at, and their rank in the kind, 1..): per (queue, kind), as many as the kind has
#: room (``rooms``: kind, room). With several queues each pair may find the whole room:
#: the claim takes the ranks up to it. Two ways, as the plain and fair claims
#: for the kinds without a limit, told apart once per claim (`_LIMITED_NEED_FAIR`, in
#: ``fair``, which `_PLAIN_NEXT` reads too):
#:
#: - while no job waiting in these kinds has a tenant or a concurrency key, from each
#:   pair's cursor (``after_*``, one per (queue, limited kind) pair, queues outer; NULL: a
#:   sweep), as `CLAIM_PLAIN` reads: with a pinned horizon, the dead entries of the jobs
#:   claimed since the last vacuum lie before the cursor, and a claim does not walk them;
#: - else from the start, on the ready index in its order (tenant, then claim order); a
#:   job whose concurrency key is running is skipped, and at most one per key is taken,
#:   as in `CLAIM`.
#:
#: Format with ``rooms``.
_LIMITED_CANDIDATES: Final = """fair AS MATERIALIZED (  -- read once: the branches, _PLAIN_NEXT
    SELECT EXISTS (""" + _LIMITED_NEED_FAIR + """) AS needed
), candidates AS (
    SELECT c.id, c.kind, c.priority, c.run_at,
           row_number() OVER (PARTITION BY c.kind ORDER BY c.priority DESC, c.run_at, c.id)
               AS rank
    FROM (
        SELECT c.id, r.kind, c.priority, c.run_at, NULL::text AS concurrency_key,
               1::bigint AS key_rank  -- from the cursors: no tenant, no key
        FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(queue, qn)
        CROSS JOIN {rooms} AS r
        CROSS JOIN LATERAL (
            SELECT (q.qn - 1) * cardinality(%(limited_kinds)s::text[])
                   + array_position(%(limited_kinds)s::text[], r.kind) AS n
        ) AS pair
        CROSS JOIN """ + _from_cursor("pair.n", "r.kind", "r.room") + """
        WHERE NOT (SELECT needed FROM fair)
        UNION ALL
        SELECT c.*, row_number() OVER (PARTITION BY c.concurrency_key
                                       ORDER BY c.priority DESC, c.run_at, c.id) AS key_rank
        FROM unnest(%(queues)s::text[]) AS q(queue) CROSS JOIN {rooms} AS r
        CROSS JOIN LATERAL (
            SELECT p.id, p.kind, p.priority, p.run_at, p.concurrency_key
            FROM pgpool_jobs AS p
            WHERE p.state = 'ready' AND p.queue = q.queue AND p.kind = r.kind
              AND p.run_at <= now()
              AND """ + _KEY_IDLE.format(p="p") + """
            ORDER BY p.tenant, p.priority DESC, p.run_at, p.id
            LIMIT r.room
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS c
        WHERE (SELECT needed FROM fair)
    ) AS c
    WHERE c.concurrency_key IS NULL OR c.key_rank = 1
)"""

#: ``picked`` of a kind-wide limited claim while no job waiting in its kinds has a tenant
#: or a concurrency key (`_LIMITED_NEED_FAIR`, read once: else it is empty, and the
#: claimer runs the claim with ``candidates``): per kind (``rooms``: kind, room and what
#: ``columns`` reads of it, alias ``r``), up to its room of ready jobs, its pairs' scans
#: from their cursors merged in claim order, each job numbered 1.. in ``n``; then
#: ``limit`` in all, in claim order, with ``columns``, each job's n-th slot and tick (any
#: one each job, so long as no two take the same). Without the fair branch, its window
#: over every kind's candidates and the join to the rooms, a claim of 50 far from a
#: concurrency limit costs 50 to 80 µs less (1,069 against 1,146, interleaved), and such
#: a kind drains at 0.905 of an unlimited one against 0.865 (medians of six rounds, in
#: turns); with a rate, the ring's rows are most of the cost (0.86 either way). Format
#: with ``rooms`` and ``columns``.
_LIMITED_PLAIN_PICKED: Final = """picked AS MATERIALIZED (
    SELECT c.id, {columns}
    FROM {rooms} AS r CROSS JOIN LATERAL (
        SELECT c.*, row_number() OVER () AS n FROM (
            SELECT c.id, c.priority, c.run_at
            FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(queue, qn)
            CROSS JOIN LATERAL (
                SELECT (q.qn - 1) * cardinality(%(limited_kinds)s::text[])
                       + array_position(%(limited_kinds)s::text[], r.kind) AS n
            ) AS pair
            CROSS JOIN """ + _from_cursor("pair.n", "r.kind", "r.room") + """
            ORDER BY c.priority DESC, c.run_at, c.id
            LIMIT r.room) AS c  -- several queues' scans may each find the whole room
    ) AS c
    WHERE NOT EXISTS (""" + _LIMITED_NEED_FAIR + """)  -- read once
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
)"""

#: The last column of each row of `CLAIM_SLOTS` and `CLAIM_LIMITED`: whether no job
#: waiting in their kinds had a tenant or a concurrency key as the claim began (its
#: snapshot: the jobs it took count), so that the next claim may be `CLAIM_SLOTS_PLAIN`
#: or `CLAIM_LIMITED_PLAIN`. On the safe side: after the claim that took the last such
#: job, one more whole claim.
_PLAIN_NEXT: Final = ",\n          NOT (SELECT needed FROM fair)\n"

#: The free slots of a kind-wide concurrency limit ``l`` (its kind, ``concurrency`` and
#: random ``start``), up to ``limit``, in ``slots``, in order. Far from the limit, from one
#: read: a window of twice ``limit`` slots (all of them for a limit up to that) placed at
#: ``start``, its held slots read in one range of the unique index, the rest free. With
#: fewer free than ``limit`` in a window narrower than the limit, each slot is probed from
#: ``start`` on (`_PROBED_SLOTS`): near the limit the free ones may be anywhere.
#: Side by side, a claim of 200 far from its limit: 140 µs less than probing each slot.
#: `_PROBED_SLOTS` of a kind-wide limit, up to the claim's ``limit``.
_KIND_WIDE_PROBED: Final = _PROBED_SLOTS.format(in_scope="IS NULL", n="%(limit)s")

_SLOTS_OF: Final = """
    SELECT CASE WHEN cardinality(w.slots) >= %(limit)s OR l.concurrency <= w.span
                THEN w.slots
                ELSE ARRAY(""" + _KIND_WIDE_PROBED + """) END AS slots
    FROM (
        SELECT g.span, ARRAY(SELECT s FROM generate_series(g.lo + 1, g.lo + g.span) AS s
                             WHERE s <> ALL (h.held) LIMIT %(limit)s) AS slots
        FROM (SELECT least(l.concurrency, 2 * %(limit)s) AS span,
                     l.start %% (l.concurrency - least(l.concurrency, 2 * %(limit)s) + 1)
                         AS lo) AS g
        CROSS JOIN LATERAL (SELECT ARRAY(
            SELECT r.limit_slot FROM pgpool_jobs AS r
            WHERE r.kind = l.kind AND r.limit_scope IS NULL
              AND r.limit_slot > g.lo AND r.limit_slot <= g.lo + g.span
              AND """ + _HOLDS_SLOT.format(r="r") + """) AS held
            OFFSET 0) AS h  -- read once, not once per slot
        OFFSET 0) AS w
    OFFSET 0"""  # each subquery run once: inlined, its array was built once per use

#: The first CTEs of `CLAIM_LIMITED` and `CLAIM_LIMITED_PLAIN`, ``lim`` to ``room``.
_LIMITED_ROOM: Final = """
WITH lim AS MATERIALIZED (
    SELECT l.kind, l.concurrency, l.rate, l.per, l.max_attempts,
           floor(random() * l.concurrency)::int AS start,
           floor(random() * """ + _tick(_RING) + """)::int + 1
               AS tick_start  -- once: lim is materialized
    FROM unnest(%(limited_kinds)s::text[], %(limited_concurrency)s::int[],
                %(limited_rate)s::int[], %(limited_per)s::float8[],
                %(limited_max_attempts)s::int[])
         AS l(kind, concurrency, rate, per, max_attempts)
    WHERE l.concurrency IS NULL OR """ + _SLOTS_CLEAR + """
), free AS MATERIALIZED (  -- a row per kind: its free slots (NULL: no concurrency limit)
    SELECT l.kind, l.max_attempts, CASE WHEN l.concurrency IS NOT NULL THEN f.slots END AS slots
    FROM lim AS l CROSS JOIN LATERAL (""" + _SLOTS_OF + """) AS f
), ticks AS MATERIALIZED (""" + _FREE_TICKS.format(
    scope="", source="lim", ring="''", n="%(limit)s") + """
), room AS MATERIALIZED (  -- a row per kind: the n-th free slot and tick for its n-th job
    SELECT f.kind, f.max_attempts, f.slots, t.ticks, t.bases,
           least(coalesce(cardinality(t.ticks), 0),  -- none free: no rows to aggregate
                 coalesce(cardinality(f.slots), %(limit)s)) AS room
    FROM free AS f CROSS JOIN LATERAL (
        SELECT array_agg(t.slot ORDER BY t.rank) AS ticks,
               array_agg(t.base ORDER BY t.rank) AS bases
        FROM ticks AS t WHERE t.kind = f.kind) AS t
)"""

#: The claim of the kinds with a kind-wide limit (`pgpool.limits`): up to ``limit`` ready
#: jobs of the given queues and of ``limited_kinds``, each taking a free slot of its kind's
#: concurrency limit (``limited_concurrency``, NULL for none), so that at most that many
#: run at once in the fleet, and a row of its kind's rate ring (``limited_rate`` rows used
#: at most once per ``limited_per`` seconds, NULL for none). Locking, the update and the
#: rows as in `CLAIM_PLAIN` (its jobs' ``max_attempts`` from ``limited_max_attempts``).
#: The plain and fair claims never see these kinds (the claimer leaves them out of their
#: ``kinds``): a kind without a limit reads nothing of this.
#:
#: - ``lim``: a kind whose running jobs hold a slot above its concurrency limit (the limit
#:   was lowered while they ran), or a slot of a scope (its limit was per tenant or per key
#:   while they started: `CLAIM_SCOPED`), takes nothing until they are done: until then,
#:   a free slot below the limit is no proof of room.
#: - ``free``: a row per kind, its free slots, up to ``limit`` of them, in an array
#:   (`_SLOTS_OF`; NULL without a concurrency limit), from a random start, so that claims
#:   racing (two claim loops, other hosts) rarely try the same slots when there are many;
#:   with few, they may, and the unique index makes the second one fail whole: the
#:   claimer tries again (`pgpool.host.claimer`), and then sees the slot taken. A slot
#:   whose job stopped running since this statement's snapshot looks taken: the next
#:   claim has it.
#: - ``ticks``: the rows of the kind's rate ring (its scope '') free now, up to ``limit``
#:   (`_FREE_TICKS`): racing claims start apart, and a claim walks past the rows used in
#:   the window only as far as it takes, a few when the rate is far from reached, more as
#:   it nears it. Locked SKIP LOCKED: racing claims take different rows, and a row a claim
#:   used since this statement's snapshot is checked again once locked (read committed),
#:   so it is not taken twice in a window. The random start is drawn once, in ``lim``
#:   (materialized): drawn in each scan, the two could overlap and hand one row out twice.
#: - ``candidates``: per (queue, kind), as many ready jobs as the kind has room (free slots
#:   and ticks), on the ready index in its order (tenant, then claim order); a job whose
#:   concurrency key is running is skipped, and at most one per key is taken, as in `CLAIM`.
#: - ``room``: a row per kind, its free slots and its ticks in arrays, the n-th of each for
#:   its n-th job, and its room, as many as both give.
#: - ``picked``: the n-th job of a kind gets its n-th free slot and tick; ``limit`` in all,
#:   in claim order (`_CLAIM_PICKED`). Each tick taken is set to now() (`_TICKS_USED`).
#:   A row per kind and arrays, not a row per slot joined on (kind, rank): the generic
#:   plan merged those on the kind alone, every job against every slot (4.6 ms a claim of
#:   200, where this takes 1.2).
#:
#: The claimer prepares it: planned at each claim, planning was most of its cost. It
#: runs it while a job waiting in its kinds has a tenant or a concurrency key, and
#: `CLAIM_LIMITED_PLAIN` (the same first CTEs, `_LIMITED_ROOM`) while none has: each row
#: ends with whether none has now (`_PLAIN_NEXT`).
CLAIM_LIMITED: Final = _LIMITED_ROOM + """, """ + _LIMITED_CANDIDATES.format(
    rooms="room") + """, picked AS MATERIALIZED (
    SELECT c.id, c.kind, ''::text AS scope,  -- the kind-wide scope
           r.slots[c.rank] AS slot, r.ticks[c.rank] AS tick, r.bases[c.rank] AS base,
           r.max_attempts
    FROM candidates AS c JOIN room AS r USING (kind)
    WHERE c.rank <= r.room  -- several queues' scans may each find the whole room
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
), """ + _TICKS_USED.format(rows=_TAKEN_KIND_WIDE) + """
""" + _CLAIM_PICKED + _PLAIN_NEXT

#: `CLAIM_LIMITED` while no job waiting in its kinds has a tenant or a concurrency key
#: (`_LIMITED_PLAIN_PICKED`): the claimer's first choice, as `CLAIM_PLAIN` is for the
#: kinds without a limit.
CLAIM_LIMITED_PLAIN: Final = _LIMITED_ROOM + """, """ + _LIMITED_PLAIN_PICKED.format(
    rooms="room", columns="""r.kind, r.slots[c.n] AS slot,
           r.ticks[c.n] AS tick, r.bases[c.n] AS base, r.max_attempts""") + """, """ + \
    _TICKS_GRANTING + """
""" + _CLAIM_PICKED + _GRANTED

#: The claim of a kind with a kind-wide rate and no concurrency limit (``limited_kinds``:
#: that one kind) from the tokens its host was granted (`_TICKS_GRANTING`): up to
#: ``limit`` of its ready jobs (the tokens left, at most the batch), as
#: `CLAIM_LIMITED_PLAIN` takes them, if this claim's now() is no later than ``until``
#: (else none: the host claims from the ring again). It reads and writes no ring row: a
#: rate far from reached costs the claims that spend a grant what an unlimited kind's
#: cost. Only while no job waiting in the kind has a tenant or a concurrency key, as
#: `CLAIM_LIMITED_PLAIN`.
CLAIM_GRANTED: Final = """
WITH room AS MATERIALIZED (
    SELECT l.kind, %(limit)s::int AS room, l.max_attempts
    FROM unnest(%(limited_kinds)s::text[], %(limited_max_attempts)s::int[])
         AS l(kind, max_attempts)
    WHERE now() <= %(until)s::timestamptz
), """ + _LIMITED_PLAIN_PICKED.format(rooms="room",
                                       columns="NULL::int AS slot, r.max_attempts") + """
""" + _CLAIM_PICKED + "\n"

#: The first CTEs of `CLAIM_SLOTS` and `CLAIM_SLOTS_PLAIN`, ``lim`` and ``free``.
_SLOTS_ROOM: Final = """
WITH lim AS MATERIALIZED (
    SELECT l.kind, l.concurrency, l.max_attempts,
           floor(random() * l.concurrency)::int AS start  -- once: lim is materialized
    FROM unnest(%(limited_kinds)s::text[], %(limited_concurrency)s::int[],
                %(limited_max_attempts)s::int[]) AS l(kind, concurrency, max_attempts)
    WHERE """ + _SLOTS_CLEAR + """
), free AS MATERIALIZED (  -- a row per kind: its free slots, and how many
    SELECT l.kind, l.max_attempts, f.slots, cardinality(f.slots) AS room
    FROM lim AS l CROSS JOIN LATERAL (""" + _SLOTS_OF + """) AS f
)"""

#: `CLAIM_LIMITED` for kinds whose kind-wide limits all have a concurrency and no rate
#: (``limited_kinds``, ``limited_concurrency``, ``limited_max_attempts``): the same rows,
#: without the rate's ring, and leaner: ``free`` is a row per kind, its free slots in an
#: array (`_SLOTS_OF`) and their count, the room; the n-th job of a kind gets the n-th. A
#: claim of 50 far from its limit: the plain claim's 863 µs, this one's 1,082 (the slots'
#: unique index is most of the difference), 1,212 before; side by side, embedded
#: PostgreSQL 18. Prepared, with a generic plan, as `CLAIM_LIMITED` is, and like it run
#: only while a job waiting in its kinds has a tenant or a concurrency key (its last
#: column: `_PLAIN_NEXT`); `CLAIM_SLOTS_PLAIN` runs otherwise.
CLAIM_SLOTS: Final = _SLOTS_ROOM + """, """ + _LIMITED_CANDIDATES.format(
    rooms="free") + """, picked AS MATERIALIZED (
    SELECT c.id, s.slots[c.rank] AS slot, s.max_attempts
    FROM candidates AS c JOIN free AS s USING (kind)
    WHERE c.rank <= s.room  -- several queues' scans may each find the whole room
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
)
""" + _CLAIM_PICKED + _PLAIN_NEXT

#: `CLAIM_SLOTS` while no job waiting in its kinds has a tenant or a concurrency key, as
#: `CLAIM_LIMITED_PLAIN` is `CLAIM_LIMITED`'s.
CLAIM_SLOTS_PLAIN: Final = _SLOTS_ROOM + """, """ + _LIMITED_PLAIN_PICKED.format(
    rooms="free", columns="r.slots[c.n] AS slot, r.max_attempts") + """
""" + _CLAIM_PICKED + "\n"

#: The scope of a job ``p`` under a limit ``l`` by tenant or by concurrency key: the
#: pgpool_jobs.limit_scope its slot is in, and its ring's pgpool_limit_ticks.scope.
_SCOPE_OF: Final = ("CASE {l}.by WHEN 'tenant' THEN 'tenant:' || {p}.tenant "
                    "ELSE 'key:' || coalesce({p}.concurrency_key, '') END")

#: The claim of the kinds with a limit by tenant or by concurrency key (`pgpool.limits`):
#: `CLAIM_LIMITED`'s, with a concurrency limit and a rate ring per scope (`_SCOPE_OF`; the
#: jobs without a tenant, or a key, share one), up to ``limit`` ready jobs of the given
#: queues and of ``scoped_kinds`` (``scoped_by``: 'tenant' or 'concurrency_key'). The rows
#: of `CLAIM_LIMITED`, each with two more: where the next claim's walk starts (the
#: claimer's cursor ``after``), and how many rows of rings this claim made (the scopes it
#: found waiting without one: the next claim can use them); with no job claimed, one row
#: with them alone (its job's columns NULL).
#:
#: - ``lim``: a kind whose running jobs hold slots kind-wide, or of scopes of the other
#:   ``by`` (the limit changed while they ran: two range probes, the scopes of each way
#:   begin with their own prefix), takes nothing until they are done.
#: - ``walk``: a loose index scan of the tenants with ready jobs in each pair, from the
#:   cursor on, wrapping round, until the rooms it guessed fill the batch, `SCOPE_WALK` at
#:   most: its cost follows the tenants it needs, never a tenant's backlog (as `CLAIM`'s
#:   walk). By tenant, each one's room is read without locking: its concurrency limit less
#:   its held slots, its ring's free rows (at most ``limit``). A tenant at its limit gets
#:   no jobs looked at, so it holds nobody else up; a guess too high costs only jobs locked
#:   and let go. By key, the batch: keys are met job by job.
#: - ``wants``: the tenants with room, in walk order, each with as many jobs as it has room
#:   for, up to what the batch has left: a claim locks about ``limit`` rows of each sort.
#: - ``candidates``: those jobs, on the ready index in claim order; a job whose concurrency
#:   key is running is skipped (as in `CLAIM`), and by key, so is one whose scope is full:
#:   its ring has no free row, or, without a key, the keyless scope's slots are all held.
#: - ``scopes``: each candidates' scope, unless a slot above a lowered limit is held in it;
#:   then its free slots (`_FREE_SLOTS`, on pgpool_jobs_limit_scoped_running) and free
#:   ticks (`_FREE_TICKS`, its ring), as many as it has candidates, locked as in
#:   `CLAIM_LIMITED`: the unique index holds the concurrency per scope, the ring the rate.
#: - ``rings``: a ring of ``rate`` rows for each scope walked or met that lacks its last
#:   row (new, or its rate raised), `RING_ROWS` rows at most past the first ring, in key
#:   order (two claims adding the same rings wait on each other rather than deadlock,
#:   mostly; a deadlock is a lost race, tried again).
#: - ``picked``: the n-th job of a scope gets its n-th free slot and tick; ``limit`` in
#:   all, the first of every scope first (`_CLAIM_PICKED_SCOPED`).
CLAIM_SCOPED: Final = """
WITH RECURSIVE lim AS MATERIALIZED (
    SELECT l.kind, l.by, l.concurrency, l.rate, l.per, l.max_attempts,
           l.by = 'concurrency_key' AND l.concurrency IS NOT NULL  -- the keyless scope
           AND l.concurrency <= (                                   -- is full
               SELECT count(*) FROM (
                   SELECT FROM pgpool_jobs AS r
                   WHERE r.kind = l.kind AND r.limit_scope = 'key:'
                     AND """ + _HOLDS_SLOT.format(r="r") + """ LIMIT l.concurrency) AS h
           ) AS keyless_full
    FROM unnest(%(scoped_kinds)s::text[], %(scoped_by)s::text[],
                %(scoped_concurrency)s::int[], %(scoped_rate)s::int[],
                %(scoped_per)s::float8[], %(scoped_max_attempts)s::int[])
         AS l(kind, by, concurrency, rate, per, max_attempts)
    CROSS JOIN LATERAL (  -- the prefix of the other way's scopes, and the end of its range
        SELECT CASE l.by WHEN 'tenant' THEN 'key:' ELSE 'tenant:' END AS other,
               CASE l.by WHEN 'tenant' THEN 'key;' ELSE 'tenant;' END AS past) AS o
    WHERE l.concurrency IS NULL
       OR NOT EXISTS (SELECT FROM pgpool_jobs AS r  -- slots held kind-wide
                      WHERE r.kind = l.kind AND r.limit_scope IS NULL
                        AND r.limit_slot IS NOT NULL AND """ + _HOLDS_SLOT.format(r="r") + """
                      """ + _PROBE_EACH + """)
      AND NOT EXISTS (SELECT FROM pgpool_jobs AS r  -- slots held by the other way
                      WHERE r.kind = l.kind AND r.limit_scope >= o.other
                        AND r.limit_scope < o.past AND """ + _HOLDS_SLOT.format(r="r") + """
                      """ + _PROBE_EACH + """)
), walk AS (  -- the tenants with ready jobs, from the cursor on, wrapping round, each
              -- with its room guessed, until the batch is full
    SELECT q.queue, l.kind, %(after)s::text COLLATE "C" AS tenant,
           NULL::text COLLATE "C" AS first, 0 AS n,  -- n = 0: the cursor, not a tenant
           0::bigint AS room, 0::bigint AS got
    FROM unnest(%(queues)s::text[]) AS q(queue) CROSS JOIN lim AS l
    UNION ALL
    SELECT w.queue, w.kind, x.tenant, coalesce(w.first, x.tenant), w.n + 1, g.room,
           w.got + greatest(g.room, 0)
    FROM walk AS w JOIN lim AS l ON l.kind = w.kind
    CROSS JOIN LATERAL (SELECT coalesce(
        (SELECT tenant FROM pgpool_jobs
         WHERE state = 'ready' AND queue = w.queue AND kind = w.kind AND tenant > w.tenant
         ORDER BY tenant, priority DESC, run_at, id LIMIT 1),
        (SELECT tenant FROM pgpool_jobs  -- past the last one: round to the first
         WHERE state = 'ready' AND queue = w.queue AND kind = w.kind
         ORDER BY tenant, priority DESC, run_at, id LIMIT 1)) AS tenant) AS x
    CROSS JOIN LATERAL (  -- by tenant: its room, unlocked; by key: the batch
        SELECT CASE WHEN l.by <> 'tenant' THEN %(limit)s ELSE least(%(limit)s,
            l.concurrency - (SELECT count(*) FROM (
                SELECT FROM pgpool_jobs AS r
                WHERE r.kind = l.kind AND r.limit_scope = 'tenant:' || x.tenant
                  AND """ + _HOLDS_SLOT.format(r="r") + """ LIMIT l.concurrency) AS h),
            CASE WHEN l.rate IS NOT NULL THEN (SELECT coalesce(sum(f.room), 0) FROM (
                SELECT """ + _tick(_TICK_ROOM) + """ AS room FROM pgpool_limit_ticks AS t
                WHERE t.kind = l.kind AND t.scope = 'tenant:' || x.tenant
                  AND t.slot <= """ + _tick(_RING) + """ AND """ + _tick(_TICK_FREE) + """
                LIMIT %(limit)s) AS f) END) END AS room
        OFFSET 0) AS g  -- not inlined: its subqueries run once per tenant, not per use
    WHERE x.tenant IS NOT NULL AND x.tenant IS DISTINCT FROM w.first AND w.n < %(walk)s
      AND w.got < %(limit)s
), wants AS (  -- in walk order, the tenants with room: as many jobs as the batch has left
    SELECT queue, kind, tenant, n, least(room, %(limit)s - before) AS want
    FROM (SELECT *, coalesce(sum(room) OVER (ORDER BY n, queue, kind ROWS BETWEEN
                                             UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
          FROM walk WHERE n > 0 AND room > 0) AS g
    WHERE before < %(limit)s
), candidates AS (
    SELECT c.*, """ + _SCOPE_OF.format(l="l", p="c") + """ AS scope,
           row_number() OVER (PARTITION BY c.concurrency_key
                              ORDER BY c.priority DESC, c.run_at, c.id) AS key_rank
    FROM wants AS w JOIN lim AS l USING (kind)
    CROSS JOIN LATERAL (
        SELECT p.id, p.kind, p.tenant, p.priority, p.run_at, p.concurrency_key
        FROM pgpool_jobs AS p
        WHERE p.state = 'ready' AND p.queue = w.queue AND p.kind = w.kind
          AND p.tenant = w.tenant AND p.run_at <= now()
          AND """ + _KEY_IDLE.format(p="p") + """
          AND (l.by = 'tenant' OR (  -- by key: a scope that can give a job now
               (p.concurrency_key IS NOT NULL OR NOT l.keyless_full)
               AND (l.rate IS NULL
                    OR EXISTS (SELECT FROM pgpool_limit_ticks AS t
                               WHERE t.kind = l.kind
                                 AND t.scope = 'key:' || coalesce(p.concurrency_key, '')
                                 AND t.slot <= """ + _tick(_RING) + """
                                 AND """ + _tick(_TICK_FREE) + """)
                    OR NOT EXISTS (SELECT FROM pgpool_limit_ticks AS t  -- no ring yet
                                   WHERE t.kind = l.kind
                                     AND t.scope = 'key:' || coalesce(p.concurrency_key, '')
                                  ))))
        ORDER BY p.priority DESC, p.run_at, p.id
        LIMIT w.want
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.kind, c.scope
                                   ORDER BY c.priority DESC, c.run_at, c.id) AS rank
    FROM candidates AS c WHERE c.concurrency_key IS NULL OR c.key_rank = 1
), scopes AS MATERIALIZED (
    SELECT c.kind, c.scope, count(*)::int AS n, l.concurrency, l.rate, l.per,
           floor(random() * l.concurrency)::int AS start,
           floor(random() * """ + _tick(_RING) + """)::int + 1
               AS tick_start  -- once: scopes is materialized
    FROM ranked AS c JOIN lim AS l USING (kind)
    WHERE l.concurrency IS NULL
       OR NOT EXISTS (SELECT FROM pgpool_jobs AS r  -- a slot above a lowered limit
                      WHERE r.kind = c.kind AND r.limit_scope = c.scope
                        AND r.limit_slot > l.concurrency AND """ + _HOLDS_SLOT.format(r="r") + """
                      """ + _PROBE_EACH + """)
    GROUP BY c.kind, c.scope, l.concurrency, l.rate, l.per
), free AS MATERIALIZED (""" + _FREE_SLOTS.format(
    scope=", l.scope", source="scopes", in_scope="= l.scope", n="l.n") + """
), ticks AS MATERIALIZED (""" + _FREE_TICKS.format(
    scope=", l.scope", source="scopes", ring="l.scope", n="l.n") + """
), room AS MATERIALIZED (  -- the n-th free slot with the n-th tick, per scope
    SELECT kind, scope, rank, f.slot, t.slot AS tick, t.base
    FROM free AS f JOIN ticks AS t USING (kind, scope, rank)
), rings AS (  -- a ring for each scope walked or met without its last row, a bounded few
    INSERT INTO pgpool_limit_ticks (kind, scope, slot)
    SELECT m.kind, m.scope, generate_series(1, m.ring)
    FROM (SELECT s.kind, s.scope, """ + _tick(_RING) + """ AS ring,
                 sum(""" + _tick(_RING) + """) OVER (ORDER BY s.kind, s.scope)
                 - """ + _tick(_RING) + """ AS before
          FROM (SELECT kind, 'tenant:' || tenant AS scope FROM walk WHERE n > 0
                UNION SELECT kind, scope FROM ranked) AS s
          JOIN lim AS l USING (kind)
          WHERE l.rate IS NOT NULL
            AND NOT EXISTS (SELECT FROM pgpool_limit_ticks AS t
                            WHERE t.kind = s.kind AND t.scope = s.scope
                              AND t.slot = """ + _tick(_RING) + """)
            AND (l.by = 'tenant') = (s.scope LIKE 'tenant:%%')) AS m
    WHERE m.before < """ + str(RING_ROWS) + """
    ORDER BY 1, 2, 3
    ON CONFLICT DO NOTHING
    RETURNING 1
), picked AS MATERIALIZED (
    SELECT c.id, c.kind, c.scope, m.slot, m.tick, m.base, l.max_attempts
    FROM ranked AS c JOIN room AS m USING (kind, scope, rank) JOIN lim AS l USING (kind)
    ORDER BY c.rank, c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
), """ + _TICKS_USED.format(rows=_TAKEN_ROWS) + """, claimed AS (
""" + _CLAIM_PICKED_SCOPED + """
)
SELECT c.*, x.after, x.rings
FROM (SELECT coalesce((SELECT tenant FROM wants ORDER BY n DESC LIMIT 1),
                      (SELECT tenant FROM walk ORDER BY n DESC LIMIT 1)) AS after,
             (SELECT count(*) FROM rings) AS rings) AS x
LEFT JOIN claimed AS c ON true
"""

#: The rows of the rate rings the claimer's kinds need (`CLAIM_LIMITED`): ``rates``
#: rows per kind of ``rate_kinds``, added unless there (never used: free at once).
ENSURE_TICKS: Final = """
INSERT INTO pgpool_limit_ticks (kind, slot)
SELECT r.kind, generate_series(1, """ + _tick(_RING, l="r") + """)
FROM unnest(%(rate_kinds)s::text[], %(rates)s::int[]) AS r(kind, rate)
ON CONFLICT DO NOTHING
"""
#: After `ENSURE_TICKS` added rows: the rings' statistics (see `pgpool.host.claimer`).
ANALYZE_TICKS: Final = "ANALYZE pgpool_limit_ticks"

#: Delete the rings of scopes (`CLAIM_SCOPED`) whose rows were all last used ``idle``
#: seconds ago or more (`pgpool.host.parts.retention`, with the longest window there is:
#: such a ring is as good as a new one, which the next claim that needs it makes), whole
#: rings, in key order, until ``limit`` rows (or one ring). Whole or not at all: a ring's
#: rows are locked SKIP LOCKED and read again, and a ring is deleted only if every one of
#: them was locked and still idle (a claim that holds one, or used one since, keeps it:
#: a ring with holes would slow its scope, and the claims check only its last row).
#: Kind-wide rings (scope '') are kept: only a host's start makes them. How many rows went.
PRUNE_TICKS: Final = """
WITH idle AS (
    SELECT kind, scope, count(*) AS n FROM pgpool_limit_ticks
    WHERE scope <> ''
    GROUP BY kind, scope
    HAVING max(used_at) <= now() - make_interval(secs => %(idle)s)
), batch AS (
    SELECT kind, scope, n
    FROM (SELECT kind, scope, n, sum(n) OVER (ORDER BY kind, scope) - n AS before
          FROM idle) AS i
    WHERE before < %(limit)s
), locked AS (
    SELECT t.kind, t.scope, t.used_at FROM pgpool_limit_ticks AS t
    JOIN batch AS b USING (kind, scope)
    FOR UPDATE OF t SKIP LOCKED
), whole AS (
    SELECT l.kind, l.scope FROM locked AS l JOIN batch AS b USING (kind, scope)
    GROUP BY l.kind, l.scope, b.n
    HAVING count(*) = b.n AND max(l.used_at) <= now() - make_interval(secs => %(idle)s)
), gone AS (
    DELETE FROM pgpool_limit_ticks AS t USING whole AS w
    WHERE t.kind = w.kind AND t.scope = w.scope
    RETURNING 1
)
SELECT count(*) FROM gone
"""

#: After an ack flush that ended jobs of limited kinds (`pgpool.host.dispatcher`): wake the
#: hosts of their ``queues``, whose claims may have been waiting on those slots.
NOTIFY_FREED: Final = ("SELECT pg_notify(" + OUR_CHANNEL
                       + ", q) FROM unnest(%(queues)s::text[]) AS q")

#: Jobs of the given queues and kinds that any host (this one too) is running now, or that
#: are ready and due in the queues it serves (``serving``), and when the last lease of those
#: running ends: a burst host is not drained while any could still come back to it. The
#: ready ones count too because another reaper (the elected one, another host's) may
#: return an expired job between this host's last claim, which skipped it while that
#: reaper held its row, and this look, which would no longer see it running.
RUNNING: Final = """
SELECT count(*), max(lease_until) FILTER (WHERE state = 'running') - now() FROM pgpool_jobs
WHERE kind = ANY(%(kinds)s::text[])
  AND (state = 'running' AND queue = ANY(%(queues)s::text[])
       OR state = 'ready' AND run_at <= now() AND queue = ANY(%(serving)s::text[]))
"""

#: Ready jobs of the given queues and of ``limited_kinds``: after a limited claim that took
#: none of them, they wait on their kind's limit (a burst host waits with them).
LIMITED_WAITING: Final = """
SELECT count(*) FROM pgpool_jobs
WHERE state = 'ready' AND queue = ANY(%(queues)s::text[])
  AND kind = ANY(%(limited_kinds)s::text[])
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

# The arms of a grouped ack that every flush with a failure has: delete succeeded jobs,
# reschedule failures (scheduled, or ready when their delay is 0), hand back unstarted jobs,
# return attempts cut off by this host's shutdown (ready now, not counted:
# ``interruptions`` + 1). Format both with ``done``: what the done arm returns.
_DONE_ARM: Final = """
WITH done AS (
    DELETE FROM pgpool_jobs AS j
    USING unnest(%(done_ids)s::bigint[], %(done_attempts)s::int[],
                 array_fill(%(owner)s::text, ARRAY[cardinality(%(done_ids)s::bigint[])]))
          AS a(id, attempt, owner)
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING {done}
)"""
_ACK_ARMS: Final = _DONE_ARM + """, retried AS (
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
)"""

# Snoozed attempts (`ACK_CONTROL` only): scheduled again after their delay (always above
# 0), not counted (``snoozes`` + 1); ``last_error`` is left as it was: a snooze is no error.
_SNOOZED: Final = """, snoozed AS (
    UPDATE pgpool_jobs AS j
    SET state = 'scheduled', locked_by = NULL, lease_until = NULL,
        run_at = now() + make_interval(secs => a.delay), snoozes = j.snoozes + 1
    FROM unnest(%(snooze_ids)s::bigint[], %(snooze_attempts)s::int[],
                array_fill(%(owner)s::text, ARRAY[cardinality(%(snooze_ids)s::bigint[])]),
                %(snooze_delays)s::float8[])
         AS a(id, attempt, owner, delay)
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING j.id
)"""


def _buried(reasons: bool) -> str:
    """The arms that move jobs to pgpool_dead, each with its error (and, with ``reasons``,
    its ``pgpool_dead.reason``; else the column's default, 'failed')."""
    reasons_in, reason, a_reason = ((", %(dead_reasons)s::text[]", ", reason", ", a.reason")
                                    if reasons else ("", "", ""))
    return f""", buried AS (
    DELETE FROM pgpool_jobs AS j
    USING unnest(%(dead_ids)s::bigint[], %(dead_attempts)s::int[],
                 array_fill(%(owner)s::text, ARRAY[cardinality(%(dead_ids)s::bigint[])]),
                 %(dead_errors)s::text[]{reasons_in})
          AS a(id, attempt, owner, error{reason})
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempts, j.interruptions,
              j.snoozes, j.max_attempts, j.unique_key, j.created_at, j.tenant,
              j.concurrency_key, j.meta, j.group_id, a.error{a_reason}
), dead AS (
    INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, interruptions,
                             snoozes, max_attempts, unique_key, created_at, tenant,
                             concurrency_key, meta, group_id, last_error{reason})
    SELECT id, queue, kind, payload, priority, attempts, interruptions, snoozes,
           max_attempts, unique_key, created_at, tenant, concurrency_key, meta, group_id,
           error{reason}
    FROM buried
    RETURNING id
)"""


_COUNTS: Final = """
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM retried),
       (SELECT count(*) FROM released), (SELECT count(*) FROM interrupted),
       (SELECT count(*) FROM dead)"""

#: One grouped ack: delete succeeded jobs, reschedule failures (scheduled, or ready when
#: their delay is 0), hand back unstarted jobs, return attempts cut off by this host's
#: shutdown (ready now, not counted: ``interruptions`` + 1) and move exhausted jobs to
#: pgpool_dead (reason 'failed'). Each arm is guarded by ownership. Returns how many rows
#: each arm changed. A hand-back is ready at once and not counted either
#: (``interruptions`` + 1): it keeps ``attempts``, so the next claim's (owner, attempt) is a
#: new one, which the same hand-back sent again (its first answer lost, its commit not)
#: cannot match.
ACK: Final = _ACK_ARMS.format(done="j.id") + _buried(reasons=False) + _COUNTS + "\n"

#: `ACK` for a flush that holds what a handler asked for (`pgpool.retry.Control`): snoozes
#: (scheduled after their delay, ``snoozes`` + 1, not counted), and dead letters with a
#: reason each (``dead_reasons``: 'failed', 'discarded', 'cancelled'). Its counts are
#: `ACK`'s and then the snoozed. A flush without any runs `ACK`, which pays for neither.
ACK_CONTROL: Final = (_ACK_ARMS.format(done="j.id") + _SNOOZED + _buried(reasons=True)
                      + _COUNTS + ",\n       (SELECT count(*) FROM snoozed)\n")

# What a flush that records outcomes adds (`ACK_OUTCOMES`, `ACK_KEPT`): each kept job's
# record in ``pgpool_done``, with its result (JSON text or NULL) and ``keep_until`` from its
# seconds to keep; and the follow-up jobs of each attempt whose success the statement
# records (its job deleted here: owned, this attempt), and of no other: an attempt that
# failed, or whose lease was lost, leaves none, and the same ack written again (its first
# answer lost) finds its job gone and adds none. Records and follow-ups are matched to the
# deleted job by (id, attempt): a host may hold a stale ack of an earlier attempt of the
# same job in the same flush (it could not write it, lost the lease, and ran the job
# again). No ON CONFLICT on the record: so matched, a job's id goes in once, and the check
# cost a tenth of the flush.
_KEPT_AND_FOLLOWED: Final = """, kept AS (
    INSERT INTO pgpool_done (id, queue, kind, tenant, attempts, created_at, keep_until,
                             result, group_id)
    SELECT d.id, d.queue, d.kind, d.tenant, d.attempts, d.created_at,
           now() + make_interval(secs => k.seconds), k.result::jsonb, d.group_id
    FROM done AS d
    JOIN unnest(%(kept_ids)s::bigint[], %(kept_attempts)s::int[], %(kept_seconds)s::float8[],
                %(kept_results)s::text[])
         AS k(id, attempt, seconds, result) ON k.id = d.id AND k.attempt = d.attempts
    RETURNING id
), followed AS (
    INSERT INTO pgpool_jobs (queue, kind, payload, priority, run_at, state, max_attempts,
                             unique_key, tenant, concurrency_key)
    SELECT f.queue, f.kind, f.payload::jsonb, f.priority, due.at,
           CASE WHEN due.at <= now() THEN 'ready' ELSE 'scheduled' END,
           f.max_attempts, f.unique_key, f.tenant, f.concurrency_key
    FROM unnest(%(follow_parents)s::bigint[], %(follow_attempts)s::int[],
                %(follow_queues)s::text[],
                %(follow_kinds)s::text[], %(follow_payloads)s::text[],
                %(follow_priorities)s::int[], %(follow_run_at)s::float8[],
                %(follow_delays)s::float8[], %(follow_max_attempts)s::int[],
                %(follow_unique_keys)s::text[], %(follow_tenants)s::text[],
                %(follow_concurrency_keys)s::text[])
         AS f(parent, attempt, queue, kind, payload, priority, run_at, delay, max_attempts,
              unique_key, tenant, concurrency_key)
    CROSS JOIN LATERAL (
        SELECT coalesce(to_timestamp(f.run_at), now() + make_interval(secs => f.delay)) AS at
    ) AS due
    WHERE (f.parent, f.attempt) IN (SELECT id, attempts FROM done)
    ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING queue, state
)"""

#: The columns that end `ACK_OUTCOMES` and `ACK_KEPT`: the queues told (of the follow-ups,
#: and of the callbacks `COUNT_MEMBERS` made ready), the waiters told, and the (id,
#: attempt) pairs whose success the statement recorded.
_OUTCOMES_TAIL: Final = """,
       (SELECT count(pg_notify(""" + OUR_CHANNEL + """, q)) FROM (
            SELECT DISTINCT CASE WHEN state = 'ready' THEN queue ELSE '""" + STAGE + """' END
            FROM (SELECT queue, state FROM followed
                  UNION ALL SELECT queue, 'ready' FROM called) AS w(queue, state)) AS n(q)),
       {finished},
       ARRAY(SELECT ARRAY[id, attempts] FROM done)
"""
_DONE_RECORDED: Final = "j.id, j.queue, j.kind, j.tenant, j.attempts, j.created_at, j.group_id"

#: `ACK_CONTROL` for a flush that holds an outcome to record (`pgpool.host.completer`): a job
#: whose kind or host keeps outcomes, a member of a group, or an attempt that enqueued
#: follow-ups. In the same statement, so all of it or none: the records and follow-ups
#: (`_KEPT_AND_FOLLOWED`), the groups' counts (`COUNT_MEMBERS`) of the members done or dead
#: here, the callbacks made ready, and the waiters woken (`notify_finished`).
#:
#: Returns `ACK_CONTROL`'s counts, then the queues told, the waiters told, and the (id,
#: attempt) pairs whose success it recorded (for their follow-up groups, written next in
#: the same transaction: `ENQUEUE_GROUP`).
ACK_OUTCOMES: Final = (
    _ACK_ARMS.format(done=_DONE_RECORDED) + _SNOOZED + _buried(reasons=True)
    + _KEPT_AND_FOLLOWED + COUNT_MEMBERS.format(finished="""
        SELECT group_id, false AS dead FROM done WHERE group_id IS NOT NULL
        UNION ALL
        SELECT group_id, true FROM buried WHERE group_id IS NOT NULL""")
    + _COUNTS + ",\n       (SELECT count(*) FROM snoozed)"
    + _OUTCOMES_TAIL.format(
        finished=notify_finished("EXISTS (SELECT FROM done) OR EXISTS (SELECT FROM dead)")))

#: `ACK_OUTCOMES` for a flush of successes only, as `ACK_DONE` is `ACK`'s first arm: the
#: arms it would run empty are left out, which takes a third off its time. The same
#: parameters and rows (the failures' counts 0).
ACK_KEPT: Final = (
    _DONE_ARM.format(done=_DONE_RECORDED) + _KEPT_AND_FOLLOWED + COUNT_MEMBERS.format(
        finished="SELECT group_id, false AS dead FROM done WHERE group_id IS NOT NULL")
    + "\nSELECT (SELECT count(*) FROM done), 0, 0, 0, 0, 0"
    + _OUTCOMES_TAIL.format(finished=notify_finished("EXISTS (SELECT FROM done)")))

#: Park attempts whose ack the database refused even alone (`pgpool.host.isolate`): an
#: application's foreign key or trigger, a lock held too long. ``state`` is 'done' for a
#: job that succeeded but could not be deleted (kept; its unique key is freed, as deleting
#: it would have), 'parked' for any other ack; ``reason`` goes to ``last_error``. The claim
#: takes only 'ready' jobs, so neither runs again until someone changes it. An UPDATE of
#: non-key columns: FOR KEY SHARE holders (foreign key checks) do not block it.
#:
#: A success parked as done has finished: a member of a group counts as done in its group
#: here (`COUNT_MEMBERS`), so its callback is not kept waiting by a row nothing will end
#: (a cancel, a retry and a delete leave it alone). Returns the ids parked, each with the
#: queues and the waiters told.
PARK: Final = """
WITH parked AS (
    UPDATE pgpool_jobs AS j
    SET state = a.state, locked_by = NULL, lease_until = NULL, last_error = a.reason,
        unique_key = CASE WHEN a.state = 'done' THEN NULL ELSE j.unique_key END
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[],
                array_fill(%(owner)s::text, ARRAY[cardinality(%(ids)s::bigint[])]),
                %(states)s::text[], %(reasons)s::text[])
         AS a(id, attempt, owner, state, reason)
    WHERE j.id = a.id AND j.attempts = a.attempt AND j.locked_by = a.owner
    RETURNING j.id, j.state, j.group_id
)""" + COUNT_MEMBERS.format(finished="""
    SELECT group_id, false AS dead FROM parked
    WHERE state = 'done' AND group_id IS NOT NULL""") + """
SELECT id, """ + NOTIFY_CALLED + """,
       """ + notify_finished("EXISTS (SELECT FROM parked WHERE state = 'done')") + """
FROM parked
"""

#: Return jobs whose lease expired (their dispatcher died or lost the database) to ready,
#: or bury them when that attempt was their last. An attempt that never started in a worker
#: (no heartbeat recorded it) does not count, up to ``max_interruptions`` per job; any other
#: expired attempt counts. A cancelled attempt (running, no owner: `ops.CANCEL`) is over
#: once its lease has expired: it is buried as cancelled, with the cancel's trace, whatever
#: attempts it has left. SKIP LOCKED lets hosts run this concurrently without two of them
#: handling one row (the fleet's leader runs it, `pgpool.host.parts.leader`, and a burst
#: host when it finds nothing). ``ids`` is NULL, or the only jobs to consider
#: (`pgpool.host.parts.reaper` isolating a job it cannot return). A running row with no
#: lease was written by hand (no claim writes one): it is as expired as any, and an
#: attempt that never started, so it holds its keys for one pass at most. A buried member
#: of a group counts as finished in its group (`COUNT_MEMBERS`). The queues of the revived
#: jobs are notified: an idle host polls only rarely (`pgpool.host.scheduler`). Returns
#: (revived, dead, callbacks' queues told, waiters told, revived queues told).
REAP: Final = """
WITH expired AS (
    SELECT id FROM pgpool_jobs
    WHERE state = 'running' AND (lease_until < now() OR lease_until IS NULL)
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    ORDER BY id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), judged AS (
    SELECT j.id, j.locked_by, j.locked_by IS NULL AND j.lease_until IS NOT NULL AS cancelled,
           NOT j.started AND j.interruptions < %(max_interruptions)s AS uncounted,
           j.attempts - j.interruptions - j.snoozes < j.max_attempts AS attempts_left
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
    RETURNING j.id, j.queue
), buried AS (
    DELETE FROM pgpool_jobs AS j
    USING judged AS g
    WHERE j.id = g.id AND (g.cancelled OR NOT (g.uncounted OR g.attempts_left))
    RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempts, j.interruptions,
              j.snoozes, j.max_attempts, j.unique_key, j.created_at, j.tenant,
              j.concurrency_key, j.meta, j.group_id, j.locked_by, j.last_error, g.cancelled
), dead AS (
    INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, interruptions,
                             snoozes, max_attempts, unique_key, created_at, tenant,
                             concurrency_key, meta, group_id, last_error, reason)
    SELECT id, queue, kind, payload, priority, attempts, interruptions, snoozes,
           max_attempts, unique_key, created_at, tenant, concurrency_key, meta, group_id,
           CASE WHEN cancelled THEN last_error
                ELSE 'lease expired while running on ' || locked_by END,
           CASE WHEN cancelled THEN 'cancelled' ELSE 'failed' END
    FROM buried
    RETURNING id
)""" + COUNT_MEMBERS.format(
    finished="SELECT group_id, true AS dead FROM buried WHERE group_id IS NOT NULL") + """
SELECT (SELECT count(*) FROM revived), (SELECT count(*) FROM dead), """ + NOTIFY_CALLED + """,
       """ + notify_finished("EXISTS (SELECT FROM dead)") + """,
       (SELECT count(pg_notify(""" + OUR_CHANNEL + """, q))
        FROM (SELECT DISTINCT queue FROM revived) AS n(q))
"""

#: The jobs `REAP` would take next, without locking them: the batch the reaper bisects
#: (`pgpool.host.isolate`) when REAP fails on one of its rows.
REAP_CANDIDATES: Final = """
SELECT id FROM pgpool_jobs
WHERE state = 'running' AND (lease_until < now() OR lease_until IS NULL)
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
WHERE j.id = a.id AND j.state = 'running'
  AND (j.lease_until < now() OR j.lease_until IS NULL)
RETURNING j.id
"""

# --- stager (pgpool.host.parts.stager): scheduled jobs become ready when due --------------

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
       (SELECT count(pg_notify({OUR_CHANNEL}, queue))
        FROM (SELECT DISTINCT queue FROM staged) AS q),
       (SELECT extract(epoch FROM min(run_at) - now())::float8 FROM pgpool_jobs
        WHERE state = 'scheduled' AND run_at > now())
"""

#: The jobs `STAGE_DUE` would take next, without locking them: the batch the stager
#: bisects (`pgpool.host.isolate`) when STAGE_DUE fails on one of its rows.
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

# --- vacuum keeper (pgpool.host.parts.vacuum): the dead rows claims walk over, removed in time -

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
#: of the live rows, besides the ``left`` that the keeper's last vacuum could not remove
#: (while the count has not fallen below them: then another vacuum removed them).
VACUUM_DUE: Final = """
SELECT n_dead_tup - CASE WHEN n_dead_tup >= %(left)s THEN %(left)s ELSE 0 END
           >= greatest(%(min_dead)s, %(scale)s * n_live_tup),
       n_dead_tup
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
