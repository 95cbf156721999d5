"""The claim scheduler: when this host claims, how many jobs, and what an idle loop awaits.

Room. A host holds at most `capacity` jobs (running, sent to a worker, waiting in the
pool's backlog, or being claimed)::

    capacity(procs, batch) = procs + (1 + CLAIM_LOOPS) * batch

one running per worker, a batch for the workers to go through, and a batch on its way for
each claim loop. A loop claims when a whole batch fits (`has_room`), so while the workers
go through one batch the next two are on their way. It asks for `want` jobs: a batch, or
more when workers are idle, so that a small batch still fills them.

Two claim loops, each with at most one claim in flight: one's round trip hides behind the
other's, which doubles what a fixed batch can claim per second. Each loop repeats
`claim_step`, whose answer says what to do next:

- `Step.AGAIN`: the claim came back full, so more may be ready now: claim again at once,
  and wake the other loop (it may claim the next batch meanwhile);
- `Step.RECHECK`: a burst host found nothing and ran the reaper, or an idle host told its
  group that it settled a notification (`pgpool.host.settle`): claim once more, alone;
- `Step.DRAINED`: a burst host is done: nothing ready, nothing held or to ack here, and
  no job it could run is running on another host (one that died holds its jobs until the
  reaper returns them; a burst host waits for that, polling);
- `Step.THROTTLED`: this host's share of the fleet's claims per second is spent for now;
- or wait, until woken or the poll backstop, for one reason (`Wait`):
  `Wait.ROOM` (outcomes wake it: `job_finished`), `Wait.ACKS` (the completer's backlog is
  at its high-water mark: `acks_flushed` wakes it), or `Wait.WORK` (the queue came back
  short: only a notification, `work_ready`, or the poll wakes it; outcomes must not, or
  every finished job would cost an empty claim). A notification wakes one loop waiting for
  work: it is usually one job, which one claim takes, and a second would come back empty.

A prompt claim: a job notified while the host is busy (its loops wait for room or for the
budget) would otherwise wait for the next claim, a batch of work away (100 ms of no-op
jobs at a batch of 1,000), however urgent. The notification (`notified`) starts one claim
of one job per (queue, kind) pair instead (`Claimer.claim_prompt`), for the kinds the host
holds no job of (`Workers.idle_kinds`): a job of one of those claimed now goes to the next
free worker (the backlog takes its pairs in turns: `pgpool.host.backlog`), while a kind
the host is busy with gets its next jobs from the full claims, soon enough. (The
notification does not say its kind: the claim asks for each idle one.) Bounds, so that a
host whose producers notify all the time pays little:

- none for a kind the host is busy with, nor for one the last full claim took more than
  one job of: the full claims keep bringing that one (a host draining a backlog of one
  kind never makes any, whether it holds jobs or waits for the budget); none before the
  host's first full claim has answered;
- one job per (queue, kind) pair at most (`sql.CLAIM_PROMPT`);
- at most one every `PROMPT_EVERY`: a notification sooner than that is put off until
  then, not dropped;
- a kind a prompt claim found nothing of is left to the full claims until the next one
  starts (`_quiet`): a flood of notifications for kinds with nothing ready costs one empty
  prompt claim per batch, not one per notification;
- past `capacity` and the budget by the jobs it takes; the budget's next claims pay them
  back.

A loop that could make a full claim makes it instead, unless the other loop's is in
flight: then the prompt claim goes first, and the batch after it.

An idle host (it holds no job) answers a notification by its tier in its group: the first
tier at once, the others only if no host of the group has said meanwhile that it took
every job it saw (`pgpool.host.settle`): a job enqueued into an idle fleet costs a few
claims, not one per host.

Room and budget are reserved before each round trip (`_claiming`), because the other loop
claims meanwhile. With ``batch="auto"`` the batch is re-derived after every claim from the
measured claim round trip and job time (`pgpool.host.sizing`), and the completer's ack batch
follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import operator
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Final, Literal, Protocol

import psycopg

from ..db.outage import Failures, backoff
from .attempt import Job
from .budget import ClaimBudget
from .settle import settle_wait
from .sizing import MAX_BATCH, BatchSizer

log = logging.getLogger("pgpool.scheduler")

_kind = operator.attrgetter("kind")

#: Claim loops, each with at most one claim in flight.
CLAIM_LOOPS: Final = 2
#: Prompt claims come at most this often, seconds: two hundred a second, each a job per
#: (queue, kind) pair of the kinds that have none waiting, and each charged to the budget.
#: (At 10 ms, and notifications sooner dropped rather than put off, the flood bench's p99
#: was still a full claim's cycle, 80 ms: a quarter of its jobs came sooner.)
PROMPT_EVERY: Final = 0.005


def capacity(procs: int, batch: int) -> int:
    """The most jobs a host holds or is claiming: one running per worker, a batch for the
    workers to go through, and a batch on its way for each claim loop."""
    return procs + (1 + CLAIM_LOOPS) * batch


def ack_high_water(procs: int, batch: int) -> int:
    """Unwritten acks at which claiming stops: four times the most a host can hold at
    ``batch`` (pass the largest batch it may use), and at least 1,000."""
    return max(1000, 4 * capacity(procs, batch))


def largest_batch(batch: int | Literal["auto"]) -> int:
    """The largest batch a host configured with ``batch`` may claim."""
    return MAX_BATCH if batch == "auto" else batch


class Wait(enum.Enum):
    """What an idle claim loop waits for."""

    ROOM = "room"
    ACKS = "acks"
    WORK = "work"


class Step(enum.Enum):
    """What a claim loop does after a `ClaimScheduler.claim_step` that did not wait."""

    AGAIN = "again"
    RECHECK = "recheck"
    DRAINED = "drained"
    THROTTLED = "throttled"


# --- the parts the scheduler reads, as it sees them (tests pass fakes) --------------------

class ClaimSource(Protocol):
    @property
    def rtt(self) -> float: ...
    @property
    def found_none(self) -> bool: ...
    @property
    def limited_kinds(self) -> frozenset[str]: ...
    @property
    def prompt_kinds(self) -> Sequence[str]: ...
    async def claim(self, limit: int) -> list[Job]: ...
    async def claim_prompt(self, kinds: Collection[str]) -> list[Job]: ...
    def sweep_next(self) -> None: ...
    async def running(self) -> tuple[int, float]: ...


class Workers(Protocol):
    @property
    def held(self) -> int: ...
    @property
    def job_seconds(self) -> float: ...
    def idle_kinds(self, kinds: Iterable[str]) -> set[str]: ...
    def submit(self, jobs: list[Job], ahead: Sequence[Job] = ()) -> None: ...


class AckBacklog(Protocol):
    max_batch: int
    @property
    def backlog(self) -> int: ...
    def has_room(self) -> bool: ...


class LeaseHealth(Protocol):
    @property
    def at_risk(self) -> bool: ...


class Reaping(Protocol):
    async def reap(self) -> tuple[int, int]: ...


class Settling(Protocol):
    """How an idle host settles notifications with its group (`pgpool.host.settle.Settler`)."""
    signature: str

    @property
    def tier(self) -> int: ...
    @property
    def last_tier(self) -> int: ...
    @property
    def standbys(self) -> bool: ...
    async def announce(self) -> bool: ...
    async def call_all(self) -> None: ...


class ClaimScheduler:
    """Runs the claim loops of one host: `run` until `stop` or, in burst mode, drained."""

    def __init__(
        self,
        *,
        procs: int,
        batch: int | Literal["auto"],
        claimer: ClaimSource,
        workers: Workers,
        acks: AckBacklog,
        lease: LeaseHealth,
        budget: ClaimBudget,
        reaper: Reaping,
        burst: bool = False,
        poll: float = 1.0,
        idle_poll: float | None = None,
        listening: Callable[[], bool] = bool,
        settler: Settling | None = None,
    ) -> None:
        self.procs = procs
        self.sizer = BatchSizer(procs) if batch == "auto" else None
        self._fixed_batch = 0 if batch == "auto" else batch
        self.claimer = claimer
        self.workers = workers
        self.acks = acks
        acks.max_batch = self.batch  # acks are flushed a batch at a time
        self.lease = lease
        self.budget = budget
        self.reaper = reaper
        self.burst = burst
        self.poll = poll
        self.idle_poll = poll if idle_poll is None else max(poll, idle_poll)
        self._listening = listening
        self._wakes = [asyncio.Event() for _ in range(CLAIM_LOOPS)]
        #: One run of claim failures for both loops: an outage is logged once, not per loop.
        self._failures = Failures(log, "claim")
        #: What each idle loop waits for, by its event.
        self._waiting: dict[asyncio.Event, Wait] = {}
        #: Jobs asked for by claims in flight: room the pool will need when they return.
        self._claiming = 0
        self._reaped_for_burst = False
        #: The last claim came back full: more jobs are likely waiting.
        self._backlog = False
        #: The kinds a notification asked a prompt claim for (it woke a loop held by the
        #: budget, if any), when the last one started, the kinds one found nothing of
        #: since the last full claim, and the full claims started (a prompt claim that
        #: overlapped one, started during it or before it, may have found nothing because
        #: that one took it).
        self._prompt: frozenset[str] = frozenset()
        self._prompt_wake = asyncio.Event()
        self._prompted_at = -math.inf
        self._quiet: set[str] = set()
        self._full_claims = 0
        #: The kinds the last full claim took more than one job of; None until the first
        #: full claim answers: a host that has not claimed yet knows of no kind that would
        #: be worth a claim of its own (at start, a prompt beside the first claim would only
        #: take more of what that one brings, past capacity).
        self._bulk: set[str] | None = None
        #: A notification put off until `PROMPT_EVERY` has passed since the last prompt.
        self._put_off: asyncio.TimerHandle | None = None
        #: A burst host found nothing to claim while other hosts ran jobs it could run.
        self._waiting_for_others = False
        self._stopping = False
        self.drained = False
        #: How this host settles notifications with its group while idle (None: it answers
        #: every one at once; a burst host does, it runs alone).
        self._settler = None if burst else settler
        #: A notification this idle host stands by on (`pgpool.host.settle`), until its
        #: tier's turn or another host's announcement.
        self._standby: asyncio.TimerHandle | None = None
        #: The next full claim answers a notification (this host was idle): if it comes back
        #: short, it is announced; full, the claim after it answers (`_answered_full`).
        self._answering = False
        #: A claim answering the notification came back full: a second one calls all.
        self._answered_full = False
        #: This host announced: its next full claim is the sweep that makes that true.
        self._announced = False
        #: Notifications settled by another host's announcement while this one stood by;
        #: and announcements of its group heard at all.
        self.settled_by_others = 0
        self._settles_heard = 0

    # --- formulas ------------------------------------------------------------------------

    @property
    def batch(self) -> int:
        """Jobs per claim: fixed, or re-derived by the sizer after every claim."""
        return self.sizer.batch if self.sizer else self._fixed_batch

    @property
    def capacity(self) -> int:
        return capacity(self.procs, self.batch)

    def has_room(self) -> bool:
        """A whole batch fits under `capacity`, counting claims in flight."""
        return self.capacity - self.workers.held - self._claiming >= self.batch

    def want(self) -> int:
        """Jobs to ask for: a batch, or more when workers are idle (so that a small batch
        still fills them), never past `capacity`."""
        held = self.workers.held + self._claiming
        return min(self.capacity - held, max(self.batch, self.procs - held))

    @property
    def claiming(self) -> int:
        """Jobs asked for by the claims in flight."""
        return self._claiming

    @property
    def waiting(self) -> list[Wait]:
        """What the idle loops wait for, one entry per idle loop (not yet woken)."""
        return sorted((reason for wake, reason in self._waiting.items() if not wake.is_set()),
                      key=lambda reason: reason.value)

    # --- events from the other parts (all on the event loop) ------------------------------

    def job_finished(self) -> None:
        """A job left the pool: a loop waiting for room may claim (per job: cheap test
        first)."""
        if Wait.ROOM in self._waiting.values() and self.has_room():
            self._wake_waiting(Wait.ROOM)

    def acks_flushed(self) -> None:
        """The completer wrote a flush: a loop waiting for its backlog may claim, and a
        burst host may be done."""
        if self.acks.has_room():
            self._wake_waiting(Wait.ACKS)
        if self.burst and self.workers.held == 0 and self.acks.backlog == 0:
            self._wake_all()  # the claim loops check whether the queue is drained

    def work_ready(self) -> None:
        """There may be work (a notification, a reconnected listener): wake one loop
        waiting for work; with none waiting, the loops still claiming claim again."""
        idle = [wake for wake, reason in self._waiting.items() if reason is Wait.WORK]
        if idle:
            idle[0].set()
        else:
            for wake in self._wakes:
                if wake not in self._waiting:
                    wake.set()

    def notified(self) -> None:
        """A notification: a job may be ready (`work_ready`). A prompt claim as well, of
        the kinds the host holds no job of, within its bounds, unless a full claim can be
        made (see the module's docstring). An idle host past its group's first tier
        stands by instead, and so does, behind every idle one, a host whose every worker
        is busy with jobs that are not short (`pgpool.host.settle`)."""
        settler = self._settler
        if settler is not None:
            tier = 0
            if self._idle():
                tier = settler.tier
                self._answering = tier == 0
            elif self.workers.held >= self.procs and settler.standbys:
                wait = settle_wait(self.claimer.rtt)
                if not 0 < self.workers.job_seconds < wait:
                    # Every worker is busy with a job that is not short (or not known yet):
                    # a job claimed now would wait behind one, while a host with a free
                    # worker could start it.
                    tier = settler.last_tier
            if tier > 0:
                if self._standby is None:
                    self._standby = asyncio.get_running_loop().call_later(
                        tier * settle_wait(self.claimer.rtt), self._stood_by)
                return
        self._respond()

    def settled(self, signature: str) -> None:
        """A host of ``signature``'s group took every job of theirs it saw, and claims once
        more: a notification this host stands by on is settled, if of its group."""
        if self._of_group(signature):
            self._settles_heard += 1
            if self._stand_down():
                self.settled_by_others += 1

    def wanted(self, signature: str) -> None:
        """A host of ``signature``'s group has more jobs than it takes: if of its group and
        idle, this host claims now, standing by or not."""
        if self._of_group(signature):
            self._stand_down()
            if self._idle():
                self._respond()

    def _of_group(self, signature: str) -> bool:
        return self._settler is not None and signature == self._settler.signature

    def _stand_down(self) -> bool:
        """Cancel the standby, if any; whether there was one."""
        if self._standby is None:
            return False
        self._standby.cancel()
        self._standby = None
        return True

    def _stood_by(self) -> None:
        """Its tier's turn came before an announcement: answer the notification."""
        self._standby = None
        if not self._stopping:
            self._answering = True
            self._respond()

    def _could_prompt(self) -> bool:
        """Whether a notification could start a prompt claim: this host serves several
        kinds and holds no job of one. Then its automatic batch stays short
        (`pgpool.host.sizing.SHARED_MAX_BATCH`): the prompt claim commits behind its
        claims and acks, and would wait for their WAL to be flushed."""
        kinds = self.claimer.prompt_kinds
        return len(kinds) > 1 and bool(self.workers.idle_kinds(kinds))

    def _idle(self) -> bool:
        return self.workers.held == 0 and self._claiming == 0

    def _respond(self) -> None:
        # Asked for even when a loop waits for work: the claim it makes may find the budget
        # spent. A loop that can make a full claim makes it instead (`claim_step`).
        since = time.monotonic() - self._prompted_at
        if since < PROMPT_EVERY:
            if self._put_off is None:  # asked again then, of the kinds idle then
                self._put_off = asyncio.get_running_loop().call_later(
                    PROMPT_EVERY - since, self._notified_again)
        elif self._bulk is not None:
            bulk = self._bulk
            kinds = frozenset(self.workers.idle_kinds(
                kind for kind in self.claimer.prompt_kinds
                if kind not in self._quiet and kind not in bulk))
            if kinds:
                self._prompt = kinds
                self._prompt_wake.set()  # a loop held by the budget
                full = [wake for wake, reason in self._waiting.items()
                        if reason is Wait.ROOM]
                if full:
                    full[0].set()
        self.work_ready()

    def _notified_again(self) -> None:
        self._put_off = None
        if not self._stopping:
            self._respond()

    def stop(self) -> None:
        """Stop claiming: every loop returns after its claim in flight, if any."""
        self._stopping = True
        if self._put_off is not None:
            self._put_off.cancel()
            self._put_off = None
        self._stand_down()
        self._wake_all()

    # --- the loops ------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the claim loops until `stop` or, in burst mode, until drained.

        If a loop fails, the other is stopped and awaited before the error propagates: it
        ends after its claim in flight, so no claimed job arrives after `run` returned.
        """
        loops = [asyncio.create_task(self._loop(wake)) for wake in self._wakes]
        try:
            await asyncio.gather(*loops)
        except BaseException:
            self.stop()
            await asyncio.gather(*loops, return_exceptions=True)
            raise

    async def _loop(self, wake: asyncio.Event) -> None:
        failures = self._failures
        while not (self._stopping or self.drained):
            wake.clear()
            try:
                step = await self.claim_step()
            except (psycopg.Error, OSError) as exc:
                failures.failed(exc)
                await self._wait(wake, Wait.WORK, backoff(failures.count, 0.1, 5.0))
                continue
            if not self.lease.at_risk:  # at risk, no claim was tried: it has not worked again
                failures.succeeded()
            if isinstance(step, Wait):
                await self._wait(wake, step, self._backstop(step))
            elif step is Step.AGAIN:
                self.work_ready()  # the other loop may claim the next batch
            elif step is Step.DRAINED:
                log.info("burst: no runnable job is ready and nothing is in flight")
                self.drained = True
                self._wake_all()  # the other loop
                return
            elif step is Step.THROTTLED:  # until the budget has a batch, or a prompt claim
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self.poll,
                                                   self.budget.wait_for(self.want()))):
                        await self._prompt_wake.wait()

    def _backstop(self, reason: Wait) -> float:
        """How long an idle loop waits at most before it claims again. Every way a job
        becomes ready for this host notifies its listener (an enqueue, the stager, the
        reaper, a hand-back, an operator's retry), so while the listener is connected and
        the last claim found no job waiting at all, the poll is only a backstop for a
        notification lost some other way: ``idle_poll``, so that an idle fleet costs the
        database next to nothing. Otherwise (the listener is reconnecting, jobs wait that
        a limit holds back, the lease is at risk) the poll interval."""
        if (reason is Wait.WORK and self.claimer.found_none and self._listening()
                and not self.lease.at_risk):
            return self.idle_poll
        return self.poll

    async def claim_step(self) -> Step | Wait:
        """Claim if there is room (or a prompt claim is owed), and say what the loop does
        next."""
        step = await self._claim_step()
        if self._answered_full and step in (Wait.ROOM, Wait.ACKS, Step.THROTTLED):
            # A claim answering a notification came back full, and this host can take no
            # more for now: the rest is the group's (`_answered`).
            assert self._settler is not None
            self._answered_full = self._answering = False
            await self._settler.call_all()
        return step

    async def _claim_step(self) -> Step | Wait:
        prompt, self._prompt = self._prompt, frozenset()
        self._prompt_wake.clear()
        room = self.has_room()
        if not (room or prompt):
            return Wait.ROOM
        if not self.acks.has_room():
            return Wait.ACKS
        if self.lease.at_risk:  # the database is not answering: poll until it does
            return Wait.WORK
        if prompt and self._claiming:
            # The other loop's full claim is in flight (a big one takes tens of ms): the
            # notified job waits neither for it nor for a second one. The batch follows.
            return await self._claim_prompt(prompt)
        # Under the claim budget, wait for a whole batch (or a bucketful) rather than
        # claiming whatever trickled in: many small claims cost more than a few full ones.
        want = min(self.want(), int(self.budget.burst)) if room else 0
        if not (room and self.budget.take(want, backlog=self._backlog)):
            if prompt:
                return await self._claim_prompt(prompt)
            return Step.THROTTLED
        # A full claim, which takes the notified jobs as well.
        answering, self._answering = self._answering, False
        heard = self._settles_heard
        self._full_claims += 1
        self._quiet.clear()
        self._claiming += want
        try:
            jobs = await self.claimer.claim(want)
        finally:
            self._claiming -= want
        self.budget.spend(len(jobs) - want)  # give back what the claim did not take
        self._submit(jobs)
        self._bulk = {kind for kind, n in Counter(map(_kind, jobs)).items() if n > 1}
        if self.sizer is not None:
            self.acks.max_batch = self.sizer.update(
                self.claimer.rtt, self.workers.job_seconds, shared=self._could_prompt())
        self._backlog = len(jobs) == want
        if self._announced:
            return await self._after_announcing(len(jobs) == want)
        if answering and self._settler is not None and self._settler.standbys:
            return await self._answered(len(jobs), want, heard)
        if len(jobs) == want:
            return Step.AGAIN
        if self.burst and not jobs and self._nothing_in_flight():
            return await self._check_drained()
        self._reaped_for_burst = False
        return Wait.WORK

    async def _answered(self, took: int, want: int, heard: int) -> Step | Wait:
        """A claim answering a notification for the group (`pgpool.host.settle`) took
        ``took`` jobs of ``want``. Full, a backlog waits: call the whole group; but a full
        claim of one job may be a lone one: claim on, and call the group if that claim is
        full too (or cannot be made: `claim_step`). Short, it took all it saw: tell the
        group, then claim once more, a sweep, which sees every job notified before the
        announcement; unless another host's announcement came while it claimed (the
        group had heard ``heard`` before): that one settled what this claim answered,
        and a job notified since starts the tiers again."""
        assert self._settler is not None
        if took == want:
            if want > 1 or self._answered_full:
                self._answered_full = False
                await self._settler.call_all()
            else:
                self._answered_full = self._answering = True
            return Step.AGAIN
        self._answered_full = False
        if self._settles_heard != heard:
            return Wait.WORK
        if not await self._settler.announce():
            return Wait.WORK  # the hosts standing by claim at their turn
        self._announced = True
        self.claimer.sweep_next()
        return Step.RECHECK

    async def _after_announcing(self, full: bool) -> Step | Wait:
        """The claim after an announcement: if it came back full, jobs are left that the
        group stood down for: call it back."""
        self._announced = False
        if not full:
            return Wait.WORK
        assert self._settler is not None
        await self._settler.call_all()
        return Step.AGAIN

    async def _claim_prompt(self, kinds: frozenset[str]) -> Step | Wait:
        """A prompt claim of ``kinds``, past the budget and capacity by the jobs it takes:
        not a batch, it sizes nothing and says nothing of the backlog."""
        self._prompted_at = time.monotonic()
        full_claims, overlapped = self._full_claims, self._claiming > 0
        jobs = await self.claimer.claim_prompt(kinds)
        self.budget.spend(len(jobs))
        if self._full_claims == full_claims and not overlapped:
            # Nothing ready of those: not a full claim's taking them first.
            self._quiet.update(kinds.difference(job.kind for job in jobs))
        self._submit(jobs)
        return Step.AGAIN if self.has_room() else Wait.ROOM

    def _submit(self, jobs: list[Job]) -> None:
        """Hand claimed ``jobs`` to the workers, those holding a limit's slot first."""
        if jobs:
            limited = self.claimer.limited_kinds
            self.workers.submit(jobs, [job for job in jobs if job.kind in limited]
                                if limited else ())
            self._reaped_for_burst = self._waiting_for_others = False

    def _nothing_in_flight(self) -> bool:
        return self.workers.held == 0 and self._claiming == 0 and self.acks.backlog == 0

    async def _check_drained(self) -> Step | Wait:
        """Drained only if a claim still finds nothing after a reaper pass, and no job this
        host could run is running elsewhere: jobs stranded by a dead host come back when
        the reaper finds their leases expired, and count as work for a batch host too."""
        if not self._reaped_for_burst:
            await self.reaper.reap()
            # The recheck looks behind the cursors too: the jobs the reaper returned, and
            # any this host handed back, are there.
            self.claimer.sweep_next()
            self._reaped_for_burst = True
            return Step.RECHECK
        self._reaped_for_burst = False
        running, lease_left = await self.claimer.running()
        if running == 0:
            return Step.DRAINED
        if not self._waiting_for_others:  # said once, not at every poll
            log.info("burst: nothing to claim, but %d jobs are running on other hosts, "
                     "were made ready meanwhile or wait on their kind's limit (the last "
                     "lease ends in %.1fs); waiting for them to finish, be reaped or be "
                     "claimed",
                     running, max(0.0, lease_left))
            self._waiting_for_others = True
        return Wait.WORK

    # --- waking ---------------------------------------------------------------------------

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.set()

    def _wake_waiting(self, reason: Wait) -> None:
        for wake, waits_for in self._waiting.items():
            if waits_for is reason:
                wake.set()

    async def _wait(self, wake: asyncio.Event, reason: Wait, timeout: float) -> None:
        self._waiting[wake] = reason
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
            # arrives as the event is set, and the loop would claim on after a hard stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await wake.wait()
        finally:
            del self._waiting[wake]
