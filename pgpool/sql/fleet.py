"""The fleet: what the hosts of one installation share. Their rows in ``pgpool_hosts``,
the claim budget they divide, operator steering as a host reads it, and the periodic
schedules they enqueue exactly once between them."""

from __future__ import annotations

from typing import Final

from .common import LEADER, OUR_CHANNEL

#: A host row is stale, and pruned, after this many of that host's own leases without a
#: beat (``stale_leases`` in these statements): it beats every third of a lease, so that
#: is nine missed beats.
STALE_AFTER_LEASES: Final = 3
#: Another host's row counts toward the claim budget for this many of its leases after its
#: last beat (``counted_leases``): two beat intervals, a third of a lease each
#: (`pgpool.host.budget.COUNTED_BEATS`).
COUNTED_LEASES: Final = 2 / 3

# --- host registry (pgpool.host.parts.hosts) ----------------------------------------------

#: Register a dispatcher, or record that it is alive. An upsert, so a host whose row was
#: pruned while it was cut off from the database reappears at its next beat; ``started_at``
#: is the first registration's time, kept across both. Runs in the budget transaction
#: (`BUDGET_LOCK`), with the share and demand that beat worked out. ``limits``, the code's
#: limits (`pgpool_limits_in_force` reads them), is written with the row only: a host's
#: code does not change while it runs.
HOST_UPSERT: Final = """
INSERT INTO pgpool_hosts AS h (owner, hostname, pid, procs, queues, kinds, lease,
                               started_at, last_seen, jobs_done, jobs_failed, jobs_claimed,
                               claims_per_sec, max_claims_per_sec, claims_share,
                               claims_demand, claim_p99_ms, batch, job_seconds, limits)
VALUES (%(owner)s, %(hostname)s, %(pid)s, %(procs)s, %(queues)s::text[], %(kinds)s::text[],
        %(lease)s, coalesce(%(started_at)s::timestamptz, now()), now(),
        %(jobs_done)s, %(jobs_failed)s, %(jobs_claimed)s,
        %(claims_per_sec)s, %(max_claims_per_sec)s, %(claims_share)s, %(claims_demand)s,
        %(claim_p99_ms)s, %(batch)s, %(job_seconds)s, %(limits)s::jsonb)
ON CONFLICT (owner) DO UPDATE
SET last_seen = now(), jobs_done = excluded.jobs_done, jobs_failed = excluded.jobs_failed,
    jobs_claimed = excluded.jobs_claimed, claims_per_sec = excluded.claims_per_sec,
    max_claims_per_sec = excluded.max_claims_per_sec, claims_share = excluded.claims_share,
    claims_demand = excluded.claims_demand, claim_p99_ms = excluded.claim_p99_ms,
    batch = excluded.batch, job_seconds = coalesce(excluded.job_seconds, h.job_seconds)
RETURNING h.started_at
"""

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
#: notice that a job will wait); live as in `observe.STATUS_HOSTS`.
KIND_SERVED: Final = """
SELECT EXISTS (
    SELECT FROM pgpool_hosts
    WHERE %(queue)s = ANY(queues) AND %(kind)s = ANY(kinds)
      AND last_seen >= now() - make_interval(secs => %(stale_leases)s * lease)
)
"""

# --- the fleet's claim budget (pgpool.host.budget) ----------------------------------------

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
#: ``idle_peer``: the host is of this one's group (its queues and kinds, ``queues`` and
#: ``kinds``, the latter sorted) and claimed no job since its previous beat; ``ahead``: it
#: comes first by owner. How many idle peers, and how many of them ahead: this host's
#: rank among the idle hosts that answer a notification (`pgpool.host.settle`).
BUDGET_PEERS: Final = """
SELECT claims_demand, claims_share,
       queues = %(queues)s::text[] AND kinds = %(kinds)s::text[]
           AND coalesce(claims_per_sec, 0) = 0 AS idle_peer,
       owner < %(owner)s AS ahead
FROM pgpool_hosts
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

# --- steering, as a host reads it (pgpool.host.parts.control) -----------------------------

#: What a host polls (and re-reads on a `common.CONTROL` notification): the paused queues, and a
#: digest of the cancelled attempts still in flight (running rows with no owner, `ops.CANCEL`),
#: whose change makes the host check its jobs at once. A set, not a high-water mark: a
#: cancel shows in it as soon as it commits, whatever order cancels commit in. (The latest
#: ``died_at`` missed a cancel made in a transaction that started before an earlier-committed
#: one: now() is the transaction's start; a sequence would miss it the same way, nextval
#: order is not commit order.) The set is read on the running index (``locked_by IS
#: NULL``), and holds only cancels whose lease has not run out yet.
#: Third, operators' overrides of limits (`pgpool.limits`), each [kind, concurrency, rate,
#: per, set_by, scope], in kind order.
CONTROL_POLL: Final = """
SELECT ARRAY(SELECT queue FROM pgpool_paused ORDER BY queue),
       (SELECT md5(string_agg(id::text, ',' ORDER BY id)) FROM pgpool_jobs
        WHERE state = 'running' AND locked_by IS NULL),
       (SELECT coalesce(json_agg(json_build_array(kind, concurrency, rate, per, set_by,
                                                  scope) ORDER BY kind), '[]')
        FROM pgpool_limits)
