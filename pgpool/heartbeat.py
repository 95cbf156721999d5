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
    be dropped. When heartbeats fail (an error, or no answer within lease/3), they are
    retried every `RETRY` seconds; `at_risk` turns True after half a lease without one
    (stop claiming), and `check_expiry` reports every held job lost once `ABANDON_AT` of a
    lease has passed: before the lease can expire on the server and the reaper can hand
    the job to another host, so two attempts of a job never run at the same time.
    """

    #: Fraction of a lease without a successful heartbeat after which held jobs are given up.
    ABANDON_AT = 0.8
    #: Seconds between heartbeat attempts after a failure.
    RETRY = 0.5

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

    @property
    def at_risk(self) -> bool:
        return time.monotonic() - self.last_ok > self.lease / 2

    def check_expiry(self) -> None:
        """Give up every held job if no heartbeat succeeded for `ABANDON_AT` of a lease.

        ``last_ok`` is taken before the statement is sent, so the server-side lease always
        ends later than ``last_ok + lease``: abandoning earlier than that is safe.
        """
        if time.monotonic() - self.last_ok <= self.ABANDON_AT * self.lease:
            return
        lost = {job.id for job in self._held() if not job.lost}
        if lost:
            log.error("no heartbeat for %.1fs: abandoning %d jobs before their leases expire",
                      time.monotonic() - self.last_ok, len(lost))
            self._on_lost(lost)

    async def run(self) -> None:
        pause = self.lease / 3
        while True:
            await asyncio.sleep(pause)
            try:
                async with asyncio.timeout(self.lease / 3):
                    await self.beat()
                pause = self.lease / 3
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("heartbeat failed: %s", type(exc).__name__)
                pause = min(self.RETRY, self.lease / 3)

    async def beat(self) -> set[int]:
        jobs = [job for job in self._held() if not job.lost]
        started = time.monotonic()
        if jobs:
            params = {
                "ids": sql.int_array(j.id for j in jobs),
                "attempts": sql.int_array(j.attempt for j in jobs),
                "owner": self._owner,
                "lease": self.lease,
            }
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql.HEARTBEAT, params)
                kept = {row[0] for row in await cur.fetchall()}
        else:
            kept = set()
        self.last_ok = started
        # A job acked while the heartbeat was in flight is simply gone; only jobs still
        # held now and not extended are really lost.
        sent = {j.id for j in jobs}
        lost = {j.id for j in self._held() if j.id in sent and j.id not in kept and not j.lost}
        if lost:
            log.warning("lost the lease of %d jobs (ids %s); dropping their results",
                        len(lost), ", ".join(map(str, sorted(lost)[:10])))
            self._on_lost(lost)
        return lost
