"""What happens to a finished attempt, and writing that back as grouped acks.

Deciding: `decide` turns an attempt's `AttemptEnd` into the job's next state, one of these
typed acks: `Ack.done` (delete it), `Ack.retry` (ready again after its kind's backoff,
`pgpool.Retry`), `Ack.dead` (its last attempt failed, or it failed in a way its handler's
`Retry` does not retry: move it to ``pgpool_dead``), `Ack.release` (claimed but never
started: ready again, the claim not counted as an attempt) and `Ack.interrupted` (cut off
by this host's shutdown: ready again now, not counted, up to `FREE_INTERRUPTIONS` times per
job; after that such an attempt fails like any other); and what a handler asked for:
`Ack.snooze` (`pgpool.Snooze`: scheduled again, not counted, up to `MAX_SNOOZES` times per
job; after that a snooze fails like any error), `Ack.discard` and `Ack.cancel`
(`pgpool.Discard`, `pgpool.Cancel`: moved to ``pgpool_dead`` now, with that reason).
`Completer.complete` and `Completer.release` are where the pool's outcomes arrive; an
attempt whose lease was lost (see `pgpool.host.parts.heartbeat`) is dropped there, never acked.

Logging: every decision but a success is logged as it is made, one event each (``job_retry``,
``job_dead``...), with the attempt's run time and as much of its error as ``log_errors``
says (`pgpool.logs.LOG_ERRORS`: the exception's type, the first line of its message, or its
traceback too); a success only with ``log_jobs`` (``job_done``), so that by default the
common case stays quiet.

Writing: the completer buffers acks and flushes when ``max_batch`` are waiting or the
oldest has waited ``interval`` seconds, whichever comes first, as the single `sql.ACK`
statement (deletes, retries, hand-backs, interruptions and dead letters, each guarded by
ownership), or `sql.ACK_DONE`, its first arm alone, when every attempt succeeded, or
`sql.ACK_CONTROL`, `sql.ACK` with snoozes and dead letters' reasons, when a handler asked
for one of those. Only one flush runs at a time; acks that arrive meanwhile wait for the
next. With ``pgpool run --fair-by cpu``, a flush first adds the CPU time of the attempts
reported since the last one, per tenant (`Completer.record_cpu`), to the fleet's usage
(`sql.RECORD_CPU`, one statement); if that fails, the flush fails, and both are kept.

Isolation: when the database refuses a flush because of some of its rows (an application's
foreign key or trigger, a unique violation in ``pgpool_dead``, a lock held past
``lock_timeout``), or cancels it at ``statement_timeout`` (each delete scans an
application's table that references jobs without an index), `pgpool.host.isolate` bisects it:
every other ack commits, and each refused one is parked with `sql.PARK`, its reason in
``last_error``: a job that succeeded but could not be deleted is kept as 'done' (and counted
in its group, if a member), any other as 'parked'. Neither is claimed again. A success whose
job the database deletes alone, but not with its outcome (its kept result, follow-up jobs
or groups: an application's trigger, say), is not parked: it becomes the failure it is,
retried or dead, its handler unaware (a success parked without its follow-ups would lose
them for good). An ack refused on a lock, or that runs past the statement timeout even
alone, is first tried `LOCK_RETRIES` more times, alone, at the next flushes (the lock may
be a short application transaction's, the slowness a moment's); if parking is refused too,
the ack is dropped and the job comes back through its lease and the reaper. After a
timeout, flushes write at most half as many acks per statement as the one cancelled, a
limit that doubles again with each flush that runs without one. A flush cut short by the
timeout is logged (``ack_timeout``), as the sign of a missing index it usually is.

Backpressure: `has_room` turns False once ``high_water`` acks are waiting, and the claim
scheduler stops claiming until flushes catch up, so a slow or unreachable database bounds
memory instead of growing it. A flush that fails for any reason but its rows is retried
with backoff and its unwritten acks are kept, in order: such a failure never drops an ack.
(If the database stays away long enough for the leases to expire, the ownership guard turns
those late acks into no-ops, and the reaper has already put the jobs back: at-least-once
either way.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..db import statements
from ..db.outage import Failures, backoff
from ..errors import first_line
from ..horizon import run_time
from ..logs import DEFAULT_LOG_ERRORS, error_message, event, mask_secrets
from ..retry import FREE_INTERRUPTIONS, MAX_SNOOZES, Retry
from ..sql import jobs as sql
from ..sql.common import int_array
from ..worker.ipc import FollowUpsWire
from .attempt import AttemptEnd, Job
from .isolate import Interrupted, Isolated, describe, isolate, park, row_error, transient

log = logging.getLogger("pgpool.completer")

AckKind = Literal["done", "retry", "release", "interrupted", "dead", "snooze", "discard",
                  "cancel"]

#: How many more times an ack refused on a row lock, or that ran past the statement
#: timeout alone, is tried, alone, before it is parked.
LOCK_RETRIES: Final = 3
#: What each refused ack says in ``last_error`` before the database's error.
_REFUSED: dict[AckKind, str] = {
    "done": "succeeded, but the database refused to delete it",
    "retry": "failed, and the database refused to make it ready for its retry",
    "release": "was handed back unstarted, and the database refused to make it ready",
    "interrupted": "was cut off by the shutdown, and the database refused to make it ready",
    "dead": "failed its last attempt, and the database refused to move it to pgpool_dead",
    "snooze": "was snoozed, and the database refused to schedule it again",
    "discard": "was discarded, and the database refused to move it to pgpool_dead",
    "cancel": "was cancelled, and the database refused to move it to pgpool_dead",
}
#: ``pgpool_dead.reason`` of the acks that move a job there (`sql.ACK_CONTROL`).
_DEAD_REASONS: dict[AckKind, str] = {"dead": "failed", "discard": "discarded",
                                     "cancel": "cancelled"}


@dataclass(frozen=True, slots=True)
class Ack:
    """A job's next state, to be written by the completer. Build one with `done`,
    `retry`, `release`, `interrupted`, `dead`, `snooze`, `discard` or `cancel`."""

    kind: AckKind
    job: Job
    delay: float = 0.0
    error: str | None = None
    #: Written by a statement that records outcomes (`RECORDING`), not the plain ones: a
    #: success kept or with follow-ups, or a member of a group finishing.
    records: bool = False
    #: A success kept in ``pgpool_done`` for this many seconds (None: not kept), with
    #: ``result``, what its handler returned as JSON text.
    keep: float | None = None
    result: bytes | None = None
    #: A success's follow-up jobs and groups (`pgpool.worker.followups.FollowUps`).
    follow: FollowUpsWire | None = None

    @classmethod
    def done(cls, job: Job, keep: float | None = None, result: bytes | None = None,
             follow: FollowUpsWire | None = None
             ) -> Ack:
        """The attempt succeeded: delete the job; keep it ``keep`` seconds in
        ``pgpool_done`` with ``result``, and insert its ``follow`` ups, when given."""
        if keep is None and follow is None and job.group_id is None:
            return cls("done", job)  # the common case: the plain statements write it
        return cls("done", job, records=True, keep=keep, result=result, follow=follow)

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
        """The job failed for good: move it to ``pgpool_dead`` with ``error`` (reason
        'failed')."""
        return cls("dead", job, error=error, records=job.group_id is not None)

    @classmethod
    def snooze(cls, job: Job, delay: float) -> Ack:
        """Its handler snoozed (`pgpool.Snooze`): scheduled again in ``delay`` seconds, the
        attempt not counted against ``max_attempts`` (``snoozes`` + 1)."""
        return cls("snooze", job, delay)

    @classmethod
    def discard(cls, job: Job, reason: str) -> Ack:
        """Its handler discarded it (`pgpool.Discard`): move it to ``pgpool_dead`` now,
        reason 'discarded', ``last_error`` the handler's ``reason``."""
        return cls("discard", job, error=reason, records=job.group_id is not None)

    @classmethod
    def cancel(cls, job: Job, reason: str) -> Ack:
        """Its handler cancelled it (`pgpool.Cancel`): move it to ``pgpool_dead`` now,
        reason 'cancelled', ``last_error`` the handler's ``reason``."""
        return cls("cancel", job, error=reason, records=job.group_id is not None)


