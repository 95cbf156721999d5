"""Batched heartbeats: one statement extends the leases of every job this host holds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import sql
from .job import Job

log = logging.getLogger("pgpool.heartbeat")


class Heartbeat:
    """Every ``lease / 3`` seconds, extend the leases of ``held()`` jobs.

    Ids the database no longer shows as ours are passed to ``on_lost``: their results must
    be dropped. If heartbeats keep failing, `at_risk` turns True after half a lease (stop
    claiming) and, once a whole lease has passed, every held job is reported lost, since
    the reaper may already have given it to another host.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        owner: str,
        lease: float,
        held: Callable[[], list[Job]],
        on_lost: Callable[[set[int]], None],
    ) -> None:
        self._pool = pool
        self._owner = owner
        self.lease = lease
        self._held = held
        self._on_lost = on_lost
        self.last_ok = time.monotonic()
        self.beats = 0

    @property
    def at_risk(self) -> bool:
        return time.monotonic() - self.last_ok > self.lease / 2

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self.beat()
            except (psycopg.Error, OSError) as exc:
                log.warning("heartbeat failed: %s", type(exc).__name__)
                if time.monotonic() - self.last_ok > self.lease:
                    lost = {job.id for job in self._held() if not job.lost}
                    if lost:
                        log.error("no heartbeat for a whole lease: abandoning %d jobs",
                                  len(lost))
                        self._on_lost(lost)

    async def beat(self) -> set[int]:
        jobs = [job for job in self._held() if not job.lost]
        started = time.monotonic()
        if jobs:
            params = {
                "ids": [j.id for j in jobs],
                "attempts": [j.attempt for j in jobs],
                "owner": self._owner,
                "lease": self.lease,
            }
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql.HEARTBEAT, params)
                kept = {row[0] for row in await cur.fetchall()}
        else:
            kept = set()
        self.last_ok = started
        self.beats += 1
        # A job acked while the heartbeat was in flight is simply gone; only jobs still
        # held now and not extended are really lost.
        sent = {j.id for j in jobs}
        lost = {j.id for j in self._held() if j.id in sent and j.id not in kept and not j.lost}
        if lost:
            log.warning("lost the lease of %d jobs (ids %s); dropping their results",
                        len(lost), ", ".join(map(str, sorted(lost)[:10])))
            self._on_lost(lost)
        return lost
