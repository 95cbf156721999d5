"""An ack or a reap that runs past ``statement_timeout`` is written in parts, never retried
whole forever (`pgpool.host.isolate`).

The trigger the docs warn about: an application table with a foreign key to
``pgpool_jobs(id)`` on an unindexed column, so that each job's delete scans that table. A
batch of deletes then takes many times as long as one, and past the statement timeout.
Here the table is real (unindexed, ``ON DELETE SET NULL``, every job referenced by one of
its rows among many that reference none), and a ``BEFORE DELETE`` trigger adds a fixed
sleep per deleted job on top of its scan, which makes the timing structural: a batch of 5
deletes sleeps the whole statement timeout, so it is cancelled on any machine however
fast; one delete takes a fifth of it, leaving a loaded machine a wide margin. The host
test of acks written together goes further (``together``): any statement deleting two
jobs or more sleeps twice the timeout, so a flush of two acks is enough, however slowly a
loaded machine runs the jobs (growing to five acks a flush needed them to end ten a second).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import psycopg
import pytest
from claims import reaper_passes
from commands import RUN, run_pgpool
from dbtools import one, with_options
from jsonlogs import only_event
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool
from records import read_records
from waits import wait_until

import pgpool
from pgpool.host.claimer import Claimer, configure_connection
from pgpool.host.completer import Ack, Completer
from pgpool.host.isolate import isolate
from pgpool.host.lease import Lease
from pgpool.host.parts.reaper import LOCK_RETRIES as REAPER_LOCK_RETRIES
from pgpool.registry import Handler

#: The hosts' statement timeout, seconds, and the sleep each job's delete adds to it.
STATEMENT_TIMEOUT = 0.5
PER_DELETE = 0.1
#: Rows of the application's table that reference no job: each job delete scans them all.
UNRELATED_ROWS = 100_000


def enqueue_records(db: psycopg.Connection, n: int, **options: Any) -> list[int]:
    """Enqueue ``n`` record jobs, each referenced by a row of ``app_orders`` once that
    exists; their ids, in order."""
    before = one(db, "SELECT coalesce(max(id), 0) FROM pgpool_jobs")[0]
    pgpool.enqueue_many(db, "record", ({"n": i} for i in range(n)), **options)
    ids = [i for i, in db.execute("SELECT id FROM pgpool_jobs WHERE id > %s ORDER BY id",
                                  (before,)).fetchall()]
    if one(db, "SELECT to_regclass('app_orders')")[0] is not None:
        db.execute("INSERT INTO app_orders (job) SELECT unnest(%s::bigint[])", (ids,))
    return ids


def slow_deletes(db: psycopg.Connection, stuck: int | None = None, *,
                 together: bool = False) -> None:
    """The application's unindexed reference to jobs, and a delete that takes
    `PER_DELETE` seconds a job; the delete of ``stuck`` takes four statement timeouts.
    With ``together``, a statement that deletes two jobs or more takes two more."""
    db.execute(f"""
        CREATE TABLE app_orders (id bigserial PRIMARY KEY,
                                 job bigint REFERENCES pgpool_jobs (id) ON DELETE SET NULL);
        INSERT INTO app_orders (job) SELECT NULL FROM generate_series(1, {UNRELATED_ROWS});
        INSERT INTO app_orders (job) SELECT id FROM pgpool_jobs;
        CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_sleep(CASE WHEN OLD.id = {stuck or 0} THEN {4 * STATEMENT_TIMEOUT}
                                  ELSE {PER_DELETE} END);
            RETURN OLD;
        END $$;
        CREATE TRIGGER slow_delete BEFORE DELETE ON pgpool_jobs
            FOR EACH ROW EXECUTE FUNCTION slow_delete();
    """)
    if together:
        db.execute(f"""
            CREATE FUNCTION slow_together() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT count(*) FROM gone) > 1 THEN
                    PERFORM pg_sleep({2 * STATEMENT_TIMEOUT});
                END IF;
                RETURN NULL;
            END $$;
            CREATE TRIGGER slow_together AFTER DELETE ON pgpool_jobs
                REFERENCING OLD TABLE AS gone
                FOR EACH STATEMENT EXECUTE FUNCTION slow_together();
        """)


def host_dsn(dsn: str) -> str:
    """``dsn`` with `STATEMENT_TIMEOUT`: the operator's setting, which the host keeps."""
    return with_options(dsn, f"statement_timeout={round(STATEMENT_TIMEOUT * 1000)}ms")


