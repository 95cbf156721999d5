"""The loop of the dispatcher's parts that run a pass at a fixed interval (the reaper,
dead-letter retention, the vacuum keeper). Not in `pgpool.retry`: workers import that
one, and must not pay for psycopg and asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import NoReturn

import psycopg

from .outage import Failures


async def every(interval: float, step: Callable[[], Awaitable[object]],
                failures: Failures) -> NoReturn:
    """Await ``step`` every ``interval`` seconds, until cancelled. A database or network
    error is one more of ``failures``, and the next step comes on time as usual: the parts
    that run this way (the reaper, dead-letter retention, the vacuum keeper) start over at
    every step."""
    while True:
        try:
            await step()
            failures.succeeded()
        except (psycopg.Error, OSError) as exc:
            failures.failed(exc)
        await asyncio.sleep(interval)
