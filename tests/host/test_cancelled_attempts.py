"""Cancelling a running job (issue 19, item 6): the cancelled attempt holds its keys until
it is over, `cancel` refuses a job kept as done, and a cancel committed out of order is
noticed at once. Real PostgreSQL, real `pgpool` processes."""

from __future__ import annotations

import signal

import psycopg
import pytest
from claims import in_registry
from commands import RUN, assert_user_error, run_pgpool
from dbtools import one
from processes import alive, start_pgpool
from psycopg_pool import AsyncConnectionPool
from records import starts
from waits import wait_until

import pgpool
from pgpool import ops
from pgpool.host.claimer import Claimer
from pgpool.host.lease import Lease
from pgpool.host.parts.reaper import Reaper
from pgpool.registry import Handler
from pgpool.sql import jobs as sql


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
