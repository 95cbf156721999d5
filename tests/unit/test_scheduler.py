"""The claim scheduler in-process, with fake parts: room, the two claim loops, what wakes
them, backpressure, the budget and the burst host's drain check.

The fakes answer at once, so a claim loop only ever pauses in its own waits: after a few
turns of the event loop every loop is idle and `ClaimScheduler.waiting` says why. The poll
backstop is set to an hour, so a loop that claims did so because something woke it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

import pytest

from pgpool.host import scheduler as scheduler_module
from pgpool.host.attempt import Job
from pgpool.host.budget import ClaimBudget
from pgpool.host.scheduler import CLAIM_LOOPS, ClaimScheduler, Step, Wait, ack_high_water, capacity
from pgpool.host.sizing import SHARED_MAX_BATCH

HOUR = 3600.0


def job(i: int, kind: str = "k") -> Job:
    return Job(i, kind, "default", 1, 0, 3, b"{}", None)


class FakeClaimer:
    """Hands out jobs from ``ready``, and those in ``behind`` (behind its cursors) only
    in a sweep (`sweep_next`); a claim may be held open with ``gate``."""

    def __init__(self, ready: int = 0) -> None:
        self.ready = [job(i) for i in range(ready)]
        self.behind: list[Job] = []
        self.sweep_owed = False
        self.sweeps = 0  # claims that were sweeps (`sweep_next` before them)
        self.limits: list[int] = []
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.rtt = 0.002
        #: The kinds claimed with a limit (none here).
        self.limited_kinds: frozenset[str] = frozenset()
        #: Jobs of this host's kinds that other hosts are running.
        self.elsewhere = 0
        #: The last claim found nothing ready at all.
        self.found_none = False
        #: The kinds a prompt claim may take, and the ready jobs of kind "u" (``ready`` is
        #: of kind "k"), which only a prompt claim takes here.
        self.prompt_kinds = ["k", "u"]
        self.urgent: list[Job] = []
        #: The kinds of each prompt claim, and the full claims made before it.
        self.prompts: list[tuple[frozenset[str], int]] = []

    async def claim_prompt(self, kinds: frozenset[str]) -> list[Job]:
        self.prompts.append((kinds, len(self.limits)))
        taken = []
        if "k" in kinds and self.ready:
            taken.append(self.ready.pop(0))
        if "u" in kinds and self.urgent:
            taken.append(self.urgent.pop(0))
        return taken

    async def claim(self, limit: int) -> list[Job]:
        self.limits.append(limit)
        self.in_flight += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
        finally:
            self.in_flight -= 1
        if self.sweep_owed:
            self.sweep_owed = False
            self.sweeps += 1
            self.ready[:0], self.behind = self.behind, []
        taken, self.ready = self.ready[:limit], self.ready[limit:]
        self.found_none = not taken and not self.behind
        return taken

    def sweep_next(self) -> None:
        self.sweep_owed = True

    async def running(self) -> tuple[int, float]:
        return self.elsewhere, 20.0


class FakeWorkers:
    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.job_seconds = 0.0
        #: Kinds held besides those of ``jobs``: as if in the backlog.
        self.busy: set[str] = set()

    @property
    def held(self) -> int:
        return len(self.jobs)

    def idle_kinds(self, kinds: Iterable[str]) -> set[str]:
        return set(kinds) - self.busy - {job.kind for job in self.jobs}

    def submit(self, jobs: list[Job], ahead: Sequence[Job] = ()) -> None:
        self.jobs.extend(jobs)


class FakeAcks:
    def __init__(self) -> None:
        self.max_batch = 0
        self.backlog = 0
        self.room = True

    def has_room(self) -> bool:
        return self.room


class FakeLease:
    at_risk = False


class FakeReaper:
    def __init__(self, claimer: FakeClaimer, revive: int = 0) -> None:
        self.passes = 0
        self._claimer = claimer
        self._revive = revive

    async def reap(self) -> tuple[int, int]:
        self.passes += 1
        revived = [job(1000 + i) for i in range(self._revive)]
        self._revive = 0
        self._claimer.behind.extend(revived)  # a job reaped is behind the cursors
        return len(revived), 0


class FakeSettler:
    """A host's group (`pgpool.host.settle.Settler`): its tier, and what it announced."""

    signature = "ours"

    def __init__(self, tier: int = 0, standbys: bool = True) -> None:
        self.tier = tier
        self.standbys = standbys  # some host of the group stands by
        self.last_tier = 3  # behind every idle host's
        self.announced = 0  # "!settled" notifications sent
        self.called_all = 0  # the group called at once: a backlog waits

    async def announce(self) -> bool:
        self.announced += 1
        return True

    async def call_all(self) -> None:
        self.called_all += 1


