"""Long jobs: a running attempt's checkpoint and progress (`pgpool.host.long`).

Each statement that writes is guarded like an ack (`pgpool.sql.jobs`): the job's
(``locked_by``, ``attempts``) must still be this dispatcher's attempt, so a fenced or
cut-off attempt never writes. A checkpoint also needs its lease not to have run out on the
server: a dispatcher thawed after a freeze may still read a checkpoint its dead worker
wrote before the fence ended it, while the job waits for the reaper.
"""

from __future__ import annotations

from typing import Final

#: Store a checkpoint; its rowcount says whether it was (1) or this attempt no longer holds
#: the job (0).
CHECKPOINT: Final = """
UPDATE pgpool_jobs
SET checkpoint = %(state)s::jsonb, checkpoint_at = now()
WHERE id = %(id)s AND attempts = %(attempt)s AND locked_by = %(owner)s
  AND lease_until > now()
"""

#: The stored checkpoint of an attempt this dispatcher holds: one row (its checkpoint, as
#: text, or NULL), or none when it holds the attempt no more.
LOAD_CHECKPOINT: Final = """
SELECT checkpoint::text FROM pgpool_jobs
WHERE id = %(id)s AND attempts = %(attempt)s AND locked_by = %(owner)s
"""

#: Write the latest progress of running attempts, one statement for all (after a
#: heartbeat, only when some reported any). Never waits for a row lock, as the heartbeat
#: does not (`pgpool.sql.jobs.HEARTBEAT`): a row being acked is skipped, its job over.
PROGRESS: Final = """
WITH p AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(progress)s::text[])
                  AS p(id, attempt, progress)
), free AS (
    SELECT j.id, p.progress
    FROM p JOIN pgpool_jobs AS j
         ON j.id = p.id AND j.attempts = p.attempt AND j.locked_by = %(owner)s
    FOR NO KEY UPDATE OF j SKIP LOCKED
)
UPDATE pgpool_jobs AS j
SET progress = f.progress::jsonb, progress_at = now()
FROM free AS f
WHERE j.id = f.id
"""

#: `CHECKPOINT` and `LOAD_CHECKPOINT` for a handler run by `pgpool.testing.drain`, on the
#: test's connection, in the test's process: there is no dispatcher, and the attempt is
#: the one the drain claimed.
CHECKPOINT_IN_PROCESS: Final = """
UPDATE pgpool_jobs
SET checkpoint = %(state)s::jsonb, checkpoint_at = now()
WHERE id = %(id)s AND attempts = %(attempt)s AND state = 'running'
"""
LOAD_CHECKPOINT_IN_PROCESS: Final = "SELECT checkpoint::text FROM pgpool_jobs WHERE id = %(id)s"
