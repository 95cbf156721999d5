"""What `pgpool.contrib.django.tasks` reads: a task's job, live, kept as done, or dead."""

from typing import Final

#: One job of a Django task's kind (``django:`` and its path, or ``legacy``, the one kind of
#: the jobs enqueued before) by id, from the live table, the kept successes or the dead
#: letters: (state (``dead`` for a dead letter), payload (as text: Django's connection
#: loads jsonb as text; for a success, what its handler returned, which holds the task's
#: path and arguments), queue, priority, run_at, attempts, locked_by, claimed_at,
#: created_at, finished_at (a success's or a death's), last_error). No row: it never was
#: (a rolled-back enqueue, another kind's id), or it succeeded and its record was pruned.
TASK_JOB: Final = """
SELECT state, payload::text, queue, priority, run_at, attempts, locked_by, claimed_at, created_at,
       NULL::timestamptz, last_error
  FROM pgpool_jobs WHERE id = %(id)s AND (kind = %(legacy)s OR starts_with(kind, %(prefix)s))
UNION ALL
SELECT 'done', result::text, queue, NULL, NULL, attempts, NULL, NULL, created_at, finished_at,
       NULL
  FROM pgpool_done WHERE id = %(id)s AND (kind = %(legacy)s OR starts_with(kind, %(prefix)s))
UNION ALL
SELECT 'dead', payload::text, queue, priority, NULL, attempts, NULL, NULL, created_at, died_at,
       last_error
  FROM pgpool_dead WHERE id = %(id)s AND (kind = %(legacy)s OR starts_with(kind, %(prefix)s))
LIMIT 1
"""
