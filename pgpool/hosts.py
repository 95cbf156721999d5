"""The host registry: one ``pgpool_hosts`` row per running dispatcher.

A dispatcher registers when it starts, beats every `Lease.beat_interval` (``last_seen``, its job
counters and its claims per second since the previous beat), and deletes its row on a clean
exit. A dispatcher that died, or that has been cut off from the database, stops beating;
once its row is `STALE_AFTER_LEASES` of its own leases old, any host prunes it. The row is
for observability (``pgpool status``) and for sharing the fleet's claim budget
(`pgpool.budget`): nothing about a job depends on it. The jobs such a host held come back
through their leases and the reaper, about one lease after its last heartbeat and so well
before the row is pruned.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Final

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import sql
from .lease import STALE_AFTER_LEASES, Lease
from .retry import Failures

log = logging.getLogger("pgpool.hosts")

#: How long a clean exit waits to delete its row before leaving it to be pruned.
DEREGISTER_TIMEOUT: Final = 5.0


class HostRegistry:
    """This dispatcher's row in ``pgpool_hosts``.

    ``counters()`` returns (jobs done, attempts failed, jobs claimed) since the dispatcher
    started; each beat records them, and the jobs claimed per second since the previous
    beat. ``max_claims_per_sec`` is the fleet budget this host runs with, recorded so
    ``pgpool status`` can compare the fleet's claims with it. `beat` and `deregister` are
    serialised, and once deregistered the registry never writes the row again, so a beat in
    flight cannot resurrect it.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        owner: str,
        *,
        procs: int,
        queues: Sequence[str],
        kinds: Sequence[str],
        lease: Lease,
        max_claims_per_sec: float,
        counters: Callable[[], tuple[int, int, int]],
        clock: Callable[[], float] = time.monotonic,
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
            "max_claims_per_sec": max_claims_per_sec,
        }
        self._counters = counters
        self._clock = clock
        #: (jobs claimed, clock) at the last beat written: the next beat's rate starts there.
        self._last_claimed: tuple[int, float] | None = None
        self._started_at: datetime | None = None
        self._closed = False
        self._lock = asyncio.Lock()
        #: Live hosts in the fleet, this one included, as of the last beat.
        self.live_hosts = 1
        #: When a beat last reached the database (``clock()``; the dispatcher checked the
        #: database just before building the registry).
        self.last_ok = clock()

    async def register(self) -> None:
        """Prune stale hosts, then insert this host's row. Database errors propagate."""
        await self.prune()
        await self.beat()

    async def run(self) -> None:
        """Beat and prune every beat interval until cancelled; failures are logged and retried."""
        failures = Failures(log, "host registry update")
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.beat()
                await self.prune()
                failures.succeeded()
            except (psycopg.Error, OSError) as exc:
                failures.failed(exc)

    async def beat(self) -> None:
        """Upsert this host's row: ``last_seen = now()``, the current counters, and the jobs
        claimed per second since the last beat written (NULL at the first).

        Re-creates the row (same ``started_at``) if it was pruned meanwhile; does nothing
        after `deregister`.
        """
        async with self._lock:
            if self._closed:
                return
            done, failed, claimed = self._counters()
            now = self._clock()
            rate = None
            if self._last_claimed is not None and now > self._last_claimed[1]:
                rate = (claimed - self._last_claimed[0]) / (now - self._last_claimed[1])
            params = {**self._row, "started_at": self._started_at, "jobs_done": done,
                      "jobs_failed": failed, "jobs_claimed": claimed, "claims_per_sec": rate}
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql.HOST_UPSERT, params)
                (self._started_at,) = await cur.fetchone()
                # After a failed beat the next rate spans both intervals, so no claim is missed.
                self._last_claimed = (claimed, now)
                cur = await conn.execute(sql.HOST_LIVE_COUNT,
                                         {"stale_leases": STALE_AFTER_LEASES})
                self.live_hosts = max(1, (await cur.fetchone())[0])
            self.last_ok = self._clock()

    async def prune(self) -> list[str]:
        """Delete every stale host's row (safe from many hosts at once); return their owners."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.HOST_PRUNE, {"stale_leases": STALE_AFTER_LEASES})
            pruned = [row[0] for row in await cur.fetchall()]
        if pruned:
            log.warning("pruned %d stale hosts from pgpool_hosts: %s",
                        len(pruned), ", ".join(pruned))
        return pruned

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
