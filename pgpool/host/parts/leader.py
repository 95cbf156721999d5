"""The maintenance leader: one host of the fleet, elected, runs the work that is the fleet's
rather than a host's (the reaper, the stager, the vacuum keeper, retention, pruning stale
host rows), instead of every host running it on its own timer::

    every host:  Leadership.run() ── LEADER_ACQUIRE ──▶ pgpool_leader ('maintenance')
                   │ won: term = token                    holder, token, expires_at
                   ▼                                         ▲
                 Elected(part).run(): part.run() while the   │ LEADER_FENCE (FOR SHARE,
                   term lasts; cancelled when it ends        │ token, expires_at > now())
                   │                                         │
                   └─ part's statements ─ Fenced.connection() ┘ first in each transaction

A host that does not lead sends one statement per lease, at the expiry the last one read
(a leader renews every third of a lease, so it finds the lease renewed and sleeps again):
a fleet of a thousand idle hosts costs the database a few dozen statements a second for
the election, not the thousands of maintenance passes every host made. When the leader
dies or freezes it stops renewing, its lease expires and the first host to look after
that takes it: within one lease of its last renewal, so within about one lease of its end;
its jobs' leases have expired by then too, and the new leader's reaper returns them. A
clean exit resigns (`sql.LEADER_RESIGN`, which notifies every host's listener), so a
successor takes over at once.

Why a lease row with a fencing token, not an advisory lock. A session advisory lock is
held for as long as the session lasts: a leader frozen by SIGSTOP, a stalled VM or a
network partition keeps its session, hence its lock, and the fleet's maintenance stops for
as long as it is frozen; and a leader whose session was ended (and lock lost) learns it
only when it next talks to the server, so for a while two hosts would both think they
lead. Here the lease ends on the server's clock whatever the holder does, and "never two at
once" is the database's, not the hosts' timing: every transaction of an elected part first
locks the lease row FOR SHARE with the token of its term and an unexpired lease
(`sql.LEADER_FENCE`). Taking the lease over is an UPDATE of that row, which skips it while
such a lock is held, so a successor takes over only between two of the old leader's
transactions, and every transaction the old leader starts after that finds the token
changed and does nothing (`NotLeader`: the part stops, and the host is a follower again).
A leader frozen inside one of its transactions cannot hold the row for long either: the
fence sets ``idle_in_transaction_session_timeout`` for it, and the server ends the session.
The vacuum keeper's VACUUM itself runs outside a transaction (VACUUM cannot run in one):
it is decided in a fenced one, and two VACUUMs of the table never run at once anyway
(each takes a lock that conflicts with the other's; the keeper's skips the table then).
A ``--burst`` host's own reaper pass when it finds nothing to claim is not elected: like
every reaper pass it takes only rows it can lock (SKIP LOCKED), so it never handles a row
the leader's pass handles.

The periodic schedules' part is not elected: each tick is enqueued exactly once by a
compare-and-set in the database whichever hosts run it, and each host declares the
schedules its own code defines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...logs import event
from ...sql import fleet as sql
from ..lease import Lease
from ..tasks import stop_tasks
from .loop import Loop, LoopPart, Part

log = logging.getLogger("pgpool.leader")

#: The elected role of the fleet's maintenance (the row of ``pgpool_leader``).
MAINTENANCE: Final = "maintenance"
#: The share of a lease added at random to a follower's wait, so that a thousand followers
#: that read the same expiry do not all try at the same instant.
JITTER: Final = 0.05
#: Seconds before a leader tries to renew again when its own fenced work held the row.
BUSY_RETRY: Final = 0.2


class NotLeader(Exception):
    """This host's term is over: the lease moved to another host, or lapsed."""


