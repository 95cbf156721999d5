"""The periodic part: a dispatcher's schedules' ticks enqueued, each exactly once across the
fleet (the schedules themselves are declared with `pgpool.periodic`: `pgpool.schedules`).

The part wakes at its schedules' next tick, enqueues the due ticks and sleeps again.
Whichever hosts are up, each tick is enqueued exactly once, by the database, not by timing:
a schedule's ``pgpool_schedules`` row holds ``last_tick`` (every tick up to it is handled),
and a host enqueues ticks only in the transaction in which its compare-and-set moves
``last_tick`` from the value it read to the latest due tick (`sql.PERIODIC_ADVANCE`),
holding the row's lock. Of two hosts racing for one tick, the second finds the row locked
(`sql.PERIODIC_LOCK` skips it rather than wait) and looks again shortly, or finds
``last_tick`` moved and enqueues nothing. The jobs table cannot remember past ticks itself:
done jobs are deleted.

Each dispatcher refreshes its schedules' rows (definition, ``declared_until``) every beat
interval; ``pgpool status`` shows a row no live host declares any more as not declared, and
no host enqueues it: removing a schedule from the code stops it. The row and its
``last_tick`` stay, so declaring the name again resumes it (with the usual catch-up).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...enqueue import enqueue_async
from ...logs import event
from ...schedules import Schedule
from ...sql import fleet as sql
from .loop import Loop, LoopPart

# The events of the schedules' part keep the logger they always had.
log = logging.getLogger("pgpool.schedules")

#: After a wake-up the database's clock may lag the host's by this much: wake this late.
_WAKE_SLACK: Final = 0.005
#: Seconds before looking again at a schedule whose row another transaction held.
_BUSY_RETRY: Final = 0.05


class Periodic(LoopPart):
    """One dispatcher's periodic part: `run` enqueues its schedules' due ticks, once across
    the fleet, and keeps their rows declared."""

    name = "periodic schedules"

    def __init__(self, pool: AsyncConnectionPool, owner: str,
                 schedules: dict[str, Schedule], *, refresh: float, declared_for: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``refresh``: seconds between declarations; ``declared_for``: how long one holds
        (`pgpool status` shows the schedule as not declared after that)."""
        self._pool = pool
        self.owner = owner
        self.schedules = dict(sorted(schedules.items()))  # one lock order for every host
        self.refresh = refresh
        self.declared_for = declared_for
        self._clock = clock
        self._declared_at = -math.inf
        #: (name, the other definition) pairs already warned about.
        self._warned: set[tuple[str, tuple[str, ...]]] = set()
        self._loop = Loop(log, "periodic schedules", interval=refresh,
                          retry=min(refresh, 1.0))

    async def step(self) -> float:
        """Declare if due, enqueue every due tick; the seconds until the next thing to do."""
        async with self._pool.connection() as conn:
            if self._clock() - self._declared_at >= self.refresh:
                await self._declare(conn)
            cur = await conn.execute(sql.PERIODIC_STATE, {"names": list(self.schedules),
                                                           "owner": self.owner})
            rows = await cur.fetchall()
            read_at = self._clock()
            wake = self.refresh - (read_at - self._declared_at)
            for name, last, other, definition, now in rows:
                schedule = self.schedules[name]
                self._check_version(schedule, other, tuple(definition))
                due = schedule.due(last, now)
                if due and not await self._enqueue(conn, schedule, last, due):
                    wake = min(wake, _BUSY_RETRY)
                    continue
                until = (schedule.next_after(due[-1] if due else last) - now).total_seconds()
                wake = min(wake, until - (self._clock() - read_at))
        return max(0.0, wake) + _WAKE_SLACK

    async def _declare(self, conn: psycopg.AsyncConnection) -> None:
        s = list(self.schedules.values())
        await conn.execute(sql.PERIODIC_DECLARE, {
            "names": [x.name for x in s], "crons": [x.cron for x in s],
            "zones": [x.timezone for x in s], "kinds": [x.kind for x in s],
            "queues": [x.queue for x in s], "catch_ups": [x.catch_up for x in s],
            "owner": self.owner, "seconds": self.declared_for,
        })
        self._declared_at = self._clock()

    def _check_version(self, schedule: Schedule, other: str | None,
                       definition: tuple[str, ...]) -> None:
        """Warn (once) when another live host declares this name differently: the hosts
        run different code versions, and either definition's ticks may fire meanwhile."""
        if other is None or definition == schedule.definition():
            return
        if (schedule.name, definition) in self._warned:
            return
        self._warned.add((schedule.name, definition))
        event(log, logging.WARNING, "periodic_mismatch",
              "schedule %r: another live host (%s) declares it as %r in %s (kind %s, queue "
              "%s), this one as %r in %s: the hosts run different code; each tick is still "
              "enqueued at most once", schedule.name, other, definition[0], definition[1],
              definition[2], definition[3], schedule.cron, schedule.timezone,
              schedule=schedule.name, other=other)

    async def _enqueue(self, conn: psycopg.AsyncConnection, schedule: Schedule,
                       last: datetime, due: list[datetime]) -> bool:
        """Move ``last_tick`` from ``last`` to ``due[-1]`` and enqueue ``due``, in one
        transaction; nothing if another host moved it first. False when the row was
        locked: whether these ticks get enqueued is not settled yet."""
        ids: list[int | None] = []
        async with conn.transaction():
            cur = await conn.execute(sql.PERIODIC_LOCK, {"name": schedule.name})
            row = await cur.fetchone()
            if row is None:
                return False  # another transaction holds the row: look again shortly
            cur = await conn.execute(sql.PERIODIC_ADVANCE, {
                "name": schedule.name, "seen": last, "tick": due[-1]})
            if await cur.fetchone() is None:
                return True  # another host enqueued these ticks since they were read
            for tick in due:
                ids.append(await enqueue_async(
                    conn, schedule.kind, schedule.payload_for(tick), queue=schedule.queue,
                    priority=schedule.priority, max_attempts=schedule.max_attempts))
        missed = schedule.next_after(last) < due[0]
        event(log, logging.INFO, "periodic_enqueued",
              "schedule %r: enqueued %s as %s (kind %s)%s", schedule.name,
              ", ".join(t.isoformat() for t in due), ", ".join(f"job {i}" for i in ids),
              schedule.kind, " after missed ticks (catch-up)" if missed else "",
              schedule=schedule.name, kind=schedule.kind,
              ticks=[t.isoformat() for t in due], jobs=ids, missed=missed)
        return True

