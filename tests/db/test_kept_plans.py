"""The plans a host's prepared claims keep: made once (`sql.GENERIC_PLANS`) from the
statistics of that moment, they must not read the whole table when the queue they were
made on was next to empty and a burst comes (issue 32's "production is not a clean
table")."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from dbtools import GRANT_PARAMS, busiest, explain_kept_plan

import pgpool
from pgpool.host.claimer import configure_connection
from pgpool.sql import jobs as sql
from pgpool.sql.jobs import SWEEP

#: What the claims below send: one queue, one kind, a claim of `BATCH`.
BATCH = 1000
PARAMS: dict[str, Any] = {
    "queues": ["default"], "kinds": ["k"], "kind_max_attempts": [5], "owner": "host-a:1:aa",
    "lease": 30.0, "limit": BATCH, "after": "", "tenant_cap": None, **SWEEP,
    "limited_kinds": ["k"], "limited_concurrency": [1_000_000], "limited_rate": [None],
    "limited_per": [1.0], "limited_max_attempts": [5], **GRANT_PARAMS}


@pytest.mark.parametrize(("statement", "tenant", "limit"), [
    ("CLAIM_PLAIN", None, BATCH), ("CLAIM_PLAIN_ONE", None, BATCH),
    ("CLAIM_PROMPT", None, 1), ("CLAIM", "t", BATCH), ("CLAIM_SLOTS", None, BATCH),
    ("CLAIM_SLOTS_PLAIN", None, BATCH), ("CLAIM_LIMITED", None, BATCH),
    ("CLAIM_LIMITED_PLAIN", None, BATCH), ("CLAIM_GRANTED", None, BATCH)])
@pytest.mark.parametrize("held_before", [0, 5000], ids=["new table", "pages held more"])
def test_a_claim_planned_on_a_next_to_empty_table_reads_only_what_it_takes_from_a_burst(
        db: psycopg.Connection, statement: str, tenant: str | None, limit: int,
        held_before: int) -> None:
    # A host started on an idle queue: two jobs, analyzed. Then 20,000 come, and the plan
    # made before them is kept until the statistics change. With a sequential scan
    # allowed, each of these claims read all 20,002 rows to take 1,000; with only that
    # off, the fair claim read them through a bitmap scan when the table's pages had
    # held more rows before (two rows over many pages: a sparser table to the planner).
    if held_before:
        db.execute("INSERT INTO pgpool_jobs (kind, payload) SELECT 'gone', '{}' "
                   "FROM generate_series(1, %s)", (held_before,))
        db.execute("DELETE FROM pgpool_jobs WHERE kind = 'gone'")
    pgpool.enqueue_many(db, "k", [{"i": i} for i in range(2)], tenant=tenant)
    db.execute("ANALYZE pgpool_jobs")
    plan = explain_kept_plan(db, getattr(sql, statement), {**PARAMS, "limit": limit},
                             lambda: pgpool.enqueue_many(db, "k", [{"i": i} for i in range(20_000)],
                                                         tenant=tenant))
    assert plan["Actual Rows"] == limit
    rows, node = busiest(plan)
    assert rows <= 2 * BATCH, (rows, node)  # CLAIM_SLOTS: its window of twice the batch


def test_the_claim_pool_keeps_generic_plans_that_read_no_table_whole(dsn: str) -> None:
    async def settings() -> tuple[str, str, str]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await configure_connection(conn, claims=True)
            cur = await conn.execute("SELECT current_setting('plan_cache_mode'), "
                                     "current_setting('enable_seqscan'), "
                                     "current_setting('enable_bitmapscan')")
            return await cur.fetchone()  # type: ignore[return-value]

    assert asyncio.run(settings()) == ("force_generic_plan", "off", "off")
