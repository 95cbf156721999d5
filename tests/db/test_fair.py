"""Fairness (docs/guides/fairness.md): tenants interleaved round-robin in every claim and capped
across the fleet, and concurrency keys: at most one running job per key, backed by a
unique index.

The claim's batch composition is checked on a `Claimer` against the real database; the
flood and the key serialisation with real dispatchers (`start_pgpool`). Nothing here
asserts wall-clock times: `bench/tenants.py` measures the lag figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import threading
from collections import Counter, defaultdict

import psycopg
import pytest
from chaos_checks import find_overlaps
from claims import in_registry
from commands import RUN, assert_user_error, run_pgpool
from dbtools import one
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool
from records import read_ticks
from waits import wait_until

import pgpool
from pgpool.host.claimer import Claimer
from pgpool.host.lease import Lease
from pgpool.registry import Handler
from pgpool.sql import jobs as sql

FLOOD = 50_000


def claimer(pool: AsyncConnectionPool, *, tenant_cap: int | None = None,
            owner: str = "host-a") -> Claimer:
    return Claimer(pool, owner, queues=("default",),
                   handlers={"k": Handler("k", print, None, None)}, lease=Lease(30),
                   max_attempts=5, timeout=None, tenant_cap=tenant_cap)


def flood(db: psycopg.Connection, kind: str, n: int = FLOOD, tenant: str = "flood",
          payload: str = "{}") -> None:
    """``n`` due jobs of one tenant, seeded in one statement (fast, unlike n enqueues)."""
    db.execute("INSERT INTO pgpool_jobs (kind, payload, tenant, run_at) "
               "SELECT %s, %s::jsonb, %s, now() - interval '1 hour' "
               "FROM generate_series(1, %s)", (kind, payload, tenant, n))
    db.execute("ANALYZE pgpool_jobs")


def tenants_of(jobs: list, db: psycopg.Connection) -> Counter[str]:
    ids = [job.id for job in jobs]
    return Counter(t for (t,) in db.execute(
        "SELECT tenant FROM pgpool_jobs WHERE id = ANY(%s)", (ids,)))


# --- enqueue ------------------------------------------------------------------------------


def test_every_way_in_sets_tenant_and_key(db, dsn):
    odd = "a\tb\\c\nd"  # COPY's special characters
    pgpool.enqueue_many(db, "k", [{}, {}], tenant=odd, concurrency_key=odd)

    async def many_async() -> int:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await pgpool.enqueue_async(conn, "k", {}, tenant="t2", concurrency_key="k2")
            return await pgpool.enqueue_many_async(conn, "k", [{}], tenant="t3")

    assert asyncio.run(many_async()) == 1
    done = run_pgpool(dsn, "enqueue", "k", "{}", "--tenant", "t4", "--concurrency-key", "k4")
    assert done.returncode == 0, done.stderr
    pgpool.enqueue(db, "k", {})
    assert db.execute("SELECT tenant, concurrency_key FROM pgpool_jobs ORDER BY id").fetchall(
        ) == [(odd, odd), (odd, odd), ("t2", "k2"), ("t3", None), ("t4", "k4"), ("", None)]


@pytest.mark.parametrize("option", ["--tenant", "--concurrency-key"])
def test_an_empty_tenant_or_key_is_a_one_line_error(db, dsn, option):
    what = option.lstrip("-").replace("-", "_")
    assert_user_error(run_pgpool(dsn, "enqueue", "k", "{}", option, ""), what, "non-empty")
    with pytest.raises(pgpool.ConfigError, match=what):
        pgpool.enqueue_many(db, "k", [{}], **{what: "x" * 201})


# --- tenants: what one claim takes --------------------------------------------------------


def test_a_claim_interleaves_tenants_and_gives_the_rest_to_the_flood(db, dsn):
    flood(db, "k")
    for tenant in ("a", "b", "c"):
        pgpool.enqueue(db, "k", {}, tenant=tenant)
        pgpool.enqueue(db, "k", {}, tenant=tenant)
    pgpool.enqueue(db, "k", {})  # no tenant: one more group

    jobs = in_registry(dsn, lambda pool: claimer(pool).claim(10))
    # Round-robin: every tenant's first job (the flood's too), then every second one; the
    # rest of the batch, which nobody else needs, goes to the flood.
    assert tenants_of(jobs, db) == {"a": 2, "b": 2, "c": 2, "": 1, "flood": 3}
    # Handed to the workers in rounds too: one job of each tenant first.
    tenant = dict(db.execute("SELECT id, tenant FROM pgpool_jobs WHERE id = ANY(%s)",
                             ([j.id for j in jobs],)).fetchall())
    assert sorted(tenant[j.id] for j in jobs[:5]) == ["", "a", "b", "c", "flood"]

    jobs = in_registry(dsn, lambda pool: claimer(pool).claim(10))
    assert tenants_of(jobs, db) == {"flood": 10}  # alone, it gets whole batches


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_within_a_tenant_the_fair_claim_takes_its_kinds_in_turns(db, mode):
    # One tenant's flood of a kind, due ahead of its job of another kind: a claim takes one
    # of each in turn, as the plain claim does across kinds (seed 004, with tenants).
    flood(db, "k", 30, tenant="t1")
    quiet = pgpool.enqueue(db, "q", {}, tenant="t1")
    db.execute(f"SET plan_cache_mode = {mode}")
    params = {"queues": ["default"], "kinds": ["k", "q"], "kind_max_attempts": [5, 5],
              "owner": "h", "lease": 30, "limit": 3, "after": "", "tenant_cap": None}
    rows = db.execute(sql.CLAIM, params, prepare=True).fetchall()
    assert len(rows) == 3 and quiet in [row[0] for row in rows]


def test_a_small_batch_still_serves_every_tenant_in_turn(db, dsn):
    # More tenants waiting than a batch holds: the cursor moves on, so none waits behind
    # the others' backlogs.
    tenants = [f"t{i:02}" for i in range(12)]
    for tenant in tenants:
        flood(db, "k", 20, tenant=tenant)

    async def claims(pool: AsyncConnectionPool) -> list[list]:
        c = claimer(pool)
        return [await c.claim(4) for _ in range(3)]

    served = [tenants_of(jobs, db) for jobs in in_registry(dsn, claims)]
    assert all(sorted(batch.values()) == [1, 1, 1, 1] for batch in served), served
    assert sorted(t for batch in served for t in batch) == tenants


def test_the_tenant_cap_counts_running_jobs_across_the_fleet(db, dsn):
    flood(db, "k", 100)
    flood(db, "k", 100, tenant="other")
    for _ in range(3):
        pgpool.enqueue(db, "k", {})  # no tenant: never capped

    async def claims(pool: AsyncConnectionPool) -> list[list]:
        first = await claimer(pool, tenant_cap=3, owner="host-a").claim(20)
        second = await claimer(pool, tenant_cap=3, owner="host-b").claim(20)
        return [first, second]

    first, second = in_registry(dsn, claims)
    assert tenants_of(first, db) == {"flood": 3, "other": 3, "": 3}
    assert tenants_of(second, db) == {}  # another host: the fleet's running jobs count
    # A finished job makes room for one more.
    db.execute("DELETE FROM pgpool_jobs WHERE id = %s", (first[0].id,))
    third = in_registry(dsn, lambda pool: claimer(pool, tenant_cap=3).claim(20))
    assert len(third) == 1


# --- tenants: a flood against real dispatchers -------------------------------------------


@pytest.mark.soak  # a big drain: `make soak-test`
def test_other_tenants_jobs_start_before_the_flood_ahead_of_them(db, dsn, tmp_path):
    # 50k jobs of one tenant are due ahead of the others'. Those must start after at most
    # the flood jobs the host already holds (a few batches), not after the backlog.
    flood(db, "noop")
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--batch", "20")
    host.event("started")
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs")[0] < FLOOD - 200,
               "the host to be working through the flood")
    before = one(db, "SELECT count(*) FROM pgpool_jobs WHERE tenant = 'flood'")[0]
    others = [pgpool.enqueue(db, "noop", {}, tenant=t) for t in ("a", "b", "c") for _ in "12"]
    wait_until(lambda: not one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = ANY(%s)",
                               others)[0], "the other tenants' jobs to be done", timeout=60)
    after = one(db, "SELECT count(*) FROM pgpool_jobs WHERE tenant = 'flood'")[0]
    # The host holds at most procs + a batch per claim loop and one for the workers
    # (2 + 3 * 20 = 62) flood jobs when the others arrive, and the flood goes on beside
    # them until their acks are seen here (the completer's flush, this poll): 5,000 leaves
    # seconds of room on a loaded machine and is a tenth of the backlog they would
    # otherwise have waited behind (the whole flood: the test then fails here, or times
    # out above).
    assert before - after < 5_000
    # And the flood kept the capacity nobody else needed: it went on being served.
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs")[0] < after - 200,
               "the flood to go on after the others")
    assert host.stop() == 0


# --- concurrency keys ---------------------------------------------------------------------


def test_a_claim_takes_one_job_per_key_and_none_of_a_running_key(db, dsn):
    for key in ("x", "x", "y", "y"):
        pgpool.enqueue(db, "k", {}, concurrency_key=key)
    pgpool.enqueue(db, "k", {})

    first = in_registry(dsn, lambda pool: claimer(pool).claim(10))
    keys = [k for (k,) in db.execute("SELECT concurrency_key FROM pgpool_jobs WHERE id = "
                                     "ANY(%s) ORDER BY 1", ([j.id for j in first],))]
    assert keys == ["x", "y", None]
    assert in_registry(dsn, lambda pool: claimer(pool).claim(10)) == []


def test_the_unique_index_refuses_a_second_running_job_of_a_key(db):
    a = pgpool.enqueue(db, "k", {}, concurrency_key="x")
    b = pgpool.enqueue(db, "k", {}, concurrency_key="x")
    db.execute("UPDATE pgpool_jobs SET state = 'running' WHERE id = %s", (a,))
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("UPDATE pgpool_jobs SET state = 'running' WHERE id = %s", (b,))


def test_two_claims_racing_for_one_key_run_one_and_the_loser_retries(db, dsn):
    # Claim A has taken key x but not committed; claim B's snapshot cannot see that, picks
    # the other job of x, and waits on A's index entry. When A commits, B's statement fails
    # with a unique violation: the claimer must try again (not raise), and then take the
    # unrelated job only.
    x1 = pgpool.enqueue(db, "k", {}, concurrency_key="x")
    x2 = pgpool.enqueue(db, "k", {}, concurrency_key="x")
    free = pgpool.enqueue(db, "k", {})
    from pgpool.sql import jobs as sql

    holder = psycopg.connect(dsn)
    try:
        holder.execute("UPDATE pgpool_jobs SET state = 'running', locked_by = 'host-a' "
                       "WHERE id = %s", (x1,))

        async def race(pool: AsyncConnectionPool) -> list:
            task = asyncio.create_task(claimer(pool, owner="host-b").claim(10))
            def waiting() -> bool:
                # The statement as sent has $1... for %(name)s: match its opening.
                return one(db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type "
                               "= 'Lock' AND datname = current_database() "
                               "AND starts_with(ltrim(query, E' \\n'), %s)",
                           sql.CLAIM.lstrip()[:30])[0] == 1
            await asyncio.to_thread(wait_until, waiting, "claim B to wait for claim A")
            threading.Thread(target=holder.commit).start()
            return await task

        jobs = in_registry(dsn, race)
    finally:
        holder.close()
    assert [j.id for j in jobs] == [free]
    assert one(db, "SELECT state FROM pgpool_jobs WHERE id = %s", x2)[0] == "ready"


@pytest.mark.soak  # long: the soak tier, which CI runs after make test
def test_no_two_jobs_of_a_key_ever_run_at_once_across_hosts_and_worker_kills(
        db, dsn, tmp_path):
    # Three hosts, 8 keys with 5 jobs each plus unrelated jobs; workers are killed mid-job
    # (their attempts fail and are retried). The ticker's records give each attempt's run
    # time (monotonic ns, one clock for every process): no two attempts of a key overlap.
    ticks = tmp_path / "ticks"
    ticks.mkdir()
    key_of: dict[int, str] = {}
    for _ in range(5):
        for k in range(8):
            key_of[pgpool.enqueue(db, "ticker", {"seconds": 0.3},
                                  concurrency_key=f"acct-{k}")] = f"acct-{k}"
    unrelated = [pgpool.enqueue(db, "ticker", {"seconds": 0.3}) for _ in range(10)]
    hosts = [start_pgpool(dsn, *RUN, "--procs", "2", "--batch", "4", "--lease", "3",
                          TICKS_RECORD=str(ticks)) for _ in range(3)]

    killed: set[int] = set()

    def kill_some() -> bool:
        # SIGKILL the worker of a keyed attempt that has ticked but not ended, 4 times.
        for f in ticks.glob("*.log"):
            pid = int(f.stem.partition("-")[2])
            lines = f.read_text().split("\n")[:-1]
            if pid in killed or not lines or lines[-1].endswith(" end"):
                continue
            if int(lines[-1].split()[0]) in key_of:
                killed.add(pid)
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(pid, signal.SIGKILL)
        return len(killed) >= 4

    wait_until(kill_some, "four workers to kill mid-job", timeout=60)
    # Every job is done in the end (killed attempts are retried): 5 jobs of 0.3 s per key
    # one after another, and retry back-offs of 0.5-1 s; 120 s is many times that.
    wait_until(lambda: not one(db, "SELECT count(*) FROM pgpool_jobs")[0],
               "every job to be done", timeout=120)
    for host in hosts:
        assert host.stop() == 0

    attempts = read_ticks(ticks)
    by_key: dict[int, list] = defaultdict(list)
    names = sorted(set(key_of.values()))
    for job, runs in attempts.items():
        if job in key_of:
            by_key[names.index(key_of[job])].extend(runs)
    for runs in by_key.values():
        runs.sort(key=lambda a: a.start)
    assert find_overlaps(by_key, lambda pid: None) == []
    assert set(attempts) == set(key_of) | set(unrelated)
    assert any(len(runs) > 1 for job, runs in attempts.items() if job in key_of)  # kills hit
    # Keys serialise their own jobs only: attempts of different keys did overlap.
    everything = sorted((a for runs in by_key.values() for a in runs), key=lambda a: a.start)
    assert any(b.start < a.end for a, b in itertools.pairwise(everything))
    assert len({a.ppid for runs in attempts.values() for a in runs}) > 1  # several hosts


def test_heartbeats_of_tenant_and_keyed_jobs_stay_hot(db, dsn):
    # No index of migration 9 covers a column a heartbeat writes: the lease extension of a
    # running job with a tenant and a key is a HOT update (no index entry written).
    from pgpool.sql import jobs as sql
    from pgpool.sql.common import int_array

    pgpool.enqueue(db, "k", {}, tenant="acme", concurrency_key="x")
    pgpool.enqueue(db, "k", {}, tenant="acme")
    jobs = in_registry(dsn, lambda pool: claimer(pool).claim(10))
    assert len(jobs) == 2
    with db.transaction():  # the statistics of this transaction, read before it ends
        beaten = db.execute(sql.HEARTBEAT, {
            "ids": int_array(j.id for j in jobs),
            "attempts": int_array(j.attempt for j in jobs), "owner": "host-a",
            "started": [True, True], "lease": 30}).fetchall()
        hot = one(db, "SELECT pg_stat_get_xact_tuples_hot_updated('pgpool_jobs'::regclass)")
    assert len(beaten) == 2
    assert hot == (2,)
