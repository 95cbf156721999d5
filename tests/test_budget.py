"""The fleet claim budget: a token bucket per host, shared by the live hosts."""

from __future__ import annotations

import asyncio
import re

from conftest import run_pgpool
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.budget import ClaimBudget
from pgpool.hosts import HostRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_refills_at_the_hosts_share_and_caps_bursts_at_one_second():
    clock = Clock()
    budget = ClaimBudget(1000, lambda: 1, clock=clock)
    assert budget.available() == 1000  # a full second's worth to start
    budget.spend(1000)
    assert budget.available() == 0
    assert budget.wait_for(50) == 0.05
    clock.now += 0.05
    assert budget.available() == 50
    clock.now += 60  # idle for a minute: still only one second's worth
    assert budget.available() == 1000


def test_live_hosts_split_the_fleet_rate():
    clock = Clock()
    hosts = [1]
    budget = ClaimBudget(1000, lambda: hosts[0], clock=clock)
    hosts[0] = 4
    assert budget.rate == 250
    assert budget.available() == 250  # the burst shrinks with the share
    budget.spend(250)
    clock.now += 0.2
    assert budget.available() == 50
    hosts[0] = 0  # never divides by zero: this host always counts
    assert budget.rate == 1000


def test_registered_hosts_are_counted_for_the_share(db, dsn):
    async def main() -> list[int]:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False,
                                       kwargs={"autocommit": True}) as pool:
            hosts = [HostRegistry(pool, f"host-{i}", procs=1, queues=["default"],
                                  kinds=["k"], lease=30, counters=lambda: (0, 0))
                     for i in range(3)]
            for h in hosts:
                await h.register()
            await hosts[0].beat()
            seen = [hosts[0].live_hosts]
            await hosts[1].deregister()
            await hosts[0].beat()
            return [*seen, hosts[0].live_hosts]

    assert asyncio.run(main()) == [3, 2]


def test_a_dispatcher_claims_no_faster_than_its_budget(db, dsn, record_dir):
    pgpool.enqueue_many(db, "noop", [{}] * 900)
    done = run_pgpool(dsn, "run", "--handlers", "testjobs", "--burst",
                      "--max-claims-per-sec", "300", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    # 300 jobs may go at once (one second's burst); the other 600 at 300/s take 2 s.
    seconds = float(re.search(r"in ([0-9.]+)s \(", done.stderr).group(1))
    assert seconds >= 1.8, seconds