def keep_of(job: Job, keeps: Mapping[str, float], keep_done: float | None) -> float | None:
    """Seconds a success of ``job`` is kept: its kind's (``keeps``), else the host's
    (``keep_done``); a member of a group is kept at least until its group is complete and
    its callback has finished (`pgpool.sql.outcomes.PRUNE_DONE`), 0 more seconds. None: not
    kept."""
    keep = keeps.get(job.kind, keep_done)
    return 0.0 if keep is None and job.group_id is not None else keep


def as_kept(outcome: AttemptEnd, keep: float | None) -> AttemptEnd:
    """``outcome`` as it is decided for a success kept ``keep`` seconds (None: not kept):
    a kept success whose returned value cannot be stored (`AttemptEnd.result_error`) is the
    failure it is, final, since the value would not change (the job is dead-lettered with
    the reason, and nothing of the success written); any other outcome as it is."""
    if keep is None or outcome.result_error is None:
        return outcome
    return dataclasses.replace(
        outcome, error=f"succeeded, but its result cannot be stored: {outcome.result_error}",
        cause="ResultError", verdict="final")


def decide(outcome: AttemptEnd, retry: Retry, keep: float | None = None) -> Ack:
    """The next state of a job after ``outcome``: done (kept ``keep`` seconds with what its
    handler returned, when not None, and with its follow-ups); what its handler asked for (a
    snooze while the job has snoozed fewer than `MAX_SNOOZES` times, a discard, a cancel,
    or dead for an error its ``retry`` does not retry); interrupted when this host's
    shutdown cut it off and the job has had fewer than `FREE_INTERRUPTIONS` uncounted
    attempts; otherwise retry after ``retry``'s delay for this attempt, or dead when it was
    the last one counted against ``max_attempts``."""
    job = outcome.job
    error = outcome.error
    if error is None:
        if keep is None:
            return Ack.done(job, follow=outcome.follow)
        return Ack.done(job, keep, outcome.result, outcome.follow)
    match outcome.verdict:
        case None:
            pass
        case "snooze":
            if job.snoozes < MAX_SNOOZES:
                return Ack.snooze(job, outcome.delay)
            error = (f"its handler snoozed it again after {job.snoozes} snoozes, the most a "
                     "job may: this snooze counts as a failed attempt")
        case "discard":
            return Ack.discard(job, error)
        case "cancel":
            return Ack.cancel(job, error)
        case "final":
            return Ack.dead(job, error)
        case "handback":  # no bound: it stopped where its checkpoint lets it resume
            return Ack.interrupted(job, error)
    if outcome.interrupted and job.interruptions < FREE_INTERRUPTIONS:
        return Ack.interrupted(job, error)
    if job.counted >= job.max_attempts:
        return Ack.dead(job, error)
    return Ack.retry(job, retry.delay(job.counted), error)


