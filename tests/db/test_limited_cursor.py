"""The kind-wide limited claim's cursors (`sql.CLAIM_SLOTS`, `sql.CLAIM_LIMITED`): while no
job waiting in its kinds has a tenant or a concurrency key, it reads each (queue, kind)
pair from where its last claim stopped, as the plain claim does, so that a pinned xmin
horizon's dead rows cost it nothing; a job behind a cursor is found by a sweep.

Costs are read as shared buffers touched, never as times.
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest
from claims import handed_back_behind
from dbtools import GRANT_PARAMS, acked_but_the_last, explain_prepared, index_reads, with_pools
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.host.claimer import Claimer, configure_connection
from pgpool.host.lease import Lease
from pgpool.registry import Handler
from pgpool.sql import jobs as sql

CLAIM_CONNECTION = functools.partial(configure_connection, lease=Lease(30), claims=True)

#: A kind-wide limit never reached: a concurrency of 1,000,000, and a rate of 100,000 a
#: second for `sql.CLAIM_LIMITED`.
PARAMS: dict[str, Any] = {
    "queues": ["default"], "owner": "h", "lease": 30, "limit": 50, "limited_kinds": ["lim"],
    "limited_concurrency": [1_000_000], "limited_rate": [100_000], "limited_per": [1.0],
    "limited_max_attempts": [20], **sql.SWEEP, **GRANT_PARAMS}


def claimer(pool: AsyncConnectionPool) -> Claimer:
    handlers = {"lim": Handler("lim", print, None, None, limit=pgpool.Limit(concurrency=100))}
    return Claimer(pool, "host-a:1:aa", queues=("default",), handlers=handlers,
                   lease=Lease(30), max_attempts=20, timeout=None)


def claim_reads(db: psycopg.Connection, statement: str, params: dict[str, Any]
                ) -> tuple[int, int]:
    """Shared buffers ``statement``, as a host's prepared claim (generic plan), rolled back
    (it must claim 50 jobs), touches to find its jobs (on the ready index) and to find free
    slots (on the slots' unique index): each scan's own, not the update's writes, which
    land in pages the dead rows keep full, by how full."""
    with db.transaction(force_rollback=True):
        top = explain_prepared(db, getattr(sql, statement), params, "force_generic_plan",
                               "ANALYZE, BUFFERS, FORMAT JSON")
        assert db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running'"
                          ).fetchone()[0] == 50
    return index_reads(top, "pgpool_jobs_ready"), index_reads(top, "limit_running")


@pytest.mark.own_schema  # pages counted: a table no earlier test left free space in
def test_behind_a_pinned_horizon_a_limited_claim_from_its_cursor_reads_what_it_does_clean(
        db: psycopg.Connection, dsn: str) -> None:
    # A transaction holds a snapshot, so no vacuum can remove the 50,000 jobs claimed and
    # acked since: their ready-index entries stay ahead of the jobs still ready, and the
    # slots they held stay in the slots' unique index. A claim from the cursor starts past
    # the first; a sweep, from the start, walks them all. The slots are probed one by one,
    # never read whole (as the generic plan once did: an anti join on all of them).
    db.execute("ALTER TABLE pgpool_jobs SET (autovacuum_enabled = false)")
    try:
        db.execute("TRUNCATE pgpool_jobs")
        pgpool.enqueue_many(db, "lim", ({"n": i} for i in range(50_200)))
        db.execute(sql.ENSURE_TICKS, {"rate_kinds": ["lim"], "rates": [100_000]})
        db.execute("VACUUM ANALYZE pgpool_jobs, pgpool_limit_ticks")
        statements = ("CLAIM_SLOTS", "CLAIM_SLOTS_PLAIN", "CLAIM_LIMITED",
                      "CLAIM_LIMITED_PLAIN", "CLAIM_GRANTED")
        clean = {s: claim_reads(db, s, PARAMS) for s in statements}
        with psycopg.connect(dsn) as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM pgpool_jobs")
            cursor = acked_but_the_last(db, 200, ", attempts = 1, limit_attempt = 1, "
                                                 "limit_slot = id %% 900000 + 1")
            pinned = {s: claim_reads(db, s, {**PARAMS, **cursor}) for s in statements}
            swept = {s: claim_reads(db, s, PARAMS) for s in statements}
    finally:
        db.execute("ALTER TABLE pgpool_jobs RESET (autovacuum_enabled)")
    for s in statements:
        # Neither grows with the dead rows: its jobs are found within a page per job of
        # what it reads on the clean table (16 and 13 pages against 12 and 9 here), its
        # slots by a probe per job of a few pages: the index's levels, and the row of a
        # dead slot's entry the probe meets (51 to 153 pages, clean or pinned, as the
        # index has one to three levels; 2,852 when the generic plan read them all)...
        assert pinned[s][0] <= clean[s][0] + 50, (s, clean, pinned)
        assert pinned[s][1] <= 4 * 50, (s, clean, pinned)
        # ...which are there: a claim from the start walks them (it can fail).
        assert swept[s][0] > pinned[s][0] + 500, (s, pinned, swept)


def test_a_limited_job_committed_behind_the_cursor_is_claimed_by_the_next_claim(
        db: psycopg.Connection, dsn: str) -> None:
    # A producer's transaction enqueues first and commits last: its job is behind the
    # cursor of the claim that took the job committed meanwhile. That claim came back
    # short, so the next one sweeps, and the job waits for no poll.
    async def claims(pools: list[AsyncConnectionPool]) -> list[list[int]]:
        c = claimer(pools[0])
        with psycopg.connect(dsn) as late:
            behind = pgpool.enqueue(late, "lim", {})
            ahead = pgpool.enqueue(db, "lim", {})
            db.commit()
            first = [j.id for j in await c.claim(10)]
            late.commit()
        second = [j.id for j in await c.claim(10)]
        return [first, second, [ahead, behind]]

    first, second, (ahead, behind) = with_pools(dsn, 1, CLAIM_CONNECTION, claims)
    assert behind < ahead
    assert (first, second) == ([ahead], [behind])


@pytest.mark.usefixtures("costly_sweeps")
@pytest.mark.parametrize("finder", ["a sweep owed to it", "a tenant's job waiting"])
def test_a_limited_job_handed_back_behind_the_cursor_waits_for_a_sweep_or_a_tenant(
        db: psycopg.Connection, dsn: str, finder: str) -> None:
    # Only `sweep_next` (a host that handed jobs back, a burst host that reaped) starts a
    # sweep, and a job behind the cursor waits for it, for the limited claim's cursors as
    # for the plain claim's; or for a tenant's job, which makes the claim read its kinds
    # from the start, in tenant order.
    pgpool.enqueue_many(db, "lim", ({"n": i} for i in range(4)))
    db.commit()

    async def claims(pools: list[AsyncConnectionPool]) -> tuple[list[list[int]], list[int],
                                                                 list[int]]:
        c = claimer(pools[0])
        first, _ = await handed_back_behind(c, pools[0])
        # From the cursor: nothing; and again (short before, but sweeps cost).
        nothing = [[j.id for j in await c.claim(2)] for _ in "ab"]
        if finder == "a sweep owed to it":
            c.sweep_next()
            expected = [first[0]]
        else:
            expected = sorted([first[0], pgpool.enqueue(db, "lim", {}, tenant="acme")])
            db.commit()
        return nothing, sorted(j.id for j in await c.claim(2)), expected

    nothing, found, expected = with_pools(dsn, 1, CLAIM_CONNECTION, claims)
    assert nothing == [[], []]
    assert found == expected
