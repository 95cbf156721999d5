"""Enqueueing: the caller's transaction decides, NOTIFY arrives at commit, dedupe, COPY."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from dbtools import listen_sql
from psycopg import sql as pgsql

import pgpool
from pgpool.sql import jobs as sql
from pgpool.sql.common import STAGE


def count(db: psycopg.Connection, where: str = "true") -> int:
    return db.execute(f"SELECT count(*) FROM pgpool_jobs WHERE {where}").fetchone()[0]


def listener(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(listen_sql(conn))
    return conn


def next_notification(conn: psycopg.Connection, timeout: float = 30) -> str | None:
    """The payload of the next notification on ``conn``; None after ``timeout`` seconds
    (only a failing test waits that long: the ones it expects arrive at once)."""
    for n in conn.notifies(timeout=timeout, stop_after=1):
        return n.payload
    return None


def nothing_before_a_marker(ears: psycopg.Connection, db: psycopg.Connection) -> bool:
    """Whether no notification reached ``ears`` before now, proved without waiting on a
    hunch: a marker notified and committed now on ``db`` must be the next one to arrive.
    PostgreSQL delivers notifications in commit order, so one sent by anything committed
    earlier would arrive first."""
    marker = f"marker-{uuid.uuid4().hex}"
    db.execute(sql.NOTIFY, {"queue": marker})
    return next_notification(ears) == marker


@pytest.mark.own_schema
def test_rolled_back_enqueue_leaves_no_job_and_wakes_nobody(db, dsn):
    ears = listener(dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (1)")
        job_id = pgpool.enqueue(conn, "thumbnail", {"order": 1})
        assert isinstance(job_id, int)
        conn.rollback()
    assert count(db) == 0
    assert db.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
    assert nothing_before_a_marker(ears, db)


@pytest.mark.own_schema
def test_committed_enqueue_commits_with_business_rows_and_notifies_at_commit(db, dsn):
    ears = listener(dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        pgpool.enqueue(conn, "thumbnail", {"order": 1}, queue="images")
        assert nothing_before_a_marker(ears, db)  # not before commit
        conn.commit()
    assert next_notification(ears) == "images"
    assert count(db, "queue = 'images' AND state = 'ready'") == 1


def test_delayed_job_is_scheduled_and_wakes_only_the_stagers(db, dsn):
    ears = listener(dsn)
    with db.transaction():
        pgpool.enqueue(db, "k", {}, delay=60)
        pgpool.enqueue(db, "k", {}, run_at=datetime.now(UTC) + timedelta(hours=2))
        pgpool.enqueue(db, "k", {}, delay=timedelta(minutes=3))
    # Not its queue's claimers: the stagers, which learn of a job due sooner than they knew
    # (once: PostgreSQL folds a transaction's identical notifications into one).
    assert next_notification(ears) == STAGE
    assert nothing_before_a_marker(ears, db)
    assert count(db, "run_at > now() + interval '50 seconds' AND state = 'scheduled'") == 3


def test_unique_key_dedupes_while_ready_or_running_per_kind(db):
    first = pgpool.enqueue(db, "report", {"day": 1}, unique_key="day-1")
    assert first is not None
    assert pgpool.enqueue(db, "report", {"day": 1}, unique_key="day-1") is None
    assert pgpool.enqueue(db, "other", {"day": 1}, unique_key="day-1") is not None
    db.execute("UPDATE pgpool_jobs SET state = 'running' WHERE id = %s", (first,))
    assert pgpool.enqueue(db, "report", {}, unique_key="day-1") is None
    db.execute("DELETE FROM pgpool_jobs WHERE id = %s", (first,))  # it finished
    assert pgpool.enqueue(db, "report", {}, unique_key="day-1") is not None


def test_enqueue_many_copies_all_rows_in_the_callers_transaction(db, dsn):
    payloads = [{"n": i, "text": 'quote " back\\slash \t tab é'} for i in range(2500)]
    with psycopg.connect(dsn) as conn:
        assert pgpool.enqueue_many(conn, "k", payloads, priority=3, max_attempts=2) == 2500
        conn.rollback()
    assert count(db) == 0
    assert pgpool.enqueue_many(db, "k", iter(payloads), queue="bulk") == 2500
    stored = db.execute("SELECT payload FROM pgpool_jobs ORDER BY id").fetchall()
    assert [r[0] for r in stored] == payloads
    at = datetime.now(UTC) + timedelta(days=1)
    assert pgpool.enqueue_many(db, "k", [{}] * 3, run_at=at) == 3
    assert count(db, "run_at > now() + interval '23 hours'") == 3
    assert pgpool.enqueue_many(db, "k", []) == 0


def test_the_async_twins_enqueue_dedupe_and_copy_as_the_sync_ones(db, dsn):
    async def main() -> tuple[int | None, int]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            one = await pgpool.enqueue_async(conn, "k", {"a": 1}, unique_key="u")
            dup = await pgpool.enqueue_async(conn, "k", {"a": 1}, unique_key="u")
            assert dup is None
            many = await pgpool.enqueue_many_async(conn, "k", [{"b": i} for i in range(10)])
            await conn.commit()
        return one, many

    one, many = asyncio.run(main())
    assert isinstance(one, int) and many == 10
    assert count(db) == 11


# --- each installation has a channel of its own ----------------------------------------------


def test_installations_in_two_schemas_never_wake_each_other(db, dsn, other_dsn):
    with psycopg.connect(other_dsn, autocommit=True) as other:
        pgpool.migrate(other)
        ears, other_ears = listener(dsn), listener(other_dsn)
        # Each way a job is enqueued notifies: one row, and COPY.
        pgpool.enqueue(other, "k", {}, queue="other-one")
        pgpool.enqueue_many(other, "k", [{}], queue="other-many")
        pgpool.enqueue(db, "k", {}, queue="mine")
        # Notifications arrive in commit order: had the other schema's reached this
        # listener, they would come before this one.
        assert next_notification(ears) == "mine"
        assert [n.payload for n in other_ears.notifies(timeout=30, stop_after=2)] == [
            "other-one", "other-many"]


@pytest.mark.parametrize("name", ["s" * 63, 'Odd "Schema" é'],
                         ids=["longest-name", "quoted-name"])
def test_any_schema_name_gives_a_channel_that_works(server_dsn, name):
    # A channel name has at most 63 bytes and is an identifier: "pgpool." + 63 bytes is
    # too long, and the quotes must survive LISTEN.
    ident = pgsql.Identifier(name)
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(ident))
        try:
            conn.execute(pgsql.SQL("SET search_path = {}").format(ident))
            pgpool.migrate(conn)
            with psycopg.connect(server_dsn, autocommit=True) as ears:
                ears.execute(pgsql.SQL("SET search_path = {}").format(ident))
                ears.execute(listen_sql(ears))
                pgpool.enqueue(conn, "k", {}, queue="one")
                assert next_notification(ears) == "one"
                pgpool.enqueue_many(conn, "k", [{}], queue="many")
                assert next_notification(ears) == "many"
        finally:
            conn.execute(pgsql.SQL("DROP SCHEMA {} CASCADE").format(ident))


def test_an_installation_in_public_keeps_the_channel_older_dispatchers_listen_on(fresh_dsn):
    # During a rolling upgrade, dispatchers of an older pgpool LISTEN on "pgpool".
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        with psycopg.connect(fresh_dsn, autocommit=True) as old:
            old.execute("LISTEN pgpool")
            pgpool.enqueue(conn, "k", {}, queue="q")
            assert next_notification(old) == "q"
