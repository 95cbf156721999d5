"""Long jobs on real hosts and real PostgreSQL: a 40-step job that checkpoints after each
step (`longjobs.steps`) survives its host being SIGKILLed, its dispatcher being frozen past
the lease (the fenced attempt's late checkpoint is never stored), and a deploy's SIGTERM
(handed back at its checkpoint without using an attempt), each time resuming from its
checkpoint on another host, with at most the step in flight run twice.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from commands import run_pgpool
from longjobs import steps_run
from processes import Pgpool, start_pgpool
from waits import wait_until

import pgpool

LEASE = 2
STEPS = 40
#: Long enough that a host is stopped mid-way, short enough for a test.
STEP_SECONDS = 0.1

#: Its timing is its subject: these run one after another (tests/conftest.py). Hosts
#: killed, frozen past their lease and stopped, a minute or more in all: the soak tier.
pytestmark = [pytest.mark.xdist_group("timing"), pytest.mark.soak]


def host(dsn: str, record_dir: Path, *more: str) -> Pgpool:
    started = start_pgpool(dsn, "run", "--handlers", "longjobs", "--procs", "1", "--lease",
                           str(LEASE), "--poll", "0.2", *more, record_dir=record_dir,
                           wrapper=("setsid",))
    started.event("started")
    return started


def checkpoint(db: psycopg.Connection, job_id: int) -> dict | None:
    row = db.execute("SELECT checkpoint FROM pgpool_jobs WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else row[0]


def reached(db: psycopg.Connection, job_id: int, step: int) -> bool:
    """Whether the job's stored checkpoint is past ``step``."""
    state = checkpoint(db, job_id)
    return state is not None and state["next"] > step


def check_resumed(db: psycopg.Connection, record_dir: Path, job_id: int,
                  claims: int) -> list[tuple[int, int, int]]:
    """The job is done, every step ran, at most one of them twice, across ``claims``
    claims, and the last claim started from the checkpoint its predecessor stored."""
    wait_until(lambda: pgpool.job_status(db, job_id).state == "done", "the job finished",
               timeout=60)
    status = pgpool.job_status(db, job_id)
    runs = steps_run(record_dir)
    counts = Counter(step for _, _, step in runs)
    assert set(counts) == set(range(STEPS))
    assert sum(counts.values()) <= STEPS + claims - 1, counts
    assert status.attempts == claims
    last = max(claim for _, claim, _ in runs)
    assert last == claims
    earlier = max(step for _, claim, step in runs if claim < last)
    # It resumed at the step after the last stored one: the step in flight ran again, or
    # (its checkpoint stored just before the stop) none did.
    assert status.result["from"] in (earlier, earlier + 1)
    assert min(step for _, claim, step in runs if claim == last) == status.result["from"]
    return runs


def test_a_killed_hosts_job_resumes_from_its_checkpoint_on_another_host(db, dsn,
                                                                          record_dir):
    first = host(dsn, record_dir)
    job_id = pgpool.enqueue(db, "steps", {"steps": STEPS, "seconds": STEP_SECONDS})
    wait_until(lambda: reached(db, job_id, 10), "ten steps checkpointed")
    status = pgpool.job_status(db, job_id)
    assert status.checkpoint_at is not None and status.state == "running"
    shown = run_pgpool(dsn, "jobs", "show", str(job_id)).stdout
    assert re.search(r"\n  checkpoint  stored \d{4}-\d\d-\d\d [\d:]+Z \(\d+(\.\d+)?m?s ago\)\n"
                     r"    state     \(not shown: --payload shows it\)\n", shown), shown
    assert '"claim": 1' not in shown
    shown = run_pgpool(dsn, "jobs", "show", str(job_id), "--payload").stdout
    assert re.search(r'\n    state     \{"next": \d+, "claim": 1\}\n', shown), shown
    first.send_signal(signal.SIGKILL)  # its workers die with it (PR_SET_PDEATHSIG)
    first.wait()
    second = host(dsn, record_dir)
    check_resumed(db, record_dir, job_id, claims=2)
    assert pgpool.job_status(db, job_id).result["attempt"] == 2  # a crash uses an attempt
    assert second.stop() == 0


