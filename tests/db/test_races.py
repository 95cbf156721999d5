"""Races between the dispatcher's own statements, each replayed in a fixed interleaving.

Each test runs the real statements (through the real Claimer, Completer and Heartbeat) on
real connections, and makes the order of events certain by holding a lock in a third
transaction and waiting, with a deadline, until the server shows a statement waiting on it:
no sleeps, no timing margins. The server's deadlock detector (``deadlock_timeout``, 1 s) is
what ends a deadlock, so a test that finds one takes about a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from commands import RUN
from dbtools import listeners
from jsonlogs import events
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool
from records import read_records
from waits import wait_until

import pgpool
from pgpool.host.attempt import Job
from pgpool.host.claimer import Claimer, configure_connection
from pgpool.host.completer import Ack, Completer
from pgpool.host.lease import Lease
from pgpool.host.parts.heartbeat import Heartbeat
from pgpool.registry import Handler

#: Every wait on the server's state gives up after this long (a failure, never a pass).
DEADLINE = 30.0


def run_with_pool(dsn: str, fn: Callable[[AsyncConnectionPool], Awaitable[Any]],
                  lease: Lease | None = None) -> Any:
    """Run ``fn`` with a pool set up like the dispatcher's (with ``lease``: its timeouts)."""
    async def configure(conn: psycopg.AsyncConnection) -> None:
        await configure_connection(conn, lease)

    async def main() -> Any:
        async with AsyncConnectionPool(dsn, min_size=4, max_size=4, open=False,
                                       kwargs={"autocommit": True},
                                       configure=configure) as pool:
            return await fn(pool)

    return asyncio.run(main())


def claimer(pool: AsyncConnectionPool, owner: str = "host-a", kind: str = "k") -> Claimer:
    return Claimer(pool, owner, queues=("default",),
                   handlers={kind: Handler(kind, print, None, None)},
                   lease=Lease(30), max_attempts=20, timeout=None)


def rows(db: psycopg.Connection, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return db.execute(query, params).fetchall()


async def waiting_on_lock(db: psycopg.AsyncConnection, like: str) -> int:
    """How many backends of this database whose query contains ``like`` (any query: "")
    wait for a lock."""
    cur = await db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database() AND pid <> pg_backend_pid()"
        " AND strpos(query, %s) > 0", (like,))
    return (await cur.fetchone())[0]


async def until_waiting(db: psycopg.AsyncConnection, like: str,
                        task: asyncio.Task[Any] | None = None, count: int = 1) -> bool:
    """Wait until ``count`` statements containing ``like`` wait for a lock (True), or
    ``task`` ended without that (False). Fails the test after `DEADLINE`."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if await waiting_on_lock(db, like) >= count:
            return True
        if task is not None and task.done():
            return False
        await asyncio.sleep(0.01)
    pytest.fail(f"{count} statements like {like!r} did not wait for a lock in {DEADLINE}s")


async def outcome(task: asyncio.Task[Any]) -> Any:
    """``task``'s result, or the exception it raised (returned, not raised)."""
    try:
        async with asyncio.timeout(DEADLINE):
            return await task
    except Exception as exc:  # the test asserts on what it was
        return exc


# --- the release arm must not repeat (owner, attempt) -------------------------------------


def test_a_retried_hand_back_never_touches_the_claim_that_followed_it(db, dsn):
    # A hand-back commits but its answer is lost (the connection drops after the commit);
    # the completer keeps the ack and retries it after its backoff. Meanwhile the same host
    # claims the job again. The retried hand-back is the very same statement: it must find
    # no attempt of its own to hand back, and leave the new claim running.
    pgpool.enqueue(db, "k", {})

    async def scenario(pool: AsyncConnectionPool) -> tuple[Job, Any, Job, Any]:
        take = claimer(pool)
        (first,) = await take.claim(1)
        acks = Completer(pool, "host-a")
        handed = await acks.flush([Ack.release(first)])  # committed; its answer "lost"
        (second,) = await take.claim(1)  # claimed again within the retry's backoff
        retried = await acks.flush([Ack.release(first)])  # the flush, retried
        return first, handed, second, retried

    first, handed, second, retried = run_with_pool(dsn, scenario)
    assert handed.released == 1
    assert (second.id, second.counted) == (first.id, 1)  # the hand-back cost no attempt
    assert second.attempt != first.attempt, "the new claim repeats the old (owner, attempt)"
    assert (retried.released, retried.stale) == (0, 1)
    assert rows(db, "SELECT state, locked_by, attempts FROM pgpool_jobs") == [
        ("running", "host-a", second.attempt)]


