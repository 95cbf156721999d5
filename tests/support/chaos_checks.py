"""The chaos checker: pure functions over what a chaos run recorded (no processes, no database).

The soak (``tests/support/chaos.py``) and ``tests/host/test_chaos.py`` gather three things
and hand them here: the attempts `chaosjobs` recorded (`read_attempts`), the faults the
driver injected (`Fault`), and upper bounds on when worker processes died (from the driver's
kills and a pidfd watcher, combined by `death_bound`). `judge` applies every rule and
returns a `Verdict`; the parts are public so a test can apply one rule at a time.

The rules, and why each is sound:

- *Lost*: a job neither completed (some attempt has an end record) nor in ``pgpool_dead``.
  Also reported: jobs still in ``pgpool_jobs`` at the end (``not drained``), and records
  of jobs that were never enqueued.
- *Overlapping*: for each job, attempts that recorded a start are sorted by start time, and
  each must have ended before the next one started. An attempt with an end record ended
  then. An attempt with only a start record was killed while it ran, so it ended when its
  process died; the time used is an upper bound on that death: the moment the driver's
  ``kill()`` returned for a worker it killed, the moment it saw the workers of a killed
  dispatcher gone, or the moment a pidfd watcher saw the process exit. If no such bound is
  known, or the bound is later than the next start, the pair counts as overlapping. Only
  neighbours need checking: an attempt overlapping any later one overlaps the next.
- *Duplicate attempts*: the same (job, attempt) started twice: one claim ran twice.
- *Re-runs*: started attempts beyond the first, per job. Each must be explained by a fault
  that could have interrupted the earlier attempt ``a`` before the next one ``b`` started:
  a worker kill that began before ``b`` started, of the process that ran ``a`` as the last
  attempt it started before the kill; a kill of ``a``'s dispatcher that began before ``b``
  started and was not over (its workers not yet gone) when ``a`` started; or a database
  fault (restart, terminated backends) whose window
  ``[start, end + 2 leases]`` meets ``[a.start, b.start]`` (after a fault a dispatcher may
  take a while to replace its broken pooled connections, and a heartbeat that fails for a
  whole lease abandons every job held). Anything else is *unexplained*. In total, re-runs
  must not exceed the jobs the faults could have interrupted, the sum of their `Fault.cap`:
  1 per worker kill; for a dispatcher kill, the jobs the database showed it owning right
  after the kill (they are frozen until their leases expire); for a database fault, the
  running jobs just before it plus one full `pgpool.host.scheduler.capacity` per dispatcher for
  claims landing around it. A re-run after an attempt that recorded its end and then
  failed on purpose (``failed``: the group workload's flaky parents) is explained by that
  failure, and not counted against the faults' bound.

The group workload (members of groups, their callbacks, parents and their follow-ups; see
``chaosjobs``) is judged by `judge_workflows`, whose docstring states its rules.

Times are CLOCK_MONOTONIC nanoseconds (`time.monotonic_ns`), the clock `chaosjobs` records
with, shared by every process on the host.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

WORKER_KILL = "worker kill"
DISPATCHER_KILL = "dispatcher kill"
POSTGRES_RESTART = "postgres restart"
BACKENDS_TERMINATED = "backends terminated"
#: The cause of a re-run after an attempt that failed on purpose (not a fault).
ASKED_TO_FAIL = "asked to fail"
#: Every fault kind; the last two are database faults.
FAULT_KINDS = (WORKER_KILL, DISPATCHER_KILL, POSTGRES_RESTART, BACKENDS_TERMINATED)

#: ``died(pid)``: an upper bound on when process ``pid`` died (monotonic ns), None if unknown.
DeathBound = Callable[[int], int | None]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One started attempt, from chaosjobs' records. ``end`` is None if it was killed."""

    job: int
    attempt: int
    #: The worker process that ran it, and that worker's dispatcher.
    pid: int
    ppid: int
    start: int
    end: int | None


