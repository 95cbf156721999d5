"""The host registry: one ``pgpool_hosts`` row per running dispatcher, and its share of the
fleet's claim budget.

A dispatcher registers when it starts, beats every `Lease.beat_interval` (``last_seen``, its job
counters, its claims per second since the previous beat, and its budget share and demand),
and deletes its row on a clean exit. A dispatcher that died, or that has been cut off from
the database, stops beating: the others stop leaving it a budget share after
`budget.COUNTED_BEATS` of its beat intervals, and once its row is `STALE_AFTER_LEASES` of its
own leases old, the fleet's maintenance leader prunes it (`Pruner`), as does a host when it
starts. Nothing about a job depends on the row: the jobs such a host held come back through
their leases and the reaper, about one lease after its last heartbeat and so well before
the row is pruned.

Each beat is one transaction under `sql.BUDGET_LOCK`: it reads the fleet's budget and the
other counted hosts' demands and shares, works out this host's share (`budget.share`), and
writes the row. It also counts the idle hosts of its group, and those ahead of it
(`rank`), which says how soon this host answers a notification while idle
(`pgpool.host.settle`). The share is applied (`ClaimBudget.grant`) once that has
committed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Final

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from ...limits import Limit
from ...logs import event
from ...sql import fleet as sql
from ...sql.fleet import COUNTED_LEASES, STALE_AFTER_LEASES
from .. import budget as budgets
from ..budget import DEFAULT_MAX_CLAIMS_PER_SEC, GRANT_BEATS, ClaimBudget, Peer
from ..lease import Lease
from .loop import Connections, Loop, LoopPart

log = logging.getLogger("pgpool.hosts")

#: How long a clean exit waits to delete its row before leaving it to be pruned.
DEREGISTER_TIMEOUT: Final = 5.0
#: The longest a beat waits for the others' (`HostRegistry._take_turn`), in beat intervals.
LOCK_WAIT: Final = 0.25


class HostRegistry(LoopPart):
    """This dispatcher's row in ``pgpool_hosts``, and its claim `budget`.

    ``counters()`` returns (jobs done, attempts failed, jobs claimed) since the dispatcher
    started, its recent claim p99 in ms (None before a claim) and its current claim batch;
    ``job_seconds()`` how long a job takes in a worker (None before the first); each beat
    records them, and the jobs claimed per second since the previous beat. ``limits`` are
    the code's limits of its kinds, written with the row for the fleet's sizing to see
    (`published`). ``max_claims_per_sec`` is this
    host's ``--max-claims-per-sec``: the fleet budget it shares when ``pgpool_fleet`` sets
    none (None: `DEFAULT_MAX_CLAIMS_PER_SEC`). `beat` and `deregister` are serialised, and
    once deregistered the registry never writes the row again, so a beat in flight cannot
    resurrect it. Once registered, it beats every beat interval (`step`); the fleet's leader
    prunes (`Pruner`).
    """

    name = "host registry"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        owner: str,
        *,
        procs: int,
        queues: Sequence[str],
        kinds: Sequence[str],
        lease: Lease,
        max_claims_per_sec: float | None,
        counters: Callable[[], tuple[int, int, int, float | None, int]],
        clock: Callable[[], float] = time.monotonic,
        job_seconds: Callable[[], float | None] = lambda: None,
        limits: Mapping[str, Limit] | None = None,
    ) -> None:
        self._pool = pool
        self.owner = owner
        self.interval = lease.beat_interval
        self._row = {
            "owner": owner,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "procs": procs,
            "queues": list(queues),
            "kinds": sorted(kinds),
            "lease": lease.seconds,
            "limits": Jsonb(published(limits or {})),
        }
        self._given = max_claims_per_sec
        self._counters = counters
        self._job_seconds = job_seconds
        self._clock = clock
        #: The fleet budget in force (the fleet's, else this host's), as of the last beat.
        self.fleet_budget = max_claims_per_sec or DEFAULT_MAX_CLAIMS_PER_SEC
        #: This host's share of it; the floor of a lone host until the first beat.
        self.budget = ClaimBudget(budgets.floor(self.fleet_budget, 1), clock=clock)
        #: (jobs claimed, throttles, clock) at the last beat written: the next beat's rate
        #: and demand start there.
        self._last: tuple[int, int, float] | None = None
        self._held_back = False  # `ClaimBudget.held_back` at the last beat written
        self._started_at: datetime | None = None
        self._closed = False
        self._lock = asyncio.Lock()
        self._overridden: float | None = None  # the fleet budget last warned about
        #: The other idle hosts of its group (`sql.BUDGET_PEERS`), and how many of them come
        #: ahead of this one, as of the last beat: whether any host stands by for a
        #: notification, and how soon this one answers it while idle (`pgpool.host.settle`).
        self.idle_peers = self.rank = 0
        #: When a beat last reached the database (``clock()``; the dispatcher checked the
        #: database just before building the registry).
        self.last_ok = clock()
        # The interval runs from one beat's start to the next (not from its end), so the
        # share a beat grants (`GRANT_BEATS` long) is renewed in time.
        self._loop = Loop(log, "host registry update", interval=self.interval,
                          wait_first=True, fixed_rate=True)

    async def register(self) -> None:
        """Prune stale hosts, then insert this host's row. Database errors propagate."""
        await self.prune()
        await self.beat()

    async def step(self) -> None:
        await self.beat()

    async def beat(self) -> None:
        """Upsert this host's row (``last_seen = now()``, the current counters, the jobs
        claimed per second since the last beat written, NULL at the first), work out its
        share of the budget, and apply it.

        Re-creates the row (same ``started_at``) if it was pruned meanwhile; does nothing
        after `deregister`.
        """
        async with self._lock:
            if self._closed:
                return
            done, failed, claimed, claim_p99_ms, batch = self._counters()
            throttles = self.budget.throttles
            now = self._clock()  # no later than the server's now() in last_seen
            rate = None
            if self._last is not None and now > self._last[2]:
                rate = (claimed - self._last[0]) / (now - self._last[2])
            # Held back at any time since the last beat: a claim refused since, or a loop
            # that was (at the last beat) or is (now) waiting for tokens; such a wait can
            # span a whole interval, refusing nothing.
            held_back = self.budget.held_back
            throttled = (throttles > (self._last[1] if self._last else 0) or held_back
                         or self._held_back)
            async with self._pool.connection() as conn, conn.transaction():
                await self._take_turn(conn)
                fleet = await (await conn.execute(sql.FLEET_BUDGET)).fetchone()
                cur = await conn.execute(sql.BUDGET_PEERS, {
                    "owner": self.owner, "counted_leases": COUNTED_LEASES,
                    "queues": self._row["queues"], "kinds": self._row["kinds"]})
                rows = await cur.fetchall()
                total = self._fleet_budget(fleet[0] if fleet else None)
                floor_share = budgets.floor(total, 1 + len(rows))
                peers = [Peer(floor_share if d is None else d, s or 0.0)
                         for d, s, _, _ in rows]
                idle_peers = [ahead for _, _, idle, ahead in rows if idle]
                demand = budgets.demand(rate, throttled, floor_share)
                share, own_floor = budgets.share(total, demand, peers)
                cur = await conn.execute(sql.HOST_UPSERT, {
                    **self._row, "started_at": self._started_at, "jobs_done": done,
                    "jobs_failed": failed, "jobs_claimed": claimed, "claims_per_sec": rate,
                    "max_claims_per_sec": total, "claims_share": share,
                    "claims_demand": demand,  # unbounded: float8 Infinity
                    "claim_p99_ms": claim_p99_ms, "batch": batch,
                    "job_seconds": self._job_seconds()})
                (self._started_at,) = await cur.fetchone()
            # Applied once committed: the others see this share from now on. It lapses to
            # the floor unless the next beats renew it (see pgpool.host.budget).
            self.budget.grant(share, floor_rate=own_floor, until=now + GRANT_BEATS * self.interval)
            self.fleet_budget = total
            self.idle_peers, self.rank = len(idle_peers), sum(idle_peers)
            # After a failed beat the next rate spans both intervals, so no claim is missed.
            self._last = (claimed, throttles, now)
            self._held_back = held_back
            self.last_ok = self._clock()

    async def _take_turn(self, conn: psycopg.AsyncConnection) -> None:
        """Wait for the other hosts' beats (`sql.BUDGET_LOCK`), at most `LOCK_WAIT` of a
        beat interval. A beat holds the lock for a few milliseconds; one holding it longer
        (its connection stalled) must not stop every other host's beat, so past the wait
        this beat goes on unserialised: a host growing at the same moment could then take
        the same free share, until the next beats."""
        try:
            async with conn.transaction():  # a savepoint: a timeout undoes only this
                await conn.execute(sql.LOCK_TIMEOUT,
                                   {"ms": f"{LOCK_WAIT * self.interval * 1000:.0f}"})
                await conn.execute(sql.BUDGET_LOCK)
        except psycopg.errors.LockNotAvailable:
            log.warning("another host's budget beat holds its lock for over %.1fs; this "
                        "beat goes on without it", LOCK_WAIT * self.interval)

    def _fleet_budget(self, fleet: float | None) -> float:
        """The budget in force: the fleet's if set, else this host's; warns (once per fleet
        value) when the fleet's overrides a different ``--max-claims-per-sec``."""
        if fleet is None:
            return self._given or DEFAULT_MAX_CLAIMS_PER_SEC
        if self._given is not None and self._given != fleet and self._overridden != fleet:
            event(log, logging.WARNING, "budget_overridden",
                  "--max-claims-per-sec %g is overridden by the fleet budget, %g claims/s "
                  "(`pgpool budget`)", self._given, fleet, given=self._given, fleet=fleet)
            self._overridden = fleet
        return fleet

    async def prune(self) -> list[str]:
        """Delete every stale host's row (safe from many hosts at once); return their owners."""
        return await prune(self._pool)

    async def deregister(self) -> None:
        """On a clean exit: delete this host's row and stop beating.

        Never raises for database trouble: the row is then left to go stale and be pruned.
        """
        self._closed = True
        try:
            async with (asyncio.timeout(DEREGISTER_TIMEOUT), self._lock,
                        self._pool.connection() as conn):
                await conn.execute(sql.HOST_DELETE, {"owner": self.owner})
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("could not remove this host from pgpool_hosts (%s); it will be "
                        "pruned once stale", type(exc).__name__)