# --- a host's heartbeat and its own ack flush ---------------------------------------------


def test_a_heartbeat_and_the_ack_flush_it_covers_neither_deadlock_nor_lose_a_job(db, dsn):
    # The host acks job X (done) and job Y (dead, in the same flush); the heartbeat covers
    # both while the flush runs (their acks are not committed yet). The flush locks X (its
    # "done" arm comes first) and then Y; the heartbeat sends the jobs in the order their
    # acks were queued, Y then X. An application transaction holding FOR KEY SHARE on Y (as
    # an INSERT of a row referencing it does) holds the flush between its two rows, and lets
    # the heartbeat (whose lock on Y does not conflict with KEY SHARE) take Y first.
    y_id = pgpool.enqueue(db, "k", {})  # first in every plan's order: id, heap, array
    x_id = pgpool.enqueue(db, "k", {})

    async def scenario(pool: AsyncConnectionPool) -> tuple[Any, Any, Heartbeat, float]:
        jobs = {j.id: j for j in await claimer(pool).claim(2)}
        x, y = jobs[x_id], jobs[y_id]
        acks = Completer(pool, "host-a", max_batch=2, interval=0)
        beat = Heartbeat(pool, "host-a", Lease(30), acks.pending_jobs, lambda: None,
                         lambda: None, acking=acks.pending_jobs)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch, \
                await psycopg.AsyncConnection.connect(dsn) as app:
            await app.execute("SELECT FROM pgpool_jobs WHERE id = %s FOR KEY SHARE", (y_id,))
            acks.add(Ack.dead(y, "gave up"))
            acks.add(Ack.done(x))
            flushing = asyncio.create_task(acks.run())
            assert await until_waiting(watch, "WITH done AS")  # holds X, waits for Y
            started = time.monotonic()
            beating = asyncio.create_task(beat.beat())
            await until_waiting(watch, "SET lease_until", beating)  # today: holds Y, waits
            await app.commit()
            lost = await outcome(beating)
            async with asyncio.timeout(DEADLINE):
                await acks.wait_idle()
            took = time.monotonic() - started
            flushing.cancel()
        return lost, acks.stats, beat, took

    lost, stats, beat, took = run_with_pool(dsn, scenario)
    print(f"heartbeat: {lost!r}; flushes {stats.flushes}; took {took:.2f}s")
    assert not isinstance(lost, BaseException), f"the heartbeat failed: {lost!r}"
    assert lost == set() and beat.lost == 0, "the heartbeat took the acked jobs for lost"
    assert stats.flushes == 1, "the flush had to be split or retried (a lock error)"
    assert rows(db, "SELECT id FROM pgpool_dead") == [(y_id,)]
    assert rows(db, "SELECT id FROM pgpool_jobs") == []


def test_a_heartbeat_answered_before_the_ack_it_raced_loses_nothing(db, dsn):
    # The ack of job X commits while a heartbeat that carries X (its ack was not committed
    # when the beat was sent) is in flight; both answers arrive together, and the
    # heartbeat's is handled first: X is still among the acks being written. The beat does
    # not find X, but X was not lost: no lease_lost, nothing counted.
    pgpool.enqueue(db, "k", {})

    async def scenario(pool: AsyncConnectionPool) -> tuple[set[Any], Heartbeat, Any]:
        (x,) = await claimer(pool).claim(1)
        written = await Completer(pool, "host-a").flush([Ack.done(x)])
        beat = Heartbeat(pool, "host-a", Lease(30), lambda: [x], lambda: None,
                         lambda: None, acking=lambda: [x])
        return await beat.beat(), beat, written

    lost, beat, written = run_with_pool(dsn, scenario)
    assert written.done == 1
    assert lost == set() and beat.lost == 0


# --- two claims racing for two concurrency keys -------------------------------------------


