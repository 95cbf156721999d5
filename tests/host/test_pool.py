"""The worker pool on its own: real worker processes, no database.

Outcomes are collected from the pool's callbacks, so these tests see exactly what the
dispatcher would: which job ended how, which worker ran it, which jobs came back unstarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from places import ROOT
from processes import HOST_PATHS, alive
from records import read_records

from pgpool.errors import HandlerError
from pgpool.host import pool as pool_module
from pgpool.host.attempt import AttemptEnd, Job
from pgpool.host.pool import MAX_START_FAILURES, WorkerPool
from pgpool.worker import ipc, portable


def job(i: int, kind: str, payload: bytes = b"{}", timeout: float | None = None) -> Job:
    return Job(i, kind, "default", 1, 0, 1, payload, timeout)


@pytest.fixture(params=list(HOST_PATHS))
def pool_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the test's pool on each host path (`HOST_PATHS`): its workers read the switch
    from the environment they inherit, the pool as pgpool read it in this process."""
    env = HOST_PATHS[request.param]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if env:
        monkeypatch.setattr(portable, "PIDFD", False)
        monkeypatch.setattr(portable, "LINUX", False)


def run_pool(jobs: list[Job], *, procs: int = 1, depth: int | None = 2,
             **limits: int) -> tuple[list[AttemptEnd], WorkerPool]:
    """Submit ``jobs``, wait until each has an outcome; return them and the pool."""
    async def main() -> tuple[list[AttemptEnd], WorkerPool]:
        outcomes: list[AttemptEnd] = []
        finished = asyncio.get_running_loop().create_future()

        def on_outcome(outcome: AttemptEnd) -> None:
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


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
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


def test_plain_successes_the_pool_had_not_read_are_reported_before_a_crash_blames_its_job(
        record_dir: Path, monkeypatch):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    # Depth 8 (ring_at 4): jobs 1, 2, 4 and 5 end without ringing the doorbell; the pool
    # reads them when the worker dies on job 6, and blames job 6 alone.
    jobs = [job(i, "whoami") for i in range(1, 6)] + [job(6, "crash"), job(7, "whoami")]
    outcomes, pool = run_pool(jobs, depth=8)
    by_id = {o.job.id: o for o in outcomes}
    assert sorted(by_id) == list(range(1, 8))
    assert [i for i, o in by_id.items() if o.error is not None] == [6]
    assert by_id[6].error == "worker died: signal 9 (SIGKILL)"
    assert pool.replaced == 1
    ran = [r[0] for r in read_records(record_dir) if r[3] == "run"]
    assert sorted(ran) == [1, 2, 3, 4, 5, 7]  # each once: job 7 on the new worker


def test_a_result_larger_than_the_pipe_reaches_the_pool(monkeypatch):
    # 600 kB of JSON: the worker rings each time its result pipe fills, so the pool, which
    # reads the pipe at the doorbell, empties it while the rest is written.
    outcomes, _ = run_pool([job(1, "large_result", b'{"bytes": 600000}'),
                            job(2, "large_result", b'{"bytes": 10}')], depth=8)
    by_id = {o.job.id: o for o in outcomes}
    assert by_id[1].error is None and len(by_id[1].result) > 600_000
    assert by_id[2].error is None


def test_short_jobs_travel_to_workers_in_chunks():
    outcomes, pool = run_pool([job(i, "noop") for i in range(3000)], procs=2, depth=None)
    assert sorted(o.job.id for o in outcomes) == list(range(3000))
    assert pool.depth > 2  # it learned that these jobs are short
    # Once a worker is half drained it is topped up to the depth, 20 ms of work (64 noop
    # jobs, which take microseconds): about 3000 / 32 frames. Under 750 (4 jobs a frame)
    # still leaves room for the job time average being thrown off on a loaded machine: a
    # first job preempted for 10 ms keeps the depth near 2 (one job a frame) for about 140
    # jobs until the average decays, each later job preempted for 100 ms for about 60.
    assert pool.frames_sent < 3000 / 4, pool.frames_sent


