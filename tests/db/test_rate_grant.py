"""A rate's grant on a real server (`pgpool.host.grant`): a full claim from the ring grants
its host the room left in its row, stamped for the grant's end; the host's next claims
(`sql.CLAIM_GRANTED`) spend it without a ring row, and take nothing once it is over; racing
hosts that spend grants never take more than the rate."""

from __future__ import annotations

import asyncio
import functools
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from dbtools import claim_racing, most_claimed_in_a_second, with_pools
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.host import grant as grant_module
from pgpool.host.claimer import Claimer, configure_connection
from pgpool.host.lease import Lease
from pgpool.registry import Handler
from pgpool.sql import jobs as sql
from pgpool.sql.common import nullable_int_array

CLAIM_CONNECTION = functools.partial(configure_connection, lease=Lease(30), claims=True)


def params(rate: int, per: float, limit: int, grant: int) -> dict[str, Any]:
    """What a host sends for a claim of ``limit`` jobs of kind lim under ``rate`` a ``per``,
    asking for ``grant`` tokens (a sweep: from the start)."""
    return {"queues": ["default"], "owner": "host-a:1:aa", "lease": 30, "limit": limit,
            "limited_kinds": ["lim"], "limited_concurrency": nullable_int_array([None]),
            "limited_rate": [rate], "limited_per": [per], "limited_max_attempts": [20],
            "grant": grant, "hold": 0.05, **sql.SWEEP}


def ring(db: psycopg.Connection) -> list[tuple[int, bool]]:
    """The rows of lim's ring used in this window: each one's n, and whether it is stamped
    after now (a grant's end)."""
    return db.execute("SELECT n, used_at > now() FROM pgpool_limit_ticks "
                      "WHERE kind = 'lim' AND isfinite(used_at) ORDER BY slot").fetchall()


def test_a_full_claim_grants_the_room_left_in_its_row_until_the_grants_end(
        db: psycopg.Connection) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(200)])
    db.execute(sql.ENSURE_TICKS, {"rate_kinds": ["lim"], "rates": [6400]})  # 64 rows of 100
    with db.transaction():  # one transaction: now() is the claim's
        rows = db.execute(sql.CLAIM_LIMITED_PLAIN, params(6400, 3600, 30, 500)).fetchall()
        claimed_now = db.execute("SELECT now()").fetchone()[0]
    assert len(rows) == 30
    granted, until = rows[0][14], rows[0][15]
    assert all(row[14:] == (70, until) for row in rows)  # the row's 100, less 30 taken
    assert until == claimed_now + timedelta(seconds=0.05)
    assert ring(db) == [(100, True)]  # counted whole, as if they had started; stamped then
    # Spent 30 at a time with no ring row read or written; the last claim takes 10.
    spent = [len(db.execute(sql.CLAIM_GRANTED, {**params(6400, 3600, n, 0), "until": until}
                            ).fetchall()) for n in (30, 30, 10)]
    assert spent == [30, 30, 10] and granted == sum(spent)
    assert ring(db) == [(100, True)]
    # Past its end, a grant takes nothing.
    assert db.execute(sql.CLAIM_GRANTED, {**params(6400, 3600, 30, 0),
                                          "until": claimed_now - timedelta(seconds=1)}
                      ).fetchall() == []
    assert db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running'"
                      ).fetchone()[0] == 100


@pytest.mark.parametrize(("jobs", "limit", "grant"), [(20, 30, 500), (200, 60, 500),
                                                      (200, 30, 0)],
                         ids=["a short claim", "too little room for another", "none asked"])
def test_a_claim_grants_nothing_unless_full_with_room_for_another_and_asked(
        db: psycopg.Connection, jobs: int, limit: int, grant: int) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(jobs)])
    db.execute(sql.ENSURE_TICKS, {"rate_kinds": ["lim"], "rates": [6400]})
    rows = db.execute(sql.CLAIM_LIMITED_PLAIN, params(6400, 3600, limit, grant)).fetchall()
    assert {row[14] for row in rows} == {0}
    assert all(not later for _, later in ring(db))  # stamped now: no grant's end
    assert sum(n for n, _ in ring(db)) == len(rows)