class Host:
    """A scheduler over fake parts, its claim loops running in a task."""

    def __init__(self, *, procs: int = 2, batch: int | str = 10, ready: int = 0,
                 burst: bool = False, budget: ClaimBudget | None = None,
                 revive: int = 0, poll: float = HOUR, idle_poll: float | None = None,
                 listening: bool = False, settler: FakeSettler | None = None) -> None:
        self.claimer = FakeClaimer(ready)
        self.listening = listening
        self.workers = FakeWorkers()
        self.acks = FakeAcks()
        self.lease = FakeLease()
        self.reaper = FakeReaper(self.claimer, revive)
        self.scheduler = ClaimScheduler(
            procs=procs, batch=batch, claimer=self.claimer,  # type: ignore[arg-type]
            workers=self.workers, acks=self.acks, lease=self.lease,
            budget=budget or ClaimBudget(1e9), reaper=self.reaper,
            burst=burst, poll=poll, idle_poll=idle_poll, listening=lambda: self.listening,
            settler=settler,
        )
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.scheduler.run())

    async def settle(self, want: Callable[[], bool] | None = None) -> None:
        """Turn the event loop until ``want()`` holds, by default until every claim loop
        is idle."""
        def idle() -> bool:
            return len(self.scheduler.waiting) == CLAIM_LOOPS

        for _ in range(1000):
            if (want or idle)():
                return
            await asyncio.sleep(0)
        raise AssertionError(f"loops never settled: waiting {self.scheduler.waiting}, "
                             f"claims {self.claimer.limits}")

    def finish(self, n: int) -> None:
        """The workers finish ``n`` jobs; each outcome tells the scheduler, as the
        dispatcher does."""
        for _ in range(n):
            self.workers.jobs.pop()
            self.scheduler.job_finished()

    async def stop(self) -> None:
        self.scheduler.stop()
        if self.task is not None:
            await self.task


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):  # a broken scheduler fails here, never hangs
            await test()

    asyncio.run(bounded())


# --- the formulas -------------------------------------------------------------------------

def test_capacity_is_a_running_job_per_worker_and_a_batch_per_loop_plus_one() -> None:
    assert capacity(2, 50) == 2 + 3 * 50
    assert capacity(16, 1) == 19
    assert ack_high_water(2, 50) == 1000  # never below 1,000
    assert ack_high_water(16, 1000) == 4 * (16 + 3 * 1000)


def test_want_is_a_batch_or_enough_to_fill_idle_workers_never_past_capacity() -> None:
    host = Host(procs=8, batch=2)
    assert host.scheduler.want() == 8  # 8 idle workers and a batch of 2: fill the workers
    host.workers.jobs = [job(i) for i in range(6)]
    assert host.scheduler.want() == 2
    host.workers.jobs = [job(i) for i in range(13)]  # capacity 14
    assert host.scheduler.want() == 1
    assert not host.scheduler.has_room()


# --- two loops, room and what wakes a loop ------------------------------------------------

def test_two_claims_are_in_flight_at_once_and_room_is_reserved_for_both() -> None:
    async def test() -> None:
        host = Host(procs=2, batch=10, ready=1000)
        host.claimer.gate = asyncio.Event()
        host.start()
        await host.settle(lambda: host.claimer.in_flight == 2)
        # Both loops asked for a batch while neither had returned: 2 + 2 x 10 jobs reserved.
        assert host.claimer.limits == [10, 10]
        host.claimer.gate.set()
        await host.settle()
        # Full batches claim again at once, while a whole batch fits under capacity.
        assert capacity(2, 10) - 10 < host.workers.held <= capacity(2, 10)
        assert host.scheduler.waiting == [Wait.ROOM, Wait.ROOM]
        await host.stop()

    run(test)


def test_each_claim_asks_for_its_own_limit_while_another_is_in_flight() -> None:
    async def test() -> None:
        # 8 workers, batch 2: the first loop asks for 8 (idle workers), the second, with
        # those 8 reserved, for one batch. A shared limit would have sent 2 twice or 8 twice.
        host = Host(procs=8, batch=2, ready=100)
        host.claimer.gate = asyncio.Event()
        host.start()
        await host.settle(lambda: host.claimer.in_flight == 2)
        assert host.claimer.limits == [8, 2]
        host.claimer.gate.set()
        await host.stop()

    run(test)


def test_a_host_at_capacity_waits_for_room_and_an_outcome_wakes_it() -> None:
    async def test() -> None:
        host = Host(procs=2, batch=10, ready=1000)
        host.start()
        await host.settle()
        assert host.scheduler.waiting == [Wait.ROOM, Wait.ROOM]
        claims = len(host.claimer.limits)
        host.finish(5)  # not a batch of room yet: nobody claims
        await host.settle()
        assert len(host.claimer.limits) == claims
        host.finish(10)
        await host.settle()
        assert len(host.claimer.limits) > claims
        assert host.workers.held <= capacity(2, 10)
        await host.stop()

    run(test)