def test_long_jobs_are_dealt_one_per_idle_worker_first():
    outcomes, pool = run_pool([job(i, "noop") for i in range(2)], procs=2, depth=None)
    assert len(outcomes) == 2
    assert pool.frames_sent == 2  # one frame to each worker, not both jobs to one


def test_what_a_worker_imports_leaves_out_psycopg() -> None:
    # Every worker imports pgpool (handler modules use @pgpool.handler) and, started by the
    # `pgpool` script, pgpool.cli again. psycopg would add about 0.15 s of CPU to the start
    # of each worker, which never talks to the database. The bench's handler module is one
    # (`pgpool bench` workers import it, and with it the pgpool.bench package).
    probe = ("import sys, pgpool, pgpool.cli, pgpool.worker, handlers.cpu, pgpool.bench.jobs; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('psycopg', 'psycopg_pool', 'asyncio')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


# --- the messages on the pipes ------------------------------------------------------------

EVERY_MESSAGE: list[ipc.Message] = [
    ipc.Jobs([ipc.WorkItem(1, 1, 0, 3, "resize", "default", b'{"w": 1}', 1234.5),
              ipc.WorkItem(2, 3, 1, 3, "email", "mail", b"{}", math.inf)]),
    ipc.Jobs([]),
    ipc.Stop(),
    ipc.Extend(98765.25),
    ipc.Drop([(2, 3), (5, 1)]),
    ipc.Ready(4321),
    ipc.Broken("handler module 'x' not found"),
    ipc.Used(0.0125),
    ipc.Done(1, 0.25),
    ipc.Skipped(5),
    ipc.Failed(2, "Traceback (most recent call last):\nValueError: café\n", "ValueError", 0.5),
    ipc.Snoozed(6, 30.0, 0.125),
    ipc.Ended(7, "discard", "order 48113 refused", "Discard", 0.01),
    ipc.Finished(8, 0.5, b'{"score": 1.5}', None,
                 ([{"kind": "next", "payload": '{"n": 1}'}], [])),
    ipc.Finished(9, 0.5, None, "too big", None),
    ipc.Returned([3, 4]),
    ipc.Returned([]),
    ipc.Retiring("recycled after 3 jobs"),
    ipc.Checkpoint(9, 2, b'{"next": 4}'),
    ipc.LoadCheckpoint(9, 2),
    ipc.Progress(9, 2, 3.5, 10, "rendering"),
    ipc.HandedBack(9, 1.25),
    ipc.Stored(9, None),
    ipc.Loaded(9, b'{"next": 4}'),
]


def test_every_message_arrives_whole_and_named_however_the_stream_is_split() -> None:
    assert {type(m) for m in EVERY_MESSAGE} == set(ipc.MESSAGES)
    stream = b"".join(ipc.encode(m) for m in EVERY_MESSAGE)
    for cut in range(len(stream) + 1):
        decoder = ipc.Decoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert got == EVERY_MESSAGE
        assert [type(m) for m in got] == [type(m) for m in EVERY_MESSAGE]
    decoder = ipc.Decoder()
    got = [m for i in range(len(stream)) for m in decoder.feed(stream[i : i + 1])]
    assert got == EVERY_MESSAGE
    jobs = got[0]
    assert isinstance(jobs, ipc.Jobs)
    assert all(type(item) is ipc.WorkItem for item in jobs.jobs)
    assert (jobs.jobs[1].kind, jobs.jobs[1].queue, jobs.jobs[1].payload) == ("email", "mail",
                                                                             b"{}")


def test_a_claimed_job_goes_to_its_worker_as_a_named_work_item() -> None:
    item = Job(7, "resize", "images", 3, 1, 5, b'{"w": 1}', 30.0, deadline=42.5).wire()
    assert item == ipc.WorkItem(id=7, attempt=3, uncounted=1, max_attempts=5, kind="resize",
                                queue="images", payload=b'{"w": 1}', deadline=42.5)
    # Snoozes are not counted either: the worker's attempt is 3 - (1 + 1).
    item = Job(7, "resize", "images", 3, 1, 5, b"{}", 30.0, snoozes=1).wire()
    assert (item.attempt, item.uncounted) == (3, 2)
    assert type(item) is ipc.WorkItem


# --- the lease fence: a worker ends itself at its deadline (pgpool.worker.fence) ----------

def run_fenced(jobs: list[Job], *, deadline_in: dict[int, float] | None = None,
               extend_every: float | None = None, min_left_to_start: float = 0.0,
               until: Callable[[WorkerPool], bool],
               ) -> tuple[list[AttemptEnd], list[Job], WorkerPool]:
    """Run ``jobs`` on one worker until ``until(pool)`` holds. ``deadline_in`` gives job ids
    a deadline that many seconds after the pool has started (a start takes a second or more
    on a loaded machine, so a deadline taken before it could pass before the job is
    submitted). With ``extend_every``, move every job's deadline to a second from now that
    often and tell the workers, as the heartbeat does. Returns the outcomes, the jobs handed
    back and the pool."""
    async def main() -> tuple[list[AttemptEnd], list[Job], WorkerPool]:
        outcomes: list[AttemptEnd] = []
        returned: list[Job] = []
        pool = WorkerPool(procs=1, modules=["testjobs"], on_outcome=outcomes.append,
                          on_returned=returned.extend, on_fatal=print, depth=4,
                          min_left_to_start=min_left_to_start)
        await pool.start()
        for job in jobs:
            if job.id in (deadline_in or {}):
                job.deadline = time.monotonic() + deadline_in[job.id]
        pool.submit(jobs)
        async with asyncio.timeout(30):  # every case here is over within about 5 s
            while not until(pool):
                await asyncio.sleep(0.05)
                if extend_every is not None:
                    for j in jobs:
                        j.deadline = time.monotonic() + 1
                    pool.extend()
                    await asyncio.sleep(extend_every)
        await pool.stop(grace=10)
        return outcomes, returned, pool

    return asyncio.run(main())


@pytest.mark.xdist_group("timing")  # its timing is its subject: see tests/conftest.py
@pytest.mark.parametrize("how", ["sleep", "gil"])
def test_a_worker_past_its_deadline_is_ended_by_the_kernel_and_its_job_not_acked(
        record_dir: Path, monkeypatch, how: str):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    stuck = Job(1, "stuck", "default", 1, 0, 1,
                json.dumps({"how": how, "seconds": 20}).encode(), None)
    after = Job(2, "whoami", "default", 1, 0, 1, b"{}", None)  # queued behind it, no deadline
    replaced_at = []

    def done(p: WorkerPool) -> bool:
        if p.replaced and not replaced_at:
            replaced_at.append(time.monotonic())
        return p.held == 0

    outcomes, returned, pool = run_fenced([stuck, after], deadline_in={1: 1.0}, until=done)
    deadline = stuck.deadline
    assert deadline is not None
    # Ended by the timer, not the dispatcher (which never killed it): not acked, not
    # reported. The job queued behind it went back to the backlog and ran on the new worker.
    assert pool.replaced == 1
    assert [(o.job.id, o.error) for o in outcomes] == [(2, None)]
    assert returned == []
    assert sorted((r[0], r[3]) for r in read_records(record_dir)) == [(1, "start"), (2, "run")]
    # Stuck for 20 s, it was gone (and replaced) at its deadline: not before, and well
    # within 5 s after (the pool notices a death within 0.05 s of polling plus the time it
    # takes to start a new worker on a loaded 2-core machine).
    assert deadline <= replaced_at[0] < deadline + 5


def test_an_extension_keeps_a_worker_alive_past_its_first_deadline(record_dir: Path,
                                                                   monkeypatch):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    # Stuck 3 s in time.sleep, with a 1 s deadline moved on every 0.35 s.
    long = Job(1, "stuck", "default", 1, 0, 1, b'{"how": "sleep", "seconds": 3}', None)
    outcomes, _, pool = run_fenced([long], deadline_in={1: 1.0}, extend_every=0.3,
                                   until=lambda p: p.held == 0)
    assert [(o.job.id, o.error) for o in outcomes] == [(1, None)]
    assert pool.replaced == 0


def test_a_job_with_too_little_lease_left_is_handed_back_and_never_started(
        record_dir: Path, monkeypatch):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    late = Job(1, "whoami", "default", 1, 0, 1, b"{}", None)
    fine = Job(2, "whoami", "default", 1, 0, 1, b"{}", None)
    outcomes, returned, pool = run_fenced([late, fine], deadline_in={1: 0.5, 2: 60},
                                          min_left_to_start=5, until=lambda p: p.held == 0)
    assert returned == [late]
    assert pool.replaced == 0
    assert [o.job.id for o in outcomes] == [2]
    assert [r[0] for r in read_records(record_dir)] == [2]


def test_a_job_whose_deadline_passes_while_queued_in_a_worker_never_starts(
        record_dir: Path, monkeypatch):
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    # ``queued`` waits in the worker's pipe behind a 1 s job, and its deadline passes
    # meanwhile (0.3 s: the hand-off takes milliseconds, the first job a full second).
    first = Job(1, "stuck", "default", 1, 0, 1, b'{"how": "sleep", "seconds": 1}', None)
    queued = Job(2, "whoami", "default", 1, 0, 1, b"{}", None)
    after = Job(3, "whoami", "default", 1, 0, 1, b"{}", None)
    outcomes, returned, pool = run_fenced([first, queued, after], deadline_in={2: 0.3},
                                          until=lambda p: p.held == 0)
    assert pool.replaced == 1
    assert returned == []
    assert [o.job.id for o in outcomes] == [1, 3]
    assert sorted((r[0], r[3]) for r in read_records(record_dir)) == [
        (1, "end"), (1, "start"), (3, "run")]


# --- a worker's end, step by step (pool._reap) --------------------------------------------

class Callbacks:
    """The pool's three callbacks, recording what the dispatcher would see."""

    def __init__(self) -> None:
        self.outcomes: list[AttemptEnd] = []
        self.returned: list[Job] = []
        self.fatal: list[str] = []
        self._changed = asyncio.Event()

    def on_outcome(self, outcome: AttemptEnd) -> None:
        self.outcomes.append(outcome)
        self._changed.set()

    def on_returned(self, jobs: list[Job]) -> None:
        self.returned.extend(jobs)
        self._changed.set()

    def on_fatal(self, reason: str) -> None:
        self.fatal.append(reason)
        self._changed.set()

    async def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 60,
                       tick: Callable[[], None] | None = None) -> None:
        """Wait until ``check()`` holds after a callback; ``tick`` runs every 50 ms meanwhile,
        as the dispatcher's own tick does."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not check():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                pytest.fail(f"timed out after {timeout}s waiting for {what}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05 if tick else left))
            if tick:
                tick()


def new_pool(calls: Callbacks, modules: list[str], **options: Any) -> WorkerPool:
    return WorkerPool(procs=options.pop("procs", 1), modules=modules,
                      on_outcome=calls.on_outcome, on_returned=calls.on_returned,
                      on_fatal=calls.on_fatal, **options)


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A handler module ``gatejobs`` on the workers' path: kind "gate" writes its worker's
    pid to its payload's "started" file, then runs until its "release" file exists.
    Importing the module exits the process with code 3 while the returned path exists."""
    (tmp_path / "gatejobs.py").write_text(textwrap.dedent('''
        import os, time
        from pathlib import Path
        import pgpool

        if Path(os.environ["GATE_CLOSED"]).exists():
            os._exit(3)

        @pgpool.handler("gate")
        def gate(payload):
            Path(payload["started"]).write_text(str(os.getpid()))
            deadline = time.monotonic() + 60
            while not Path(payload["release"]).exists() and time.monotonic() < deadline:
                time.sleep(0.005)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers get this sys.path
    closed = tmp_path / "closed"
    monkeypatch.setenv("GATE_CLOSED", str(closed))
    return closed


def bytes_read(pid: int) -> int:
    """What process ``pid`` has read so far (``rchar``: pipes included; a handler waiting on
    a file's existence reads nothing)."""
    io = Path(f"/proc/{pid}/io").read_text()
    return int(next(line.split()[1] for line in io.splitlines() if line.startswith("rchar:")))


async def file_appears(path: Path, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not path.exists():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {path}")
        await asyncio.sleep(0.01)


def test_a_stopping_worker_finishes_its_job_hands_back_the_rest_and_is_not_replaced(
        tmp_path: Path, gate: Path) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    payload = json.dumps({"started": str(started), "release": str(release)}).encode()

    async def main() -> tuple[Callbacks, WorkerPool]:
        calls = Callbacks()
        pool = new_pool(calls, ["gatejobs"], depth=4)
        await pool.start()
        pool.submit([job(1, "gate", payload), *(job(i, "gate", payload) for i in (2, 3, 4))])
        await file_appears(started)  # job 1 runs; 2, 3 and 4 wait in the worker's pipe
        async with asyncio.timeout(30):
            while not (pid := started.read_text()):  # created, its pid not yet written
                await asyncio.sleep(0.001)
            before = bytes_read(int(pid))
            stopping = asyncio.create_task(pool.stop(grace=30))
            await asyncio.sleep(0)  # stop() has written Stop
            # Job 1 ends only once the worker has read it: a Stop still in the pipe when a
            # job ends is not waited for (worker._Inbox), and the next job would start.
            while bytes_read(int(pid)) < before + len(ipc.encode(ipc.Stop())):
                await asyncio.sleep(0.001)
        release.touch()
        await asyncio.wait_for(stopping, 60)
        return calls, pool

    calls, pool = asyncio.run(main())
    assert [(o.job.id, o.error) for o in calls.outcomes] == [(1, None)]
    assert [j.id for j in calls.returned] == [2, 3, 4]
    assert pool.replaced == 0 and pool.held == 0


def test_a_job_past_its_deadline_fails_alone_and_its_worker_is_replaced(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))

    async def main() -> tuple[Callbacks, WorkerPool]:
        calls = Callbacks()
        pool = new_pool(calls, ["testjobs"], depth=2)
        await pool.start()
        pool.submit([job(1, "spin", timeout=0.2), job(2, "whoami")])
        await calls.wait_for(lambda: len(calls.outcomes) == 2, "both outcomes",
                             tick=pool.check_deadlines)
        await pool.stop(grace=10)
        return calls, pool

    calls, pool = asyncio.run(main())
    by_id = {o.job.id: o for o in calls.outcomes}
    assert by_id[1].cause == by_id[1].error == "timeout: killed after 0.2s"
    assert by_id[2].error is None
    assert pool.replaced == 1
    pids = {r[0]: r[2] for r in read_records(record_dir)}
    assert pids[1] != pids[2]  # job 2 waited behind the killed job: it ran on the new worker


def test_a_timeout_behind_unread_successes_is_timed_from_its_own_start(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))

    async def main() -> Callbacks:
        calls = Callbacks()
        pool = new_pool(calls, ["testjobs"], depth=8)  # ring_at 4
        await pool.start()
        # After job 1, 3 jobs wait: its success rings for more. Job 2's does not (once
        # per frame): the pool still has it in front, without a timeout, while job 3,
        # which has one, spins. It is killed all the same, and job 1's 0.4 s (longer than
        # job 3's timeout) is not counted as job 3's.
        pool.submit([job(1, "burn", b'{"cpu": 0.4}'), job(2, "whoami"),
                     job(3, "spin", timeout=0.3), job(4, "whoami")])
        await calls.wait_for(lambda: len(calls.outcomes) == 4, "every outcome",
                             tick=pool.check_deadlines)
        await pool.stop(grace=10)
        return calls

    calls = asyncio.run(main())
    by_id = {o.job.id: o for o in calls.outcomes}
    assert [i for i in sorted(by_id) if by_id[i].error is not None] == [3]
    assert by_id[3].error == "timeout: killed after 0.3s"
    assert by_id[3].elapsed >= 0.3
    runs = [r for r in read_records(record_dir) if r[3] in ("run", "start")]
    assert sorted(r[0] for r in runs) == [2, 3, 4]  # each once (burn records nothing)


@pytest.mark.usefixtures("pool_path")
def test_a_killed_worker_is_replaced_even_while_its_handlers_child_holds_the_pipe(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The handler's child inherits the worker's result pipe and would sleep 40 s: the
    # worker's death must be seen from the process, and the child must die with it.
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    payload = json.dumps({"sleep": 60, "child_sleep": 40}).encode()

    async def main() -> tuple[Callbacks, WorkerPool, float]:
        calls = Callbacks()
        pool = new_pool(calls, ["testjobs"], depth=2)
        await pool.start()
        started = asyncio.get_running_loop().time()
        pool.submit([job(1, "forker", payload, timeout=0.5), job(2, "whoami")])
        # 20 s: well under the child's 40 s, so holding the pipe would fail this wait; and
        # far above the 0.5 s timeout plus a worker start on a loaded 2-core machine.
        await calls.wait_for(lambda: len(calls.outcomes) == 2, "both outcomes", timeout=20,
                             tick=pool.check_deadlines)
        elapsed = asyncio.get_running_loop().time() - started
        await pool.stop(grace=10)
        return calls, pool, elapsed

    calls, pool, elapsed = asyncio.run(main())
    by_id = {o.job.id: o for o in calls.outcomes}
    assert by_id[1].cause == "timeout: killed after 0.5s"
    assert by_id[2].error is None
    assert pool.replaced == 1
    records = read_records(record_dir)
    (child,) = [pid for _, _, pid, event in records if event == "child"]
    # Killed with its worker's process group: no need to wait, it is gone already (at
    # most a zombie that its new parent has not reaped yet).
    assert not alive(child), f"the handler's child {child} outlived its worker"
    print(f"timeout 0.5 s: both outcomes after {elapsed:.2f} s")


@pytest.mark.usefixtures("pool_path")
def test_a_worker_that_ends_on_its_own_takes_what_its_handler_started_with_it(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The handler returns and leaves a child behind (holding the result pipe, sleeping
    # far longer than the test may take); the worker retires after one job, and job 2
    # needs its replacement.
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    payload = json.dumps({"child_sleep": 600}).encode()
    try:
        outcomes, pool = run_pool([job(1, "forker", payload), job(2, "whoami")], max_tasks=1)
        assert [o.error for o in outcomes] == [None, None]
        assert pool.replaced >= 1
        (child,) = [pid for _, _, pid, event in read_records(record_dir) if event == "child"]
        assert not alive(child), f"the handler's child {child} outlived its worker"
    finally:
        for _, _, pid, event in read_records(record_dir):
            if event == "child" and alive(pid):
                os.kill(pid, 9)


def test_a_worker_that_exits_while_starting_fails_the_start_and_is_not_replaced(
        gate: Path) -> None:
    gate.touch()
    pool = new_pool(Callbacks(), ["gatejobs"], procs=2)
    with pytest.raises(HandlerError, match=r"exited while starting \(worker died: exit code 3\)"):
        asyncio.run(pool.start())
    # Both workers die; whichever is reaped second must not be counted as a failed start
    # and replaced while start() is still running (it once could be).
    assert pool.replaced == 0


@pytest.fixture
def slow_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A handler module ``slowstart`` whose import records its worker's pid in a directory,
    then waits while a "hold" file exists: a test can kill a worker that is starting."""
    (tmp_path / "slowstart.py").write_text(textwrap.dedent('''
        import os, time
        from pathlib import Path
        import pgpool

        (Path(os.environ["SLOWSTART_PIDS"]) / str(os.getpid())).touch()
        while Path(os.environ["SLOWSTART_HOLD"]).exists():
            time.sleep(0.01)

        @pgpool.handler("slow")
        def slow(payload):
            pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers get this sys.path
    pids, hold = tmp_path / "pids", tmp_path / "hold"
    pids.mkdir()
    hold.touch()
    monkeypatch.setenv("SLOWSTART_PIDS", str(pids))
    monkeypatch.setenv("SLOWSTART_HOLD", str(hold))
    return pids, hold


@pytest.mark.parametrize("kills", [1, MAX_START_FAILURES])
def test_a_worker_killed_while_starting_is_started_again_a_few_times(
        slow_start: tuple[Path, Path], kills: int) -> None:
    # A worker killed from outside while it imports (an operator, the OOM killer, the chaos
    # soak) is not a module that cannot load: the start goes on with another, up to a bound.
    pids, hold = slow_start

    async def main() -> WorkerPool:
        pool = new_pool(Callbacks(), ["slowstart"])
        start = asyncio.ensure_future(pool.start())

        async def importing(n: int) -> int:
            """The pid of the n-th worker to start importing; the start's error if it ended."""
            deadline = time.monotonic() + 30
            while len(started := sorted(pids.iterdir(), key=os.path.getmtime)) < n:
                if start.done():
                    await start  # raises what ended the start
                if time.monotonic() > deadline:
                    pytest.fail(f"worker {n} never started importing")
                await asyncio.sleep(0.01)
            return int(started[n - 1].name)

        for n in range(1, kills + 1):
            os.kill(await importing(n), 9)
        if kills == MAX_START_FAILURES:
            with pytest.raises(HandlerError, match=r"exited while starting \(worker died: "
                                                   r"signal 9 \(SIGKILL\)\)"):
                await start
            return pool
        await importing(kills + 1)  # its replacement
        hold.unlink()
        await start
        await pool.stop(grace=10)
        return pool

    pool = asyncio.run(main())
    assert pool.replaced == kills - (kills == MAX_START_FAILURES)
    assert dict(pool.restarts) == ({"crash": pool.replaced} if pool.replaced else {})


def test_a_worker_that_cannot_import_its_handlers_fails_the_start() -> None:
    async def main() -> None:
        await new_pool(Callbacks(), ["no_such_module_here"]).start()

    with pytest.raises(HandlerError, match="handler module 'no_such_module_here' not found"):
        asyncio.run(main())


def test_replacements_that_keep_failing_to_start_stop_the_pool(gate: Path) -> None:
    async def main() -> tuple[Callbacks, WorkerPool]:
        calls = Callbacks()
        pool = new_pool(calls, ["testjobs", "gatejobs"])
        await pool.start()
        gate.touch()  # from now on a new worker exits while importing its handler modules
        pool.submit([job(1, "crash")])
        await calls.wait_for(lambda: bool(calls.fatal), "on_fatal")
        await pool.stop(grace=10)
        return calls, pool

    calls, pool = asyncio.run(main())
    assert [(o.job.id, o.cause) for o in calls.outcomes] == [
        (1, "worker died: signal 9 (SIGKILL)")]
    assert calls.fatal == ["worker processes keep failing to start (worker died: exit code 3); "
                           "stopping this dispatcher"]
    assert pool.replaced == MAX_START_FAILURES  # the crashed worker's and two failed ones'
    assert pool.closing


def test_a_spare_worker_takes_a_crashed_ones_place_and_another_is_started(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The spare was started before the crash: the job queued behind the crashing one runs
    # in it. Another spare is started in its place, and the pool's stop ends it.
    monkeypatch.setenv("TESTJOBS_RECORD", str(record_dir))
    monkeypatch.setattr(pool_module, "SPARES_AFTER", 0)  # not 5 s after the start

    async def main() -> tuple[Callbacks, WorkerPool, int, list[int]]:
        calls = Callbacks()
        pool = new_pool(calls, ["testjobs"], spares=1, depth=2)
        await pool.start()
        while not pool.spare_pids:  # started by a timer, SPARES_AFTER after the start
            await asyncio.sleep(0.01)
        (spare,) = pool.spare_pids
        pool.submit([job(1, "crash"), job(2, "whoami")])
        await calls.wait_for(lambda: len(calls.outcomes) == 2, "both outcomes")
        after = pool.spare_pids
        assert all(alive(pid) for pid in after)
        await pool.stop(grace=10)
        return calls, pool, spare, after

    calls, pool, spare, after = asyncio.run(main())
    assert [(o.job.id, o.error) for o in calls.outcomes] == [
        (1, "worker died: signal 9 (SIGKILL)"), (2, None)]
    assert [r[2] for r in read_records(record_dir) if r[0] == 2] == [spare]
    assert pool.replaced == 1
    assert len(after) == 1 and after[0] != spare
    assert not alive(after[0])


@pytest.mark.usefixtures("pool_path")
def test_a_hard_stop_kills_running_jobs_without_reporting_or_replacing() -> None:
    async def main() -> tuple[Callbacks, WorkerPool]:
        calls = Callbacks()
        pool = new_pool(calls, ["testjobs"], procs=2)
        await pool.start()
        pool.submit([job(1, "spin"), job(2, "spin")])
        await pool.kill_all()
        return calls, pool

    calls, pool = asyncio.run(main())
    assert calls.outcomes == [] and calls.returned == []
    assert pool.replaced == 0 and pool.held == 0


def test_with_on_cpu_each_attempt_reports_the_cpu_it_and_its_waited_children_used() -> None:
    # --fair-by cpu: the worker measures each attempt, success or failure, and the CPU of
    # the handler's children it waited for; the pool reports it before the outcome.
    jobs = [job(1, "burn", b'{"cpu": 0.2}'), job(2, "burn", b'{"sleep": 0.2}'),
            job(3, "burn", b'{"child_cpu": 0.2}'), job(4, "fail")]

    async def main() -> tuple[dict[int, float], list[tuple[int, bool]]]:
        cpu: dict[int, float] = {}
        ended: list[tuple[int, bool]] = []  # (job, whether its CPU came first)
        finished = asyncio.get_running_loop().create_future()

        def on_outcome(outcome: AttemptEnd) -> None:
            ended.append((outcome.job.id, outcome.job.id in cpu))
            if len(ended) == len(jobs):
                finished.set_result(None)

        pool = WorkerPool(procs=1, modules=["testjobs"], on_outcome=on_outcome,
                          on_returned=lambda jobs: None, on_fatal=finished.set_exception,
                          on_cpu=lambda job, seconds: cpu.setdefault(job.id, seconds))
        await pool.start()
        pool.submit(jobs)
        await asyncio.wait_for(finished, 60)
        await pool.stop(grace=10)
        return cpu, ended

    cpu, ended = asyncio.run(main())
    # In turns across kinds (`pgpool.host.backlog`): the "fail" job runs second.
    assert sorted(ended) == [(1, True), (2, True), (3, True), (4, True)]
    assert cpu[1] >= 0.2, cpu  # its own spin
    assert cpu[2] < 0.1, cpu  # a sleep uses next to none
    assert cpu[3] >= 0.2, cpu  # its child's spin


def test_jobs_that_hold_a_limits_slot_go_ahead_of_the_backlog() -> None:
    """A job of a limited kind holds a fleet-wide slot while it waits in a host's backlog:
    `submit` puts those of ``ahead`` first, before every job claimed earlier, and the rest
    behind, in their order. (No worker is started: the backlog is what is left to send.)"""
    pool = WorkerPool(procs=1, modules=[], on_outcome=print, on_returned=print,
                      on_fatal=print)
    pool.submit([job(1, "a"), job(2, "a")])
    claimed = [job(3, "a"), job(4, "lim"), job(5, "a"), job(6, "lim")]
    pool.submit(claimed, [claimed[1], claimed[3]])
    assert [j.id for j in pool.held_jobs()] == [4, 6, 1, 2, 3, 5]
