"""What happens to a finished attempt, and writing that back as grouped acks.

Deciding: `decide` turns an attempt's `Outcome` into the job's next state, one of five
typed acks: `Ack.done` (delete it), `Ack.retry` (ready again after a capped exponential
backoff with jitter), `Ack.dead` (its last attempt failed: move it to ``pgpool_dead``),
`Ack.release` (claimed but never started: ready again, the claim not counted as an attempt)
and `Ack.interrupted` (cut off by this host's shutdown: ready again now, not counted, up to
`FREE_INTERRUPTIONS` times per job; after that such an attempt fails like any other).
`Completer.complete` and `Completer.release` are where the pool's outcomes arrive; an
attempt whose lease was lost (see `pgpool.heartbeat`) is dropped there, never acked.

Writing: the completer buffers acks and flushes when ``max_batch`` are waiting or the
oldest has waited ``interval`` seconds, whichever comes first, as the single `sql.ACK`
statement (deletes, retries, hand-backs, interruptions and dead letters, each guarded by
ownership). Only
one flush runs at a time; acks that arrive meanwhile wait for the next.

Backpressure: `has_room` turns False once ``high_water`` acks are waiting, and the claim
scheduler stops claiming until flushes catch up, so a slow or unreachable database bounds
memory instead of growing it. A flush that fails is retried with backoff and its acks are
kept, in order: an ack is never dropped. (If the database stays away long enough for the
leases to expire, the ownership guard turns those late acks into no-ops, and the reaper has
already put the jobs back: at-least-once either way.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import sql
from .job import Job, Outcome
from .logs import event
from .retry import FREE_INTERRUPTIONS, Failures, RetryPolicy, backoff

log = logging.getLogger("pgpool.completer")

AckKind = Literal["done", "retry", "release", "interrupted", "dead"]


@dataclass(frozen=True, slots=True)
class Ack:
    """A job's next state, to be written by the completer. Build one with `done`,
    `retry`, `release`, `interrupted` or `dead`."""

    kind: AckKind
    job: Job
    delay: float = 0.0
    error: str | None = None

    @classmethod
    def done(cls, job: Job) -> Ack:
        """The attempt succeeded: delete the job."""
        return cls("done", job)

    @classmethod
    def retry(cls, job: Job, delay: float, error: str) -> Ack:
        """The attempt failed: ready again in ``delay`` seconds, ``error`` kept."""
        return cls("retry", job, delay, error)

    @classmethod
    def release(cls, job: Job) -> Ack:
        """Claimed but never started: ready again now; the claim is not an attempt."""
        return cls("release", job)

    @classmethod
    def interrupted(cls, job: Job, error: str) -> Ack:
        """Cut off by this host's shutdown: ready again now, ``error`` kept, the attempt
        not counted against ``max_attempts``."""
        return cls("interrupted", job, error=error)

    @classmethod
    def dead(cls, job: Job, error: str) -> Ack:
        """The last attempt failed: move the job to ``pgpool_dead`` with ``error``."""
        return cls("dead", job, error=error)


def decide(outcome: Outcome, retry: RetryPolicy) -> Ack:
    """The next state of a job after ``outcome``: done; interrupted when this host's
    shutdown cut it off and the job has had fewer than `FREE_INTERRUPTIONS` uncounted
    attempts; otherwise retry after ``retry``'s delay for this attempt, or dead when it was
    the last one counted against ``max_attempts``."""
    job = outcome.job
    if outcome.error is None:
        return Ack.done(job)
    if outcome.interrupted and job.interruptions < FREE_INTERRUPTIONS:
        return Ack.interrupted(job, outcome.error)
    if job.counted >= job.max_attempts:
        return Ack.dead(job, outcome.error)
    return Ack.retry(job, retry.delay(job.counted), outcome.error)


#: The `Completer.counts` key of each ack kind.
_COUNTED: dict[AckKind, str] = {"done": "done", "retry": "retried", "release": "released",
                                "interrupted": "interrupted", "dead": "dead"}


@dataclass(slots=True)
class FlushResult:
    done: int = 0
    retried: int = 0
    released: int = 0
    interrupted: int = 0
    dead: int = 0
    #: Acks the database refused because this host no longer owned the attempt.
    stale: int = 0
    size: int = 0
    seconds: float = 0.0


@dataclass
class CompleterStats:
    flushes: int = 0
    acks: int = 0
    stale: int = 0
    failed_flushes: int = 0
    #: Durations of the most recent successful flushes, seconds (for percentiles).
    flush_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))


class Completer:
    """Decides each finished attempt's next state, buffers the acks and writes them in
    grouped transactions.

    ``counts`` tallies what was decided: "done", "retried", "dead", "released",
    "interrupted", and "lost" (results dropped because the lease was lost).
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        owner: str,
        *,
        max_batch: int = 50,
        interval: float = 0.01,
        high_water: int = 1000,
        retry: RetryPolicy | None = None,
        on_flushed: Callable[[FlushResult], None] | None = None,
    ) -> None:
        self._pool = pool
        self._owner = owner
        self.max_batch = max(1, max_batch)
        self.interval = interval
        self.high_water = high_water
        self._retry = retry or RetryPolicy()
        self._on_flushed = on_flushed
        self.counts: Counter[str] = Counter()
        self._buffer: list[Ack] = []
        self._flushing: list[Ack] = []
        self._first_at = 0.0
        self._have = asyncio.Event()
        self._full = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.stats = CompleterStats()

    # --- outcomes in ---------------------------------------------------------------------------

    def complete(self, outcome: Outcome) -> Ack | None:
        """An attempt ended: decide the job's next state and queue its ack, which is
        returned; or drop the result if the lease was lost meanwhile (None)."""
        job = outcome.job
        fields = {"job_id": job.id, "kind": job.kind, "attempt": job.counted,
                  "cause": outcome.cause}
        if job.lost:
            self.counts["lost"] += 1
            event(log, logging.WARNING, "job_lost",
                  "%s ended after its lease was lost; result dropped", job, **fields)
            return None
        ack = decide(outcome, self._retry)
        if ack.kind == "dead":
            event(log, logging.ERROR, "job_dead",
                  "%s failed (%s), no attempts left: moved to pgpool_dead", job,
                  outcome.cause, **fields)
        elif ack.kind == "retry":
            event(log, logging.WARNING, "job_retry", "%s failed (%s); retry in %.1fs", job,
                  outcome.cause, ack.delay, delay=round(ack.delay, 3), **fields)
        elif ack.kind == "interrupted":
            event(log, logging.WARNING, "job_interrupted",
                  "%s cut off by shutdown (%s); ready again, not counted as an attempt",
                  job, outcome.cause, **fields)
        self.add(ack)
        return ack

    def release(self, jobs: list[Job]) -> None:
        """Jobs claimed and never started: hand them back (unless their lease was lost)."""
        for job in jobs:
            if not job.lost:
                self.add(Ack.release(job))

    def add(self, ack: Ack) -> None:
        """Queue ``ack`` for the next flush."""
        self.counts[_COUNTED[ack.kind]] += 1
        if not self._buffer:
            self._first_at = time.monotonic()
        self._buffer.append(ack)
        self._idle.clear()
        self._have.set()
        if len(self._buffer) >= self.max_batch:
            self._full.set()

    @property
    def backlog(self) -> int:
        """Acks not yet committed, including the flush in progress."""
        return len(self._buffer) + len(self._flushing)

    def has_room(self) -> bool:
        return self.backlog < self.high_water

    def pending_jobs(self) -> list[Job]:
        """Jobs whose acks are not committed yet: their leases still need extending."""
        return [a.job for a in self._flushing] + [a.job for a in self._buffer]

    async def wait_idle(self) -> None:
        """Wait until every ack added so far is committed."""
        await self._idle.wait()

    # --- flushing ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Flush forever; cancel to stop (call `wait_idle` first to lose nothing)."""
        failures = Failures(log, "ack flush")
        while True:
            await self._have.wait()
            wait = self.interval - (time.monotonic() - self._first_at)
            if wait > 0 and not self._full.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):  # not wait_for: see scheduler._wait
                        await self._full.wait()
            self._flushing, self._buffer = self._buffer, []
            self._have.clear()
            self._full.clear()
            try:
                result = await self.flush(self._flushing)
            except (psycopg.Error, OSError) as exc:
                failures.failed(exc)
                self.stats.failed_flushes += 1
                delay = backoff(failures.count, 0.1, 5.0)
                self._buffer[:0] = self._flushing  # kept, in order, for the next try
                self._flushing = []
                self._first_at = 0.0
                self._have.set()
                await asyncio.sleep(delay)
                continue
            failures.succeeded()
            self._flushing = []
            if not self._buffer:
                self._idle.set()
            if self._on_flushed is not None:
                self._on_flushed(result)

    async def flush(self, acks: list[Ack]) -> FlushResult:
        """Write ``acks`` in one transaction (one statement, autocommit); errors propagate
        (`run` keeps the acks and retries)."""
        started = time.monotonic()
        arms: dict[str, list[Ack]] = {"done": [], "retry": [], "release": [],
                                      "interrupted": [], "dead": []}
        for a in acks:
            arms[a.kind].append(a)
        p: dict[str, object] = {"owner": self._owner}
        for kind, arm in arms.items():
            p[f"{kind}_ids"] = sql.int_array(a.job.id for a in arm)
            p[f"{kind}_attempts"] = sql.int_array(a.job.attempt for a in arm)
        p["retry_delays"] = [a.delay for a in arms["retry"]]
        p["retry_errors"] = [a.error or "" for a in arms["retry"]]
        p["interrupted_errors"] = [a.error or "" for a in arms["interrupted"]]
        p["dead_errors"] = [a.error or "" for a in arms["dead"]]
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.ACK, p)
            done, retried, released, interrupted, dead = await cur.fetchone()
        result = FlushResult(done, retried, released, interrupted, dead, size=len(acks),
                             seconds=time.monotonic() - started)
        result.stale = len(acks) - (done + retried + released + interrupted + dead)
        self.stats.flushes += 1
        self.stats.acks += len(acks)
        self.stats.stale += result.stale
        self.stats.flush_seconds.append(result.seconds)
        if result.stale:
            log.warning(
                "%d of %d acks were not applied: this host no longer owned those attempts "
                "(their lease expired and the jobs were returned to the queue)",
                result.stale, len(acks),
            )
        return result