@dataclass
class Fault:
    """One injected fault. ``t0``..``t1`` is when it was being done (monotonic ns)."""

    kind: str
    t0: int
    t1: int
    #: The killed worker or dispatcher.
    pid: int | None = None
    #: How many jobs it could have interrupted (see the module docstring).
    cap: int = 0
    #: For a dispatcher kill: when its workers were seen gone (None: not seen).
    workers_gone: int | None = None
    #: For a dispatcher kill: its workers at the time of the kill.
    workers: list[int] = field(default_factory=list)

    @property
    def until(self) -> int:
        """When its direct effect was over: the killed processes were gone, or the server
        was back (a dispatcher's workers die a moment after the dispatcher, and may start
        one more queued job meanwhile; workers never seen gone count as alive 10 s)."""
        if self.kind == DISPATCHER_KILL:
            return self.workers_gone if self.workers_gone is not None else self.t1 + 10**10
        return self.t1


def read_attempts(record_dir: Path) -> dict[int, list[Attempt]]:
    """Every attempt that recorded a start, by job id, each list sorted by start time.

    Record files are ``<dispatcher pid>-<worker pid>.log`` (see ``chaosjobs``). A line cut
    short by a kill (no trailing newline) is ignored; an attempt whose start line never
    made it to disk did not start as far as this is concerned.
    """
    ends: dict[tuple[int, int, int, int], int | None] = {}
    parents: dict[int, int] = {}
    for f in record_dir.glob("*.log"):
        ppid, _, pid_text = f.stem.partition("-")
        parents[int(pid_text)] = int(ppid)
        for line in f.read_text().split("\n")[:-1]:
            job, attempt, pid, start, end = line.split(" ", 5)[:5]
            key = (int(job), int(attempt), int(pid), int(start))
            if end != "-":
                ends[key] = int(end)
            else:
                ends.setdefault(key, None)
    by_job: dict[int, list[Attempt]] = defaultdict(list)
    for (job, attempt, pid, start), end in ends.items():
        by_job[job].append(Attempt(job, attempt, pid, parents.get(pid, 0), start, end))
    for runs in by_job.values():
        runs.sort(key=lambda a: a.start)
    return dict(by_job)


def completed_jobs(attempts: dict[int, list[Attempt]]) -> set[int]:
    """Jobs with at least one attempt that recorded its end."""
    return {job for job, runs in attempts.items() if any(a.end is not None for a in runs)}


def rerun_count(attempts: dict[int, list[Attempt]]) -> int:
    """Started attempts beyond the first of each job."""
    return sum(len(runs) - 1 for runs in attempts.values())


def death_bound(faults: Iterable[Fault], watched: DeathBound) -> DeathBound:
    """The earliest known upper bound on each worker's death: when the driver's kill of it
    returned, when the workers of its killed dispatcher were seen gone, or ``watched(pid)``
    (a pidfd watcher's sighting)."""
    bounds: dict[int, list[int]] = defaultdict(list)
    for f in faults:
        if f.kind == WORKER_KILL and f.pid is not None:
            bounds[f.pid].append(f.t1)
        elif f.kind == DISPATCHER_KILL and f.workers_gone is not None:
            for w in f.workers:
                bounds[w].append(f.workers_gone)

    def died(pid: int) -> int | None:
        known = list(bounds.get(pid, ()))
        seen = watched(pid)
        if seen is not None:
            known.append(seen)
        return min(known) if known else None

    return died


def find_overlaps(attempts: dict[int, list[Attempt]],
                  died: DeathBound) -> list[tuple[Attempt, Attempt]]:
    """Pairs of consecutive attempts of one job not proven to have run one after the other.

    An attempt without an end record is taken to end at ``died(pid)`` of its worker.
    """
    bad = []
    for runs in attempts.values():
        for a, b in pairwise(runs):
            end = a.end if a.end is not None else died(a.pid)
            if end is None or end > b.start:
                bad.append((a, b))
    return bad


def duplicate_attempts(attempts: dict[int, list[Attempt]]) -> list[tuple[int, int]]:
    """(job, attempt) pairs that started more than once: a claim ran twice."""
    dups = []
    for job, runs in attempts.items():
        counts = Counter(a.attempt for a in runs)
        dups.extend((job, n) for n, c in counts.items() if c > 1)
    return dups