def published(limits: Mapping[str, Limit]) -> dict[str, dict[str, float | str]]:
    """The code's limits as a host's row holds them (``pgpool_hosts.limits``): by kind, the
    fields set, ``per`` with a rate only, ``by`` for a limit per tenant or per key."""
    return {kind: {name: value for name, value in (("concurrency", lim.concurrency),
                                                   ("rate", lim.rate),
                                                   ("per", lim.per if lim.rate else None),
                                                   ("by", lim.by))
                   if value is not None}
            for kind, lim in sorted(limits.items())}


async def prune(pool: Connections) -> list[str]:
    """Delete every stale host's row (safe from many hosts at once); return their owners."""
    async with pool.connection() as conn:
        cur = await conn.execute(sql.HOST_PRUNE, {"stale_leases": STALE_AFTER_LEASES})
        pruned = [row[0] for row in await cur.fetchall()]
    if pruned:
        log.warning("pruned %d stale hosts from pgpool_hosts: %s",
                    len(pruned), ", ".join(pruned))
    return pruned


class Pruner(LoopPart):
    """Every ``interval`` seconds, `prune`: the fleet's work, run by its maintenance leader
    (`pgpool.host.parts.leader`); every host prunes once when it registers."""

    name = "host pruner"

    def __init__(self, pool: Connections, interval: float) -> None:
        self._pool = pool
        self._loop = Loop(log, "pruning stale hosts", interval=interval)

    async def step(self) -> None:
        await prune(self._pool)
