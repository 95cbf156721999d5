"""The limited claim (`sql.CLAIM_LIMITED`, `pgpool.limits`) on a real server: a kind's
concurrency limit holds across claimers racing on their own connections, a slot is free
again however its job stops running, a lowered limit waits for the jobs above it, and a
job that ran under a limit is claimed as any other once the limit is gone; a rate takes at
most R in a window, racing or not, and R more once the window has passed. The same per
tenant and per concurrency key (``by=``, `sql.CLAIM_SCOPED`): each scope on its own, the
others claimed while one waits, and a change of ``by`` waits for the slots held the old
way."""

from __future__ import annotations

import asyncio
import functools

import psycopg
import pytest
from dbtools import (
    GRANT_PARAMS,
    busiest,
    claim_racing,
    explain_kept_plan,
    most_claimed_in_a_second,
    with_pools,
)
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.host.claimer import Claimer, configure_connection
from pgpool.host.lease import Lease
from pgpool.host.parts.retention import Retention
from pgpool.limits import Override
from pgpool.registry import Handler
from pgpool.sql import jobs as sql
from pgpool.sql.jobs import RING_MAX, RING_ROWS, SCOPE_WALK

#: How a host sets up its claim connections.
CLAIM_CONNECTION = functools.partial(configure_connection, lease=Lease(30), claims=True)

def handlers(concurrency: int | None, *, also: str | None = None, rate: int | None = None,
             per: float = 1.0, by: str | None = None) -> dict[str, Handler]:
    limit = (None if concurrency is None and rate is None
             else pgpool.Limit(concurrency=concurrency, rate=rate, per=per, by=by))
    found = {"lim": Handler("lim", print, None, None, limit=limit)}
    if also:
        found[also] = Handler(also, print, None, None)
    return found


def claimer(pool: AsyncConnectionPool, owner: str, concurrency: int | None,
            also: str | None = None, rate: int | None = None, per: float = 1.0,
            by: str | None = None) -> Claimer:
    return Claimer(pool, owner, queues=("default",),
                   handlers=handlers(concurrency, also=also, rate=rate, per=per, by=by),
                   lease=Lease(30), max_attempts=20, timeout=None)


async def race(claimers: list[Claimer], batch: int) -> int:
    """Two claims of ``batch`` at once on each claimer: how many jobs they took."""
    batches = await asyncio.gather(*(c.claim(batch) for c in claimers for _ in "ab"))
    return sum(len(b) for b in batches)


def running_per(db: psycopg.Connection, column: str = "tenant") -> dict[str, int]:
    """The running jobs of kind lim per tenant (or per concurrency key, '' for none)."""
    return dict(db.execute(f"SELECT coalesce({column}, ''), count(*) FROM pgpool_jobs "
                           "WHERE state = 'running' AND kind = 'lim' GROUP BY 1").fetchall())


def enqueue_tenants(db: psycopg.Connection, jobs: dict[str, int]) -> None:
    for tenant, count in jobs.items():
        pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(count)], tenant=tenant or None)


def finish_running(db: psycopg.Connection) -> None:
    """Every running job done (acked: deleted), as its host would."""
    db.execute("DELETE FROM pgpool_jobs WHERE state = 'running'")


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


@pytest.mark.parametrize(("rate", "by"), [(None, None), (100, None), (None, "tenant")],
                         ids=["slots", "slots and a rate", "by tenant"])
def test_a_host_of_several_queues_takes_no_more_than_the_limit_in_all(
        db: psycopg.Connection, dsn: str, rate: int | None, by: str | None) -> None:
    for queue in ("a", "b", "c"):
        pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(5)], queue=queue,
                            tenant="t" if by else None)
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = Claimer(pools[0], "host-a:1:aa", queues=("a", "b", "c"),
                    handlers=handlers(2, rate=rate, by=by), lease=Lease(30),
                    max_attempts=20, timeout=None)
        return [len(await c.claim(10)) for _ in range(2)]

    # Each queue's scan may find the kind's whole room: the claim takes it once in all.
    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [2, 0]
    assert running(db) == 2


@pytest.mark.parametrize("statement", ["CLAIM_SLOTS", "CLAIM_SLOTS_PLAIN", "CLAIM_LIMITED",
                                       "CLAIM_LIMITED_PLAIN", "CLAIM_GRANTED"])
