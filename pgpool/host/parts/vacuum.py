"""The vacuum keeper: pgpool_jobs is vacuumed as soon as its dead rows would slow claims.

Every claim and every ack leaves dead rows, and a claim reads the ready index in claim
order: the entries of the jobs claimed since the last vacuum are a dead head that every
claim walks over before it reaches a ready job, about 2 ms more per claim for each 100,000
of them. Autovacuum removes them, but it visits a database once per
``autovacuum_naptime`` (a minute by default), whatever the table's own thresholds say: a
host draining 10,000 jobs a second leaves over a million dead rows before it comes, and
the next batch is claimed at a tenth of the speed or less.

Every host runs a keeper. Every `INTERVAL` it reads the table's dead-row estimate
(`sql.VACUUM_DUE`, what autovacuum reads) and, at `MIN_DEAD` dead rows and `SCALE` of the
live ones, vacuums it (`sql.VACUUM_JOBS`): with SKIP_LOCKED, so a keeper that finds another
vacuum at work, autovacuum's or another host's, leaves it to that one. Vacuuming a table
the size of a busy queue's takes tens of milliseconds; its CPU is the server's.

A vacuum cannot remove the rows that died after the oldest transaction, slot or standby
that may still see them (the xmin horizon, `pgpool.horizon`). When one is held, the keeper's
vacuum leaves its dead rows behind: it then logs ``vacuum_held``, naming the holder and the
statement that ends it (at most once a `HELD_LOG_EVERY` for the same holder), and vacuums
again only once `MIN_DEAD` more rows have died, and only if the horizon has moved since
(the oldest transaction id holding it is another, `observe.HORIZON_XID`) or the dead rows
have grown `HELD_GROWTH` times. Behind the same holder a vacuum removes nothing, and it
reads the whole table, which grows with every job: a host draining 40,000 jobs a second
behind a pinned horizon vacuumed every second, 0.5 s a vacuum, a third of a core of the
server's two to no avail. Growth alone still vacuums now and then, for a holder this role
cannot see (its session's transaction ids read NULL to it, so it would not notice its
end).

Each vacuum runs on a connection of its own, opened for it (a few milliseconds, next to a
vacuum every few seconds at most) and without ``statement_timeout``: the dispatcher's
statements are bounded to keep a host responsive, but a vacuum cut off part way through
loses its work, and holds up nothing in the meantime (claims, acks and heartbeats do not
wait for it). A role that may not vacuum the table (`sql.CAN_VACUUM`) runs no keeper and
leaves it to autovacuum, which `keeper` says once.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Final

import psycopg

from ... import horizon
from ...db import dsn as dsnlib
from ...horizon import MIN_DEAD, SCALE
from ...logs import event
from ...sql import jobs as sql
from ...sql import observe
from .loop import Connections, Loop, LoopPart

log = logging.getLogger("pgpool.vacuum")

#: Seconds between looks at the dead-row estimate (which the server updates about as often).
INTERVAL: Final = 1.0
#: Seconds between two ``vacuum_held`` warnings naming the same holder.
HELD_LOG_EVERY: Final = 60.0
#: Behind a horizon that has not moved, the keeper vacuums again once the dead rows are
#: this many times what its last vacuum left.
HELD_GROWTH: Final = 2.0


async def keeper(pool: Connections, dsn: str, *,
                 elected: Connections | None = None) -> VacuumKeeper | None:
    """A keeper for the installation ``pool`` and ``dsn`` reach, working through
    ``elected`` (the leader's fenced connections; None: ``pool``), or None (logged) when
    this role may not vacuum pgpool_jobs."""
    async with pool.connection() as conn:
        (allowed,) = await (await conn.execute(sql.CAN_VACUUM)).fetchone()
    if allowed:
        return VacuumKeeper(elected or pool, dsn)
    event(log, logging.WARNING, "vacuum_keeper_off",
          "this role may not vacuum pgpool_jobs, so autovacuum alone removes its dead rows, "
          "once per autovacuum_naptime: claims slow down as they pile up. Run pgpool as the "
          "table's owner, GRANT MAINTAIN ON pgpool_jobs (PostgreSQL 17+), or lower "
          "autovacuum_naptime", reason="not allowed")
    return None


class VacuumKeeper(LoopPart):
    name = "vacuum keeper"

    def __init__(self, pool: Connections, dsn: str, *, interval: float = INTERVAL,
                 min_dead: int = MIN_DEAD, scale: float = SCALE) -> None:
        """Reads the dead-row estimate on ``pool`` every ``interval`` seconds, and vacuums
        on a new connection to ``dsn`` at ``min_dead`` dead rows and ``scale`` of the live
        ones."""
        self._pool = pool
        self._dsn = dsn
        self._params = {"min_dead": min_dead, "scale": scale}
        #: Vacuums this keeper started (one that found another at work ends at once).
        self.vacuums = 0
        #: The dead rows its last vacuum left, when as many as would make one due: the
        #: horizon held them (0: it removed what was due).
        self.left = 0
        #: The oldest transaction id holding the horizon after the last vacuum that left
        #: rows behind (`observe.HORIZON_XID`; None: none seen).
        self.horizon: str | None = None
        # The holder the last vacuum_held named ((kind, pid, name); None: one unseen), and
        # when (time.monotonic()).
        self._held_by: tuple[str, int | None, str | None] | None = None
        self._held_at = -math.inf
        self._loop = Loop(log, "vacuum keeper", interval=interval)

    async def step(self) -> None:
        await self.keep()

    async def keep(self) -> bool:
        """Vacuum pgpool_jobs if its dead rows are due (`sql.VACUUM_DUE`); whether it did."""
        async with self._pool.connection() as conn:
            row = await (await conn.execute(sql.VACUUM_DUE,
                                             {**self._params, "left": self.left})).fetchone()
            if row is None or not row[0]:
                return False  # no statistics for the table yet, or not due
            if (self.left and row[1] < HELD_GROWTH * self.left
                    and await self._horizon(conn) == self.horizon):
                return False  # held as it was: a vacuum would remove nothing more
        started = time.monotonic()
        async with await dsnlib.connect_async(self._dsn, autocommit=True) as conn:
            await conn.execute(sql.NO_STATEMENT_TIMEOUT)
            await conn.execute(sql.VACUUM_JOBS)
        self.vacuums += 1
        seconds = time.monotonic() - started
        event(log, logging.DEBUG, "vacuumed", "vacuumed pgpool_jobs (%d dead rows) in %.3fs",
              row[1], seconds, dead=row[1], seconds=round(seconds, 3))
        await self._after(row[1])
        return True

    @staticmethod
    async def _horizon(conn: psycopg.AsyncConnection[Any]) -> str | None:
        """The oldest transaction id that holds the horizon now (`observe.HORIZON_XID`)."""
        row = await (await conn.execute(observe.HORIZON_XID)).fetchone()
        return None if row is None else row[0]

    async def _after(self, before: int) -> None:
        """What the vacuum left (the server's count, which a vacuum sets at its end to the
        rows it could not remove yet): as many as would make one due again means the
        horizon held them, and who holds it is logged."""
        async with self._pool.connection() as conn:
            row = await (await conn.execute(sql.VACUUM_DUE,
                                             {**self._params, "left": 0})).fetchone()
            if row is None or not row[0]:
                self.left = 0
                return
            self.left = row[1]
            self.horizon = await self._horizon(conn)
            found = await (await conn.execute(observe.HORIZON_HOLDERS, {"limit": 1})
                           ).fetchone()
        oldest = horizon.holder(found) if found is not None and found[1] == "tables" else None
        who = (None if oldest is None
               else (oldest["kind"], oldest["pid"], oldest["name"]))
        now = time.monotonic()
        if who == self._held_by and now - self._held_at < HELD_LOG_EVERY:
            return
        self._held_by, self._held_at = who, now
        if oldest is None:
            held_by = ("a session this role may not inspect ("
                       f"{horizon.HIDDEN_HINT}; `pgpool status` lists what it can see)")
        else:
            held_by = f"{horizon.describe(oldest)}: {oldest['advice']}"
        event(log, logging.WARNING, "vacuum_held",
              "vacuumed pgpool_jobs, but %d of its %d dead rows are not yet removable: the "
              "xmin horizon is held by %s", self.left, before, held_by,
              dead_before=before, dead_left=self.left,
              holder=None if oldest is None else oldest["kind"],
              holder_pid=None if oldest is None else oldest["pid"],
              holder_name=None if oldest is None else oldest["name"],
              holder_age_seconds=None if oldest is None else oldest["age_seconds"])
