"""The maintenance leader's election and fence on a real PostgreSQL (pgpool.host.parts.leader):
one holder at a time, a takeover only once the lease has expired and only between two of
the old leader's fenced transactions, and a deposed leader's work refused by the database.

Hosts here are `Leadership` objects stepped by hand, each on its own pool, so that a test
chooses who renews and who is frozen; tests/host/test_leader.py does the same with real
processes, killed and stopped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import psycopg
import pytest
from dbtools import with_pools
from psycopg_pool import AsyncConnectionPool

from pgpool.host.claimer import configure_connection
from pgpool.host.lease import Lease
from pgpool.host.parts.leader import Elected, Fenced, Leadership, NotLeader
from pgpool.host.parts.loop import Loop, LoopPart

LEASE = Lease(1.5)


#: How a host sets up its connections (its timeouts).
HOST_CONNECTION = functools.partial(configure_connection, lease=LEASE)

def leader_row(db: psycopg.Connection) -> tuple[Any, ...]:
    return db.execute("SELECT holder, token FROM pgpool_leader WHERE role = 'maintenance'"
                      ).fetchone()


def test_one_host_leads_and_renews_and_the_others_wait_for_its_lease(db, dsn):
    async def work(pools: list[AsyncConnectionPool]) -> list[Any]:
        a, b = (Leadership(p, owner, LEASE) for p, owner in zip(pools, "ab", strict=True))
        first = await a.step()
        assert a.term == 1 and a.leading.is_set() and first == LEASE.beat_interval
        wait = await b.step()
        assert b.term is None and not b.leading.is_set()
        # The follower looks again when the lease it read runs out, not before.
        assert LEASE.seconds * 0.9 < wait <= LEASE.seconds * 1.06
        renewed = await a.step()
        assert a.term == 1 and renewed == LEASE.beat_interval  # same term, renewed
        return [leader_row(db), await b.step() > LEASE.seconds * 0.9, b.term]

    row, waits_again, b_term = with_pools(dsn, 2, HOST_CONNECTION, work)
    assert row == ("a", 1)
    assert waits_again and b_term is None


def test_an_expired_lease_goes_to_the_next_host_with_a_new_token_and_fences_the_old(db, dsn):
    async def work(pools: list[AsyncConnectionPool]) -> None:
        a, b = (Leadership(p, owner, LEASE) for p, owner in zip(pools, "ab", strict=True))
        await a.step()
        fenced_a = Fenced(pools[0], a)
        async with fenced_a.connection() as conn:  # the leader's work passes its fence
            await conn.execute("SELECT 1")
        # a is frozen: it does not renew. b takes over once the lease has expired.
        wait = await b.step()
        await asyncio.sleep(wait)
        await b.step()
        assert b.term == 2 and leader_row(db) == ("b", 2)
        # a still believes it leads (it was frozen), but the database refuses its work.
        assert a.term == 1
        with pytest.raises(NotLeader):
            async with fenced_a.connection() as conn:
                await conn.execute("DELETE FROM pgpool_hosts")
        # a's next election step finds b's lease and ends its term.
        await a.step()
        assert a.term is None and not a.leading.is_set()

    with_pools(dsn, 2, HOST_CONNECTION, work)


def test_no_takeover_during_a_fenced_transaction_and_a_frozen_one_is_ended(db, dsn):
    """A successor cannot take the lease while the old leader's fenced transaction is open,
    even past the lease; a leader frozen inside one is cut off by the server
    (idle_in_transaction_session_timeout), and only then does the successor take over."""
    async def work(pools: list[AsyncConnectionPool]) -> float:
        a, b = (Leadership(p, owner, LEASE) for p, owner in zip(pools, "ab", strict=True))
        await a.step()
        async with pools[0].connection() as raw:
            # a's fenced transaction, opened by hand so that it can freeze inside it.
            await raw.execute("BEGIN")
            # Read before the statement is sent: the server starts its idle timer only after
            # the statement ends, so this clock can never be ahead of the server's.
            frozen_at = time.monotonic()
            await raw.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', '4s', true) "
                "FROM pgpool_leader WHERE role = 'maintenance' AND holder = 'a' AND token = 1 "
                "AND expires_at > now() FOR SHARE")
            await asyncio.sleep(LEASE.seconds + 0.2)  # past the lease, inside the transaction
            assert await b.step() >= 0 and b.term is None  # the row is locked: skipped
            assert leader_row(db) == ("a", 1)
            # The server ends a's session at its idle timeout; b then takes the lease.
            while b.term is None:
                await asyncio.sleep(0.05)
                await b.step()
            took = time.monotonic() - frozen_at
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                await raw.execute("SELECT 1")
        return took

    took = with_pools(dsn, 2, HOST_CONNECTION, work)
    assert leader_row(db) == ("b", 2)
    assert took >= 4  # not before the frozen transaction was ended


def test_a_clean_exit_resigns_and_notifies_so_another_host_takes_over_at_once(db, dsn):
    ears = psycopg.connect(dsn, autocommit=True)
    channel = ears.execute("SELECT pgpool_channel()").fetchone()[0]
    ears.execute(f'LISTEN "{channel}"')

    async def work(pools: list[AsyncConnectionPool]) -> None:
        a, b = (Leadership(p, owner, LEASE) for p, owner in zip(pools, "ab", strict=True))
        await a.step()
        await b.step()
        await a.resign()
        assert a.term is None
        await b.step()  # at once, not at the lease's end
        assert b.term == 2

    with_pools(dsn, 2, HOST_CONNECTION, work)
    assert [n.payload for n in ears.notifies(timeout=5, stop_after=1)] == ["!leader"]
    assert leader_row(db) == ("b", 2)


class Counting(LoopPart):
    """A part that counts its steps, each in a fenced transaction."""

    name = "counting"

    def __init__(self, fenced: Fenced) -> None:
        self._fenced = fenced
        self.steps = 0
        self._loop = Loop(logging.getLogger("test"), "counting", interval=0.01)

    async def step(self) -> None:
        async with self._fenced.connection() as conn:
            await conn.execute("SELECT 1")
        self.steps += 1


def test_an_elected_part_runs_only_during_a_term_and_stops_when_it_is_fenced_off(db, dsn):
    async def work(pools: list[AsyncConnectionPool]) -> None:
        a, b = (Leadership(p, owner, LEASE) for p, owner in zip(pools, "ab", strict=True))
        part = Counting(Fenced(pools[0], a))
        runner = asyncio.create_task(Elected(part, a).run())
        await asyncio.sleep(0.2)
        assert part.steps == 0  # not leading: the part does not run
        await a.step()
        while part.steps < 3:
            await asyncio.sleep(0.01)
        # Taken over behind a's back (a frozen, its lease expired): the part's next fenced
        # transaction fails, the term ends and the part stops.
        db.execute("UPDATE pgpool_leader SET expires_at = now() - interval '1 second'")
        await b.step()
        while a.term is not None:
            await asyncio.sleep(0.01)
        steps = part.steps
        await asyncio.sleep(0.2)
        assert part.steps == steps and not runner.done()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    with_pools(dsn, 2, HOST_CONNECTION, work)


class SlowToStop(LoopPart):
    """A part whose step, cancelled, takes a moment to end, as psycopg does when it cancels
    its query in flight on the server (and drops the connection, with a warning, if it is
    cancelled again meanwhile)."""

    name = "slow to stop"

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.stopping = asyncio.Event()
        self.ended_cleanly: bool | None = None
        self._loop = Loop(logging.getLogger("test"), "slow to stop", interval=0.01)

    async def step(self) -> None:
        self.running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.stopping.set()
            try:
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                self.ended_cleanly = False
                raise
            self.ended_cleanly = True
            raise


def test_a_host_stopping_as_its_term_ends_cancels_the_elected_part_once(db, dsn):
    """A clean exit resigns (the term ends, the part is cancelled) and then cancels every
    part: the elected part, still stopping, must not be cancelled a second time."""
    async def work(pools: list[AsyncConnectionPool]) -> bool | None:
        a = Leadership(pools[0], "a", LEASE)
        part = SlowToStop()
        runner = asyncio.create_task(Elected(part, a).run())
        await a.step()
        await part.running.wait()
        a.end("this host is stopping")
        await part.stopping.wait()  # the part is cancelled and still stopping
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        assert runner.cancelled()
        return part.ended_cleanly

    assert with_pools(dsn, 1, HOST_CONNECTION, work) is True
