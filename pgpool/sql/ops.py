"""Operations: the operators' commands, to inspect, repair and steer (`pgpool.ops`, which
the CLI and the dashboard call), and dead-letter retention, which prunes with the same
purge."""

from __future__ import annotations

from typing import Final

from .common import CONTROL, COUNT_MEMBERS, NOTIFY_CALLED, OUR_CHANNEL, notify_finished

NOTIFY_CONTROL: Final = f"SELECT pg_notify({OUR_CHANNEL}, '{CONTROL}')"

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
# `jobs.PARK`). Due is by ``run_at``: a scheduled job the stager has not staged yet is ready, a
# ready row an older pgpool wrote with a future time is scheduled.
_JOB_STATE = ("CASE WHEN state IN ('running', 'parked', 'done', 'waiting') THEN state "
              "WHEN run_at > now() THEN 'scheduled' ELSE 'ready' END")

# The columns `pgpool.ops` reads of a live job, in `ops.LiveJob` order.
_JOB_COLUMNS = f"""
    id, kind, queue, {_JOB_STATE} AS op_state, attempts, max_attempts, priority, run_at,
    extract(epoch FROM lease_until - now())::float8, locked_by, nullif({_ERROR_LINE}, ''),
    created_at,
    CASE WHEN %(full)s THEN last_error END, CASE WHEN %(payload)s THEN payload END, group_id,
    checkpoint_at, CASE WHEN %(payload)s THEN checkpoint END, progress, progress_at
"""

#: Live jobs, filtered (a NULL filter matches all), oldest first; one more than ``limit``,
#: so the caller can say that more are left. ``group`` takes the members of one group.
#: ``after_*`` is a keyset cursor on (run_at, id), the listing's order, for the next page
#: (the dashboard's).
JOBS_LIST: Final = f"""
SELECT {_JOB_COLUMNS} FROM pgpool_jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(state)s::text IS NULL OR {_JOB_STATE} = %(state)s)
  AND (%(group)s::bigint IS NULL OR group_id = %(group)s)
  AND (%(older_than)s::float8 IS NULL
       OR created_at < now() - make_interval(secs => %(older_than)s))
  AND (%(after_run_at)s::timestamptz IS NULL
       OR (run_at, id) > (%(after_run_at)s::timestamptz, %(after_id)s::bigint))
ORDER BY run_at, id
LIMIT %(limit)s + 1
"""

#: Live jobs by id.
JOBS_BY_ID: Final = f"SELECT {_JOB_COLUMNS} FROM pgpool_jobs WHERE id = ANY(%(ids)s::bigint[])"

#: A job kept as done (it succeeded: see `pgpool.outcomes`), in `ops.DoneJob` order; its
#: result only when asked for (user data, as a payload is).
DONE_BY_ID: Final = """
SELECT id, kind, queue, 'done', tenant, attempts, created_at, finished_at, keep_until,
       group_id, CASE WHEN %(result)s THEN result END
FROM pgpool_done WHERE id = %(id)s
"""

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

#: Dead jobs counted by (kind, reason, error signature), the largest group first: the
#: triage view.
DEAD_GROUPS: Final = f"""
SELECT kind, reason, {SIGNATURE} AS signature, count(*), min(died_at), max(died_at), min(id)
FROM pgpool_dead
WHERE {_DEAD_FILTER}
GROUP BY 1, 2, 3
ORDER BY 4 DESC, 1, 2, 3
LIMIT %(limit)s + 1
"""

# With ``keep_pending``, a dead member of a group whose callback has not finished (it is
# still in pgpool_jobs) is left out: the callback reads it. A NOT EXISTS of its own, the
# parameter inside: an anti-join, one primary-key probe per dead job, never a scan of the
# live jobs (a dead job of no group matches none: ``id = NULL``).
_NOT_PENDING = """
    NOT EXISTS (SELECT FROM pgpool_jobs AS j
                WHERE j.id = pgpool_dead.group_id AND %(keep_pending)s)
"""

#: How many dead jobs match (a dry run of a replay or purge), at most ``limit``; with
#: ``keep_pending``, none that a callback that has not run yet reads (`PURGE_DEAD`).
DEAD_COUNT: Final = f"""
SELECT count(*) FROM (SELECT FROM pgpool_dead WHERE {_DEAD_FILTER} AND {_NOT_PENDING}
                      LIMIT %(limit)s) AS d
"""

