"""Retention: dead jobs older than ``--dead-retention`` are deleted, and so are the records
of finished jobs past their ``keep_until`` (`pgpool.sql.outcomes.PRUNE_DONE`), never those of
a member of a group whose callback has not finished, dead or done (nor, done, of a group
not complete), groups with nothing left to show (`pgpool.sql.outcomes.PRUNE_GROUPS`), the
rate rings of tenants or keys unused for a day (`pgpool.sql.jobs.PRUNE_TICKS`), and the
tenants' CPU usage past the window fairness by CPU time weighs (`pgpool.sql.jobs.PRUNE_CPU`).

Every host runs this part, and one at a time prunes: each batch's transaction first takes
a per-schema advisory lock with ``pg_try_advisory_xact_lock`` (`sql.RETENTION_LOCK`), and a
host that does not get it leaves this pass to the one that did. Deletes go in batches of
`BATCH` rows, oldest first, each its own short transaction with a pause between them, so a
large backlog (the first pass after retention was shortened, say) holds no lock for long
and leaves autovacuum a steady trickle of dead tuples, not a storm.

A pass runs when the host starts and then every `interval`: a minute, or more often for
a dead-letter retention under 60 hours (a 3600th of the retention, at least a second), so a
short retention is kept to closely too. A record of a finished job goes at the first pass
after its ``keep_until``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from ...limits import MAX_PER
from ...logs import event
from ...ops import DeadFilter
from ...sql import jobs, outcomes
from ...sql import ops as sql
from .loop import Connections, Loop, LoopPart

log = logging.getLogger("pgpool.retention")

#: Rows per delete transaction.
BATCH: Final = 1000
#: Between batches: other sessions and autovacuum get the table in between.
BATCH_PAUSE: Final = 0.05


def interval(retention: float) -> float:
    """Seconds between passes for a retention of ``retention`` seconds."""
    return min(60.0, max(1.0, retention / 3600))


class Retention(LoopPart):
    """A pass (`prune`) when started, then every `interval` of ``retention`` seconds (the
    dead letters'; None: dead letters are kept, and a pass runs every minute)."""

    name = "retention"

    def __init__(self, pool: Connections, retention: float | None) -> None:
        self._pool = pool
        self.retention = retention
        #: What a pass deletes, in order: (what, statement, its parameters).
        self._prunes: list[tuple[str, str, dict[str, object]]] = [
            ("finished jobs", outcomes.PRUNE_DONE, {"limit": BATCH}),
            ("groups", outcomes.PRUNE_GROUPS, {"limit": BATCH}),
            ("rows of rate rings, a day unused", jobs.PRUNE_TICKS,
             {"limit": BATCH, "idle": MAX_PER}),
            ("buckets of tenants' CPU usage", jobs.PRUNE_CPU, {"limit": BATCH}),
        ]
        if retention is not None:
            self._prunes.insert(0, ("dead jobs", sql.PURGE_DEAD,
                                    {**DeadFilter(older_than=retention).params(),
                                     "keep_pending": True, "limit": BATCH}))
        self._loop = Loop(log, "retention",
                          interval=60.0 if retention is None else interval(retention))

    async def step(self) -> None:
        await self.prune()

    async def prune(self) -> int | None:
        """One pass; how many rows it deleted, or None if another host holds the lock."""
        total = 0
        for what, statement, params in self._prunes:
            pruned = await self._prune(statement, params)
            if pruned is None:
                return None  # another host prunes (or took over between two batches)
            deleted, batches = pruned
            total += deleted
            if deleted and what == "dead jobs":
                event(log, logging.INFO, "dead_pruned",
                      "dead-letter retention: deleted %d dead jobs older than %gs in %d "
                      "batches", deleted, self.retention, batches, deleted=deleted,
                      batches=batches, retention=self.retention)
            elif deleted:
                event(log, logging.INFO, "outcomes_pruned",
                      "retention: deleted %d %s past their keep", deleted, what,
                      deleted=deleted, what=what)
        return total

    async def _prune(self, statement: str, params: dict[str, object]
                     ) -> tuple[int, int] | None:
        """Delete in batches until one comes back short: how many rows in how many batches,
        or None if another host holds the lock."""
        deleted = batches = 0
        while True:
            async with self._pool.connection() as conn, conn.transaction():
                got = (await (await conn.execute(sql.RETENTION_LOCK)).fetchone())[0]
                if got:
                    cur = await conn.execute(statement, params)
                    n = (await cur.fetchone())[0]
            if not got:
                return (deleted, batches) if batches else None
            deleted += n
            batches += 1
            if n < BATCH:
                return deleted, batches
            await asyncio.sleep(BATCH_PAUSE)
