"""The worker pool on its own: real worker processes, no database.

Outcomes are collected from the pool's callbacks, so these tests see exactly what the
dispatcher would: which job ended how, which worker ran it, which jobs came back unstarted.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from conftest import read_records

from pgpool.job import Job, Outcome
from pgpool.pool import WorkerPool


def job(i: int, kind: str, payload: bytes = b"{}", timeout: float | None = None) -> Job:
    return Job(i, kind, "default", 1, 1, payload, timeout)


def run_pool(jobs: list[Job], *, procs: int = 1, depth: int | None = 2,
             **limits: int) -> tuple[list[Outcome], WorkerPool]:
    """Submit ``jobs``, wait until each has an outcome; return them and the pool."""
    async def main() -> tuple[list[Outcome], WorkerPool]:
        outcomes: list[Outcome] = []
        finished = asyncio.get_running_loop().create_future()

        def on_outcome(outcome: Outcome) -> None:
            outcomes.append(outcome)
            if len(outcomes) == len(jobs):
                finished.set_result(None)

        pool = WorkerPool(procs=procs, modules=["testjobs"], on_outcome=on_outcome,
                          on_returned=lambda jobs: None, on_fatal=finished.set_exception,
                          depth=depth, **limits)
        await pool.start()
        pool.submit(jobs)
        await asyncio.wait_for(finished, 60)
        await pool.stop(grace=10)
        return outcomes, pool

    return asyncio.run(main())


def test_max_tasks_recycles_workers_without_failing_or_losing_jobs(record_dir: Path,
                                                                  monkeypatch):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    outcomes, pool = run_pool([job(i, "whoami") for i in range(10)], depth=4, max_tasks=3)
    assert sorted(o.job.id for o in outcomes) == list(range(10))
    assert all(o.error is None for o in outcomes)
    assert pool.replaced == 3  # after jobs 3, 6 and 9
    pids = [r[2] for r in read_records(record_dir)]
    assert len(pids) == 10 and len(set(pids)) == 4


def test_max_memory_fails_the_runaway_job_alone_and_replaces_its_worker(
        record_dir: Path, monkeypatch):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    jobs = [job(1, "hog", b'{"mib": 1024}'), job(2, "hog", b'{"mib": 8}'),
            job(3, "whoami")]
    outcomes, pool = run_pool(jobs, max_memory=512 * 2**20)
    by_id = {o.job.id: o for o in outcomes}
    assert by_id[1].cause == "MemoryError"
    assert "MemoryError" in by_id[1].error
    assert by_id[2].error is None and by_id[3].error is None
    assert pool.replaced == 1
    first_pid = next(r[2] for r in read_records(record_dir) if r[0] == 1)
    assert all(r[2] != first_pid for r in read_records(record_dir) if r[0] in (2, 3))


def test_a_crash_blames_only_the_running_job_and_reruns_the_queued_one(
        record_dir: Path, monkeypatch):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    # One worker, depth 2: job 2 sits queued behind the crashing job 1.
    outcomes, pool = run_pool([job(1, "crash"), job(2, "whoami")], depth=2)
    by_id = {o.job.id: o for o in outcomes}
    assert by_id[1].error == "worker died: signal 9 (SIGKILL)"
    assert by_id[2].error is None
    assert pool.replaced == 1
    records = read_records(record_dir)
    assert [r[0] for r in records if r[3] == "run"] == [2]  # ran once, on the new worker
    assert os.getpid() not in {r[2] for r in records}


def test_short_jobs_travel_to_workers_in_chunks():
    outcomes, pool = run_pool([job(i, "noop") for i in range(3000)], procs=2, depth=None)
    assert sorted(o.job.id for o in outcomes) == list(range(3000))
    assert pool.depth > 2  # it learned that these jobs are short
    assert pool.frames_sent < 3000 / 4, pool.frames_sent


def test_long_jobs_are_dealt_one_per_idle_worker_first():
    outcomes, pool = run_pool([job(i, "noop") for i in range(2)], procs=2, depth=None)
    assert len(outcomes) == 2
    assert pool.frames_sent == 2  # one frame to each worker, not both jobs to one


def test_what_a_worker_imports_leaves_out_psycopg() -> None:
    # Every worker imports pgpool (handler modules use @pgpool.handler) and, started by the
    # `pgpool` script, pgpool.cli again. psycopg would add about 0.15 s of CPU to the start
    # of each worker, which never talks to the database.
    probe = ("import sys, pgpool, pgpool.cli, pgpool.worker, handlers.cpu; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('psycopg', 'psycopg_pool', 'asyncio')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, check=True)
    assert done.stdout.strip() == "[]"
