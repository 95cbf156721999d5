"""pgpool.contrib.sqlalchemy: jobs enqueued on a SQLAlchemy session's own connection commit
and roll back with its transaction, sync and async, on real PostgreSQL, through psycopg 3
(pgpool.enqueue itself) and through psycopg2 and asyncpg (the SQL function)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, run_bench_script
from dbtools import listen_sql
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Integer, create_engine, select, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

import pgpool
from pgpool.contrib import sqlalchemy as pgsa


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


@dataclass
class Resize:
    image_id: int
    width: int


@pgpool.handler("sqla.resize", queue="images", priority=2)
def resize(payload: Resize) -> None:
    pass


def url_and_args(dsn: str, driver: str = "psycopg") -> tuple[URL, dict[str, Any]]:
    """A SQLAlchemy URL for the server of ``dsn``, and the ``connect_args`` that keep its
    ``options`` (the search_path leading to the test's installation)."""
    params = conninfo_to_dict(dsn)
    url = URL.create(f"postgresql+{driver}", username=params.get("user"),
                     password=params.get("password"), database=params.get("dbname"),
                     query={"host": params["host"], "port": str(params.get("port", 5432))})
    options = params.get("options", "")
    if driver != "asyncpg":
        return url, {"options": options}
    # asyncpg takes the "-c name=value" settings as a dict.
    settings = dict(s.removeprefix("-c").partition("=")[::2]
                    for s in options.replace("-c ", "-c").split())
    return url, {"server_settings": settings}


#: The sync drivers: psycopg 3 (pgpool.enqueue's own statements) and psycopg2 (the SQL
#: function pgpool_enqueue).
SYNC_DRIVERS = ["psycopg", "psycopg2"]


@pytest.fixture(params=SYNC_DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def engine(dsn: str, driver: str = "psycopg") -> Engine:
    url, args = url_and_args(dsn, driver)
    return create_engine(url, connect_args=args)


def async_engine(dsn: str, driver: str = "psycopg") -> AsyncEngine:
    url, args = url_and_args(dsn, driver)
    return create_async_engine(url, connect_args=args)


def jobs(db: psycopg.Connection) -> list[dict[str, Any]]:
    cur = db.execute("SELECT kind, queue, payload, priority, state, max_attempts, unique_key,"
                     " tenant, concurrency_key, run_at FROM pgpool_jobs ORDER BY id")
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


OPTIONS: dict[str, Any] = {"queue": "mail", "priority": 7, "delay": 3600,
                           "unique_key": "welcome-1", "max_attempts": 3, "tenant": "acme",
                           "concurrency_key": "user-1"}


def assert_has_every_option(job: dict[str, Any]) -> None:
    assert job["kind"] == "welcome" and job["payload"] == {"user": 1}
    assert (job["queue"], job["priority"], job["state"], job["max_attempts"]) == \
        ("mail", 7, "scheduled", 3)
    assert (job["unique_key"], job["tenant"], job["concurrency_key"]) == \
        ("welcome-1", "acme", "user-1")
    assert job["run_at"] > datetime.now(UTC) + timedelta(minutes=50)


@pytest.mark.own_schema
def test_a_session_job_rolls_back_and_commits_with_the_sessions_rows(db, dsn, driver):
    eng = engine(dsn, driver)
    Base.metadata.create_all(eng)
    try:
        with Session(eng) as session:
            session.add(Order(id=1))
            assert isinstance(pgsa.enqueue(session, "welcome", {"user": 1}), int)
            session.rollback()
        assert jobs(db) == []
        with Session(eng) as session:
            session.add(Order(id=2))
            session.flush()
            job_id = pgsa.enqueue(session, "welcome", {"user": 1}, **OPTIONS)
            assert pgsa.enqueue(session, "welcome", {"user": 1}, **OPTIONS) is None  # dup
            assert jobs(db) == []  # not before commit
            session.commit()
        [job] = jobs(db)
        assert_has_every_option(job)
        assert db.execute("SELECT id FROM pgpool_jobs").fetchone() == (job_id,)
        assert db.execute("SELECT id FROM orders").fetchall() == [(2,)]
        at = datetime.now(UTC) + timedelta(days=1)
        with Session(eng) as session:
            later = pgsa.enqueue(session, "later", {}, run_at=at)
            session.commit()
        assert db.execute("SELECT run_at, state FROM pgpool_jobs WHERE id = %s",
                          (later,)).fetchone() == (at, "scheduled")
    finally:
        eng.dispose()


def test_on_a_connection_the_job_commits_with_its_commit_which_wakes_its_queue(db, dsn, driver):
    eng = engine(dsn, driver)
    ears = psycopg.connect(dsn, autocommit=True)
    ears.execute(listen_sql(ears))
    try:
        with eng.connect() as conn:  # nothing executed yet: no transaction begun
            pgsa.enqueue(conn, "k", {"a": 1}, queue="q1")
            conn.commit()
        assert next(ears.notifies(timeout=30, stop_after=1)).payload == "q1"
        with eng.connect() as conn:
            pgsa.enqueue(conn, "k", {"a": 2})  # closed without commit: rolled back
        with eng.begin() as conn:
            pgsa.enqueue(conn, "k", {"a": 3})
    finally:
        eng.dispose()
        ears.close()
    assert [j["payload"] for j in jobs(db)] == [{"a": 1}, {"a": 3}]


@pytest.mark.own_schema
@pytest.mark.parametrize("async_driver", ["psycopg", "asyncpg"])
def test_an_async_session_job_rolls_back_and_commits_with_the_sessions_rows(db, dsn,
                                                                           async_driver):
    async def main() -> int | None:
        eng = async_engine(dsn, async_driver)
        try:
            async with eng.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            async with AsyncSession(eng) as session:
                session.add(Order(id=1))
                await pgsa.enqueue_async(session, "welcome", {"user": 1})
                await session.rollback()
            assert jobs(db) == []
            async with AsyncSession(eng) as session:
                session.add(Order(id=2))
                job_id = await pgsa.enqueue_async(session, "welcome", {"user": 1}, **OPTIONS)
                assert await pgsa.enqueue_async(session, "welcome", {}, **OPTIONS) is None
                assert await pgsa.enqueue_many_async(session, "bulk", [{"n": 1}, {"n": 2}]) \
                    == 2
                await session.commit()
            async with eng.connect() as conn:
                await pgsa.enqueue_async(conn, resize, Resize(5, 100))
                await conn.commit()
            return job_id
        finally:
            await eng.dispose()

    job_id = asyncio.run(main())
    first, *bulk, typed = jobs(db)
    assert_has_every_option(first)
    assert db.execute("SELECT min(id) FROM pgpool_jobs").fetchone() == (job_id,)
    assert [j["payload"] for j in bulk] == [{"n": 1}, {"n": 2}]
    assert (typed["kind"], typed["queue"], typed["payload"]) == \
        ("sqla.resize", "images", {"image_id": 5, "width": 100})
    assert db.execute("SELECT id FROM orders").fetchall() == [(2,)]


def test_enqueue_many_inserts_in_the_sessions_transaction(db, dsn, driver):
    eng = engine(dsn, driver)
    payloads = [{"n": i, "text": 'quote " back\\slash'} for i in range(300)]
    try:
        with Session(eng) as session:
            assert pgsa.enqueue_many(session, "k", payloads, priority=3) == 300
            session.rollback()
        assert jobs(db) == []
        with Session(eng) as session:
            assert pgsa.enqueue_many(session, "k", iter(payloads), queue="bulk",
                                     tenant="t1") == 300
            session.commit()
    finally:
        eng.dispose()
    stored = jobs(db)
    assert [j["payload"] for j in stored] == payloads
    assert {(j["queue"], j["tenant"], j["priority"]) for j in stored} == {("bulk", "t1", 0)}


def test_a_bad_payload_raises_and_leaves_the_transaction_usable(db, dsn, driver):
    eng = engine(dsn, driver)
    try:
        with Session(eng) as session:
            pgsa.enqueue(session, "k", {"kept": 1})
            with pytest.raises(pgpool.PayloadError, match="not JSON-serialisable"):
                pgsa.enqueue(session, "k", {"bad": object()})
            with pytest.raises(pgpool.PayloadError, match="payload #1 "):
                pgsa.enqueue_many(session, "k", [{"ok": 1}, {"bad": float("nan")}])
            with pytest.raises(pgpool.PayloadError, match="field 'width'"):
                pgsa.enqueue(session, resize, {"image_id": 1, "width": "wide"})
            assert session.execute(select(text("1"))).scalar() == 1
            session.commit()
    finally:
        eng.dispose()
    assert [j["payload"] for j in jobs(db)] == [{"kept": 1}]


def test_a_savepoint_rolled_back_takes_its_jobs_only(db, dsn, driver):
    eng = engine(dsn, driver)
    try:
        with Session(eng) as session:
            pgsa.enqueue(session, "k", {"outer": 1})
            nested = session.begin_nested()
            pgsa.enqueue(session, "k", {"inner": 1})
            pgsa.enqueue_many(session, "k", [{"inner": 2}])
            nested.rollback()
            with session.begin_nested():
                pgsa.enqueue_many(session, "k", [{"kept": 2}])
            session.commit()
    finally:
        eng.dispose()
    assert [j["payload"] for j in jobs(db)] == [{"outer": 1}, {"kept": 2}]


def test_a_handler_in_place_of_the_kind_applies_its_defaults_and_type(db, dsn, driver):
    eng = engine(dsn, driver)
    try:
        with Session(eng) as session:
            pgsa.enqueue(session, resize, Resize(1, 64))
            pgsa.enqueue(session, resize, {"image_id": 2, "width": 32}, priority=9)
            session.commit()
        scoped = scoped_session(sessionmaker(eng))
        assert pgsa.enqueue_many(scoped, resize, [Resize(3, 16)]) == 1
        scoped.commit()
        scoped.remove()
    finally:
        eng.dispose()
    assert [(j["kind"], j["queue"], j["priority"], j["payload"]) for j in jobs(db)] == [
        ("sqla.resize", "images", 2, {"image_id": 1, "width": 64}),
        ("sqla.resize", "images", 9, {"image_id": 2, "width": 32}),
        ("sqla.resize", "images", 2, {"image_id": 3, "width": 16}),
    ]


def test_the_wrong_kind_of_session_or_driver_is_named_in_one_line(db, dsn):
    eng = engine(dsn)
    try:
        with Session(eng) as session, pytest.raises(pgpool.ConfigError) as caught:
            asyncio.run(pgsa.enqueue_async(session, "k", {}))  # type: ignore[arg-type]
        assert str(caught.value) == ("Session is not async: call "
                                     "pgpool.contrib.sqlalchemy.enqueue (or enqueue_many) "
                                     "instead")
    finally:
        eng.dispose()
    lite = create_engine("sqlite://")
    with Session(lite) as session, pytest.raises(pgpool.ConfigError) as caught:
        pgsa.enqueue(session, "k", {})
    assert str(caught.value) == (
        "pgpool's jobs live in PostgreSQL, and this engine is sqlite+pysqlite: enqueue on a "
        "session of the PostgreSQL database that holds pgpool's tables")
    # Where the SQL function is not (pgpool not installed on the search_path), the error
    # says to migrate, as pgpool.enqueue's does for missing tables.
    url, _ = url_and_args(dsn, "psycopg2")
    elsewhere = create_engine(url, connect_args={"options": "-c search_path=pg_catalog"})
    try:
        with Session(elsewhere) as session, pytest.raises(pgpool.SchemaError,
                                                          match="run `pgpool migrate`"):
            pgsa.enqueue(session, "k", {})
    finally:
        elsewhere.dispose()
    with pytest.raises(pgpool.ConfigError, match="takes a SQLAlchemy Session"):
        pgsa.enqueue(object(), "k", {})  # type: ignore[arg-type]
    assert jobs(db) == []  # no refused call left a job behind


def test_the_driver_bench_measures_both_drivers_and_leaves_nothing(db, dsn):
    result = run_bench_script("enqueue_drivers.py", dsn, "--enqueues", "100", "--many",
                              "1000", "--rounds", "1", "--json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["best"]
    for driver in SYNC_DRIVERS:
        assert best[driver]["enqueue_us"] > 0 and best[driver]["many_1000"] > 0
    assert db.execute(BENCH_SCHEMAS).fetchall() == []
