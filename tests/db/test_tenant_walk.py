"""The claim's walk over tenants goes on past tenants that give nothing now (at the tenant
cap, or their first job waiting on a running concurrency key), so other tenants' ready jobs
do not wait, a worker free, for the blocking jobs to end (issue 19, item 2).

Claims are checked on a `Claimer` against the real database, a host's behaviour with a real
`pgpool run`; nothing here asserts wall-clock times.
"""

from __future__ import annotations

import psycopg
from claims import in_registry
from commands import RUN
from dbtools import one
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool
from records import read_records
from waits import wait_until

import pgpool
from pgpool.host.claimer import Claimer
from pgpool.host.lease import Lease
from pgpool.registry import Handler
from pgpool.sql.jobs import TENANT_SKIPS


def claimer(pool: AsyncConnectionPool, *, tenant_cap: int | None = None,
            owner: str = "host-a") -> Claimer:
    return Claimer(pool, owner, queues=("default",),
                   handlers={"k": Handler("k", print, None, None)}, lease=Lease(30),
                   max_attempts=5, timeout=None, tenant_cap=tenant_cap)


def enqueue(db: psycopg.Connection, tenant: str, n: int, key: str | None = None) -> list[int]:
    return [pgpool.enqueue(db, "k", {}, tenant=tenant, concurrency_key=key)
            for _ in range(n)]


def test_a_claim_of_one_walks_past_a_tenant_whose_key_is_running(db, dsn):
    # Tenant a's two jobs share a key, tenant b's three have none. Once a1 runs, a has
    # nothing to give: every claim of one must still reach b until b is empty.
    a = enqueue(db, "a", 2, key="ka")
    b = enqueue(db, "b", 3)

    async def claims(pool: AsyncConnectionPool) -> list[list[int]]:
        c = claimer(pool)
        return [[j.id for j in await c.claim(1)] for _ in range(5)]

    assert in_registry(dsn, claims) == [a[:1], b[:1], b[1:2], b[2:], []]


def test_a_claim_walks_past_tenants_at_the_cap(db, dsn):
    # Another host runs a job of tenant a: a is at the cap of 1. A claim starting at a (a
    # fresh claimer's cursor) must go on to b.
    a = enqueue(db, "a", 2)
    b = enqueue(db, "b", 1)

    async def claims(pool: AsyncConnectionPool) -> tuple[list[int], list[int]]:
        other = await claimer(pool, tenant_cap=1, owner="host-b").claim(1)
        mine = await claimer(pool, tenant_cap=1).claim(1)
        return [j.id for j in other], [j.id for j in mine]

    assert in_registry(dsn, claims) == (a[:1], b)


def test_a_tenant_whose_first_job_waits_on_its_key_still_gives_a_later_one(db, dsn):
    # The walk judges a tenant by its first job; the claim still reads the rest of its jobs.
    (running,) = enqueue(db, "a", 1, key="ka")
    db.execute("UPDATE pgpool_jobs SET state = 'running', locked_by = 'elsewhere', "
               "attempts = 1 WHERE id = %s", (running,))
    enqueue(db, "a", 1, key="ka")
    free = enqueue(db, "a", 1)
    enqueue(db, "b", 1, key="ka")

    jobs = in_registry(dsn, lambda pool: claimer(pool).claim(2))
    assert [j.id for j in jobs] == free


def test_a_claim_fills_its_batch_from_tenants_past_a_window_of_blocked_ones(db, dsn):
    # Four tenants come first in the walk, each with its key running; four more have a
    # job each that can run. A claim of 4 visits 4 tenants before the rest: it must take
    # all four free jobs, one per tenant, and none of the blocked ones.
    for tenant in ("a0", "a1", "a2", "a3"):
        db.execute("INSERT INTO pgpool_jobs (kind, payload, tenant, concurrency_key, state, "
                   "locked_by, attempts) VALUES ('k', '{}', %s, %s, 'running', 'elsewhere', 1)",
                   (tenant, "key-" + tenant))
        enqueue(db, tenant, 2, key="key-" + tenant)
    free = [i for t in ("b0", "b1", "b2", "b3") for i in enqueue(db, t, 1)]

    jobs = in_registry(dsn, lambda pool: claimer(pool).claim(4))
    assert sorted(j.id for j in jobs) == free


def test_past_the_walks_bound_the_next_claim_starts_where_this_one_stopped(db, dsn):
    # More tenants blocked on running keys than one claim may step over: the claim comes
    # back empty, but the next one starts after the tenants it visited, so the free tenant
    # behind them is reached within a few claims, not when the keys are released.
    blocked = [f"a{i:03}" for i in range(TENANT_SKIPS + 5)]
    db.execute("INSERT INTO pgpool_jobs (kind, payload, tenant, concurrency_key, state, "
               "locked_by, attempts) SELECT 'k', '{}', t, 'key-' || t, 'running', "
               "'elsewhere', 1 FROM unnest(%s::text[]) AS t", (blocked,))
    db.execute("INSERT INTO pgpool_jobs (kind, payload, tenant, concurrency_key) "
               "SELECT 'k', '{}', t, 'key-' || t FROM unnest(%s::text[]) AS t", (blocked,))
    (free,) = enqueue(db, "b", 1)

    async def claims(pool: AsyncConnectionPool) -> list[list[int]]:
        c = claimer(pool)
        return [[j.id for j in await c.claim(1)] for _ in range(3)]

    assert in_registry(dsn, claims) == [[], [free], []]


def test_a_new_tenants_short_jobs_run_beside_tenants_blocked_on_a_busy_key(
        db, dsn, record_dir):
    # A long job holds key k; eight more tenants queue behind that key: with a claim of
    # one, the walk's window is full of tenants that can give nothing. A tenant that comes
    # last in the walk then enqueues short jobs: they must all end while the long job still
    # runs (the records say so, not a clock). Three workers: the long job's, and one idle
    # worker per short job, so no short job is queued behind the long one in its pipe.
    holder = pgpool.enqueue(db, "record", {"sleep": 600}, tenant="a0", concurrency_key="k")
    host = start_pgpool(dsn, *RUN, "--procs", "3", "--batch", "1", "--grace", "0",
                        record_dir=record_dir)
    host.event("started")
    wait_until(lambda: (holder, "start") in {(r[0], r[3]) for r in read_records(record_dir)},
               "the long job to start")
    for i in range(1, 9):
        pgpool.enqueue(db, "record", {"sleep": 600}, tenant=f"a{i}", concurrency_key="k")
    short = [pgpool.enqueue(db, "record", {}, tenant="z") for _ in range(2)]
    wait_until(lambda: not one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = ANY(%s)",
                               short)[0], "the new tenant's short jobs to be done", timeout=60)
    records = read_records(record_dir)
    assert {(job, "end") for job in short} <= {(r[0], r[3]) for r in records}
    assert (holder, "end") not in {(r[0], r[3]) for r in records}  # it still runs
    assert one(db, "SELECT state FROM pgpool_jobs WHERE id = %s", holder) == ("running",)
    assert host.stop() == 0