def test_claims_racing_for_two_concurrency_keys_end_without_an_error(db, dsn):
    # Claim 1 takes jobs of keys A, Z and B (in id order), claim 2 jobs of keys B and A.
    # Both see every key idle; the unique index pgpool_jobs_key_running decides. A third
    # transaction holding an uncommitted running job of key Z stops claim 1 between A and
    # B; claim 2 takes B and waits for claim 1's A; then Z is let go: claim 1 waits for
    # claim 2's B. A deadlock, not a unique violation: one claim is aborted.
    pgpool.enqueue(db, "gate", {}, concurrency_key="Z")
    for key in ("A", "Z", "B", "B", "A"):
        pgpool.enqueue(db, "k", {}, concurrency_key=key)

    async def scenario(pool: AsyncConnectionPool) -> tuple[Any, Any]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch, \
                await psycopg.AsyncConnection.connect(dsn) as gate:
            await gate.execute("UPDATE pgpool_jobs SET state = 'running', locked_by = 'gate',"
                               " attempts = 1 WHERE kind = 'gate'")
            # Only the claims ever wait here: any query will do.
            one = asyncio.create_task(claimer(pool, "host-a").claim(3))
            assert await until_waiting(watch, "", one)  # for Z
            two = asyncio.create_task(claimer(pool, "host-b").claim(2))
            assert await until_waiting(watch, "", two, count=2)  # claim 2 for A
            await gate.rollback()
            return await outcome(one), await outcome(two)

    one, two = run_with_pool(dsn, scenario)
    print(f"claim 1: {one!r}\nclaim 2: {two!r}")
    for got in (one, two):
        assert not isinstance(got, BaseException), f"a claim failed: {got!r}"
    running = rows(db, "SELECT concurrency_key, locked_by FROM pgpool_jobs"
                       " WHERE state = 'running' AND kind = 'k' ORDER BY concurrency_key")
    assert [key for key, _ in running] == ["A", "B", "Z"]  # every key taken, once
    assert sorted(j.id for j in one + two) == sorted(
        r[0] for r in rows(db, "SELECT id FROM pgpool_jobs WHERE state = 'running'"
                               " AND kind = 'k'"))


# --- a stricter default isolation ---------------------------------------------------------


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_claims_run_read_committed_whatever_the_database_default(fresh_dsn, level):
    # A claim that starts while another transaction (a claim of another host, say) holds
    # the table's lock and has taken a job: the claim's snapshot is taken before it waits
    # for the table, and the job it then finds taken was committed after that snapshot.
    # Read committed takes a new snapshot and claims the other job; repeatable read or
    # serializable fails the claim with a serialization error.
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        taken = pgpool.enqueue(conn, "k", {})
        free = pgpool.enqueue(conn, "k", {})
        dbname = conn.info.dbname
        conn.execute(f"ALTER DATABASE {dbname} SET default_transaction_isolation = '{level}'")

    async def scenario(pool: AsyncConnectionPool) -> tuple[str, Any]:
        async with pool.connection() as conn:
            shown = await (await conn.execute("SHOW transaction_isolation")).fetchone()
        async with await psycopg.AsyncConnection.connect(fresh_dsn, autocommit=True) \
                as watch, await psycopg.AsyncConnection.connect(fresh_dsn) as other:
            await other.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1,"
                                " locked_by = 'other', lease_until = now() + interval '1h'"
                                " WHERE id = %s", (taken,))
            await other.execute("LOCK TABLE pgpool_jobs IN SHARE MODE")
            claiming = asyncio.create_task(claimer(pool).claim(1))
            assert await until_waiting(watch, "", claiming)  # for the table
            await other.commit()
            return shown[0], await outcome(claiming)

    shown, got = run_with_pool(fresh_dsn, scenario, lease=Lease(30))
    print(f"isolation: {shown}; claim: {got!r}")
    assert not isinstance(got, BaseException), f"the claim failed: {got!r}"
    assert [j.id for j in got] == [free]
    assert shown == "read committed"


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_two_hosts_drain_a_serializable_database_without_serialization_errors(
        fresh_dsn, record_dir):
    # The same with real hosts: two of them (four claim loops) drain jobs from a database
    # whose default is serializable; their claims, heartbeats and acks contend all along.
    with psycopg.connect(fresh_dsn, autocommit=True) as db:
        pgpool.migrate(db)
        db.execute(f"ALTER DATABASE {db.info.dbname} "
                   "SET default_transaction_isolation = 'serializable'")
        hosts = [start_pgpool(fresh_dsn, *RUN, "--procs", "2", record_dir=record_dir)
                 for _ in range(2)]
        for host in hosts:
            host.event("started")
        wait_until(lambda: len(listeners(db)) == 2, "both LISTENs")
        pgpool.enqueue_many(db, "record", ({"n": i} for i in range(3000)))
        wait_until(lambda: db.execute("SELECT count(*) FROM pgpool_jobs").fetchone() == (0,),
                   "every job to be acked", 180, interval=0.2)
        for host in hosts:
            assert host.stop() == 0, host.stderr
        failing = [(e["what"], e["error"]) for h in hosts for e in events(h.stderr, "failing")]
        assert failing == []
        ended = [r[0] for r in read_records(record_dir) if r[3] == "end"]
        assert len(ended) == len(set(ended)) == 3000
        assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone() == (0,)