#: The `Completer.counts` key of each ack kind.
_COUNTED: dict[AckKind, str] = {"done": "done", "retry": "retried", "release": "released",
                                "interrupted": "interrupted", "dead": "dead",
                                "snooze": "snoozed", "discard": "discarded",
                                "cancel": "cancelled"}


@dataclass(slots=True)
class FlushResult:
    done: int = 0
    retried: int = 0
    released: int = 0
    interrupted: int = 0
    dead: int = 0  # discarded and cancelled jobs too
    snoozed: int = 0
    #: Acks the database refused because this host no longer owned the attempt.
    stale: int = 0
    #: Acks refused because of their row, parked instead (`sql.PARK`).
    parked: int = 0
    #: Acks refused on a row lock or the statement timeout, to be tried again, alone, at
    #: the next flush; and the failures of successes whose outcome the database refused.
    later: list[Ack] = field(default_factory=list)
    #: Statements of this flush cancelled by the statement timeout.
    timeouts: int = 0
    size: int = 0
    seconds: float = 0.0
    #: The queues of the jobs of limited kinds this flush ended: their slots are free
    #: (`pgpool.limits`), which the hosts waiting on them are told of.
    freed: frozenset[str] = frozenset()


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
    "interrupted", "snoozed", "discarded", "cancelled", and "lost" (results dropped because
    the lease was lost); and "parked", acks the database refused for their row
    (`sql.PARK`), counted under their decision too.

    ``retry`` is the default retry schedule, ``retries`` the kinds' own (a handler's
    ``retry=``). ``keeps`` are the seconds a success of each kind is kept (a handler's
    ``keep=``), ``keep_done`` those of every other kind (``--keep-done``; None: not kept).
    ``log_errors``: what the events of failures show of their error
    (`pgpool.logs.LOG_ERRORS`); ``log_jobs``: log each success too (``job_done``).
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        owner: str,
        *,
        max_batch: int = 50,
        interval: float = 0.01,
        high_water: int = 1000,
        retry: Retry | None = None,
        retries: Mapping[str, Retry] | None = None,
        keeps: Mapping[str, float] | None = None,
        keep_done: float | None = None,
        on_flushed: Callable[[FlushResult], None] | None = None,
        log_errors: str = DEFAULT_LOG_ERRORS,
        log_jobs: bool = False,
        limited: frozenset[str] = frozenset(),
    ) -> None:
        """``limited``: the kinds with a concurrency limit (`pgpool.limits`), whose ends a
        flush reports (`FlushResult.freed`)."""
        self._pool = pool
        self.limited = limited
        self._owner = owner
        self.max_batch = max(1, max_batch)
        self.interval = interval
        self.high_water = high_water
        self._retry = retry or Retry()
        self._retries = dict(retries or {})
        self._keeps = dict(keeps or {})
        self._keep_done = keep_done
        #: Whether any success may be kept: when not, a success costs no lookup.
        self._keeping = bool(self._keeps) or keep_done is not None
        #: Kinds whose handler returned a value that was dropped: warned of once each.
        self._dropped_results: set[str] = set()
        self._on_flushed = on_flushed
        self._log_errors = log_errors
        self._log_jobs = log_jobs
        self.counts: Counter[str] = Counter()
        self._buffer: list[Ack] = []
        self._flushing: list[Ack] = []
        self._first_at = 0.0
        self._have = asyncio.Event()
        self._full = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.stats = CompleterStats()
        #: Lock and statement timeouts so far of the acks refused on them, by (id, attempt).
        self._lock_misses: dict[tuple[int, int], int] = {}
        #: Acks written per statement at most, since a statement timeout; None: no limit.
        self._limit: int | None = None
        #: Per tenant, the CPU seconds and attempts measured since the last flush
        #: (`record_cpu`: ``pgpool run --fair-by cpu``).
        self._cpu: dict[str, tuple[float, int]] = {}

    # --- outcomes in ----------------------------------------------------------------------

    def complete(self, outcome: AttemptEnd) -> Ack | None:
        """An attempt ended: decide the job's next state and queue its ack, which is
        returned; or drop the result if the lease was lost meanwhile (None)."""
        job = outcome.job
        if job.lost:
            self.counts["lost"] += 1
            event(log, logging.WARNING, "job_lost",
                  "%s ended after its lease was lost (after %s); result dropped", job,
                  run_time(outcome.elapsed), **_fields(outcome, "lost"))
            return None
        keep = (keep_of(job, self._keeps, self._keep_done)
                if self._keeping or job.group_id is not None else None)
        if keep is not None:  # no call on the common path
            outcome = as_kept(outcome, keep)
        ack = decide(outcome, self._retry if outcome.error is None
                     else self._retries.get(job.kind, self._retry), keep)
        if keep is None and outcome.error is None and (
                outcome.result is not None or outcome.result_error is not None):
            self._drop_result(job)
        if ack.kind != "done":
            _log_decision(ack, outcome, self._log_errors)
        elif self._log_jobs:  # off by default: the common case stays quiet
            event(log, logging.INFO, "job_done", "%s succeeded in %s", job,
                  run_time(outcome.elapsed), **_fields(outcome, "done"))
        self.add(ack)
        return ack

    def done(self, jobs: list[Job], elapsed: list[float]) -> list[Ack | None]:
        """Plain successes (nothing returned, no follow-ups): `complete` for each, its ack
        made here without an `AttemptEnd` when nothing is kept or logged (the common case
        of a host running short jobs)."""
        if self._keeping or self._log_jobs:
            return [self.complete(AttemptEnd(job, None, seconds))
                    for job, seconds in zip(jobs, elapsed, strict=True)]
        acks: list[Ack | None] = []
        plain: list[Ack] = []
        for job, seconds in zip(jobs, elapsed, strict=True):
            if job.lost or job.group_id is not None:
                acks.append(self.complete(AttemptEnd(job, None, seconds)))
            else:
                ack = Ack("done", job)
                acks.append(ack)
                plain.append(ack)
        if plain:
            self.counts["done"] += len(plain)
            self._queue(plain)
        return acks

    def record_cpu(self, job: Job, seconds: float) -> None:
        """An attempt of ``job`` used ``seconds`` of CPU: its tenant's usage, which the next
        flush writes before its acks (`sql.RECORD_CPU`). Whatever becomes of the attempt:
        even one whose lease was lost used the CPU."""
        self._add_cpu(job.tenant, seconds, 1)

    def _add_cpu(self, tenant: str, cpu: float, attempts: int) -> None:
        had_cpu, had_attempts = self._cpu.get(tenant, (0.0, 0))
        self._cpu[tenant] = (had_cpu + cpu, had_attempts + attempts)

    def _drop_result(self, job: Job) -> None:
        if job.kind in self._dropped_results:
            return
        self._dropped_results.add(job.kind)
        # The kind only: a returned value may hold the payload's data.
        event(log, logging.WARNING, "result_dropped",
              "handler %r returned a value, which is dropped: keep its outcomes with "
              "@pgpool.handler(%r, keep=...) or pgpool run --keep-done to store it (logged "
              "once per kind)", job.kind, job.kind, kind=job.kind)

    def release(self, jobs: list[Job]) -> None:
        """Jobs claimed and never started: hand them back (unless their lease was lost)."""
        for job in jobs:
            if not job.lost:
                self.add(Ack.release(job))

    def add(self, ack: Ack) -> None:
        """Queue ``ack`` for the next flush."""
        self.counts[_COUNTED[ack.kind]] += 1
        self._queue((ack,))

    def _queue(self, acks: Sequence[Ack]) -> None:
        if not self._buffer:
            self._first_at = time.monotonic()
        self._buffer.extend(acks)
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

    # --- flushing -------------------------------------------------------------------------

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
            except Interrupted as exc:
                failures.failed(exc.error)
                self.stats.failed_flushes += 1
                delay = backoff(failures.count, 0.1, 5.0)
                self._buffer[:0] = exc.left  # kept, in order, for the next try
                self._flushing = []
                self._first_at = 0.0
                self._have.set()
                await asyncio.sleep(delay)
                continue
            failures.succeeded()
            self._flushing = []
            if result.later:  # tried again, alone, at the next flush
                self._buffer[:0] = result.later
                self._first_at = 0.0
                self._have.set()
            if not self._buffer:
                self._idle.set()
            if self._on_flushed is not None:
                self._on_flushed(result)

    async def flush(self, acks: list[Ack]) -> FlushResult:
        """Write ``acks``: one statement (autocommit) unless the database refuses some of
        their rows or it runs past the statement timeout; they are then isolated
        (`pgpool.host.isolate`) and parked, or returned in ``later`` after a lock or statement
        timeout. Any other failure raises `Interrupted` naming the acks not written (`run`
        keeps them and retries)."""
        started = time.monotonic()
        if self._cpu:
            await self._write_cpu(acks)
        try:
            written = await isolate(acks, self._write, limit=self._limit,
                                    alone=self._missed_lock if self._lock_misses else None)
        except Interrupted as exc:
            # Refused ones are tried again with the rest: the failure may have hidden why.
            raise Interrupted(exc.error, exc.left + [a for a, _ in exc.done.rejected],
                              exc.done) from exc.error
        result = FlushResult(size=len(acks), timeouts=written.timeouts)
        if written.timeouts:
            event(log, logging.WARNING, "ack_timeout",
                  "%d statements of an ack flush of %d jobs ran past statement_timeout; "
                  "each was split, or left for a later flush if it held one ack (does an "
                  "application table reference pgpool_jobs(id) from a column without an "
                  "index?)", written.timeouts,
                  len(acks), acks=len(acks), timeouts=written.timeouts, limit=written.limit)
        if written.limit != self._limit:  # a batch timed out: lowered
            self._limit = written.limit
        elif self._limit is not None:  # none did: a larger batch may fit again
            self._limit = None if self._limit >= self.high_water else 2 * self._limit
        for done, retried, released, interrupted, dead, snoozed in written.results:
            result.done += done
            result.retried += retried
            result.released += released
            result.interrupted += interrupted
            result.dead += dead
            result.snoozed += snoozed
        refused = []
        for ack, exc in written.rejected:
            key = (ack.job.id, ack.job.attempt)
            misses = self._lock_misses.get(key, 0)
            if transient(exc) and misses < LOCK_RETRIES:
                self._lock_misses[key] = misses + 1
                result.later.append(ack)
            else:
                refused.append((ack, exc))
        if self._lock_misses:  # forget the acks written, parked or dropped
            for ack in acks:
                if ack not in result.later:
                    self._lock_misses.pop((ack.job.id, ack.job.attempt), None)
        if refused:
            refused = await self._fail_refused_outcomes(refused, result.later)
        if refused:
            result.parked = await self._park(refused, result.later)
        if self.limited:  # per flush, and only on a host that runs limited kinds
            result.freed = frozenset(a.job.queue for a in acks if a.job.kind in self.limited)
        result.seconds = time.monotonic() - started
        result.stale = (len(acks) - len(refused) - len(result.later)
                        - (result.done + result.retried + result.released
                           + result.interrupted + result.dead + result.snoozed))
        self.stats.flushes += 1
        self.stats.acks += len(acks) - len(result.later)
        self.stats.stale += result.stale
        self.stats.flush_seconds.append(result.seconds)
        if result.stale:
            log.warning(
                "%d of %d acks were not applied: this host no longer owned those attempts "
                "(their lease expired and the jobs were returned to the queue)",
                result.stale, len(acks),
            )
        return result

    def _missed_lock(self, ack: Ack) -> bool:
        return (ack.job.id, ack.job.attempt) in self._lock_misses

    async def _write_cpu(self, acks: list[Ack]) -> None:
        """Write the CPU usage recorded since the last flush (`sql.RECORD_CPU`), one
        statement, before ``acks``: a claim that no longer sees an attempt's job running
        sees its CPU. On a failure it is kept, and `Interrupted` names all of ``acks`` as
        not written (`run` tries them again)."""
        used, self._cpu = self._cpu, {}
        tenants = sorted(used)
        try:
            async with self._pool.connection() as conn:
                await conn.execute(sql.RECORD_CPU, {
                    "tenants": tenants, "cpu": [used[t][0] for t in tenants],
                    "attempts": [used[t][1] for t in tenants]})
        except (psycopg.Error, OSError) as exc:
            for tenant, (cpu, attempts) in used.items():  # with what came in meanwhile
                self._add_cpu(tenant, cpu, attempts)
            raise Interrupted(exc, acks, Isolated()) from exc

    async def _fail_refused_outcomes(self, refused: list[tuple[Ack, BaseException]],
                                     later: list[Ack]) -> list[tuple[Ack, BaseException]]:
        """``refused`` but the successes whose outcome the database refused (their kept
        result, follow-up jobs or groups: an application's trigger, say), not their delete:
        each of those becomes the failed attempt it is, its handler unaware, put in
        ``later`` (the next flush writes it). Parked as done instead, it would have lost its
        follow-ups for good; it is retried, or dead when that was its last attempt."""
        parked = []
        for i, (ack, exc) in enumerate(refused):
            if ack.kind != "done" or not ack.records:
                parked.append((ack, exc))
                continue
            try:
                outcome_refused = await self._deletes_alone(ack)
            except (psycopg.Error, OSError) as error:  # not about its rows: kept, retried
                left = [a for a, _ in parked + refused[i:]] + later
                raise Interrupted(error, left, Isolated()) from error
            if not outcome_refused:
                parked.append((ack, exc))
                continue
            error = (f"succeeded, but the database refused to store its outcome (its result, "
                     f"follow-up jobs or groups): {describe(exc)}: {first_line(exc)}")
            failure = decide(AttemptEnd(ack.job, error, 0.0, cause=describe(exc)),
                             self._retries.get(ack.job.kind, self._retry))
            self.counts["done"] -= 1
            self.counts[_COUNTED[failure.kind]] += 1
            later.append(failure)
            event(log, logging.ERROR, "outcome_refused",
                  "%s succeeded, but the database refused to store its outcome (%s): %s",
                  ack.job, describe(exc), "retried" if failure.kind == "retry"
                  else "moved to pgpool_dead", job_id=ack.job.id, kind=ack.job.kind,
                  error=describe(exc), then=failure.kind)
        return parked

    async def _deletes_alone(self, ack: Ack) -> bool:
        """Whether the database deletes the job of ``ack`` (a success) alone, without its
        outcome, in a transaction rolled back: then what it refused was the outcome."""
        p = {"owner": self._owner, "done_ids": int_array([ack.job.id]),
             "done_attempts": int_array([ack.job.attempt])}
        try:
            async with self._pool.connection() as conn, conn.transaction(
                    force_rollback=True):
                return (await conn.execute(sql.ACK_DONE, p)).rowcount == 1
        except psycopg.Error as exc:
            if row_error(exc):
                return False
            raise

    async def _park(self, refused: list[tuple[Ack, BaseException]], later: list[Ack]) -> int:
        """Park the acks the database refused, each with its reason; returns how many were
        parked. One it refuses to park too is dropped: the job comes back through its lease
        and the reaper. ``later``: kept across an `Interrupted` (they are in no batch)."""
        try:
            ids, again = await park(refused, self._write_park)
        except Interrupted as exc:
            left = [ack for ack, _ in exc.left] + [ack for (ack, _), _ in exc.done.rejected]
            raise Interrupted(exc.error, left + later, exc.done) from exc.error
        for ack, exc in refused:
            if ack.job.id in ids:  # not if another host took the job back meanwhile
                self.counts["parked"] += 1
                state = "done" if ack.kind == "done" else "parked"
                event(log, logging.ERROR, "parked",
                      "%s: the database refused its %s ack (%s); kept as %r, see last_error",
                      ack.job, ack.kind, describe(exc), state, job_id=ack.job.id,
                      kind=ack.job.kind, ack=ack.kind, state=state, error=describe(exc))
        for (ack, _), exc in again:
            event(log, logging.ERROR, "park_refused",
                  "%s: the database refused its %s ack and parking it (%s); it runs again "
                  "once its lease expires", ack.job, ack.kind, describe(exc),
                  job_id=ack.job.id, kind=ack.job.kind, ack=ack.kind, error=describe(exc))
        return len(ids)

    async def _write_park(self, refused: list[tuple[Ack, BaseException]]) -> list[int]:
        """One `sql.PARK` statement for ``refused``; the ids of the jobs it parked."""
        p = {
            "owner": self._owner,
            "ids": int_array(a.job.id for a, _ in refused),
            "attempts": int_array(a.job.attempt for a, _ in refused),
            "states": ["done" if a.kind == "done" else "parked" for a, _ in refused],
            "reasons": [_reason(a, exc) for a, exc in refused],
        }
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.PARK, p)
            return [row[0] for row in await cur.fetchall()]

    async def _write(self, acks: list[Ack]) -> tuple[int, int, int, int, int, int]:
        """One statement for ``acks`` (`ack_statement`): rows (done, retried, released,
        interrupted, dead, snoozed). With outcomes to record, in a transaction with the
        statements of the follow-up groups of the successes it recorded."""
        query, params = ack_statement(acks, self._owner)
        async with self._pool.connection() as conn:
            if query in RECORDING:
                async with conn.transaction():
                    row = await (await statements.execute(conn, query, params)).fetchone()
                    for group in follow_up_groups(acks, row[-1]):
                        await conn.execute(sql.ENQUEUE_GROUP, group)
                return row[:6]
            cur = await statements.execute(conn, query, params)
            if query is sql.ACK_DONE:  # the jobs it deleted are its rowcount
                return cur.rowcount, 0, 0, 0, 0, 0
            row = await cur.fetchone()
        if query is sql.ACK_CONTROL:
            return row
        done, retried, released, interrupted, dead = row
        return done, retried, released, interrupted, dead, 0