#: The dead jobs matching the filter that `PURGE_DEAD` keeps with ``keep_pending``: how
#: many, and their groups.
DEAD_PENDING: Final = f"""
SELECT count(*), coalesce(array_agg(DISTINCT group_id ORDER BY group_id), '{{}}')
FROM pgpool_dead
WHERE {_DEAD_FILTER} AND group_id IS NOT NULL
  AND EXISTS (SELECT FROM pgpool_jobs AS j WHERE j.id = pgpool_dead.group_id)
"""

#: Which of these ids are dead jobs (to explain why a live-job command did not find them).
DEAD_IDS: Final = "SELECT id FROM pgpool_dead WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id"

#: Move up to ``limit`` matching dead jobs back to ready, oldest death first: same id,
#: attempts from 0, due now; the last error is kept for reference. One whose unique key a
#: live job holds stays dead (ON CONFLICT). SKIP LOCKED: two replays never move one job
#: twice. Wakes the hosts of each queue.
#:
#: A member of a group (``group_id``) goes back according to its group's row, locked in id
#: order as `COUNT_MEMBERS` locks it, so the acks that count the group's other members wait
#: for the replay or it for them, and it reads the row as they left it:
#:
#: - its group is not complete: back into it, uncounted in the same statement (``dead`` -
#:   1), so its new end is counted again and the callback waits for it;
#: - its group is complete and its callback has not finished (it is still in
#:   ``pgpool_jobs``, or it is replayed by this same statement): it stays dead, refused,
#:   since the callback reads its end as it is;
#: - its group's callback has finished, or its group is gone: back outside its group
#:   (``group_id`` NULL), since nothing would read its new end.
#:
#: A group's callback (cancelled while it waited, say) goes back waiting while its group
#: is not complete, and ready once it is: its members' acks make it ready then, an ack
#: whose statement began before the replay committed too (`COUNT_MEMBERS` makes it ready
#: with a snapshot taken once the ack holds the group's row, which the replay held until
#: it committed).
#:
#: Returns how many were picked and moved, the (died_at, id) cursor of the last picked,
#: from which the next batch goes on, the queues told; then how many stayed dead refused
#: and their groups, how many went back outside their group and those groups, and the
#: callbacks that went back waiting.
REPLAY_DEAD: Final = f"""
WITH picked AS (
    SELECT id, died_at, group_id FROM pgpool_dead
    WHERE {_DEAD_FILTER}
    ORDER BY died_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), locked_groups AS (
    SELECT g.id, g.completed_at IS NOT NULL AS complete,
           EXISTS (SELECT FROM pgpool_jobs AS j WHERE j.id = g.id)
           OR g.id IN (SELECT id FROM picked) AS callback_pending
    FROM pgpool_groups AS g
    WHERE g.id IN (SELECT group_id FROM picked) OR g.id IN (SELECT id FROM picked)
    ORDER BY g.id
    FOR NO KEY UPDATE OF g
), judged AS (
    SELECT p.id, p.group_id,
           CASE WHEN p.group_id IS NULL THEN 'plain'
                WHEN NOT g.complete THEN 'into'
                WHEN g.callback_pending THEN 'refused'
                ELSE 'outside' END AS way,  -- a group row gone: outside
           CASE WHEN NOT c.complete THEN 'waiting' ELSE 'ready' END AS state
    FROM picked AS p
    LEFT JOIN locked_groups AS g ON g.id = p.group_id
    LEFT JOIN locked_groups AS c ON c.id = p.id  -- its own group, if it is a callback
), revived AS (
    INSERT INTO pgpool_jobs (id, queue, kind, payload, priority, state, max_attempts,
                             unique_key, last_error, created_at, tenant, concurrency_key, meta,
                             group_id)
    OVERRIDING SYSTEM VALUE
    SELECT d.id, d.queue, d.kind, d.payload, d.priority, j.state, d.max_attempts,
           d.unique_key, d.last_error, d.created_at, d.tenant, d.concurrency_key, d.meta,
           CASE WHEN j.way = 'into' THEN d.group_id END
    FROM pgpool_dead AS d JOIN judged AS j USING (id)
    WHERE j.way <> 'refused'
    ON CONFLICT DO NOTHING
    RETURNING id, queue, group_id, state
), uncounted AS (
    UPDATE pgpool_groups AS g SET dead = g.dead - r.n
    FROM (SELECT group_id, count(*) AS n FROM revived WHERE group_id IS NOT NULL
          GROUP BY group_id) AS r
    WHERE g.id = r.group_id
), gone AS (
    DELETE FROM pgpool_dead AS d USING revived WHERE d.id = revived.id RETURNING d.id
), last AS (
    SELECT died_at, id FROM picked ORDER BY died_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM picked), (SELECT count(*) FROM gone),
       (SELECT died_at FROM last), (SELECT id FROM last),
       (SELECT count(pg_notify({OUR_CHANNEL}, queue))
        FROM (SELECT DISTINCT queue FROM revived WHERE state = 'ready') AS q),
       (SELECT count(*) FROM judged WHERE way = 'refused'),
       ARRAY(SELECT DISTINCT group_id FROM judged WHERE way = 'refused' ORDER BY 1),
       (SELECT count(*) FROM judged JOIN gone USING (id) WHERE way = 'outside'),
       ARRAY(SELECT DISTINCT group_id FROM judged JOIN gone USING (id)
             WHERE way = 'outside' ORDER BY 1),
       ARRAY(SELECT id FROM revived WHERE state = 'waiting' ORDER BY id)
"""

