"""The drive: a real dispatcher, in this process, drains the seeded jobs; what it cost.

The dispatcher runs in burst mode (it exits once drained) and is watched through a
`DriveObserver`, the public `pgpool.host.dispatcher.DispatcherObserver` hook: completion times,
statements, progress lines, and PostgreSQL's CPU sampled while the dispatcher's connections
(and so their backends) still exist. Statements are checkouts of the dispatcher's connection
pool (``requests_num``) from its start-up to its drain: one statement each, except a host
registry beat, which sends two in one checkout.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from pathlib import Path
from typing import Any, Final

import psycopg

from .. import registry
from ..enqueue import enqueue_many
from ..host.attempt import AttemptEnd
from ..host.budget import DEFAULT_MAX_CLAIMS_PER_SEC
from ..host.config import RunConfig
from ..host.dispatcher import Dispatcher, DispatcherObserver
from . import jobs, queries
from .cpu import cpu_between, postgres_cpu, rusage_seconds
from .figures import quantile
from .jobs import KIND, STAMPS_ENV
from .options import BenchError, BenchOptions
from .progress import Progress
from .scratch import vacuum

#: The drive's budget when none is given: far above anything one host can claim.
NO_BUDGET: Final = 1e9


class DriveObserver(DispatcherObserver):
    """Times the dispatcher's completions, counts its statements, shows progress, and
    samples PostgreSQL's CPU once drained."""

    def __init__(self, total: int, progress: Progress) -> None:
        #: perf_counter() of the first and the last completion (the steady window).
        self.first_done: float | None = None
        self.last_done = 0.0
        #: Jobs the dispatcher had claimed when the first one completed.
        self.claimed_at_first_done = 0
        #: Pool checkouts from start-up to drain (see the module docstring).
        self.statements = 0
        #: `postgres_cpu` once drained.
        self.postgres_cpu_end: dict[int, float] = {}
        #: A signal (Ctrl-C) asked the run to stop.
        self.interrupted = False
        self._total = total
        self._progress = progress
        self._dispatcher: Dispatcher | None = None
        self._checkouts_at_start = 0
        self._ticker: asyncio.Task[None] | None = None

    def started(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._checkouts_at_start = _checkouts(dispatcher)
        self._ticker = asyncio.get_running_loop().create_task(self._tick(dispatcher))

    def finished(self, outcome: AttemptEnd) -> None:
        now = time.perf_counter()
        if self.first_done is None:
            assert self._dispatcher is not None
            self.first_done = now
            self.claimed_at_first_done = self._dispatcher.claimer.claimed
        self.last_done = now

    def stopping(self, signum: int) -> None:
        self.interrupted = True

    def drained(self) -> None:
        assert self._dispatcher is not None
        self.statements = _checkouts(self._dispatcher) - self._checkouts_at_start
        self.postgres_cpu_end = postgres_cpu()
        if self._ticker is not None:
            self._ticker.cancel()

    async def _tick(self, dispatcher: Dispatcher) -> None:
        last_at, last_done = time.perf_counter(), 0
        while True:
            await asyncio.sleep(self._progress.interval)
            counts = dispatcher.completer.counts
            now, done = time.perf_counter(), counts["done"] + counts["dead"]
            self._progress.update(f"drained {done}/{self._total} jobs "
                                  f"({(done - last_done) / (now - last_at):,.0f} jobs/s)")
            last_at, last_done = now, done


def _checkouts(dispatcher: Dispatcher) -> int:
    """Checkouts of the dispatcher's two pools, its claims' and the rest's."""
    return sum(pool.get_stats().get("requests_num", 0)  # absent before the first
               for pool in (dispatcher.db, dispatcher.claims_db))


def drive_dispatcher(opts: BenchOptions, dsn: str, admin: psycopg.Connection,
                     conn: psycopg.Connection, payloads: list[dict[str, Any]], tmp: Path,
                     progress: Progress) -> dict[str, Any]:
    """Seed ``payloads`` into a vacuumed table and drain them with a dispatcher of
    ``opts.procs`` workers; the drive's figures. ``admin`` (outside the scratch schema)
    reads the database's commits; stamps go to a file in ``tmp``.

    Raises `BenchError` if the dispatcher fails, KeyboardInterrupt if a signal stopped it.
    """
    modules = (jobs.__name__,)
    config = RunConfig(dsn=dsn, modules=modules, procs=opts.procs, batch=opts.batch,
                       burst=True, max_claims_per_sec=opts.max_claims_per_sec or NO_BUDGET,
                       metrics_port=0 if opts.metrics else None, metrics_host="127.0.0.1")
    observer = DriveObserver(total=len(payloads), progress=progress)
    dispatcher = Dispatcher(config, {KIND: registry.load(modules)[KIND]}, observer=observer)
    stamps = tmp / "drive-stamps"
    stamps.touch()
    vacuum(conn)
    wal_start = _wal(admin)
    enqueue_many(conn, KIND, payloads)
    enqueued_ns = time.monotonic_ns()  # enqueue_many has committed its transaction
    wal_enqueued = _wal(admin)
    progress.step(f"driving {opts.jobs} {opts.profile} jobs through a dispatcher with "
                  f"{opts.procs} workers, batch {opts.batch}")
    commits_before = _commits(admin)
    pg_before = postgres_cpu()
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.environ[STAMPS_ENV] = str(stamps)  # inherited by the workers the dispatcher spawns
    started = time.perf_counter()
    try:
        status = dispatcher.run_sync()
    finally:
        del os.environ[STAMPS_ENV]
    ended = time.perf_counter()
    self_cpu = (rusage_seconds(resource.getrusage(resource.RUSAGE_SELF))
                - rusage_seconds(self_before))
    children_cpu = (rusage_seconds(resource.getrusage(resource.RUSAGE_CHILDREN))
                    - rusage_seconds(children_before))
    transactions = _commits(admin, settle=True) - commits_before
    wal_drained = _wal(admin)
    if observer.interrupted:
        raise KeyboardInterrupt
    if status != 0:
        raise BenchError(f"the dispatcher failed ({dispatcher.fatal or f'exit {status}'})")

    done = dispatcher.completer.counts["done"]
    progress.step(f"drained {done}/{len(payloads)} jobs in {ended - started:.2f}s")
    first = observer.first_done or ended
    steady = max(1e-9, observer.last_done - first)
    rtts = sorted(dispatcher.claimer.rtts) or [dispatcher.claimer.rtt]
    claims = dispatcher.claimer.claims
    stats = dispatcher.completer.stats
    flush_times = sorted(stats.flush_seconds)
    lags = sorted((int(line) - enqueued_ns) / 1e6 for line in stamps.read_text().split())
    statements = observer.statements
    return {
        "batch": dispatcher.scheduler.batch,  # with auto, the batch it settled at
        "jobs_drained": done,
        "seconds": ended - started,
        "wall_jobs_per_s": done / (ended - started),
        "steady_jobs_per_s": max(0, done - 1) / steady,
        "claims": claims,
        "claimed_per_claim": dispatcher.claimer.claimed / max(1, claims),
        "claim_rtt_p50_ms": 1000 * quantile(rtts, 0.50),
        "claim_rtt_p99_ms": 1000 * quantile(rtts, 0.99),
        "claim_rtt_recent_ms": 1000 * dispatcher.claimer.rtt,
        "claims_per_s": (dispatcher.claimer.claimed - observer.claimed_at_first_done) / steady,
        "claim_budget_per_s": (dispatcher.scheduler.budget.rate if opts.max_claims_per_sec
                               else DEFAULT_MAX_CLAIMS_PER_SEC),
        "claim_budget_applied": opts.max_claims_per_sec is not None,
        "ack_flushes": stats.flushes,
        "mean_flush_size": stats.acks / max(1, stats.flushes),
        "flush_p50_ms": 1000 * quantile(flush_times, 0.50),
        "flush_p99_ms": 1000 * quantile(flush_times, 0.99),
        "transactions": transactions,
        "transactions_per_job": transactions / max(1, done),
        "statements": statements,
        "statements_per_job": statements / max(1, done),
        # Bytes of WAL per job: enqueue_many's COPY, then the drain (claims, acks,
        # heartbeats, and the vacuum keeper's and autovacuum's passes over the table).
        "wal_bytes_per_job": {
            "enqueue": _wal_between(admin, wal_start, wal_enqueued) / max(1, done),
            "drain": _wal_between(admin, wal_enqueued, wal_drained) / max(1, done),
            "total": _wal_between(admin, wal_start, wal_drained) / max(1, done)},
        "queue_lag_samples": len(lags),
        "queue_lag_p50_ms": quantile(lags, 0.50),
        "queue_lag_p99_ms": quantile(lags, 0.99),
        "cpu_seconds": {"dispatcher": self_cpu, "workers": children_cpu,
                        "postgres": cpu_between(pg_before, observer.postgres_cpu_end)},
    }


def _wal(conn: psycopg.Connection) -> str:
    row = conn.execute(queries.WAL_NOW).fetchone()
    assert row is not None
    return str(row[0])


def _wal_between(conn: psycopg.Connection, start: str, end: str) -> int:
    row = conn.execute(queries.WAL_BETWEEN, (end, start)).fetchone()
    assert row is not None
    return int(row[0])


def _commits(conn: psycopg.Connection, *, settle: bool = False) -> int:
    """The database's committed transactions. With ``settle``, wait (up to ~2 s) until the
    count stops moving: backends report their statistics when they exit, a bit later."""
    last = -1
    for _ in range(10):
        row = conn.execute(queries.COMMITS).fetchone()
        assert row is not None
        if not settle or row[0] == last:
            return int(row[0])
        last = row[0]
        time.sleep(0.2)
    return last
