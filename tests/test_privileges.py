"""Running under a least-privilege role: the table owner migrates, a role that can only
read and write pgpool's tables enqueues and runs jobs."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from conftest import run_pgpool
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgpool

# The grants the README documents for a dispatcher or producer role.
GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON pgpool_schema_version TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {role};
"""


def test_dispatcher_and_producer_need_only_table_privileges(db, dsn, record_dir):
    role = f"pgpool_app_{uuid.uuid4().hex[:8]}"
    schema = db.execute("SELECT current_schema()").fetchone()[0]
    tables = [r[0] for r in db.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
        "AND tablename LIKE 'pgpool%%' AND tablename <> 'pgpool_schema_version'")]
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        db.execute(sql.SQL(GRANTS).format(
            schema=sql.Identifier(schema), role=sql.Identifier(role),
            tables=sql.SQL(", ").join(map(sql.Identifier, tables))))
        limited = make_conninfo(dsn, user=role)
        assert conninfo_to_dict(limited)["user"] == role

        with psycopg.connect(limited, autocommit=True) as conn:
            pgpool.enqueue_many(conn, "record", [{"n": i} for i in range(20)])
            pgpool.enqueue(conn, "record", {"n": 20}, unique_key="k")
            # No DDL for this role: it cannot create tables in pgpool's schema.
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE TABLE pgpool_intruder (x int)")

        current = run_pgpool(limited, "migrate")
        assert current.returncode == 0, current.stderr
        assert "already at version" in current.stdout
        done = run_pgpool(limited, "run", "--handlers", "testjobs", "--burst",
                          record_dir=record_dir)
        assert done.returncode == 0, done.stderr
        assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
        # In an empty schema the same role cannot create pgpool's tables: a clear refusal.
        empty = f"t_empty_{uuid.uuid4().hex[:8]}"
        db.execute(sql.SQL("CREATE SCHEMA {s}; GRANT USAGE ON SCHEMA {s} TO {r}").format(
            s=sql.Identifier(empty), r=sql.Identifier(role)))
        refused = run_pgpool(make_conninfo(limited, options=f"-c search_path={empty}"),
                             "migrate")
        assert refused.returncode == 2
        assert refused.stderr.startswith("pgpool: error: the database refused: permission")
        db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(empty)))
    finally:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
