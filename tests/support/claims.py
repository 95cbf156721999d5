"""The dispatcher's claim, ack and reap statements driven in this process, on a small pool
set up as a dispatcher's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgpool.host.claimer import Claimer, configure_connection
from pgpool.host.lease import Lease
from pgpool.registry import Handler


def in_registry(dsn: str, work: Callable[[AsyncConnectionPool], Awaitable[Any]]) -> Any:
    """Run ``work(pool)`` on a small async pool like the dispatcher's (autocommit)."""
    async def main() -> Any:
        async with AsyncConnectionPool(dsn, min_size=2, max_size=2,
                                       kwargs={"autocommit": True}) as pool:
            return await work(pool)

    return asyncio.run(main())


@asynccontextmanager
async def record_claimer(dsn: str, lease: Any, owner: str
                         ) -> AsyncIterator[tuple[AsyncConnectionPool, Any]]:
    """A small pool set up as a dispatcher's (`configure_connection`, ``lease``'s timeouts)
    and a `Claimer` of ``record`` jobs on it, as host ``owner``."""
    async with AsyncConnectionPool(
            dsn, min_size=2, max_size=2, kwargs={"autocommit": True},
            configure=lambda conn: configure_connection(conn, lease)) as pool:
        yield pool, Claimer(pool, owner, queues=("default",),
                            handlers={"record": Handler("record", print, None, None)},
                            lease=lease, max_attempts=20, timeout=None)


def reaper_passes(db: psycopg.Connection, dsn: str, lease: Any, jobs: int, passes: int,
                  hold: int | None = None) -> list[tuple[tuple[int, int], str]]:
    """Claim ``jobs`` ready ``record`` jobs as a host that then died (owner gone:1:aa), let
    every lease run out on a started attempt, and run a real `Reaper` ``passes`` times: what
    each pass reaped (revived, buried) and the state of the row left after it. With ``hold``,
    another connection holds that job FOR KEY SHARE meanwhile, so deleting it waits on a
    lock."""
    from pgpool.host.parts.reaper import Reaper

    async def main() -> list[tuple[tuple[int, int], str]]:
        async with record_claimer(dsn, lease, "gone:1:aa") as (pool, claimer):
            assert len(await claimer.claim(jobs)) == jobs
            async with pool.connection() as conn:
                await conn.execute("UPDATE pgpool_jobs SET lease_until = now() - interval "
                                   "'1s', started = true")
            async with await psycopg.AsyncConnection.connect(dsn) as holder:
                if hold is not None:
                    await holder.execute("SELECT FROM pgpool_jobs WHERE id = %s FOR KEY SHARE",
                                         (hold,))
                reaper = Reaper(pool, interval=1)
                reaped = []
                for _ in range(passes):
                    done = await reaper.reap()
                    reaped.append((done, db.execute("SELECT state FROM pgpool_jobs")
                                   .fetchone()[0]))
                return reaped

    return asyncio.run(main())


def _handlers(*kinds: str, max_attempts: int | None = None) -> dict[str, Handler]:
    return {k: Handler(k, print, None, max_attempts) for k in kinds}


def run_with_pool(dsn: str, fn: Callable[[AsyncConnectionPool], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with AsyncConnectionPool(dsn, min_size=2, max_size=4, open=False,
                                       kwargs={"autocommit": True,
                                               "application_name": "pgpool-test-pool"},
                                       configure=configure_connection) as pool:
            return await fn(pool)

    return asyncio.run(main())


def claimer(pool: AsyncConnectionPool, owner: str = "host-a", *kinds: str,
            queues: tuple[str, ...] = ("default",), lease: float = 30,
            max_attempts: int = 20) -> Claimer:
    return Claimer(pool, owner, queues=queues, handlers=_handlers(*(kinds or ("k",))),
                   lease=Lease(lease), max_attempts=max_attempts, timeout=None)


async def handed_back_behind(c: Claimer, pool: AsyncConnectionPool) -> list[list[int]]:
    """Two claims of 2 on ``c`` (from the start, then a sweep whose round trip is measured:
    with `costly_sweeps`, sweeps "cost" from then on), and the first job taken handed back
    as a host hands one back (run_at kept): behind the cursor. What each claim took."""
    taken = [[j.id for j in await c.claim(2)]]
    c.sweep_next()
    taken.append([j.id for j in await c.claim(2)])
    async with pool.connection() as conn:
        await conn.execute("UPDATE pgpool_jobs SET state = 'ready', locked_by = NULL, "
                           "lease_until = NULL WHERE id = %s", (taken[0][0],))
    return taken