def runs(record_dir) -> Counter[int]:
    """How many attempts of each job ran to their end."""
    return Counter(job for job, _, _, what in read_records(record_dir) if what == "end")


def left(db: psycopg.Connection) -> list[tuple[int, str]]:
    return db.execute("SELECT id, state FROM pgpool_jobs ORDER BY id").fetchall()


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_isolate_halves_untried_every_part_as_large_as_one_the_timeout_cancelled(dsn):
    calls: list[int] = []

    async def main() -> Any:
        # Each item sleeps 0.2 s: a write of 4 runs past the 0.7 s timeout, one of 2 fits.
        async with await psycopg.AsyncConnection.connect(
                with_options(dsn, "statement_timeout=700ms"), autocommit=True) as conn:
            async def write(part: list[int]) -> list[int]:
                calls.append(len(part))
                await conn.execute("SELECT pg_sleep(0.2 * %s)", (len(part),))
                return part

            return await isolate(list(range(8)), write)

    got = asyncio.run(main())
    assert [item for part in got.results for item in part] == list(range(8))
    assert (got.rejected, got.timeouts, got.limit) == ([], 2, 2)
    # 8 and then 4 time out; the other half of 8 is halved twice before it is tried.
    assert calls == [8, 4, 2, 2, 2, 2]


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
@pytest.mark.own_schema
def test_after_a_timeout_the_completer_writes_fewer_acks_a_statement_then_more_again(
        db, dsn):
    enqueue_records(db, 30)
    slow_deletes(db)
    lease = Lease(30)

    async def main() -> list[tuple[int, int]]:
        # A 1 s timeout: 10 deletes always run past it, 5 take half of it.
        async with AsyncConnectionPool(
                with_options(dsn, "statement_timeout=1s"), min_size=2, max_size=2,
                kwargs={"autocommit": True},
                configure=lambda conn: configure_connection(conn, lease)) as pool:
            claimer = Claimer(pool, "host-a", queues=("default",),
                              handlers={"record": Handler("record", print, None, None)},
                              lease=lease, max_attempts=20, timeout=None)
            acks = [Ack.done(job) for job in await claimer.claim(30)]
            completer = Completer(pool, "host-a")
            flushes = []
            for first in range(0, 30, 10):
                result = await completer.flush(acks[first:first + 10])
                flushes.append((result.done, result.timeouts))
            return flushes

    assert asyncio.run(main()) == [
        (10, 1),  # 10 time out: at most 5 a statement from now on
        (10, 0),  # two parts of 5, untried as one: at most 10 again next time
        (10, 1),  # 10 time out again: 5 at most
    ]
    assert left(db) == []


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
@pytest.mark.own_schema
def test_acks_that_run_past_the_statement_timeout_together_are_written_in_parts(
        db, dsn, record_dir, caplog):
    enqueue_records(db, 30)
    slow_deletes(db, together=True)
    lease = Lease(30)

    # A flush of the 30 acks at once, as a host's completer writes them: the statement of
    # 30 runs past the timeout, and the acks are written in parts. (Driven here rather than
    # through a host: how many acks a host's flushes hold depends on how its jobs end, and
    # on a loaded machine every flush held one.)
    async def flush_all() -> tuple[int, int]:
        async with AsyncConnectionPool(
                host_dsn(dsn), min_size=2, max_size=2, kwargs={"autocommit": True},
                configure=lambda conn: configure_connection(conn, lease)) as pool:
            claimer = Claimer(pool, "host-a", queues=("default",),
                              handlers={"record": Handler("record", print, None, None)},
                              lease=lease, max_attempts=20, timeout=None)
            acks = [Ack.done(job) for job in await claimer.claim(30)]
            result = await Completer(pool, "host-a").flush(acks)
            return result.done, result.timeouts

    with caplog.at_level("WARNING", logger="pgpool.completer"):
        done, timeouts = asyncio.run(flush_all())
    assert (done, left(db)) == (30, [])
    assert timeouts >= 1
    assert [r.fields["acks"] for r in caplog.records
            if getattr(r, "event", None) == "ack_timeout"] == [30]
    # A real host under the same slow deletes: it acks its jobs and goes on claiming.
    host = start_pgpool(host_dsn(dsn), *RUN, "--procs", "2", "--batch", "50",
                        record_dir=record_dir)
    later = enqueue_records(db, 10)
    wait_until(lambda: left(db) == [], "the jobs enqueued later to be acked", 60)
    assert host.stop() == 0
    finished = only_event(host.stderr, "finished")
    assert (finished["done"], finished["parked"]) == (10, 0)
    assert runs(record_dir) == Counter(later)  # each once (the first 30 were acked above)
    assert one(db, "SELECT count(*) FROM app_orders WHERE job IS NOT NULL") == (0,)


