"""The fair claim's cursors (`sql.CLAIM`, `sql.CLAIM_CPU`): per (queue, kind) and tenant, the
claim-order key of the last job the claimer took there, so that a pinned xmin horizon's
dead rows, which lie at the head of every tenant's range of the ready index, cost its walk
and its scans nothing; a tenant without a cursor is reached by a descent bounded by the
next one with a cursor; a job behind a cursor is found by a sweep; and while a job with a
concurrency key waits, every tenant is read from the start.

Costs are read as shared buffers touched, never as times.
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest
from dbtools import explain_prepared, index_reads, with_pools
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.host.claimer import Claimer, configure_connection
from pgpool.host.lease import Lease
from pgpool.registry import Handler
from pgpool.sql import jobs as sql

CLAIM_CONNECTION = functools.partial(configure_connection, lease=Lease(30), claims=True)

TENANTS = 20
PARAMS: dict[str, Any] = {
    "queues": ["default"], "kinds": ["k"], "kind_max_attempts": [20], "owner": "h",
    "lease": 30, "limit": 50, "after": "", "tenant_cap": None}


def claimer(pool: AsyncConnectionPool) -> Claimer:
    return Claimer(pool, "host-a:1:aa", queues=("default",),
                   handlers={"k": Handler("k", print, None, None)}, lease=Lease(30),
                   max_attempts=20, timeout=None)


def ready_reads(db: psycopg.Connection, statement: str, params: dict[str, Any], mode: str
                ) -> int:
    """Shared buffers ``statement``, prepared under plan_cache_mode ``mode`` and rolled
    back (it must claim 50 jobs of 20 tenants), touches on the ready indexes to walk the
    tenants and find their jobs: each scan's own, not the update's writes."""
    with db.transaction(force_rollback=True):
        top = explain_prepared(db, getattr(sql, statement), params, mode,
                               "ANALYZE, BUFFERS, FORMAT JSON")
        assert db.execute("SELECT count(*), count(DISTINCT tenant) FROM pgpool_jobs "
                          "WHERE state = 'running'").fetchone() == (50, TENANTS)
    return index_reads(top, "pgpool_jobs_ready")


@pytest.mark.own_schema  # pages counted: a table no earlier test left free space in
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_behind_a_pinned_horizon_a_fair_claim_from_its_tenants_cursors_reads_what_it_does_clean(
        db: psycopg.Connection, dsn: str, mode: str) -> None:
    # A transaction holds a snapshot, so no vacuum can remove the 20,000 jobs of 20
    # tenants claimed and acked since: each tenant's range of the ready index starts with
    # a thousand dead entries. The walk and the scans reach each tenant from its cursor,
    # past them; a sweep, from the start, walks them all, twice.
    db.execute("ALTER TABLE pgpool_jobs SET (autovacuum_enabled = false)")
    try:
        db.execute("TRUNCATE pgpool_jobs")
        pgpool.enqueue_many(db, "k", ({"n": i} for i in range(1000 * TENANTS + 20 * TENANTS)))
        db.execute("UPDATE pgpool_jobs SET tenant = 't' || lpad((id %% %s)::text, 2, '0')",
                   (TENANTS,))
        db.execute("VACUUM ANALYZE pgpool_jobs")
        # Each tenant's cursor: its last job of those about to be taken (one COPY: one
        # run_at). Clean, the claim from them reads past jobs still there, alive.
        last = db.execute("SELECT max(id) FROM pgpool_jobs").fetchone()[0] - 20 * TENANTS
        rows = db.execute(
            "SELECT tenant, min(priority), min((extract(epoch FROM run_at) * 1000000)::int8),"
            " max(id) FROM pgpool_jobs WHERE id <= %s GROUP BY tenant ORDER BY tenant",
            (last,)).fetchall()
        cursors = {"cursor_pairs": [1] * TENANTS, "cursor_tenants": [r[0] for r in rows],
                   "cursor_priorities": [r[1] for r in rows],
                   "cursor_run_at_us": [r[2] for r in rows], "cursor_ids": [r[3] for r in rows]}
        statements = {"CLAIM_CURSORS": "CLAIM", "CLAIM_CPU_CURSORS": "CLAIM_CPU"}
        clean = {s: ready_reads(db, s, {**PARAMS, **cursors}, mode) for s in statements}
        with psycopg.connect(dsn) as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM pgpool_jobs")
            db.execute("UPDATE pgpool_jobs SET state = 'running' WHERE id <= %s", (last,))
            db.execute("DELETE FROM pgpool_jobs WHERE state = 'running'")
            pinned = {s: ready_reads(db, s, {**PARAMS, **cursors}, mode) for s in statements}
            swept = {s: ready_reads(db, sweep, PARAMS, mode) for s, sweep in statements.items()}
    finally:
        db.execute("ALTER TABLE pgpool_jobs RESET (autovacuum_enabled)")
    for s in statements:
        # It does not grow with the dead rows: within a page per job claimed of what the
        # same claim reads clean (376 against 382 pages here, in both plan modes)...
        assert pinned[s] <= clean[s] + 50, (s, clean, pinned)
        # ...and they are there: a claim from the start walks them (28,210; it can fail).
        assert swept[s] > pinned[s] + 10 * TENANTS * 50, (s, pinned, swept)


@pytest.mark.usefixtures("costly_sweeps")
def test_a_new_tenant_is_claimed_from_the_cursors_and_a_job_behind_one_waits_for_a_sweep(
        db: psycopg.Connection, dsn: str) -> None:
    # Tenant a's jobs are claimed and one is handed back, behind a's cursor. A job of a
    # new tenant b, which has no cursor, is claimed by the next claim, from the cursors:
    # the walk reaches b by a descent of its own. The job handed back is not (no sweep);
    # the sweep owed to it (`sweep_next`) finds it.
    pgpool.enqueue_many(db, "k", ({"n": i} for i in range(6)), tenant="a")
    a = [i for (i,) in db.execute("SELECT id FROM pgpool_jobs ORDER BY id")]
    db.commit()

    async def claims(pools: list[AsyncConnectionPool]) -> list[list[int]]:
        c = claimer(pools[0])
        taken = [[j.id for j in await c.claim(2)]]
        c.sweep_next()  # a sweep whose round trip is measured: sweeps "cost" from now on
        taken.append([j.id for j in await c.claim(2)])
        async with pools[0].connection() as conn:
            await conn.execute("UPDATE pgpool_jobs SET state = 'ready', locked_by = NULL, "
                               "lease_until = NULL WHERE id = %s", (taken[0][0],))
        b = pgpool.enqueue(db, "k", {}, tenant="b")
        db.commit()
        taken.append(sorted(j.id for j in await c.claim(2)))
        c.sweep_next()
        taken.append(sorted(j.id for j in await c.claim(2)))
        return [*taken, [b]]

    first, second, from_cursors, swept, (b,) = with_pools(dsn, 1, CLAIM_CONNECTION, claims)
    assert (first, second) == (a[0:2], a[2:4])
    assert from_cursors == [a[4], b]  # a's next one and b's; not a[0], behind a's cursor
    assert swept == [a[0], a[5]]


@pytest.mark.usefixtures("costly_sweeps")
def test_while_a_keyed_job_waits_every_tenant_is_read_from_the_start(
        db: psycopg.Connection, dsn: str) -> None:
    # Tenant a's first job waits on its key, held by a running job of tenant z: the first
    # claim takes a's later ones past it. Once the key is free, the next claim, which is
    # not a sweep, takes it: with a keyed job waiting, no tenant is read from its cursor
    # (a's would start past the job).
    holder = pgpool.enqueue(db, "k", {}, tenant="z", concurrency_key="key")
    db.commit()

    async def claims(pools: list[AsyncConnectionPool]) -> list[list[int]]:
        c = claimer(pools[0])
        held = [j.id for j in await c.claim(1)]
        waiting = pgpool.enqueue(db, "k", {}, tenant="a", concurrency_key="key")
        later = [pgpool.enqueue(db, "k", {}, tenant="a") for _ in range(2)]
        db.commit()
        taken = [held, [j.id for j in await c.claim(2)]]
        c.sweep_next()  # a sweep whose round trip is measured: sweeps "cost" from now on
        taken.append([j.id for j in await c.claim(2)])
        async with pools[0].connection() as conn:
            await conn.execute("DELETE FROM pgpool_jobs WHERE id = %s", (holder,))
        taken.append([j.id for j in await c.claim(2)])
        return [*taken, [waiting, *later]]

    held, later_ones, nothing, freed, (waiting, *later) = with_pools(
        dsn, 1, CLAIM_CONNECTION, claims)
    assert held == [holder]
    assert later_ones == later
    assert nothing == []
    assert freed == [waiting]
