"""The reaper: jobs whose lease expired go back to ready, or to pgpool_dead when exhausted.

A lease expires only when its dispatcher stopped heartbeating (it died, or lost the
database for a whole lease), so this never steals a job from a live, connected host. Every
host runs a reaper; SKIP LOCKED keeps them from handling the same row twice.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import sql
from .retry import FREE_INTERRUPTIONS, Failures

log = logging.getLogger("pgpool.reaper")

BATCH = 1000


class Reaper:
    def __init__(self, pool: AsyncConnectionPool, interval: float) -> None:
        self._pool = pool
        self.interval = interval
        # One pass at a time per process: a caller that reaps on demand (``--burst``) then
        # knows that every revival the periodic pass made is committed when it returns.
        self._lock = asyncio.Lock()

    async def run(self) -> None:
        failures = Failures(log, "reaper pass")
        while True:
            try:
                await self.reap()
                failures.succeeded()
            except (psycopg.Error, OSError) as exc:
                failures.failed(exc)
            await asyncio.sleep(self.interval)

    async def reap(self) -> tuple[int, int]:
        """One pass, in batches; returns (returned to ready, moved to pgpool_dead)."""
        revived = buried = 0
        async with self._lock:
            while True:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(sql.REAP, {"limit": BATCH,
                                                       "max_interruptions": FREE_INTERRUPTIONS})
                    r, d = await cur.fetchone()
                revived += r
                buried += d
                if r + d < BATCH:
                    break
        if revived or buried:
            log.warning("reaper: %d expired jobs returned to the queue, %d dead-lettered",
                        revived, buried)
        return revived, buried