def test_a_generic_plan_made_with_next_to_nothing_waiting_claims_a_thousand_in_linear_steps(
        db: psycopg.Connection, statement: str) -> None:
    # The plan a host's prepared claim keeps was made when its kind had next to nothing
    # waiting; then a thousand jobs come. Joined to what it picked, the update rescanned
    # the jobs once per job: half a million rows handed on for a claim of a thousand.
    params = {"limited_kinds": ["lim"], "limited_concurrency": "{1000000}",
              "limited_rate": "{NULL}", "limited_per": [1.0], "limited_max_attempts": "{5}",
              "queues": ["default"], "limit": 1000, "owner": "host-a:1:aa", "lease": 30.0,
              "after_priorities": None, "after_run_at_us": None, "after_ids": None,
              **GRANT_PARAMS}
    # Another kind's backlog, so that the plan reads the ready index in claim order
    # (tests/db/test_kept_plans.py checks a table of two rows).
    pgpool.enqueue_many(db, "other", [{"i": i} for i in range(5000)])
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(2)])
    db.execute("ANALYZE pgpool_jobs")
    plan = explain_kept_plan(db, getattr(sql, statement), params, lambda: pgpool.enqueue_many(
        db, "lim", [{"i": i} for i in range(1000)]))
    assert plan["Actual Rows"] == 1000
    rows, node = busiest(plan)
    assert rows <= 2 * 1000, (rows, node)  # the window of free slots: twice the batch


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


@pytest.mark.parametrize("rate", [None, 1000], ids=["slots", "slots and a rate"])
def test_a_kind_wide_claim_is_whole_while_a_keyed_job_waits_and_plain_again_after(
        db: psycopg.Connection, dsn: str, rate: int | None) -> None:
    # The plain twin (CLAIM_SLOTS_PLAIN, CLAIM_LIMITED_PLAIN) takes nothing while a job
    # with a concurrency key waits; the whole claim takes it, one per key, and says when
    # the plain one may go again.
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(3)])
    for i in range(2):
        pgpool.enqueue(db, "lim", {"k": i}, concurrency_key="key")
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[tuple[int, bool]]:
        c = claimer(pools[0], "host-a:1:aa", 100, rate=rate)
        got = [(len(await c.claim(10)), c._limited_plain)]  # 3 and the first keyed
        got.append((len(await c.claim(10)), c._limited_plain))  # its key runs: nothing
        finish_running(db)
        db.commit()
        # The second keyed: it waited as the claim began, so the next one is whole too.
        got.append((len(await c.claim(10)), c._limited_plain))
        pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(2)])
        db.commit()
        got.append((len(await c.claim(10)), c._limited_plain))  # none waits: plain next
        got.append((len(await c.claim(10)), c._limited_plain))  # and plain it is
        return got

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [
        (4, False), (0, False), (1, False), (2, True), (0, True)]
    assert running(db) == 3


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
        got = [await race(claimers, 5) for _ in range(3)]
        # The window passes (its ticks an hour old): seven more, and no more.
        db.execute("UPDATE pgpool_limit_ticks SET used_at = used_at - interval '1 hour'")
        db.commit()
        return [*got, await race(claimers, 5)]

    got = with_pools(dsn, 2, CLAIM_CONNECTION, work)
    assert sum(got[:3]) == 7
    assert got[3] == 7
    assert running(db) == 14
    assert db.execute("SELECT count(*) FROM pgpool_limit_ticks WHERE kind = 'lim'"
                      ).fetchone()[0] == 7


def test_a_rate_above_the_ring_is_exact_however_claims_race(db: psycopg.Connection,
                                                           dsn: str) -> None:
    """150 an hour: a ring of `RING_MAX` rows, two or three jobs each; racing claims of 50
    take 150 in all, then 150 more a window later, and no more."""
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(400)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        claimers = [claimer(pool, f"host-{n}:1:aa", None, rate=150, per=3600)
                    for n, pool in enumerate(pools)]
        got = [await race(claimers, 50) for _ in range(3)]
        db.execute("UPDATE pgpool_limit_ticks SET used_at = used_at - interval '1 hour'")
        db.commit()
        return [*got, *[await race(claimers, 50) for _ in range(3)]]

    got = with_pools(dsn, 2, CLAIM_CONNECTION, work)
    assert sum(got[:3]) == 150
    assert sum(got[3:]) == 150
    assert running(db) == 300
    assert db.execute("SELECT count(*), sum(n) FROM pgpool_limit_ticks WHERE kind = 'lim'"
                      ).fetchone() == (RING_MAX, 150)


