"""A worker rings its doorbell only when its dispatcher must act (`pgpool.worker.ipc.Outbox`):
for every frame but a plain success, once per frame of jobs as they run low, and when it
runs out; never for a plain success while the dispatcher watches the result pipe itself.
The pool reads what a worker wrote without ringing whenever it must know which job runs.

Real worker processes (`RawWorker`, tests/handlers/testjobs.py): every ring a worker made
is in its doorbell once it has exited, so the counts are exact. Each count includes two
rings that every worker makes here: for its `ipc.Ready`, and for the `ipc.Returned` that
answers the test's Stop.
"""

from __future__ import annotations

import pytest
from raw_worker import RawWorker, item

from pgpool.worker import ipc


@pytest.fixture
def raw_worker():
    w = RawWorker()
    yield w
    w.close()


def run_then_stop(worker: RawWorker, *messages: ipc.ToWorker) -> list[str]:
    """Send ``messages``; once the jobs are over, stop the worker and wait for it to exit:
    the types of what it answered, in order (the Stop's `ipc.Returned` last)."""
    jobs = sum(len(m.jobs) for m in messages if isinstance(m, ipc.Jobs))
    worker.send(*messages)
    answers = [type(worker.receive()).__name__ for _ in range(jobs)]
    worker.send(ipc.Stop())
    answers.append(type(worker.receive()).__name__)
    worker.process.join(10)
    assert worker.process.exitcode == 0
    return answers


def test_plain_successes_ring_once_as_the_jobs_run_low_and_once_at_the_end(
        raw_worker: RawWorker) -> None:
    # After job k of 8, 8 - k wait: at 3 (job 5) it rings for more, once for this frame;
    # at 0 (job 8) it rings as it runs out.
    answers = run_then_stop(raw_worker, ipc.Jobs([item(i, "whoami") for i in range(1, 9)],
                                                 ring_at=3))
    assert answers == ["Done"] * 8 + ["Returned"]
    assert raw_worker.rings() == 2 + 2


def test_anything_but_a_plain_success_rings(raw_worker: RawWorker) -> None:
    # Job 3 fails: it rings whatever waits. Job 5 leaves 1 waiting (ring_at), job 6 none.
    answers = run_then_stop(raw_worker, ipc.Jobs(
        [item(1, "whoami"), item(2, "whoami"), item(3, "fail"), item(4, "whoami"),
         item(5, "whoami"), item(6, "whoami")], ring_at=1))
    assert answers == ["Done", "Done", "Failed", "Done", "Done", "Done", "Returned"]
    assert raw_worker.rings() == 3 + 2


def test_a_watched_worker_never_rings_for_a_plain_success(raw_worker: RawWorker) -> None:
    # ring_at -1: the dispatcher reads the result pipe as it fills (jobs of microseconds).
    answers = run_then_stop(raw_worker, ipc.Jobs([item(i, "whoami") for i in range(1, 9)],
                                                 ring_at=-1))
    assert answers == ["Done"] * 8 + ["Returned"]
    assert raw_worker.rings() == 0 + 2


def test_jobs_sent_without_a_ring_at_ring_after_every_outcome(raw_worker: RawWorker) -> None:
    # What a host whose jobs take several slots sends (`WorkerPool._assign_slots`).
    answers = run_then_stop(raw_worker, ipc.Jobs([item(1, "whoami"), item(2, "whoami")]))
    assert answers == ["Done", "Done", "Returned"]
    assert raw_worker.rings() == 2 + 2
