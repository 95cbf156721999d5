"""LISTEN/NOTIFY wake-ups, on a dedicated connection that reconnects by itself.

Notifications are not durable: any sent while this connection is down are lost. So after
every (re)connect the listener wakes the claimer once, and the claimer also polls as a
backstop: every poll interval while this connection is down, and only every idle poll
interval while it is up (`listening`) and the queue is empty, since every way a job
becomes ready sends a notification (`pgpool.host.scheduler`). The connection sends TCP
keepalives, so that one the network dropped silently is noticed (and reopened) within
`KEEPALIVE` seconds rather than the kernel's two hours.

The channel is the installation's (`sql.CHANNEL`): enqueues into pgpool's tables in another
schema of the same database never wake this one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import psycopg

from ...db.outage import backoff
from ...sql import common as sql
from .loop import Loop, LoopPart

log = logging.getLogger("pgpool.listener")

#: TCP keepalives (libpq's parameters): the first probe after 10 s of silence, then every
#: 5 s, and the connection is given up after 3 unanswered ones.
_KEEPALIVES: Final = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                      "keepalives_count": 3}
#: Seconds after which a connection the network dropped silently is given up.
KEEPALIVE: Final = 10 + 5 * 3


class Listener(LoopPart):
    """Relays the installation's notifications, reconnecting with a backoff when its
    connection fails (`wake` ends that wait)."""

    name = "listener"

    def __init__(self, dsn: str, queues: tuple[str, ...], wake: Callable[[], None],
                 on_control: Callable[[], None], on_stage: Callable[[], None],
                 on_leader: Callable[[], None], on_settled: Callable[[str], None],
                 on_wanted: Callable[[str], None]) -> None:
        """``wake`` on work in one of ``queues``; ``on_control`` on an operator's change
        (`sql.CONTROL`); ``on_stage`` on a newly scheduled job (`sql.STAGE`);
        ``on_leader`` when the fleet's leader resigned (`sql.LEADER`); the first three
        after every (re)connect, since any sent meanwhile were lost. ``on_settled`` and
        ``on_wanted`` with a group's signature when a host says it settled a notification
        (`sql.SETTLED`) or that its group is wanted (`sql.WANTED`,
        `pgpool.host.settle`)."""
        self._dsn = dsn
        self._queues = frozenset(queues)
        self._wake = wake
        self._on_control = on_control
        self._on_stage = on_stage
        self._on_leader = on_leader
        self._on_settled = on_settled
        self._on_wanted = on_wanted
        #: Whether the connection is up and listening: no notification is lost meanwhile.
        self.listening = False
        # A connection that ends without an error is opened again at once.
        self._loop = Loop(log, "listener connection", interval=0.0,
                          retry=lambda failures: backoff(failures, 0.2, 10.0))

    async def step(self) -> None:
        """Connect, LISTEN, and relay notifications for as long as the connection lasts."""
        async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True,
                                                         **_KEEPALIVES) as conn:
            row = await (await conn.execute(sql.CHANNEL)).fetchone()
            await conn.execute(sql.listen_statement(row[0]))
            self._loop.working()
            self.listening = True
            try:
                self._wake()
                self._on_control()
                self._on_stage()
                async for notify in conn.notifies():
                    if notify.payload in self._queues:
                        self._wake()
                    elif notify.payload == sql.CONTROL:
                        self._on_control()
                    elif notify.payload == sql.STAGE:
                        self._on_stage()
                    elif notify.payload.startswith(sql.SETTLED):
                        self._on_settled(notify.payload[len(sql.SETTLED):])
                    elif notify.payload.startswith(sql.WANTED):
                        self._on_wanted(notify.payload[len(sql.WANTED):])
                    elif notify.payload == sql.LEADER:
                        self._on_leader()
            finally:
                self.listening = False

