"""The limited claim (`sql.CLAIM_LIMITED`, `pgpool.limits`) on a real server: a kind's
concurrency limit holds across claimers racing on their own connections, a slot is free
again however its job stops running, a lowered limit waits for the jobs above it, and a
job that ran under a limit is claimed as any other once the limit is gone; a rate takes at
most R in a window, racing or not, and R more once the window has passed."""

from __future__ import annotations

import asyncio
import functools

import psycopg
from dbtools import with_pools
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.host.claimer import Claimer, configure_connection
from pgpool.host.lease import Lease
from pgpool.registry import Handler

#: How a host sets up its claim connections.
CLAIM_CONNECTION = functools.partial(configure_connection, lease=Lease(30), claims=True)

def handlers(concurrency: int | None, *, also: str | None = None,
             rate: int | None = None, per: float = 1.0) -> dict[str, Handler]:
    limit = (None if concurrency is None and rate is None
             else pgpool.Limit(concurrency=concurrency, rate=rate, per=per))
    found = {"lim": Handler("lim", print, None, None, limit=limit)}
    if also:
        found[also] = Handler(also, print, None, None)
    return found


def claimer(pool: AsyncConnectionPool, owner: str, concurrency: int | None,
            also: str | None = None, rate: int | None = None, per: float = 1.0) -> Claimer:
    return Claimer(pool, owner, queues=("default",),
                   handlers=handlers(concurrency, also=also, rate=rate, per=per),
                   lease=Lease(30), max_attempts=20, timeout=None)


def running(db: psycopg.Connection, kind: str = "lim") -> int:
    return db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running' AND kind = %s",
                      (kind,)).fetchone()[0]


def test_racing_claimers_never_take_more_than_the_limit(db: psycopg.Connection,
                                                         dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(40)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        claimers = [claimer(pool, f"host-{n}:1:aa", 3) for n, pool in enumerate(pools)]
        got = []
        for _ in range(5):  # rounds of four claims at once, two per claimer
            batches = await asyncio.gather(*(c.claim(10) for c in claimers for _ in "ab"))
            got.append(sum(len(b) for b in batches))
        return got

    got = with_pools(dsn, 2, CLAIM_CONNECTION, work)
    assert sum(got) == 3
    assert running(db) == 3
    slots = db.execute("SELECT array_agg(limit_slot ORDER BY limit_slot) FROM pgpool_jobs "
                       "WHERE state = 'running'").fetchone()[0]
    assert slots == [1, 2, 3]


def test_a_slot_is_free_again_however_its_job_stops_running(db: psycopg.Connection,
                                                             dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(10)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = claimer(pools[0], "host-a:1:aa", 2)
        got = [len(await c.claim(10))]
        # One acked (deleted), one back to ready (a retry, a hand-back, the reaper): each
        # frees its slot, and the row that went back keeps its stale slot number.
        db.execute("DELETE FROM pgpool_jobs WHERE id = (SELECT min(id) FROM pgpool_jobs "
                   "WHERE state = 'running')")
        db.execute("UPDATE pgpool_jobs SET state = 'ready', locked_by = NULL, "
                   "lease_until = NULL WHERE state = 'running'")
        db.commit()
        got.append(len(await c.claim(10)))
        got.append(len(await c.claim(10)))
        return got

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [2, 2, 0]
    assert running(db) == 2


def test_a_lowered_limit_waits_for_the_jobs_above_it(db: psycopg.Connection,
                                                      dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(10)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        got = [len(await claimer(pools[0], "host-a:1:aa", 5).claim(10))]
        lowered = claimer(pools[0], "host-b:1:aa", 3)
        got.append(len(await lowered.claim(10)))
        # The jobs above the new limit end: the ones left are within it, the rest is room.
        db.execute("DELETE FROM pgpool_jobs WHERE state = 'running' AND limit_slot > 3")
        db.commit()
        left = running(db)
        got.append(len(await lowered.claim(10)) + left)
        return got

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [5, 0, 3]
    assert running(db) == 3


def test_jobs_once_limited_are_claimed_as_any_other_without_the_limit(
        db: psycopg.Connection, dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(6)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        got = [len(await claimer(pools[0], "host-a:1:aa", 3).claim(10))]
        # Back to ready, each with the slot it held: a later claim makes it another attempt.
        db.execute("UPDATE pgpool_jobs SET state = 'ready', locked_by = NULL, "
                   "lease_until = NULL WHERE state = 'running'")
        db.commit()
        got.append(len(await claimer(pools[0], "host-b:1:aa", None).claim(10)))
        return got

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [3, 6]
    assert running(db) == 6


def test_a_host_claims_its_limited_and_unlimited_kinds_together(db: psycopg.Connection,
                                                                dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(5)])
    pgpool.enqueue_many(db, "free", [{"i": i} for i in range(5)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[tuple[str, int]]:
        jobs = await claimer(pools[0], "host-a:1:aa", 2, also="free").claim(20)
        return sorted((job.kind, job.max_attempts) for job in jobs)

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [("free", 20)] * 5 + [("lim", 20)] * 2
    assert running(db, "lim") == 2


def test_the_database_refuses_a_second_running_job_in_a_slot(db: psycopg.Connection,
                                                             dsn: str) -> None:
    """What holds the limit when two claims both see a slot free (each statement's snapshot
    predates the other's commit): the unique index, not the claim's reading."""
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(2)])
    db.commit()
    with_pools(dsn, 1, CLAIM_CONNECTION,
               lambda pools: claimer(pools[0], "host-a:1:aa", 1).claim(10))
    taken = db.execute("SELECT limit_slot FROM pgpool_jobs WHERE state = 'running'").fetchone()
    try:
        db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = attempts + 1, "
                   "limit_slot = %s, limit_attempt = attempts + 1 WHERE state = 'ready'",
                   taken)
    except psycopg.errors.UniqueViolation:
        db.rollback()
    else:
        raise AssertionError("a second job took a slot that a running job holds")
    assert running(db) == 1


def test_a_rate_takes_at_most_r_in_a_window_however_claims_race(db: psycopg.Connection,
                                                                 dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(30)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        claimers = [claimer(pool, f"host-{n}:1:aa", None, rate=7, per=3600)
                    for n, pool in enumerate(pools)]
        got = []
        for _ in range(3):
            batches = await asyncio.gather(*(c.claim(5) for c in claimers for _ in "ab"))
            got.append(sum(len(b) for b in batches))
        # The window passes (its ticks an hour old): seven more, and no more.
        db.execute("UPDATE pgpool_limit_ticks SET used_at = used_at - interval '1 hour'")
        db.commit()
        batches = await asyncio.gather(*(c.claim(5) for c in claimers for _ in "ab"))
        got.append(sum(len(b) for b in batches))
        return got

    got = with_pools(dsn, 2, CLAIM_CONNECTION, work)
    assert sum(got[:3]) == 7
    assert got[3] == 7
    assert running(db) == 14
    assert db.execute("SELECT count(*) FROM pgpool_limit_ticks WHERE kind = 'lim'"
                      ).fetchone()[0] == 7


def test_a_kind_with_a_rate_and_a_concurrency_limit_keeps_both(db: psycopg.Connection,
                                                                dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(10)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = claimer(pools[0], "host-a:1:aa", 2, rate=3, per=3600)
        got = [len(await c.claim(10))]  # two slots
        db.execute("DELETE FROM pgpool_jobs WHERE state = 'running'")  # both done
        db.commit()
        got.append(len(await c.claim(10)))  # two slots free, one tick left
        got.append(len(await c.claim(10)))  # the window is spent
        return got

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [2, 1, 0]