def test_claims_of_one_top_rows_up_and_take_exactly_the_rate(db: psycopg.Connection,
                                                             dsn: str) -> None:
    """130 an hour, claimed one job at a time: a row lets its next job start while it has
    room (its episode goes on), so every one of the 130 is taken, and the 131st is not."""
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(140)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> int:
        c = claimer(pools[0], "host-a:1:aa", None, rate=130, per=3600)
        return sum([len(await c.claim(1)) for _ in range(140)])

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == 130
    caps = db.execute("SELECT array_agg(n ORDER BY slot) FROM pgpool_limit_ticks "
                      "WHERE kind = 'lim'").fetchone()[0]
    assert caps == [3, 3] + [2] * (RING_MAX - 2)  # 130 = 64 x 2 + 2


def test_a_claim_under_a_high_rate_writes_one_row_of_its_ring(db: psycopg.Connection,
                                                               dsn: str) -> None:
    """What a rate never reached costs a claim of 50: one row of its ring written, not 50."""
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(100)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = claimer(pools[0], "host-a:1:aa", None, rate=100_000, per=1)
        return [len(await c.claim(50)), len(await c.claim(50))]

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [50, 50]
    # One row each at most (the second claim may have been granted tokens of its row,
    # which count in its n: `pgpool.host.grant`).
    used = db.execute("SELECT array_agg(n ORDER BY n) FROM pgpool_limit_ticks "
                      "WHERE kind = 'lim' AND isfinite(used_at)").fetchone()[0]
    assert len(used) <= 2 and sum(used) >= 100, used


@pytest.mark.soak  # 2.5 s of claims against the clock: `make soak-test`
def test_a_rate_above_the_ring_holds_in_every_real_window_while_claims_race(
        db: psycopg.Connection, dsn: str) -> None:
    """130 a second (rows of 3 and 2), three claimers on their own connections claiming
    batches of 1 to 40 as fast as they can for 2.5 s: in no one-second window of the
    claims' own times (``claimed_at``, the server's clock, as the ring's) more than 130,
    and the rate used (more than two windows' worth claimed)."""
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(2000)])
    db.commit()
    claim_racing(dsn, CLAIM_CONNECTION, lambda pool, owner: claimer(pool, owner, None, rate=130),
                 count=3, seconds=2.5, largest=40)
    most, claimed = most_claimed_in_a_second(db)
    assert most <= 130, most
    assert claimed > 260, claimed


def test_a_claim_reads_one_more_ring_row_than_whole_rows_would_need(db: psycopg.Connection,
                                                                     dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(10)])
    db.commit()

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = claimer(pools[0], "host-a:1:aa", None, rate=128, per=3600)  # 64 rows of 2
        got = [len(await c.claim(1))]  # makes the ring
        # Every row half used in this window: one job left in each.
        db.execute("UPDATE pgpool_limit_ticks SET n = 1, used_at = now() WHERE kind = 'lim'")
        db.commit()
        got.append(len(await c.claim(2)))  # a whole row would do: two part-used ones do
        return got

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [1, 2]


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


def test_a_limit_by_tenant_holds_per_tenant_however_claims_race(db: psycopg.Connection,
                                                                 dsn: str) -> None:
    """Two running per tenant, never three, with four claims racing on two connections;
    the jobs without a tenant share a scope of their own; slots are numbered per tenant."""
    enqueue_tenants(db, {"acme": 10, "globex": 10, "": 10, "initech": 1})

    async def work(pools: list[AsyncConnectionPool]) -> None:
        claimers = [claimer(pool, f"host-{n}:1:aa", 2, by="tenant")
                    for n, pool in enumerate(pools)]
        for _ in range(5):
            await race(claimers, 10)

    with_pools(dsn, 2, CLAIM_CONNECTION, work)
    assert running_per(db) == {"acme": 2, "globex": 2, "": 2, "initech": 1}
    slots = db.execute("SELECT limit_scope, array_agg(limit_slot ORDER BY limit_slot) "
                       "FROM pgpool_jobs WHERE state = 'running' GROUP BY 1 ORDER BY 1"
                       ).fetchall()
    assert [s for _, s in slots if len(s) == 2] == [[1, 2]] * 3
    assert [scope for scope, _ in slots] == ["tenant:", "tenant:acme", "tenant:globex",
                                             "tenant:initech"]


