"""``pgpool migrate`` names the pending migrations that need a drained fleet before it
starts them (issue 19, item 6), and says nothing of draining on a fresh install."""

from __future__ import annotations

import psycopg
import pytest
from commands import run_pgpool
from dbtools import make_version_1_schema

from pgpool.db import schema


@pytest.mark.own_schema
def test_migrate_says_which_pending_migrations_need_a_stopped_fleet_before_it_starts(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_1_schema(conn)
    done = run_pgpool(dsn, "migrate")
    assert done.returncode == 0, done.stderr
    heavy = [m for m in schema.MIGRATIONS if m.drain]
    assert [m.version for m in heavy] == [6, 9, 13, 19, 20, 23, 27]
    for m in heavy:
        assert f"pgpool: warning: migration {m.version} " in done.stderr
    assert "pgpool_jobs" in done.stderr
    assert "stop every `pgpool run` host" in done.stderr
    assert "schema migrated to version" in done.stdout
    # Nothing heavy left to apply: nothing said.
    again = run_pgpool(dsn, "migrate")
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_a_fresh_install_says_nothing_about_draining(dsn):
    done = run_pgpool(dsn, "migrate")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
