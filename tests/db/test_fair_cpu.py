"""Fairness by CPU time (``pgpool run --fair-by cpu``, docs/guides/fairness.md): given the
usage recorded in pgpool_tenant_cpu, the fair claim (`sql.CLAIM_CPU`) shares its batch so
that the tenants' expected CPU evens out, in both plans a claim runs with; a real host
records what its attempts used; retention prunes what is past the window.

The shares asserted are worked out by hand from the rule (`sql.CLAIM_CPU`'s comment): a
tenant's r-th job starts at ``ahead + (r - 1) x mean``, and the batch takes the earliest
starts. The figures under load (two tenants flooding, 30 s) are bench/fair_cpu.py's.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import psycopg
import pytest
from commands import RUN, assert_user_error, run_pgpool
from dbtools import buffers, explain_prepared
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.host.parts.retention import Retention
from pgpool.sql import jobs as sql

MODES = ["force_custom_plan", "force_generic_plan"]


def claim_params(limit: int) -> dict[str, Any]:
    return {"queues": ["default"], "kinds": ["k"], "kind_max_attempts": [5], "owner": "h",
            "lease": 30, "limit": limit, "after": "", "tenant_cap": None}


def flood(db: psycopg.Connection, tenant: str, n: int) -> None:
    db.execute("INSERT INTO pgpool_jobs (kind, payload, tenant, run_at) "
               "SELECT 'k', '{}', %s, now() - interval '1 minute' "
               "FROM generate_series(1, %s)", (tenant, n))


def used(db: psycopg.Connection, tenant: str, cpu: float, attempts: int,
         ago: float = 1.0) -> None:
    """Recorded usage: ``cpu`` seconds over ``attempts`` attempts, ``ago`` seconds back."""
    db.execute("INSERT INTO pgpool_tenant_cpu (tenant, bucket, cpu, attempts) "
               "VALUES (%s, now() - make_interval(secs => %s), %s, %s)",
               (tenant, ago, cpu, attempts))


def claimed(db: psycopg.Connection, statement: str, limit: int, mode: str) -> Counter[str]:
    """The jobs per tenant one claim of ``limit`` takes, run as a prepared statement with a
    plan of ``mode``; rolled back, so the jobs stay ready."""
    db.execute("ANALYZE pgpool_jobs")
    with db.transaction(force_rollback=True):
        explain_prepared(db, statement, claim_params(limit), mode)
        return Counter(dict(db.execute(
            "SELECT tenant, count(*) FROM pgpool_jobs WHERE state = 'running' "
            "GROUP BY tenant").fetchall()))


def running(db: psycopg.Connection, tenant: str, n: int) -> None:
    """``n`` jobs of ``tenant`` running on another host: CPU no usage records yet."""
    db.execute("INSERT INTO pgpool_jobs (kind, payload, tenant, state, attempts, locked_by, "
               "claimed_at, lease_until) SELECT 'k', '{}', %s, 'running', 1, 'elsewhere', "
               "now(), now() + interval '1 minute' FROM generate_series(1, %s)", (tenant, n))


#: Recorded usage (tenant, CPU seconds, attempts, seconds ago), jobs running elsewhere per
#: tenant, the jobs ready per tenant, the batch, and the shares expected. heavy's jobs use
#: 100 ms each, light's 3 ms; light's usage is always 1.2 s over 400 attempts.
#: Worked out with the rule: a batch of 50 evens out at 50 / (1/0.1 + 1/0.003) = 0.1456 s
#: a tenant, which bounds how far ahead a tenant counts.
CASES = {
    # Even loads: heavy's starts 0, 0.1, 0.2; light's 0, 0.003... The 50 earliest: light's
    # 34 below 0.1 and heavy's 2 at 0 and 0.1, then light's next 14 (up to 0.141).
    # heavy's 50 s of a minute ago are past the window.
    "even": ([("heavy", 1.2, 12, 1), ("heavy", 50.0, 500, 100)], {}, 200, 50,
             {"heavy": 2, "light": 48}),
    # heavy behind by 0.9 s: light counts as 0.1456 ahead, so heavy's starts 0, 0.1 and
    # 0.2 come before light's 47th (0.1456 + 46 x 0.003 = 0.284).
    "behind": ([("heavy", 0.3, 3, 1)], {}, 200, 50, {"heavy": 3, "light": 47}),
    # heavy ahead by 0.8 s, counted as 0.1456: light's first 49 (to 0.144) go first, and
    # heavy still gets one: a tenant ahead is never starved.
    "ahead": ([("heavy", 2.0, 20, 1)], {}, 200, 50, {"heavy": 1, "light": 49}),
    # heavy's 0.9 s recorded and 3 jobs running (0.3 s expected): even with light, as in
    # "even" (counting only what was recorded, it would be behind, as in "behind").
    "running": ([("heavy", 0.9, 9, 1)], {"heavy": 3}, 200, 50, {"heavy": 2, "light": 48}),
    # A batch of 10 evens out at 0.029 s: all of it is light's share, heavy counting as
    # that far ahead. light has 3 jobs ready: the 7 left go to heavy, whose share was none.
    "spare": ([("heavy", 2.0, 20, 1)], {}, 3, 10, {"heavy": 7, "light": 3}),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_a_claim_by_cpu_evens_out_the_tenants_expected_cpu(db, mode, case):
    usage, running_now, ready, limit, expected = CASES[case]
    flood(db, "heavy", 200)
    flood(db, "light", ready)
    used(db, "light", 1.2, 400)
    for tenant, cpu, attempts, ago in usage:
        used(db, tenant, cpu, attempts, ago)
    for tenant, n in running_now.items():
        running(db, tenant, n)
    expected = Counter(expected) + Counter(running_now)  # those running stay so
    assert claimed(db, sql.CLAIM_CPU, limit, mode) == expected


@pytest.mark.parametrize("mode", MODES)
def test_by_job_count_the_same_usage_changes_nothing(db, mode):
    # The default claim reads no usage: each tenant gets half the batch, as before.
    flood(db, "heavy", 200)
    flood(db, "light", 200)
    used(db, "light", 1.2, 400)
    used(db, "heavy", 2.0, 20)
    assert claimed(db, sql.CLAIM, 50, mode) == {"heavy": 25, "light": 25}


@pytest.mark.parametrize("mode", MODES)
def test_tenants_not_measured_yet_share_evenly(db, mode):
    # No usage at all: every tenant's job is expected to cost the same (the least a job
    # may: `sql.MIN_JOB_CPU`), so the batch is shared by job count.
    for tenant in ("a", "b", "c"):
        flood(db, tenant, 100)
    assert claimed(db, sql.CLAIM_CPU, 30, mode) == {"a": 10, "b": 10, "c": 10}


def claim_pages(db: psycopg.Connection, statement: str, mode: str) -> int:
    """Shared buffers one claim of 50 touches (rolled back): the same on every machine."""
    with db.transaction(force_rollback=True):
        return buffers(explain_prepared(db, statement, claim_params(50), mode,
                                        "ANALYZE, BUFFERS, FORMAT JSON"))


@pytest.mark.parametrize("mode", MODES)
def test_a_claim_by_cpu_reads_a_few_pages_per_tenant_more_than_one_by_count(db, mode):
    # 100 tenants waiting, each with a window of usage: the claim by CPU reads each of the
    # 50 tenants walked's usage and running jobs, about 5 pages each (226 here), and
    # otherwise what the claim by count reads. (Its scans were once joined to the tenants
    # after running: 2,500 scans and their row locks for 50 tenants, 10,000 pages more.)
    for t in range(100):
        flood(db, f"t{t:03}", 200)
        for ago in range(0, 30, 5):
            used(db, f"t{t:03}", 1.0, 100, ago)
    db.execute("VACUUM ANALYZE pgpool_jobs")
    by_count = claim_pages(db, sql.CLAIM, mode)
    by_cpu = claim_pages(db, sql.CLAIM_CPU, mode)
    assert by_cpu <= by_count + 6 * 50, (by_count, by_cpu)


@pytest.mark.soak  # a real host (7 s): `make soak-test`
def test_a_host_records_the_cpu_its_attempts_used_per_tenant(db, dsn):
    # A real host with --fair-by cpu: one row per tenant in the bucket of now, each
    # attempt counted, the CPU the handlers burned (50 ms a job, in the worker) recorded.
    for tenant in ("a", "b"):
        pgpool.enqueue_many(db, "burn", ({"cpu": 0.05} for _ in range(4)), tenant=tenant)
    pgpool.enqueue(db, "burn", {"cpu": 0.05})  # no tenant: ''
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--burst", "--fair-by", "cpu")
    assert host.wait(60) == 0
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    rows = db.execute("SELECT tenant, sum(attempts)::int, sum(cpu) FROM pgpool_tenant_cpu "
                      "GROUP BY tenant ORDER BY tenant").fetchall()
    assert [(t, n) for t, n, _ in rows] == [("", 1), ("a", 4), ("b", 4)]
    for tenant, n, cpu in rows:
        assert cpu >= 0.05 * n, (tenant, cpu)  # each attempt burned at least 50 ms


@pytest.mark.soak  # a real host (8 s): `make soak-test`
def test_without_fair_by_cpu_a_host_records_nothing(db, dsn):
    pgpool.enqueue_many(db, "burn", ({"cpu": 0.01} for _ in range(3)), tenant="a")
    assert start_pgpool(dsn, *RUN, "--procs", "1", "--burst").wait(60) == 0
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM pgpool_tenant_cpu").fetchone()[0] == 0


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_fair_by_bogus_is_a_one_line_error(dsn, how):
    if how == "flag":
        result = run_pgpool(dsn, *RUN, "--burst", "--fair-by", "bogus")
        assert_user_error(result, "--fair-by", "'bogus'", "count, cpu")
    else:
        result = run_pgpool(dsn, *RUN, "--burst", PGPOOL_FAIR_BY="bogus")
        assert_user_error(result, "PGPOOL_FAIR_BY", "'bogus'", "count, cpu")


def test_retention_prunes_usage_past_its_window_and_keeps_the_rest(db, dsn):
    used(db, "a", 1.0, 10, ago=1)
    used(db, "a", 1.0, 10, ago=sql.CPU_KEPT + 10)
    used(db, "b", 1.0, 10, ago=sql.CPU_KEPT + 20)

    async def prune() -> int | None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1,
                                       kwargs={"autocommit": True}) as pool:
            return await Retention(pool, None).prune()

    assert asyncio.run(prune()) == 2
    assert db.execute("SELECT tenant FROM pgpool_tenant_cpu").fetchall() == [("a",)]
