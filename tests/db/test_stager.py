"""The stager: jobs not yet due wait as scheduled, out of the claim's index, and become ready
when due, promptly: woken at the time they are due, not at a poll."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import psycopg
import pytest
from claims import in_registry
from dbtools import listen_sql
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool
from records import read_records
from waits import wait_until

import pgpool
from pgpool.host.parts import stager
from pgpool.host.parts.stager import Stager


def states(db: psycopg.Connection) -> dict[int, str]:
    return dict(db.execute("SELECT id, state FROM pgpool_jobs"))


def test_a_pass_makes_due_jobs_ready_in_batches_and_says_when_the_next_is_due(
    db: psycopg.Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    due = [pgpool.enqueue(db, "k", {}, queue=q, delay=3600) for q in ("a", "b", "a")]
    later = pgpool.enqueue(db, "k", {}, delay=3600)
    db.execute("UPDATE pgpool_jobs SET run_at = now() - interval '1 second' "
               "WHERE id = ANY(%s)", (due,))
    assert set(states(db).values()) == {"scheduled"}
    ears = psycopg.connect(dsn, autocommit=True)
    ears.execute(listen_sql(ears))
    monkeypatch.setattr(stager, "BATCH", 2)  # one pass goes on until a batch is not full

    async def stage(pool: AsyncConnectionPool) -> tuple[float | None, int]:
        s = Stager(pool, interval=1.0)
        return await s.stage(), s.staged

    next_due, staged = in_registry(dsn, stage)
    assert staged == 3
    assert states(db) == {**dict.fromkeys(due, "ready"), later: "scheduled"}
    assert next_due is not None and 3500 < next_due <= 3600
    # Each batch woke the claimers of its queues.
    woken = {n.payload for n in ears.notifies(timeout=5, stop_after=3)}
    assert woken == {"a", "b"}
    db.execute("DELETE FROM pgpool_jobs WHERE id = %s", (later,))
    assert in_registry(dsn, stage) == (None, 0)  # nothing scheduled: nothing to wait for


#: The poll interval of the dispatchers below: far longer than the bounds the tests allow,
#: so only the stager waking at the due time can make a job start within them.
POLL = "30"
#: How long after its due time a job may take to start: on an idle machine, tens of
#: milliseconds (the stager wakes, makes it ready, its notification wakes a claim); this
#: leaves room for a loaded 2-core test machine, and is still far below POLL.
PROMPT = 10.0


def test_a_delayed_job_starts_promptly_when_due(dsn: str, db: psycopg.Connection,
                                                record_dir: Path) -> None:
    host = start_pgpool(dsn, "run", "--handlers", "testjobs", "--procs", "1",
                        "--poll", POLL, record_dir=record_dir)
    host.event("started")
    enqueued = time.monotonic()
    job = pgpool.enqueue(db, "record", {}, delay=1)
    assert states(db) == {job: "scheduled"}
    wait_until(lambda: read_records(record_dir), "the delayed job to start", timeout=PROMPT)
    assert time.monotonic() - enqueued >= 1.0  # not before it was due
    assert host.stop() == 0


def test_a_retry_runs_promptly_when_its_backoff_ends(dsn: str, db: psycopg.Connection,
                                                     record_dir: Path) -> None:
    host = start_pgpool(dsn, "run", "--handlers", "testjobs", "--procs", "1",
                        "--poll", POLL, record_dir=record_dir)
    host.event("started")
    pgpool.enqueue(db, "flaky", {"succeed_on": 2})
    # The first attempt fails and waits out a backoff of 0.5 to 1 s, as scheduled.
    wait_until(lambda: [r for r in read_records(record_dir) if r[3] == "end"],
               "the retry to succeed", timeout=PROMPT)
    runs = [(claim, event) for _, claim, _, event in read_records(record_dir)]
    assert sorted(runs) == [(1, "start"), (2, "end"), (2, "start")]
    assert host.stop() == 0


@pytest.mark.own_schema
def test_a_job_the_database_refuses_to_make_ready_is_parked_and_spares_the_others(
    db: psycopg.Connection, dsn: str
) -> None:
    jobs = [pgpool.enqueue(db, "k", {}, delay=3600) for _ in range(5)]
    refused = jobs[2]
    db.execute("UPDATE pgpool_jobs SET run_at = now() - interval '1 second'")
    db.execute(f"""
        CREATE FUNCTION guard() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.id = {refused} AND NEW.state = 'ready' THEN
                RAISE EXCEPTION 'job % may not run yet', NEW.id;
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER guard BEFORE UPDATE ON pgpool_jobs
            FOR EACH ROW EXECUTE FUNCTION guard();
    """)

    async def stage(pool: AsyncConnectionPool) -> int:
        s = Stager(pool, interval=1.0)
        await s.stage()
        return s.staged

    assert in_registry(dsn, stage) == 4
    assert states(db) == {**dict.fromkeys(jobs, "ready"), refused: "parked"}
    (error,) = db.execute("SELECT last_error FROM pgpool_jobs WHERE id = %s",
                          (refused,)).fetchone()
    assert error.startswith("the stager could not make it ready: RaiseException (P0001): "
                            f"job {refused} may not run yet")
    assert in_registry(dsn, stage) == 0  # the next pass does not stop on it again


def test_a_stream_of_wake_ups_costs_at_most_one_pass_per_gap(db: psycopg.Connection,
                                                              dsn: str) -> None:
    # Every delayed enqueue wakes every host's stager: a wake-up every millisecond for
    # ``window`` seconds must start at most one pass per MIN_GAP (plus the first), not one
    # per wake-up. Fewer on a slow machine, never more.
    pgpool.enqueue(db, "k", {}, delay=3600)  # something scheduled: each pass reads it
    window = 1.0

    async def storm(pool: AsyncConnectionPool) -> int:
        s = Stager(pool, interval=30.0)
        passes = 0
        stage = s.stage

        async def counted() -> float | None:
            nonlocal passes
            passes += 1
            return await stage()

        s.stage = counted  # type: ignore[method-assign]
        task = asyncio.create_task(s.run())
        until = time.monotonic() + window
        while time.monotonic() < until:
            s.wake()
            await asyncio.sleep(0.001)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return passes

    passes = in_registry(dsn, storm)
    assert 1 <= passes <= window / stager.MIN_GAP + 2, passes
