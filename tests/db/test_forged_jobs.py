"""The application role cannot forge jobs (issue 19, item 6): the states and columns only a
host or the owner writes are refused to it, while every option a producer sets still goes
in and the worker role runs what it enqueued; the tables' owner may still write any row."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from commands import RUN, run_pgpool
from dbtools import one
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from records import starts

import pgpool
from pgpool.sql import jobs as sql


@pytest.fixture
def roles(db: psycopg.Connection, dsn: str) -> Iterator[tuple[str, str]]:
    """DSNs of an application role and a worker role granted by `pgpool grants`."""
    names = (f"pgpool_app_{uuid.uuid4().hex[:8]}", f"pgpool_worker_{uuid.uuid4().hex[:8]}")
    for name in names:
        db.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(name)))
    applied = run_pgpool(dsn, "grants", "--app", names[0], "--worker", names[1], "--apply")
    assert applied.returncode == 0, applied.stderr
    yield tuple(make_conninfo(dsn, user=name) for name in names)
    for name in names:
        db.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(name)))
        db.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)))


#: Rows the application role must not write: running (its key blocked, no lease for the
#: reaper), done or parked jobs, and any column only a dispatcher or the owner sets.
FORGED_STATES = (
    "INSERT INTO pgpool_jobs (kind, payload, state, concurrency_key) "
    "VALUES ('record', '{}', 'running', 'k')",
    "INSERT INTO pgpool_jobs (kind, payload, state, unique_key) "
    "VALUES ('record', '{}', 'done', 'u')",
    "INSERT INTO pgpool_jobs (kind, payload, state) VALUES ('record', '{}', 'parked')",
)
FORGED_COLUMNS = (
    "INSERT INTO pgpool_jobs (kind, payload, locked_by) VALUES ('record', '{}', 'host:1:aa')",
    "INSERT INTO pgpool_jobs (kind, payload, lease_until) VALUES ('record', '{}', now())",
    "INSERT INTO pgpool_jobs (kind, payload, attempts) VALUES ('record', '{}', 7)",
    "INSERT INTO pgpool_jobs (kind, payload, last_error) VALUES ('record', '{}', 'x')",
    "INSERT INTO pgpool_jobs (id, kind, payload) OVERRIDING SYSTEM VALUE "
    "VALUES (424242, 'record', '{}')",
)


def refusals(conn: psycopg.Connection, statements: tuple[str, ...]) -> list[str]:
    """The SQLSTATE each statement failed with (each rolled back), None if it worked."""
    out = []
    for statement in statements:
        try:
            with conn.transaction():
                conn.execute(statement)
            out.append(None)
        except psycopg.Error as exc:
            out.append(exc.sqlstate)
    return out


@pytest.mark.own_schema
def test_the_app_role_cannot_forge_jobs_and_enqueues_with_every_option(
        db, dsn, roles, record_dir):
    app_dsn, worker_dsn = roles
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    with psycopg.connect(app_dsn, autocommit=True) as conn:
        assert refusals(conn, FORGED_STATES) == ["23514"] * len(FORGED_STATES)
        assert refusals(conn, FORGED_COLUMNS) == ["42501"] * len(FORGED_COLUMNS)
        with pytest.raises(psycopg.errors.CheckViolation), conn.transaction(), \
                conn.cursor() as cur, cur.copy(sql.COPY_JOBS_AT) as copy:
            copy.write_row(("default", "record", "{}", 0, None, "", None, past, "running"))
        # Everything a producer sets still goes in.
        options = {"queue": "default", "priority": 3, "unique_key": "u", "max_attempts": 2,
                   "tenant": "t", "concurrency_key": "k1"}
        jobs = [pgpool.enqueue(conn, "record", {"n": 1}, **options),
                pgpool.enqueue(conn, "record", {"n": 2}, delay=0.0, tenant="t2"),
                pgpool.enqueue(conn, "record", {"n": 3}, run_at=past)]
        pgpool.enqueue_many(conn, "record", [{"n": 4}, {"n": 5}], priority=1, max_attempts=3,
                            tenant="t3", concurrency_key="k2")
        pgpool.enqueue_many(conn, "record", [{"n": 6}], run_at=past)
    assert None not in jobs
    done = run_pgpool(app_dsn, "enqueue", "record", "{}", "--unique-key", "v", "--tenant", "t4",
                      "--priority", "2", "--max-attempts", "4")
    assert done.returncode == 0, done.stderr
    assert one(db, "SELECT count(*), count(*) FILTER (WHERE state IN ('ready', 'scheduled')) "
                   "FROM pgpool_jobs") == (7, 7)
    # The worker role stages the scheduled ones and runs them all.
    ran = run_pgpool(worker_dsn, *RUN, "--burst", record_dir=record_dir)
    assert ran.returncode == 0, ran.stderr
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
    assert len(starts(record_dir)) == 7


def test_the_owner_may_still_write_any_row(db):
    # Repairs and tests: the table's owner is not held to the producer's rows.
    db.execute("INSERT INTO pgpool_jobs (kind, payload, state, last_error) "
               "VALUES ('record', '{}', 'parked', 'by hand')")
