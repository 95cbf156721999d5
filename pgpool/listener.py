"""LISTEN/NOTIFY wake-ups, on a dedicated connection that reconnects by itself.

Notifications are only a latency optimisation: they are not durable, and any sent while
this connection is down are lost. So after every (re)connect the listener wakes the claimer
once, and the claimer also polls as a backstop.

The channel is the installation's (`sql.CHANNEL`): enqueues into pgpool's tables in another
schema of the same database never wake this one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from .outage import Failures, backoff
from .sql import common as sql

log = logging.getLogger("pgpool.listener")


class Listener:
    def __init__(self, dsn: str, queues: tuple[str, ...], wake: Callable[[], None],
                 on_control: Callable[[], None], on_stage: Callable[[], None]) -> None:
        """``wake`` on work in one of ``queues``; ``on_control`` on an operator's change
        (`sql.CONTROL`); ``on_stage`` on a newly scheduled job (`sql.STAGE`); all three
        after every (re)connect, since any sent meanwhile were lost."""
        self._dsn = dsn
        self._queues = frozenset(queues)
        self._wake = wake
        self._on_control = on_control
        self._on_stage = on_stage

    async def run(self) -> None:
        failures = Failures(log, "listener connection")
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True
                ) as conn:
                    row = await (await conn.execute(sql.CHANNEL)).fetchone()
                    await conn.execute(listen_statement(row[0]))
                    failures.succeeded()
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
            except (psycopg.Error, OSError) as exc:
                failures.failed(exc)
                await asyncio.sleep(backoff(failures.count, 0.2, 10.0))


def listen_statement(channel: str) -> str:
    """``LISTEN`` on ``channel`` (as `sql.CHANNEL` returns it), quoted as an identifier: a
    schema name may hold any character."""
    return sql.LISTEN.format('"' + channel.replace('"', '""') + '"')
