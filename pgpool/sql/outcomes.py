"""Outcomes: what became of a job (`pgpool.outcomes`), a group's members, and the retention
of the records of finished jobs and groups (`pgpool.host.parts.retention`)."""

from __future__ import annotations

from typing import Final

from .common import FINISHED_CHANNEL

__all__ = ["FINISHED_CHANNEL", "GROUP", "GROUP_MEMBERS", "PRUNE_DONE", "PRUNE_GROUPS",
           "STATUSES"]

#: What each of ``ids`` is now, one row each that is known anywhere: (id, state, kind,
#: queue, attempts, result, error, finished_at, group_id, parked). A live job's state is
#: its ``pgpool_jobs`` state (a ready job not yet due is 'scheduled'), parked when its ack
#: was refused ('parked', or 'done': it succeeded, and neither its result nor its
#: follow-ups were stored); a kept success is 'done' with its result; a dead letter
#: 'dead', or 'cancelled' when cancelled, with its last error. A job in none of them is
#: not returned.
STATUSES: Final = """
SELECT id,
       CASE WHEN state = 'ready' AND run_at > now() THEN 'scheduled' ELSE state END,
       kind, queue, attempts, NULL::jsonb, last_error, NULL::timestamptz, group_id,
       state IN ('parked', 'done'), checkpoint_at, progress, progress_at
FROM pgpool_jobs WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, 'done', kind, queue, attempts, result, NULL, finished_at, group_id, false,
       NULL, NULL, NULL
FROM pgpool_done WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, CASE WHEN reason = 'cancelled' THEN 'cancelled' ELSE 'dead' END, kind, queue,
       attempts, NULL, last_error, died_at, group_id, false, NULL, NULL, NULL
FROM pgpool_dead WHERE id = ANY(%(ids)s::bigint[])
"""

#: A group's row: (total, done, dead, created_at, completed_at), and its callback's state
#: as `STATUSES` gives it (NULL when it is in none of the tables).
GROUP: Final = """
SELECT g.total, g.done, g.dead, g.created_at, g.completed_at,
       coalesce((SELECT CASE WHEN state = 'ready' AND run_at > now() THEN 'scheduled'
                             ELSE state END FROM pgpool_jobs WHERE id = g.id),
                (SELECT 'done' FROM pgpool_done WHERE id = g.id),
                (SELECT CASE WHEN reason = 'cancelled' THEN 'cancelled' ELSE 'dead' END
                 FROM pgpool_dead WHERE id = g.id))
FROM pgpool_groups AS g WHERE g.id = %(id)s
"""

#: The finished members of a group, in id order: (id, state, result, error), state 'done'
#: (with its result), 'dead' or 'cancelled' (with its last error). No row when there is no
#: such group; one of NULLs for a group none of whose members has finished.
GROUP_MEMBERS: Final = """
SELECT m.id, m.state, m.result, m.error
FROM pgpool_groups AS g LEFT JOIN LATERAL (
    SELECT id, 'done' AS state, result, NULL AS error FROM pgpool_done
    WHERE group_id = %(id)s
    UNION ALL
    SELECT id, CASE WHEN reason = 'cancelled' THEN 'cancelled' ELSE 'dead' END, NULL,
           last_error
    FROM pgpool_dead WHERE group_id = %(id)s
) AS m ON true
WHERE g.id = %(id)s
ORDER BY m.id
"""

#: Delete up to ``limit`` records of finished jobs past their ``keep_until`` (retention's
#: batch, as `pgpool.sql.ops.PURGE_DEAD`), except those of a group that is not complete or
#: whose callback has not finished (it is still in ``pgpool_jobs``): it may still read
#: them. Two arms, each on its own index (migration 19), so that neither reads a record
#: it keeps: the records of no group, oldest first; then those of complete groups, the
#: oldest groups first, one probe of the callback and one of the records per group. A
#: waiting group's records, all past ``keep_until`` (a member's is its finish unless its
#: kind keeps it longer), are never read: walking them cost every pass a read of each.
#: (The records of a complete group are read at most ``limit`` at a time; a complete
#: group whose callback has run but whose records its kind keeps longer costs a probe of
#: each per pass, as in `PRUNE_GROUPS`.) Deleted by primary key in any plan: a hash join
#: would read the whole table.
PRUNE_DONE: Final = """
WITH doomed AS (
    (SELECT d.id FROM pgpool_done AS d
     WHERE d.group_id IS NULL AND d.keep_until < now()
     ORDER BY d.keep_until
     LIMIT %(limit)s)
    UNION ALL
    (SELECT m.id
     FROM pgpool_groups AS g
     CROSS JOIN LATERAL (
         SELECT d.id FROM pgpool_done AS d
         WHERE d.group_id = g.id AND d.keep_until < now()
         ORDER BY d.keep_until
         LIMIT %(limit)s) AS m
     WHERE g.completed_at IS NOT NULL
       AND NOT EXISTS (SELECT FROM pgpool_jobs AS j WHERE j.id = g.id)
     ORDER BY g.completed_at
     LIMIT %(limit)s)
    LIMIT %(limit)s
), gone AS (
    DELETE FROM pgpool_done AS d WHERE d.id = ANY(ARRAY(SELECT id FROM doomed))
    RETURNING d.id
)
SELECT count(*) FROM gone
"""

#: Delete up to ``limit`` groups whose callback has finished (it is no longer in
#: ``pgpool_jobs``) and whose members' records are all gone: nothing is left to show of
#: them but their counts.
PRUNE_GROUPS: Final = """
WITH doomed AS (
    SELECT g.id FROM pgpool_groups AS g
    WHERE g.completed_at IS NOT NULL
      AND NOT EXISTS (SELECT FROM pgpool_jobs AS j WHERE j.id = g.id)
      AND NOT EXISTS (SELECT FROM pgpool_done AS d WHERE d.group_id = g.id)
      AND NOT EXISTS (SELECT FROM pgpool_dead AS d WHERE d.group_id = g.id)
    ORDER BY g.completed_at
    LIMIT %(limit)s
), gone AS (
    DELETE FROM pgpool_groups AS g USING doomed WHERE g.id = doomed.id RETURNING g.id
)
SELECT count(*) FROM gone
"""