def explain_reruns(attempts: dict[int, list[Attempt]], faults: Iterable[Fault], *,
                   lease: float, failed: Collection[tuple[int, int]] = ()
                   ) -> tuple[Counter[str], list[tuple[Attempt, Attempt]]]:
    """Attribute each re-run (a started attempt ``b`` after ``a``) to a fault, or to ``a``
    failing on purpose (``failed``: its (job, attempt) pairs); see the module docstring for
    the rules. ``lease`` is the dispatchers' lease in seconds. Returns re-runs by cause,
    and the unexplained pairs."""
    killed_workers = defaultdict(list)
    killed_hosts = defaultdict(list)
    database = []
    slack = int(2 * lease * 1e9)
    for f in faults:
        if f.kind == WORKER_KILL:
            killed_workers[f.pid].append(f)
        elif f.kind == DISPATCHER_KILL:
            killed_hosts[f.pid].append(f)
        else:
            database.append(f)
    # A killed worker was running (or had just finished, unreported) only its last attempt.
    starts: dict[int, list[int]] = defaultdict(list)
    for runs in attempts.values():
        for a in runs:
            starts[a.pid].append(a.start)
    last_before: dict[int, int] = {}
    for pid, fs in killed_workers.items():
        ordered = sorted(starts.get(pid, ()))
        for f in fs:
            i = bisect.bisect_right(ordered, f.t1)
            if i:
                last_before[id(f)] = ordered[i - 1]
    causes: Counter[str] = Counter()
    unexplained = []
    for runs in attempts.values():
        for a, b in pairwise(runs):
            if a.end is not None and (a.job, a.attempt) in failed:
                causes[ASKED_TO_FAIL] += 1
            elif any(f.t0 <= b.start and last_before.get(id(f)) == a.start
                     for f in killed_workers.get(a.pid, ())):
                causes[WORKER_KILL] += 1
            elif any(f.t0 <= b.start and a.start <= f.until
                     for f in killed_hosts.get(a.ppid, ())):
                causes[DISPATCHER_KILL] += 1
            else:
                hit = [f for f in database if f.t0 <= b.start and a.start <= f.until + slack]
                if hit:
                    causes[hit[-1].kind] += 1
                else:
                    unexplained.append((a, b))
    return causes, unexplained


@dataclass
class Verdict:
    """Every rule applied to one run; `failures` lists the broken ones."""

    jobs: int
    completed: int
    dead: int
    lost: list[int]
    #: Jobs still in ``pgpool_jobs`` at the end.
    left: int
    #: Job ids with records that were never enqueued.
    strays: list[int]
    overlaps: list[tuple[Attempt, Attempt]]
    duplicates: list[tuple[int, int]]
    reruns: int
    causes: Counter[str]
    unexplained: list[tuple[Attempt, Attempt]]
    #: Faults by kind, and the jobs each kind could have interrupted (their caps).
    faults: Counter[str]
    interruptible: Counter[str]
    #: Attempt numbers claimed and lost before any worker started them (not a failure).
    never_run: int

    @property
    def bound(self) -> int:
        """The most re-runs the faults explain: the sum of their caps."""
        return sum(self.interruptible.values())

    @property
    def allowed(self) -> int:
        """The most re-runs allowed: `bound`, and one per attempt that failed on purpose."""
        return self.bound + self.causes[ASKED_TO_FAIL]

    def figures(self) -> dict[str, int]:
        """The counts, by the names the soak prints them under."""
        return {
            "jobs": self.jobs, "faults": sum(self.faults.values()),
            "completed": self.completed, "dead": self.dead, "lost": len(self.lost),
            "not drained": self.left, "overlapping": len(self.overlaps),
            "duplicate attempts": len(self.duplicates), "re-runs": self.reruns,
            "interruptible": self.bound, "unexplained re-runs": len(self.unexplained),
            "attempts never run": self.never_run,
        }

    def failures(self) -> list[str]:
        """One line per broken rule, with a few examples; empty if every rule held."""
        out = [f"{what}: {len(items)}, e.g. {items[:5]}"
               for what, items in (("lost", self.lost), ("overlapping", self.overlaps),
                                   ("duplicate attempts", self.duplicates),
                                   ("unexplained re-runs", self.unexplained),
                                   ("records of unknown jobs", self.strays))
               if items]
        if self.reruns > self.allowed:
            failed = self.causes[ASKED_TO_FAIL]
            out.append(f"{self.reruns} re-runs, more than the {self.bound} jobs the faults "
                       "could have interrupted"
                       + (f" and the {failed} attempts that failed on purpose"
                          if failed else ""))
        if self.left:
            out.append(f"not drained: {self.left} jobs still in pgpool_jobs")
        return out