def test_a_notification_while_full_prompt_claims_the_kinds_the_host_holds_none_of(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "PROMPT_EVERY", 0.0)

    async def test() -> None:
        host = Host(procs=2, batch=10, ready=1000)
        host.workers.busy = {"k"}  # it holds jobs of "k", none of "u"
        host.start()
        await host.settle()
        assert host.scheduler.waiting == [Wait.ROOM, Wait.ROOM]
        claims, held = len(host.claimer.limits), host.workers.held
        host.claimer.urgent = [job(5000, "u")]
        host.scheduler.notified()
        await host.settle()
        # One claim past what the loops would claim, of "u" alone: one more "k" job would
        # wait behind those in the backlog anyway.
        assert host.claimer.prompts == [(frozenset({"u"}), claims)]
        assert len(host.claimer.limits) == claims
        assert host.workers.held == held + 1
        host.scheduler.notified()  # the host holds a job of "u" now: none
        await host.settle()
        assert len(host.claimer.prompts) == 1
        host.finish(1)  # the job of "u" done
        await host.settle()
        assert len(host.claimer.limits) == claims  # no room for a batch yet
        host.scheduler.notified()  # "u" again: nothing ready, so "u" is quiet...
        await host.settle()
        host.scheduler.notified()  # ...and not asked for again before a full claim
        await host.settle()
        assert host.claimer.prompts[1:] == [(frozenset({"u"}), claims)]
        host.finish(10)  # room for a batch: a full claim
        await host.settle()
        assert host.claimer.limits[claims:] == [10]
        host.scheduler.notified()  # and the next notification may ask for "u" again
        await host.settle()
        assert host.claimer.prompts[2:] == [(frozenset({"u"}), claims + 1)]
        await host.stop()

    run(test)


async def with_a_full_claim_in_flight() -> Host:
    """A host full of jobs of "k", one of its loops making a full claim held open (its
    ``claimer.gate``), the other waiting for room."""
    host = Host(procs=2, batch=10, ready=1000)
    host.start()
    await host.settle()
    host.claimer.gate = asyncio.Event()
    host.finish(10)
    await host.settle(lambda: host.claimer.in_flight == 1)
    return host


def test_a_prompt_claim_does_not_wait_for_the_other_loops_full_claim_in_flight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "PROMPT_EVERY", 0.0)

    async def test() -> None:
        host = await with_a_full_claim_in_flight()
        claims = len(host.claimer.limits) - 1
        del host.workers.jobs[-10:]  # room for a second batch, untold: the loop waits
        host.claimer.urgent = [job(5000, "u")]
        host.scheduler.notified()
        await host.settle(lambda: len(host.claimer.prompts) == 1)
        # The prompt claim while the first batch is on its way, not a second batch: that
        # one comes after it.
        assert host.claimer.prompts == [(frozenset({"u"}), claims + 1)]
        host.claimer.gate.set()
        await host.settle()
        await host.stop()

    run(test)


def test_a_prompt_claim_that_found_nothing_beside_a_full_claim_leaves_the_kind_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "PROMPT_EVERY", 0.0)

    async def test() -> None:
        host = await with_a_full_claim_in_flight()
        host.scheduler.notified()  # nothing of "u" ready: that full claim may have it
        await host.settle(lambda: len(host.claimer.prompts) == 1)
        host.claimer.gate.set()
        host.claimer.gate = None
        await host.settle()
        host.claimer.urgent = [job(5000, "u")]
        host.scheduler.notified()  # "u" was not made quiet: asked for again
        await host.settle(lambda: len(host.claimer.prompts) == 2)
        assert host.claimer.urgent == []
        await host.stop()

    run(test)


def test_no_prompt_claim_before_the_first_full_claim_has_answered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "PROMPT_EVERY", 0.0)

    async def test() -> None:
        budget = ClaimBudget(10, clock=lambda: 0.0)  # one batch: the other loop held back
        host = Host(procs=2, batch=10, ready=1000, budget=budget)
        host.claimer.gate = asyncio.Event()  # the first claim is slow
        host.start()
        await host.settle(lambda: host.claimer.in_flight == 1)
        for _ in range(20):  # the other loop finds the budget spent
            await asyncio.sleep(0)
        host.claimer.urgent = [job(5000, "u")]
        host.scheduler.notified()  # it knows of no kind yet that those claims do not bring
        for _ in range(50):
            await asyncio.sleep(0)
        assert host.claimer.prompts == []
        host.claimer.gate.set()
        host.claimer.gate = None
        await host.settle(lambda: host.claimer.in_flight == 0 and len(host.claimer.limits) == 1)
        host.scheduler.notified()  # now it does, and the budget holds the host back
        await host.settle(lambda: len(host.claimer.prompts) == 1)
        await host.stop()

    run(test)


