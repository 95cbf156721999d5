"""The stager: scheduled jobs become ready when they fall due.

A job not due yet (enqueued with ``run_at`` or ``delay``, or a failed attempt waiting out
its retry backoff) is ``scheduled``, outside the ready index the claim reads, so however
many wait, at whatever priority, they cost a claim nothing. Each pass (`sql.STAGE_DUE`)
makes the due ones ready, oldest due first, in batches of `BATCH`, and notifies their
queues, so claimers wake at once rather than at their next poll.

Every host runs one; SKIP LOCKED keeps two from staging the same row, and each is enough
on its own. A pass learns when the next scheduled job is due, and the stager sleeps until
then, at most its ``interval`` (the poll interval: a job scheduled by another session for
sooner is found within it). It wakes earlier on `wake`: the listener calls it when it
hears `sql.STAGE`, which every enqueue of a scheduled job sends, and the dispatcher when
its own acks scheduled retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import sql
from .retry import Failures

log = logging.getLogger("pgpool.stager")

#: Jobs made ready per statement: each its own short transaction.
BATCH: Final = 1000


class Stager:
    def __init__(self, pool: AsyncConnectionPool, interval: float) -> None:
        self._pool = pool
        self.interval = interval
        self._woken = asyncio.Event()
        #: Jobs this stager has made ready since it started.
        self.staged = 0

    def wake(self) -> None:
        """A job was scheduled that may be due before the time the last pass read."""
        self._woken.set()

    async def run(self) -> None:
        failures = Failures(log, "stager pass")
        while True:
            wait = self.interval
            try:
                next_due = await self.stage()
                failures.succeeded()
                if next_due is not None:
                    wait = min(wait, next_due)
            except (psycopg.Error, OSError) as exc:
                failures.failed(exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._woken.wait()

    async def stage(self) -> float | None:
        """One pass: make every due scheduled job ready, in batches. Returns the seconds
        until the next scheduled job is due, or None when none is scheduled."""
        # Cleared before reading: a wake-up arriving during the pass is for a job this
        # pass may not have seen, so it makes the next pass run at once.
        self._woken.clear()
        while True:
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql.STAGE_DUE, {"limit": BATCH})
                staged, _, next_due = await cur.fetchone()
            self.staged += staged
            if staged < BATCH:
                return None if next_due is None else max(0.0, next_due)
