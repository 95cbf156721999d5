"""The reaper: jobs whose lease expired go back to ready, or to pgpool_dead when exhausted.

A lease expires only when its dispatcher stopped heartbeating (it died, or lost the
database for a whole lease), so this never steals a job from a live, connected host. Every
host runs a reaper; SKIP LOCKED keeps them from handling the same row twice.

When the database refuses a batch because of one of its rows (an application's foreign
key or trigger, a unique violation in ``pgpool_dead``, a lock held past ``lock_timeout``),
or cancels it at ``statement_timeout`` (each job buried is a delete, which may scan an
application's table that references jobs without an index), the batch is bisected
(`pgpool.host.isolate`): every other expired job is returned, and each refused one is parked
with `sql.PARK_EXPIRED`, its reason in ``last_error``, so the next pass does not stop on it
again. One refused on a lock, or that runs past the statement timeout alone, is left for
`LOCK_RETRIES` more passes first (the lock may be a short application transaction's, the
slowness a moment's).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from ...db import statements
from ...errors import first_line
from ...logs import event
from ...retry import FREE_INTERRUPTIONS
from ...sql import jobs as sql
from ...sql.common import int_array
from ..isolate import describe, isolate, park, report_parked, transient, whole_or_bisected
from .loop import Connections, Loop, LoopPart

log = logging.getLogger("pgpool.reaper")

BATCH = 1000
#: Passes that leave an expired job refused on a row lock, or that ran past the statement
#: timeout alone, as it is, before it is parked.
LOCK_RETRIES: Final = 3


class Reaper(LoopPart):
    """Every ``interval`` seconds, a pass (`reap`) over the expired leases."""

    name = "reaper"

    def __init__(self, pool: Connections, interval: float) -> None:
        self._pool = pool
        self._loop = Loop(log, "reaper pass", interval=interval)
        # One pass at a time per process: a caller that reaps on demand (``--burst``) then
        # knows that every revival the periodic pass made is committed when it returns.
        self._lock = asyncio.Lock()
        #: Lock and statement timeouts so far of the jobs refused on them, by id.
        self._lock_misses: dict[int, int] = {}

    async def step(self) -> None:
        await self.reap()

    async def reap(self) -> tuple[int, int]:
        """One pass, in batches; returns (returned to ready, moved to pgpool_dead). Database
        errors propagate (the next pass starts over), but those about one row."""
        revived = buried = 0
        async with self._lock:
            while True:
                r, d, handled = await whole_or_bisected(self._reap_batch, self._isolate)
                revived += r
                buried += d
                if handled < BATCH:
                    break
        if revived or buried:
            log.warning("reaper: %d expired jobs returned to the queue, %d dead-lettered",
                        revived, buried)
        return revived, buried

    async def _reap_batch(self) -> tuple[int, int, int]:
        """The next batch in one statement: (revived, buried, jobs handled)."""
        r, d = await self._reap(None)
        return r, d, r + d

    async def _reap(self, ids: list[int] | None) -> tuple[int, int]:
        """One `sql.REAP` statement: the next batch, or only ``ids``."""
        params = {"limit": BATCH, "ids": None if ids is None else int_array(ids),
                  "max_interruptions": FREE_INTERRUPTIONS}
        async with self._pool.connection() as conn:
            cur = await statements.execute(conn, sql.REAP, params)
            r, d, _, _, _ = await cur.fetchone()
        return r, d

    async def _isolate(self) -> tuple[int, int, int]:
        """The batch REAP failed on, bisected: (revived, buried, jobs handled, parked or
        left for a later pass included)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.REAP_CANDIDATES, {"limit": BATCH})
            ids = [job_id for job_id, in await cur.fetchall()]
        written = await isolate(ids, self._reap)
        if written.timeouts:
            event(log, logging.WARNING, "reap_timeout",
                  "%d statements of a reaper pass over %d expired jobs ran past "
                  "statement_timeout; each was split, or left for a later pass if it held "
                  "one job (does an application table reference pgpool_jobs(id) from a "
                  "column without an index?)", written.timeouts,
                  len(ids), jobs=len(ids), timeouts=written.timeouts)
        # Forget jobs no longer expired here (returned by another host, or changed by hand).
        candidates = set(ids)
        self._lock_misses = {i: n for i, n in self._lock_misses.items() if i in candidates}
        revived = sum(r for r, _ in written.results)
        buried = sum(d for _, d in written.results)
        refused = []
        for job_id, exc in written.rejected:
            misses = self._lock_misses.get(job_id, 0)
            if transient(exc) and misses < LOCK_RETRIES:
                self._lock_misses[job_id] = misses + 1
            else:
                self._lock_misses.pop(job_id, None)
                refused.append((job_id, exc))
        if refused:
            await self._park(refused)
        return revived, buried, len(ids)

    async def _park(self, refused: list[tuple[int, BaseException]]) -> None:
        """Park the jobs the database refused to return, each with its reason. One it
        refuses to park too stays as it is (and is tried again at the next pass)."""
        parked, again = await park(refused, self._write_park)
        report_parked(log, refused, parked, again, what="to return it (its lease expired)")

    async def _write_park(self, refused: list[tuple[int, BaseException]]) -> list[int]:
        """One `sql.PARK_EXPIRED` statement for ``refused``; the ids it parked."""
        params = {
            "ids": int_array(job_id for job_id, _ in refused),
            "reasons": [f"the reaper could not return it: {describe(exc)}: {first_line(exc)}"
                        for _, exc in refused],
        }
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.PARK_EXPIRED, params)
            return [job_id for job_id, in await cur.fetchall()]
