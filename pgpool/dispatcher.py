"""The dispatcher: one process per host that keeps that host's workers fed.

It is an asyncio program (on uvloop) made of small parts, each in its own module:

- `Claimer`: claims batches of ready jobs (one statement each) when there is room;
- `WorkerPool`: hands them to worker processes and reports each outcome;
- `Completer`: writes outcomes back as grouped acks, with backpressure on claiming;
- `Heartbeat`: extends every held lease in one statement, every lease/3;
- `Reaper`: returns jobs whose lease expired (their host died);
- `Listener`: LISTEN/NOTIFY wake-ups; the claim loop also polls as a backstop;
- `HostRegistry`: this host's row in ``pgpool_hosts``, for ``pgpool status``;
- `ClaimBudget`: this host's share of the fleet's claims per second (a token bucket).

Room: the dispatcher holds at most ``procs + 3 * batch`` jobs (running, sent to a worker,
waiting in the backlog, or being claimed). Two claim loops each claim when a whole batch
fits, so while the workers go through one batch the next two are on their way; after a
full batch a loop claims again at once and wakes the other. A claim that comes back short
means the queue is empty: that loop then sleeps until a notification (which wakes one
loop: it is usually one job) or the poll, not until the next outcome. With ``--batch
auto`` the batch is re-derived after every claim from the measured claim round trip and
job time (`pgpool.sizing`). Outcomes are acked every 50 ms or every batch, whichever comes
first. With short jobs that makes about two transactions per batch of jobs: one claim and
one ack.

Signals are handled through asyncio's self-pipe (``loop.add_signal_handler``): the handler
only sets flags, and the work happens on the loop. The first SIGTERM/SIGINT stops claiming,
hands unstarted jobs back, lets running jobs finish within ``grace`` and acks them, then
exits 0. A second one kills the workers and exits at once; leases make that safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import psycopg
from psycopg_pool import AsyncConnectionPool
from setproctitle import setproctitle

from . import dsn as dsnlib
from . import schema
from .budget import ClaimBudget
from .claimer import Claimer, RawJsonLoader
from .completer import Ack, Completer, FlushResult
from .config import RunConfig
from .heartbeat import Heartbeat
from .hosts import HostRegistry
from .job import Job, Outcome
from .listener import Listener
from .pool import WorkerPool
from .reaper import Reaper
from .registry import Handler
from .retry import backoff
from .sizing import BatchSizer

log = logging.getLogger("pgpool.dispatcher")

#: Claim loops, each with at most one claim in flight: one's round trip hides behind the
#: other's, which doubles what a fixed batch can claim per second.
CLAIM_LOOPS = 2
#: How long a graceful stop waits for its last acks before giving up on the database.
FINAL_ACK_TIMEOUT = 15.0


def make_owner() -> str:
    """A dispatcher id, unique per run: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Dispatcher:
    """One host's dispatcher: `run` it on an event loop; it owns its worker processes and
    database connections for the duration of the call."""

    #: The class of the pooled connections (`pgpool bench` substitutes one that counts
    #: statements).
    connection_class: type[psycopg.AsyncConnection] = psycopg.AsyncConnection

    def __init__(self, config: RunConfig, handlers: dict[str, Handler], *,
                 early_signals: list[int] | None = None) -> None:
        """``early_signals``: signals received before `run` could install its handlers
        (the CLI records them); any there, or arriving later, stop the run gracefully."""
        self.config = config
        self._early_signals = early_signals if early_signals is not None else []
        self.handlers = handlers
        self.owner = make_owner()
        self.sizer = BatchSizer(config.procs) if config.batch == "auto" else None
        self._fixed_batch = 0 if config.batch == "auto" else config.batch
        self.counts: Counter[str] = Counter()
        self.fatal: str | None = None
        self._stopping = False
        self._signal: int | None = None
        self._started = 0.0
        self._reaped_for_burst = False
        self._drained = False
        #: Jobs asked for by claims in flight: room the pool will need when they return.
        self._claiming = 0

    async def run(self) -> int:
        """Run until stopped (or, with ``burst``, until drained); return the exit status.

        Raises `ConnectError`, `SchemaError` or `HandlerError` before starting anything
        if the database or the handler modules are not usable.
        """
        loop = asyncio.get_running_loop()
        self._wakes = [asyncio.Event() for _ in range(CLAIM_LOOPS)]
        #: What each idle claim loop waits for, by its event: "room" (outcomes wake it),
        #: "acks" (flushes do), or "work" (a notification or the poll; outcomes must not
        #: wake it, or every finished job would cost an empty claim).
        self._waiting: dict[asyncio.Event, str] = {}
        self._hard_stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        for sig in self._early_signals:
            self._on_signal(sig)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        cfg = self.config
        setproctitle(f"pgpool dispatcher: starting {cfg.procs} workers")
        await self._check_database()

        self.pool = WorkerPool(
            procs=cfg.procs,
            modules=list(cfg.modules),
            on_outcome=self._on_outcome,
            on_returned=self._on_returned,
            on_fatal=self._on_fatal,
            max_tasks=cfg.max_tasks_per_child,
            max_memory=cfg.max_memory,
        )
        await self.pool.start()
        db = AsyncConnectionPool(
            cfg.dsn, min_size=5, max_size=5, open=False, name="pgpool",
            connection_class=self.connection_class, kwargs={"autocommit": True},
            configure=_configure,
        )
        tasks: list[asyncio.Task[None]] = []
        try:
            await db.open(wait=True, timeout=30)
            self.claimer = Claimer(
                db, self.owner, queues=cfg.queues, handlers=self.handlers,
                lease=cfg.lease, max_attempts=cfg.max_attempts, timeout=cfg.timeout,
            )
            self.hosts = HostRegistry(
                db, self.owner, procs=cfg.procs, queues=cfg.queues, kinds=list(self.handlers),
                lease=cfg.lease, max_claims_per_sec=cfg.max_claims_per_sec,
                counters=self._host_counters,
            )
            await self._register()
            self.budget = ClaimBudget(cfg.max_claims_per_sec, lambda: self.hosts.live_hosts)
            self.completer = Completer(
                db, self.owner, max_batch=self.batch, interval=0.05,
                # Four times the most this host can hold, at the largest batch it may use.
                high_water=max(1000, 4 * self._capacity(
                    self.sizer.maximum if self.sizer else self.batch)),
                on_flushed=self._on_flushed,
            )
            self.heartbeat = Heartbeat(db, self.owner, cfg.lease, self._held, self._on_lost)
            self.reaper = Reaper(db, interval=max(1.0, cfg.lease / 3))
            self.listener = Listener(cfg.dsn, cfg.queues, self._wake_one)
            for part in (self.completer, self.heartbeat, self.reaper, self.listener,
                         self.hosts):
                tasks.append(asyncio.create_task(part.run()))
            tasks.append(asyncio.create_task(self._watch()))
            log.info(
                "dispatcher %s: %d workers, batch %s, queues %s, kinds %s",
                self.owner, cfg.procs, cfg.batch, ",".join(cfg.queues),
                ",".join(sorted(self.handlers)),
            )
            self._started = time.monotonic()
            if not await self._until_hard_stop(self._claim_loops()):
                return await self._die()
            if not await self._until_hard_stop(self._drain()):
                return await self._die()
            self._summary()
            await self.hosts.deregister()  # not after a hard stop: that row goes stale
            return 1 if self.fatal else 0
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if not self.pool.closing:
                await self.pool.kill_all()
            await db.close()

    # --- the claim loop ---------------------------------------------------------------------

    async def _claim_loops(self) -> None:
        await asyncio.gather(*(self._claim_loop(wake) for wake in self._wakes))

    async def _claim_loop(self, wake: asyncio.Event) -> None:
        failures = 0
        while not (self._stopping or self._drained):
            wake.clear()
            try:
                step = await self._claim_step()
            except (psycopg.Error, OSError) as exc:
                failures += 1
                log.warning("claim failed (%s); retrying", type(exc).__name__)
                await self._wait(wake, "work", backoff(failures, 0.1, 5.0))
                continue
            failures = 0
            if step == "again":
                self._wake_one()  # a full batch: the other loop may claim the next one
            elif step == "drained":
                log.info("burst: no runnable job is ready and nothing is in flight")
                self._drained = True
                self._wake()  # the other claim loop
                return
            elif step in ("room", "acks", "work"):
                await self._wait(wake, step, self.config.poll)
            elif step == "throttled":  # over this host's share of the fleet's claims/s
                await asyncio.sleep(min(self.config.poll, self.budget.wait_for(self._want())))

    async def _claim_step(self) -> str:
        """Claim if there is room: "again" after a full batch; "recheck" (claim once more,
        alone: a burst host may be drained); "drained"; "throttled" (the claim budget is
        spent for now); or what to wait for: "room", "acks" or "work"."""
        if not self._room():
            return "room"
        if not self.completer.has_room():
            return "acks"
        if self.heartbeat.at_risk:  # the database is not answering: poll until it does
            return "work"
        # Under the claim budget, wait for a whole batch (or a bucketful) rather than
        # claiming whatever trickled in: many small claims cost more than a few full ones.
        want = min(self._want(), int(self.budget.burst))
        if self.budget.available() < want:
            return "throttled"
        # Reserve room and budget before the round trip: the other loop claims meanwhile.
        self.budget.spend(want)
        self._claiming += want
        try:
            jobs = await self.claimer.claim(want)
        finally:
            self._claiming -= want
        self.budget.spend(len(jobs) - want)  # give back what the claim did not take
        if self.sizer is not None:
            self.completer.max_batch = self.sizer.update(self.claimer.rtt,
                                                         self.pool.job_seconds)
        if jobs:
            self.pool.submit(jobs)
            self._reaped_for_burst = False
        if len(jobs) == want:
            return "again"  # a full batch: more may be ready right now
        if self.config.burst and not jobs and self.pool.held == 0 \
                and self._claiming == 0 and self.completer.backlog == 0:
            # Drained only if a claim still finds nothing after a reaper pass: jobs
            # stranded by a dead host count as work for a batch host too.
            if self._reaped_for_burst:
                return "drained"
            await self.reaper.reap()
            self._reaped_for_burst = True
            return "recheck"
        self._reaped_for_burst = False
        return "work"

    @property
    def batch(self) -> int:
        """Jobs per claim: fixed, or re-derived by the sizer after every claim."""
        return self.sizer.batch if self.sizer else self._fixed_batch

    @property
    def capacity(self) -> int:
        return self._capacity(self.batch)

    def _capacity(self, batch: int) -> int:
        """The most jobs this host holds or is claiming: one running per worker, a batch
        for the workers to go through, and a batch on its way for each claim loop."""
        return self.config.procs + (1 + CLAIM_LOOPS) * batch

    def _room(self) -> bool:
        return self.capacity - self.pool.held - self._claiming >= self.batch

    def _want(self) -> int:
        """A batch, or more when workers are idle (so a small batch still fills them)."""
        held = self.pool.held + self._claiming
        return min(self.capacity - held, max(self.batch, self.config.procs - held))

    def _wake(self) -> None:
        for wake in self._wakes:
            wake.set()

    def _wake_waiting(self, reason: str) -> None:
        for wake, waits_for in self._waiting.items():
            if waits_for == reason:
                wake.set()

    def _wake_one(self) -> None:
        """There may be work: wake one loop waiting for it (a notification is usually one
        job: one claim takes it, and a second would come back empty). With none waiting
        for work, the loops still claiming claim again when done."""
        idle = [wake for wake, reason in self._waiting.items() if reason == "work"]
        if idle:
            idle[0].set()
        else:
            for wake in self._wakes:
                if wake not in self._waiting:
                    wake.set()

    async def _wait(self, wake: asyncio.Event, reason: str, timeout: float) -> None:
        self._waiting[wake] = reason
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)
        finally:
            del self._waiting[wake]

    async def _drain(self) -> None:
        await self.pool.stop(self.config.grace)
        try:
            await asyncio.wait_for(self.completer.wait_idle(), FINAL_ACK_TIMEOUT)
        except TimeoutError:
            log.error(
                "could not write the last %d acks within %gs; those jobs will run again "
                "once their leases expire", self.completer.backlog, FINAL_ACK_TIMEOUT,
            )
            self.fatal = self.fatal or "final acks not written"

    async def _until_hard_stop(self, work: object) -> bool:
        """Run ``work``; False if a second signal interrupted it."""
        task = asyncio.ensure_future(work)  # type: ignore[arg-type]
        hard = asyncio.create_task(self._hard_stop.wait())
        await asyncio.wait({task, hard}, return_when=asyncio.FIRST_COMPLETED)
        hard.cancel()
        if task.done():
            task.result()
            return True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False

    async def _die(self) -> int:
        log.warning("second signal: stopping now; unfinished jobs return when their "
                    "leases expire")
        await self.pool.kill_all()
        return 128 + (self._signal or signal.SIGTERM)

    async def _register(self) -> None:
        """Register in pgpool_hosts, riding out a database restart during start-up.

        If it keeps failing (the server restarting, connections being killed), start
        anyway: the row is for `pgpool status` and the budget's host count, no job depends
        on it, and the registry's next beat inserts it.
        """
        try:
            await _retrying("registering this host", self.hosts.register)
        except (psycopg.OperationalError, OSError) as exc:
            log.warning("registering this host failed (%s); starting anyway, the next "
                        "registry beat will register it", type(exc).__name__)

    async def _check_database(self) -> None:
        """Refuse a missing, older or newer schema. A server that cannot be reached fails at
        once (`ConnectError`); a connection lost during the check is retried."""
        async def check() -> None:
            conn = await dsnlib.connect_async(self.config.dsn, autocommit=True)
            async with conn:
                schema.check_version(await schema.schema_version_async(conn))

        await _retrying("checking the schema", check)

    async def _watch(self) -> None:
        """Hard timeouts, and the process title, a few times a second."""
        ticks = 0
        while True:
            await asyncio.sleep(0.1)
            self.heartbeat.check_expiry()
            self.pool.check_deadlines()
            ticks += 1
            if ticks % 10 == 0:
                setproctitle(
                    f"pgpool dispatcher: {self.config.procs} workers, batch {self.batch}, "
                    f"{self.pool.held} held, {self.counts['ok']} done"
                )

    # --- callbacks (all on the event loop) --------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        if self._stopping:
            self._signal = sig
            self._hard_stop.set()
            return
        log.info("%s: stopping; running jobs may finish within %gs (signal again to stop "
                 "now)", signal.Signals(sig).name, self.config.grace)
        self._stopping = True
        self._wake()

    def _on_outcome(self, out: Outcome) -> None:
        job = out.job
        if "room" in self._waiting.values() and self._room():  # cheap test first: per job
            self._wake_waiting("room")
        if job.lost:
            self.counts["lost"] += 1
            log.warning("%s ended after its lease was lost; result dropped", job)
            return
        if out.error is None:
            self.counts["ok"] += 1
            self.completer.add(Ack("done", job))
        elif job.attempt >= job.max_attempts:
            self.counts["dead"] += 1
            log.error("%s failed (%s), no attempts left: moved to pgpool_dead", job, out.cause)
            self.completer.add(Ack("dead", job, error=out.error))
        else:
            delay = self.config.retry.delay(job.attempt)
            self.counts["retried"] += 1
            log.warning("%s failed (%s); retry in %.1fs", job, out.cause, delay)
            self.completer.add(Ack("retry", job, delay=delay, error=out.error))

    def _on_returned(self, jobs: list[Job]) -> None:
        for job in jobs:
            if not job.lost:
                self.counts["returned"] += 1
                self.completer.add(Ack("release", job))

    def _on_lost(self, ids: set[int]) -> None:
        self.pool.drop_lost(ids)

    def _on_fatal(self, reason: str) -> None:
        log.error("%s", reason)
        self.fatal = reason
        self._stopping = True
        self._wake()

    def _on_flushed(self, result: FlushResult) -> None:
        if self.completer.has_room():
            self._wake_waiting("acks")
        if self.config.burst and self.pool.held == 0 and self.completer.backlog == 0:
            self._wake()  # a batch host may be done: the claim loop checks

    def _host_counters(self) -> tuple[int, int, int]:
        """(jobs done, attempts failed, jobs claimed) for the host registry."""
        return (self.counts["ok"], self.counts["retried"] + self.counts["dead"],
                self.claimer.claimed)

    def _held(self) -> list[Job]:
        return [*self.pool.held_jobs(), *self.completer.pending_jobs()]

    def _summary(self) -> None:
        elapsed = max(1e-9, time.monotonic() - self._started)
        c = self.counts
        finished = c["ok"] + c["dead"]
        log.info(
            "finished: %d succeeded, %d failed and retried later, %d dead-lettered, "
            "%d handed back, in %.2fs (%.0f jobs/s); %d claims, %d ack flushes; batch %d%s",
            c["ok"], c["retried"], c["dead"], c["returned"], elapsed, finished / elapsed,
            self.claimer.claims, self.completer.stats.flushes, self.batch,
            " (auto)" if self.sizer else "",
        )


async def _retrying(what: str, step: Callable[[], Awaitable[None]]) -> None:
    """Run ``step``, retrying it after a lost connection or a restarting server for about
    6 s; the last failure propagates."""
    for failures in range(5):
        try:
            await step()
            return
        except (psycopg.OperationalError, OSError) as exc:
            delay = backoff(failures, 0.2, 4.0)
            log.warning("%s failed (%s); retrying in %gs", what, type(exc).__name__, delay)
            await asyncio.sleep(delay)
    await step()


async def _configure(conn: psycopg.AsyncConnection) -> None:
    conn.adapters.register_loader("jsonb", RawJsonLoader)
