"""Migrations: versioned, idempotent, safe to run from many hosts at once."""

from __future__ import annotations

import threading

import psycopg
import pytest
from conftest import make_version_1_schema

import pgpool
from pgpool import schema


def test_migrate_creates_schema_records_version_and_is_idempotent(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert schema.schema_version(conn) is None
        assert pgpool.migrate(conn) == [1, 2]
        assert pgpool.migrate(conn) == []
        assert schema.schema_version(conn) == pgpool.SCHEMA_VERSION
        options = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'pgpool_jobs' "
            "AND relnamespace = current_schema()::regnamespace").fetchone()[0]
        assert "fillfactor=80" in options


def test_concurrent_migrations_apply_once(dsn):
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                results.append(pgpool.migrate(conn))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == [[], [], [], [], [], [1, 2]]


def test_migrate_upgrades_a_version_1_schema_keeping_its_jobs(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_1_schema(conn)
        job = pgpool.enqueue(conn, "record", {})
        assert schema.schema_version(conn) == 1
        assert pgpool.migrate(conn) == [2]
        assert schema.schema_version(conn) == pgpool.SCHEMA_VERSION == 2
        assert conn.execute("SELECT id FROM pgpool_jobs").fetchall() == [(job,)]
        assert conn.execute("SELECT count(*) FROM pgpool_hosts").fetchone() == (0,)


def test_check_version_refuses_missing_older_and_newer():
    with pytest.raises(pgpool.SchemaError, match="pgpool migrate"):
        schema.check_version(None)
    with pytest.raises(pgpool.SchemaError, match="run `pgpool migrate` to upgrade"):
        schema.check_version(0)  # bookkeeping table present, migrations not applied
    with pytest.raises(pgpool.SchemaError, match="newer"):
        schema.check_version(pgpool.SCHEMA_VERSION + 1)
    schema.check_version(pgpool.SCHEMA_VERSION)