def judge(ids: Collection[int], attempts: dict[int, list[Attempt]], faults: Iterable[Fault],
          *, died: DeathBound, lease: float, dead: Collection[int] = (),
          left: int = 0, failed: Collection[tuple[int, int]] = ()) -> Verdict:
    """Apply every rule to a run: ``ids`` the jobs enqueued, ``attempts`` their records,
    ``faults`` what was injected, ``died`` the bound on each worker's death, ``lease`` the
    dispatchers' lease (s), ``dead`` the ids in ``pgpool_dead``, ``left`` the jobs still in
    ``pgpool_jobs``, ``failed`` the (job, attempt) pairs that failed on purpose."""
    faults = list(faults)
    enqueued = set(ids)
    completed = completed_jobs(attempts)
    causes, unexplained = explain_reruns(attempts, faults, lease=lease, failed=failed)
    interruptible: Counter[str] = Counter()
    for f in faults:
        interruptible[f.kind] += f.cap
    return Verdict(
        jobs=len(enqueued),
        completed=len(completed & enqueued),
        dead=len(set(dead)),
        lost=sorted(enqueued - completed - set(dead)),
        left=left,
        strays=sorted(set(attempts) - enqueued),
        overlaps=find_overlaps(attempts, died),
        duplicates=duplicate_attempts(attempts),
        reruns=rerun_count(attempts),
        causes=causes,
        unexplained=unexplained,
        faults=Counter(f.kind for f in faults),
        interruptible=interruptible,
        never_run=sum(max(a.attempt for a in runs) - len({a.attempt for a in runs})
                      for runs in attempts.values()),
    )


# --- the group workload -------------------------------------------------------------------

#: The group workload's kinds (`chaosjobs`' handlers).
MEMBER, CALLBACK, PARENT, CHILD = "chaos.member", "chaos.callback", "chaos.parent", "chaos.child"
WORKFLOW_KINDS = (MEMBER, CALLBACK, PARENT, CHILD)