#: The arms of `sql.ACK` (and `sql.ACK_DONE`), and of `sql.ACK_CONTROL`.
_ARMS: tuple[AckKind, ...] = ("done", "retry", "release", "interrupted", "dead")
_ARMS_CONTROL: tuple[AckKind, ...] = (*_ARMS, "snooze")


def _fields(outcome: AttemptEnd, counted: str) -> dict[str, object]:
    """What every event about a job's outcome carries; ``counted``: the outcome as
    `Completer.counts` (and the summary, `pgpool.host.summary`) counts it."""
    job = outcome.job
    return {"job_id": job.id, "kind": job.kind, "attempt": job.counted,
            "outcome": counted, "seconds": round(outcome.elapsed, 6), "cause": outcome.cause}


def _error(outcome: AttemptEnd, errors: str, fields: dict[str, object]
           ) -> tuple[str | None, str | None]:
    """What the event of a failed ``outcome`` shows of its error, as ``errors``
    (`pgpool.logs.LOG_ERRORS`) says: the first line of its message (None: none to show
    beyond its cause), also put in ``fields`` as ``error``; and its whole error text,
    masked, to write under the line (``traceback``; None: none, or nothing more than the
    message)."""
    if errors == "none" or not outcome.error:
        return None, None
    message = error_message(outcome.error)
    if message:
        fields["error"] = message
    if errors == "traceback" or log.isEnabledFor(logging.DEBUG):
        whole = mask_secrets(outcome.error).strip()
        if whole != message:
            return message or None, whole
    return message or None, None


