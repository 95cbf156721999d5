"""Dead-letter retention: dead jobs older than ``--dead-retention`` are deleted.

Every host runs this part, and one at a time prunes: each batch's transaction first takes
a per-schema advisory lock with ``pg_try_advisory_xact_lock`` (`sql.RETENTION_LOCK`), and a
host that does not get it leaves this pass to the one that did. Deletes go in batches of
`BATCH` rows, oldest first, each its own short transaction with a pause between them, so a
large backlog (the first pass after retention was shortened, say) holds no lock for long
and leaves autovacuum a steady trickle of dead tuples, not a storm.

A pass runs when the host starts and then every `interval`: a minute, or more often for
retentions under 60 hours (a 3600th of the retention, at least a second), so a short
retention is kept to closely too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from psycopg_pool import AsyncConnectionPool

from ..logs import event
from ..ops import DeadFilter
from ..sql import ops as sql
from .loop import Loop, LoopPart

log = logging.getLogger("pgpool.retention")

#: Rows per delete transaction.
BATCH: Final = 1000
#: Between batches: other sessions and autovacuum get the table in between.
BATCH_PAUSE: Final = 0.05


def interval(retention: float) -> float:
    """Seconds between passes for a retention of ``retention`` seconds."""
    return min(60.0, max(1.0, retention / 3600))


class Retention(LoopPart):
    """A pass (`prune`) when started, then every `interval` of ``retention`` seconds."""

    name = "dead-letter retention"

    def __init__(self, pool: AsyncConnectionPool, retention: float) -> None:
        self._pool = pool
        self.retention = retention
        self._params = {**DeadFilter(older_than=retention).params(), "limit": BATCH}
        self._loop = Loop(log, "dead-letter retention", interval=interval(retention))

    async def step(self) -> None:
        await self.prune()

    async def prune(self) -> int | None:
        """One pass; how many dead jobs it deleted, or None if another host holds the lock."""
        deleted = batches = 0
        while True:
            async with self._pool.connection() as conn, conn.transaction():
                got = (await (await conn.execute(sql.RETENTION_LOCK)).fetchone())[0]
                if got:
                    cur = await conn.execute(sql.PURGE_DEAD, self._params)
                    n = (await cur.fetchone())[0]
            if not got:
                break  # another host prunes (or took over between two batches)
            deleted += n
            batches += 1
            if n < BATCH:
                break
            await asyncio.sleep(BATCH_PAUSE)
        if deleted:
            event(log, logging.INFO, "dead_pruned",
                  "dead-letter retention: deleted %d dead jobs older than %gs in %d batches",
                  deleted, self.retention, batches, deleted=deleted, batches=batches,
                  retention=self.retention)
        return deleted if batches else None