#: (kind, payload) of a job, as its start record or the database shows it.
Identity = tuple[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class GroupRow:
    """A group's row in ``pgpool_groups``."""

    total: int
    done: int
    dead: int
    completed: bool


@dataclass(frozen=True, slots=True)
class Finished:
    """A finished job of the group workload as the database keeps it: ``state`` 'done' (in
    ``pgpool_done``, with its ``result`` and its claims, ``attempts``) or 'dead' (in
    ``pgpool_dead``, with its ``payload``)."""

    kind: str
    state: str
    group_id: int | None
    attempts: int = 0
    result: Any = None
    payload: Any = None


def read_identities(record_dir: Path) -> dict[int, Identity]:
    """The kind and payload of each job whose start line carries them (the group workload's
    kinds: see ``chaosjobs``). Lines cut short by a kill are ignored."""
    found: dict[int, Identity] = {}
    for f in record_dir.glob("*.log"):
        for line in f.read_text().split("\n")[:-1]:
            fields = line.split(" ", 6)
            if len(fields) == 7 and fields[4] == "-":
                found[int(fields[0])] = (fields[5], json.loads(fields[6]))
    return found


def failed_on_purpose(attempts: dict[int, list[Attempt]],
                      identities: dict[int, Identity]) -> set[tuple[int, int]]:
    """The (job, attempt) pairs that failed on purpose and were retried: a flaky parent's
    first claim, once it recorded its end."""
    return {(job, a.attempt) for job, (kind, payload) in identities.items()
            if kind == PARENT and payload.get("flaky")
            for a in attempts.get(job, ()) if a.attempt == 1 and a.end is not None}


@dataclass
class Workflows:
    """The group workload's rules applied to one run (`judge_workflows`); `failures` lists
    the broken ones. Each list holds examples: a group key, a job id, or a pair."""

    groups: int
    expected_groups: int
    callbacks_run: int
    members: int
    parents_done: int
    parents_dead: int
    children: int
    members_lost: list[Any] = field(default_factory=list)
    callbacks_duplicated: list[str] = field(default_factory=list)
    callbacks_missing: list[str] = field(default_factory=list)
    callbacks_early: list[Any] = field(default_factory=list)
    miscounted: list[Any] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)
    orphan_groups: list[Any] = field(default_factory=list)
    duplicates: list[Any] = field(default_factory=list)
    children_lost: list[Any] = field(default_factory=list)
    #: Members cancelled while they ran, and those of them not dead at the end.
    cancelled: int = 0
    not_cancelled: list[int] = field(default_factory=list)

    def figures(self) -> dict[str, int]:
        """The counts, by the names the soak prints them under."""
        return {
            "groups": self.groups, "callbacks run": self.callbacks_run,
            "members": self.members, "members cancelled": self.cancelled,
            "members lost": len(self.members_lost),
            "callbacks duplicated": len(self.callbacks_duplicated),
            "callbacks early": len(self.callbacks_early),
            "parents done": self.parents_done, "parents dead": self.parents_dead,
            "children": self.children, "orphans": len(self.orphans) + len(self.orphan_groups),
            "duplicates": len(self.duplicates), "children lost": len(self.children_lost),
        }

    def failures(self) -> list[str]:
        """One line per broken rule, with a few examples; empty if every rule held."""
        out = [f"{what}: {len(items)}, e.g. {items[:5]}"
               for what, items in (
                   ("members lost", self.members_lost),
                   ("callbacks duplicated", self.callbacks_duplicated),
                   ("callbacks not run", self.callbacks_missing),
                   ("callbacks started before their members finished", self.callbacks_early),
                   ("groups miscounted", self.miscounted),
                   ("orphan follow-ups", self.orphans),
                   ("orphan groups", self.orphan_groups),
                   ("duplicate follow-ups or members", self.duplicates),
                   ("children lost", self.children_lost),
                   ("cancelled members not dead", self.not_cancelled))
               if items]
        if self.groups != self.expected_groups:
            out.append(f"{self.groups} groups in pgpool_groups, not the "
                       f"{self.expected_groups} enqueued and started by parents that are done")
        return out