#: Why a job died at once, by the cause of its failure, where its Retry did not decide it.
_PERMANENT: Final = {"PayloadDecodeError": "its payload does not fit its handler's type",
                     "ResultError": "its result cannot be stored"}


def _log_decision(ack: Ack, outcome: AttemptEnd, errors: str) -> None:
    """The event of a decision other than done: what became of the job, after how long,
    and why (as much of its error as ``errors`` says: `_error`)."""
    job, fields = outcome.job, _fields(outcome, _COUNTED[ack.kind])
    took = run_time(outcome.elapsed)
    message, whole = (None, None) if ack.kind == "snooze" else _error(outcome, errors, fields)
    # The cause, or the message when there is one (it starts with the exception's type).
    why = outcome.cause if message is None or message == outcome.cause else message
    exc_text = whole if errors == "traceback" else None
    if ack.kind == "dead":
        permanent = outcome.verdict == "final"
        reason = (_PERMANENT.get(outcome.cause, "an error its handler's Retry does not retry")
                  if permanent else "no attempts left")
        event(log, logging.ERROR, "job_dead",
              "%s failed (%s) after %s, %s: moved to pgpool_dead", job, why, took, reason,
              exc_text=exc_text, permanent=permanent, **fields)
    elif ack.kind == "retry":
        event(log, logging.WARNING, "job_retry", "%s failed (%s) after %s; retry in %.1fs",
              job, why, took, ack.delay, exc_text=exc_text, delay=round(ack.delay, 3),
              **fields)
    elif ack.kind == "interrupted":
        event(log, logging.WARNING, "job_interrupted",
              "%s cut off by this host (%s) after %s; ready again, not counted as an "
              "attempt", job, why, took, exc_text=exc_text, **fields)
    elif ack.kind == "snooze":
        event(log, logging.INFO, "job_snoozed",
              "%s snoozed by its handler after %s; runs again in %.1fs, not counted as an "
              "attempt", job, took, ack.delay, delay=round(ack.delay, 3),
              snoozes=job.snoozes + 1, **fields)
    elif ack.kind in ("discard", "cancel"):
        name, done = (("job_discarded", "discarded") if ack.kind == "discard"
                      else ("job_cancelled", "cancelled"))
        reason = "" if message is None else f" ({message})"
        event(log, logging.WARNING, name,
              "%s %s by its handler%s after %s: moved to pgpool_dead", job, done, reason,
              took, exc_text=exc_text, **fields)
    if whole is not None and exc_text is None:  # --log-errors message: at DEBUG
        event(log, logging.DEBUG, "job_traceback", "%s: the error of that attempt", job,
              exc_text=whole, job_id=job.id, kind=job.kind, attempt=job.counted)