def test_no_prompt_claim_for_kinds_the_host_is_busy_with_nor_sooner_than_prompt_every(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "PROMPT_EVERY", 0.05)

    async def test() -> None:
        host = Host(procs=2, batch=10, ready=1000)
        host.workers.busy = {"k", "u"}
        host.start()
        await host.settle()
        host.scheduler.notified()  # busy with every kind: the full claims take them
        await host.settle()
        assert host.claimer.prompts == []
        host.workers.busy = {"k"}
        host.claimer.urgent = [job(5000, "u"), job(5001, "u")]
        host.scheduler.notified()
        await host.settle()
        host.finish(1)  # that job of "u" done: "u" is idle again
        host.scheduler.notified()  # within PROMPT_EVERY of the last: put off until then
        host.scheduler.notified()  # (once)
        await host.settle()
        assert [kinds for kinds, _ in host.claimer.prompts] == [frozenset({"u"})]
        while len(host.claimer.prompts) < 2:  # the put-off notification, once its timer fires
            await asyncio.sleep(0.01)  # (the test's 10 s bound fails it if it never does)
        await host.settle()
        assert [kinds for kinds, _ in host.claimer.prompts] == [frozenset({"u"})] * 2
        assert host.claimer.urgent == []
        await host.stop()

    run(test)


def test_an_empty_queue_waits_for_work_and_outcomes_do_not_wake_it() -> None:
    async def test() -> None:
        host = Host(procs=2, batch=10, ready=15)
        host.start()
        await host.settle()
        assert host.scheduler.waiting == [Wait.WORK, Wait.WORK]
        claims = len(host.claimer.limits)
        host.finish(15)  # every outcome: no claim (it would come back empty)
        await host.settle()
        assert len(host.claimer.limits) == claims

    run(test)


def test_a_notification_wakes_one_loop_waiting_for_work() -> None:
    async def test() -> None:
        host = Host(procs=2, batch=10)
        host.start()
        await host.settle()
        claims = len(host.claimer.limits)
        host.claimer.ready.append(job(1))
        host.scheduler.work_ready()
        await host.settle()
        assert len(host.claimer.limits) == claims + 1  # one claim takes it, not two
        assert host.workers.held == 1
        await host.stop()

    run(test)


# --- settling a notification with the group (pgpool.host.settle) ---------------------------

async def idle_host(settler: FakeSettler, **kwargs: Any) -> Host:
    """A host with a settler, started, its first claims made (an empty queue)."""
    host = Host(procs=2, batch=10, settler=settler, **kwargs)
    host.start()
    await host.settle()
    host.claimer.limits.clear()
    return host


async def notified(settler: FakeSettler, ready: int = 1) -> Host:
    """An `idle_host` told of ``ready`` new jobs (one notification), its loops idle again."""
    host = await idle_host(settler)
    host.claimer.ready.extend(job(i) for i in range(1, ready + 1))
    host.scheduler.notified()
    await host.settle()
    return host


