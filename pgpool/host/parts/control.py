"""Operator steering, as a host sees it: paused queues and cancelled jobs (`pgpool.ops`).

One small query (`sql.CONTROL_POLL`) at once when the listener hears
`pgpool.sql.common.CONTROL` (sent by ``pgpool pause``, ``resume`` and ``cancel``), and as a
backstop every poll interval, or every idle poll interval while the host holds no job and
its listener is connected (a notification is lost only while it is not): notifications
make a change act within a round trip or two, the poll within its interval when one is
lost. It reads two things:

- the paused queues: ``on_paused`` gets the new set whenever it changes (the claimer then
  leaves those queues out of its claims; running jobs finish);
- the cancelled attempts still in flight, as a digest of their ids: when it changes,
  ``on_cancelled`` is called (the heartbeat then beats at once: a cancelled running job has
  no owner any more, so the beat finds its lease lost and the pool kills its worker, or has
  the worker skip it if it still waits in the worker's pipe: the path a lost lease takes).
  A set rather than the latest time, so that a cancel committed after a later-dated one is
  noticed too (`sql.CONTROL_POLL`);
- operators' overrides of limits (``pgpool limits set``, `pgpool.limits`): ``on_limits`` gets
  them, by kind, at the first poll and whenever they change, and each change is logged (the
  audit trail: who set what).

The dispatcher claims nothing before the first poll has succeeded (`loaded`), so a pause
holds across restarts; until then the part polls like at any other time, so a database
that is away at start-up delays the first claim instead of failing the start.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Final

from psycopg_pool import AsyncConnectionPool

from ...limits import Override
from ...logs import event
from ...sql import fleet as sql
from .loop import Loop, LoopPart

log = logging.getLogger("pgpool.control")


#: Seconds between polls at most until the first one worked: the claim loops wait for it.
FIRST_POLL_RETRY: Final = 0.5


class Control(LoopPart):
    """A `poll` every ``interval`` seconds, and when woken (a control notification)."""

    name = "control poll"

    def __init__(self, pool: AsyncConnectionPool, interval: float, *,
                 on_paused: Callable[[frozenset[str]], None],
                 on_cancelled: Callable[[], None],
                 on_limits: Callable[[dict[str, Override]], None] | None = None,
                 idle_interval: float | None = None,
                 quiet: Callable[[], bool] = bool) -> None:
        """``idle_interval``: between polls while ``quiet()`` (the host runs nothing a
        cancel could stop, and its listener relays the control notifications)."""
        self._pool = pool
        self._idle_interval = interval if idle_interval is None else max(interval,
                                                                          idle_interval)
        self._quiet = quiet
        self._notified = False
        self._polled_at = -math.inf
        self._on_paused = on_paused
        self._on_limits = on_limits
        self.limits: dict[str, Override] = {}
        self._on_cancelled = on_cancelled
        self._loop = Loop(log, "control poll", interval=interval,
                          retry=lambda _failures: self._pause())
        self.paused: frozenset[str] = frozenset()
        self._cancelled: str | None = None
        self._polled = False
        #: Set once a poll has read the paused queues.
        self.loaded = asyncio.Event()

    def wake(self) -> None:
        self._notified = True
        self._loop.wake()

    async def step(self) -> float:
        # Every interval the part looks whether to poll: always when notified or busy,
        # only every idle interval when quiet, so a host that starts running jobs goes
        # back to the short poll at once.
        now = time.monotonic()
        if (self._notified or not self.loaded.is_set() or not self._quiet()
                or now - self._polled_at >= self._idle_interval):
            self._notified = False
            await self.poll()
            self._polled_at = now
        return self._pause()

    def _pause(self) -> float:
        """Seconds to the next look: the interval, shorter until the first poll worked."""
        interval = self._loop.interval
        return interval if self.loaded.is_set() else min(interval, FIRST_POLL_RETRY)

    async def poll(self) -> None:
        """Read the paused queues and the cancelled attempts; act on changes."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.CONTROL_POLL)
            paused, cancelled, overrides = await cur.fetchone()
        limits = {kind: Override(concurrency, rate, per, set_by, scope)
                  for kind, concurrency, rate, per, set_by, scope in overrides}
        if limits != self.limits or not self._polled:
            self._log_limits(limits)
            self.limits = limits
            if self._on_limits is not None:
                self._on_limits(limits)
        paused = frozenset(paused)
        if paused != self.paused:
            event(log, logging.INFO, "queues_paused", "paused queues: %s",
                  ", ".join(sorted(paused)) or "none", queues=sorted(paused))
            self.paused = paused
            self._on_paused(paused)
        if self._polled and cancelled != self._cancelled:
            self._on_cancelled()
        self._cancelled = cancelled
        self._polled = True
        self.loaded.set()

    def _log_limits(self, limits: dict[str, Override]) -> None:
        """Log each override set, changed or reset since the last poll."""
        for kind in sorted(limits.keys() | self.limits.keys()):
            new, old = limits.get(kind), self.limits.get(kind)
            if new == old:
                continue
            if new is None:
                event(log, logging.INFO, "limit_reset", "limit of kind %s: reset to the "
                      "code's", kind, kind=kind)
            else:
                event(log, logging.INFO, "limit_set", "limit of kind %s: %s, set by %s",
                      kind, new.describe(), new.set_by, kind=kind,
                      concurrency=new.concurrency, rate=new.rate, per=new.per,
                      by=new.by, set_by=new.set_by)