def judge_workflows(attempts: dict[int, list[Attempt]], identities: dict[int, Identity], *,
                    planned: dict[str, int], groups: dict[int, GroupRow],
                    finished: dict[int, Finished], left: dict[int, Identity],
                    died: DeathBound, cancelled: Collection[int] = ()) -> Workflows:
    """Apply the group workload's rules to a run.

    ``attempts`` are every recorded attempt, ``identities`` the workload's jobs' kinds and
    payloads from their records (`read_identities`), ``planned`` the groups the driver
    enqueued (key -> members), ``groups`` the rows of ``pgpool_groups`` by id, ``finished``
    the workload's jobs in ``pgpool_done`` and ``pgpool_dead`` by id, ``left`` those still
    in ``pgpool_jobs``, ``cancelled`` the members an operator cancelled while they ran (each
    must be dead). Every job the workload ever had is in one of the three: it ran
    (records), it died (``pgpool_dead``, with its payload) or it is left (`Workflows` counts
    none left as lost: the soak's own accounting reports them not drained).

    The rules:

    - The groups expected are the planned ones, and one per parent or callback that is
      done (in ``pgpool_done``) and asked for one (a callback's is a nested group), keyed
      ``p<id>.<claim>`` by the claim that succeeded (its result; the same as its
      ``attempts`` there). ``pgpool_groups`` holds
      exactly those: one more is an orphan group (a failed or cut-off attempt's), or a
      duplicate.
    - Each expected group has exactly one callback job (more: *callbacks duplicated*; none:
      *callbacks not run*), done in ``pgpool_done``, which saw every member finished
      (its result), and whose first attempt started after every attempt of every member
      had ended (its end record, or an upper bound on its worker's death, as for overlaps):
      otherwise *callbacks early*.
    - Its row is complete (``completed_at`` set), ``done + dead == total``, and those
      counts are the members in ``pgpool_done`` and in ``pgpool_dead`` with its id:
      otherwise *groups miscounted*.
    - Its members are indices ``0..total-1``, each exactly one job (more: *duplicates*),
      each done or dead in its group: otherwise *members lost*.
    - A parent that is done has exactly its children of the claim that succeeded, indices
      ``0..n-1``, each one job (more: *duplicates*), each that ran to its end or is dead
      (otherwise *children lost*). Any other child (of a dead parent, or of another claim)
      is an *orphan*, and so is a member or callback of a group nobody expects.
    """
    known: dict[int, Identity] = dict(identities)
    for job, f in finished.items():
        if f.state == "dead" and job not in known:
            known[job] = (f.kind, f.payload)
    for job, ident in left.items():
        known.setdefault(job, ident)
    by_kind: dict[str, list[int]] = defaultdict(list)
    for job, (kind, _) in known.items():
        by_kind[kind].append(job)

    def done(job: int) -> bool:
        return job in finished and finished[job].state == "done"

    def final(job: int) -> int | None:
        """When the last attempt of ``job`` was over, if known (0: it never started)."""
        ends = [a.end if a.end is not None else died(a.pid) for a in attempts.get(job, ())]
        return None if None in ends else max(ends, default=0)

    verdict = Workflows(groups=len(groups), expected_groups=0, callbacks_run=0,
                        members=len(by_kind[MEMBER]), parents_done=0, parents_dead=0,
                        children=len(by_kind[CHILD]), cancelled=len(set(cancelled)))
    verdict.not_cancelled = sorted(job for job in set(cancelled)
                                   if job not in finished or finished[job].state != "dead")
    # Parents, and callbacks that start a nested group: the claim that succeeded, and what
    # it was asked to start.
    expected = dict(planned)
    claimed: dict[int, int] = {}
    nesting = [job for job in by_kind[CALLBACK] if known[job][1].get("group")]
    for job in by_kind[PARENT] + nesting:
        f = finished.get(job)
        if f is None:
            continue
        parent = known[job][0] == PARENT
        if f.state == "dead":
            verdict.parents_dead += parent
            continue
        verdict.parents_done += parent
        claim = f.result["claim"]
        if claim != f.attempts:
            verdict.miscounted.append((job, f"result says claim {claim}, kept attempts "
                                            f"{f.attempts}"))
        if parent:
            claimed[job] = claim
        size = known[job][1].get("group", 0)
        if size:
            expected[f"p{job}.{claim}"] = size
    verdict.expected_groups = len(expected)

    # Groups: one callback each, run once and after every member.
    callbacks: dict[str, list[int]] = defaultdict(list)
    for job in by_kind[CALLBACK]:
        callbacks[known[job][1]["g"]].append(job)
    members: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for job in by_kind[MEMBER]:
        payload = known[job][1]
        members[payload["g"]][payload["i"]].append(job)
    matched: set[int] = set()
    for key, total in sorted(expected.items()):
        ids = sorted(callbacks.get(key, ()))
        if len(ids) > 1:
            verdict.callbacks_duplicated.append(key)
        if not ids:
            verdict.callbacks_missing.append(key)
            continue
        cid = ids[0]
        matched.update(ids)
        if not (done(cid) and any(a.end is not None for a in attempts.get(cid, ()))):
            verdict.callbacks_missing.append(key)
        else:
            verdict.callbacks_run += 1
            seen = {k: finished[cid].result.get(k) for k in ("members", "finished")}
            if seen != {"members": total, "finished": total}:
                verdict.callbacks_early.append((key, f"saw {seen} of {total}"))
        mine = members.get(key, {})
        done_here = dead_here = 0
        for i in range(total):
            jobs = mine.get(i, [])
            if len(jobs) > 1:
                verdict.duplicates.append((key, i, jobs))
            if not jobs:
                verdict.members_lost.append((key, i))
            for job in jobs:
                f = finished.get(job)
                if f is None or f.group_id != cid:
                    verdict.members_lost.append((key, i, job))
                elif f.state == "done":
                    done_here += 1
                else:
                    dead_here += 1
        extra = [(key, i) for i in mine if not 0 <= i < total]
        verdict.duplicates.extend(extra)
        starts = [a.start for a in attempts.get(cid, ())]
        if starts:
            ends = [final(job) for jobs in mine.values() for job in jobs]
            if None in ends or max((e for e in ends if e is not None), default=0) >= min(
                    starts):
                verdict.callbacks_early.append(
                    (key, "started before a member's attempt was over (or unknown)"))
        row = groups.get(cid)
        if row is None:
            verdict.miscounted.append((key, "no row in pgpool_groups"))
        elif (row.total, row.done, row.dead, row.completed) != (total, done_here, dead_here,
                                                                True):
            verdict.miscounted.append((key, row, f"members done {done_here}, dead {dead_here}"))
    verdict.orphan_groups = sorted(gid for gid in groups if gid not in matched)
    verdict.orphans.extend(sorted(
        [job for key in set(callbacks) - set(expected) for job in callbacks[key]]
        + [job for key in set(members) - set(expected)
           for jobs in members[key].values() for job in jobs]))

    # Children: exactly those of each done parent's successful claim.
    children: dict[tuple[int, int], dict[int, list[int]]] = defaultdict(
        lambda: defaultdict(list))
    for job in by_kind[CHILD]:
        payload = known[job][1]
        children[payload["p"], payload["c"]][payload["i"]].append(job)
    for parent, claim in sorted(claimed.items()):
        asked = known[parent][1].get("children", 0)
        mine = children.get((parent, claim), {})
        for i in range(asked):
            jobs = mine.get(i, [])
            if len(jobs) > 1:
                verdict.duplicates.append((parent, claim, i, jobs))
            if not jobs:
                verdict.children_lost.append((parent, claim, i))
            for job in jobs:
                ran = any(a.end is not None for a in attempts.get(job, ()))
                if not ran and not (job in finished and finished[job].state == "dead"):
                    verdict.children_lost.append((parent, claim, i, job))
        verdict.duplicates.extend((parent, claim, i) for i in mine if not 0 <= i < asked)
    verdict.orphans.extend(sorted(job for (parent, claim), jobs in children.items()
                                  if claimed.get(parent) != claim
                                  for ids in jobs.values() for job in ids))
    return verdict