@pytest.fixture
def standing_by_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier past the first stands by for an hour: only an announcement ends it here."""
    monkeypatch.setattr(scheduler_module, "settle_wait", lambda rtt: HOUR)


def test_an_idle_first_tier_host_claims_at_once_then_announces_and_sweeps_once() -> None:
    async def test() -> None:
        settler = FakeSettler(tier=0)
        host = await notified(settler)
        # The claim took all it saw: announced, then one more claim, a sweep, which
        # announces nothing (it found nothing: the loops wait for work).
        assert host.workers.held == 1
        assert (host.claimer.limits, settler.announced, host.claimer.sweeps) == ([10, 10], 1, 1)
        assert settler.called_all == 0
        await host.stop()

    run(test)


def test_a_full_claim_answering_a_notification_leaves_the_announcing_to_a_short_one(
        ) -> None:
    async def test() -> None:
        settler = FakeSettler(tier=0)
        host = Host(procs=1, batch=1, settler=settler)
        host.start()
        await host.settle()
        host.claimer.ready.append(job(1))
        host.scheduler.notified()
        await host.settle()
        # A full claim of one job, then one that came back short: announced once, after it.
        assert host.workers.held == 1
        assert (settler.announced, settler.called_all, host.claimer.sweeps) == (1, 0, 1)
        await host.stop()

    run(test)


def test_a_host_whose_group_has_no_standby_announces_nothing() -> None:
    """A lone host, or a pair: its first claim is all a notification costs, as before."""
    async def test() -> None:
        settler = FakeSettler(tier=0, standbys=False)
        host = await notified(settler, ready=20)
        host.claimer.limits.clear()
        host.workers.jobs.clear()
        host.claimer.ready.append(job(99))
        host.scheduler.notified()
        await host.settle()
        assert host.claimer.limits == [10]
        assert (settler.announced, settler.called_all) == (0, 0)
        await host.stop()

    run(test)


def test_a_first_tier_host_that_found_nothing_announces_it_too() -> None:
    """The job may have gone to a host that holds jobs (those answer at once and announce
    nothing): the hosts standing by must still hear that nothing is left."""
    async def test() -> None:
        settler = FakeSettler(tier=0)
        host = await notified(settler, ready=0)
        assert (len(host.claimer.limits), settler.announced, host.claimer.sweeps) == (2, 1, 1)
        await host.stop()

    run(test)


def test_a_first_tier_host_that_hears_another_announce_while_it_claims_leaves_it_at_that(
        ) -> None:
    """The other host of the first tier announced while this one claimed: nobody stands by
    on what came before that announcement, and whatever came after starts the tiers
    again: a second announcement, and its sweep, would add nothing."""
    async def test() -> None:
        settler = FakeSettler(tier=0)
        host = await idle_host(settler)
        host.claimer.gate = asyncio.Event()
        host.scheduler.notified()
        await host.settle(lambda: host.claimer.in_flight == 1)
        host.scheduler.settled("theirs")  # another group's: no
        host.scheduler.settled("ours")
        host.claimer.gate.set()
        await host.settle()
        assert (host.claimer.limits, settler.announced, host.claimer.sweeps) == ([10], 0, 0)
        await host.stop()

    run(test)


def test_a_sweep_after_announcing_that_comes_back_full_wakes_the_group_again() -> None:
    async def test() -> None:
        settler = FakeSettler(tier=0)
        host = await idle_host(settler)
        host.claimer.ready.append(job(1))
        host.claimer.behind.extend(job(100 + i) for i in range(30))  # only a sweep sees them
        host.scheduler.notified()
        await host.settle()
        assert settler.announced == 1
        assert settler.called_all == 1  # it took 9 of 30: the others must not stand down
        await host.stop()

    run(test)


def test_a_burst_calls_the_whole_group_at_a_full_claim() -> None:
    """A claim of ten that comes back full tells a backlog: every host of the group is
    wanted at once, not tier by tier (a batch of one needs a second full claim: below)."""
    async def test() -> None:
        settler = FakeSettler(tier=0)
        host = await notified(settler, ready=1000)
        assert host.claimer.limits[:2] == [10, 10]
        assert (settler.called_all, settler.announced) == (1, 0)
        await host.stop()

    run(test)


def test_a_lone_full_claim_then_none_for_want_of_budget_calls_the_whole_group() -> None:
    async def test() -> None:
        now = [0.0]
        settler = FakeSettler(tier=0)
        host = Host(procs=1, batch=1, settler=settler,
                    budget=ClaimBudget(1, clock=lambda: now[0]))  # a bucket of 1 job
        host.claimer.ready.extend(job(i) for i in range(5))
        host.scheduler.notified()  # the loops are not running: the steps are taken here
        assert await host.scheduler.claim_step() is Step.AGAIN  # one job of one: full
        assert settler.called_all == 0  # maybe a lone job
        assert await host.scheduler.claim_step() is Step.THROTTLED
        assert settler.called_all == 1  # this host takes no more now: the group does

    run(test)


@pytest.mark.usefixtures("standing_by_for_good")
def test_a_standby_claims_at_once_when_its_group_is_wanted() -> None:
    async def test() -> None:
        host = await notified(FakeSettler(tier=4), ready=5)
        assert host.claimer.limits == []
        host.scheduler.wanted("theirs")
        await host.settle()
        assert host.claimer.limits == []
        host.scheduler.wanted("ours")
        await host.settle()
        assert host.workers.held == 5
        await host.stop()

    run(test)


@pytest.mark.usefixtures("standing_by_for_good")
def test_an_idle_host_past_the_first_tier_stands_by_and_an_announcement_settles_it() -> None:
    async def test() -> None:
        host = await notified(FakeSettler(tier=1))
        host.scheduler.notified()  # one standby for both
        await host.settle()
        assert host.claimer.limits == []  # standing by
        host.scheduler.settled("theirs")  # another group's: not this one's business
        assert host.scheduler.settled_by_others == 0
        host.scheduler.settled("ours")
        await host.settle()
        assert host.claimer.limits == [] and host.scheduler.settled_by_others == 1
        host.scheduler.settled("ours")  # nothing to settle any more
        assert host.scheduler.settled_by_others == 1
        await host.stop()

    run(test)


def test_a_standby_that_no_announcement_settles_claims_at_its_turn_and_announces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first tier died or froze: the next one answers, and settles the rest."""
    async def test() -> None:
        waits: list[float] = []

        def wait(rtt: float) -> float:
            waits.append(rtt)
            return 0.0

        monkeypatch.setattr(scheduler_module, "settle_wait", wait)
        settler = FakeSettler(tier=3)
        host = await notified(settler)
        await host.settle(lambda: host.workers.held == 1)
        await host.settle()
        assert waits == [host.claimer.rtt]  # stood by for its tier's wait first
        assert (settler.announced, host.claimer.sweeps) == (1, 1)
        await host.stop()

    run(test)