@pytest.mark.own_schema
@pytest.mark.soak  # long: the soak tier, which CI runs after make test
def test_an_ack_that_runs_past_the_statement_timeout_alone_is_kept_done(db, dsn, record_dir):
    ids = enqueue_records(db, 20)
    stuck = ids[7]
    slow_deletes(db, stuck)
    host = start_pgpool(host_dsn(dsn), *RUN, "--procs", "2", "--batch", "50",
                        record_dir=record_dir)
    parked = host.event("parked", 60)
    assert (parked["job_id"], parked["ack"], parked["state"], parked["error"]) == (
        stuck, "done", "done", "QueryCanceled (57014)")
    wait_until(lambda: left(db) == [(stuck, "done")], "every other job to be acked", 60)
    later = enqueue_records(db, 10)
    wait_until(lambda: left(db) == [(stuck, "done")], "the jobs enqueued later to be acked", 60)
    assert host.stop() == 0
    assert only_event(host.stderr, "finished")["parked"] == 1
    assert runs(record_dir) == Counter(ids + later)
    assert db.execute("SELECT state, locked_by, last_error FROM pgpool_jobs").fetchall() == [
        ("done", None, "succeeded, but the database refused to delete it: QueryCanceled "
                       "(57014): canceling statement due to statement timeout")]
    # A restart runs nothing again.
    again = run_pgpool(dsn, *RUN, "--burst", record_dir=record_dir)
    assert again.returncode == 0, again.stderr
    assert runs(record_dir) == Counter(ids + later)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
@pytest.mark.own_schema
def test_the_reaper_buries_in_parts_a_batch_that_runs_past_the_statement_timeout(db, dsn):
    ids = enqueue_records(db, 20, max_attempts=1)
    stuck = ids[7]
    slow_deletes(db, stuck)
    lease = Lease(3)  # a 0.5 s statement_timeout
    assert lease.statement_timeout == STATEMENT_TIMEOUT

    # Their host died running them: every lease ran out, on their last attempt, so the
    # reaper buries them, a delete of each.
    passes = reaper_passes(db, dsn, lease, 20, REAPER_LOCK_RETRIES + 1)
    # The 19 others are buried at the first pass; the one whose delete alone runs past the
    # timeout is left for a few passes, then parked.
    assert passes == [((0, 19), "running")] + [
        ((0, 0), "running")] * (REAPER_LOCK_RETRIES - 1) + [((0, 0), "parked")]
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (19,)
    assert one(db, "SELECT id, last_error FROM pgpool_jobs") == (
        stuck, "lease expired while running on gone:1:aa; the reaper could not return it: "
               "QueryCanceled (57014): canceling statement due to statement timeout")