def test_the_database_refuses_a_second_running_job_in_a_tenants_slot(
        db: psycopg.Connection, dsn: str) -> None:
    enqueue_tenants(db, {"acme": 2, "globex": 1})
    with_pools(dsn, 1, CLAIM_CONNECTION,
               lambda pools: claimer(pools[0], "host-a:1:aa", 1, by="tenant").claim(10))
    assert running_per(db) == {"acme": 1, "globex": 1}  # slot 1 of each: no collision
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = attempts + 1, "
                   "limit_slot = 1, limit_scope = 'tenant:acme', "
                   "limit_attempt = attempts + 1 WHERE state = 'ready'")


def test_a_rate_by_tenant_holds_per_tenant_and_others_go_on(db: psycopg.Connection,
                                                            dsn: str) -> None:
    """Three an hour per tenant: a tenant with a backlog at its rate (first in the ready
    index's order) holds nobody back; each ring is made by the claim that first meets its
    tenant; racing claims take three per tenant in all, then three more a window later."""
    enqueue_tenants(db, {"aaa": 40, "bbb": 5, "ccc": 5, "ddd": 2})

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        claimers = [claimer(pool, f"host-{n}:1:aa", None, rate=3, per=3600, by="tenant")
                    for n, pool in enumerate(pools)]
        got = [await race(claimers, 4) for _ in range(4)]
        db.execute("UPDATE pgpool_limit_ticks SET used_at = used_at - interval '1 hour'")
        return [*got, await race(claimers, 10)]

    got = with_pools(dsn, 2, CLAIM_CONNECTION, work)
    assert sum(got[:4]) == 3 + 3 + 3 + 2
    assert got[4] == 3 + 2 + 2  # the window passed: what each tenant has left, up to 3
    assert running_per(db) == {"aaa": 6, "bbb": 5, "ccc": 5, "ddd": 2}
    assert db.execute("SELECT scope, count(*) FROM pgpool_limit_ticks GROUP BY 1 ORDER BY 1"
                      ).fetchall() == [(f"tenant:{t}", 3) for t in ("aaa", "bbb", "ccc", "ddd")]


def test_a_rate_by_tenant_above_the_ring_is_exact_per_tenant(db: psycopg.Connection,
                                                            dsn: str) -> None:
    """100 an hour per tenant: each tenant's ring is `RING_MAX` rows, not 100, and racing
    claims take exactly 100 of each tenant's 150."""
    enqueue_tenants(db, {"acme": 150, "globex": 150})

    async def work(pools: list[AsyncConnectionPool]) -> None:
        claimers = [claimer(pool, f"host-{n}:1:aa", None, rate=100, per=3600, by="tenant")
                    for n, pool in enumerate(pools)]
        for _ in range(6):
            await race(claimers, 40)

    with_pools(dsn, 2, CLAIM_CONNECTION, work)
    assert running_per(db) == {"acme": 100, "globex": 100}
    assert db.execute("SELECT scope, count(*), sum(n) FROM pgpool_limit_ticks "
                      "GROUP BY 1 ORDER BY 1").fetchall() == [
        ("tenant:acme", RING_MAX, 100), ("tenant:globex", RING_MAX, 100)]