@pytest.mark.usefixtures("standing_by_for_good")
def test_a_host_holding_jobs_answers_at_once_and_announces_nothing() -> None:
    async def test() -> None:
        settler = FakeSettler(tier=5)
        host = await idle_host(settler)
        host.workers.jobs.append(job(99))  # running a job: not idle
        host.claimer.ready.append(job(1))
        host.scheduler.notified()
        await host.settle()
        assert host.claimer.limits == [10] and host.workers.held == 2
        assert settler.announced == 0
        await host.stop()

    run(test)


@pytest.mark.usefixtures("standing_by_for_good")
@pytest.mark.parametrize(("job_seconds", "standbys", "stands_by"), [
    (2 * HOUR, True, True),  # longer than a tier's wait: a host with a free worker
    (0.0, True, True),  # none finished yet: maybe long
    (0.001, True, False),  # a worker frees long before a tier's wait: take it now
    (2 * HOUR, False, False),  # no idle host in the group to leave it to
])
def test_a_host_whose_workers_are_all_taken_stands_by_unless_its_jobs_are_short(
        job_seconds: float, standbys: bool, stands_by: bool) -> None:
    async def test() -> None:
        settler = FakeSettler(tier=0, standbys=standbys)
        host = await idle_host(settler)
        host.workers.jobs.extend([job(98), job(99)])  # both workers running
        host.workers.job_seconds = job_seconds
        host.claimer.ready.append(job(1))
        host.scheduler.notified()
        await host.settle()
        assert host.claimer.limits == ([] if stands_by else [10])
        host.scheduler.settled("ours")
        assert host.scheduler.settled_by_others == int(stands_by)
        await host.stop()

    run(test)


def test_a_claim_that_answers_no_notification_announces_nothing() -> None:
    """A poll, or the listener's wake-up after a reconnect: only a notification's first
    claim speaks for the group, so an idle fleet's polls cost what they did."""
    async def test() -> None:
        settler = FakeSettler(tier=0)
        host = await idle_host(settler)
        host.claimer.ready.append(job(1))
        host.scheduler.work_ready()
        await host.settle()
        assert host.workers.held == 1 and settler.announced == 0
        await host.stop()

    run(test)


def test_a_burst_host_answers_every_notification_at_once() -> None:
    async def test() -> None:
        settler = FakeSettler(tier=7)
        host = Host(procs=2, batch=10, ready=1, burst=True, settler=settler)
        host.claimer.elsewhere = 1  # not drained: it waits for work
        host.start()
        await host.settle(lambda: host.workers.held == 1)
        host.claimer.ready.append(job(2))
        host.scheduler.notified()
        await host.settle(lambda: host.workers.held == 2)
        assert settler.announced == 0
        await host.stop()

    run(test)


@pytest.mark.parametrize("listening", [True, False])
def test_an_idle_host_polls_at_the_idle_interval_only_while_its_listener_is_up(
        listening: bool) -> None:
    """Nothing ready and the listener connected: notifications cover every new job, so the
    loops wait for one (the idle poll is an hour here) instead of polling every 10 ms."""
    async def test() -> None:
        host = Host(poll=0.01, idle_poll=HOUR, listening=listening)
        host.start()
        if listening:
            await host.settle()
            await asyncio.sleep(0.3)  # thirty poll intervals
            assert len(host.claimer.limits) == CLAIM_LOOPS  # one claim each, then waiting
            host.claimer.ready = [job(1)]
            host.scheduler.work_ready()  # a notification still wakes a loop at once
            await host.settle(lambda: host.workers.jobs != [])
        else:
            while len(host.claimer.limits) < 10 * CLAIM_LOOPS:  # polling: run's bound ends it
                await asyncio.sleep(0.01)
        await host.stop()

    run(test)


def test_acks_at_high_water_stop_claiming_until_a_flush() -> None:
    async def test() -> None:
        host = Host(procs=2, batch=10, ready=100)
        host.acks.room = False
        host.start()
        await host.settle()
        assert host.claimer.limits == []
        assert host.scheduler.waiting == [Wait.ACKS, Wait.ACKS]
        host.acks.room = True
        host.scheduler.acks_flushed()
        await host.settle()
        assert host.workers.held > 0
        await host.stop()

    run(test)


def test_no_claim_while_heartbeats_are_failing() -> None:
    async def test() -> None:
        host = Host(ready=100)
        host.lease.at_risk = True
        assert await host.scheduler.claim_step() is Wait.WORK
        assert host.claimer.limits == []

    run(test)


