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
        assert pgpool.migrate(conn) == list(range(1, pgpool.SCHEMA_VERSION + 1))
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
    assert sorted(results) == [[]] * 5 + [list(range(1, pgpool.SCHEMA_VERSION + 1))]


def test_migrate_upgrades_a_version_1_schema_keeping_its_jobs(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_1_schema(conn)
        job = pgpool.enqueue(conn, "record", {})
        assert schema.schema_version(conn) == 1
        assert pgpool.migrate(conn) == list(range(2, pgpool.SCHEMA_VERSION + 1))
        assert schema.schema_version(conn) == pgpool.SCHEMA_VERSION
        assert conn.execute("SELECT id FROM pgpool_jobs").fetchall() == [(job,)]
        assert conn.execute("SELECT count(*) FROM pgpool_hosts").fetchone() == (0,)


def make_version_2_schema(conn: psycopg.Connection) -> None:
    """pgpool's schema as version 2 left it: version 1, then migration 2 as it shipped."""
    make_version_1_schema(conn)
    conn.execute(schema.MIGRATIONS[1].ddl)
    conn.execute("INSERT INTO pgpool_schema_version (version, description) VALUES (2, %s)",
                 (schema.MIGRATIONS[1].description,))


# How a version-2 dispatcher beats: it knows nothing of the claim columns.
V2_HOST_UPSERT = """
INSERT INTO pgpool_hosts AS h (owner, hostname, pid, procs, queues, kinds, lease,
                               started_at, last_seen, jobs_done, jobs_failed)
VALUES (%s, 'old', 1, 2, '{default}', '{record}', 30, now(), now(), %s, 0)
ON CONFLICT (owner) DO UPDATE
SET last_seen = now(), jobs_done = excluded.jobs_done, jobs_failed = excluded.jobs_failed
"""


def test_migrate_upgrades_a_version_2_schema_in_place_keeping_hosts_and_jobs(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_2_schema(conn)
        job = pgpool.enqueue(conn, "record", {})
        conn.execute(V2_HOST_UPSERT, ("old:1:aa", 5))
        with pytest.raises(pgpool.SchemaError, match="run `pgpool migrate` to upgrade"):
            schema.check_version(schema.schema_version(conn))

        assert pgpool.migrate(conn) == list(range(3, pgpool.SCHEMA_VERSION + 1))
        schema.check_version(schema.schema_version(conn))
        assert conn.execute("SELECT id FROM pgpool_jobs").fetchall() == [(job,)]
        # The registered host keeps its row; what it never reported stays unknown (NULL).
        claims = ("SELECT owner, jobs_done, jobs_claimed, claims_per_sec, max_claims_per_sec "
                  "FROM pgpool_hosts")
        assert conn.execute(claims).fetchall() == [("old:1:aa", 5, 0, None, None)]
        # A version-2 dispatcher that was already running goes on beating after the upgrade.
        conn.execute(V2_HOST_UPSERT, ("old:1:aa", 6))
        conn.execute(V2_HOST_UPSERT, ("old:2:bb", 0))
        assert conn.execute(claims + " ORDER BY owner").fetchall() == [
            ("old:1:aa", 6, 0, None, None), ("old:2:bb", 0, 0, None, None)]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE pgpool_hosts SET max_claims_per_sec = 0")


def test_check_version_refuses_missing_older_and_newer():
    with pytest.raises(pgpool.SchemaError, match="pgpool migrate"):
        schema.check_version(None)
    with pytest.raises(pgpool.SchemaError, match="run `pgpool migrate` to upgrade"):
        schema.check_version(0)  # bookkeeping table present, migrations not applied
    needs = f"at version 2 but this pgpool needs {pgpool.SCHEMA_VERSION}"
    with pytest.raises(pgpool.SchemaError, match=needs):
        schema.check_version(2)
    with pytest.raises(pgpool.SchemaError, match="newer"):
        schema.check_version(pgpool.SCHEMA_VERSION + 1)
    schema.check_version(pgpool.SCHEMA_VERSION)
