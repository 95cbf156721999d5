"""The worker pool: the dispatcher's side of its worker processes.

How a job crosses one host, by the attributes of a running `WorkerPool`. The dispatcher's
event loop owns everything left of the pipes; each worker process (`pgpool.worker.main`)
owns the far ends of one task pipe and one result pipe. What crosses them are the message
types of `pgpool.worker.ipc`::

  submit(jobs)
     ▼
  _backlog: Backlog        claimed, not yet sent (stop() hands them back: on_returned), by
     │                       priority, then in turns across kinds (`pgpool.host.backlog`)
     │ _assign(): top each open worker up to `depth` jobs (about QUEUED_SECONDS of work)
     │   once it is half drained, dealt in rounds: one Jobs frame per hand-off
     ▼
  _workers[index]: _Worker
     .assigned: deque[Job]   in order: the front one runs (since .started_at, and it is
     │                       marked `Job.started` for the heartbeat), the rest wait in the
     │                       pipe
     │  .transport ── task pipe: Jobs([job.wire(), ...], ring_at) ──▶ ┌─────────────────────┐
     │                                                                │ worker.main(index)  │
     │                                                                │   handler modules   │
     │                                                                │   imported once;    │
     │  .results ◀───── result pipe: Ready | Broken, then per job ────│   per job: orjson,  │
     │                  Done | Failed | Skipped; Returned | Retiring  │   handler.run()     │
     │                  (Snoozed | Ended: what a handler asked for;   │                     │
     │                  Finished: a result, follow-ups)               │                     │
     │  .bell ◀──────── doorbell: a byte after each frame but a Done ──│                     │
     │                  while more than ring_at of its jobs wait      └─────────────────────┘
     │    _on_bell() ─▶ _read_written(w) ─▶ ipc.Decoder ─▶ _read_results(w), until empty
     │    (jobs of microseconds, `SHORT_JOB_SECONDS`: the pipe itself is watched instead,
     │     _on_results(), and ring_at is -1)
     │        Done: assigned.popleft(), gathered per read ─▶ on_done(jobs, run times)
     │            (the dispatcher's `_jobs_done`: to its completer, without an AttemptEnd)
     │        Used (--fair-by cpu, before an outcome): the front job's CPU ─▶ on_cpu
     │        the rest ─▶ _on_message(w, message), one method per type: _on_ready,
     │        _on_broken, _on_returned, _on_retiring,
     │        _on_outcome (Failed | Snoozed | Ended | Finished): assigned.popleft()
     │            ─▶ on_outcome(AttemptEnd)    (the dispatcher's `_job_finished`: to its completer)
     │        _on_skipped: assigned.popleft(), no outcome (its lease was lost: `drop_lost`)
     │        _on_long: the running job's Checkpoint | LoadCheckpoint | Progress ─▶ on_long
     │            (`pgpool.host.long`), answered with Stored | Loaded (`_answer`)
     │
     │  .exit_fd (a pidfd) readable: the process itself ended ─▶ _on_exit(w):
     │    (without pidfds: _wait_in_thread() ─▶ call_soon_threadsafe(_on_exit, w))
     │    _kill_group() (what the handler started dies with it), _drain_results()
     ▼
  _reap(w): _exit_status() ─▶ _forget() ─▶ _fail_running() ─▶ _requeue() ─▶ .exited set
            ─▶ _settle_startup() ─▶ _replace(): a spare (`_spares`, started ahead), or a
               new worker by _spawn() at the same index

Why a doorbell beside the result pipe: a dispatcher that sleeps between outcomes pays a
wake for each (50 to 90 us of CPU on a small VM, `bench/wake_floor.py`), on the cores the
jobs need. The worker writes every frame at once, so nothing it did is lost if it dies,
but rings only when the pool must act: an outcome other than a plain success, a message,
running low on jobs (at most ``ring_at``, half the depth: when `_assign` tops it up), or
going idle. Between rings the pool's view of a worker lags by its plain successes unread;
whatever asks which job runs reads them first (`drop_lost`, `check_deadlines` a few times
a second, a worker's end, `submit` for a worker that looks full). The run time of a job
the pool saw start late, a timeout's or a crash's, is short by at most that lag: a few
jobs of milliseconds.

Why one pair of pipes per worker rather than one shared call queue: the pool always knows
which job each worker is running (the front of its `assigned`). That lets it kill exactly
one worker at a job's deadline (`check_deadlines`) or when its running job's lease is lost
(`drop_lost`; a lost job still queued behind it is dropped from the worker's queue instead,
`ipc.Drop`, and the job ahead runs on), attribute a crash to the one job that caused it,
hand the worker's unstarted jobs to others, and replace it, while the rest of the pool
carries on. A shared queue cannot say who held what, and a process killed while holding a
shared queue's lock breaks the queue for everyone.

Each worker also fences itself (`pgpool.worker.fence`): every job carries its lease deadline
(`Job.deadline`), and after each heartbeat `extend` sends every worker one `ipc.Extend`.
A worker the kernel ended at a deadline (SIGALRM) has its running job dropped, not acked:
its lease may be another host's by now. `_assign` hands back, instead of sending, jobs
with less than ``min_left_to_start`` seconds left before their deadline.

Every way a worker ends goes through `_reap`: a crash, a `_kill` (deadline, lost lease,
grace period over, hard stop), retiring, or answering Stop. Its death is noticed from the
process itself, through a pidfd that becomes readable when it exits, never from its result
pipe: a handler's child inherits the pipe and may hold it open long after the worker died.
Then whatever the worker wrote before it died is read from the pipe, the process is reaped
(no zombies) and its exit status, or the reason it was killed, becomes the cause of the
failure. Where there are no pidfds (macOS, `pgpool.worker.portable`), a thread per worker waits
for it to exit, reaping it, and hands its end to the event loop; the rest is the same.

Each worker leads its own process group (`worker.main` calls setpgid before it imports a
handler), and `_kill` signals the whole group: a handler's children and grandchildren die
with the attempt. When a worker ends on its own (retiring, stopping) whatever is left in
its group is killed too, so nothing a handler started outlives it. The worker's own side
does the same without the pool (`fence.guard_group`), for when the dispatcher cannot act:
frozen, or dead. A child that leaves the group on purpose (setsid, a double-forking daemon)
escapes this; when the dispatcher runs as PID 1 it still reaps it (`pgpool.host.pid1`).

Workers are started with the ``spawn`` method: a fresh interpreter that inherits none of
the dispatcher's threads, sockets or event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import NamedTuple, cast

from ..errors import HandlerError
from ..logs import event
from ..worker import fence, ipc, portable
from ..worker import main as worker
from .attempt import AttemptEnd, Job
from .backlog import Backlog

log = logging.getLogger("pgpool.pool")

#: Seconds from the pool's start to its first spare workers' (`WorkerPool` ``spares``).
SPARES_AFTER = 5.0
#: Consecutive replacement workers that may fail to start before the pool gives up.
MAX_START_FAILURES = 3
#: How much work, in seconds, to keep queued in each worker's pipe; and the most jobs.
#: The worker rings its doorbell for more at half of it: the dispatcher wakes about once
#: per 10 ms of a worker's jobs, not per job (see the module's text for the figures).
QUEUED_SECONDS = 0.02
MAX_DEPTH = 64
#: Jobs shorter than this on average: the pool reads every worker's result pipe as it
#: fills, not at its doorbell. Their outcomes come faster than a sleeping dispatcher
#: wakes (50 to 90 us on a small VM, bench/wake_floor.py), so it rarely sleeps between
#: them: read at rings only, no-op drains ran 4 to 6% slower (bench/vs_loop.py --checkout).
SHORT_JOB_SECONDS = 0.0001
#: Bytes per read of a result pipe: what a pipe holds. A larger buffer is over malloc's
#: mmap threshold: an mmap, mremap and munmap per read, 28 us against 2 us.
_READ_SIZE = 1 << 16
#: Kill reasons for a worker the pool ends on purpose before it was ready: not a failed start.
_STOPPING = "pool stopping"
_HARD_STOP = "hard stop"
#: The kill reason of a worker that said it cannot load its handler modules (`ipc.Broken`).
_BROKEN = "broken"
#: How a worker's death by a signal begins (`_describe_exit`).
_SIGNALLED = "worker died: signal"
#: Kill reasons (the cause recorded with the attempt), and the start of a hard timeout's.
LEASE_LOST = "lease lost"
TIMEOUT = "timeout"
#: The cause of a job that was not lost, yet ran in a worker killed for a lost one.
KILLED_WITH_LOST = "worker killed for another job's lost lease"


@dataclass(eq=False)
class _Worker:
    index: int
    process: BaseProcess
    exited: asyncio.Future[None]  # set by _reap once its jobs are settled
    exit_fd: int  # readable once the process has exited (a pidfd); -1 without pidfds
    results: int  # the read end of its result pipe, non-blocking; -1 once closed
    bell: int  # the read end of its doorbell (`ipc.Outbox`), non-blocking; -1 once closed
    decoder: ipc.Decoder = field(default_factory=ipc.Decoder)
    transport: asyncio.WriteTransport | None = None
    assigned: deque[Job] = field(default_factory=deque)
    ready: bool = False
    stopping: bool = False
    started_at: float = 0.0  # loop time the front job of `assigned` started
    kill_reason: str | None = None
    #: Killed because the shutdown grace period ran out: its running job was interrupted.
    interrupted: bool = False
    retiring: str | None = None  # left on its own between jobs; nothing of it is running
    #: Lost jobs of `assigned` it was told to drop (`ipc.Drop`): it skips them, or ends if
    #: one had started.
    dropped: set[Job] = field(default_factory=set)

    @property
    def running(self) -> Job | None:
        return self.assigned[0] if self.assigned else None


class WorkerPool:
    """``procs`` worker processes, each fed through its own pipe.

    ``on_outcome`` is called, on the event loop, once per started job: success, failure,
    timeout or worker death; except a job its worker's fence ended (its lease deadline
    passed), which gets no outcome: it is not acked, and runs again once the lease expires.
    ``on_done``, if given, gets the plain successes instead (`ipc.Done`: nothing returned,
    no follow-ups), those of one read of a result pipe together, with their run times:
    the per-job path of a host running short jobs, without an `AttemptEnd` each.
    ``on_returned`` receives jobs that were never started: those a stopping worker hands
    back, those requeued while the pool closes, and late ones (below). ``on_fatal`` is
    called if replacement workers keep failing to start.
    ``min_left_to_start``: a job is sent to a worker only with at least that many seconds
    left before its `Job.deadline`; later ones go back through ``on_returned``.
    ``launched``: workers already started by `launch`, by index, which `start` adopts
    (taking each out of the dict) instead of starting them.
    ``on_cpu``, if given, gets each attempt's CPU seconds, as its worker measured them,
    before its outcome (the workers measure them only then: `ipc.Used`); an attempt that
    ends with its worker has none.
    ``spares``: workers kept started, their handler modules imported, beside the
    ``procs``, from `SPARES_AFTER` seconds after `start` on: a worker that ends (crashed,
    killed, recycled) is replaced by one of them at once, and another spare is started in
    the background. A spare takes an index of its own (``procs`` on), which its title and
    the logs show.
    """

    def __init__(
        self,
        *,
        procs: int,
        modules: list[str],
        on_outcome: Callable[[AttemptEnd], None],
        on_returned: Callable[[list[Job]], None],
        on_fatal: Callable[[str], None],
        on_done: Callable[[list[Job], list[float]], None] | None = None,
        depth: int | None = None,
        max_tasks: int | None = None,
        max_memory: int | None = None,
        min_left_to_start: float = 0.0,
        log: tuple[str, str] | None = None,
        launched: dict[int, Launched] | None = None,
        on_long: Callable[[Job | None, ipc.LongFromWorker, Callable[[ipc.LongToWorker], None]],
                          None] | None = None,
        cpus: dict[str, int] | None = None,
        on_cpu: Callable[[Job, float], None] | None = None,
        spares: int = 0,
    ) -> None:
        self.procs = procs
        self._report_cpu = on_cpu
        self._report_long = on_long
        #: The kinds whose jobs take more than one of the ``procs`` slots (a handler's
        #: ``cpus``): with any, jobs are assigned by slots (`_assign_slots`).
        self._wide = {kind: n for kind, n in (cpus or {}).items() if n > 1}
        self._min_left_to_start = min_left_to_start
        self._fixed_depth = depth
        self._job_seconds = 0.0  # moving average of how long a job takes in a worker
        #: Result pipes are read as they fill (`SHORT_JOB_SECONDS`), not at the doorbell.
        self._watched = False
        self._limits = (max_tasks, max_memory)
        self._log = log  # the workers' log level and format (`worker.main`)
        self._modules = modules
        self._report_outcome = on_outcome
        self._report_done = on_done or self._done_one_by_one
        self._report_returned = on_returned
        self._report_fatal = on_fatal
        #: Workers `launch`ed ahead of the pool, by index: `_spawn` takes each out as it
        #: adopts it, so that what is left in the caller's dict was never adopted.
        self._launched = launched if launched is not None else {}
        self._workers: dict[int, _Worker] = {}
        #: Spare workers started ahead of need, by index (`_top_up_spares`), oldest first;
        #: ``_next_index`` is the index the next one takes.
        self._spares_wanted = spares
        self._spares: dict[int, Launched] = {}
        self._next_index = procs
        self._backlog = Backlog()
        self._start_failures = 0
        self._startup: asyncio.Future[None] | None = None
        self.closing = False
        self.replaced = 0
        #: Workers replaced, by `restart_reason`.
        self.restarts: Counter[str] = Counter()
        self.frames_sent = 0  # job frames written to workers

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, timeout: float = 60.0) -> None:
        """Start every worker and wait until each has imported its handler modules.

        Raises `HandlerError` if a worker cannot import them or dies while starting.
        """
        loop = asyncio.get_running_loop()
        self._startup = loop.create_future()
        for index in range(self.procs):
            await self._spawn(index)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
            # comes in the same turn as the future's result.
            async with asyncio.timeout(timeout):
                await self._startup
        except TimeoutError:
            await self.kill_all()
            raise HandlerError(
                f"worker processes did not start within {timeout:g}s: a handler module may "
                "block at import time"
            ) from None
        except HandlerError:
            await self.kill_all()
            raise
        finally:
            self._startup = None
        # Not at once: a spare's start (an interpreter importing the handler modules) takes
        # a core for a few tenths of a second, which a host's first seconds of work need.
        asyncio.get_running_loop().call_later(SPARES_AFTER, self._top_up_spares)

    async def stop(self, grace: float) -> None:
        """Let running jobs finish within ``grace`` seconds, then kill what is left.

        Unstarted jobs come back through ``on_returned``; jobs killed at the deadline
        end through ``on_outcome`` as failures marked `AttemptEnd.interrupted` (the
        completer does not count such an attempt, up to a bound).
        """
        self.closing = True
        self._abandon_spares()
        returned = self._backlog.take_all()
        if returned:
            self._report_returned(returned)
        for w in self._workers.values():
            if w.ready and not w.stopping:
                w.stopping = True
                self._send(w, ipc.Stop())
            elif not w.ready:
                self._kill(w, _STOPPING)
        waits = [w.exited for w in self._workers.values()]
        if not waits:
            return
        _, late = await asyncio.wait(waits, timeout=grace)
        if late:
            for w in list(self._workers.values()):
                if w.kill_reason is None:
                    w.interrupted = True
                self._kill(w, f"shutdown grace period ({grace:g}s) expired")
            await asyncio.wait(late, timeout=10)

    async def kill_all(self) -> None:
        """Kill every worker now, without reporting outcomes (hard stop)."""
        self.closing = True
        self._report_outcome = _ignore
        self._report_done = _ignore
        self._report_returned = _ignore
        waits = []
        for w in list(self._workers.values()):
            self._kill(w, _HARD_STOP)
            waits.append(w.exited)
        for launched in self._launched.values():  # never adopted: a start cut short
            abandon(launched)
        self._launched.clear()
        self._abandon_spares()
        if waits:
            await asyncio.wait(waits, timeout=10)

    # --- work in --------------------------------------------------------------------------

    def submit(self, jobs: list[Job], ahead: Sequence[Job] = ()) -> None:
        """Queue ``jobs`` for the workers, those of ``ahead`` (some of them) before the whole
        backlog: a job that holds a slot of a fleet-wide limit keeps it from every host
        while it waits here, so it goes next."""
        if not self._watched:
            depth = self.depth
            for w in list(self._workers.values()):
                if len(w.assigned) > depth // 2:
                    # It may have rung for jobs when there were none, then gone on
                    # quietly: what it wrote since says how many it holds now.
                    self._read_written(w)
        if ahead:
            first = {id(job) for job in ahead}
            self._backlog.add_first(list(ahead))
            self._backlog.add(job for job in jobs if id(job) not in first)
        else:
            self._backlog.add(jobs)
        self._assign()

    @property
    def held(self) -> int:
        """Jobs claimed and not yet finished: backlog plus everything sent to workers."""
        return len(self._backlog) + sum(len(w.assigned) for w in self._workers.values())

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def idle_kinds(self, kinds: Iterable[str]) -> set[str]:
        """Those of ``kinds`` this host holds no job of: none waits in the backlog, and
        no worker has one (queued or running). Stops reading as soon as none is left: a
        busy host of one kind answers at its first job."""
        idle = set(kinds).difference(self._backlog.kinds())
        for w in self._workers.values():
            if not idle:
                break
            for job in w.assigned:
                idle.discard(job.kind)
        return idle

    def held_jobs(self) -> Iterator[Job]:
        yield from self._backlog
        for w in self._workers.values():
            yield from w.assigned

    def drop_lost(self) -> None:
        """Forget jobs whose lease this host lost (the heartbeat marked them), so that two
        attempts of a job never run at the same time: the backlog's are dropped, a worker
        running one is killed, and one waiting in a worker's pipe is dropped there: the
        worker skips it (or ends at once if it has just started it, `ipc.Drop`), and the job
        running ahead of it runs on."""
        self._backlog.keep(lambda job: not job.lost)
        for w in list(self._workers.values()):
            if w.kill_reason is not None or not any(job.lost for job in w.assigned):
                continue
            # Outcomes already written say which job runs now: maybe not the front one.
            self._read_written(w)
            running = w.running
            if running is not None and running.lost:
                self._kill(w, LEASE_LOST)  # its unstarted jobs are requeued, lost ones not
                continue
            drop = [job for job in w.assigned if job.lost and job not in w.dropped]
            if not drop or w.kill_reason or w.retiring:
                continue
            w.dropped.update(drop)
            self._send(w, ipc.Drop([(job.id, job.attempt) for job in drop]))
            ids = sorted(job.id for job in drop)
            event(log, logging.INFO, "lost_queued",
                  "worker %d skips %d jobs whose lease was lost while they waited behind its "
                  "running job (ids %s); that job runs on", w.index, len(drop),
                  ", ".join(map(str, ids[:10])), worker=w.index, jobs=len(drop))

    def extend(self) -> None:
        """The heartbeat moved `Job.deadline` on: send each worker one `ipc.Extend`, for
        the earliest deadline among the jobs it was sent and has not answered (every job
        it holds is one of those), leaving out lost ones: their deadlines stay behind, and
        none of them runs past this message (`drop_lost` told the worker before)."""
        for w in self._workers.values():
            if w.assigned and w.kill_reason is None:
                until = min((job.deadline for job in w.assigned if not job.lost),
                            default=math.inf)
                if until != math.inf:
                    self._send(w, ipc.Extend(until))

    def check_deadlines(self) -> None:
        """Kill workers whose running job is past its hard timeout (the dispatcher calls
        this a few times a second). First, what a worker holding more than one job wrote
        without ringing: its front job may be over, and the one running another. That
        also bounds how late the pool learns of a plain success to one call's interval."""
        now = asyncio.get_running_loop().time()
        for w in list(self._workers.values()):
            if len(w.assigned) > 1 and not self._watched:
                self._read_written(w)
            job = w.running
            if job is not None and job.timeout and now - w.started_at > job.timeout:
                self._kill(w, f"{TIMEOUT}: killed after {job.timeout:g}s")

    @property
    def job_seconds(self) -> float:
        """Moving average of how long a job takes in a worker (0 before any finished)."""
        return self._job_seconds

    @property
    def depth(self) -> int:
        """Jobs a worker may hold (running plus queued in its pipe).

        Enough queued work (about `QUEUED_SECONDS`) that a worker never waits for the
        dispatcher to answer an outcome, and the dispatcher wakes about once per half of
        it; no more: queued jobs cannot move to an idle worker. Jobs of 10 ms and longer
        get 2 (one running, one waiting); 2 ms jobs 10; 0.3 ms and shorter 64.
        """
        if self._fixed_depth is not None:
            return self._fixed_depth
        if self._wide:
            return 1  # a job starts only once its slots are free: none waits in a pipe
        if self._job_seconds <= 0:
            return 2
        return max(2, min(MAX_DEPTH, round(QUEUED_SECONDS / self._job_seconds)))

    def _assign(self) -> None:
        if not self._backlog:
            return
        if self._wide:
            self._assign_slots()
            return
        depth = self.depth
        # Top a worker up only once it is half drained, so short jobs travel in chunks of
        # depth/2 per frame instead of one frame per job.
        open_ = [w for w in self._workers.values()
                 if w.ready and not (w.stopping or w.kill_reason or w.retiring)
                 and len(w.assigned) <= depth // 2]
        if not open_:
            return
        # Deal in rounds, one job per worker per round, so a short backlog spreads over
        # idle workers before any worker gets a job queued behind its running one.
        batches: dict[_Worker, list[Job]] = {}
        late: list[Job] = []
        start_by = time.monotonic() + self._min_left_to_start
        for level in range(depth):
            for w in open_:
                if len(w.assigned) + len(batches.get(w, ())) <= level:
                    job = self._take(start_by, late)
                    if job is None:
                        break
                    batches.setdefault(w, []).append(job)
            if not self._backlog:
                break
        if late:
            log.warning("handing back %d jobs with too little of their lease left to start "
                        "(a slow claim, or a stalled dispatcher)", len(late))
            self._report_returned(late)
        now = asyncio.get_running_loop().time()
        for w, batch in batches.items():
            if not w.assigned:
                w.started_at = now
                batch[0].started = True
            w.assigned.extend(batch)
            # Watched, a worker never rings for a plain success (ring_at -1).
            self._send(w, ipc.Jobs([job.wire() for job in batch],
                                   -1 if self._watched else depth // 2))
            self.frames_sent += 1

    def _assign_slots(self) -> None:
        """Assign by slots, when some kinds take several (``cpus``): each idle worker gets
        the backlog's next job if its slots are free, one job at a time. The backlog's
        order is kept: a wide job that does not fit yet holds the narrow ones behind it
        back until enough slots are free, so a stream of narrow jobs never starves it."""
        idle = [w for w in self._workers.values()
                if w.ready and not (w.stopping or w.kill_reason or w.retiring or w.assigned)]
        used = self.slots_used
        late: list[Job] = []
        start_by = time.monotonic() + self._min_left_to_start
        now = asyncio.get_running_loop().time()
        for w in idle:
            while self._backlog and self._backlog.peek().deadline < start_by:
                late.append(self._backlog.popleft())
            if not self._backlog:
                break
            job = self._backlog.peek()
            slots = self._wide.get(job.kind, 1)
            if used + slots > self.procs:
                break
            self._backlog.popleft()
            used += slots
            w.started_at = now
            job.started = True
            w.assigned.append(job)
            self._send(w, ipc.Jobs([job.wire()]))
            self.frames_sent += 1
        if late:
            log.warning("handing back %d jobs with too little of their lease left to start "
                        "(a slow claim, or a stalled dispatcher)", len(late))
            self._report_returned(late)

    @property
    def slots_used(self) -> int:
        """The slots the running jobs take (each its kind's ``cpus``)."""
        return sum(self._wide.get(w.assigned[0].kind, 1)
                   for w in self._workers.values() if w.assigned)

    def _take(self, start_by: float, late: list[Job]) -> Job | None:
        """The next backlog job whose deadline is ``start_by`` or later; earlier ones go
        to ``late``."""
        backlog = self._backlog
        while backlog:
            job = backlog.popleft()
            if job.deadline >= start_by:
                return job
            late.append(job)
        return None

    # --- processes ------------------------------------------------------------------------

    async def _spawn(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        process, task, results, bell = (self._launched.pop(index, None)
                                        or launch(index, self._modules, self._limits,
                                                  self._log, cpu=self._report_cpu is not None))
        os.set_blocking(results, False)
        os.set_blocking(bell, False)
        w = _Worker(index, process, loop.create_future(), _exit_fd(process), results, bell)
        self._workers[index] = w
        # Its task pipe first: a spare's Ready is in its result pipe already, and read at
        # once, jobs would be assigned to it with nothing to send them through.
        w.transport, _ = await loop.connect_write_pipe(
            asyncio.BaseProtocol, os.fdopen(task, "wb", buffering=0)
        )
        loop.add_reader(w.bell, self._on_bell, w)
        if self._watched:
            loop.add_reader(w.results, self._on_results, w)
        if w.exit_fd >= 0:
            loop.add_reader(w.exit_fd, self._on_exit, w)
        else:
            _wait_in_thread(w, lambda: loop.call_soon_threadsafe(self._on_exit, w))

    def _send(self, w: _Worker, message: ipc.ToWorker) -> None:
        if w.transport is not None and not w.transport.is_closing():
            w.transport.write(ipc.encode(message))

    def _kill(self, w: _Worker, reason: str) -> None:
        """Kill the worker and everything its handler started (its process group)."""
        if w.kill_reason is None:
            w.kill_reason = reason
        if w.process.exitcode is None:
            _kill_group(w.process.pid)

    @property
    def _starting(self) -> bool:
        """`start` is running: it waits for every worker to be ready, and a worker that
        ends before it is ready fails the start instead of being replaced."""
        return self._startup is not None

    def _fail_start(self, error: HandlerError) -> None:
        if self._startup is not None and not self._startup.done():  # the first error wins
            self._startup.set_exception(error)

    # --- messages from a worker -----------------------------------------------------------

    def _on_message(self, w: _Worker, message: ipc.FromWorker) -> None:
        match message:  # the per-job ones first (Done: `_read_results`)
            case ipc.Failed() | ipc.Snoozed() | ipc.Ended() | ipc.Finished() | ipc.HandedBack():
                self._on_outcome(w, message)
            case ipc.Checkpoint() | ipc.LoadCheckpoint() | ipc.Progress():
                self._on_long(w, message)
            case ipc.Skipped():
                self._on_skipped(w, message)
            case ipc.Ready():
                self._on_ready(w)
            case ipc.Returned():
                self._on_returned(w, message)
            case ipc.Retiring():
                self._on_retiring(w, message)
            case ipc.Broken():
                self._on_broken(w, message)
            case _:
                raise RuntimeError(f"worker {w.index} sent {message!r}")  # a bug

    def _on_outcome(self, w: _Worker, message: ipc.Failed | ipc.Snoozed | ipc.Ended
                    | ipc.Finished | ipc.HandedBack) -> None:
        self._finished(w, AttemptEnd.of(self._front_job(w, message.id), message))

    def _on_long(self, w: _Worker, message: ipc.LongFromWorker) -> None:
        """The running job's handler checkpoints or reports progress
        (`pgpool.worker.long`): to ``on_long``, with the job (None when the attempt the
        message names is not the one running: it has ended) and how to answer."""
        job = w.running
        if job is not None and (job.id, job.attempt) != (message.id, message.attempt):
            job = None
        if self._report_long is not None:
            self._report_long(job, message, lambda answer: self._answer(w, answer))
        elif not isinstance(message, ipc.Progress):  # a pool on its own (tests)
            self._answer(w, ipc.Stored(message.id, "no dispatcher stores checkpoints")
                         if isinstance(message, ipc.Checkpoint)
                         else ipc.Loaded(message.id, None))

    def _answer(self, w: _Worker, answer: ipc.LongToWorker) -> None:
        """Answer worker ``w``'s request, unless it has ended meanwhile."""
        if w.kill_reason is None and self._workers.get(w.index) is w:
            self._send(w, answer)

    def _on_skipped(self, w: _Worker, message: ipc.Skipped) -> None:
        # Its lease was lost before it started: nothing to report (the heartbeat did).
        self._front_job(w, message.id)
        w.started_at = asyncio.get_running_loop().time()  # its next job starts now
        if w.assigned:
            w.assigned[0].started = True
        if len(w.assigned) <= self.depth // 2:
            self._assign()

    def _front_job(self, w: _Worker, job_id: int) -> Job:
        """The job an outcome is about: the front of `assigned`, which it leaves."""
        job = w.assigned.popleft()
        if job.id != job_id:  # the protocol is strictly in order; this is a bug
            raise RuntimeError(f"worker {w.index} answered job {job_id}, not {job.id}")
        if w.dropped:
            w.dropped.discard(job)
        return job

    def _finished(self, w: _Worker, outcome: AttemptEnd) -> None:
        self._next_started(w, (outcome.elapsed,))
        self._report_outcome(outcome)
        self._top_up(w)

    def _finished_done(self, w: _Worker, jobs: list[Job], elapsed: list[float]) -> None:
        """Plain successes, in the order the worker ran them (`_read_results`)."""
        self._next_started(w, elapsed)
        self._report_done(jobs, elapsed)
        self._top_up(w)

    def _next_started(self, w: _Worker, elapsed: Iterable[float]) -> None:
        """Jobs of ``w`` ran for ``elapsed`` seconds each: the one now at its front started
        as the last of them ended."""
        w.started_at = asyncio.get_running_loop().time()
        if w.assigned:
            w.assigned[0].started = True
        # A slow average: one job preempted for 5 ms among 3 us jobs must not swing the
        # batch and depth derived from it; a real change (jobs turning long) still moves it
        # at once, because the new times are so much larger.
        average = self._job_seconds
        for seconds in elapsed:
            average = seconds if not average else 0.98 * average + 0.02 * seconds
        self._job_seconds = average
        if (average < SHORT_JOB_SECONDS) != self._watched:
            self._watch_results(not self._watched)

    def _watch_results(self, on: bool) -> None:
        """Read every result pipe as it fills (``on``), or only at its worker's doorbell."""
        self._watched = on
        loop = asyncio.get_running_loop()
        for w in self._workers.values():
            if w.results >= 0:
                if on:
                    loop.add_reader(w.results, self._on_results, w)
                else:
                    loop.remove_reader(w.results)

    def _top_up(self, w: _Worker) -> None:
        # Every other worker was topped up when it last could be: only this one, now
        # shorter of jobs, may need more (per-job path: skip scanning the pool).
        if len(w.assigned) <= self.depth // 2:
            self._assign()

    def _done_one_by_one(self, jobs: list[Job], elapsed: list[float]) -> None:
        """Without ``on_done``: each success goes to ``on_outcome``."""
        for job, seconds in zip(jobs, elapsed, strict=True):
            self._report_outcome(AttemptEnd(job, None, seconds))

    def _on_ready(self, w: _Worker) -> None:
        w.ready = True
        self._start_failures = 0
        if (self._startup is not None and not self._startup.done()
                and all(x.ready for x in self._workers.values())):
            self._startup.set_result(None)
        self._assign()

    def _on_returned(self, w: _Worker, message: ipc.Returned) -> None:
        ids = set(message.ids)
        returned = [job for job in w.assigned if job.id in ids]
        w.assigned = deque(job for job in w.assigned if job.id not in ids)
        if returned:
            self._report_returned(returned)

    def _on_retiring(self, w: _Worker, message: ipc.Retiring) -> None:
        # Everything still assigned is unstarted, including jobs sent after it decided.
        w.retiring = message.reason
        self._requeue(w)
        self._assign()

    def _on_broken(self, w: _Worker, message: ipc.Broken) -> None:
        w.kill_reason = _BROKEN
        if self._starting:
            self._fail_start(HandlerError(message.reason))
        else:
            self._start_failed(message.reason)

    # --- a worker's end -------------------------------------------------------------------

    def _on_bell(self, w: _Worker) -> None:
        """The worker rang its doorbell: it wrote what the pool must act on (and maybe
        plain successes before it): decode and handle all it has written."""
        try:
            rung = os.read(w.bell, 4096)
        except BlockingIOError:
            return
        if not rung:  # it has ended: `_on_exit` reads its results
            self._close_bell(w)
            return
        self._read_written(w)

    def _on_results(self, w: _Worker) -> None:
        """A watched result pipe (`_watch_results`) has something: one read of it."""
        if self._read_results(w) is None:
            self._close_results(w)  # EOF; its death is noticed by _on_exit, not here

    def _read_written(self, w: _Worker) -> None:
        """Handle every message the worker has written so far, without waiting for more."""
        while w.results >= 0:
            got = self._read_results(w)
            if got is None:
                self._close_results(w)  # EOF; its death is noticed by _on_exit, not here
                return
            if got < _READ_SIZE:
                # The pipe was empty then. What the worker writes meanwhile either rings,
                # or is a plain success with jobs still to run, whose last one rings.
                return

    def _read_results(self, w: _Worker) -> int | None:
        """Handle what one read of the result pipe brings: the bytes it read (0: nothing
        was waiting), None at EOF."""
        try:
            data = os.read(w.results, _READ_SIZE)
        except BlockingIOError:
            return 0
        if not data:
            return None
        # Plain successes, the common case by far, are gathered and reported together: the
        # per-job work of a short job is then a few list appends here.
        done: list[Job] = []
        elapsed: list[float] = []
        for message in w.decoder.feed(data):
            if type(message) is ipc.Done:
                job = self._front_job(w, message.id)
                job.started = True  # it ran: the heartbeat records that until it is acked
                done.append(job)
                elapsed.append(message.elapsed)
                continue
            if type(message) is ipc.Used:  # the next outcome's: the job still in front
                assert self._report_cpu is not None  # its workers send none otherwise
                self._report_cpu(w.assigned[0], message.cpu)
                continue
            if done:  # in order: what came before this message first
                self._finished_done(w, done, elapsed)
                done, elapsed = [], []
            self._on_message(w, message)
        if done:
            self._finished_done(w, done, elapsed)
        return len(data)

    def _on_exit(self, w: _Worker) -> None:
        """The worker process exited (its pidfd turned readable, or its waiter thread saw
        it end): settle it now, even if a child of its handler still holds its result pipe
        open."""
        if w.exit_fd >= 0:
            asyncio.get_running_loop().remove_reader(w.exit_fd)
            os.close(w.exit_fd)
        _kill_group(w.process.pid)  # what its handler started must not outlive it
        self._drain_results(w)
        asyncio.get_running_loop().create_task(self._reap(w))

    def _drain_results(self, w: _Worker) -> None:
        """Handle everything the dead worker wrote, then close its result pipe.

        The process has exited, so all it ever wrote is in the pipe already: reading until
        the pipe is empty (or at EOF) cannot miss an outcome, and never waits for a child
        that holds the pipe open.
        """
        while w.results >= 0 and self._read_results(w):
            pass
        self._close_results(w)

    def _close_results(self, w: _Worker) -> None:
        if w.results >= 0:
            asyncio.get_running_loop().remove_reader(w.results)  # if watched
            os.close(w.results)
            w.results = -1
        self._close_bell(w)

    def _close_bell(self, w: _Worker) -> None:
        if w.bell >= 0:
            asyncio.get_running_loop().remove_reader(w.bell)
            os.close(w.bell)
            w.bell = -1

    async def _reap(self, w: _Worker) -> None:
        """Settle a worker that exited: it crashed, was killed, retired or stopped. Its
        running job fails with the exit as the cause, its unstarted jobs go back, and,
        unless the pool or this worker was stopping, a new worker takes its place.
        """
        code = await self._exit_status(w)
        self._forget(w)
        if w.kill_reason is None and w.running in w.dropped:
            w.kill_reason = LEASE_LOST  # it ended itself for it (`ipc.Drop`)
        cause = w.kill_reason or _describe_exit(code)
        self._fail_running(w, cause)
        self._requeue(w)  # the jobs queued behind it never started
        w.exited.set_result(None)  # what stop() and kill_all() wait for
        if self._settle_startup(w, cause) and not (self.closing or w.stopping):
            await self._replace(w, cause)

    async def _exit_status(self, w: _Worker) -> int | None:
        """The worker's exit code (negative: the signal that ended it; None: unknown),
        reaping it (no zombie). It has exited already (`_on_exit`), so this does not wait."""
        w.process.join(timeout=1)
        return w.process.exitcode

    def _forget(self, w: _Worker) -> None:
        """Take the worker out of the pool: nothing is sent or assigned to it any more."""
        if w.transport is not None:
            w.transport.close()
        del self._workers[w.index]

    def _fail_running(self, w: _Worker, cause: str) -> None:
        """The job it was running, if any, ends as a failure with ``cause``; unless the
        fence ended it at its lease deadline: then its lease may be another host's by now,
        so it is not acked, and it runs again once the lease ends on the server."""
        if not w.assigned:
            return
        job = w.assigned.popleft()
        if cause == fence.DEADLINE_PASSED:
            log.warning("worker %d (pid %s): %s, %s: not acked, it runs again once its "
                        "lease ends", w.index, w.process.pid, cause, job)
            return
        interrupted = w.interrupted
        if cause == LEASE_LOST and not job.lost:
            # Killed for the lost job ahead of it, which ended just before the kill (after
            # `drop_lost` read what the worker had written): this one had only just
            # started, and is not to blame. It runs again, the attempt not counted.
            cause, interrupted = KILLED_WITH_LOST, True
        # Its run time as this pool saw it: from when the worker started it to now.
        elapsed = asyncio.get_running_loop().time() - w.started_at if job.started else 0.0
        self._report_outcome(AttemptEnd(job, cause, elapsed, cause=cause,
                                        interrupted=interrupted))

    def _requeue(self, w: _Worker) -> None:
        """Take a worker's unstarted jobs: back to the front of the backlog, or to the
        dispatcher when no worker will take new jobs any more."""
        unstarted = [job for job in w.assigned if not job.lost]
        w.assigned.clear()
        if unstarted:
            if self.closing:
                self._report_returned(unstarted)
            else:
                self._backlog.add_first(unstarted)

    def _settle_startup(self, w: _Worker, cause: str) -> bool:
        """Account for a worker that ended before it was ready. During `start` that fails
        the start (False: it is not replaced); later it counts as a failed start."""
        if w.ready or w.kill_reason in (_STOPPING, _HARD_STOP):
            return True
        if self._starting:
            # Killed from outside (an operator, the OOM killer) is not a module that cannot
            # load: start another, a few times.
            if cause.startswith(_SIGNALLED) and self._start_failures + 1 < MAX_START_FAILURES:
                self._start_failures += 1
                log.warning("worker %d (pid %s) %s while starting; starting another",
                            w.index, w.process.pid, cause)
                return True
            module = self._modules[0] if self._modules else "..."
            self._fail_start(HandlerError(
                f"worker {w.index} exited while starting ({cause}): run "
                f"`python -c 'import {module}'` to see why"
            ))
            return False
        if w.kill_reason != _BROKEN:  # a broken one was counted when it said so
            self._start_failed(cause)
        return True

    async def _replace(self, w: _Worker, cause: str) -> None:
        """Start a new worker at the dead one's index and give it work."""
        if w.retiring:
            log.info("worker %d (pid %s) %s; replacing it", w.index, w.process.pid,
                     w.retiring)
        elif w.ready:
            log.warning("worker %d (pid %s) %s; replacing it", w.index, w.process.pid, cause)
        self.replaced += 1
        self.restarts[restart_reason(w, cause)] += 1
        index = w.index
        if self._spares:  # a spare takes its place, with the spare's own index
            index = next(iter(self._spares))  # the oldest: most likely ready
            self._launched[index] = self._spares.pop(index)
        await self._spawn(index)
        self._assign()
        if index != w.index:
            self._top_up_spares()

    @property
    def spare_pids(self) -> list[int]:
        """The process ids of the spare workers, oldest first."""
        return [cast(int, spare.process.pid) for spare in self._spares.values()]

    def _top_up_spares(self) -> None:
        """Start spare workers until there are ``spares`` of them."""
        while len(self._spares) < self._spares_wanted and not self.closing:
            index = self._next_index
            self._next_index += 1
            self._spares[index] = launch(index, self._modules, self._limits, self._log,
                                         cpu=self._report_cpu is not None)

    def _abandon_spares(self) -> None:
        """End the spare workers: the pool is closing."""
        for launched in self._spares.values():
            abandon(launched)
        self._spares.clear()

    def _start_failed(self, reason: str) -> None:
        self._start_failures += 1
        if self._start_failures >= MAX_START_FAILURES and not self.closing:
            self.closing = True
            self._report_fatal(
                f"worker processes keep failing to start ({reason}); stopping this dispatcher"
            )


class Launched(NamedTuple):
    """A worker process started before its pool existed (`launch`): the pool adopts it."""

    process: BaseProcess
    task: int  # the write end of its task pipe
    results: int  # the read end of its result pipe
    bell: int  # the read end of its doorbell


def launch(index: int, modules: Sequence[str], limits: tuple[int | None, int | None],
           log: tuple[str, str] | None, *, cpu: bool = False) -> Launched:
    """Start worker ``index`` (`pgpool.worker.main`, a fresh interpreter) importing
    ``modules``, with its (max tasks, max memory) ``limits`` and ``log`` settings, measuring
    each attempt's CPU time with ``cpu``, and return it with the dispatcher's ends of its
    pipes. `pgpool run` calls it before the
    dispatcher has imported its own modules, so that both start at once."""
    ctx = multiprocessing.get_context("spawn")
    task_r, task_w = ctx.Pipe(duplex=False)
    result_r, result_w = ctx.Pipe(duplex=False)
    bell_r, bell_w = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=worker.main,
        args=(index, list(modules), task_r, result_w, bell_w, os.getpid(), *limits, log,
              cpu),
        name=f"pgpool-worker-{index}",
        daemon=True,
    )
    process.start()
    # The child has its own copies now; ours must close or EOF would never arrive.
    task_r.close()
    result_w.close()
    bell_w.close()
    ends = Launched(process, os.dup(task_w.fileno()), os.dup(result_r.fileno()),
                    os.dup(bell_r.fileno()))
    task_w.close()
    result_r.close()
    bell_r.close()
    return ends


def abandon(launched: Launched) -> None:
    """End a `launch`ed worker no pool adopted, and reap it."""
    assert launched.process.pid is not None  # started
    _kill_group(launched.process.pid)
    launched.process.join()
    os.close(launched.task)
    os.close(launched.results)
    os.close(launched.bell)


def restart_reason(w: _Worker, cause: str) -> str:
    """Why a worker is replaced, as the metrics' ``reason`` label: recycle, memory, timeout,
    lease (lost, or its fence ended it at the deadline) or crash (anything else)."""
    if w.retiring:
        return "memory" if w.retiring == worker.RETIRED_AFTER_MEMORY_ERROR else "recycle"
    if cause.startswith(TIMEOUT):
        return "timeout"
    if cause in (LEASE_LOST, fence.DEADLINE_PASSED):
        return "lease"
    return "crash"


def _exit_fd(process: BaseProcess) -> int:
    """A file descriptor that becomes readable when ``process`` exits: a pidfd; -1 where
    there are none (`_wait_in_thread` then). Not the process's sentinel: that is a pipe
    the worker's own children inherit and hold open."""
    assert process.pid is not None
    return os.pidfd_open(process.pid) if portable.PIDFD else -1


def _wait_in_thread(w: _Worker, exited: Callable[[], object]) -> None:
    """Without pidfds: call ``exited`` from a thread of its own once worker ``w`` has
    exited. A thread per worker, as asyncio watches children where pidfds are missing: one
    blocking ``waitpid`` each, no SIGCHLD handler to share with other code, nothing polled.
    ``waitpid`` reaps the worker as it returns (``waitid`` with WNOWAIT would not, but
    Python has it on macOS only from 3.13), so its exit status is known before ``exited``
    runs, and its process group, which `_on_exit` kills, stays reserved while anything in
    it lives."""
    def wait() -> None:
        w.process.join()
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits
            exited()

    threading.Thread(target=wait, name=f"pgpool-exit-{w.index}", daemon=True).start()


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by worker ``pid``: the worker, if it still runs, and
    every process its handlers started that stayed in the group."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # nothing left in the group (or not a leader yet)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "worker died: exit status unknown"
    if code == -fence.SIGNAL:
        return fence.DEADLINE_PASSED
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"{_SIGNALLED} {-code} ({name})"
    return f"worker died: exit code {code}"


def _ignore(*_: object) -> None:
    pass