#: Delete up to ``limit`` matching dead jobs, oldest death first (a purge's or the
#: retention's batch): bounded, so no delete holds many locks or leaves a vacuum storm.
#: No FOR UPDATE: it needs UPDATE on the table, which the worker role (which prunes) does
#: not have. A row another purge deletes first is waited for, then skipped. With
#: ``keep_pending`` (the retention's, and a purge's unless forced), a member of a group
#: whose callback has not finished is kept, as `pgpool.sql.outcomes.PRUNE_DONE` keeps the
#: records of its members that succeeded.
PURGE_DEAD: Final = f"""
WITH doomed AS (
    SELECT id FROM pgpool_dead
    WHERE {_DEAD_FILTER} AND {_NOT_PENDING}
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

#: Cancel live jobs (`CANCEL_LOCK` first; never a job kept as done): a waiting one (a
#: group's callback waiting for its members too) moves to
#: pgpool_dead with reason 'cancelled' and a last_error that says when and what it was
#: doing. A running one loses its owner at once but keeps its row, state running, until its
#: lease ends: its attempt may run until then (its host stops it at its next heartbeat, sent
#: at once after `NOTIFY_CONTROL`, but a frozen host's worker runs on until its lease
#: fence), so the unique indexes on its keys still hold. Its heartbeat and ack match no
#: row (they need the owner), and when the lease has expired, `jobs.REAP` buries it as
#: cancelled. A cancelled member of a group counts as finished in its group
#: (`COUNT_MEMBERS`). Returns how many were dead-lettered and how many stopped, then the
#: queues and waiters told.
CANCEL: Final = f"""
WITH gone AS (
    DELETE FROM pgpool_jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('ready', 'scheduled', 'parked', 'waiting')
    RETURNING id, queue, kind, payload, priority, attempts, interruptions, snoozes,
              max_attempts, unique_key, created_at, tenant, concurrency_key, meta, group_id,
              {_JOB_STATE} AS op_state
), dead AS (
    INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, interruptions,
                             snoozes, max_attempts, unique_key, created_at, tenant,
                             concurrency_key, meta, group_id, reason, last_error)
    SELECT id, queue, kind, payload, priority, attempts, interruptions, snoozes,
           max_attempts, unique_key, created_at, tenant, concurrency_key, meta, group_id,
           'cancelled', {_CANCELLED_AT} || ' while ' || op_state
    FROM gone
    RETURNING id
){COUNT_MEMBERS.format(
    finished="SELECT group_id, true AS dead FROM gone WHERE group_id IS NOT NULL")}, stopped AS (
    UPDATE pgpool_jobs
    SET locked_by = NULL,
        last_error = {_CANCELLED_AT} || ' while running attempt ' || attempts || ' on '
                     || locked_by
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running' AND locked_by IS NOT NULL
    RETURNING id
)
SELECT (SELECT count(*) FROM dead), (SELECT count(*) FROM stopped), {NOTIFY_CALLED},
       {notify_finished("EXISTS (SELECT FROM dead)")}
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
SELECT id, (SELECT count(pg_notify({OUR_CHANNEL}, queue))
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
SELECT queue, pg_notify({OUR_CHANNEL}, queue) FROM gone
"""

#: The paused queues and since when.
PAUSED: Final = "SELECT queue, paused_at FROM pgpool_paused ORDER BY queue"


# --- limits (pgpool.ops.set_limit, reset_limit, limits) -----------------------------------

#: Set an operator's override of a kind's limit (`pgpool.limits.Override`), replacing any
#: earlier one; returns its row. The hosts hear at once (`NOTIFY_CONTROL`).
SET_LIMIT: Final = """
INSERT INTO pgpool_limits AS l (kind, concurrency, rate, per, scope)
VALUES (%(kind)s, %(concurrency)s, %(rate)s, %(per)s, %(by)s)
ON CONFLICT (kind) DO UPDATE
SET concurrency = excluded.concurrency, rate = excluded.rate, per = excluded.per,
    scope = excluded.scope, set_at = now(), set_by = session_user
RETURNING kind, set_by
"""

#: Drop a kind's override: the code's limit holds again. Returns a row only if there was one.
RESET_LIMIT: Final = "DELETE FROM pgpool_limits WHERE kind = %(kind)s RETURNING kind"

#: The kinds with a limit in force (an override, or a registered host's code:
#: ``pgpool_limits_in_force``, migration 24) or with jobs holding slots of a concurrency
#: limit or rows of a rate's ring: each one's override (NULLs without one), when and by
#: whom it was set, its running jobs that hold a slot, the jobs its rate rings' rows used
#: in the last ``per`` seconds let start (the limit in force's per, else a second), its
#: jobs due now, the limit in force (NULLs: none known), and of its jobs due now those
#: waiting on it: past what it lets start within the fleet's target lag (``allowance``;
#: as pgpool_queue_work counts them, over the kind's queues); then the override's scope
#: (`pgpool.limits.OVERRIDE_BY`), and for a limit by tenant or by key, how many scopes are
#: in use (holding slots, or with rows of their ring used in that period) and the ``top``
#: busiest of them, each [scope, running, rate used], busiest first: bounded, however many
#: tenants there are.
LIMITS: Final = """
SELECT k.kind, o.concurrency, o.rate, o.per, o.set_by, o.set_at,
       (SELECT count(*) FROM pgpool_jobs AS j
        WHERE j.kind = k.kind AND j.state = 'running' AND j.limit_attempt = j.attempts),
       (SELECT coalesce(sum(t.n), 0) FROM pgpool_limit_ticks AS t
        WHERE t.kind = k.kind
          AND t.used_at > now() - make_interval(secs => coalesce(f.per, 1))),
       d.ready, f.concurrency, f.rate, CASE WHEN f.rate IS NOT NULL THEN f.per END,
       d.ready - least(d.ready, f.allowance),
       o.scope, s.scopes, s.top
FROM (SELECT kind FROM pgpool_limits_in_force
      UNION SELECT kind FROM pgpool_limit_ticks
      UNION SELECT kind FROM pgpool_jobs
            WHERE state = 'running' AND limit_attempt = attempts) AS k
LEFT JOIN pgpool_limits AS o USING (kind)
LEFT JOIN pgpool_limits_in_force AS f USING (kind)
CROSS JOIN LATERAL (
    SELECT count(*) AS ready FROM pgpool_jobs AS j
    WHERE j.kind = k.kind AND j.state IN ('ready', 'scheduled') AND j.run_at <= now()
) AS d
CROSS JOIN LATERAL (
    SELECT count(*) AS scopes,
           coalesce(json_agg(json_build_array(scope, running, used)
                             ORDER BY busiest) FILTER (WHERE busiest <= %(top)s),
                    '[]') AS top
    FROM (SELECT scope, sum(running) AS running, sum(used) AS used,
                 row_number() OVER (ORDER BY sum(running) + sum(used) DESC, scope) AS busiest
          FROM (SELECT j.limit_scope, 1, 0 FROM pgpool_jobs AS j
                WHERE j.kind = k.kind AND j.limit_scope IS NOT NULL
                  AND j.state = 'running' AND j.limit_attempt = j.attempts
                UNION ALL
                SELECT t.scope, 0, t.n FROM pgpool_limit_ticks AS t
                WHERE t.kind = k.kind AND t.scope <> ''
                  AND t.used_at > now() - make_interval(secs => coalesce(f.per, 1)))
               AS u(scope, running, used)
          GROUP BY scope) AS s
) AS s
ORDER BY k.kind
"""