def test_a_claim_makes_rings_of_ring_rows_at_most_and_the_next_claims_the_rest(
        db: psycopg.Connection, dsn: str) -> None:
    """200 new keys at 64 an hour each: a ring of 64 rows per key, `RING_ROWS` rows of new
    rings a statement at most (157 rings: the one that crosses the bound is made whole). A
    scope's jobs are claimed once its ring is there: the claimer runs a claim that made
    rings once more at once (157 jobs, and the 43 rings left), and the next claim takes
    the rest."""
    for i in range(200):
        pgpool.enqueue(db, "lim", {"i": i}, concurrency_key=f"key{i:03}")

    async def work(pools: list[AsyncConnectionPool]) -> list[tuple[int, int]]:
        c = claimer(pools[0], "host-a:1:aa", None, rate=RING_MAX, per=3600,
                    by="concurrency_key")
        got = []
        for _ in range(3):
            claimed = len(await c.claim(1000))
            got.append((claimed, db.execute("SELECT count(DISTINCT scope) FROM "
                                            "pgpool_limit_ticks").fetchone()[0]))
        return got

    rings = -(-RING_ROWS // RING_MAX)  # the ring that crosses the bound is made whole
    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [(rings, 200), (200 - rings, 200),
                                                          (0, 200)]


def test_tenants_past_one_claims_walk_get_theirs_from_the_next(db: psycopg.Connection,
                                                                dsn: str) -> None:
    """A claim walks `sql.SCOPE_WALK` tenants at most; the next goes on from where it
    stopped, past the tenants at their limit, so those further on are not left waiting."""
    tenants = SCOPE_WALK + 20
    enqueue_tenants(db, {f"t{n:03}": 2 for n in range(tenants)})

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = claimer(pools[0], "host-a:1:aa", 1, by="tenant")
        return [len(await c.claim(1000)) for _ in range(3)]

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [SCOPE_WALK, 20, 0]
    assert set(running_per(db).values()) == {1}
    assert len(running_per(db)) == tenants


def test_a_limit_by_concurrency_key_holds_per_key(db: psycopg.Connection, dsn: str) -> None:
    """Two an hour per key (a key runs one job at a time anyway), the keyless jobs one
    scope with two slots: a key at its rate holds the other keys back no more than a
    running key does."""
    for key, count in (("k1", 6), ("k2", 3)):
        for i in range(count):
            pgpool.enqueue(db, "lim", {"i": i}, concurrency_key=key)
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(6)])

    async def work(pools: list[AsyncConnectionPool]) -> list[dict[str, int]]:
        c = claimer(pools[0], "host-a:1:aa", 2, rate=2, per=3600, by="concurrency_key")
        seen = []
        for _ in range(4):
            await c.claim(20)
            seen.append(running_per(db, "concurrency_key"))
            finish_running(db)
        return seen

    seen = with_pools(dsn, 1, CLAIM_CONNECTION, work)
    assert seen[0] == {"k1": 1, "k2": 1, "": 2}
    assert seen[1] == {"k1": 1, "k2": 1}  # the keyless scope's two ticks are spent
    assert seen[2:] == [{}, {}]  # every scope at its rate
    assert db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'ready'"
                      ).fetchone()[0] == 6 + 3 + 6 - 6


def test_a_rate_by_concurrency_key_alone_takes_the_keyless_jobs_too(db: psycopg.Connection,
                                                                   dsn: str) -> None:
    """No concurrency limit: the keyless jobs are one scope, at the rate like any key."""
    pgpool.enqueue(db, "lim", {"i": 0}, concurrency_key="k1")
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(5)])

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = claimer(pools[0], "host-a:1:aa", None, rate=3, per=3600, by="concurrency_key")
        return [len(await c.claim(10)) for _ in range(2)]

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [4, 0]
    assert running_per(db, "concurrency_key") == {"k1": 1, "": 3}


def test_a_lowered_limit_by_tenant_waits_for_the_slots_above_it(db: psycopg.Connection,
                                                                 dsn: str) -> None:
    enqueue_tenants(db, {"acme": 10, "globex": 10})

    async def work(pools: list[AsyncConnectionPool]) -> list[dict[str, int]]:
        await claimer(pools[0], "host-a:1:aa", 3, by="tenant").claim(10)
        seen = [running_per(db)]
        db.execute("DELETE FROM pgpool_jobs WHERE tenant = 'globex' AND state = 'running'")
        db.execute("DELETE FROM pgpool_jobs WHERE tenant = 'acme' AND limit_slot = 1")
        lowered = claimer(pools[0], "host-b:1:aa", 2, by="tenant")
        await lowered.claim(10)  # acme holds slot 3: none for it; globex gets two
        seen.append(running_per(db))
        db.execute("DELETE FROM pgpool_jobs WHERE tenant = 'acme' AND limit_slot = 3")
        await lowered.claim(10)
        seen.append(running_per(db))
        return seen

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [
        {"acme": 3, "globex": 3}, {"acme": 2, "globex": 2}, {"acme": 2, "globex": 2}]


