"""The chaos checker (bench/chaos_checks.py) on hand-made records and faults: what it must
accept, and what it must flag. No processes, no database."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from chaos_checks import (
    BACKENDS_TERMINATED,
    DISPATCHER_KILL,
    POSTGRES_RESTART,
    WORKER_KILL,
    Attempt,
    DeathBound,
    Fault,
    death_bound,
    duplicate_attempts,
    explain_reruns,
    find_overlaps,
    judge,
    read_attempts,
)

S = 10**9  # one second in the checker's unit (monotonic ns)
LEASE = 2.0
HOST, OTHER_HOST = 100, 200  # dispatcher pids
W1, W2, W3 = 101, 102, 201  # worker pids: W1 and W2 under HOST, W3 under OTHER_HOST


def attempt(job: int, n: int, pid: int, start: float, end: float | None) -> Attempt:
    """An attempt of ``job`` by worker ``pid``; times in seconds."""
    ppid = HOST if pid in (W1, W2) else OTHER_HOST
    return Attempt(job, n, pid, ppid, int(start * S), None if end is None else int(end * S))


def runs(*attempts: Attempt) -> dict[int, list[Attempt]]:
    """Attempts by job, sorted by start, as `read_attempts` returns them."""
    out: dict[int, list[Attempt]] = {}
    for a in sorted(attempts, key=lambda a: a.start):
        out.setdefault(a.job, []).append(a)
    return out


def fault(kind: str, t0: float, t1: float, *, pid: int | None = None, cap: int = 0,
          workers: tuple[int, ...] = (), workers_gone: float | None = None) -> Fault:
    """A fault done from ``t0`` to ``t1``; times in seconds."""
    return Fault(kind, int(t0 * S), int(t1 * S), pid=pid, cap=cap, workers=list(workers),
                 workers_gone=None if workers_gone is None else int(workers_gone * S))


def never_seen(pid: int) -> int | None:
    """A watcher that saw no worker die."""
    return None


def seen_at(**deaths: float) -> DeathBound:
    """A watcher that saw worker ``w<pid>`` die at the given second."""
    known = {int(name[1:]): int(t * S) for name, t in deaths.items()}
    return known.get


# --- records --------------------------------------------------------------------------------


def test_read_attempts_pairs_starts_with_ends_and_ignores_cut_lines(tmp_path):
    (tmp_path / f"{HOST}-{W1}.log").write_text(
        f"7 1 {W1} 5 -\n7 1 {W1} 5 9\n"  # started and ended
        f"8 1 {W1} 10 -\n"  # killed while it ran
        f"9 1 {W1} 12 -")  # cut short by the kill: never started as far as records go
    (tmp_path / f"{OTHER_HOST}-{W3}.log").write_text(f"8 2 {W3} 20 -\n8 2 {W3} 20 25\n")
    assert read_attempts(tmp_path) == {
        7: [Attempt(7, 1, W1, HOST, 5, 9)],
        8: [Attempt(8, 1, W1, HOST, 10, None), Attempt(8, 2, W3, OTHER_HOST, 20, 25)],
    }


# --- overlaps -------------------------------------------------------------------------------


def test_attempts_one_after_the_other_do_not_overlap():
    attempts = runs(attempt(1, 1, W1, 0, 1), attempt(1, 2, W3, 2, 3))
    assert find_overlaps(attempts, never_seen) == []


def test_an_attempt_starting_before_the_previous_one_ended_overlaps():
    a, b = attempt(1, 1, W1, 0, 3), attempt(1, 2, W3, 2, 4)
    assert find_overlaps(runs(a, b), never_seen) == [(a, b)]


def test_a_killed_attempt_ends_when_its_worker_was_seen_dead():
    a, b = attempt(1, 1, W1, 0, None), attempt(1, 2, W3, 2, 3)
    assert find_overlaps(runs(a, b), seen_at(w101=1.5)) == []
    # Seen dead only after the next attempt started: not proven to have stopped in time.
    assert find_overlaps(runs(a, b), seen_at(w101=2.5)) == [(a, b)]
    # Never seen dead: no bound at all.
    assert find_overlaps(runs(a, b), never_seen) == [(a, b)]


def test_death_bound_takes_the_earliest_of_kills_and_sightings():
    faults = [fault(WORKER_KILL, 1.0, 1.2, pid=W1, cap=1),
              fault(DISPATCHER_KILL, 3.0, 3.1, pid=HOST, workers=(W1, W2), workers_gone=3.4)]
    died = death_bound(faults, seen_at(w101=1.3, w102=5.0))
    assert died(W1) == int(1.2 * S)  # the kill returned before the watcher saw it
    assert died(W2) == int(3.4 * S)  # its dispatcher's workers were all gone by then
    assert died(W3) is None


def test_the_same_attempt_started_twice_is_a_duplicate():
    attempts = runs(attempt(1, 1, W1, 0, 1), attempt(1, 1, W3, 2, 3), attempt(2, 1, W1, 4, 5))
    assert duplicate_attempts(attempts) == [(1, 1)]


# --- re-runs --------------------------------------------------------------------------------


def test_a_rerun_without_a_fault_is_unexplained():
    a, b = attempt(1, 1, W1, 0, None), attempt(1, 2, W3, 3, 4)
    causes, unexplained = explain_reruns(runs(a, b), [], lease=LEASE)
    assert not causes
    assert unexplained == [(a, b)]


def test_a_worker_kill_explains_the_last_attempt_its_worker_started():
    a, b = attempt(1, 1, W1, 0, None), attempt(1, 2, W3, 3, 4)
    kill = fault(WORKER_KILL, 1.0, 1.1, pid=W1, cap=1)
    causes, unexplained = explain_reruns(runs(a, b), [kill], lease=LEASE)
    assert causes == {WORKER_KILL: 1}
    assert unexplained == []


def test_a_worker_kill_does_not_explain_an_attempt_it_could_not_interrupt():
    # W1 started job 2 after job 1: the kill interrupted job 2, not job 1.
    a, b = attempt(1, 1, W1, 0, None), attempt(1, 2, W3, 3, 4)
    later = attempt(2, 1, W1, 0.5, None)
    kill = fault(WORKER_KILL, 1.0, 1.1, pid=W1, cap=1)
    _, unexplained = explain_reruns(runs(a, b, later), [kill], lease=LEASE)
    assert unexplained == [(a, b)]
    # A kill of another worker, or one that began after the re-run started, explains nothing.
    for other in (fault(WORKER_KILL, 1.0, 1.1, pid=W2, cap=1),
                  fault(WORKER_KILL, 3.5, 3.6, pid=W1, cap=1)):
        _, unexplained = explain_reruns(runs(a, b), [other], lease=LEASE)
        assert unexplained == [(a, b)]


def test_a_dispatcher_kill_explains_attempts_its_workers_were_running():
    a, b = attempt(1, 1, W2, 0, None), attempt(1, 2, W3, 5, 6)
    kill = fault(DISPATCHER_KILL, 1.0, 1.1, pid=HOST, workers=(W1, W2), workers_gone=1.3)
    causes, unexplained = explain_reruns(runs(a, b), [kill], lease=LEASE)
    assert causes == {DISPATCHER_KILL: 1}
    assert unexplained == []


def test_a_dispatcher_kill_does_not_explain_attempts_after_it_or_of_another_host():
    # Started after the killed dispatcher's workers were gone, or run under the other one.
    too_late = runs(attempt(1, 1, W2, 2, None), attempt(1, 2, W3, 5, 6))
    elsewhere = runs(attempt(1, 1, W3, 0, None), attempt(1, 2, W1, 5, 6))
    kill = fault(DISPATCHER_KILL, 1.0, 1.1, pid=HOST, workers=(W1, W2), workers_gone=1.3)
    for attempts in (too_late, elsewhere):
        _, unexplained = explain_reruns(attempts, [kill], lease=LEASE)
        assert len(unexplained) == 1


def test_a_dispatcher_kill_whose_workers_were_never_seen_gone_covers_ten_seconds():
    kill = fault(DISPATCHER_KILL, 1.0, 1.1, pid=HOST, workers=(W2,))
    assert kill.until == kill.t1 + 10 * S
    attempts = runs(attempt(1, 1, W2, 9, None), attempt(1, 2, W3, 12, 13))
    assert explain_reruns(attempts, [kill], lease=LEASE)[1] == []


@pytest.mark.parametrize("kind", [POSTGRES_RESTART, BACKENDS_TERMINATED])
def test_a_database_fault_explains_reruns_up_to_two_leases_after_it(kind):
    # The fault ends at 2 s; its window reaches 2 + 2 * LEASE = 6 s.
    db_fault = fault(kind, 1.0, 2.0, cap=10)
    near = runs(attempt(1, 1, W1, 5.5, None), attempt(1, 2, W3, 8, 9))
    causes, unexplained = explain_reruns(near, [db_fault], lease=LEASE)
    assert causes == {kind: 1}
    assert unexplained == []
    # An attempt that started after the window, or a re-run that started before the fault.
    for attempts in (runs(attempt(1, 1, W1, 6.5, None), attempt(1, 2, W3, 8, 9)),
                     runs(attempt(1, 1, W1, 0.0, None), attempt(1, 2, W3, 0.5, 0.9))):
        _, unexplained = explain_reruns(attempts, [db_fault], lease=LEASE)
        assert len(unexplained) == 1


# --- the verdict ----------------------------------------------------------------------------


def test_judge_passes_a_clean_run_with_explained_reruns():
    attempts = runs(attempt(1, 1, W1, 0, None), attempt(1, 2, W3, 3, 4),
                    attempt(2, 1, W2, 0, 1))
    kill = fault(WORKER_KILL, 1.0, 1.1, pid=W1, cap=1)
    verdict = judge({1, 2, 3}, attempts, [kill], died=death_bound([kill], never_seen),
                    lease=LEASE, dead={3})
    assert verdict.failures() == []
    assert verdict.figures() == {
        "jobs": 3, "faults": 1, "completed": 2, "dead": 1, "lost": 0, "not drained": 0,
        "overlapping": 0, "duplicate attempts": 0, "re-runs": 1, "interruptible": 1,
        "unexplained re-runs": 0, "attempts never run": 0,
    }


def test_judge_flags_every_broken_rule():
    attempts = runs(
        attempt(1, 1, W1, 0, 3), attempt(1, 2, W3, 2, 4),  # overlapping, unexplained
        attempt(2, 1, W2, 0, 1), attempt(2, 1, W3, 2, 3),  # the same attempt twice
        attempt(9, 1, W1, 5, 6),  # a job nobody enqueued
        attempt(4, 3, W1, 7, None),  # never completed (attempts 1 and 2 never ran)
    )
    verdict = judge({1, 2, 4, 5}, attempts, [], died=never_seen, lease=LEASE, left=1)
    assert verdict.lost == [4, 5]
    assert verdict.strays == [9]
    assert verdict.never_run == 2
    failures = verdict.failures()
    for start in ("lost: 2", "overlapping: 1", "duplicate attempts: 1",
                  "unexplained re-runs: 2", "records of unknown jobs: 1",
                  "2 re-runs, more than the 0 jobs", "not drained: 1"):
        assert any(f.startswith(start) for f in failures), (start, failures)


def test_judge_flags_more_reruns_than_the_faults_could_cause():
    # Both re-runs are explained by the restart, but it could interrupt only one job.
    restart = fault(POSTGRES_RESTART, 1.0, 2.0, cap=1)
    attempts = runs(attempt(1, 1, W1, 1.5, None), attempt(1, 2, W3, 3, 4),
                    attempt(2, 1, W2, 1.5, None), attempt(2, 2, W3, 4, 5))
    died = seen_at(w101=1.6, w102=1.6)
    verdict = judge({1, 2}, attempts, [restart], died=died, lease=LEASE)
    assert verdict.unexplained == []
    assert verdict.failures() == ["2 re-runs, more than the 1 jobs the faults could have "
                                  "interrupted"]
