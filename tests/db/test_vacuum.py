"""The vacuum keeper vacuums pgpool_jobs once its dead rows are due, and only then; a role
that may not vacuum the table runs none and says so (issue 20). When the xmin horizon is
held, it names the holder and does not vacuum the same rows again, nor new ones until the
horizon moves or they double (issue 32)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from claims import in_registry
from dbtools import one
from horizon_holds import dead_rows, hold_horizon
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from waits import wait_until

import pgpool
from pgpool.host.parts.vacuum import VacuumKeeper, keeper

#: Dead rows the tests make: two row versions per job, deleted after a claim.
JOBS = 600


def vacuums(db: psycopg.Connection) -> int:
    return one(db, "SELECT vacuum_count FROM pg_stat_user_tables "
                   "WHERE relid = 'pgpool_jobs'::regclass")[0]


def make_dead_rows(db: psycopg.Connection, at_least: int = 2 * JOBS, jobs: int = JOBS) -> None:
    """Claim and delete ``jobs`` jobs, then wait until the server's statistics count their
    dead rows, ``at_least`` in all (a backend reports its counts at most once a second,
    unless forced)."""
    pgpool.enqueue_many(db, "dead", ({"n": i} for i in range(jobs)))
    db.execute("UPDATE pgpool_jobs SET state = 'running', locked_by = 'h' WHERE kind = 'dead'")
    db.execute("DELETE FROM pgpool_jobs WHERE kind = 'dead'")
    db.execute("SELECT pg_stat_force_next_flush()")
    wait_until(lambda: dead_rows(db) >= at_least, "the statistics to count the dead rows")


@pytest.fixture
def alone(fresh_dsn: str) -> Iterator[tuple[psycopg.Connection, str]]:
    """A migrated installation in a database of its own, and its DSN: the horizon of a
    table counts only its own database's sessions, so no other test's snapshot (the suite
    runs tests side by side on one server) holds back what a test here expects removed.
    Autovacuum is off for its table: an autovacuum that started behind the test's holder
    makes the keeper's vacuum (SKIP_LOCKED) skip, and then leaves rows the test expects
    the keeper to remove. And the new database's catalogs, which the migration just
    filled, are vacuumed and analyzed first: else autovacuum analyzes them during the
    test, and each ANALYZE holds the horizon for a moment."""
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        conn.execute("ALTER TABLE pgpool_jobs SET (autovacuum_enabled = false)")
        conn.execute("VACUUM ANALYZE")
        yield conn, fresh_dsn


def test_the_keeper_vacuums_when_dead_rows_are_due_and_not_before(db, dsn):
    make_dead_rows(db)
    before = vacuums(db)

    async def keep(pool: AsyncConnectionPool) -> list[bool]:
        # Due at 10 times the dead rows there are: no vacuum. At them: one.
        far = VacuumKeeper(pool, dsn, min_dead=20 * JOBS, scale=0)
        near = VacuumKeeper(pool, dsn, min_dead=2 * JOBS, scale=0)
        return [await far.keep(), await near.keep()]

    assert in_registry(dsn, keep) == [False, True]
    assert vacuums(db) == before + 1
    # The vacuum reset the count: nothing is due any more.
    assert one(db, "SELECT n_dead_tup FROM pg_stat_user_tables "
                   "WHERE relid = 'pgpool_jobs'::regclass")[0] < 2 * JOBS


def test_the_keeper_counts_live_rows_against_dead_ones(db, dsn):
    pgpool.enqueue_many(db, "k", ({"n": i} for i in range(20 * JOBS)))
    db.execute("VACUUM ANALYZE pgpool_jobs")  # the live rows counted, the dead ones gone
    make_dead_rows(db)
    before = vacuums(db)

    async def keep(pool: AsyncConnectionPool) -> list[bool]:
        # The dead rows are a tenth of the live ones: due at 5%, not at 50%.
        return [await VacuumKeeper(pool, dsn, min_dead=0, scale=0.5).keep(),
                await VacuumKeeper(pool, dsn, min_dead=0, scale=0.05).keep()]

    assert in_registry(dsn, keep) == [False, True]
    assert vacuums(db) == before + 1


def test_a_held_horizon_is_named_and_the_same_rows_are_not_vacuumed_again(alone, caplog):
    db, dsn = alone
    holder = hold_horizon(dsn, "write")
    make_dead_rows(db)
    before = vacuums(db)

    async def keep(pool: AsyncConnectionPool) -> list[Any]:
        keeper = VacuumKeeper(pool, dsn, min_dead=2 * JOBS, scale=0)
        # Due; the vacuum leaves them all; the same rows are not due again...
        done = [await keeper.keep(), await keeper.keep(), keeper.left >= 2 * JOBS]
        # ...until as many more have died: twice what was left (`HELD_GROWTH`), behind the
        # same holder.
        await asyncio.to_thread(make_dead_rows, db, 4 * JOBS)
        done += [await keeper.keep(), await keeper.keep()]
        # Let go: the next vacuum removes them all, and nothing is left.
        holder.close()
        await asyncio.to_thread(make_dead_rows, db, 6 * JOBS)
        return [*done, await keeper.keep(), keeper.left]

    pid = holder.info.backend_pid
    with caplog.at_level(logging.WARNING, logger="pgpool.vacuum"):
        assert in_registry(dsn, keep) == [True, False, True, True, False, True, 0]
    assert vacuums(db) == before + 3 and dead_rows(db) < 2 * JOBS
    held = [r for r in caplog.records if r.event == "vacuum_held"]
    # Named once: the same holder, within a minute.
    assert [(r.fields["holder"], r.fields["holder_pid"]) for r in held] == [("backend", pid)]
    assert f"SELECT pg_terminate_backend({pid})" in held[0].getMessage()


def test_behind_a_horizon_that_has_not_moved_the_keeper_waits_for_the_dead_rows_to_double(
        alone):
    """A vacuum behind the same holder would remove nothing and read the whole table: once
    held, the keeper vacuums again only when the horizon has moved (another transaction
    holds it) or the dead rows have doubled (the test above: twice what was left)."""
    db, dsn = alone
    # A holder with a transaction id: when it moves on to a new one, the horizon moves
    # with it. (A new snapshot's xmin is the oldest transaction running anywhere on the
    # server, this suite's other tests' included: it may not move.)
    holder = hold_horizon(dsn, "write")
    make_dead_rows(db)  # 2 x JOBS dead rows
    before = vacuums(db)

    async def keep(pool: AsyncConnectionPool) -> list[Any]:
        keeper = VacuumKeeper(pool, dsn, min_dead=JOBS, scale=0)
        done = [await keeper.keep(), keeper.left >= 2 * JOBS, keeper.horizon is not None]
        # JOBS more: due by the count, but the same holder holds what they left.
        await asyncio.to_thread(make_dead_rows, db, 3 * JOBS, JOBS // 2)
        done.append(await keeper.keep())
        # The holder moves on to a new transaction: the horizon moves, the rows that died
        # before it are removable, and the keeper vacuums them.
        holder.commit()
        holder.execute("SELECT txid_current()")
        done += [await keeper.keep(), keeper.left]
        return done

    try:
        assert in_registry(dsn, keep) == [True, True, True, False, True, 0]
    finally:
        holder.close()
    assert vacuums(db) == before + 2


@pytest.mark.own_schema
def test_a_role_that_may_not_vacuum_runs_no_keeper_and_says_so(db, dsn, caplog):
    role = f"pgpool_worker_{uuid.uuid4().hex[:8]}"
    schema = one(db, "SELECT current_schema()")[0]
    db.execute(pgsql.SQL("CREATE ROLE {r} LOGIN; GRANT USAGE ON SCHEMA {s} TO {r}").format(
        r=pgsql.Identifier(role), s=pgsql.Identifier(schema)))
    try:
        limited = make_conninfo(dsn, user=role)

        async def make(pool: AsyncConnectionPool) -> VacuumKeeper | None:
            return await keeper(pool, limited)

        with caplog.at_level(logging.WARNING, logger="pgpool.vacuum"):
            assert in_registry(limited, make) is None
        assert [r.event for r in caplog.records] == ["vacuum_keeper_off"]
        if one(db, "SELECT current_setting('server_version_num')::int")[0] >= 170000:
            db.execute(pgsql.SQL("GRANT MAINTAIN ON pgpool_jobs TO {}").format(
                pgsql.Identifier(role)))
            assert isinstance(in_registry(limited, make), VacuumKeeper)
    finally:
        db.execute(pgsql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(
            r=pgsql.Identifier(role)))
