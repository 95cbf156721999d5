"""Claiming batches of ready jobs: one statement, one transaction, SKIP LOCKED."""

from __future__ import annotations

import itertools
import time
from collections import deque

from psycopg.adapt import Loader
from psycopg_pool import AsyncConnectionPool

from . import sql
from .job import Job
from .registry import Handler

RTT_SAMPLES = 10_000
RECENT_RTTS = 15


class RawJsonLoader(Loader):
    """Load jsonb as its raw text bytes: the dispatcher never parses payloads."""

    def load(self, data: bytes | bytearray | memoryview) -> bytes:
        return bytes(data)


class Claimer:
    """Claims jobs of the given queues and of the kinds this host has handlers for."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        owner: str,
        *,
        queues: tuple[str, ...],
        handlers: dict[str, Handler],
        lease: float,
        max_attempts: int,
        timeout: float | None,
    ) -> None:
        self._pool = pool
        kinds = sorted(handlers)
        self._timeouts = {k: handlers[k].timeout or timeout for k in kinds}
        self.params: dict[str, object] = {
            "queues": list(queues),
            "kinds": kinds,
            "kind_max_attempts": [handlers[k].max_attempts or max_attempts for k in kinds],
            "owner": owner,
            "lease": lease,
            "limit": 0,
        }
        self.claims = 0
        self.claimed = 0
        #: The most recent round trips, seconds, for percentiles.
        self.rtts: deque[float] = deque(maxlen=RTT_SAMPLES)

    @property
    def rtt(self) -> float:
        """The typical claim round trip lately, seconds (0 before the first claim): the
        median of the last `RECENT_RTTS`, so a slow first claim (which also prepares the
        statement) or a stray hiccup does not skew the batch sized from it."""
        recent = sorted(itertools.islice(reversed(self.rtts), RECENT_RTTS))
        return recent[len(recent) // 2] if recent else 0.0

    async def claim(self, limit: int) -> list[Job]:
        started = time.monotonic()
        self.params["limit"] = limit
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.CLAIM, self.params)
            rows = await cur.fetchall()
        self.rtts.append(time.monotonic() - started)
        self.claims += 1
        self.claimed += len(rows)
        timeouts = self._timeouts
        return [
            Job(id_, kind, queue, attempt, max_attempts, payload, timeouts[kind])
            for id_, kind, queue, attempt, max_attempts, payload in rows
        ]
