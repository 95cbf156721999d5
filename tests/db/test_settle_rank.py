"""The registry's count of idle hosts in a group (`sql.BUDGET_PEERS`), from which each host
knows whether anyone stands by for a notification and how soon it answers one itself
(`pgpool.host.settle`): real beats on real rows."""

from __future__ import annotations

from collections.abc import Callable

from claims import in_registry
from psycopg_pool import AsyncConnectionPool

from pgpool.host.lease import Lease
from pgpool.host.parts.hosts import HostRegistry


def registry(pool: AsyncConnectionPool, owner: str, kinds: list[str],
             claimed: Callable[[], int] = lambda: 0) -> HostRegistry:
    return HostRegistry(pool, owner, procs=1, queues=["default"], kinds=kinds,
                        lease=Lease(30), max_claims_per_sec=None,
                        counters=lambda: (0, 0, claimed(), None, 1))


def test_a_host_counts_the_idle_hosts_of_its_group_and_those_ahead_of_it(dsn):
    claimed = [0]

    async def work(pool: AsyncConnectionPool) -> list[list[tuple[int, int]]]:
        a, c, d = (registry(pool, owner, ["k", "j"]) for owner in "acd")
        b = registry(pool, "b", ["j", "k"], lambda: claimed[0])  # the same kinds
        other = registry(pool, "c2", ["k"])  # another group: other kinds
        hosts = [a, b, c, d, other]
        for host in hosts:
            await host.register()
        for host in hosts:  # every host beats after all registered
            await host.beat()
        seen = [[(h.idle_peers, h.rank) for h in hosts]]
        claimed[0] += 10  # b claims jobs: busy as of its next beat
        for host in (b, a, c, d, other):
            await host.beat()
        seen.append([(h.idle_peers, h.rank) for h in hosts])
        return seen

    idle, b_busy = in_registry(dsn, work)
    # (idle peers, how many of them ahead): a, b, c, d by owner; c2 alone in its group.
    assert idle == [(3, 0), (3, 1), (3, 2), (3, 3), (0, 0)]
    # b claimed since its last beat: the others leave it out; it still counts those ahead.
    assert b_busy == [(2, 0), (3, 1), (2, 1), (2, 2), (0, 0)]
