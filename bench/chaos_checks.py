"""The chaos checker: pure functions over what a chaos run recorded (no processes, no database).

The soak (``bench/chaos.py``) and ``tests/test_chaos.py`` gather three things and hand them
here: the attempts `chaosjobs` recorded (`read_attempts`), the faults the driver injected
(`Fault`), and upper bounds on when worker processes died (from the driver's kills and a
pidfd watcher, combined by `death_bound`). `judge` applies every rule and returns a
`Verdict`; the parts are public so a test can apply one rule at a time.

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
  running jobs just before it plus one full `pgpool.scheduler.capacity` per dispatcher for
  claims landing around it.

Times are CLOCK_MONOTONIC nanoseconds (`time.monotonic_ns`), the clock `chaosjobs` records
with, shared by every process on the host.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

WORKER_KILL = "worker kill"
DISPATCHER_KILL = "dispatcher kill"
POSTGRES_RESTART = "postgres restart"
BACKENDS_TERMINATED = "backends terminated"
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
            job, attempt, pid, start, end = line.split()
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
                   lease: float) -> tuple[Counter[str], list[tuple[Attempt, Attempt]]]:
    """Attribute each re-run (a started attempt ``b`` after ``a``) to a fault; see the module
    docstring for the rules. ``lease`` is the dispatchers' lease in seconds. Returns re-runs
    by fault kind, and the unexplained pairs."""
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
            if any(f.t0 <= b.start and last_before.get(id(f)) == a.start
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
        if self.reruns > self.bound:
            out.append(f"{self.reruns} re-runs, more than the {self.bound} jobs the faults "
                       "could have interrupted")
        if self.left:
            out.append(f"not drained: {self.left} jobs still in pgpool_jobs")
        return out


def judge(ids: Collection[int], attempts: dict[int, list[Attempt]], faults: Iterable[Fault],
          *, died: DeathBound, lease: float, dead: Collection[int] = (),
          left: int = 0) -> Verdict:
    """Apply every rule to a run: ``ids`` the jobs enqueued, ``attempts`` their records,
    ``faults`` what was injected, ``died`` the bound on each worker's death, ``lease`` the
    dispatchers' lease (s), ``dead`` the ids in ``pgpool_dead``, ``left`` the jobs still in
    ``pgpool_jobs``."""
    faults = list(faults)
    enqueued = set(ids)
    completed = completed_jobs(attempts)
    causes, unexplained = explain_reruns(attempts, faults, lease=lease)
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
