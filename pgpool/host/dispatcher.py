"""The dispatcher: one process per host that keeps that host's workers fed.

How one job travels through a host, by the attributes of a running `Dispatcher` (the data
path's modules sit in ``pgpool``, the side parts in ``pgpool.host.parts``)::

  enqueue(): INSERT + pg_notify ──▶ pgpool_jobs ◀── reaper.run(): expired leases to ready
                                        │    ▲
  listener.run() ◀──── NOTIFY ──────────┘    ├── heartbeat.run(): HEARTBEAT of _held() =
     │ scheduler.notified(), .settled() ...  │     pool.held_jobs() + completer.pending_jobs()
     ▼ (idle: by tier, pgpool.host.settle)   │     every lease.beat_interval; attempts not kept:
  scheduler.run(): CLAIM_LOOPS claim loops   │     job.lost = True, then pool.drop_lost();
     │                                       │     kept: job.deadline moved on, then
     │                                       │     pool.extend(): one ipc.Extend a worker
     │ has_room()? acks.has_room()? budget?  │
     ├── claimer.claim(want()) ──── CLAIM ───┤  (FOR NO KEY UPDATE SKIP LOCKED)
     ▼ jobs                                  │
  pool.submit(jobs) ─▶ task pipes ─▶ workers │  (pgpool.host.pool, pgpool.worker)
     │ one AttemptEnd per attempt               │
     ▼                                       │
  _job_finished(outcome):                    │
     scheduler.job_finished()  (room)        │
     completer.complete(outcome): decide() ─▶ Ack.done / Ack.retry / Ack.dead / Ack.snooze
     summary.runs.add()  (its run time)      │
  unstarted jobs handed back: completer.release(jobs) ─▶ Ack.release
  a handler's checkpoint or progress: long.received() (pgpool.host.long): a checkpoint
     stored at once, guarded like an ack; progress written after each heartbeat
     │                                       │
  completer.run(): a batch or 50 ms ─ ACK ───┘  (one statement per flush; --fair-by cpu:
     │  RECORD_CPU first, the CPU of its attempts per tenant, from ipc.Used: _cpu_used)
     └─▶ _acks_flushed(): scheduler.acks_flushed()  (backpressure: Wait.ACKS); jobs of
         limited kinds ended while their claims came back short: NOTIFY_FREED, their
         queues' hosts claim the free slots

`stager` makes scheduled jobs (delayed, or waiting out a retry backoff) ready when they fall
due and notifies their queues: the listener wakes it on `sql.common.STAGE`, `_acks_flushed` after
this host's own retries. `hosts` (the ``pgpool_hosts`` row, and this host's share of the
fleet's claims per second, `hosts.budget`, which the scheduler spends) sits beside that
path, as do `control` (an operator's paused queues, taken out of the claimer's queues, and
cancellations, which make the heartbeat beat at once: ``pgpool.host.parts.control``), `retention`
(pruning dead letters, kept outcomes and finished groups), `vacuum` (the keeper that
vacuums pgpool_jobs before its dead rows slow claims) and, when the handler modules
declare schedules, `periodic` (their ticks: ``pgpool.host.parts.periodic``). `summary`
logs what the jobs that ended did, at most once a minute, unless ``--log-summary`` is off
(`pgpool.host.summary`). The scheduler owns the room formulas and the two claim loops; the
completer owns what an outcome becomes.

This module is supervision, in a few verbs: `run` checks the database, starts the workers,
opens the connections and starts the parts (the completer, the watchdog, and the side
parts: `side`, each a `pgpool.host.parts.loop.Part`), serves (the claim loops) until stopped or
drained, drains (workers finish or hand back their jobs, the last acks are written), and
shuts down. It watches every part it started: one that dies on an exception it does not
expect stops the host (`_part_failed`: logged, drained, exit 1), never leaving it up and
idle. Signals are handled through asyncio's self-pipe (``loop.add_signal_handler``):
the handler only sets flags, and the work happens on the loop. The first SIGTERM/SIGINT
stops claiming, hands unstarted jobs back, lets running jobs finish within ``grace`` and
acks them, then exits 0. A second one kills the workers and exits at once; leases make
that safe.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import signal
import socket
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg_pool import AsyncConnectionPool
from setproctitle import setproctitle

from ..db import dsn as dsnlib
from ..db import schema
from ..db.outage import backoff
from ..limits import Override
from ..logs import event
from ..registry import Handler
from ..schedules import Schedule
from ..sql import jobs as sql_jobs
from ..sql.common import STAGE
from ..sql.fleet import STALE_AFTER_LEASES
from ..worker import ipc
from .attempt import AttemptEnd, Job
from .claimer import Claimer, configure_connection
from .completer import Completer, FlushResult
from .config import RunConfig
from .lease import Lease
from .long import Answer, LongJobs
from .parts import vacuum
from .parts.control import Control
from .parts.heartbeat import Heartbeat
from .parts.hosts import HostRegistry, Pruner
from .parts.leader import Fenced, Leadership, elect
from .parts.listener import Listener
from .parts.loop import Part
from .parts.periodic import Periodic
from .parts.reaper import Reaper
from .parts.retention import Retention
from .parts.stager import Stager
from .pool import Launched, WorkerPool
from .scheduler import CLAIM_LOOPS, ClaimScheduler, ack_high_water, largest_batch
from .settle import Settler
from .summary import RunTimes, Summary
from .tasks import stop_tasks

if TYPE_CHECKING:
    # Imported where a host serves /metrics (`_bind_metrics`): prometheus_client is a
    # tenth of a dispatcher's imports, and most hosts never load it.
    from .metrics import DispatcherMetrics, HostState, MetricsServer

log = logging.getLogger("pgpool.dispatcher")

#: How long a graceful stop waits for its last acks before giving up on the database.
FINAL_ACK_TIMEOUT: Final = 15.0
#: How long a stop waits for the notifications that wake the other hosts (`_notify`).
FINAL_NOTIFY_TIMEOUT: Final = 2.0
#: Pooled connections: the completer, heartbeat, reaper, stager, registry, control poll,
#: retention (of dead letters and kept outcomes) and the leader election; one more with
#: periodic schedules. The vacuum keeper's look at the statistics, and the pruning of stale
#: hosts, take one in turn with the others; each vacuum opens a connection of its own.
#: The reaper, stager, retention, vacuum keeper and pruner run only on the fleet's leader.
#: The claims have a pool of their own, one connection per claim loop, whose prepared
#: claims keep one plan (`pgpool.host.claimer.configure_connection`).
CONNECTIONS: Final = 8
#: The part that enforces lease expiry and hard timeouts (`Dispatcher._watch`).
WATCHDOG: Final = "watchdog"


def make_owner() -> str:
    """A dispatcher id, unique per run: host and pid to read, and 128 random bits to be
    unique. Containers share hostnames and all run as pid 1, so host and pid alone (or
    with a few random bits) could give two live dispatchers one id, and each could then
    ack and extend the other's jobs."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(16)}"