def test_over_budget_a_loop_is_throttled_without_claiming() -> None:
    async def test() -> None:
        now = [0.0]
        budget = ClaimBudget(20, clock=lambda: now[0])  # a bucket of 20 jobs
        host = Host(procs=2, batch=10, ready=100, budget=budget)
        assert await host.scheduler.claim_step() is Step.AGAIN
        assert await host.scheduler.claim_step() is Step.AGAIN
        assert await host.scheduler.claim_step() is Step.THROTTLED  # 20 jobs spent
        assert host.claimer.limits == [10, 10]
        # The registry's next beat asks for more: a claim was refused, and the loop waits.
        assert (budget.throttles, budget.held_back) == (1, True)
        now[0] += 0.5  # half a second later: 10 more jobs' worth, a batch
        assert await host.scheduler.claim_step() is Step.AGAIN
        assert host.claimer.limits == [10, 10, 10]
        assert (budget.throttles, budget.held_back) == (1, False)

    run(test)


async def held_back_by_the_budget() -> tuple[Host, ClaimBudget]:
    """A host that made two full claims of 10 and whose budget, a bucket of 20 jobs never
    refilled, holds both its loops back."""
    budget = ClaimBudget(20, clock=lambda: 0.0)
    host = Host(procs=2, batch=10, ready=100, budget=budget, poll=HOUR)
    host.start()
    await host.settle(lambda: len(host.claimer.limits) == 2 and host.claimer.in_flight == 0)
    await host.settle(lambda: budget.throttles >= 2)
    return host, budget


def test_no_prompt_claim_of_a_kind_the_last_full_claim_took_a_backlog_of(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "PROMPT_EVERY", 0.0)

    async def test() -> None:
        host, _ = await held_back_by_the_budget()
        for _ in range(3):
            host.finish(host.workers.held)  # it holds nothing: the budget holds it back
            host.scheduler.notified()
            await host.settle(lambda: host.claimer.in_flight == 0)
            for _ in range(20):
                await asyncio.sleep(0)
        # Never "k": the full claims bring it ten at a time. "u" once: it had nothing ready,
        # and is quiet until the next full claim.
        assert host.claimer.prompts == [(frozenset({"u"}), 2)]
        assert host.claimer.limits == [10, 10]
        await host.stop()

    run(test)


def test_a_notification_while_the_budget_holds_the_host_back_makes_a_prompt_claim(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "PROMPT_EVERY", 0.0)

    async def test() -> None:
        host, budget = await held_back_by_the_budget()
        host.claimer.urgent = [job(5000, "u"), job(5001, "u")]
        host.scheduler.notified()
        await host.settle(lambda: len(host.claimer.prompts) == 1)
        await host.settle(lambda: host.workers.held == 21)
        host.finish(1)  # that job of "u" done: "u" is idle again
        host.scheduler.notified()
        await host.settle(lambda: len(host.claimer.prompts) == 2)
        await host.settle(lambda: host.workers.held == 21)
        # A job of "u" each (the host holds jobs of "k"), past the budget: its tokens are
        # owed by the next claims.
        assert host.claimer.limits == [10, 10]
        assert host.claimer.prompts == [(frozenset({"u"}), 2)] * 2
        assert budget.available() < 0
        await host.stop()

    run(test)


def test_a_loop_polling_an_empty_queue_is_not_held_back_by_the_budget() -> None:
    async def test() -> None:
        budget = ClaimBudget(20, clock=lambda: 0.0)
        host = Host(procs=2, batch=10, ready=0, budget=budget)
        assert await host.scheduler.claim_step() is Wait.WORK  # came back empty
        budget.spend(20)  # the other loop's claim in flight
        assert await host.scheduler.claim_step() is Step.THROTTLED
        # Refused, but nothing is known to wait: this host asks for no more budget.
        assert (budget.throttles, budget.held_back) == (0, False)

    run(test)


# --- stopping and draining ----------------------------------------------------------------

def test_stop_ends_the_loops() -> None:
    async def test() -> None:
        host = Host()
        host.start()
        await host.settle()
        await host.stop()
        assert host.task is not None and host.task.done()

    run(test)


def test_a_hard_stop_cancels_loops_that_were_just_woken() -> None:
    async def test() -> None:
        # Outcomes wake both loops, and the cancel (a second signal) comes before they run.
        # asyncio.wait_for on 3.11 would swallow it and claim on, and that claim would hang.
        host = Host(procs=2, batch=10, ready=1000)
        host.start()
        await host.settle()
        claims = len(host.claimer.limits)
        host.claimer.gate = asyncio.Event()  # never opened
        host.finish(30)
        assert host.scheduler.waiting == []  # both woken, neither has run yet
        assert host.task is not None
        host.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await host.task
        assert len(host.claimer.limits) == claims

    run(test)


