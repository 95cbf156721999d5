"""A row the database refuses to ack or reap never blocks the others (`pgpool.host.isolate`).

The isolating component on its own, against real PostgreSQL errors; then real `pgpool run`
processes facing an application's foreign key to a job, an application transaction holding
``FOR KEY SHARE`` on a job row, and triggers that raise for one job; and the reaper facing
expired jobs it cannot return.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from claims import reaper_passes, record_claimer
from commands import JSON_LOGS, RUN, run_pgpool, status_json
from dbtools import one, with_options
from jsonlogs import only_event
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool
from records import read_records
from waits import wait_until

import pgpool
from pgpool.host.claimer import configure_connection
from pgpool.host.completer import LOCK_RETRIES, Ack, Completer
from pgpool.host.isolate import Interrupted, isolate, row_error, timed_out, transient
from pgpool.host.lease import Lease
from pgpool.host.parts.reaper import LOCK_RETRIES as REAPER_LOCK_RETRIES
from pgpool.host.parts.reaper import Reaper

# --- the component ------------------------------------------------------------------------

#: Items 13 and 37 are refused: one by a CHECK constraint, one by a trigger.
ITEMS = list(range(50))
ITEMS_TABLE = """
CREATE TABLE items (n int PRIMARY KEY CHECK (n <> 13));
CREATE FUNCTION refuse_37() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.n = 37 THEN RAISE EXCEPTION 'item 37 refused'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_37 BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION refuse_37();
"""


def inserter(conn: psycopg.AsyncConnection, calls: list[list[int]]
             ) -> Callable[[list[int]], Any]:
    """A ``write`` that inserts its items in one statement and records each call."""
    async def write(part: list[int]) -> int:
        calls.append(part)
        cur = await conn.execute("INSERT INTO items SELECT unnest(%s::int[])", (part,))
        return cur.rowcount

    return write


def stored(db: psycopg.Connection) -> list[int]:
    return [n for n, in db.execute("SELECT n FROM items ORDER BY n").fetchall()]


@pytest.mark.own_schema
def test_isolate_commits_every_item_but_the_ones_the_database_refuses(db, dsn):
    db.execute(ITEMS_TABLE)
    calls: list[list[int]] = []

    async def main() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await isolate(ITEMS, inserter(conn, calls))

    got = asyncio.run(main())
    assert [(n, exc.sqlstate) for n, exc in got.rejected] == [(13, "23514"), (37, "P0001")]
    assert stored(db) == [n for n in ITEMS if n not in (13, 37)]
    assert sum(got.results) == 48
    # Bisection: the whole batch, then two halves per level on the way down to each refused
    # item (6 levels for 50 items), for each of the two: far fewer than one write per item.
    assert calls[0] == ITEMS
    assert len(calls) <= 1 + 2 * 2 * 6


@pytest.mark.own_schema
def test_isolate_writes_the_items_marked_alone_one_at_a_time_after_the_batch(db, dsn):
    db.execute(ITEMS_TABLE)
    calls: list[list[int]] = []

    async def main() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await isolate([1, 2, 3, 4, 5], inserter(conn, calls),
                                 alone=lambda n: n in (2, 4))

    got = asyncio.run(main())
    assert calls == [[1, 3, 5], [2], [4]]
    assert got.rejected == [] and stored(db) == [1, 2, 3, 4, 5]


@pytest.mark.own_schema
def test_isolate_stops_on_a_lost_connection_and_names_exactly_the_items_not_written(
        db, dsn):
    db.execute(ITEMS_TABLE)
    calls: list[list[int]] = []

    async def main() -> Interrupted:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            insert = inserter(conn, calls)

            async def write(part: list[int]) -> int:
                # Written so far: the batch and its first half, both refused (item 13),
                # then the first quarter (0-11), committed. Now the server goes away.
                if len(calls) == 3:
                    db.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
                return await insert(part)

            with pytest.raises(Interrupted) as caught:
                await isolate(ITEMS, write)
            return caught.value

    stopped = asyncio.run(main())
    assert isinstance(stopped.error, psycopg.OperationalError)
    assert not row_error(stopped.error)
    # Nothing committed is named as left, and nothing unwritten is missing from it.
    assert stored(db) == list(range(12))
    assert stopped.left == list(range(12, 50))
    assert stopped.done.rejected == []


@pytest.mark.own_schema
def test_row_errors_are_the_ones_about_the_rows_written(db, dsn):
    db.execute("CREATE TABLE parent (id int PRIMARY KEY); CREATE TABLE child "
               "(id int PRIMARY KEY, parent int REFERENCES parent); INSERT INTO parent VALUES (1)")

    def error_of(statement: str, conn: psycopg.Connection = db) -> psycopg.Error:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(statement)
        return caught.value

    about_rows = {
        "foreign key": "INSERT INTO child VALUES (1, 2)",
        "unique": "INSERT INTO parent VALUES (1)",
        "data": "SELECT 1 / 0",
        "raise": "DO $$ BEGIN RAISE EXCEPTION 'no'; END $$",
    }
    for what, statement in about_rows.items():
        exc = error_of(statement)
        assert row_error(exc) and not transient(exc), what
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT * FROM parent FOR UPDATE")
        db.execute("SET lock_timeout = '50ms'")
        exc = error_of("DELETE FROM parent")
        assert row_error(exc) and transient(exc) and not timed_out(exc)
    # Too many rows for the time a statement has, or one slow row: bisected too.
    db.execute("SET statement_timeout = '50ms'")
    exc = error_of("SELECT pg_sleep(1)")
    db.execute("RESET statement_timeout")
    assert row_error(exc) and transient(exc) and timed_out(exc)
    not_about_rows = {"missing table": error_of("SELECT FROM no_such_table")}
    lost = psycopg.connect(dsn, autocommit=True)
    db.execute("SELECT pg_terminate_backend(%s)", (lost.info.backend_pid,))
    not_about_rows["connection lost"] = error_of("SELECT 1", lost)
    for what, exc in not_about_rows.items():
        assert not row_error(exc), what


def test_dispatcher_connections_wait_for_a_row_lock_and_run_for_a_share_of_the_lease(db, dsn):
    lease = Lease(30)
    assert (lease.lock_timeout, lease.statement_timeout) == (1.0, 5.0)
    assert (Lease(1).lock_timeout, Lease(1).statement_timeout) == (0.1, 0.5)  # the floors
    assert (Lease(86_400).lock_timeout, Lease(86_400).statement_timeout) == (5.0, 30.0)

    async def settings(pool: AsyncConnectionPool) -> tuple[str, str]:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT current_setting('lock_timeout'), "
                                     "current_setting('statement_timeout')")
            return await cur.fetchone()

    async def main(dsn: str) -> tuple[str, str]:
        async with AsyncConnectionPool(
                dsn, min_size=1, max_size=1, kwargs={"autocommit": True},
                configure=lambda conn: configure_connection(conn, lease)) as pool:
            return await settings(pool)

    assert asyncio.run(main(dsn)) == ("1s", "5s")
    # A value the operator set for the connection wins (here the DSN's options).
    assert asyncio.run(main(with_options(dsn, "lock_timeout=250ms"))) == ("250ms", "5s")


def test_an_ack_refused_on_a_lock_is_tried_alone_again_then_parked(db, dsn):
    ids = enqueue_records(db, 10)
    lease = Lease(3)  # a 0.1 s lock_timeout

    async def main(held_briefly: int, held_long: int) -> list[Any]:
        async with record_claimer(dsn, lease, "host-a") as (pool, claimer):
            acks = [Ack.done(job) for job in await claimer.claim(10)]
            completer = Completer(pool, "host-a")
            brief = await psycopg.AsyncConnection.connect(dsn)
            long = await psycopg.AsyncConnection.connect(dsn)
            for holder, job in ((brief, held_briefly), (long, held_long)):
                await holder.execute("SELECT FROM pgpool_jobs WHERE id = %s FOR KEY SHARE",
                                     (job,))
            seen = []
            for flush in range(LOCK_RETRIES + 1):
                if flush == 2:
                    await brief.rollback()  # that application transaction ends
                result = await completer.flush(acks)
                acks = result.later
                seen.append((result.done, result.parked, sorted(a.job.id for a in acks)))
            await long.rollback()
            await brief.close()
            await long.close()
            return seen

    brief, long = ids[2], ids[7]
    assert asyncio.run(main(brief, long)) == [
        (8, 0, [brief, long]),  # the others commit at once
        (0, 0, [brief, long]),  # each tried alone: both still held
        (1, 0, [long]),         # the brief holder is gone: deleted as usual
        (0, 1, []),             # tried LOCK_RETRIES times after the first: parked
    ]
    assert db.execute("SELECT id, state FROM pgpool_jobs").fetchall() == [(long, "done")]


# --- pgpool run ---------------------------------------------------------------------------


def enqueue_records(db: psycopg.Connection, n: int, **options: Any) -> list[int]:
    """Enqueue ``n`` record jobs; their ids, in order."""
    before = one(db, "SELECT coalesce(max(id), 0) FROM pgpool_jobs")[0]
    pgpool.enqueue_many(db, "record", ({"n": i} for i in range(n)), **options)
    return [i for i, in db.execute("SELECT id FROM pgpool_jobs WHERE id > %s ORDER BY id",
                                   (before,)).fetchall()]


def runs(record_dir) -> Counter[int]:
    """How many attempts of each job ran to their end."""
    return Counter(job for job, _, _, what in read_records(record_dir) if what == "end")


@pytest.mark.own_schema
@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_a_job_an_application_row_references_is_kept_done_and_the_host_goes_on(
        db, dsn, record_dir):
    ids = enqueue_records(db, 50)
    referenced = ids[17]
    db.execute("CREATE TABLE app_orders (id int PRIMARY KEY, "
               "job bigint NOT NULL REFERENCES pgpool_jobs (id))")
    db.execute("INSERT INTO app_orders VALUES (1, %s)", (referenced,))
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--batch", "50", record_dir=record_dir)
    # Generous: 50 no-op jobs take well under a second; this machine's cores are shared.
    parked = host.event("parked", 60)
    assert (parked["job_id"], parked["ack"], parked["state"]) == (referenced, "done", "done")
    assert parked["error"] == "ForeignKeyViolation (23503)"
    # The host goes on claiming: 20 more jobs run to their end.
    later = enqueue_records(db, 20)
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs WHERE state <> 'done'") == (0,),
               "every job but the referenced one to be acked", 60)
    assert host.stop() == 0
    assert only_event(host.stderr, "finished")["parked"] == 1
    assert runs(record_dir) == Counter(ids + later)  # each once
    assert db.execute("SELECT id, state, locked_by, last_error FROM pgpool_jobs").fetchall() == [
        (referenced, "done", None,
         "succeeded, but the database refused to delete it: ForeignKeyViolation (23503): "
         'update or delete on table "pgpool_jobs" violates foreign key constraint '
         '"app_orders_job_fkey" on table "app_orders"')]
    assert [(q["queue"], q["parked"], q["parked_done"]) for q in status_json(dsn)["queues"]] == [
        ("default", 0, 1)]
    # A restart runs nothing again: the 49 are gone and the referenced one is done.
    again = run_pgpool(dsn, *RUN, "--burst", record_dir=record_dir)
    assert again.returncode == 0, again.stderr
    assert runs(record_dir) == Counter(ids + later)
    text = run_pgpool(dsn, "status").stdout
    assert "warning: the database refused to ack or reap 1 jobs" in text


def test_a_job_row_held_for_key_share_is_retried_then_kept_done(db, dsn, record_dir):
    ids = enqueue_records(db, 20)
    held = ids[5]
    with psycopg.connect(dsn) as holder:  # an application transaction that stays open
        holder.execute("SELECT FROM pgpool_jobs WHERE id = %s FOR KEY SHARE", (held,))
        # --lease 6: each delete of the held row gives up after 0.2 s (Lease.lock_timeout).
        done = run_pgpool(dsn, *RUN, "--procs", "2", "--lease", "6", "--burst",
                          record_dir=record_dir, **JSON_LOGS)
        holder.rollback()
    assert done.returncode == 0, done.stderr
    assert runs(record_dir) == Counter(ids)
    parked = only_event(done.stderr, "parked")
    assert (parked["job_id"], parked["state"], parked["error"]) == (
        held, "done", "LockNotAvailable (55P03)")
    assert db.execute("SELECT id, state, last_error FROM pgpool_jobs").fetchall() == [
        (held, "done", "succeeded, but the database refused to delete it: "
                       "LockNotAvailable (55P03): canceling statement due to lock timeout")]


@pytest.mark.own_schema
def test_triggers_that_raise_for_one_job_park_it_and_spare_the_others(db, dsn, record_dir):
    ids = enqueue_records(db, 20)
    undeletable = ids[3]
    failing = pgpool.enqueue(db, "fail", {})
    db.execute("""
        CREATE FUNCTION guard() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' AND OLD.id = %(undeletable)s THEN
                RAISE EXCEPTION 'job % is audited', OLD.id;
            END IF;
            IF TG_OP = 'UPDATE' AND NEW.id = %(failing)s
               AND NEW.state IN ('ready', 'scheduled') THEN
                RAISE EXCEPTION 'job % may not be retried', NEW.id;
            END IF;
            RETURN coalesce(NEW, OLD);
        END $$;
        CREATE TRIGGER guard BEFORE DELETE OR UPDATE ON pgpool_jobs
            FOR EACH ROW EXECUTE FUNCTION guard();
    """.replace("%(undeletable)s", str(undeletable)).replace("%(failing)s", str(failing)))
    done = run_pgpool(dsn, *RUN, "--procs", "2", "--burst", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert runs(record_dir) == Counter(ids)
    rows = {job: (state, error) for job, state, error in db.execute(
        "SELECT id, state, last_error FROM pgpool_jobs").fetchall()}
    assert rows.keys() == {undeletable, failing}
    assert rows[undeletable] == ("done", "succeeded, but the database refused to delete it: "
                                 f"RaiseException (P0001): job {undeletable} is audited")
    state, error = rows[failing]
    assert state == "parked"
    assert error.startswith(
        "failed, and the database refused to make it ready for its retry: RaiseException "
        f"(P0001): job {failing} may not be retried\n")
    assert "this job always fails" in error  # the attempt's own error is kept below
    assert [(q["parked"], q["parked_done"]) for q in status_json(dsn)["queues"]] == [(1, 1)]


# --- the reaper ---------------------------------------------------------------------------


@pytest.mark.own_schema
def test_the_reaper_parks_an_expired_job_it_cannot_return_and_returns_the_others(db, dsn):
    ids = enqueue_records(db, 6, max_attempts=1)
    ids += [pgpool.enqueue(db, "record", {"n": 6}, max_attempts=5)]
    referenced, collides = ids[1], ids[4]
    db.execute("CREATE TABLE app_orders (job bigint REFERENCES pgpool_jobs (id))")
    db.execute("INSERT INTO app_orders VALUES (%s)", (referenced,))
    # A dead letter with the id of a job about to be buried: a primary key collision.
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "created_at) VALUES (%s, 'default', 'record', '{}', 0, 1, now())", (collides,))

    async def claim_and_reap() -> list[tuple[int, int]]:
        async with record_claimer(dsn, Lease(30), "gone:1:aa") as (pool, claimer):
            assert len(await claimer.claim(10)) == 7
            # Their host died while running them (a heartbeat recorded their start): every
            # lease ran out, and each attempt counts.
            async with pool.connection() as conn:
                await conn.execute("UPDATE pgpool_jobs SET lease_until = now() - interval "
                                   "'1s', started = true")
            reaper = Reaper(pool, interval=1)
            return [await reaper.reap(), await reaper.reap()]

    # The exhausted jobs are buried but for two: one referenced, one whose id collides.
    assert asyncio.run(claim_and_reap()) == [(1, 4), (0, 0)]
    rows = dict(db.execute("SELECT id, state FROM pgpool_jobs").fetchall())
    assert rows == {referenced: "parked", collides: "parked", ids[6]: "ready"}
    errors = dict(db.execute("SELECT id, last_error FROM pgpool_jobs "
                             "WHERE state = 'parked'").fetchall())
    assert errors[referenced].startswith(
        "lease expired while running on gone:1:aa; the reaper could not return it: "
        "ForeignKeyViolation (23503)")
    assert "UniqueViolation (23505)" in errors[collides]
    assert [(q["parked"], q["dead"]) for q in status_json(dsn)["queues"]] == [(2, 5)]


def test_the_reaper_leaves_a_job_refused_on_a_lock_for_a_few_passes_then_parks_it(db, dsn):
    job = pgpool.enqueue(db, "record", {}, max_attempts=1)
    lease = Lease(3)  # a 0.1 s lock_timeout

    # Its last attempt ran and expired: burying it deletes the row, which another
    # connection's lock blocks.
    passes = reaper_passes(db, dsn, lease, 1, REAPER_LOCK_RETRIES + 1, hold=job)
    assert passes == [((0, 0), "running")] * REAPER_LOCK_RETRIES + [
        ((0, 0), "parked")]
    assert "LockNotAvailable (55P03)" in one(db, "SELECT last_error FROM pgpool_jobs")[0]


# --- groups -------------------------------------------------------------------------------


def flush_members(dsn: str, acks: Callable[[Any], Ack]) -> tuple[list[int], int, int]:
    """Claim the ready ``record`` jobs as host-a and flush ``acks(job)`` of each with a real
    `Completer`: the ids claimed, and how many were done and parked."""
    async def main() -> tuple[list[int], int, int]:
        async with record_claimer(dsn, Lease(30), "host-a") as (pool, claimer):
            jobs = await claimer.claim(10)
            result = await Completer(pool, "host-a").flush([acks(job) for job in jobs])
            return sorted(job.id for job in jobs), result.done, result.parked

    return asyncio.run(main())


@pytest.mark.own_schema
def test_a_member_whose_success_is_parked_counts_in_its_group(db, dsn):
    group = pgpool.group(db, "record", [{"n": 1}, {"n": 2}], then=("record", {"n": 0}))
    first, second = [i for (i,) in db.execute(
        "SELECT id FROM pgpool_jobs WHERE group_id = %s ORDER BY id", (group.id,))]
    db.execute("CREATE TABLE app_orders (job bigint NOT NULL REFERENCES pgpool_jobs (id))")
    db.execute("INSERT INTO app_orders VALUES (%s)", (first,))
    assert flush_members(dsn, lambda job: Ack.done(job, 0.0)) == ([first, second], 1, 1)
    # The success it could not delete counts: the callback is released.
    progress = pgpool.group_status(db, group.id)
    assert (progress.done, progress.dead, progress.callback) == (2, 0, "ready")
    # And it is not plainly done: parked, its result and follow-ups never stored.
    status = pgpool.job_status(db, first)
    assert (status.state, status.parked, status.result) == ("done", True, None)
    assert status.error.startswith("succeeded, but the database refused to delete it: "
                                   "ForeignKeyViolation (23503)")
    shown = run_pgpool(dsn, "jobs", "show", str(first))
    assert ("  state       done, parked: its ack was refused (see its last error), so its "
            "result and follow-ups were not stored") in shown.stdout.splitlines(), shown.stdout
    assert not pgpool.job_status(db, second).parked


@pytest.mark.own_schema
@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_a_success_whose_follow_up_group_is_refused_fails_and_runs_again(db, dsn):
    # The database refuses the group a handler started (an application's trigger here): its
    # success cannot be written whole, and a success without its follow-ups would lose
    # them. It fails instead, as an error its handler never saw, and runs again.
    db.execute("""
        CREATE FUNCTION no_groups() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'no groups today'; END $$;
        CREATE TRIGGER no_groups BEFORE INSERT ON pgpool_groups
            FOR EACH ROW EXECUTE FUNCTION no_groups();
    """)
    parent = pgpool.enqueue(db, "out.fanout_later", {}, max_attempts=2)
    run = ("run", "--handlers", "outcomejobs", "--burst")
    done = run_pgpool(dsn, *run, **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    status = pgpool.job_status(db, parent)
    assert (status.state, status.parked) == ("scheduled", False), status
    assert status.error == ("succeeded, but the database refused to store its outcome (its "
                            "result, follow-up jobs or groups): RaiseException (P0001): no "
                            "groups today")
    refused = only_event(done.stderr, "outcome_refused")
    assert (refused["job_id"], refused["error"]) == (parent, "RaiseException (P0001)")
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE kind = 'out.score'") == (0,)

    db.execute("DROP TRIGGER no_groups ON pgpool_groups")
    assert run_pgpool(dsn, "retry", str(parent)).returncode == 0
    assert run_pgpool(dsn, *run).returncode == 0
    assert pgpool.job_status(db, parent).state == "unknown"  # succeeded, kept by nothing
    assert one(db, "SELECT result->>'label' FROM pgpool_done WHERE kind = 'out.combine'") == (
        "fanned",)
