"""A job whose lease is lost while it waits in a worker's pipe behind a running job: it is
skipped there, and the job running ahead of it runs on, uncharged.

With long jobs the pool keeps one job queued behind each running one (`WorkerPool.depth`),
so about half of what an operator sees as running is really waiting. Cancelling such a job
(or the heartbeat finding its lease gone) must not kill the worker, nor charge the running
job an attempt. The jobs are tests/handlers/testjobs.py ``gated`` jobs: each runs until the
test creates its release file, so which job runs and which waits is decided by the test, not
by durations. Real dispatchers and workers on real PostgreSQL; the pool-level tests at the
end drive real workers through the races the host-level tests cannot time.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import psycopg
import pytest
from commands import RUN, run_pgpool
from dbtools import one
from processes import Pgpool, alive, start_pgpool
from raw_worker import RawWorker, item
from records import read_records
from waits import wait_until

import pgpool
from pgpool.host.attempt import AttemptEnd, Job
from pgpool.host.pool import LEASE_LOST, WorkerPool
from pgpool.worker import ipc


def start_two(db: psycopg.Connection, dsn: str, record_dir: Path, release: Path,
              *options: str) -> tuple[Pgpool, int, int]:
    """Two ``gated`` jobs (one attempt each) on a host with one worker that claims both at
    once: one runs, the other waits in the worker's pipe behind it. The host, the running
    job's id and the queued one's."""
    with db.transaction():
        ids = [pgpool.enqueue(db, "gated", {"release": str(release)}, max_attempts=1)
               for _ in range(2)]
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--batch", "2", *options,
                        record_dir=record_dir)
    (running,) = wait_until(lambda: [r[0] for r in read_records(record_dir)],
                            "the first job to start")
    (queued,) = set(ids) - {running}
    # Claimed together and both handed to the one worker (a pool keeps two jobs per worker
    # until it knows how long they take): the second waits in its pipe.
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs WHERE state = 'running'")
               == (2,), "both jobs to be claimed")
    return host, running, queued


def wait_for_the_drop(host: Pgpool) -> None:
    """Wait until the host has told its worker to skip the lost job: the event is logged
    once the message is on its way, ahead of anything else the worker reads."""
    wait_until(lambda: host.events("lost_queued") or host.events("job_dead"),
               "the host to drop the lost job")
    assert not host.events("job_dead"), (
        "the running job was killed and dead-lettered for the queued job's loss:\n"
        + host.stderr)
    assert host.events("lost_queued")[0]["jobs"] == 1


def by_job(record_dir: Path) -> dict[int, list[tuple[int, str]]]:
    """(claim, event) records by job id, in the order each worker wrote them."""
    out: dict[int, list[tuple[int, str]]] = {}
    for job_id, claim, _, what in read_records(record_dir):
        out.setdefault(job_id, []).append((claim, what))
    return out


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_cancelling_a_queued_job_leaves_the_job_running_ahead_of_it_alone(
        db, dsn, record_dir, tmp_path):
    release = tmp_path / "release"
    # A short lease: the cancelled job keeps its row (running, no owner) until its lease
    # ends, and only then is dead-lettered.
    host, running, queued = start_two(db, dsn, record_dir, release, "--lease", "6")
    done = run_pgpool(dsn, "cancel", str(queued))
    assert done.returncode == 0, done.stderr
    assert host.event("lease_lost")["jobs"] == 1
    wait_for_the_drop(host)

    release.touch()
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs")[0] == 0,
               "the running job to be acked and the cancelled one dead-lettered")
    # It ran once, to its end, on the worker it started on: done on its first attempt.
    assert by_job(record_dir) == {running: [(1, "start"), (1, "end")]}
    pids = {pid for job_id, _, pid, _ in read_records(record_dir)}
    assert len(pids) == 1
    assert one(db, "SELECT count(*) FROM pgpool_dead WHERE id = %s", running) == (0,)
    # The cancelled one never started, and is dead-lettered as any cancel is.
    reason, error = one(db, "SELECT reason, last_error FROM pgpool_dead WHERE id = %s",
                        queued)
    assert reason == "cancelled"
    assert " while running attempt 1 on " in error
    assert host.stop() == 0
    finished = host.event("finished")
    assert (finished["done"], finished["retried"], finished["dead"], finished["lost"]) == (
        1, 0, 0, 0)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_queued_job_the_heartbeat_finds_lost_is_skipped_and_runs_again_later(
        db, dsn, record_dir, tmp_path):
    release = tmp_path / "release"
    lease = 6
    host, running, queued = start_two(db, dsn, record_dir, release, "--lease", str(lease))
    # The queued job's lease is taken away (as if another host held it now): the next
    # heartbeat finds it lost.
    (lease_until,) = one(db, "UPDATE pgpool_jobs SET locked_by = 'elsewhere' WHERE id = %s "
                             "RETURNING lease_until", queued)
    assert host.event("lease_lost")["jobs"] == 1
    wait_for_the_drop(host)
    # The lost job's lease ends on the server: its deadline, never extended since, has
    # passed in the worker too. The running job's lease is still extended, and its worker
    # told so: it runs on past that point.
    wait_until(lambda: one(db, "SELECT now() > %s", lease_until)[0],
               "the lost lease to end", timeout=3 * lease)
    assert by_job(record_dir) == {running: [(1, "start")]}
    (pid,) = {pid for _, _, pid, _ in read_records(record_dir)}
    assert alive(pid), "the running job's worker ended at the lost job's deadline"

    release.touch()
    # The running job ends done; the lost one goes back through the reaper (its attempt
    # never started, so it is not counted) and runs, on its second claim only.
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs")[0] == 0,
               "both jobs to finish", timeout=10 * lease)
    records = by_job(record_dir)
    assert records[running] == [(1, "start"), (1, "end")]
    assert records[queued] == [(2, "start"), (2, "end")]
    pids = {pid for job_id, _, pid, _ in read_records(record_dir)}
    assert len(pids) == 1, "a worker was replaced"
    assert one(db, "SELECT count(*) FROM pgpool_dead")[0] == 0
    assert host.stop() == 0
    finished = host.event("finished")
    assert (finished["done"], finished["retried"], finished["dead"], finished["lost"]) == (
        2, 0, 0, 0)


# --- the races, driven by hand ------------------------------------------------------------


@pytest.fixture
def raw_worker(record_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    w = RawWorker()
    yield w
    w.close()


def events_of(record_dir: Path) -> list[tuple[int, int, str]]:
    return sorted((job_id, claim, what) for job_id, claim, _, what in read_records(record_dir))


def test_a_dropped_job_waiting_in_a_worker_is_skipped_in_its_place_and_the_worker_goes_on(
        raw_worker: RawWorker, record_dir: Path, tmp_path: Path) -> None:
    release = tmp_path / "release"
    # Job 2's first attempt loses its lease while it waits; its second attempt, sent to
    # the same worker, is another job as far as a drop goes. The drop comes in the same
    # read as the jobs: it has been acted on before job 1 (held until released) can end.
    raw_worker.send(ipc.Jobs([item(1, "gated", {"release": str(release)}), item(2, "whoami"),
                              item(2, "whoami", attempt=2), item(3, "whoami")]),
                    ipc.Drop([(2, 1)]))
    wait_until(lambda: events_of(record_dir), "job 1 to start")
    release.touch()
    answers = [raw_worker.receive() for _ in range(4)]
    assert [type(a).__name__ for a in answers] == ["Done", "Skipped", "Done", "Done"]
    assert [a.id for a in answers] == [1, 2, 2, 3]
    # A drop that comes once a job is over changes nothing: the worker carries on.
    raw_worker.send(ipc.Drop([(1, 1), (3, 1)]))
    raw_worker.send(ipc.Jobs([item(4, "whoami")]))
    answer = raw_worker.receive()
    assert isinstance(answer, ipc.Done) and answer.id == 4
    raw_worker.send(ipc.Stop())
    assert raw_worker.receive() == ipc.Returned([])
    assert raw_worker.receive() is None
    raw_worker.process.join(10)
    assert raw_worker.process.exitcode == 0
    assert events_of(record_dir) == [(1, 1, "end"), (1, 1, "start"), (2, 2, "run"),
                                     (3, 1, "run"), (4, 1, "run")]


def test_a_dropped_job_the_worker_has_started_ends_it_at_once_with_its_process_group(
        raw_worker: RawWorker, record_dir: Path, tmp_path: Path) -> None:
    # The dispatcher sends the drop believing job 2 waits behind job 1, but job 1 has
    # ended meanwhile and job 2 runs: the worker ends itself, and what job 2's handler
    # started, without writing an outcome for it; job 3 never starts.
    release = tmp_path / "release"
    raw_worker.send(ipc.Jobs([item(1, "gated", {"release": str(release)}),
                              item(2, "forker", {"sleep": 60, "child_sleep": 60}),
                              item(3, "whoami")]))
    wait_until(lambda: events_of(record_dir), "job 1 to start")
    release.touch()
    wait_until(lambda: {(2, 1, "start"), (2, 1, "child")} <= set(events_of(record_dir)),
               "job 2 and its child to start")
    raw_worker.send(ipc.Drop([(2, 1)]))
    raw_worker.process.join(10)
    assert raw_worker.process.exitcode == -signal.SIGKILL
    answer = raw_worker.receive()
    assert isinstance(answer, ipc.Done) and answer.id == 1
    assert raw_worker.receive() is None
    (child,) = [pid for _, _, pid, what in read_records(record_dir) if what == "child"]
    # The worker signals its whole group, itself included, with one killpg(): the child's
    # SIGKILL is sent before the worker dies, but it dies when the kernel next runs it,
    # which may be just after the worker is reaped (a full suite saw it alive here once).
    wait_until(lambda: not alive(child), "what the dropped job's handler started to die",
               timeout=5)
    assert events_of(record_dir) == [(1, 1, "end"), (1, 1, "start"), (2, 1, "child"),
                                     (2, 1, "start")]


@pytest.mark.parametrize("lost", ["ended", "started"])
def test_the_pool_reads_what_a_worker_wrote_before_it_kills_it_for_a_lost_job(
        record_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: str) -> None:
    # The pool still shows job 1 as running when the heartbeat finds a lease lost, but job
    # 1 has ended and job 2 has started (its outcome waits in the result pipe, unread).
    # ended: job 1 is the lost one; job 2 must run on, to its end.
    # started: job 2 is the lost one; its worker is killed (job 3 goes to the next one).
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    release = [tmp_path / "release-1", tmp_path / "release-2"]
    jobs = [Job(1, "gated", "default", 1, 0, 1, json.dumps({"release": str(release[0])})
                .encode(), None),
            Job(2, "gated", "default", 1, 0, 1, json.dumps({"release": str(release[1])})
                .encode(), None),
            Job(3, "whoami", "default", 1, 0, 1, b"{}", None)]

    async def main() -> tuple[list[AttemptEnd], WorkerPool]:
        outcomes: list[AttemptEnd] = []
        pool = WorkerPool(procs=1, modules=["testjobs"], on_outcome=outcomes.append,
                          on_returned=print, on_fatal=print, depth=3)
        await pool.start()
        pool.submit(jobs)
        async with asyncio.timeout(30):
            while not events_of(record_dir):
                await asyncio.sleep(0.01)
        # From here until drop_lost the event loop is blocked on purpose: the pool cannot
        # read job 1's outcome on its own.
        release[0].touch()
        wait_until(lambda: (2, 1, "start") in events_of(record_dir), "job 2 to start")
        jobs[0 if lost == "ended" else 1].lost = True
        pool.drop_lost()
        release[1].touch()
        async with asyncio.timeout(30):
            while pool.held:
                await asyncio.sleep(0.01)
        await pool.stop(grace=10)
        return outcomes, pool

    outcomes, pool = asyncio.run(main())
    by_id = {o.job.id: (o.error, o.interrupted) for o in outcomes}
    if lost == "ended":
        assert by_id == {1: (None, False), 2: (None, False), 3: (None, False)}
        assert pool.replaced == 0
    else:
        assert by_id == {1: (None, False), 2: (LEASE_LOST, False), 3: (None, False)}
        assert pool.replaced == 1
        assert (2, 1, "end") not in events_of(record_dir)