@pytest.fixture
def long_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Grants held 5 s (per an hour): a host asks for them however slow its claims on a
    loaded test machine, so that the tests below spend them every time."""
    monkeypatch.setattr(grant_module, "HOLD", 5.0)


def claimer(pool: AsyncConnectionPool, owner: str, rate: int) -> Claimer:
    handlers = {"lim": Handler("lim", print, None, None,
                               limit=pgpool.Limit(rate=rate, per=3600))}
    return Claimer(pool, owner, queues=("default",), handlers=handlers, lease=Lease(30),
                   max_attempts=20, timeout=None)


@pytest.mark.usefixtures("long_hold")
def test_a_host_claiming_often_spends_grants_and_writes_a_ring_row_every_few_claims(
        db: psycopg.Connection, dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(2000)])

    async def work(pools: list[AsyncConnectionPool]) -> list[int]:
        c = claimer(pools[0], "host-a:1:aa", 100_000)  # 64 rows of 1,562
        return [len(await c.claim(50)) for _ in range(40)]

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == [50] * 40
    # The first claim (no pace yet) and the second take from the ring; the second is
    # granted its row's room (1,512), the next 30 claims spend it; one more ring claim.
    used = ring(db)
    assert len(used) <= 4, used
    assert sum(n for n, _ in used) >= 2000


async def granted(pool: AsyncConnectionPool) -> Claimer:
    """A claimer of lim at 100,000 a second that claimed 50 twice, the second time
    granted tokens for more."""
    c = claimer(pool, "host-a:1:aa", 100_000)
    assert [len(await c.claim(50)) for _ in range(2)] == [50, 50]
    assert c._grants.current is not None and c._grants.current.tokens > 50
    return c


@pytest.mark.usefixtures("long_hold")
def test_a_grant_the_server_says_is_over_is_dropped_and_the_ring_claims_the_batch(
        db: psycopg.Connection, dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(300)])

    async def work(pools: list[AsyncConnectionPool]) -> tuple[int, bool]:
        c = await granted(pools[0])
        grant = c._grants.current
        # The host's clock says it still holds; the server's is what counts.
        grant.until -= timedelta(hours=1)
        return len(await c.claim(50)), c._grants.current is not grant

    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == (50, True)


@pytest.mark.usefixtures("long_hold")
def test_a_keyed_job_waiting_ends_a_grant_and_the_whole_claim_takes_it(
        db: psycopg.Connection, dsn: str) -> None:
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(300)])

    async def work(pools: list[AsyncConnectionPool]) -> int:
        c = await granted(pools[0])
        # First in claim order: a claim that ignored their key would take both.
        for i in range(2):
            pgpool.enqueue(db, "lim", {"k": i}, concurrency_key="key", priority=1)
        return len(await c.claim(50))  # the grant's claim takes nothing: whole

    # One per key, as the whole claim takes them (the other keyed job is left out of its 50).
    assert with_pools(dsn, 1, CLAIM_CONNECTION, work) == 49
    assert db.execute("SELECT array_agg(state ORDER BY state) FROM pgpool_jobs "
                      "WHERE concurrency_key = 'key'").fetchone()[0] == ["ready", "running"]


@pytest.mark.usefixtures("long_hold")
def test_racing_hosts_spending_grants_take_no_more_than_the_rate(db: psycopg.Connection,
                                                                 dsn: str) -> None:
    """640 an hour (64 rows of 10), claims of 5: each full claim from the ring is granted
    the other 5 of its row. Two claimers, two claims in flight each, until the ring is
    spent: 640 at most, and every row's tokens counted."""
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(1000)])

    async def work(pools: list[AsyncConnectionPool]) -> int:
        claimers = [claimer(pool, f"host-{n}:1:aa", 640) for n, pool in enumerate(pools)]
        claimed = 0
        for _ in range(100):
            batches = await asyncio.gather(*(c.claim(5) for c in claimers for _ in "ab"))
            claimed += sum(len(b) for b in batches)
        return claimed

    claimed = with_pools(dsn, 2, CLAIM_CONNECTION, work)
    used = ring(db)
    print(f"claimed {claimed}; rows granted {sum(later for _, later in used)}")
    assert len(used) == 64 and sum(n for n, _ in used) == 640, used
    assert claimed <= 640
    # Grants were made (their rows stamped for their end, within the hold still), and
    # tokens a claimer could not spend (a grant replaced by the next) were few.
    assert sum(later for _, later in used) >= 32, used
    assert claimed >= 600, claimed
    assert db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running'"
                      ).fetchone()[0] == claimed


@pytest.mark.soak  # 2.5 s of claims against the clock: `make soak-test`
def test_grants_keep_a_rate_in_every_real_window_while_claims_race(db: psycopg.Connection,
                                                                   dsn: str) -> None:
    """640 a second (64 rows of 10), three claimers claiming batches of 1 to 5 as fast as
    they can for 2.5 s, with the grants' real hold: a full claim of up to 5 is granted the
    rest of its row, which its next claims spend. In no one-second window of the claims'
    own times (``claimed_at``, the server's clock, as the ring's and the grants') more
    than 640, and the rate used (more than two windows' worth claimed)."""
    pgpool.enqueue_many(db, "lim", [{"i": i} for i in range(3000)])
    claim_racing(dsn, CLAIM_CONNECTION, claimer_per_second, count=3, seconds=2.5, largest=5)
    most, claimed = most_claimed_in_a_second(db)
    assert most <= 640, most
    assert claimed > 1280, claimed


def claimer_per_second(pool: AsyncConnectionPool, owner: str) -> Claimer:
    handlers = {"lim": Handler("lim", print, None, None, limit=pgpool.Limit(rate=640, per=1))}
    return Claimer(pool, owner, queues=("default",), handlers=handlers, lease=Lease(30),
                   max_attempts=20, timeout=None)
