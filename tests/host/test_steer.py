"""Steering running dispatchers: cancel a running job, pause a queue across hosts and
restarts, and dead-letter retention pruning while jobs run. Real dispatchers, real workers
(tests/handlers/testjobs.py records every attempt), real PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from claims import in_registry
from commands import RUN, run_pgpool
from dbtools import one
from processes import alive, start_pgpool
from records import read_records
from waits import wait_until

import pgpool
from pgpool.host.parts import retention
from pgpool.sql import ops as sql


def attempts(record_dir: Path, event: str) -> dict[int, list[int]]:
    """Worker pids by job id, one per recorded ``event`` (start or end)."""
    out: dict[int, list[int]] = {}
    for job_id, _, pid, what in read_records(record_dir):
        if what == event:
            out.setdefault(job_id, []).append(pid)
    return out


def jobs_left(db: psycopg.Connection, queue: str) -> int:
    return one(db, "SELECT count(*) FROM pgpool_jobs WHERE queue = %s", queue)[0]


@pytest.mark.xdist_group("timing")  # its timing is its subject: see tests/conftest.py
@pytest.mark.parametrize("how", ["notified", "polled"])
@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_cancelling_a_running_job_stops_exactly_its_worker_and_never_retries_it(
        db, dsn, record_dir, how):
    ids = [pgpool.enqueue(db, "record", {"sleep": 4}) for _ in range(3)]
    # notified: a 5 s poll and a 30 s lease (heartbeats every 10 s), so only the
    # notification can make the worker stop within the bound below. polled: the cancel
    # sends no notification (as if it were lost), and the 1 s poll must catch it.
    poll = "5" if how == "notified" else "1"
    host = start_pgpool(dsn, *RUN, "--procs", "3", "--batch", "1", "--poll", poll,
                        record_dir=record_dir)
    started = wait_until(lambda: len(attempts(record_dir, "start")) == 3
                         and attempts(record_dir, "start"), "the three jobs to start")
    victim = ids[1]
    (pid,) = started[victim]
    others = [started[i][0] for i in ids if i != victim]

    if how == "notified":
        done = run_pgpool(dsn, "cancel", str(victim))
        assert done.returncode == 0, done.stderr
        assert f"cancelled job {victim} (was running on " in done.stdout
    else:
        db.execute(sql.CANCEL, {"ids": f"{{{victim}}}"})
    cancelled_at = time.monotonic()
    # "Within about a second": notification (or poll), control poll, heartbeat, kill; 3 s
    # allows a loaded machine, and is under the job's 4 s, the notified case's 5 s poll
    # and the 10 s heartbeat.
    wait_until(lambda: not alive(pid), "the cancelled job's worker to die", timeout=10)
    assert time.monotonic() - cancelled_at < 3.0
    assert all(alive(p) for p in others), "another job's worker was stopped too"

    # The other jobs finish and are acked; the cancelled one never ends nor runs again. Its
    # row stays, running with no owner, until its 30 s lease ends (then the reaper
    # dead-letters it: tests/host/test_cancelled_attempts.py).
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs WHERE id <> %s",
                           victim)[0] == 0, "the other two jobs to finish", timeout=30)
    ends = attempts(record_dir, "end")
    assert sorted(ends) == sorted(i for i in ids if i != victim)
    assert attempts(record_dir, "start")[victim] == [pid]
    state, owner, error = one(db, "SELECT state, locked_by, last_error FROM pgpool_jobs "
                                  "WHERE id = %s", victim)
    assert (state, owner) == ("running", None)
    assert "cancelled by operator at " in error and " while running attempt 1 on " in error
    lost = host.event("lease_lost")
    assert lost["jobs"] == 1
    assert host.stop() == 0
    finished = host.event("finished")
    assert (finished["done"], finished["retried"], finished["dead"], finished["lost"]) == (
        2, 0, 0, 1)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_pause_holds_across_two_hosts_and_a_restart(db, dsn, record_dir):
    serve = (*RUN, "--procs", "2", "--queue", "default", "--queue", "held")
    a = start_pgpool(dsn, *serve, record_dir=record_dir)
    b = start_pgpool(dsn, *serve, record_dir=record_dir)
    a.event("started")
    b.event("started")
    # A job that is running when the queue is paused finishes.
    running = pgpool.enqueue(db, "record", {"sleep": 1.5}, queue="held")
    wait_until(lambda: running in attempts(record_dir, "start"), "the held job to start")
    assert run_pgpool(dsn, "pause", "held").returncode == 0
    for host in (a, b):
        assert host.event("queues_paused")["queues"] == ["held"]

    def held_untouched_while_default_drains() -> None:
        with db.transaction():  # one notification wakes both queues' claims
            held = pgpool.enqueue_many(db, "record", ({} for _ in range(20)), queue="held")
            pgpool.enqueue_many(db, "record", ({} for _ in range(20)))
        assert held == 20
        # The hosts claim (the default queue drains) and leave the paused queue alone.
        wait_until(lambda: jobs_left(db, "default") == 0, "the default queue to drain")
        assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE queue = 'held' "
                       "AND state = 'ready'")[0] >= 20

    held_untouched_while_default_drains()
    wait_until(lambda: running in attempts(record_dir, "end"), "the running job to end")
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = %s", running)
               == (0,), "the running job to be acked")

    # Restart: both hosts stop, one comes back; the pause is read before its first claim.
    assert a.stop() == 0 and b.stop() == 0
    c = start_pgpool(dsn, *serve, record_dir=record_dir)
    assert c.event("queues_paused")["queues"] == ["held"]
    c.event("started")
    held_untouched_while_default_drains()
    assert jobs_left(db, "held") == 40

    assert run_pgpool(dsn, "resume", "held").returncode == 0
    wait_until(lambda: [e["queues"] for e in c.events("queues_paused")] == [["held"], []],
               "the restarted host to see the resume", timeout=10)
    # Resumed: 40 no-op jobs on two workers; the bound is for a loaded machine.
    wait_until(lambda: jobs_left(db, "held") == 0, "the held queue to drain", timeout=30)
    assert c.stop() == 0


def test_retention_prunes_old_dead_jobs_in_batches_while_a_run_goes_on(db, dsn, record_dir,
                                                                       tmp_path):
    # The run goes on until the test releases its gated job: the prune below happens while
    # it runs, however fast or slow the machine.
    release = tmp_path / "release"
    gated = pgpool.enqueue(db, "gated", {"release": str(release)})
    pgpool.enqueue_many(db, "record", ({} for _ in range(20)))
    # A 1 h retention makes a pass every second (retention.interval), so rows buried after
    # the host started are pruned by a later pass, during the run.
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--dead-retention", "1h",
                        record_dir=record_dir)
    wait_until(lambda: gated in attempts(record_dir, "start"), "the gated job to start")
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "created_at, died_at) SELECT g, 'default', 'k', '{}', 0, 1, now(), "
               "now() - interval '2 hours' FROM generate_series(100001, 102500) g")
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "created_at, died_at) VALUES (200001, 'default', 'k', '{}', 0, 1, now(), "
               "now() - interval '50 minutes')")
    pruned = host.event("dead_pruned", timeout=30)
    # All 2,500 in one pass, which went in batches of retention.BATCH.
    assert pruned["deleted"] == 2500 and pruned["batches"] == 3
    assert db.execute("SELECT id FROM pgpool_dead").fetchall() == [(200001,)]
    assert gated not in attempts(record_dir, "end"), "the run ended before the prune"
    release.touch()
    wait_until(lambda: jobs_left(db, "default") == 0, "the run to finish", timeout=60)
    assert host.stop() == 0


def test_only_the_host_holding_the_retention_lock_prunes(db, dsn):
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "created_at, died_at) SELECT g, 'default', 'k', '{}', 0, 1, now(), "
               "now() - interval '2 days' FROM generate_series(1, 10) g")

    async def prune_twice(pool) -> tuple[int | None, int | None]:
        prune = retention.Retention(pool, 86_400)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            async with other.transaction():  # another host is pruning
                await other.execute(sql.RETENTION_LOCK)
                blocked = await prune.prune()
            return blocked, await prune.prune()

    assert in_registry(dsn, prune_twice) == (None, 10)
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)


@pytest.mark.xdist_group("timing")  # its timing is its subject: see tests/conftest.py
def test_retry_and_replay_wake_the_hosts_and_the_jobs_run(db, dsn, record_dir):
    # A 30 s poll: a start within the bound below comes from the commands' notifications.
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--poll", "30", record_dir=record_dir)
    host.event("started")
    waiting = pgpool.enqueue(db, "record", {}, delay=3600)  # as if waiting out a backoff
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "max_attempts, last_error, created_at) VALUES (%s, 'default', 'record', '{}', "
               "0, 3, 3, 'ValueError: upstream down', now())", (waiting + 1000,))

    asked = time.monotonic()
    assert run_pgpool(dsn, "retry", str(waiting)).returncode == 0
    wait_until(lambda: waiting in attempts(record_dir, "end"), "the retried job to run")
    assert run_pgpool(dsn, "dead", "replay", "--id", str(waiting + 1000)).returncode == 0
    wait_until(lambda: waiting + 1000 in attempts(record_dir, "end"), "the replayed job to run")
    # Two commands (each a Python start, about a second on a loaded machine) and two jobs:
    # far from the 30 s poll.
    assert time.monotonic() - asked < 8
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs") == (0,), "the acks")
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)
    assert host.stop() == 0