def ack_statement(acks: list[Ack], owner: str) -> tuple[str, dict[str, object]]:
    """The one statement that writes ``acks`` as host ``owner``, and its parameters:
    `sql.ACK_DONE` when every attempt succeeded (the one arm with rows), `sql.ACK_CONTROL`
    when a handler asked for a snooze, a discard or a cancel, `sql.ACK_OUTCOMES` when an
    ack records an outcome (`Ack.records`; `sql.ACK_KEPT` when every attempt succeeded),
    else `sql.ACK`. Its rows: ACK_DONE's rowcount is the jobs deleted; ACK returns (done,
    retried, released, interrupted, dead), ACK_CONTROL those and snoozed, the two that
    record (`RECORDING`) those and then what `follow_up_groups` takes.
    `pgpool.testing.drain` writes its acks with it too."""
    arms: dict[AckKind, list[Ack]] = {"done": [], "retry": [], "release": [],
                                      "interrupted": [], "dead": [], "snooze": [],
                                      "discard": [], "cancel": []}
    records = False
    for a in acks:
        arms[a.kind].append(a)
        if a.records:
            records = True
    control = records or bool(arms["snooze"] or arms["discard"] or arms["cancel"])
    if control:  # dead letters with a reason each
        arms["dead"] += arms["discard"] + arms["cancel"]
    p: dict[str, object] = {"owner": owner}
    for kind in _ARMS_CONTROL if control else _ARMS:
        arm = arms[kind]
        p[f"{kind}_ids"] = int_array(a.job.id for a in arm)
        p[f"{kind}_attempts"] = int_array(a.job.attempt for a in arm)
    p["retry_delays"] = [a.delay for a in arms["retry"]]
    p["retry_errors"] = [a.error or "" for a in arms["retry"]]
    p["interrupted_errors"] = [a.error or "" for a in arms["interrupted"]]
    p["dead_errors"] = [a.error or "" for a in arms["dead"]]
    successes = len(arms["done"]) == len(acks)
    if successes and not records:
        return sql.ACK_DONE, p
    if not control:
        return sql.ACK, p
    p["snooze_delays"] = [a.delay for a in arms["snooze"]]
    p["dead_reasons"] = [_DEAD_REASONS[a.kind] for a in arms["dead"]]
    if not records:
        return sql.ACK_CONTROL, p
    kept = [a for a in arms["done"] if a.keep is not None]
    p["kept_ids"] = int_array(a.job.id for a in kept)
    p["kept_attempts"] = int_array(a.job.attempt for a in kept)
    p["kept_seconds"] = [a.keep for a in kept]
    p["kept_results"] = [None if a.result is None else a.result.decode() for a in kept]
    follow = [(a.job, job) for a in arms["done"] if a.follow for job in a.follow[0]]
    p["follow_parents"] = int_array(parent.id for parent, _ in follow)
    p["follow_attempts"] = int_array(parent.attempt for parent, _ in follow)
    for column, key in _FOLLOW_COLUMNS:
        p[column] = [job[key] for _, job in follow]
    return (sql.ACK_KEPT if successes else sql.ACK_OUTCOMES), p


