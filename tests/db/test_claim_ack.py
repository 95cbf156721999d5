"""The dispatcher's SQL against a real PostgreSQL: claim, heartbeat, grouped acks, reaper.

These drive the dispatcher's own components (Claimer, Completer, Heartbeat, Reaper) on a
real connection pool, without worker processes, so each property is checked directly.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from claims import claimer, run_with_pool
from dbtools import explain_prepared
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.host.attempt import AttemptEnd, Job
from pgpool.host.claimer import configure_connection
from pgpool.host.completer import Ack, Completer, decide
from pgpool.host.lease import Lease
from pgpool.host.parts.heartbeat import Heartbeat
from pgpool.host.parts.reaper import Reaper
from pgpool.retry import FREE_INTERRUPTIONS, Retry
from pgpool.sql.jobs import SWEEP


def rows(db: psycopg.Connection, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return db.execute(query, params).fetchall()


def test_claim_skips_rows_locked_by_a_concurrent_transaction(db, dsn):
    ids = [pgpool.enqueue(db, "k", {"n": i}) for i in range(10)]
    with psycopg.connect(dsn) as locker:
        locked = [r[0] for r in locker.execute(
            "SELECT id FROM pgpool_jobs ORDER BY id LIMIT 3 FOR UPDATE").fetchall()]

        async def claim(pool: AsyncConnectionPool) -> list[int]:
            async with pool.connection() as conn:
                # Without SKIP LOCKED the claim would wait on the locker and hit this.
                await conn.execute("SET statement_timeout = '5s'")
            return [j.id for j in await claimer(pool).claim(10)]

        got = run_with_pool(dsn, claim)
        assert sorted(got) == sorted(set(ids) - set(locked))
        locker.rollback()
    later = run_with_pool(dsn, lambda pool: claimer(pool, "host-b").claim(10))
    assert sorted(j.id for j in later) == sorted(locked)


def test_claim_order_filters_and_ownership_columns(db, dsn):
    future = datetime.now(UTC) + timedelta(hours=1)
    low = pgpool.enqueue(db, "k", {}, priority=0)
    high = pgpool.enqueue(db, "k", {}, priority=5)
    pgpool.enqueue(db, "k", {}, run_at=future)  # not due
    pgpool.enqueue(db, "other-kind", {})  # no handler on this host
    pgpool.enqueue(db, "k", {}, queue="elsewhere")  # not our queue
    explicit = pgpool.enqueue(db, "k", {"x": "é"}, max_attempts=4)

    jobs = run_with_pool(dsn, lambda pool: claimer(pool, "host-a", "k", max_attempts=7).claim(10))
    assert [j.id for j in jobs] == [high, low, explicit]
    by_id = {j.id: j for j in jobs}
    assert by_id[low].max_attempts == 7  # the handler's limit fills in an open one
    assert by_id[explicit].max_attempts == 4  # the producer's wins
    assert by_id[explicit].payload == b'{"x": "\xc3\xa9"}'  # raw JSON text, unparsed
    state = rows(db, "SELECT state, attempts, locked_by, lease_until > now() FROM pgpool_jobs"
                     " WHERE id = %s", low)
    assert state == [("running", 1, "host-a", True)]
    left = rows(db, "SELECT state, count(*) FROM pgpool_jobs WHERE state <> 'running'"
                    " GROUP BY state ORDER BY state")
    assert left == [("ready", 2), ("scheduled", 1)]  # the job not due waits as scheduled


def test_claims_waiting_for_a_connection_each_send_their_own_limit(db, dsn):
    # Two claim loops share the pool: a claim that waits for a connection must not send
    # the limit of a claim made after it (they once shared one parameter dict).
    pgpool.enqueue_many(db, "k", [{}] * 20)

    async def scenario(_: AsyncConnectionPool) -> list[int]:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False,
                                       kwargs={"autocommit": True},
                                       configure=configure_connection) as one:
            taking = claimer(one)
            async with one.connection():  # both claims queue for the only connection
                small = asyncio.create_task(taking.claim(1))
                big = asyncio.create_task(taking.claim(5))
                await asyncio.sleep(0)  # one turn: both have started and wait for it
            return [len(await small), len(await big)]

    assert run_with_pool(dsn, scenario) == [1, 5]


def test_grouped_ack_is_one_statement_and_guarded_by_owner_and_attempt(db, dsn):
    for i in range(7):
        pgpool.enqueue(db, "k", {"n": i})

    async def scenario(pool: AsyncConnectionPool) -> list[Any]:
        jobs = await claimer(pool, "host-a").claim(7)
        mine = Completer(pool, "host-a")
        theirs = Completer(pool, "host-b")
        # Another host cannot ack, retry or bury jobs it does not own.
        stolen = await theirs.flush([Ack.done(jobs[0]), Ack.dead(jobs[1], "x")])
        result = await mine.flush([
            Ack.done(jobs[0]), Ack.done(jobs[1]),
            Ack.retry(jobs[2], 60, "boom"),
            Ack.release(jobs[3]),
            Ack.dead(jobs[4], "gave up"),
            Ack.interrupted(jobs[6], "shutdown grace period (1s) expired"),
        ])
        return [stolen, result, jobs]

    stolen, result, jobs = run_with_pool(dsn, scenario)
    assert (stolen.done, stolen.dead, stolen.stale) == (0, 0, 2)
    assert (result.done, result.retried, result.released, result.interrupted, result.dead,
            result.stale) == (2, 1, 1, 1, 1, 0)
    states = dict(rows(db, "SELECT id, state FROM pgpool_jobs"))
    # The retried job waits out its backoff as scheduled, out of the claim's index.
    assert states == {jobs[2].id: "scheduled", jobs[3].id: "ready", jobs[5].id: "running",
                      jobs[6].id: "ready"}
    retried = rows(db, "SELECT attempts, last_error, run_at > now() + interval '50 seconds',"
                       " locked_by FROM pgpool_jobs WHERE id = %s", jobs[2].id)
    assert retried == [(1, "boom", True, None)]
    # Handing back an unstarted job costs no attempt; the claim is kept (it is the
    # ownership token) but not counted.
    released = rows(db, "SELECT attempts, interruptions FROM pgpool_jobs WHERE id = %s",
                    jobs[3].id)
    assert released == [(1, 1)]
    # Cut off by a shutdown: ready now, the claim kept (it is the ownership token) but
    # not counted against max_attempts.
    interrupted = rows(db, "SELECT attempts, interruptions, run_at <= now(), last_error, "
                           "locked_by FROM pgpool_jobs WHERE id = %s", jobs[6].id)
    assert interrupted == [(1, 1, True, "shutdown grace period (1s) expired", None)]
    dead = rows(db, "SELECT id, attempts, last_error, payload FROM pgpool_dead")
    assert dead == [(jobs[4].id, 1, "gave up", {"n": 4})]


def test_a_reclaimed_attempt_cannot_be_acked_by_its_old_owner(db, dsn):
    pgpool.enqueue(db, "k", {})

    async def scenario(pool: AsyncConnectionPool) -> tuple[Any, Any, int]:
        (old,) = await claimer(pool, "host-a", lease=30).claim(1)
        async with pool.connection() as conn:  # host-a goes silent; its lease runs out
            await conn.execute("UPDATE pgpool_jobs SET lease_until = now() - interval '1s'")
        revived, _ = await Reaper(pool, 1).reap()
        (new,) = await claimer(pool, "host-a").claim(1)  # the same host claims it again
        late = await Completer(pool, "host-a").flush([Ack.done(old)])
        beat = await Heartbeat(pool, "host-a", Lease(30), lambda: [old], lambda: None,
                               lambda: None).beat()
        return late, beat, new.attempt, revived

    late, lost, attempt, revived = run_with_pool(dsn, scenario)
    assert revived == 1
    assert attempt == 2
    assert late.stale == 1  # attempt 1's ack is refused: attempt 2 owns the job now
    assert rows(db, "SELECT state, attempts FROM pgpool_jobs") == [("running", 2)]
    assert lost == {(rows(db, "SELECT id FROM pgpool_jobs")[0][0], 1)}


def test_losing_a_stale_attempt_spares_the_fresh_attempt_of_the_same_job(db, dsn):
    # Host-a still holds attempt 1 (its lease expired, its ack not written yet) when it
    # claims attempt 2 of the same job, while a heartbeat that carried only attempt 1 is in
    # flight. That heartbeat loses attempt 1; attempt 2, which it never asked about, must
    # stay held and running.
    pgpool.enqueue(db, "k", {})

    async def scenario(pool: AsyncConnectionPool) -> tuple[set[Any], Job, Job]:
        (old,) = await claimer(pool, "host-a", lease=30).claim(1)
        async with pool.connection() as conn:
            await conn.execute("UPDATE pgpool_jobs SET lease_until = now() - interval '1s'")
        await Reaper(pool, 1).reap()
        (new,) = await claimer(pool, "host-a").claim(1)
        held = iter([[old], [old, new]])  # as sent; once the answer is back
        beat = Heartbeat(pool, "host-a", Lease(30), lambda: next(held), lambda: None,
                         lambda: None)
        return await beat.beat(), old, new

    lost, old, new = run_with_pool(dsn, scenario)
    assert (old.id, old.attempt, new.attempt) == (new.id, 1, 2)
    assert old.lost and not new.lost
    assert lost == {(old.id, 1)}


def test_heartbeat_extends_every_held_lease_in_one_statement(db, dsn):
    for i in range(20):
        pgpool.enqueue(db, "k", {"n": i})
    extended = []

    async def scenario(pool: AsyncConnectionPool
                       ) -> tuple[set[int], list[float], float, float]:
        before = time.monotonic()
        jobs = await claimer(pool, "host-a", lease=5).claim(20)
        claimed = {job.deadline for job in jobs}
        # Counted from the claim's start, a margin short of the lease: a slow answer
        # cannot stretch it.
        assert len(claimed) == 1 and before < claimed.pop() - Lease(5).deadline(0) < before + 5
        hb = Heartbeat(pool, "host-a", Lease(600), lambda: jobs, lambda: None,
                       lambda: extended.append(True))
        sent = time.monotonic()
        lost = await hb.beat()
        return lost, [job.deadline for job in jobs], sent, time.monotonic()

    lost, deadlines, sent, answered = run_with_pool(dsn, scenario)
    assert lost == set()
    short = rows(db, "SELECT count(*) FROM pgpool_jobs WHERE lease_until < now() + "
                     "interval '500 seconds'")[0][0]
    assert short == 0
    # Each kept job's deadline moved on to the new lease, and the pool was told once.
    assert extended == [True]
    assert all(Lease(600).deadline(sent) <= d <= Lease(600).deadline(answered)
               for d in deadlines)


def test_reaper_revives_expired_jobs_and_buries_exhausted_ones(db, dsn):
    for i in range(3):
        pgpool.enqueue(db, "k", {"n": i}, max_attempts=1 if i == 0 else 5)

    async def scenario(pool: AsyncConnectionPool) -> tuple[int, int]:
        await claimer(pool, "host-gone").claim(3)
        async with pool.connection() as conn:  # they ran (a heartbeat recorded it), then
            await conn.execute("UPDATE pgpool_jobs SET lease_until = now() - interval '1s',"
                               " started = true WHERE payload->>'n' IN ('0', '1')")
        # Two reapers at once (two hosts): each expired job is handled exactly once.
        a, b = await asyncio.gather(Reaper(pool, 1).reap(), Reaper(pool, 1).reap())
        return a[0] + b[0], a[1] + b[1]

    assert run_with_pool(dsn, scenario) == (1, 1)
    ready = rows(db, "SELECT payload->>'n', attempts, last_error LIKE 'lease expired%%' "
                     "FROM pgpool_jobs WHERE state = 'ready'")
    assert ready == [("1", 1, True)]
    assert rows(db, "SELECT payload->>'n', last_error LIKE 'lease expired while running on "
                    "host-gone%%' FROM pgpool_dead") == [("0", True)]
    assert rows(db, "SELECT count(*) FROM pgpool_jobs WHERE state = 'running'") == [(1,)]


def test_reaper_does_not_count_an_attempt_that_never_started_up_to_a_bound(db, dsn):
    # A host claims three max_attempts=1 jobs, starts one, and dies. The heartbeat recorded
    # which one started: only that attempt counts. The third job was already stranded
    # FREE_INTERRUPTIONS times, so this time its attempt counts too.
    for i in range(3):
        pgpool.enqueue(db, "k", {"n": i}, max_attempts=1)
    db.execute("UPDATE pgpool_jobs SET attempts = %s, interruptions = %s "
               "WHERE payload->>'n' = '2'", (FREE_INTERRUPTIONS, FREE_INTERRUPTIONS))

    async def scenario(pool: AsyncConnectionPool) -> tuple[int, int]:
        jobs = await claimer(pool, "host-gone").claim(3)
        jobs[0].started = True  # what the pool marks when a worker takes it
        await Heartbeat(pool, "host-gone", Lease(30), lambda: jobs, lambda: None,
                        lambda: None).beat()
        async with pool.connection() as conn:
            await conn.execute("UPDATE pgpool_jobs SET lease_until = now() - interval '1s'")
        return await Reaper(pool, 1).reap()

    assert run_with_pool(dsn, scenario) == (1, 2)
    assert rows(db, "SELECT payload->>'n', state, attempts, interruptions, "
                    "last_error LIKE 'lease expired while waiting to start on host-gone%%' "
                    "FROM pgpool_jobs") == [("1", "ready", 1, 1, True)]
    assert rows(db, "SELECT payload->>'n', attempts, interruptions FROM pgpool_dead "
                    "ORDER BY id") == [("0", 1, 0),
                                       ("2", FREE_INTERRUPTIONS + 1, FREE_INTERRUPTIONS)]
    # Its next claim is attempt 2 as a token, attempt 1 as counted against max_attempts.
    (again,) = run_with_pool(dsn, lambda pool: claimer(pool).claim(1))
    assert (again.attempt, again.counted, again.max_attempts) == (2, 1, 1)


def _outcome(attempt: int, interruptions: int, *, interrupted: bool) -> AttemptEnd:
    job = Job(1, "k", "default", attempt, interruptions, 3, b"{}", None)
    return AttemptEnd(job, "shutdown grace period (1s) expired", 1.0, interrupted=interrupted)


def test_an_attempt_cut_off_by_shutdown_is_not_counted_up_to_the_bound() -> None:
    policy = Retry()
    # On its last counted attempt, a shutdown cut-off does not send it to pgpool_dead.
    assert decide(_outcome(3, 0, interrupted=True), policy).kind == "interrupted"
    assert decide(_outcome(3, 0, interrupted=False), policy).kind == "dead"
    # Past the bound it counts like any failure: retried while attempts are left, then dead.
    bound = FREE_INTERRUPTIONS
    assert decide(_outcome(bound + 1, bound, interrupted=True), policy).kind == "retry"
    assert decide(_outcome(bound + 3, bound, interrupted=True), policy).kind == "dead"
    # Uncounted claims do not use up max_attempts: the 5th claim with 2 uncounted is the 3rd
    # attempt, the last; the 4th is retried.
    assert decide(_outcome(4, 2, interrupted=False), policy).kind == "retry"
    assert decide(_outcome(5, 2, interrupted=False), policy).kind == "dead"


def test_completer_groups_many_acks_into_few_transactions(db, dsn):
    pgpool.enqueue_many(db, "k", ({"n": i} for i in range(500)))

    async def scenario(pool: AsyncConnectionPool) -> tuple[int, bool]:
        jobs = []
        c = claimer(pool)
        while batch := await c.claim(100):
            jobs += batch
        completer = Completer(pool, "host-a", max_batch=100, interval=0.05, high_water=300)
        task = asyncio.create_task(completer.run())
        for job in jobs[:299]:
            completer.add(Ack.done(job))
        room_before = completer.has_room()
        completer.add(Ack.done(jobs[299]))
        full = not completer.has_room()  # backpressure: the dispatcher stops claiming
        for job in jobs[300:]:
            completer.add(Ack.done(job))
        await completer.wait_idle()
        task.cancel()
        assert room_before and full
        return completer.stats.flushes, completer.stats.acks

    flushes, acks = run_with_pool(dsn, scenario)
    assert acks == 500
    assert flushes <= 10
    assert rows(db, "SELECT count(*) FROM pgpool_jobs") == [(0,)]


def test_completer_keeps_acks_across_a_killed_connection(db, dsn, server_dsn):
    pgpool.enqueue_many(db, "k", ({"n": i} for i in range(40)))

    async def scenario(pool: AsyncConnectionPool) -> tuple[int, int, int]:
        jobs = await claimer(pool).claim(40)
        # Kill every connection of the pool: the next flush fails on a dead socket.
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'pgpool-test-pool' "
                "AND datname = current_database()").fetchone()[0]
        completer = Completer(pool, "host-a", max_batch=10, interval=0.001)
        task = asyncio.create_task(completer.run())
        for job in jobs:
            completer.add(Ack.done(job))
        await asyncio.wait_for(completer.wait_idle(), 30)
        task.cancel()
        return killed, completer.stats.failed_flushes, completer.stats.acks

    killed, failed, acked = run_with_pool(dsn, scenario)
    assert killed >= 1
    assert failed >= 1  # the flush really hit the dead connection, and was retried
    assert acked == 40
    assert rows(db, "SELECT count(*) FROM pgpool_jobs") == [(0,)]


@pytest.mark.parametrize("attempt", [1, 2, 5, 12, 40])
def test_backoff_is_capped_exponential_with_bounded_jitter(attempt):
    policy = Retry(base=1.0, cap=600.0)
    nominal = min(600.0, 2.0 ** (attempt - 1))
    delays = [policy.delay(attempt) for _ in range(200)]
    assert all(nominal / 2 <= d <= nominal for d in delays)
    assert len(set(delays)) > 100  # jittered, not one fixed value


def _index_scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node] if node.get("Index Name") == "pgpool_jobs_ready" else []
    for child in node.get("Plans", []):
        found += _index_scans(child)
    return found


@pytest.mark.parametrize("statement", ["CLAIM_PLAIN", "CLAIM_PLAIN_ONE", "CLAIM"])
@pytest.mark.parametrize("queues", [["default"], ["default", "other"]])
def test_claim_reads_only_a_batch_of_a_deep_backlog(db, queues, statement):
    # Claim cost must not grow with the backlog: the ready index is read in claim order and
    # the scan stops at the batch size. (Sorting every due row instead took 350 ms per
    # claim with a million jobs due.)
    pgpool.enqueue_many(db, "k", ({"n": i} for i in range(3000)))
    pgpool.enqueue_many(db, "k", ({"n": i} for i in range(3000)), queue="other")
    db.execute("ANALYZE pgpool_jobs")
    params = {"queues": queues, "kinds": ["k"], "kind_max_attempts": [20], "owner": "h",
              "lease": 30, "limit": 10, "after": "", **SWEEP, "tenant_cap": None}
    from pgpool.sql import jobs as sql

    (plan,) = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + getattr(sql, statement),
                         params).fetchone()[0]
    scans = _index_scans(plan["Plan"])
    # The batch's rows, plus the fair claim's loose scan over tenants: one row per tenant
    # (here the one group of jobs without a tenant) and step.
    assert sum(s["Actual Rows"] * s["Actual Loops"] for s in scans) <= (10 + 2) * len(queues)
    assert db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running'"
                      ).fetchone()[0] == 10


def _join_filter_removals(node: dict[str, Any]) -> int:
    return node.get("Rows Removed by Join Filter", 0) + sum(
        _join_filter_removals(child) for child in node.get("Plans", []))


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("statement", ["ack", "ack_done", "heartbeat"])
def test_ack_and_heartbeat_plans_stay_linear_with_stale_statistics(db, statement, mode):
    # Statistics gathered while every job waits say no job runs. The ack and the heartbeat
    # must still look each id up once, not compare every held job with every id (that
    # plan took 200 ms for 1,000 acks; see "ownership" in pgpool.sql.jobs).
    from pgpool.sql import jobs as sql
    from pgpool.sql.common import int_array

    pgpool.enqueue_many(db, "k", ({"n": i} for i in range(3000)))
    db.execute("ANALYZE pgpool_jobs")
    rows = db.execute(sql.CLAIM, {"queues": ["default"], "kinds": ["k"],
                                  "kind_max_attempts": [20], "owner": "h", "lease": 30,
                                  "limit": 1000, "after": "", "tenant_cap": None}).fetchall()
    ids = int_array(r[0] for r in rows)
    attempts = int_array(r[3] for r in rows)
    if statement == "ack_done":  # what a flush of successes alone sends
        query = sql.ACK_DONE
        params: dict[str, Any] = {"owner": "h", "done_ids": ids, "done_attempts": attempts}
    elif statement == "ack":
        query = sql.ACK
        params = {"owner": "h", "done_ids": ids, "done_attempts": attempts}
        for arm in ("retry", "release", "interrupted", "dead"):
            params |= {f"{arm}_ids": "{}", f"{arm}_attempts": "{}"}
        params |= {"retry_delays": [], "retry_errors": [], "interrupted_errors": [],
                   "dead_errors": []}
    else:
        query = sql.HEARTBEAT
        params = {"owner": "h", "ids": ids, "attempts": attempts, "lease": 30,
                  "started": "{" + ",".join("t" * len(rows)) + "}"}

    plan = explain_prepared(db, query, params, mode)
    assert _join_filter_removals(plan) <= len(rows)
    remaining = db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0]
    assert remaining == (3000 if statement == "heartbeat" else 2000)
