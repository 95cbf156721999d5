"""The SQL only `pgpool bench` sends, by name: its scratch schema's life (`scratch`), the
table upkeep and checks between stages, and the server statistics it reads.

The ceilings and the pickup floor claim with hand-written statements of their own
(`PICK`, `LEASE_CLAIM`), never pgpool's: they are what a loop with no framework would send.
The runtime statements the bench also uses (`pgpool.sql.common.CHANNEL`,
`pgpool.sql.jobs.COPY_JOBS`) stay in `pgpool.sql`, next to the rest of pgpool's runtime SQL.
"""

from __future__ import annotations

from typing import Final

#: The scratch schema (not pgpool's own DDL, which is in `pgpool.db.schema`), dropped at the
#: end; compose with ``psycopg.sql.Identifier(name)``.
CREATE_SCHEMA: Final = "CREATE SCHEMA {}"
DROP_SCHEMA: Final = "DROP SCHEMA IF EXISTS {} CASCADE"

#: The server facts the report prints: version and durability settings, read, not changed.
SERVER_FACTS: Final = """
SELECT current_setting('server_version'), current_setting('fsync'),
       current_setting('synchronous_commit'), current_setting('full_page_writes'),
       current_setting('shared_buffers')
"""

#: ``--backlog``: N no-op jobs due in a day, the deep table a claim must skip.
BACKLOG: Final = """
INSERT INTO pgpool_jobs (kind, payload, run_at, state)
SELECT %(kind)s, '{"do": "noop"}', now() + interval '1 day', 'scheduled'
FROM generate_series(1, %(n)s)
"""

#: After a stage: (jobs due or running, jobs not yet due, dead-lettered jobs).
LEFTOVERS: Final = """
SELECT count(*) FILTER (WHERE state = 'running' OR run_at <= now()),
       count(*) FILTER (WHERE state IN ('ready', 'scheduled') AND run_at > now()),
       (SELECT count(*) FROM pgpool_dead)
FROM pgpool_jobs
"""

#: The "one transaction" ceiling's claim, and the subquery of `LEASE_CLAIM`: up to
#: ``limit`` ready bench jobs in claim order, locked. The simplest claim a hand-written loop
#: could send: one kind, no tenant, no fairness. The equalities match the ready index's
#: leading (queue, kind, tenant) and its ORDER BY the rest, so it reads ``limit`` index
#: entries however deep the queue (tests/cli/test_bench.py checks the plan).
_PICK_COLUMNS: Final = """
SELECT {} FROM pgpool_jobs
WHERE state = 'ready' AND queue = 'default' AND kind = %(kind)s AND tenant = ''
ORDER BY priority DESC, run_at, id
LIMIT %(limit)s
FOR NO KEY UPDATE SKIP LOCKED
"""
PICK: Final = _PICK_COLUMNS.format("id")
#: The claim of bench/vs_loop.py's hand-written loop, which runs the jobs it picks: `PICK`
#: with each job's payload.
PICK_JOBS: Final = _PICK_COLUMNS.format("id, payload")

#: The "lease cycle" ceiling's and the pickup floor's claim: `PICK`'s jobs leased to
#: ``owner``, to commit on its own (a claim must be durable before its work starts).
#: ``id = ANY(ARRAY(...))``, as in pgpool's claim: a primary key lookup per id in any plan.
LEASE_CLAIM: Final = f"""
UPDATE pgpool_jobs
SET state = 'running', attempts = attempts + 1, locked_by = %(owner)s, claimed_at = now(),
    lease_until = now() + interval '60 seconds'
WHERE id = ANY(ARRAY({PICK}))
RETURNING id, payload
"""

#: The ceiling loops' and the pickup floor's second statement: the claimed jobs are done.
DELETE: Final = "DELETE FROM pgpool_jobs WHERE id = ANY(%(ids)s::bigint[])"
EMPTY: Final = "TRUNCATE pgpool_jobs"
VACUUM: Final = "VACUUM pgpool_jobs"
ANALYZE: Final = "ANALYZE pgpool_jobs"

#: Committed transactions in the current database (each autocommit read takes a fresh
#: statistics snapshot).
COMMITS: Final = """
SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()
"""

#: Where the server's write-ahead log is being inserted now: the WAL written between two
#: reads is their difference (`WAL_BETWEEN`), every session's, whatever a checkpoint
#: forced (full-page images).
WAL_NOW: Final = "SELECT pg_current_wal_insert_lsn()::text"
WAL_BETWEEN: Final = "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::int8"

#: Whether the connection named ``app`` is LISTENing yet.
LISTENING: Final = """
SELECT 1 FROM pg_stat_activity WHERE application_name = %(app)s AND query = %(listen)s
"""
