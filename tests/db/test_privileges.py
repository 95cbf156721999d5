"""Least-privilege roles: the tables' owner migrates and applies `pgpool grants`; the
application role enqueues and reads; the worker role runs dispatchers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from commands import assert_user_error, run_pgpool, status_json
from dbtools import as_role, one
from horizon_holds import hold_horizon
from places import ROOT
from processes import start_pgpool
from psycopg import sql
from psycopg.conninfo import make_conninfo
from waits import wait_until

import pgpool

#: The page that quotes `pgpool grants` output.
SECURITY_PAGE = ROOT / "docs" / "guides" / "security.md"

#: What neither role may do: change the schema, or write the fleet's budget.
FORBIDDEN_TO_BOTH = (
    "CREATE TABLE pgpool_intruder (x int)",
    "UPDATE pgpool_fleet SET max_claims_per_sec = 1",
)
#: What the application role may not do on top: write the host registry (a fake fresh
#: row there takes budget shares), or change jobs once enqueued.
FORBIDDEN_TO_APP = (
    "INSERT INTO pgpool_hosts (owner, hostname, pid, procs, queues, kinds, lease) "
    "VALUES ('fake:1:aa', 'fake', 1, 1, '{default}', '{record}', 30)",
    "UPDATE pgpool_hosts SET last_seen = now()",
    "DELETE FROM pgpool_hosts",
    "UPDATE pgpool_jobs SET priority = 1",
    "DELETE FROM pgpool_jobs",
    "DELETE FROM pgpool_dead",
)


@pytest.fixture
def roles(db: psycopg.Connection) -> Iterator[tuple[str, str]]:
    """An application role and a worker role, with LOGIN and nothing else."""
    names = (f"pgpool_app_{uuid.uuid4().hex[:8]}", f"pgpool_worker_{uuid.uuid4().hex[:8]}")
    for name in names:
        db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    yield names
    for name in names:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def refused(conn: psycopg.Connection, statements: tuple[str, ...]) -> list[str]:
    """The statements the database refused for lack of privilege (each rolled back)."""
    out = []
    for statement in statements:
        try:
            with conn.transaction():
                conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege:
            out.append(statement)
    return out


def test_the_security_page_quotes_the_grants_pgpool_prints(dsn):
    done = run_pgpool(dsn, "grants", "--app", "pgpool_app", "--worker", "pgpool_worker",
                      "--schema", "app")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('REVOKE ALL ON "app"."pgpool_jobs"'), done.stdout
    # Whole, as one block of output on the page.
    assert f"```text\n{done.stdout}```\n" in SECURITY_PAGE.read_text()


@pytest.mark.own_schema
def test_the_app_role_enqueues_and_reads_and_the_worker_role_runs(db, dsn, roles,
                                                                   record_dir):
    app, worker = roles
    applied = run_pgpool(dsn, "grants", "--app", app, "--worker", worker, "--apply")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.startswith(f"pgpool: granted the application role {app} and the "
                                     f"worker role {worker}"), applied.stdout
    # Applying again (or over broader grants) leaves exactly the same.
    assert run_pgpool(dsn, "grants", "--app", app, "--worker", worker,
                      "--apply").returncode == 0
    app_dsn, worker_dsn = as_role(dsn, app), as_role(dsn, worker)

    with psycopg.connect(app_dsn, autocommit=True) as conn:
        pgpool.enqueue_many(conn, "record", [{"n": i} for i in range(20)])
        pgpool.enqueue(conn, "record", {"n": 20}, unique_key="k")
        assert pgpool.enqueue(conn, "record", {"n": 21}, unique_key="k") is None
        pgpool.enqueue(conn, "fail", {}, max_attempts=1)
        assert refused(conn, FORBIDDEN_TO_BOTH + FORBIDDEN_TO_APP) == list(
            FORBIDDEN_TO_BOTH + FORBIDDEN_TO_APP)
    enqueued = run_pgpool(app_dsn, "enqueue", "record", "{}")
    assert enqueued.returncode == 0, enqueued.stderr
    assert [q["ready"] for q in status_json(app_dsn)["queues"]] == [23]
    # Other roles' sessions are hidden from it (no pg_read_all_stats), one holding back
    # vacuum too: its status counts them and names the grant.
    with hold_horizon(dsn, "snapshot") as holder:
        horizon = status_json(app_dsn)["horizon"]
        assert horizon["hidden_sessions"] >= 1
        assert all(h["pid"] != holder.info.backend_pid for h in horizon["holders"])
        assert "grant pg_read_all_stats to see it" in run_pgpool(app_dsn, "status").stdout
    assert_user_error(run_pgpool(app_dsn, "budget", "set", "5"),
                      "may not change the fleet's budget")

    with psycopg.connect(worker_dsn, autocommit=True) as conn:
        # It may enqueue (periodic schedules' ticks), not change the schema or budget.
        assert refused(conn, FORBIDDEN_TO_BOTH) == list(FORBIDDEN_TO_BOTH)
    current = run_pgpool(worker_dsn, "migrate")
    assert current.returncode == 0, current.stderr
    assert "already at version" in current.stdout
    # --fair-by cpu: it records its attempts' CPU time too (23 attempts, no tenant).
    done = run_pgpool(worker_dsn, "run", "--handlers", "testjobs", "--burst",
                      "--fair-by", "cpu", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
    assert one(db, "SELECT tenant, sum(attempts)::int FROM pgpool_tenant_cpu "
                   "GROUP BY tenant") == ("", 23)
    assert one(db, "SELECT kind FROM pgpool_dead") == ("fail",)  # dead letters written
    assert_user_error(run_pgpool(worker_dsn, "budget", "set", "5"),
                      "may not change the fleet's budget")

    # Neither can apply grants; and in an empty schema the worker cannot create pgpool's
    # tables: clear refusals.
    assert_user_error(run_pgpool(app_dsn, "grants", "--app", app, "--apply"),
                      "the database refused", "as the owner of pgpool's tables")
    empty = f"t_empty_{uuid.uuid4().hex[:8]}"
    db.execute(sql.SQL("CREATE SCHEMA {s}; GRANT USAGE ON SCHEMA {s} TO {r}").format(
        s=sql.Identifier(empty), r=sql.Identifier(worker)))
    try:
        refusal = run_pgpool(make_conninfo(worker_dsn, options=f"-c search_path={empty}"),
                             "migrate")
        assert refusal.returncode == 2
        assert refusal.stderr.startswith("pgpool: error: the database refused: permission")
    finally:
        db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(empty)))


def test_grants_user_errors(db, dsn):
    assert_user_error(run_pgpool(dsn, "grants"), "--app ROLE, --worker ROLE or both")
    assert_user_error(run_pgpool(dsn, "grants", "--worker", "no_such_role_x", "--apply"),
                      "no_such_role_x", "does not exist", "create the role first")


@pytest.mark.own_schema
def test_the_worker_role_runs_periodic_schedules(db, dsn, roles):
    _, worker = roles
    applied = run_pgpool(dsn, "grants", "--worker", worker, "--apply")
    assert applied.returncode == 0, applied.stderr
    host = start_pgpool(as_role(dsn, worker), "run", "--handlers", "testperiodic",
                        "--procs", "1")
    host.event("started")
    # Ticks every second; 20 s is a generous bound on a loaded machine.
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs WHERE queue = 'ticks'")[0],
               "a tick enqueued under the worker role", timeout=20)
    assert host.stop() == 0
    # No part failed: not the schedules, nor dead-letter retention (its purge once took a
    # row lock the worker role may not take).
    assert host.events("failing") == [], host.stderr
