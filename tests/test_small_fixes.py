"""Issue 19, item 6: a cancelled running job holds its keys until its attempt is over;
`cancel` refuses a job kept as done; a cancel committed out of order is noticed at once;
the application role cannot forge jobs; `pgpool migrate` names the migrations that need a
drained fleet before it starts. Real PostgreSQL, real `pgpool` processes."""

from __future__ import annotations

import datetime as dt
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import (
    RUN,
    alive,
    assert_user_error,
    in_registry,
    make_version_1_schema,
    one,
    read_records,
    run_pgpool,
    start_pgpool,
    wait_until,
)
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool import ops
from pgpool.db import schema
from pgpool.host.claimer import Claimer
from pgpool.host.lease import Lease
from pgpool.host.parts.reaper import Reaper
from pgpool.registry import Handler
from pgpool.sql import jobs as sql


def starts(record_dir: Path) -> dict[int, list[int]]:
    """Worker pids by job id, one per recorded start (tests/testjobs.py)."""
    out: dict[int, list[int]] = {}
    for job_id, _, pid, what in read_records(record_dir):
        if what == "start":
            out.setdefault(job_id, []).append(pid)
    return out


def claimer(pool: AsyncConnectionPool, owner: str) -> Claimer:
    return Claimer(pool, owner, queues=("default",),
                   handlers={"record": Handler("record", print, None, None)},
                   lease=Lease(30), max_attempts=5, timeout=None, tenant_cap=None)


def claim(dsn: str, owner: str) -> list[int]:
    return [j.id for j in in_registry(dsn, lambda pool: claimer(pool, owner).claim(10))]


# --- a cancelled running job holds its keys until its attempt is over ---------------------


def test_a_cancelled_attempt_holds_its_keys_until_its_lease_ends_then_is_dead_as_cancelled(
        db, dsn):
    first = pgpool.enqueue(db, "record", {}, concurrency_key="k", unique_key="u")
    second = pgpool.enqueue(db, "record", {}, concurrency_key="k")
    assert claim(dsn, "host-a") == [first]
    (cancelled,) = ops.cancel(db, [first])
    assert (cancelled.id, cancelled.was, cancelled.owner) == (first, "running", "host-a")

    # host-a's attempt may still run (until its lease ends): its keys stay taken.
    assert claim(dsn, "host-b") == []
    assert pgpool.enqueue(db, "record", {}, unique_key="u") is None
    # Its host finds it lost at its next beat (and kills the worker); its ack changes
    # nothing; a second cancel says what is going on.
    beat = {"ids": f"{{{first}}}", "attempts": "{1}", "started": "{t}", "owner": "host-a",
            "lease": 30}
    assert db.execute(sql.HEARTBEAT, beat).fetchall() == []
    with pytest.raises(ops.JobNotFound, match=f"job {first} is already cancelled"):
        ops.cancel(db, [first])
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)

    # Its lease ends (as if 30 s passed): the reaper buries it as cancelled, though it had
    # attempts left, with the cancel's trace; then the key is free.
    db.execute("UPDATE pgpool_jobs SET lease_until = now() - interval '1 second' "
               "WHERE id = %s", (first,))
    assert in_registry(dsn, lambda pool: Reaper(pool, 1).reap()) == (0, 1)
    reason, error = one(db, "SELECT reason, last_error FROM pgpool_dead WHERE id = %s", first)
    assert reason == "cancelled"
    assert error.startswith("cancelled by operator at ")
    assert error.endswith(" while running attempt 1 on host-a")
    assert claim(dsn, "host-b") == [second]


@pytest.mark.soak  # long: the soak tier, which CI runs after make test
def test_a_second_job_of_the_key_waits_while_the_cancelled_attempt_may_still_run(
        db, dsn, record_dir):
    # host-a runs the first job of key k, then freezes (SIGSTOP): it cannot stop that
    # worker, which runs on until its lease fence, 0.9 of a lease after the last
    # extension. host-b has the second job of k to run, and must not start it before the
    # first attempt is over.
    first = pgpool.enqueue(db, "record", {"sleep": 120}, concurrency_key="k")
    a = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "10", record_dir=record_dir)
    (pid,) = wait_until(lambda: starts(record_dir).get(first), "the first job to start")
    second = pgpool.enqueue(db, "record", {}, concurrency_key="k")
    b = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "3", "--poll", "0.5",
                     record_dir=record_dir)
    b.event("started")
    a.send_signal(signal.SIGSTOP)
    try:
        ops.cancel(db, [first])
        wait_until(lambda: starts(record_dir).get(second), "the second job to start",
                   timeout=60)
        assert not alive(pid), "the second job started while the cancelled one still ran"
        assert one(db, "SELECT reason FROM pgpool_dead WHERE id = %s", first) == ("cancelled",)
    finally:
        a.send_signal(signal.SIGCONT)
    assert starts(record_dir)[first] == [pid]  # never run again
    assert a.stop() == 0
    assert b.stop() == 0


# --- cancel refuses a job kept as done ----------------------------------------------------


def test_cancel_refuses_a_job_kept_as_done_and_changes_nothing(db, dsn):
    # What pgpool.host.isolate leaves when the database refuses to delete a succeeded job.
    kept = pgpool.enqueue(db, "record", {})
    waiting = pgpool.enqueue(db, "record", {})
    db.execute("UPDATE pgpool_jobs SET state = 'done', attempts = 1, last_error = 'refused' "
               "WHERE id = %s", (kept,))
    with pytest.raises(ops.JobNotFound, match=f"job {kept} succeeded"):
        ops.cancel(db, [waiting, kept])
    assert_user_error(run_pgpool(dsn, "cancel", str(kept)),
                      f"job {kept} succeeded (kept as done", "nothing to cancel",
                      "nothing was changed")
    assert dict(db.execute("SELECT id, state FROM pgpool_jobs")) == {
        kept: "done", waiting: "ready"}
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)


# --- a cancel committed out of order is noticed at once -----------------------------------


def test_a_cancel_committed_out_of_order_stops_its_worker_at_once(db, dsn, record_dir):
    # A 60 s lease: regular heartbeats 20 s apart, so only the cancel's notification (or
    # the 5 s poll) can stop a worker within the bound below.
    early, late = (pgpool.enqueue(db, "record", {"sleep": 120}) for _ in range(2))
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--batch", "1", "--lease", "60",
                        "--poll", "5", record_dir=record_dir)
    pids = wait_until(lambda: len(starts(record_dir)) == 2 and starts(record_dir),
                      "both jobs to start")
    # An application transaction starts (its now() is fixed from here on)...
    with psycopg.connect(dsn) as app:
        app.execute("SELECT 1")
        # ...meanwhile another cancel commits; the host beats at once and stops that job.
        ops.cancel(db, [late])
        wait_until(lambda: not alive(pids[late][0]), "the first cancelled worker to die",
                   timeout=10)
        # The application's cancel commits after it, dated earlier.
        ops.cancel(app, [early])
        app.commit()
    wait_until(lambda: not alive(pids[early][0]),
               "the worker of the cancel committed second to die", timeout=10)
    assert host.stop() == 0


# --- the application role cannot forge jobs -----------------------------------------------


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


# --- pgpool migrate names the migrations that need a drained fleet ------------------------


@pytest.mark.own_schema
def test_migrate_says_which_pending_migrations_need_a_stopped_fleet_before_it_starts(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_1_schema(conn)
    done = run_pgpool(dsn, "migrate")
    assert done.returncode == 0, done.stderr
    heavy = [m for m in schema.MIGRATIONS if m.drain]
    assert [m.version for m in heavy] == [6, 9, 13, 19]
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
