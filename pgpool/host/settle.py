"""Settling a notification in an idle fleet: a few hosts answer it at once, the rest stand by.

Every host hears every notification of its queues (`pgpool.host.parts.listener`). In an
idle fleet each one used to send a claim for every job enqueued, and all but one came back
empty: about 220 transactions per job at 100 hosts, 2,200 at 1,000. Now::

  enqueue commits ─▶ NOTIFY <queue> ─▶ each host: scheduler.notified()
     a host that holds jobs ─▶ claims at once, as before
     an idle host, by its tier (`Settler.tier`: its rank among the idle hosts of its group,
     `pgpool.host.parts.hosts`, over `RESPONDERS`):
       tier 0 ─▶ claims at once, and on while its claims come back full;
                 the first one back short (it took all it saw, maybe nothing), unless
                 another host's "!settled" came while it claimed:
                   NOTIFY "!settled <signature>" (`Settler.announce`), committed, then
                   one more claim, a sweep (behind the cursors too);
                 one back full (of more than one job, or a second in a row), or that
                 sweep back full (a backlog):
                   NOTIFY "!wanted <signature>" (`Settler.call_all`)
       tier t ─▶ stands by for t * `settle_wait`, then claims, unless "!settled <its
                 signature>" came first (`ClaimScheduler.settled`: nothing left to do),
                 or at once on "!wanted <its signature>" (`ClaimScheduler.wanted`)
     a host whose every worker is busy with jobs that are not short ─▶ stands by in the
     last tier (`Settler.last_tier`): a job it claimed would wait behind a running one

Why it loses no job: notifications reach every listener in commit order. A job committed
before the announcement was notified before it, and the announcer's next claim, which
begins after the announcement committed, sees that job: it takes it (or, full, calls
the group back). A job committed after the announcement is notified after it, and
the tiers start again. (So a host that hears another's announcement while it claims
need not announce: nobody stands by on what came before that one.) A tier-0 host that
died or froze costs a pickup one `settle_wait`, not the job: the next tier answers then,
and its own announcement settles the rest.

A burst wants every host: a first-tier claim that comes back full calls the group at
once, rather than the tiers coming in one by one; for a claim of one job, the second
full one in a row does (one full claim of one may be a lone job).

A group is the hosts that would claim the same jobs: the same queues, kinds, tenant cap
and fairness (`signature`). Hosts of other groups ignore its announcements; each group
settles its own. An idle host is one that holds no job; a host's poll (`--idle-poll`)
announces nothing, so an idle fleet's backstop polls cost what they did.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Final

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..sql import common
from ..sql import jobs as sql

log = logging.getLogger("pgpool.settle")

#: Idle hosts of a group that answer a notification at once (tier 0): two, so that one
#: slow host does not delay a pickup by a `settle_wait`.
RESPONDERS: Final = 2
#: The least a tier stands by, seconds: long enough for the tier before to claim and
#: announce on a loaded machine (`settle_wait` stretches it with the claims' round trip).
SETTLE_WAIT: Final = 0.05
#: Round trips of a claim a tier stands by at least.
SETTLE_RTTS: Final = 4
#: The longest a claim loop waits for a connection to notify its group, seconds: past it,
#: it gives up (the hosts standing by claim at their turn) rather than stall its claims.
SEND_TIMEOUT: Final = 2.0


def signature(queues: Sequence[str], kinds: Sequence[str], tenant_cap: int | None,
              fair_by: str) -> str:
    """What names a host's group in its announcements: a digest of what its claims take."""
    text = "\x1f".join([",".join(queues), ",".join(sorted(kinds)), str(tenant_cap), fair_by])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def settle_wait(rtt: float) -> float:
    """How long each tier stands by, for a claim round trip of ``rtt`` seconds."""
    return max(SETTLE_WAIT, SETTLE_RTTS * rtt)


class Settler:
    """What a host's scheduler needs to settle notifications with its group: its `tier`,
    and the two notifications it sends (`announce`, `call_all`), which only matter while
    some host of the group stands by (`standbys`). ``rank()`` is the number of idle hosts of
    its group ahead of it, ``peers()`` the number of them in all
    (`pgpool.host.parts.hosts.HostRegistry`)."""

    def __init__(self, pool: AsyncConnectionPool, *, queues: Sequence[str],
                 kinds: Sequence[str], tenant_cap: int | None, fair_by: str,
                 rank: Callable[[], int], peers: Callable[[], int]) -> None:
        self._pool = pool
        self._rank = rank
        self._peers = peers
        self.signature = signature(queues, kinds, tenant_cap, fair_by)
        self._settled = common.SETTLED + self.signature
        self._wanted = common.WANTED + self.signature

    @property
    def tier(self) -> int:
        """0: answer a notification at once; t: stand by t * `settle_wait` first."""
        return self._rank() // RESPONDERS

    @property
    def last_tier(self) -> int:
        """The tier after every idle host's: where a host whose workers are all taken
        stands by, so that a host with a free worker gets the job first."""
        return self._peers() // RESPONDERS + 1

    @property
    def standbys(self) -> bool:
        """Whether the group has more idle hosts than its first tier: a lone host, or a pair,
        announces nothing (nobody would hear it)."""
        return self._peers() + 1 > RESPONDERS

    async def announce(self) -> bool:
        """Tell the group that this host took what it saw (committed once this returns);
        False if it could not: the hosts standing by then claim at their turn."""
        return await self._send(self._settled)

    async def call_all(self) -> None:
        """Tell the group's idle hosts to claim at once: more jobs wait than this host takes."""
        await self._send(self._wanted)

    async def _send(self, payload: str) -> bool:
        try:
            async with self._pool.connection(timeout=SEND_TIMEOUT) as conn:
                await conn.execute(sql.NOTIFY_MANY, {"payloads": [payload]})
        except (psycopg.Error, OSError) as exc:
            log.debug("could not notify the group (%s)", type(exc).__name__)
            return False
        return True