# --- long jobs that checkpoint ---------------------------------------------------------

#: The long jobs' kind (`chaosjobs.steps`).
STEPS = "chaos.steps"


def read_steps(record_dir: Path) -> dict[int, dict[int, list[int]]]:
    """The steps each long job's claims started, in the order recorded: job -> claim ->
    steps, from the ``.steps`` records (see ``chaosjobs``). Cut-short lines are ignored."""
    found: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for f in record_dir.glob("*.steps"):
        for line in f.read_text().split("\n")[:-1]:
            job, claim, step = map(int, line.split(" "))
            found[job][claim].append(step)
    return {job: dict(claims) for job, claims in found.items()}


@dataclass
class Resumes:
    """The long jobs' rules applied to one run (`judge_steps`): ``broken`` lists
    (job, claim, why) examples; ``resumed`` counts the claims that started past step 0."""

    jobs: int = 0
    resumed: int = 0
    repeated: int = 0
    broken: list[tuple[int, int, str]] = field(default_factory=list)

    def figures(self) -> dict[str, int]:
        return {"long jobs": self.jobs, "resumed": self.resumed,
                "steps run twice": self.repeated, "bad resumes": len(self.broken)}

    def failures(self) -> list[str]:
        return ([f"bad resumes: {len(self.broken)}, e.g. {self.broken[:5]}"]
                if self.broken else [])


