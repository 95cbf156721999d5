"""What the dispatcher knows about a claimed job (`Job`: one attempt, with its lease
deadline) and how that attempt ended (`AttemptEnd`, built from what the worker reported)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..worker.ipc import (
    Done,
    Ended,
    Failed,
    Finished,
    FollowUpsWire,
    HandedBack,
    Snoozed,
    Verdict,
    WorkItem,
)


@dataclass(slots=True, eq=False)
class Job:
    """A claimed attempt of a job. (``id``, ``attempt``) is the ownership token."""

    id: int
    kind: str
    queue: str
    attempt: int  # claims so far, this one included: with ``id``, the ownership token
    interruptions: int  # earlier claims not counted against ``max_attempts``
    max_attempts: int
    payload: bytes  # raw JSON text as stored; only the worker parses it
    timeout: float | None
    #: This dispatcher no longer owns the attempt: never ack it. Only `pgpool.host.parts.heartbeat`
    #: sets it.
    lost: bool = False
    #: When a worker must stop running it (`time.monotonic()`, see `Lease.deadline`): set
    #: from the claim's start, moved on by each heartbeat that extends the lease.
    deadline: float = math.inf  # inf: no deadline (a pool used on its own, in tests)
    #: A worker has started it (set by the pool; the heartbeat records it for the reaper).
    started: bool = False
    #: Seconds from when it was due (``run_at``) to its claim: its queue lag.
    waited: float = 0.0
    #: Earlier claims whose handler snoozed (`pgpool.Snooze`): not counted either.
    snoozes: int = 0
    #: The ``meta`` column as stored, raw JSON text (the producer's trace context:
    #: `pgpool.tracing`), or None; only the worker parses it.
    meta: bytes | None = None
    #: The group it is a member of (`pgpool.group`: its callback's id), or None.
    group_id: int | None = None
    #: Its tenant ('' for none): whose CPU its attempt used (``pgpool run --fair-by cpu``).
    tenant: str = ""
    #: Its priority: a job of a higher one leaves the pool's backlog first
    #: (`pgpool.host.backlog`).
    priority: int = 0

    @property
    def counted(self) -> int:
        """Attempts used against ``max_attempts``, this one included."""
        return self.attempt - self.interruptions - self.snoozes

    def wire(self) -> WorkItem:
        """What a worker receives of this attempt."""
        # tuple.__new__ skips the named tuple's Python-level __new__: half the cost, once per
        # job on the dispatcher's busiest path.
        return tuple.__new__(WorkItem, (self.id, self.attempt,
                                        self.interruptions + self.snoozes,
                                        self.max_attempts, self.kind, self.queue,
                                        self.payload, self.deadline, self.meta))

    def __str__(self) -> str:
        return f"job {self.id} ({self.kind}, attempt {self.counted}/{self.max_attempts})"


@dataclass(slots=True)
class AttemptEnd:
    """How an attempt ended. ``error`` is None on success."""

    job: Job
    error: str | None
    #: Seconds the handler ran (as the worker measured it; for a worker that ended with
    #: the job, as the pool saw it).
    elapsed: float
    #: A short cause for logs: the exception type, "timeout", "worker died: signal 9"...
    #: Logs carry this always, and of the error text, which may quote payload data, only
    #: what ``--log-errors`` allows (`pgpool.logs.error_message`).
    cause: str = ""
    #: Cut off by this host's shutdown (its grace period ran out), or killed with a job whose
    #: lease was lost (`pgpool.host.pool.KILLED_WITH_LOST`): not by the job itself.
    interrupted: bool = False
    #: What its handler asked for instead of a plain failure (``error`` is set then too):
    #: "snooze" (run again in ``delay`` seconds, not counted), "discard" or "cancel"
    #: (dead-letter it now, with that reason), "final" (a failure no retry would change:
    #: one its handler's `pgpool.Retry` does not retry, a payload that does not fit its
    #: type, a kept result that cannot be stored; dead-letter it now), "handback" (it
    #: stopped at a checkpoint, `pgpool.Interrupted`: ready again now, not counted). None:
    #: a plain outcome.
    verdict: Verdict | None = None
    delay: float = 0.0
    #: A success's returned value, as JSON text (None: it returned None), or why it cannot
    #: be stored (``result_error``); and its follow-ups (`pgpool.worker.followups.FollowUps`).
    result: bytes | None = None
    result_error: str | None = None
    follow: FollowUpsWire | None = None

    @classmethod
    def of(cls, job: Job,
           message: Done | Failed | Snoozed | Ended | Finished | HandedBack) -> AttemptEnd:
        """The outcome of ``job`` a worker's message reports."""
        match message:
            case Finished():
                return cls(job, None, message.elapsed, result=message.result,
                           result_error=message.result_error, follow=message.follow)
            case Failed():
                return cls(job, message.error, message.elapsed, cause=message.cause)
            case Snoozed():
                return cls(job, f"snoozed for {message.seconds:g}s", message.elapsed,
                           cause="Snooze", verdict="snooze", delay=message.seconds)
            case Ended():
                return cls(job, message.error, message.elapsed, cause=message.cause,
                           verdict=message.verdict)
            case HandedBack():
                return cls(job, "handed back at its checkpoint: its host was stopping",
                           message.elapsed, cause="Interrupted", verdict="handback")
        return cls(job, None, message.elapsed)