def test_a_deploy_hands_a_job_back_at_its_checkpoint_without_using_an_attempt(
        db, dsn, record_dir):
    stopping = host(dsn, record_dir, "--grace", "60")
    job_id = pgpool.enqueue(db, "steps", {"steps": STEPS, "seconds": STEP_SECONDS})
    wait_until(lambda: reached(db, job_id, 10), "ten steps checkpointed")
    signalled = time.monotonic()
    # Its running job stops at its next checkpoint: the host exits long before its grace.
    assert stopping.stop(signal.SIGTERM) == 0
    assert time.monotonic() - signalled < 30
    handed = stopping.event("job_interrupted", end_ok=True)
    assert (handed["job_id"], handed["cause"]) == (job_id, "Interrupted")
    row = db.execute("SELECT state, attempts, interruptions, last_error FROM pgpool_jobs "
                     "WHERE id = %s", (job_id,)).fetchone()
    assert row[:3] == ("ready", 1, 1) and "handed back at its checkpoint" in row[3]
    # Stopped at a checkpoint: the step it was running when asked to stop ran to its
    # end and was stored; no step runs twice.
    second = host(dsn, record_dir)
    runs = check_resumed(db, record_dir, job_id, claims=2)
    assert len(runs) == STEPS
    assert pgpool.job_status(db, job_id).result["attempt"] == 1
    assert second.stop() == 0


@pytest.mark.own_schema  # a trigger records every checkpoint stored
def test_a_frozen_dispatchers_late_checkpoint_is_never_stored(db, dsn, record_dir):
    db.execute("""
        CREATE TABLE stored (job bigint, state jsonb, at timestamptz DEFAULT clock_timestamp());
        CREATE FUNCTION record_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO stored (job, state) VALUES (NEW.id, NEW.checkpoint);
            RETURN NEW;
        END $$;
        CREATE TRIGGER record_checkpoint AFTER UPDATE OF checkpoint ON pgpool_jobs
            FOR EACH ROW EXECUTE FUNCTION record_checkpoint();
    """)
    frozen = host(dsn, record_dir)
    job_id = pgpool.enqueue(db, "steps", {"steps": STEPS, "seconds": STEP_SECONDS})
    wait_until(lambda: reached(db, job_id, 10), "ten steps checkpointed")
    frozen.send_signal(signal.SIGSTOP)  # the dispatcher alone: its worker runs on
    try:
        # Its worker finishes the step in flight, asks to store its checkpoint, and waits
        # for an answer that never comes until its fence ends it; the lease expires.
        wait_until(lambda: db.execute(
            "SELECT locked_by IS NULL OR lease_until < now() FROM pgpool_jobs WHERE id = %s",
            (job_id,)).fetchone()[0], "the frozen host's lease ran out", timeout=30)
        other = host(dsn, record_dir)
        wait_until(lambda: reached(db, job_id, 0) and checkpoint(db, job_id)["claim"] == 2,
                   "the other host stored a checkpoint", timeout=30)
    finally:
        frozen.send_signal(signal.SIGCONT)
    # Thawed, the frozen dispatcher reads what its dead worker wrote, the late checkpoint
    # among it, and drops its lost job.
    wait_until(lambda: frozen.events("abandoned") or frozen.events("lease_lost"),
               "the thawed dispatcher gave its job up")
    refused = frozen.event("checkpoint_refused")
    assert refused["job_id"] == job_id
    runs = check_resumed(db, record_dir, job_id, claims=2)
    stored = db.execute("SELECT state FROM stored WHERE job = %s ORDER BY at",
                        (job_id,)).fetchall()
    claims = [state["claim"] for (state,) in stored]
    # Every checkpoint of the first claim came before any of the second, and none of the
    # first claim's was stored for a step it ran after the second claim started.
    assert claims == sorted(claims) and set(claims) == {1, 2}
    last_first = max(state["next"] for (state,) in stored if state["claim"] == 1)
    first_steps = sorted(step for _, claim, step in runs if claim == 1)
    assert first_steps[-1] + 1 > last_first  # it ran a step whose checkpoint never landed
    second_start = min(step for _, claim, step in runs if claim == 2)
    assert second_start == last_first
    assert frozen.stop() == 0 and other.stop() == 0
