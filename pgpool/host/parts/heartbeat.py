"""Batched heartbeats: one statement extends the leases of every job this host holds.

The heartbeat is the only part that decides a lease is lost, and the only writer of
`Job.lost`: when the database no longer shows an attempt as ours, or when no heartbeat has
succeeded for `Lease.abandon_after`. It marks those jobs and calls ``on_lost``, which stops
them (the pool kills a worker running one; a worker skips one still queued); every other
part only reads the flag, and a lost job's result is dropped instead of acked. It also
moves `Job.deadline` on for every job a heartbeat extended, then calls ``on_extended`` (the
pool tells its workers, whose fence would otherwise end them at the old deadline:
`pgpool.worker.fence`). After a beat, on its connection, ``progress`` writes the progress
the running jobs reported since (`pgpool.host.long`): none, most beats.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...logs import event
from ...sql import jobs as sql
from ...sql.common import int_array
from ..attempt import Job
from ..lease import Lease
from .loop import Loop, LoopPart

log = logging.getLogger("pgpool.heartbeat")


class Heartbeat(LoopPart):
    """Every `Lease.beat_interval`, extend the leases of ``held()`` jobs.

    Jobs the database no longer shows as ours are marked lost, then ``on_lost`` is called;
    but not the jobs ``acking()`` returns (their attempt is over and their ack is being
    written: the beat may simply have found that ack written), nor a row another
    transaction was changing (judged at the next beat).
    When heartbeats fail (an error, or no answer within a beat interval), they are retried
    every `Lease.retry_interval` (only a beat that sent a statement ends such an outage);
    `at_risk` turns True after `Lease.at_risk_after` without one (stop claiming), and
    `check_expiry` marks every held job lost once
    `Lease.abandon_after` has passed: before the lease can expire on the server and the
    reaper can hand the job to another host, so two attempts of a job never run at once.
    `wake` beats at once: a job may have been cancelled, and the beat that finds it gone
    stops its worker (`pgpool.host.parts.control`).
    """

    name = "heartbeat"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        owner: str,
        lease: Lease,
        held: Callable[[], list[Job]],
        on_lost: Callable[[], None],
        on_extended: Callable[[], None],
        *,
        acking: Callable[[], list[Job]] = list,
        progress: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
    ) -> None:
        self._pool = pool
        self._owner = owner
        self.lease = lease
        self._held = held
        self._on_lost = on_lost
        self._on_extended = on_extended
        self._acking = acking
        self._progress = progress
        self._loop = Loop(log, "heartbeat", interval=lease.beat_interval,
                          retry=lease.retry_interval, timeout=lease.beat_interval,
                          wait_first=True, reached=lambda: self.reached)
        self.last_ok = time.monotonic()
        #: The last successful beat sent a statement (it holds jobs).
        self.reached = False
        #: Attempts found lost (the database no longer shows them as ours), and attempts
        #: abandoned for want of a successful heartbeat, since start.
        self.lost = 0
        self.abandoned = 0

    @property
    def at_risk(self) -> bool:
        return time.monotonic() - self.last_ok > self.lease.at_risk_after

    def check_expiry(self) -> None:
        """Give up every held job if no heartbeat succeeded for `Lease.abandon_after`.

        ``last_ok`` is taken before the statement is sent, so the server-side lease always
        ends later than ``last_ok + lease``: abandoning earlier than that is safe.
        """
        silent = time.monotonic() - self.last_ok
        if silent <= self.lease.abandon_after:
            return
        lost = [job for job in self._held() if not job.lost]
        if lost:
            event(log, logging.ERROR, "abandoned",
                  "no heartbeat for %.1fs: abandoning %d jobs before their leases expire",
                  silent, len(lost), jobs=len(lost), seconds=round(silent, 3))
            self.abandoned += len(lost)
            self._lose(lost)

    async def _write_progress(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Progress is for people to read: a failure to write it is logged, and never
        fails the beat whose leases were just extended."""
        assert self._progress is not None
        try:
            await self._progress(conn)
        except (psycopg.Error, OSError) as exc:
            log.warning("writing the running jobs' progress failed (%s); the next report "
                        "is written with a later beat", type(exc).__name__)

    async def step(self) -> None:
        await self.beat()

    async def beat(self) -> set[tuple[int, int]]:
        """Extend the leases of every held job; return the (id, attempt) pairs found lost.

        Attempts are matched as (id, attempt), never by id alone: this host may hold a
        fresh attempt of a job whose stale attempt it still holds too (an unsent ack), or
        claim one while this beat is in flight; losing the old one must not touch it.
        """
        jobs = [job for job in self._held() if not job.lost]
        started = time.monotonic()
        if jobs:
            params = {
                "ids": int_array(j.id for j in jobs),
                "attempts": int_array(j.attempt for j in jobs),
                "started": "{" + ",".join("t" if j.started else "f" for j in jobs) + "}",
                "owner": self._owner,
                "lease": self.lease.seconds,
            }
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql.HEARTBEAT, params)
                owned = await cur.fetchall()
                if self._progress is not None:
                    await self._write_progress(conn)
            kept = {(job_id, attempt) for job_id, attempt, extended in owned if extended}
            busy = {(job_id, attempt) for job_id, attempt, extended in owned if not extended}
        else:
            kept = busy = set()
        self.last_ok = started
        self.reached = bool(jobs)
        if kept:
            deadline = self.lease.deadline(started)
            for job in jobs:
                if (job.id, job.attempt) in kept:
                    job.deadline = deadline
            self._on_extended()
        # A job acked while the heartbeat was in flight is simply gone (and one whose ack
        # is still being written may be), and one claimed meanwhile was not asked about;
        # only attempts sent, not extended and not busy are lost.
        sent = {(j.id, j.attempt) for j in jobs}
        unjudged = kept | busy | {(j.id, j.attempt) for j in self._acking()}
        lost = [j for j in self._held()
                if (j.id, j.attempt) in sent and (j.id, j.attempt) not in unjudged
                and not j.lost]
        if lost:
            ids = sorted(j.id for j in lost)
            event(log, logging.WARNING, "lease_lost",
                  "lost the lease of %d jobs (ids %s); dropping their results",
                  len(lost), ", ".join(map(str, ids[:10])), jobs=len(lost))
            self.lost += len(lost)
            self._lose(lost)
        return {(j.id, j.attempt) for j in lost}

    def _lose(self, jobs: list[Job]) -> None:
        for job in jobs:
            job.lost = True
        self._on_lost()
