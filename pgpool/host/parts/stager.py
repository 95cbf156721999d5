"""The stager: scheduled jobs become ready when they fall due.

A job not due yet (enqueued with ``run_at`` or ``delay``, or a failed attempt waiting out
its retry backoff) is ``scheduled``, outside the ready index the claim reads, so however
many wait, at whatever priority, they cost a claim nothing. Each pass (`sql.STAGE_DUE`)
makes the due ones ready, oldest due first, in batches of `BATCH`, and notifies their
queues, so claimers wake at once rather than at their next poll.

Every host runs one; SKIP LOCKED keeps two from staging the same row, and each is enough
on its own. A batch the database refuses because of one of its rows (an application's
trigger or constraint) is bisected (`pgpool.host.isolate`): the others are made ready, and a
refused job is parked with its reason in ``last_error``, so it does not stop every later
pass; one refused on a lock, or that runs past the statement timeout alone, is left for the
next pass.

A pass learns when the next scheduled job is due, and the stager sleeps until then, at most
its ``interval`` (the poll interval: a job scheduled by another session for sooner is found
within it). It wakes earlier on `wake`: the listener calls it when it hears
`pgpool.sql.common.STAGE`, which every enqueue of a scheduled job sends, and the dispatcher
when its own acks scheduled retries. Every host hears every such enqueue, so a pass that a
wake-up starts comes at least `MIN_GAP` after the previous one: under a stream of delayed
enqueues each host runs at most ten passes a second, not one per job.
"""

from __future__ import annotations

import logging
from typing import Final

from ...errors import first_line
from ...sql import jobs as sql
from ...sql.common import int_array
from ..isolate import describe, isolate, park, report_parked, transient, whole_or_bisected
from .loop import Connections, Loop, LoopPart

log = logging.getLogger("pgpool.stager")

#: Jobs made ready per statement: each its own short transaction.
BATCH: Final = 1000
#: Seconds from the start of one pass to a pass a wake-up starts. A pass the next due time
#: starts is never held back.
MIN_GAP: Final = 0.1


class Stager(LoopPart):
    """A pass (`stage`) when the next scheduled job falls due, at most ``interval`` seconds
    after the last, and when woken: a job was scheduled that may be due before the time the
    last pass read."""

    name = "stager"

    def __init__(self, pool: Connections, interval: float) -> None:
        self._pool = pool
        # A wake-up arriving during a pass is for a job that pass may not have seen, so it
        # makes the next pass run at once.
        self._loop = Loop(log, "stager pass", interval=interval, min_gap=MIN_GAP)
        #: Jobs this stager has made ready since it started.
        self.staged = 0

    async def step(self) -> float:
        next_due = await self.stage()
        return self._loop.interval if next_due is None else min(self._loop.interval, next_due)

    async def stage(self) -> float | None:
        """One pass: make every due scheduled job ready, in batches. Returns the seconds
        until the next scheduled job is due, or None when none is scheduled."""
        while True:
            staged, next_due, handled = await whole_or_bisected(self._stage_batch,
                                                                self._isolate)
            self.staged += staged
            if handled < BATCH:
                return None if next_due is None else max(0.0, next_due)

    async def _stage_batch(self) -> tuple[int, float | None, int]:
        """The next batch in one statement: (staged, seconds to the next due job, jobs
        handled)."""
        staged, next_due = await self._stage(None)
        return staged, next_due, staged

    async def _stage(self, ids: list[int] | None) -> tuple[int, float | None]:
        """One `sql.STAGE_DUE` statement: the next batch, or only ``ids``."""
        params = {"limit": BATCH, "ids": None if ids is None else int_array(ids)}
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.STAGE_DUE, params)
            staged, _, next_due = await cur.fetchone()
        return staged, next_due

    async def _isolate(self) -> tuple[int, float | None, int]:
        """The batch STAGE_DUE failed on, bisected: (staged, seconds to the next due job,
        jobs handled, parked or left for a later pass included)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.STAGE_CANDIDATES, {"limit": BATCH})
            ids = [job_id for job_id, in await cur.fetchall()]
        written = await isolate(ids, self._stage)
        refused = [(job_id, exc) for job_id, exc in written.rejected if not transient(exc)]
        if refused:
            await self._park(refused)
        dues = [due for _, due in written.results if due is not None]
        return (sum(n for n, _ in written.results), min(dues, default=None), len(ids))

    async def _park(self, refused: list[tuple[int, BaseException]]) -> None:
        """Park the due jobs the database refused to make ready, each with its reason. One
        it refuses to park too stays as it is (and is tried again at the next pass)."""
        parked, again = await park(refused, self._write_park)
        report_parked(log, refused, parked, again, what="to make it ready (it is due)")

    async def _write_park(self, refused: list[tuple[int, BaseException]]) -> list[int]:
        """One `sql.PARK_SCHEDULED` statement for ``refused``; the ids it parked."""
        params = {
            "ids": int_array(job_id for job_id, _ in refused),
            "reasons": [f"the stager could not make it ready: {describe(exc)}: "
                        f"{first_line(exc)}" for _, exc in refused],
        }
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.PARK_SCHEDULED, params)
            return [job_id for job_id, in await cur.fetchall()]
