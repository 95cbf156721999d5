"""The chaos checker (tests/support/chaos_checks.py) on hand-made records and faults: what
it must accept, and what it must flag. No processes, no database."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from chaos_checks import (
    ASKED_TO_FAIL,
    BACKENDS_TERMINATED,
    CALLBACK,
    CHILD,
    DISPATCHER_KILL,
    MEMBER,
    PARENT,
    POSTGRES_RESTART,
    STEPS,
    WORKER_KILL,
    Attempt,
    DeathBound,
    Fault,
    Finished,
    GroupRow,
    Identity,
    Workflows,
    death_bound,
    duplicate_attempts,
    explain_reruns,
    failed_on_purpose,
    find_overlaps,
    judge,
    judge_limits,
    judge_steps,
    judge_workflows,
    most_at_once,
    most_in_window,
    read_attempts,
    read_identities,
    read_steps,
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


def test_judge_explains_a_rerun_after_an_attempt_that_failed_on_purpose():
    # A flaky parent's first claim recorded its end and raised: its re-run is no fault's.
    a, b = attempt(1, 1, W1, 0, 1), attempt(1, 2, W3, 2, 3)
    verdict = judge({1}, runs(a, b), [], died=never_seen, lease=LEASE, failed={(1, 1)})
    assert verdict.causes == {ASKED_TO_FAIL: 1}
    assert verdict.failures() == []
    # Without it, the same re-run is unexplained and over the faults' bound.
    assert len(judge({1}, runs(a, b), [], died=never_seen, lease=LEASE).failures()) == 2


# --- the group workload ---------------------------------------------------------------------


def test_read_identities_and_the_attempts_that_failed_on_purpose(tmp_path):
    (tmp_path / f"{HOST}-{W1}.log").write_text(
        f'7 1 {W1} 5 - chaos.parent {{"children":2,"flaky":true}}\n7 1 {W1} 5 9\n'
        f"8 1 {W1} 10 -\n"  # a plain chaos.record job: no identity
        f'9 1 {W1} 12 - chaos.member {{"g":"d0","i":3}}\n'
        f'10 1 {W1} 14 - chaos.child {{"p":7,')  # cut short by a kill
    identities = read_identities(tmp_path)
    assert identities == {7: (PARENT, {"children": 2, "flaky": True}),
                          9: (MEMBER, {"g": "d0", "i": 3})}
    attempts = read_attempts(tmp_path)
    assert attempts[9] == [Attempt(9, 1, W1, HOST, 12, None)]
    assert failed_on_purpose(attempts, identities) == {(7, 1)}


@dataclass
class World:
    """A run of the group workload, by hand: a planned group d0 (callback 10, member 11
    done, member 12 discarded); parent 20 done on its second claim (the first was killed)
    with children 30 and 31 and group p20.2 (callback 40, members 41 and 42); parent 21
    discarded with none. Members end by 2 s, callbacks start at 5 s."""

    attempts: dict[int, list[Attempt]] = field(default_factory=lambda: runs(
        attempt(11, 1, W1, 0, 1), attempt(12, 1, W2, 0, 2), attempt(10, 1, W3, 5, 6),
        attempt(20, 1, W1, 0, None), attempt(20, 2, W3, 1, 1.5), attempt(21, 1, W2, 0, 0.5),
        attempt(30, 1, W1, 2, 3), attempt(31, 1, W1, 3, 4),
        attempt(41, 1, W1, 1.6, 2), attempt(42, 1, W3, 1.6, 2), attempt(40, 1, W2, 5, 6)))
    identities: dict[int, Identity] = field(default_factory=lambda: {
        10: (CALLBACK, {"g": "d0", "total": 2}), 11: (MEMBER, {"g": "d0", "i": 0}),
        12: (MEMBER, {"g": "d0", "i": 1, "fail": True}),
        20: (PARENT, {"children": 2, "group": 2}), 21: (PARENT, {"children": 1, "fail": True}),
        30: (CHILD, {"p": 20, "c": 2, "i": 0}), 31: (CHILD, {"p": 20, "c": 2, "i": 1}),
        40: (CALLBACK, {"g": "p20.2", "total": 2}), 41: (MEMBER, {"g": "p20.2", "i": 0}),
        42: (MEMBER, {"g": "p20.2", "i": 1})})
    finished: dict[int, Finished] = field(default_factory=lambda: {
        10: Finished(CALLBACK, "done", None, 1, {"members": 2, "finished": 2}),
        11: Finished(MEMBER, "done", 10, 1, {"i": 0}),
        12: Finished(MEMBER, "dead", 10, 1, payload={"g": "d0", "i": 1, "fail": True}),
        20: Finished(PARENT, "done", None, 2, {"claim": 2}),
        21: Finished(PARENT, "dead", None, 1, payload={"children": 1, "fail": True}),
        40: Finished(CALLBACK, "done", None, 1, {"members": 2, "finished": 2}),
        41: Finished(MEMBER, "done", 40, 1, {"i": 0}),
        42: Finished(MEMBER, "done", 40, 1, {"i": 1})})
    groups: dict[int, GroupRow] = field(default_factory=lambda: {
        10: GroupRow(2, 1, 1, True), 40: GroupRow(2, 2, 0, True)})
    left: dict[int, Identity] = field(default_factory=dict)

    def ran(self, job: int, kind: str, payload: dict[str, Any], start: float,
            end: float | None = None) -> None:
        """Add a job that ran once, from ``start`` to ``end`` seconds."""
        self.identities[job] = (kind, payload)
        self.attempts[job] = [attempt(job, 1, W1, start, end)]

    def judge(self) -> Workflows:
        return judge_workflows(self.attempts, self.identities, planned={"d0": 2},
                               groups=self.groups, finished=self.finished, left=self.left,
                               died=seen_at(w101=0.8))


def test_judge_workflows_passes_a_clean_run():
    verdict = World().judge()
    assert verdict.failures() == []
    assert verdict.figures() == {
        "groups": 2, "callbacks run": 2, "members": 4, "members cancelled": 0,
        "members lost": 0,
        "callbacks duplicated": 0, "callbacks early": 0, "parents done": 1,
        "parents dead": 1, "children": 2, "orphans": 0, "duplicates": 0, "children lost": 0,
    }


def flagged(world: World) -> dict[str, int]:
    """The broken rules, by the start of their failure line."""
    return {line.split(":")[0]: int(line.split(":")[1].split(",")[0])
            for line in world.judge().failures() if ":" in line}


def test_judge_workflows_flags_follow_ups_of_other_attempts_and_written_twice():
    world = World()
    world.ran(32, CHILD, {"p": 20, "c": 1, "i": 0}, 1, 1.2)  # of the killed first claim
    world.ran(33, CHILD, {"p": 21, "c": 1, "i": 0}, 1, 1.2)  # of the discarded parent
    world.ran(34, CHILD, {"p": 20, "c": 2, "i": 1}, 4, 5)  # child 1 again: a re-acked flush
    assert flagged(world) == {"orphan follow-ups": 2, "duplicate follow-ups or members": 1}
    assert world.judge().orphans == [32, 33]


def test_judge_workflows_flags_a_child_missing_or_never_finished():
    world = World()
    del world.attempts[31], world.identities[31]
    world.attempts[30] = [attempt(30, 1, W1, 2, None)]  # killed, never run again nor dead
    assert world.judge().children_lost == [(20, 2, 0, 30), (20, 2, 1)]


def test_judge_workflows_flags_a_group_of_a_failed_or_cut_off_attempt():
    world = World()
    world.ran(50, CALLBACK, {"g": "p20.1", "total": 1}, 7, 8)
    world.ran(51, MEMBER, {"g": "p20.1", "i": 0}, 6, 6.5)
    world.groups[50] = GroupRow(1, 1, 0, True)
    assert flagged(world) == {"orphan follow-ups": 2, "orphan groups": 1}
    assert "3 groups in pgpool_groups, not the 2 enqueued" in world.judge().failures()[-1]


def test_judge_workflows_flags_a_second_callback_and_a_callback_run_early():
    world = World()
    world.ran(50, CALLBACK, {"g": "d0", "total": 2}, 7, 8)  # a second callback of d0
    world.attempts[40] = [attempt(40, 1, W2, 1.8, 3)]  # before members 41 and 42 ended
    verdict = world.judge()
    assert verdict.callbacks_duplicated == ["d0"]
    assert [key for key, _ in verdict.callbacks_early] == ["p20.2"]
    # A callback that saw a member unfinished was released early, whatever the records say.
    world = World()
    world.finished[10] = Finished(CALLBACK, "done", None, 1, {"members": 2, "finished": 1})
    assert [key for key, _ in world.judge().callbacks_early] == ["d0"]
    # A member killed and never seen dead: the callback is not proven to have come after.
    world = World()
    world.attempts[41] = [attempt(41, 1, W2, 1.6, None), attempt(41, 2, W3, 1.7, 2)]
    assert [key for key, _ in world.judge().callbacks_early] == ["p20.2"]


def test_judge_workflows_flags_lost_members_and_miscounted_groups():
    world = World()
    del world.finished[42]  # ran, but neither done nor dead
    world.groups[10] = GroupRow(2, 2, 0, True)  # counts the dead member as done
    del world.attempts[11], world.identities[11], world.finished[11]  # never existed
    verdict = world.judge()
    assert verdict.members_lost == [("d0", 0), ("p20.2", 1, 42)]
    assert [m[0] for m in verdict.miscounted] == ["d0", "p20.2"]
    # A group whose callback never ran, and a row never completed.
    world = World()
    del world.finished[40]
    world.groups[10] = GroupRow(2, 1, 1, False)
    verdict = world.judge()
    assert verdict.callbacks_missing == ["p20.2"]
    assert verdict.callbacks_run == 1
    assert [m[0] for m in verdict.miscounted] == ["d0"]


def test_judge_workflows_expects_the_nested_group_of_a_callback_that_is_done():
    world = World()
    world.identities[40] = (CALLBACK, {"g": "p20.2", "total": 2, "group": 1})
    world.finished[40] = Finished(CALLBACK, "done", None, 1,
                                  {"members": 2, "finished": 2, "claim": 1})
    assert world.judge().callbacks_missing == ["p40.1"]  # expected, never written
    world.ran(60, CALLBACK, {"g": "p40.1", "total": 1}, 9, 10)
    world.ran(61, MEMBER, {"g": "p40.1", "i": 0}, 7, 8)
    world.finished[60] = Finished(CALLBACK, "done", None, 1, {"members": 1, "finished": 1})
    world.finished[61] = Finished(MEMBER, "done", 60, 1, {"i": 0})
    world.groups[60] = GroupRow(1, 1, 0, True)
    verdict = world.judge()
    assert verdict.failures() == []
    assert (verdict.groups, verdict.callbacks_run, verdict.members) == (3, 3, 5)
    # One of another claim of that callback is an orphan group.
    world.ran(62, CALLBACK, {"g": "p40.2", "total": 1}, 9, 10)
    world.groups[62] = GroupRow(1, 0, 0, False)
    assert flagged(world) == {"orphan follow-ups": 1, "orphan groups": 1}


def test_judge_workflows_flags_a_cancelled_member_that_did_not_die():
    world = World()
    world.finished[12] = Finished(MEMBER, "dead", 10, 1, payload={"g": "d0", "i": 1})
    assert world.judge().failures() == []
    verdict = judge_workflows(world.attempts, world.identities, planned={"d0": 2},
                              groups=world.groups, finished=world.finished, left={},
                              died=seen_at(w101=0.8), cancelled=[12, 41])
    assert verdict.figures()["members cancelled"] == 2
    assert verdict.not_cancelled == [41]  # done: the cancel did not stop it


# --- long jobs that checkpoint ---------------------------------------------------------

LONG = {7: (STEPS, {"steps": 5, "ms": 2})}


def test_read_steps_groups_steps_by_job_and_claim_and_ignores_cut_lines(tmp_path):
    (tmp_path / "1-2.steps").write_text("7 1 0\n7 1 1\n7 2 1\n7 2 2\n7 2 3")
    (tmp_path / "1-3.log").write_text("7 1 3 10 -\n")  # not a steps record
    assert read_steps(tmp_path) == {7: {1: [0, 1], 2: [1, 2]}}


def test_claims_that_resume_from_their_checkpoints_pass():
    # Claim 2 reran step 1, cut off before its checkpoint; claim 3 went on after step 3.
    verdict = judge_steps({7: {1: [0, 1], 2: [1, 2, 3], 3: [4]}}, LONG, completed={7})
    assert verdict.failures() == []
    assert verdict.figures() == {"long jobs": 1, "resumed": 2, "steps run twice": 1,
                                 "bad resumes": 0}


@pytest.mark.parametrize(("claims", "why"), [
    ({1: [0, 1, 2], 2: [1, 2, 3, 4]}, "started at step 1 after step 2"),  # two run again
    ({1: [0, 1], 2: [3, 4]}, "started at step 3 after step 1"),  # step 2 skipped
    ({1: [0, 2, 3, 4]}, "steps out of order: [0, 2, 3, 4]"),
    ({1: [0, 1, 2]}, "completed after step 2 of 5"),
])
def test_a_claim_that_does_not_resume_where_it_stopped_is_reported(claims, why):
    verdict = judge_steps({7: claims}, LONG, completed={7})
    assert [b[2] for b in verdict.broken] == [why]
    assert verdict.failures() == [f"bad resumes: 1, e.g. {verdict.broken}"]


# --- limited kinds ----------------------------------------------------------------------------

def test_most_at_once_counts_the_attempts_running_at_each_moment():
    ran = runs(attempt(1, 1, W1, 0, 2), attempt(2, 1, W2, 1, 3), attempt(3, 1, W3, 2, 4),
               attempt(4, 1, W3, 4, 5))
    # 2 ends as 3 starts, and 3 ends as 4 starts: an end before a start at one instant.
    assert most_at_once(ran, never_seen) == 2
    ran = runs(attempt(1, 1, W1, 0, 2), attempt(2, 1, W2, 1, 3), attempt(3, 1, W3, 1.5, 4))
    assert most_at_once(ran, never_seen) == 3


def test_a_killed_attempt_runs_until_its_worker_was_seen_dead_or_to_the_end():
    killed_then_next = runs(attempt(1, 1, W1, 0, None), attempt(2, 1, W2, 5, 6))
    assert most_at_once(killed_then_next, seen_at(w101=4)) == 1
    assert most_at_once(killed_then_next, seen_at(w101=5.5)) == 2
    assert most_at_once(killed_then_next, never_seen) == 2  # no bound: it may still run


def test_most_in_window_counts_any_window_not_only_whole_seconds():
    assert most_in_window([], 1.0) == 0
    assert most_in_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0) == 3
    # 0.6 to 1.5 straddles a second's boundary: 4 in [0.6, 1.6).
    assert most_in_window([0.1, 0.6, 0.9, 1.2, 1.5, 2.7], 1.0) == 4


def test_judge_limits_flags_each_limit_exceeded_and_passes_within_them():
    ran = runs(attempt(1, 1, W1, 0, 2), attempt(2, 1, W2, 1, 3), attempt(3, 1, W3, 1.5, 4),
               attempt(9, 1, W3, 0, 9))  # job 9 is of another kind
    within = judge_limits(ran, never_seen, limited={1, 2, 3}, concurrency=3,
                          claims=[0.0, 0.5, 1.0], rate=2, per=1.0)
    assert within.failures() == []
    assert within.figures() == {"limited jobs": 3, "most running at once": 3,
                                "rated claims": 3, "most claimed in a window": 2}
    over = judge_limits(ran, never_seen, limited={1, 2, 3}, concurrency=2,
                        claims=[0.0, 0.5, 0.9], rate=2, per=1.0)
    assert over.failures() == [
        "over the concurrency limit: 3 ran at once, limit 2",
        "over the rate limit: 3 claimed in one window, limit 2"]
