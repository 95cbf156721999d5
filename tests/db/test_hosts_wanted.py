"""The view a fleet that sizes itself reads (pgpool_hosts_wanted, migrations 0022 and 0024):
per queue, its ready and running jobs, its lag, and the hosts it wants for the fleet's
target lag, from the job time and --procs the live hosts measured and their claims per
second; the ready jobs that wait on their kind's limit counted apart, neither backlog nor
lag."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from claims import in_registry
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool import ops
from pgpool.host.lease import Lease
from pgpool.host.parts.hosts import HostRegistry

#: What KEDA's PostgreSQL trigger runs (deploy/kubernetes/keda-scaledobject.yaml): always
#: one row, 0 for a queue with no job.
KEDA_QUERY = ("SELECT coalesce(max(hosts_wanted), 0) FROM pgpool_hosts_wanted "
              "WHERE queue = %s")


def add_host(db: psycopg.Connection, owner: str, *, procs: int, job_seconds: float | None,
             claims_per_sec: float | None, queues: tuple[str, ...] = ("default",),
             seen_ago: float = 0.0, lease: float = 30.0) -> None:
    db.execute(
        "INSERT INTO pgpool_hosts (owner, hostname, pid, procs, queues, kinds, lease, "
        "last_seen, job_seconds, claims_per_sec) VALUES (%s, 'h', 1, %s, %s, '{k}', %s, "
        "now() - make_interval(secs => %s), %s, %s)",
        (owner, procs, list(queues), lease, seen_ago, job_seconds, claims_per_sec))


def wanted(db: psycopg.Connection, queue: str = "default") -> dict[str, object]:
    cur = db.execute("SELECT * FROM pgpool_hosts_wanted WHERE queue = %s", (queue,))
    row = cur.fetchone()
    assert cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True)) if row else {}


def keda(db: psycopg.Connection, queue: str = "default") -> int:
    return db.execute(KEDA_QUERY, (queue,)).fetchone()[0]


def test_a_queue_with_no_job_wants_no_host(db):
    add_host(db, "a", procs=4, job_seconds=0.5, claims_per_sec=10)
    assert wanted(db) == {}
    assert keda(db) == 0


def test_work_and_no_host_wants_one_which_measures_the_job_time(db):
    pgpool.enqueue_many(db, "k", [{} for _ in range(600)])
    row = wanted(db)
    assert (row["ready"], row["running"], row["hosts"], row["job_seconds"]) == (600, 0, 0, None)
    assert row["hosts_wanted"] == 1
    assert keda(db) == 1


def test_hosts_wanted_keep_up_with_arrivals_and_start_the_backlog_within_the_target(db):
    pgpool.enqueue_many(db, "k", [{} for _ in range(600)])
    db.execute("UPDATE pgpool_jobs SET run_at = now() - interval '42 seconds'")
    # Two live hosts of 4 workers, 0.5 s a job, claiming 10 jobs/s each; one stale host
    # (beaten a lease ago) and one serving another queue, neither counted.
    add_host(db, "a", procs=4, job_seconds=0.5, claims_per_sec=10)
    add_host(db, "b", procs=4, job_seconds=0.5, claims_per_sec=10)
    add_host(db, "gone", procs=64, job_seconds=9.0, claims_per_sec=100, seen_ago=30)
    add_host(db, "other", procs=64, job_seconds=9.0, claims_per_sec=100, queues=("other",))
    row = wanted(db)
    assert row["hosts"] == 2 and row["procs"] == 4 and row["job_seconds"] == 0.5
    assert row["claims_per_sec"] == 20
    assert 42 <= row["lag_seconds"] < 52
    # Keeping up: 20 jobs/s x 0.5 s = 10 busy workers; the backlog: 600 x 0.5 s of work
    # to start within 60 s = 5 workers; 15 workers / 4 per host = 3.75: 4 hosts.
    assert row["target_lag_seconds"] == 60
    assert row["hosts_wanted"] == 4 == keda(db)
    # Half the target lag: twice the backlog's workers: (10 + 10) / 4 = 5 hosts.
    db.execute("UPDATE pgpool_fleet SET target_lag_seconds = 30")
    assert wanted(db)["hosts_wanted"] == 5
    # Running jobs count as work in progress, not as backlog: all of them claimed, the
    # fleet only needs to keep up: 10 / 4 = 2.5: 3 hosts.
    db.execute("UPDATE pgpool_jobs SET state = 'running', locked_by = 'a', "
               "lease_until = now() + interval '30 seconds', attempts = 1")
    row = wanted(db)
    assert (row["ready"], row["running"], row["hosts_wanted"]) == (0, 600, 3)


def test_a_target_lag_that_is_not_positive_is_refused(db):
    for bad in ("0", "-1", "'Infinity'"):
        try:
            with db.transaction():
                db.execute(f"UPDATE pgpool_fleet SET target_lag_seconds = {bad}")
        except psycopg.errors.CheckViolation:
            continue
        raise AssertionError(f"target_lag_seconds = {bad} was accepted")


def run_limited(db: psycopg.Connection, kind: str, n: int) -> None:
    """``n`` jobs of ``kind`` running with slots 1..n, as the limited claim leaves them."""
    pgpool.enqueue_many(db, kind, [{} for _ in range(n)])
    db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, locked_by = 'a', "
               "lease_until = now() + interval '1 hour', limit_slot = s.slot, "
               "limit_attempt = 1 FROM (SELECT id AS i, row_number() OVER (ORDER BY id) AS "
               "slot FROM pgpool_jobs WHERE kind = %s AND state = 'ready') AS s "
               "WHERE id = s.i", (kind,))


def test_jobs_waiting_on_a_full_concurrency_limit_are_neither_backlog_nor_lag(db):
    # 600 unlimited jobs due 42 s ago: 600 x 0.5 s to start within 60 s = 5 workers, 2 hosts
    # of 4 (the test above). Then a kind limited to 2 at once, both slots taken, and 1,000
    # more of it due 5 minutes ago: no more host could start one of them.
    pgpool.enqueue_many(db, "k", [{} for _ in range(600)])
    db.execute("UPDATE pgpool_jobs SET run_at = now() - interval '42 seconds'")
    add_host(db, "a", procs=4, job_seconds=0.5, claims_per_sec=0)
    assert wanted(db)["hosts_wanted"] == 2
    ops.set_limit(db, "gpu", concurrency=2)
    run_limited(db, "gpu", 2)
    pgpool.enqueue_many(db, "gpu", [{} for _ in range(1000)])
    db.execute("UPDATE pgpool_jobs SET run_at = now() - interval '5 minutes' "
               "WHERE kind = 'gpu' AND state = 'ready'")
    row = wanted(db)
    assert row["hosts_wanted"] == 2 == keda(db)
    assert 42 <= row["lag_seconds"] < 52  # the unlimited jobs' age, not the waiting ones'
    assert (row["ready"], row["running"], row["waiting_on_limits"]) == (1600, 2, 1000)
    # One slot freed: one job more hosts could start, and it has waited 5 minutes.
    db.execute("DELETE FROM pgpool_jobs WHERE id = (SELECT min(id) FROM pgpool_jobs "
               "WHERE state = 'running')")
    row = wanted(db)
    assert (row["waiting_on_limits"], row["hosts_wanted"]) == (999, 2)
    assert row["lag_seconds"] >= 300


def test_jobs_past_a_rate_wait_on_it_and_lag_only_from_when_it_had_room(db):
    # A host's code limits "sync" to 10 a minute (the hosts publish it: not an override).
    add_host(db, "a", procs=4, job_seconds=0.5, claims_per_sec=0)
    db.execute("""UPDATE pgpool_hosts SET limits = '{"sync": {"rate": 10, "per": 60}}'""")
    pgpool.enqueue_many(db, "sync", [{} for _ in range(1000)])
    db.execute("UPDATE pgpool_jobs SET run_at = now() - interval '5 minutes'")
    # Its ring used up 10 s ago: the rate has no room for 50 s.
    db.execute("INSERT INTO pgpool_limit_ticks (kind, slot, used_at, n) SELECT 'sync', s, "
               "now() - interval '10 seconds', 1 FROM generate_series(1, 10) AS s")
    row = wanted(db)
    # Within the 60 s target lag the rate starts 10: the other 990 wait on it.
    assert (row["ready"], row["waiting_on_limits"], row["lag_seconds"]) == (1000, 990, 0)
    assert row["hosts_wanted"] == 1
    # 100 times the backlog waits on the rate the same: no more hosts for it.
    pgpool.enqueue_many(db, "sync", [{} for _ in range(99_000)])
    row = wanted(db)
    assert (row["waiting_on_limits"], row["hosts_wanted"]) == (99_990, 1)
    # The ring last used 70 s ago: room for 10 s, and the jobs lag from then, not from when
    # they were due.
    db.execute("UPDATE pgpool_limit_ticks SET used_at = now() - interval '70 seconds'")
    assert 10 <= wanted(db)["lag_seconds"] < 20


def test_a_host_publishes_its_codes_limits_and_an_override_wins_over_them(db, dsn):
    async def register(pool: AsyncConnectionPool) -> None:
        await HostRegistry(
            pool, "me:9:z", procs=1, queues=["default"], kinds=["gpu", "sync", "k"],
            lease=Lease(10), max_claims_per_sec=400, counters=lambda: (0, 0, 0, None, 1),
            limits={"gpu": pgpool.Limit(concurrency=3),
                    "sync": pgpool.Limit(rate=5, per=timedelta(minutes=1))}).register()

    in_registry(dsn, register)
    assert db.execute("SELECT limits FROM pgpool_hosts").fetchone()[0] == {
        "gpu": {"concurrency": 3}, "sync": {"rate": 5, "per": 60.0}}
    ops.set_limit(db, "sync", concurrency=2)
    in_force = {u.kind: (u.concurrency, u.rate, u.per) for u in ops.limits(db)}
    assert in_force == {"gpu": (3, None, None), "sync": (2, 5, 60.0)}


def test_a_limit_by_tenant_holds_back_no_start_fleet_wide(db, dsn):
    # A host's code limits "per.tenant" to 1 running per tenant: each tenant is bounded,
    # not the kind, so more hosts do start its other tenants' jobs. Its published limit
    # says so, and its backlog counts as any other's.
    async def register(pool: AsyncConnectionPool) -> None:
        await HostRegistry(
            pool, "me:9:z", procs=4, queues=["default"], kinds=["per.tenant"],
            lease=Lease(10), max_claims_per_sec=400, counters=lambda: (0, 0, 0, None, 1),
            limits={"per.tenant": pgpool.Limit(concurrency=1, by="tenant")}).register()

    in_registry(dsn, register)
    assert db.execute("SELECT limits FROM pgpool_hosts").fetchone()[0] == {
        "per.tenant": {"concurrency": 1, "by": "tenant"}}
    db.execute("UPDATE pgpool_hosts SET job_seconds = 0.5, claims_per_sec = 0")
    run_limited(db, "per.tenant", 2)  # two running, holding slots
    for tenant in ("a", "b", "c"):
        pgpool.enqueue_many(db, "per.tenant", [{} for _ in range(200)], tenant=tenant)
    row = wanted(db)
    # 600 x 0.5 s to start within 60 s: 5 workers, 2 hosts of 4; none of them waiting.
    assert (row["ready"], row["waiting_on_limits"], row["hosts_wanted"]) == (600, 0, 2)
    (use,) = ops.limits(db)
    assert (use.concurrency, use.waiting) == (1, 0)
    # An operator's override of the scope back to the kind as a whole: now 1 runs fleet-wide
    # at most, 2 hold slots, and every ready job waits on it.
    ops.set_limit(db, "per.tenant", by="kind")
    assert wanted(db)["waiting_on_limits"] == 600