#: The statements that record outcomes: run in a transaction with the follow-up groups of
#: the successes they recorded (`follow_up_groups`).
RECORDING: Final = (sql.ACK_OUTCOMES, sql.ACK_KEPT)

#: The follow-up jobs' columns in `sql.ACK_OUTCOMES`, and their key in each job's
#: parameters (`pgpool.enqueue.function_params`).
_FOLLOW_COLUMNS: Final = (
    ("follow_queues", "queue"), ("follow_kinds", "kind"), ("follow_payloads", "payload"),
    ("follow_priorities", "priority"), ("follow_run_at", "run_at"),
    ("follow_delays", "delay"), ("follow_max_attempts", "max_attempts"),
    ("follow_unique_keys", "unique_key"), ("follow_tenants", "tenant"),
    ("follow_concurrency_keys", "concurrency_key"))


def follow_up_groups(acks: list[Ack], recorded: list[list[int]]) -> list[dict[str, Any]]:
    """The parameters of `sql.ENQUEUE_GROUP` for each group a handler started (through
    its job) in the attempts of ``acks`` whose success a `RECORDING` statement recorded
    (the (id, attempt) pairs it returned last: not a stale ack's of an earlier attempt of
    the same job): written in the same transaction, after it."""
    done = {(job_id, attempt) for job_id, attempt in recorded}
    return [group for a in acks if a.follow and (a.job.id, a.job.attempt) in done
            for group in a.follow[1]]


def _reason(ack: Ack, exc: BaseException) -> str:
    """``last_error`` of a parked job: what pgpool could not write, the database's error,
    and the attempt's own error, if it failed."""
    reason = f"{_REFUSED[ack.kind]}: {describe(exc)}: {first_line(exc)}"
    return reason if ack.error is None else f"{reason}\n{ack.error}"
