"""The test kit: what a user's test reads of the jobs and the queues `pgpool.testing.drain`
serves (its claims, stages and acks are the job protocol's own: `jobs`), and the schemas
of the pytest fixtures (`pgpool.testing.plugin`)."""

from __future__ import annotations

from typing import Final

#: The live jobs (``pgpool_jobs``, in any state), of one kind or all (NULL), in id order.
ENQUEUED: Final = """
SELECT id, kind, queue, payload, priority, run_at, state, attempts, max_attempts, tenant,
       concurrency_key, unique_key
FROM pgpool_jobs
WHERE %(kind)s::text IS NULL OR kind = %(kind)s
ORDER BY id
"""

#: How many live jobs of each kind there are: what a failed assertion names when no job of
#: its kind is enqueued at all.
KIND_COUNTS: Final = "SELECT kind, count(*) FROM pgpool_jobs GROUP BY kind ORDER BY kind"

#: The queues `drain` claims from: those with a job ready or scheduled, less the paused ones
#: (a host claims from none of those either).
QUEUES: Final = """
SELECT DISTINCT queue FROM pgpool_jobs
WHERE state IN ('ready', 'scheduled')
  AND queue NOT IN (SELECT queue FROM pgpool_paused)
ORDER BY queue
"""

#: The scheduled jobs that are due, but those in ``skip`` (retries `drain` itself scheduled,
#: which it leaves for later): the ones it stages (`jobs.STAGE_DUE`) before it claims again.
DUE: Final = """
SELECT id FROM pgpool_jobs
WHERE state = 'scheduled' AND run_at <= now() AND id <> ALL(%(skip)s::bigint[])
ORDER BY run_at
"""

# --- the fixtures' schemas (pgpool.testing.plugin) ----------------------------------------

#: A test's own schema, named by the fixture ({} is its identifier); dropped after the test.
CREATE_SCHEMA: Final = "CREATE SCHEMA {}"
DROP_SCHEMA: Final = "DROP SCHEMA {} CASCADE"
#: How long the drop waits for a lock before it ends the sessions holding one.
DROP_LOCK_TIMEOUT: Final = "SET lock_timeout = '5s'"
#: End the sessions a test left holding locks on its schema's tables (a connection left in
#: a transaction, a ``pgpool run`` still running), so that the schema can be dropped.
END_SCHEMA_SESSIONS: Final = """
SELECT pg_terminate_backend(l.pid) FROM pg_locks AS l
JOIN pg_class AS c ON c.oid = l.relation
WHERE l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND c.relnamespace = %(schema)s::regnamespace AND l.pid <> pg_backend_pid()
"""
#: A throwaway server need not survive a crash: no waits on the disk. Never run on a
#: server the user gave (``PGPOOL_TEST_DSN``).
THROWAWAY_SETTINGS: Final = ("fsync", "synchronous_commit", "full_page_writes")
SETTING_OFF: Final = "ALTER SYSTEM SET {} = off"
RELOAD: Final = "SELECT pg_reload_conf()"