def judge_steps(steps: dict[int, dict[int, list[int]]], identities: dict[int, Identity],
                completed: Collection[int]) -> Resumes:
    """Apply the long jobs' rules: every claim of a job runs its steps one after another
    from where the last stored checkpoint left it, so its first step is the highest any
    earlier claim started (that step was cut off before its checkpoint was stored), or
    the next one (it was stored), never one lower (more than the step in flight run
    again) nor higher (a step skipped); a completed job ran every step."""
    verdict = Resumes()
    for job, (kind, payload) in identities.items():
        if kind != STEPS:
            continue
        verdict.jobs += 1
        highest = -1
        for claim, run in sorted(steps.get(job, {}).items()):
            if run != list(range(run[0], run[0] + len(run))):
                verdict.broken.append((job, claim, f"steps out of order: {run}"))
            elif not highest <= run[0] <= highest + 1:
                verdict.broken.append((job, claim, f"started at step {run[0]} after step "
                                                   f"{highest}"))
            verdict.resumed += run[0] > 0
            verdict.repeated += run[0] == highest
            highest = max(highest, run[-1])
        if job in completed and highest != payload["steps"] - 1:
            verdict.broken.append((job, 0, f"completed after step {highest} of "
                                           f"{payload['steps']}"))
    return verdict


# --- limited kinds --------------------------------------------------------------------------

#: The kinds with fleet-wide limits the soak runs (`chaosjobs.one_at_a_time`,
#: `chaosjobs.rated`), and their limits.
LIMITED, LIMITED_CONCURRENCY = "chaos.one_at_a_time", 1
RATED, RATED_PER_SECOND = "chaos.rated", 20

def most_at_once(attempts: dict[int, list[Attempt]], died: DeathBound) -> int:
    """The most of ``attempts`` that ran at any one moment. One without an end record ran
    until ``died(pid)`` of its worker, or, with no bound known, to the end of the run: the
    count can only overstate what ran at once."""
    edges = []
    for runs in attempts.values():
        for a in runs:
            end = a.end if a.end is not None else died(a.pid)
            edges += [(a.start, 1), (end if end is not None else 1 << 63, -1)]
    at_once = most = 0
    for _, step in sorted(edges):  # at one instant, an end before a start
        at_once += step
        most = max(most, at_once)
    return most


def most_in_window(times: Iterable[float], per: float) -> int:
    """The most of ``times`` (seconds) in any window ``[t, t + per)``."""
    ordered = sorted(times)
    return max((bisect.bisect_left(ordered, t + per) - i for i, t in enumerate(ordered)),
               default=0)


@dataclass
class Limits:
    """The limited kinds' rules applied to one run (`judge_limits`)."""

    jobs: int
    at_once: int
    concurrency: int
    claims: int
    in_a_window: int
    rate: int

    def figures(self) -> dict[str, int]:
        return {"limited jobs": self.jobs, "most running at once": self.at_once,
                "rated claims": self.claims, "most claimed in a window": self.in_a_window}

    def failures(self) -> list[str]:
        over = []
        if self.at_once > self.concurrency:
            over.append(f"over the concurrency limit: {self.at_once} ran at once, limit "
                        f"{self.concurrency}")
        if self.in_a_window > self.rate:
            over.append(f"over the rate limit: {self.in_a_window} claimed in one window, "
                        f"limit {self.rate}")
        return over


def judge_limits(attempts: dict[int, list[Attempt]], died: DeathBound, *,
                 limited: Collection[int], concurrency: int, claims: Iterable[float],
                 rate: int, per: float) -> Limits:
    """Apply the limits' rules: the attempts of the ``limited`` jobs (a kind limited to
    ``concurrency``) never ran more than ``concurrency`` at once (`most_at_once`), and the
    ``claims`` of a kind limited to ``rate`` per ``per`` seconds (the server's claim times,
    which is what the limit holds) were never more than ``rate`` in a window of ``per``."""
    ran = {job: runs for job, runs in attempts.items() if job in limited}
    claimed = list(claims)
    return Limits(jobs=len(limited), at_once=most_at_once(ran, died),
                  concurrency=concurrency, claims=len(claimed),
                  in_a_window=most_in_window(claimed, per), rate=rate)