class DispatcherObserver:
    """Watches a dispatcher from inside its process (`pgpool bench` uses one).

    Pass one to `Dispatcher`. Every method runs on the dispatcher's event loop, must not
    block, and does nothing unless overridden.
    """

    def started(self, dispatcher: Dispatcher) -> None:
        """Every part is up; nothing is claimed yet."""

    def finished(self, outcome: AttemptEnd) -> None:
        """An attempt ended (called once per job: keep it cheap)."""

    def stopping(self, signum: int) -> None:
        """A signal asked the dispatcher to stop."""

    def drained(self) -> None:
        """The workers stopped and the last acks are written; connections are still open."""


class Dispatcher:
    """One host's dispatcher: `run` it on an event loop (or `run_sync`); it owns its worker
    processes and database connections for the duration of the call."""

    def __init__(self, config: RunConfig, handlers: dict[str, Handler], *,
                 early_signals: list[int] | None = None,
                 observer: DispatcherObserver | None = None,
                 schedules: dict[str, Schedule] | None = None,
                 workers: dict[int, Launched] | None = None) -> None:
        """``early_signals``: signals received before `run` could install its handlers
        (the CLI records them); any there, or arriving later, stop the run gracefully.
        ``schedules``: the periodic schedules this host runs (`pgpool.schedules`), those the
        handler modules declared. ``workers``: its worker processes, started already
        (`pgpool.host.pool.launch`, as `pgpool run` does), which its pool adopts, taking
        each out of the dict; the caller ends those left in it."""
        self.config = config
        self.handlers = handlers
        self.schedules = schedules or {}
        self._launched = workers
        self.owner = make_owner()
        self.lease = Lease(config.lease)
        self.observer = observer or DispatcherObserver()
        #: Whether the observer watches each attempt's end (`pgpool bench` does): the
        #: common case makes no call per job for it.
        self._observed = type(self.observer).finished is not DispatcherObserver.finished
        self.fatal: str | None = None
        self._early_signals = early_signals if early_signals is not None else []
        #: A signal or a failure asked the host to stop claiming.
        self._stopping = asyncio.Event()
        self._signal: int | None = None
        self._started = 0.0
        #: Built once the database is open; a signal may arrive before that.
        self.scheduler: ClaimScheduler | None = None
        #: The side parts (`pgpool.host.parts`), once built.
        self.side: list[Part] = []
        #: The supervised tasks, by name (`_start_parts`).
        self._parts: dict[str, asyncio.Task[None]] = {}
        self._killing: asyncio.Task[None] | None = None  # a dead watchdog's kill_all
        #: The notifications of freed slots in flight (kept: a task must be referenced).
        self._telling: set[asyncio.Task[None]] = set()
        #: With ``metrics_port``: the instruments and their HTTP server.
        self.metrics: DispatcherMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        #: With ``log_summary``: the periodic summary, and where each run time goes.
        self.summary: Summary | None = None
        self._run_times: RunTimes | None = None
        #: Long jobs' checkpoints and progress, once the database is open.
        self.long: LongJobs | None = None
        self.listener: Listener | None = None
        #: Notifications being sent (`_notify`).
        self._notices: set[asyncio.Task[None]] = set()

    def run_sync(self) -> int:
        """`run` on a fresh event loop (uvloop where it is built) and return its status."""
        return run_event_loop(self.run())

    async def run(self) -> int:
        """Run until stopped (or, with ``burst``, until drained); return the exit status.

        Raises `ConnectError`, `SchemaError` or `HandlerError` before starting anything
        if the database or the handler modules are not usable.
        """
        loop = asyncio.get_running_loop()
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
        setproctitle(f"pgpool dispatcher: starting {self.config.procs} workers")
        if self.config.metrics_port is not None:
            self._bind_metrics()  # a port in use fails before anything starts
        try:
            return await self._start_and_serve()
        finally:
            if self.metrics_server is not None:
                self.metrics_server.close()

    async def _start_and_serve(self) -> int:
        # The workers start (a fresh interpreter each, importing the handler modules) while
        # the database is checked and connected: start-up takes the longer of the two, not
        # their sum. No job is claimed before every worker is ready.
        self.pool = self._worker_pool()
        starting = asyncio.create_task(self.pool.start())
        connections = CONNECTIONS + (1 if self.schedules else 0)
        self.db = AsyncConnectionPool(
            self.config.dsn, min_size=connections, max_size=connections, open=False,
            name="pgpool", kwargs={"autocommit": True},
            configure=functools.partial(configure_connection, lease=self.lease),
        )
        self.claims_db = AsyncConnectionPool(
            self.config.dsn, min_size=CLAIM_LOOPS, max_size=CLAIM_LOOPS, open=False,
            name="pgpool-claims", kwargs={"autocommit": True},
            configure=functools.partial(configure_connection, lease=self.lease, claims=True),
        )
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._check_database()
            await self.db.open(wait=True, timeout=30)
            await self.claims_db.open(wait=True, timeout=30)
            await self._build_parts()
            await starting
            tasks = self._start_parts()
            if not await self._until_hard_stop(self._serve()):
                return await self._die()
            if not await self._until_hard_stop(self._drain()):
                return await self._die()
            # Another host takes the fleet's maintenance over now, not at the lease's end.
            await self.leadership.resign()
            self._summary()  # the host's last line
            # Not after a hard stop (that row goes stale), nor when the database did not
            # take the last acks: the stop then ends within grace + FINAL_ACK_TIMEOUT.
            if self.completer.backlog == 0:
                await self.hosts.deregister()
            return 1 if self.fatal else 0
        finally:
            await stop_tasks(*tasks, starting)
            if self._killing is not None:
                await self._killing
            if not self.pool.closing:
                await self.pool.kill_all()
            if self.long is not None:
                await self.long.close()
            if self._notices:  # the hand-backs' wake-ups: the other hosts run those jobs
                await asyncio.wait(self._notices, timeout=FINAL_NOTIFY_TIMEOUT)
            await self.claims_db.close()
            await self.db.close()

    # --- start-up -------------------------------------------------------------------------

    def _bind_metrics(self) -> None:
        from .metrics import DispatcherMetrics, Health, MetricsServer

        cfg = self.config
        assert cfg.metrics_port is not None
        loop = asyncio.get_running_loop()
        self.metrics = DispatcherMetrics(loop, self._host_state, cfg.dsn)
        health = Health(loop, self.lease.seconds, lambda: self.hosts.last_ok)
        self.metrics_server = MetricsServer(self.metrics, health, cfg.metrics_host,
                                            cfg.metrics_port)

    async def _check_database(self) -> None:
        """Refuse a missing, older or newer schema. A server that cannot be reached fails at
        once (`ConnectError`); a connection lost during the check is retried."""
        async def check() -> None:
            conn = await dsnlib.connect_async(self.config.dsn, autocommit=True)
            async with conn:
                await schema.check_async(conn)

        await _retrying("checking the schema", check)

    def _worker_pool(self) -> WorkerPool:
        cfg = self.config
        # The workers' handlers reach the host's database through it (a group's callback
        # reading its members: `pgpool.job.JobInfo.group_members`).
        os.environ["PGPOOL_DSN"] = cfg.dsn
        return WorkerPool(
            procs=cfg.procs,
            modules=list(cfg.modules),
            on_outcome=self._job_finished,
            on_done=self._jobs_done,
            on_returned=self._jobs_returned,
            on_fatal=self._on_fatal,
            max_tasks=cfg.max_tasks_per_child,
            max_memory=cfg.max_memory,
            min_left_to_start=self.lease.min_left_to_start,
            log=None if cfg.log_level is None else (cfg.log_level, cfg.log_format),
            launched=self._launched,
            on_long=self._long_message,
            cpus={kind: h.cpus for kind, h in self.handlers.items()},
            on_cpu=self._cpu_used if cfg.fair_by == "cpu" else None,
            spares=cfg.spare_workers,
        )

    def _runnable(self) -> dict[str, Handler]:
        """The handlers whose jobs fit this host: a kind wider (``cpus``) than its
        ``--procs`` is not claimed here, and said so once."""
        procs = self.config.procs
        for kind, h in self.handlers.items():
            if h.cpus > procs:
                event(log, logging.WARNING, "kind_too_wide",
                      "kind %r takes %d cpus, more than this host's %d --procs: this host "
                      "does not claim it; run it on a host with --procs %d or more",
                      kind, h.cpus, procs, h.cpus, kind=kind, cpus=h.cpus, procs=procs)
        return {kind: h for kind, h in self.handlers.items() if h.cpus <= procs}

    async def _build_parts(self) -> None:
        cfg, db = self.config, self.db
        runnable = self._runnable()
        self.claimer = Claimer(
            self.claims_db, self.owner, queues=cfg.queues, handlers=runnable,
            lease=self.lease, max_attempts=cfg.max_attempts, timeout=cfg.timeout,
            on_claimed=self.metrics.jobs_claimed if self.metrics else None,
            tenant_cap=cfg.tenant_cap, fair_by=cfg.fair_by,
        )
        self.hosts = HostRegistry(
            db, self.owner, procs=cfg.procs, queues=cfg.queues, kinds=list(runnable),
            lease=self.lease, max_claims_per_sec=cfg.max_claims_per_sec,
            counters=self._host_counters,
            job_seconds=lambda: self.pool.job_seconds or None,
            limits={k: h.limit for k, h in runnable.items() if h.limit is not None},
        )
        self.completer = Completer(
            db, self.owner, interval=0.05, retry=cfg.retry,
            retries={kind: h.retry for kind, h in self.handlers.items() if h.retry is not None},
            keeps={kind: h.keep for kind, h in self.handlers.items() if h.keep is not None},
            keep_done=cfg.keep_done, on_flushed=self._acks_flushed,
            high_water=ack_high_water(cfg.procs, largest_batch(cfg.batch)),
            log_errors=cfg.log_errors, log_jobs=cfg.log_jobs,
            limited=frozenset(k for k, h in self.handlers.items()
                              if h.limit is not None and h.limit.concurrency is not None),
        )
        if cfg.log_summary:
            self.summary = Summary(cfg.log_summary, self.completer.counts)
            self._run_times = self.summary.runs
        self.long = long = LongJobs(db, self.owner)
        self.heartbeat = Heartbeat(db, self.owner, self.lease, self._held,
                                   on_lost=self.pool.drop_lost, on_extended=self.pool.extend,
                                   acking=self.completer.pending_jobs,
                                   progress=long.write_progress)
        # The fleet's maintenance runs on one host, elected (`pgpool.host.parts.leader`).
        self.leadership = Leadership(db, self.owner, self.lease)
        fenced = Fenced(db, self.leadership)
        self.reaper = Reaper(fenced, interval=self.lease.reaper_interval)
        self.stager = Stager(fenced, interval=cfg.poll)
        self.vacuum = await vacuum.keeper(db, cfg.dsn, elected=fenced)
        self.scheduler = ClaimScheduler(
            procs=cfg.procs, batch=cfg.batch, claimer=self.claimer, workers=self.pool,
            acks=self.completer, lease=self.heartbeat,
            budget=self.hosts.budget,
            # A burst host's own pass when it finds nothing: not fenced, as SKIP LOCKED
            # keeps it off the rows the leader's pass handles.
            reaper=Reaper(db, interval=self.lease.reaper_interval), burst=cfg.burst,
            poll=cfg.poll, idle_poll=cfg.idle_poll, listening=self._listening,
            settler=Settler(db, queues=cfg.queues, kinds=list(runnable),
                            tenant_cap=cfg.tenant_cap, fair_by=cfg.fair_by,
                            rank=lambda: self.hosts.rank,
                            peers=lambda: self.hosts.idle_peers),
        )
        if self._stopping.is_set():
            self.scheduler.stop()
        self.control = Control(db, cfg.poll, on_paused=self._paused,
                               on_cancelled=self.heartbeat.wake,
                               on_limits=self._limits_overridden,
                               idle_interval=cfg.idle_poll, quiet=self._quiet)
        self.retention = Retention(fenced, cfg.dead_retention)
        # Declared like a host row: refreshed every beat, stale after as many leases.
        self.periodic = (Periodic(db, self.owner, self.schedules,
                                  refresh=self.lease.beat_interval,
                                  declared_for=STALE_AFTER_LEASES * self.lease.seconds)
                         if self.schedules else None)
        elected = elect([self.reaper, self.stager, self.retention,
                         Pruner(fenced, self.lease.beat_interval),
                         *([self.vacuum] if self.vacuum is not None else [])],
                        self.leadership)
        self.listener = Listener(cfg.dsn, cfg.queues, self.scheduler.notified,
                                 self.control.wake, elected[1].wake, self.leadership.wake,
                                 self.scheduler.settled, self.scheduler.wanted)
        self.side = [self.heartbeat, self.listener, self.hosts, self.control,
                     self.leadership, *elected,
                     *([self.periodic] if self.periodic is not None else [])]
        await self._register()

    def _start_parts(self) -> list[asyncio.Task[None]]:
        """Start what runs beside the claim loops, each supervised (`_part_ended`): the
        completer's flushes, the watchdog, the side parts and the summary's loop."""
        runs = {"completer": self.completer.run(), WATCHDOG: self._watch(),
                **{part.name: part.run() for part in self.side}}
        if self.summary is not None:
            runs[self.summary.name] = self.summary.run()
        self._parts = {name: asyncio.create_task(run, name=f"pgpool {name}")
                       for name, run in runs.items()}
        if self.metrics_server is not None:
            self.metrics_server.start()
            event(log, logging.INFO, "metrics", "serving /metrics and /healthz on %s:%d",
                  self.config.metrics_host, self.metrics_server.port,
                  address=self.config.metrics_host, port=self.metrics_server.port)
        for name, task in self._parts.items():
            task.add_done_callback(functools.partial(self._part_ended, name))
        tasks = list(self._parts.values())
        cfg = self.config
        event(log, logging.INFO, "started",
              "dispatcher %s: %d workers, batch %s, queues %s, kinds %s",
              self.owner, cfg.procs, cfg.batch, ",".join(cfg.queues),
              ",".join(sorted(self.handlers)),
              owner=self.owner, procs=cfg.procs, batch=cfg.batch, queues=list(cfg.queues),
              kinds=sorted(self.handlers))
        self._started = time.monotonic()
        self.observer.started(self)
        return tasks

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

    # --- serving --------------------------------------------------------------------------

    async def _serve(self) -> None:
        """The claim loops, until stopped or drained; a failure of theirs stops the host.

        They start once the control part has read the paused queues, so a pause holds across
        a restart, or when a stop comes first.
        """
        loaded = asyncio.ensure_future(self.control.loaded.wait())
        stopped = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({loaded, stopped}, return_when=asyncio.FIRST_COMPLETED)
        loaded.cancel()
        stopped.cancel()
        try:
            await self.scheduler.run()
        except Exception as exc:
            self._part_failed("claim loops", exc)

    def _part_ended(self, name: str, task: asyncio.Task[None]) -> None:
        """A supervised part's task ended. Each runs until cancelled at shutdown and handles
        the failures it expects (the database going away) itself, so anything else is a
        bug or a broken environment: the host stops, loudly (`_part_failed`)."""
        if not task.cancelled():
            self._part_failed(name, task.exception())

    def _part_failed(self, name: str, exc: BaseException | None) -> None:
        """Stop this host because part ``name`` died: log it, stop claiming and drain as
        gracefully as the dead part allows; `run` then returns 1.

        Never stay up and idle: a host whose completer, heartbeat or claim loops are dead
        holds or claims nothing useful. A dead watchdog cannot enforce lease expiry and
        timeouts any more, so then the workers are killed at once instead of drained (their
        jobs come back when their leases expire). The log names the exception's type and
        where it was raised, never its message, which may quote job data.
        """
        if exc is None:
            reason = f"the {name} stopped unexpectedly"
        else:
            frame = traceback.extract_tb(exc.__traceback__)[-1:]
            where = f" at {frame[0].filename}:{frame[0].lineno}" if frame else ""
            reason = f"the {name} failed: {type(exc).__name__}{where}"
        event(log, logging.CRITICAL, "part_failed", "%s; stopping this dispatcher", reason,
              part=name, error=type(exc).__name__ if exc else None)
        self.fatal = self.fatal or reason
        self._stop_claiming()
        if name == WATCHDOG and not self.pool.closing:
            self._killing = asyncio.create_task(self.pool.kill_all())

    async def _watch(self) -> None:
        """Lease expiry and hard timeouts, and the process title, a few times a second."""
        ticks = 0
        while True:
            await asyncio.sleep(0.1)
            self.heartbeat.check_expiry()
            self.pool.check_deadlines()
            ticks += 1
            if ticks % 10 == 0:
                setproctitle(
                    f"pgpool dispatcher: {self.config.procs} workers, batch "
                    f"{self.scheduler.batch}, {self.pool.held} held, "
                    f"{self.completer.counts['done']} done"
                )

    def _host_state(self) -> HostState:
        """What /metrics shows of this host (called on the loop by the metrics thread)."""
        from .metrics import HostState

        assert self.scheduler is not None
        return HostState(
            procs=self.config.procs, batch=self.scheduler.batch,
            in_flight=self.pool.held + self.completer.backlog,
            budget_share=self.hosts.budget.rate,
            restarts=dict(self.pool.restarts),
            leases_lost=self.heartbeat.lost, lease_abandonments=self.heartbeat.abandoned,
            ack_flush_failures=self.completer.stats.failed_flushes,
            db_reached_at=self.hosts.last_ok,
            vacuums=0 if self.vacuum is None else self.vacuum.vacuums,
            vacuum_left=0 if self.vacuum is None else self.vacuum.left,
        )

    def _jobs_done(self, jobs: list[Job], elapsed: list[float]) -> None:
        """Plain successes, reported together (`WorkerPool`'s ``on_done``): what
        `_job_finished` does for each, once per read of a worker's results."""
        self.scheduler.job_finished()
        acks = self.completer.done(jobs, elapsed)
        if self._run_times is not None:
            add = self._run_times.add
            for job, seconds in zip(jobs, elapsed, strict=True):
                add(job.kind, seconds)
        if self.metrics is not None:
            self.metrics.jobs_done(jobs, elapsed, acks)
        if self._observed:
            for job, seconds in zip(jobs, elapsed, strict=True):
                self.observer.finished(AttemptEnd(job, None, seconds))

    def _job_finished(self, outcome: AttemptEnd) -> None:
        self.scheduler.job_finished()
        ack = self.completer.complete(outcome)
        if self._run_times is not None:
            self._run_times.add(outcome.job.kind, outcome.elapsed)
        if self.metrics is not None:
            self.metrics.job_finished(outcome, ack)
        self.observer.finished(outcome)

    def _cpu_used(self, job: Job, seconds: float) -> None:
        """``--fair-by cpu``: an attempt's CPU time, recorded for its tenant."""
        self.completer.record_cpu(job, seconds)

    def _long_message(self, job: Job | None, message: ipc.LongFromWorker,
                      answer: Answer) -> None:
        assert self.long is not None  # built before any job is claimed
        self.long.received(job, message, answer)

    def _jobs_returned(self, jobs: list[Job]) -> None:
        self.completer.release(jobs)

    def _acks_flushed(self, result: FlushResult) -> None:
        if result.freed and self.claimer.limited_short:  # none wait while claims come back full
            self._tell_freed(result.freed)
        wake: list[str] = []
        if result.released or result.interrupted:
            self.claimer.sweep_next()  # ready again, behind the claim's cursors
            wake.extend(self.config.queues)  # and for the other hosts, which may be idle
        self.scheduler.acks_flushed()
        if result.retried or result.snoozed:
            # Their delay may end before the stager's next pass: the leader's stager.
            if self.leadership.term is not None:
                self.stager.wake()
            else:
                wake.append(STAGE)
        if wake:
            self._notify(wake)
        if self.metrics is not None:
            self.metrics.acks_flushed(result)

    def _tell_freed(self, queues: frozenset[str]) -> None:
        """Wake the hosts of ``queues``, this one too: jobs of limited kinds ended there, and
        their slots are free. Best effort: a host not told claims at its next poll."""
        async def tell() -> None:
            try:
                async with self.db.connection(timeout=self.lease.at_risk_after) as conn:
                    await conn.execute(sql_jobs.NOTIFY_FREED, {"queues": sorted(queues)})
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.debug("could not tell the hosts of freed slots: %s", exc)

        task = asyncio.create_task(tell(), name="pgpool freed slots")
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    def _limits_overridden(self, overrides: dict[str, Override]) -> None:
        """Apply operators' overrides of limits (`pgpool.limits`): the code's limit with an
        override's fields, from the next claim on."""
        limits = {kind: overrides[kind].over(h.limit) if kind in overrides else h.limit
                  for kind, h in self.handlers.items()}
        in_force = {kind: limit for kind, limit in limits.items() if limit is not None}
        self.claimer.set_limits(in_force)
        self.completer.limited = frozenset(kind for kind, limit in in_force.items()
                                           if limit.concurrency is not None)
        self.scheduler.work_ready()  # a higher limit may have room now

    def _paused(self, queues: frozenset[str]) -> None:
        self.claimer.pause(queues)
        self.scheduler.work_ready()  # a resumed queue may have work waiting

    def _notify(self, payloads: list[str]) -> None:
        """Send these notifications (`sql.NOTIFY_MANY`) beside the data path; one that
        fails is logged, and the hosts' backstop polls find the jobs."""
        async def send() -> None:
            try:
                async with self.db.connection() as conn:
                    await conn.execute(sql_jobs.NOTIFY_MANY, {"payloads": payloads})
            except (psycopg.Error, OSError) as exc:
                log.warning("could not wake the other hosts (%s); they find the jobs at "
                            "their next poll", type(exc).__name__)

        task = asyncio.create_task(send())
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    def _listening(self) -> bool:
        """Whether the listener is connected: no notification is lost meanwhile."""
        return self.listener is not None and self.listener.listening

    def _quiet(self) -> bool:
        """Idle: the listener is connected and this host holds no job."""
        return self._listening() and self.pool.held == 0 and self.completer.backlog == 0

    def _held(self) -> list[Job]:
        return [*self.pool.held_jobs(), *self.completer.pending_jobs()]

    def _host_counters(self) -> tuple[int, int, int, float | None, int]:
        """(jobs done, attempts failed, jobs claimed, claim p99 ms, current batch) for the
        host registry."""
        c = self.completer.counts
        return (c["done"], c["retried"] + c["dead"], self.claimer.claimed,
                self.claimer.p99_ms(), self.scheduler.batch)

    # --- stopping -------------------------------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        if self._stopping.is_set():
            self._signal = sig
            self._hard_stop.set()
            return
        name = signal.Signals(sig).name
        event(log, logging.INFO, "stopping",
              "%s: stopping; running jobs may finish within %gs (signal again to stop now)",
              name, self.config.grace, signal=name)
        self._stop_claiming()
        self.observer.stopping(sig)

    def _on_fatal(self, reason: str) -> None:
        log.error("%s", reason)
        self.fatal = reason
        self._stop_claiming()

    def _stop_claiming(self) -> None:
        self._stopping.set()
        if self.scheduler is not None:
            self.scheduler.stop()

    async def _drain(self) -> None:
        await self.pool.stop(self.config.grace)
        if self._parts["completer"].done():
            log.error("the completer is down: %d acks are not written; those jobs will run "
                      "again once their leases expire", self.completer.backlog)
            self.observer.drained()
            return
        try:
            async with asyncio.timeout(FINAL_ACK_TIMEOUT):
                await self.completer.wait_idle()
        except TimeoutError:
            log.error(
                "could not write the last %d acks within %gs; those jobs will run again "
                "once their leases expire", self.completer.backlog, FINAL_ACK_TIMEOUT,
            )
            self.fatal = self.fatal or "final acks not written"
        self.observer.drained()

    async def _until_hard_stop(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run ``work``; False if a second signal interrupted it."""
        task = asyncio.ensure_future(work)
        hard = asyncio.create_task(self._hard_stop.wait())
        await asyncio.wait({task, hard}, return_when=asyncio.FIRST_COMPLETED)
        hard.cancel()
        if task.done():
            task.result()
            return True
        await stop_tasks(task)
        return False

    async def _die(self) -> int:
        log.warning("second signal: stopping now; unfinished jobs return when their "
                    "leases expire")
        await self.pool.kill_all()
        return 128 + (self._signal or signal.SIGTERM)

    def _summary(self) -> None:
        elapsed = max(1e-9, time.monotonic() - self._started)
        c = self.completer.counts
        # Everything moved to pgpool_dead: failed for good, discarded or cancelled.
        dead_lettered = c["dead"] + c["discarded"] + c["cancelled"]
        rate = (c["done"] + dead_lettered) / elapsed
        auto = self.scheduler.sizer is not None
        event(
            log, logging.INFO, "finished",
            "finished: %d succeeded, %d failed and retried later, %d dead-lettered (%d "
            "failed, %d discarded, %d cancelled), %d snoozed, %d handed back, %d cut off by "
            "the shutdown, in %.2fs (%.0f jobs/s); %d claims, %d ack flushes; batch %d%s",
            c["done"], c["retried"], dead_lettered, c["dead"], c["discarded"], c["cancelled"],
            c["snoozed"], c["released"], c["interrupted"], elapsed, rate,
            self.claimer.claims, self.completer.stats.flushes, self.scheduler.batch,
            " (auto)" if auto else "",
            done=c["done"], failed=c["retried"] + c["dead"], retried=c["retried"],
            dead=c["dead"], released=c["released"],
            interrupted=c["interrupted"], dead_lettered=dead_lettered,
            seconds=round(elapsed, 3), jobs_per_s=round(rate, 1), claims=self.claimer.claims,
            ack_flushes=self.completer.stats.flushes, batch=self.scheduler.batch,
            batch_auto=auto, lost=c["lost"], parked=c["parked"], snoozed=c["snoozed"],
            discarded=c["discarded"], cancelled=c["cancelled"],
            settled_by_others=self.scheduler.settled_by_others,
        )


def run_event_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on a new event loop, uvloop where it is built, and return its result."""
    try:
        import uvloop
    except ImportError:  # uvloop is not built for every platform
        return asyncio.run(main)
    return uvloop.run(main)


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
