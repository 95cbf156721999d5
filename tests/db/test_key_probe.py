"""The claims' look at running concurrency keys behind a pinned xmin horizon: a job with a
key waits while one of its key runs, which the fair claim (and the limited claims in their
fair order) ask of pgpool_jobs_key_running. A long transaction keeps that index's entry of
every keyed job claimed since, dead: the look must probe by key, never read them all.

Costs are read as shared buffers touched, never as times: here, those of the looks at
running jobs alone (a claim's own writes touch more pages in a table full of dead rows, by
how full they are).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from dbtools import explain_prepared, index_reads

import pgpool
from pgpool.sql import jobs as sql

#: A claim of 50 of kind k, as a host sends it; for `sql.CLAIM_SLOTS`, k limited to
#: 1,000,000 at once (never reached).
PARAMS: dict[str, Any] = {
    "queues": ["default"], "kinds": ["k"], "kind_max_attempts": [5], "owner": "h",
    "lease": 30, "limit": 50, "after": "", **sql.SWEEP, "tenant_cap": None,
    "limited_kinds": ["k"], "limited_concurrency": [1_000_000], "limited_max_attempts": [5]}


def claim_running_reads(db: psycopg.Connection, statement: str) -> int:
    """Shared buffers ``statement``, as a host's prepared claim (generic plan), rolled
    back, touches to look at running jobs (for their keys) on the indexes of running jobs
    (pgpool_jobs_running, _key_running, ...); it must claim 50 jobs."""
    with db.transaction(force_rollback=True):
        top = explain_prepared(db, getattr(sql, statement), PARAMS, "force_generic_plan",
                               "ANALYZE, BUFFERS, FORMAT JSON")
        assert db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running'"
                          ).fetchone()[0] == 50
    return index_reads(top, "running")


@pytest.mark.own_schema  # pages counted: a table no earlier test left free space in
def test_behind_a_pinned_horizon_the_claims_do_not_read_the_keys_of_jobs_gone(
        db: psycopg.Connection, dsn: str) -> None:
    # 200 jobs of kind k over 10 tenants, the fair order's; and 30,000 jobs of another
    # kind, each with a key, claimed and acked while a transaction holds a snapshot.
    db.execute("ALTER TABLE pgpool_jobs SET (autovacuum_enabled = false)")
    statements = ("CLAIM", "CLAIM_CPU", "CLAIM_SLOTS")
    try:
        pgpool.enqueue_many(db, "other", ({"n": i} for i in range(30_000)))
        for t in range(10):
            pgpool.enqueue_many(db, "k", ({"n": i} for i in range(20)), tenant=f"t{t}")
        db.execute("VACUUM ANALYZE pgpool_jobs")
        clean = {s: claim_running_reads(db, s) for s in statements}
        with psycopg.connect(dsn) as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM pgpool_jobs")
            db.execute("UPDATE pgpool_jobs SET state = 'running', "
                       "concurrency_key = 'key-' || id WHERE kind = 'other'")
            db.execute("DELETE FROM pgpool_jobs WHERE kind = 'other'")
            pinned = {s: claim_running_reads(db, s) for s in statements}
    finally:
        db.execute("ALTER TABLE pgpool_jobs RESET (autovacuum_enabled)")
    for s in statements:
        # Its jobs have no key: no running job is read for them, pinned or not (1,205
        # pages more for the fair claim when its generic plan read every running job,
        # dead ones included, once per claim: an anti join on pgpool_jobs_running). What
        # is read is the tenants' running counts (`sql.CLAIM_CPU`) and the slots' probes
        # (`sql.CLAIM_SLOTS`), a few pages whatever lies dead.
        assert pinned[s] <= clean[s] + 50, (s, clean, pinned)