class Leadership(LoopPart):
    """This host's side of the election of ``role``: it tries for the lease when it may be
    free, renews it every third of a lease while it holds it, and says whether it leads
    (`term`: the token of its current term, or None)."""

    name = "leader election"

    def __init__(self, pool: AsyncConnectionPool, owner: str, lease: Lease, *,
                 role: str = MAINTENANCE) -> None:
        self._pool = pool
        self.owner = owner
        self.lease = lease
        self.role = role
        #: The token of this host's current term; None when it does not lead.
        self.term: int | None = None
        #: Set while this host leads; `_ended` is set when that term ends.
        self.leading = asyncio.Event()
        self._ended = asyncio.Event()
        #: When (``time.monotonic()``) the lease held runs out at the latest: counted from
        #: the moment the renewal was sent, no later than the server's ``now()``.
        self._until = 0.0
        #: Terms this host has begun since it started.
        self.terms = 0
        #: Set by `resign`: this host is stopping and takes no further term.
        self._resigned = False
        self._loop = Loop(log, "leader election", interval=lease.beat_interval,
                          retry=lambda _failures: self._after_failure())

    async def step(self) -> float:
        if self._resigned:
            return self.lease.seconds
        sent = time.monotonic()
        params = {"role": self.role, "owner": self.owner, "lease": self.lease.seconds}
        async with self._pool.connection() as conn:
            row = await (await conn.execute(sql.LEADER_ACQUIRE, params)).fetchone()
            if row is None:
                await conn.execute(sql.LEADER_SEED, {"role": self.role})
                return 0.0
        won, holder, token, left = row
        if won is not None:
            self._until = sent + self.lease.seconds
            if won != self.term:
                self._begin(won)
            return self.lease.beat_interval
        if holder == self.owner and token == self.term and left > 0:
            # Still ours: this host's own fenced work held the row. Try again shortly.
            self._until = min(self._until, sent + left)
            return min(BUSY_RETRY, left / 3)
        self.end("the lease is another host's" if holder else "the lease lapsed")
        # Look again when the lease read runs out (a renewal will have moved it on).
        return max(0.0, left) + random.uniform(0, JITTER * self.lease.seconds)

    def _after_failure(self) -> float:
        """The database did not answer: a leader stops leading once its lease may have
        run out (its work is fenced anyway); retry within a second."""
        if self.term is not None and time.monotonic() >= self._until:
            self.end("its lease ran out while the database did not answer")
        return min(1.0, self.lease.beat_interval)

    def _begin(self, token: int) -> None:
        if self.term is not None:
            self.end("a new term began")
        self.term = token
        self.terms += 1
        self._ended = asyncio.Event()
        self.leading.set()
        event(log, logging.INFO, "leader_elected",
              "this host leads the fleet's maintenance (term %d)", token, role=self.role,
              term=token)

    def end(self, why: str) -> None:
        """End this host's term, if it leads: its elected parts stop."""
        if self.term is None:
            return
        event(log, logging.INFO, "leader_deposed",
              "this host no longer leads the fleet's maintenance (term %d): %s", self.term,
              why, role=self.role, term=self.term, reason=why)
        self.term = None
        self.leading.clear()
        self._ended.set()

    async def ended(self) -> None:
        """Return when the current term ends."""
        await self._ended.wait()

    async def resign(self) -> None:
        """On a clean exit: give the lease up, so that another host takes over now. Never
        raises for database trouble: the lease then runs out by itself."""
        self._resigned = True
        token = self.term
        self.end("this host is stopping")
        if token is None:
            return
        try:
            async with asyncio.timeout(self.lease.statement_timeout), \
                    self._pool.connection() as conn:
                await conn.execute(sql.LEADER_RESIGN, {"role": self.role, "owner": self.owner,
                                                       "token": token})
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("could not resign the fleet's maintenance (%s); another host takes "
                        "over when the lease runs out", type(exc).__name__)


class Fenced:
    """The connections of the elected parts: each in a transaction that first checks, and
    holds, this host's term (`sql.LEADER_FENCE`); `NotLeader` when it has none."""

    def __init__(self, pool: AsyncConnectionPool, leadership: Leadership) -> None:
        self._pool = pool
        self._leadership = leadership
        lease = leadership.lease
        self._idle = f"{round(lease.statement_timeout * 1000)}ms"

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        leadership = self._leadership
        token = leadership.term
        if token is None:
            raise NotLeader
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(sql.LEADER_FENCE, {
                "role": leadership.role, "owner": leadership.owner, "token": token,
                "idle": self._idle})
            if await cur.fetchone() is None:
                raise NotLeader
            yield conn


class Elected:
    """Runs ``part`` while this host leads (`Leadership`), and stops it when the term
    ends: when the election says so, or when one of its fenced transactions found the
    lease gone (`NotLeader`)."""

    def __init__(self, part: LoopPart, leadership: Leadership) -> None:
        self.part = part
        self.name = part.name
        self._leadership = leadership

    def wake(self) -> None:
        self.part.wake()

    async def run(self) -> None:
        leadership = self._leadership
        while True:
            await leadership.leading.wait()
            term = leadership.term
            work = asyncio.create_task(self.part.run(), name=f"pgpool {self.name} (elected)")
            ended = asyncio.create_task(leadership.ended())
            try:
                await asyncio.wait({work, ended}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await stop_tasks(work, ended)
            if work.cancelled():
                continue  # the term ended
            exc = work.exception()
            if exc is None:
                return  # the part ended: the dispatcher stops the host
            if isinstance(exc, NotLeader):
                if leadership.term == term:
                    leadership.end(f"the {self.name} found the lease taken over")
                continue
            raise exc  # a bug in the part: the dispatcher stops the host


def elect(parts: list[LoopPart], leadership: Leadership) -> list[Part]:
    """Each of ``parts``, run only while this host leads."""
    return [Elected(part, leadership) for part in parts]