"""

# --- periodic jobs (pgpool.host.parts.periodic) -------------------------------------------

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

#: The most ``--procs`` of a live host (NULL when none is live): a kind whose handler
#: takes more ``cpus`` waits for a wider host (`pgpool.registry.Handler.enqueue` warns).
WIDEST_LIVE_HOST: Final = """
SELECT max(procs) FROM pgpool_hosts
WHERE last_seen >= now() - make_interval(secs => %(stale_leases)s * lease)
"""

# --- the maintenance leader (pgpool.host.parts.leader) ------------------------------------

#: Take or renew the lease of ``role`` for ``owner``, ``lease`` seconds from now: when this
#: host holds it, or when it expired. The row is skipped while another transaction holds
#: it (a leader's fenced work, `LEADER_FENCE`, or another host's attempt), so nobody waits
#: here. The token grows when the lease changes hands or lapsed. One row: ``won`` (this
#: host's token, NULL when it did not take it), and the lease as it stood before this
#: statement: its holder, token and seconds left (negative: expired). No row: the role's
#: row is missing (`LEADER_SEED`).
LEADER_ACQUIRE: Final = """
WITH cur AS (
    SELECT role FROM pgpool_leader
    WHERE role = %(role)s AND (holder = %(owner)s OR expires_at < now())
    FOR NO KEY UPDATE SKIP LOCKED
), won AS (
    UPDATE pgpool_leader AS l
    SET token = CASE WHEN l.holder IS DISTINCT FROM %(owner)s OR l.expires_at < now()
                     THEN l.token + 1 ELSE l.token END,
        acquired_at = CASE WHEN l.holder IS DISTINCT FROM %(owner)s OR l.expires_at < now()
                           THEN now() ELSE l.acquired_at END,
        holder = %(owner)s,
        expires_at = now() + make_interval(secs => %(lease)s)
    FROM cur WHERE l.role = cur.role
    RETURNING l.token
)
SELECT (SELECT token FROM won), l.holder, l.token,
       extract(epoch FROM l.expires_at - now())::float8
FROM pgpool_leader AS l WHERE l.role = %(role)s
"""

#: Put back the row of ``role`` if it is missing (deleted by hand): nobody leads it.
LEADER_SEED: Final = """
INSERT INTO pgpool_leader (role) VALUES (%(role)s) ON CONFLICT (role) DO NOTHING
"""

#: The fence of a leader's work, first in each of its transactions: the row of ``role``,
#: locked FOR SHARE, if ``owner`` holds it with ``token`` and the lease has not expired;
#: no row otherwise (deposed: the transaction does nothing). A successor's `LEADER_ACQUIRE`
#: skips the row while this lock is held, so a takeover falls between two fenced
#: transactions, never during one; a transaction that starts after it sees the new holder
#: (READ COMMITTED re-reads a row locked after a concurrent update). The transaction also
#: ends itself after ``idle`` (``idle_in_transaction_session_timeout``, as text): a leader
#: frozen inside one (SIGSTOP, a stalled VM) must not keep the row locked, and the
#: successor out, for longer than that.
LEADER_FENCE: Final = """
SELECT set_config('idle_in_transaction_session_timeout', %(idle)s, true)
FROM pgpool_leader
WHERE role = %(role)s AND holder = %(owner)s AND token = %(token)s AND expires_at > now()
FOR SHARE
"""

#: A clean exit: give up the lease of ``role`` held with ``token``, and say so on the
#: installation's channel (`LEADER`), so another host takes over now.
LEADER_RESIGN: Final = f"""
WITH gone AS (
    UPDATE pgpool_leader SET holder = NULL, expires_at = '-infinity'
    WHERE role = %(role)s AND holder = %(owner)s AND token = %(token)s
    RETURNING role
)
SELECT count(pg_notify({OUR_CHANNEL}, '{LEADER}')) FROM gone
"""