def test_an_override_changes_by_and_waits_for_the_slots_held_the_old_way(
        db: psycopg.Connection, dsn: str) -> None:
    """Kind-wide to per tenant and back (`pgpool limits set KIND --by ...`): neither way
    starts a job while slots held the other way run, so no tenant (nor the kind) ever has
    more running than its limit."""
    enqueue_tenants(db, {"acme": 10, "globex": 10})
    code = pgpool.Limit(concurrency=2)
    per_tenant = Override(None, None, None, "ops", by="tenant").over(code)
    assert per_tenant == pgpool.Limit(concurrency=2, by="tenant")

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = claimer(pools[0], "host-a:1:aa", 2)
        got = [len(await c.claim(10))]  # kind-wide: two
        c.set_limits({"lim": per_tenant})
        got.append(len(await c.claim(10)))  # kind-wide slots held: none
        finish_running(db)
        got.append(len(await c.claim(10)))  # two per tenant
        c.set_limits({"lim": Override(None, None, None, "ops", by="kind").over(per_tenant)})
        got.append(len(await c.claim(10)))  # slots held per tenant: none
        finish_running(db)
        got.append(len(await c.claim(10)))
        return got

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [2, 0, 4, 0, 2]


def test_a_host_claims_kind_wide_and_scoped_limits_together(db: psycopg.Connection,
                                                            dsn: str) -> None:
    enqueue_tenants(db, {"acme": 5, "globex": 5})
    pgpool.enqueue_many(db, "whole", [{"i": i} for i in range(5)])
    pgpool.enqueue_many(db, "free", [{"i": i} for i in range(5)])

    async def work(pools: list[AsyncConnectionPool]) -> list[str]:
        found = {**handlers(1, also="free"),
                 "whole": Handler("whole", print, None, None, limit=pgpool.Limit(concurrency=2))}
        c = Claimer(pools[0], "host-a:1:aa", queues=("default",), handlers=found,
                    lease=Lease(30), max_attempts=20, timeout=None)
        c.set_limits({"lim": pgpool.Limit(concurrency=1, by="tenant"),
                      "whole": pgpool.Limit(concurrency=2)})
        return sorted(job.kind for job in await c.claim(30))

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == (
        ["free"] * 5 + ["lim"] * 2 + ["whole"] * 2)


def test_retention_deletes_the_rings_unused_for_a_day(db: psycopg.Connection,
                                                      dsn: str) -> None:
    """A scope's ring unused for a day is deleted (no window is longer: it is as good as
    new), one used since is kept, and so is one a claim holds a row of (whole: a ring with
    holes would slow its tenant), and every kind-wide ring."""
    db.execute("INSERT INTO pgpool_limit_ticks (kind, scope, slot, used_at) "
               "SELECT 'lim', s, n, now() - interval '25 hours' "
               "FROM unnest(ARRAY['', 'tenant:old', 'tenant:used']) AS s, "
               "generate_series(1, 3) AS n")
    db.execute("UPDATE pgpool_limit_ticks SET used_at = now() - interval '23 hours' "
               "WHERE scope = 'tenant:used' AND slot = 2")

    db.execute("INSERT INTO pgpool_limit_ticks (kind, scope, slot, used_at) "
               "SELECT 'lim', 'tenant:held', n, now() - interval '25 hours' "
               "FROM generate_series(1, 3) AS n")

    async def prune(pools: list[AsyncConnectionPool]) -> int | None:
        return await Retention(pools[0], None).prune()

    # A claim holds a row of an idle ring (it is taking it): the ring is kept whole.
    with psycopg.connect(dsn) as claim:
        claim.execute("SELECT FROM pgpool_limit_ticks WHERE scope = 'tenant:held' AND slot = 2 "
                      "FOR UPDATE")
        assert with_pools(dsn, 1, CLAIM_CONNECTION, prune) == 3
    assert db.execute("SELECT scope, count(*) FROM pgpool_limit_ticks GROUP BY 1 ORDER BY 1"
                      ).fetchall() == [("", 3), ("tenant:held", 3), ("tenant:used", 3)]


@pytest.mark.parametrize("by", ["colour", "Tenant", ""])
def test_a_limit_by_anything_else_is_refused_in_one_line(by: str) -> None:
    with pytest.raises(pgpool.HandlerError) as refused:
        pgpool.Limit(concurrency=2, by=by)  # type: ignore[arg-type]
    assert str(refused.value) == ('pgpool.Limit: by must be "tenant" or "concurrency_key" '
                                  f"(or None, for the kind as a whole), got {by!r}")