def test_a_burst_host_runs_the_reaper_before_it_calls_the_queue_drained() -> None:
    async def test() -> None:
        # Nothing ready, but the reaper brings back 3 jobs a dead host left: they run first.
        host = Host(burst=True, revive=3)
        host.start()
        await host.settle(lambda: host.workers.held == 3)
        assert not host.scheduler.drained
        host.finish(3)
        host.scheduler.acks_flushed()  # the last acks are written: the loops check again
        await host.settle(lambda: host.scheduler.drained)
        await host.task
        assert host.reaper.passes == 2  # a pass found the 3 jobs, a second found none

    run(test)


def test_a_burst_host_looks_behind_its_cursors_before_it_calls_the_queue_drained() -> None:
    async def test() -> None:
        # A job this host handed back unstarted is ready again behind the claim's cursor,
        # where only a sweep finds it; sweeps cost too much to run after every empty claim.
        host = Host(burst=True)
        host.claimer.behind = [job(5)]
        host.start()
        await host.settle(lambda: host.workers.held == 1)
        assert not host.scheduler.drained
        host.finish(1)
        host.scheduler.acks_flushed()
        await host.settle(lambda: host.scheduler.drained)
        await host.task
        assert host.claimer.behind == []

    run(test)


def test_auto_batch_grows_and_the_ack_batch_follows() -> None:
    async def test() -> None:
        host = Host(procs=2, batch="auto", ready=10_000)
        host.claimer.prompt_kinds = ["k"]  # one kind: no prompt claim to keep short
        host.workers.job_seconds = 0.0001  # 0.1 ms jobs, 2 ms claims: big batches
        assert host.acks.max_batch == host.scheduler.batch == 2
        for _ in range(8):
            host.workers.jobs.clear()
            await host.scheduler.claim_step()
        assert host.scheduler.batch > SHARED_MAX_BATCH
        assert host.acks.max_batch == host.scheduler.batch

    run(test)


def test_a_host_of_several_kinds_keeps_its_auto_batch_and_acks_short() -> None:
    # A kind it holds no job of would get a prompt claim, which commits behind this host's
    # own claims and acks: those stay small, whatever the formula asks for, and shrink at
    # once when that becomes so. While it holds jobs of every kind, no claim is prompt.
    async def test() -> None:
        host = Host(procs=2, batch="auto", ready=10_000)
        host.workers.job_seconds = 0.0001
        host.workers.busy = {"u"}  # it holds jobs of both kinds
        for _ in range(8):
            host.workers.jobs.clear()
            await host.scheduler.claim_step()
        assert host.scheduler.batch > SHARED_MAX_BATCH
        host.workers.busy = set()  # none of "u" any more
        seen = []
        for _ in range(8):
            host.workers.jobs.clear()
            await host.scheduler.claim_step()
            seen.append(host.scheduler.batch)
        assert seen == [SHARED_MAX_BATCH] * 8
        assert host.acks.max_batch == SHARED_MAX_BATCH

    run(test)


def test_a_burst_host_is_not_drained_while_other_hosts_run_its_kind_of_jobs() -> None:
    async def test() -> None:
        # A host that was SIGKILLed holds 2 jobs under live leases: they are not done, and
        # will come back to the queue once the reaper finds their leases expired.
        host = Host(burst=True)
        host.claimer.elsewhere = 2
        host.start()
        await host.settle()
        assert not host.scheduler.drained
        assert host.scheduler.waiting == [Wait.WORK, Wait.WORK]
        host.claimer.elsewhere = 0  # their leases expired, the reaper returned them
        host.claimer.ready = [job(7), job(8)]
        host.scheduler.work_ready()  # (the poll, in a real host)
        await host.settle(lambda: host.workers.held == 2)
        host.finish(2)
        host.scheduler.acks_flushed()
        await host.settle(lambda: host.scheduler.drained)
        await host.task

    run(test)


@pytest.mark.parametrize("batch", [1, 7, 50])
def test_held_and_claiming_jobs_never_exceed_capacity(batch: int) -> None:
    async def test() -> None:
        host = Host(procs=3, batch=batch, ready=5000)
        host.claimer.gate = asyncio.Event()
        host.start()
        limit = capacity(3, batch)
        for _ in range(100):  # claims return and outcomes arrive, in turns
            host.claimer.gate.set()
            await asyncio.sleep(0)
            host.claimer.gate.clear()
            assert host.workers.held + host.scheduler.claiming <= limit
            host.finish(min(host.workers.held, 10))
            await asyncio.sleep(0)
            assert host.workers.held + host.scheduler.claiming <= limit
        assert len(host.claimer.limits) > 10  # it did claim, again and again
        host.claimer.gate.set()
        await host.stop()

    run(test)
