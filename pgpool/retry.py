"""When a failed attempt of a job runs again, which failures are not retried, and what a
handler can say about its job by raising a control exception.

`Retry` is a retry schedule: capped exponential backoff with or without jitter, the number
of attempts, and which exceptions are retried (``on``) or never retried (``never``). The
dispatcher's default is ``Retry()``; a handler may give its own
(``@pgpool.handler(kind, retry=pgpool.Retry(...))``). The worker, which holds the
exception, classifies it (`Retry.retries`); the dispatcher computes the delay (`Retry.delay`).

The control exceptions (`Snooze`, `Discard`, `Cancel`) are not failures: the worker reports
them as what they ask for, and the dispatcher writes that.

Worker processes import this module (through `pgpool.registry`): it stays free of psycopg
and asyncio. The loops that retry the database itself are `pgpool.db.outage`'s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from .errors import HandlerError

# The longest delay of a retry or a snooze is an enqueue delay's: 100 years.
from .job import MAX_DELAY_SECONDS

#: How many attempts of one job may go uncounted against its ``max_attempts``: attempts cut
#: off by a dispatcher's shutdown (its grace period ran out) and attempts whose host died
#: before they started. Bounded, so a job that always outlives the grace period cannot loop
#: through deploys forever: past the bound, such attempts count like any other. Claims handed
#: back unstarted are never counted, but they share the counter (``interruptions``), so
#: they use up this bound too.
FREE_INTERRUPTIONS = 3
#: How many times one job may snooze (`Snooze`) without using an attempt; a snooze past
#: that counts as a failed attempt, so a job that always snoozes still ends.
MAX_SNOOZES: Final = 100
#: Longest reason kept from a `Discard` or `Cancel` (as a failed attempt's error).
MAX_REASON_CHARS: Final = 4000


#: What `Retry`'s ``on`` and ``never`` take: an exception type or a tuple of them (stored
#: as a tuple).
ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...]


@dataclass(frozen=True, slots=True)
class Retry:
    """A retry schedule: ``attempts`` attempts at most (the handler's ``max_attempts``,
    which a producer's ``max_attempts`` at enqueue overrides; None: the handler's
    ``max_attempts=``, else 20), the n-th failure retried after ``base * 2**(n-1)`` seconds
    capped at ``cap``, with "equal jitter" unless ``jitter`` is False.

    With jitter, half of the delay is fixed and half is random, so retries of jobs that
    failed together (a database blip, a downstream outage) spread out instead of returning
    as one wave, while no retry comes sooner than half its nominal delay. Without it, the
    delay is exactly the nominal one.

    ``never``: exception types (a type or a tuple of types; subclasses count) that
    dead-letter the job at once, whatever attempts it has left. ``on``: when given, only
    exceptions of these types are retried; any other dead-letters the job at once. Both
    apply to what the handler raises; a timeout or a crashed worker is always retried.

    Every field is checked when it is built: a bad value raises `HandlerError`.
    """

    attempts: int | None = None
    base: float = 1.0
    cap: float = 600.0
    jitter: bool = True
    on: ExceptionTypes = ()
    never: ExceptionTypes = ()

    def __post_init__(self) -> None:
        if self.attempts is not None and (not isinstance(self.attempts, int)
                                          or isinstance(self.attempts, bool)
                                          or self.attempts < 1):
            raise HandlerError(f"pgpool.Retry: attempts must be a positive integer or None, "
                               f"got {self.attempts!r}")
        for what in ("base", "cap"):
            value = getattr(self, what)
            if (not isinstance(value, int | float) or isinstance(value, bool)
                    or not math.isfinite(value) or not 0 < value <= MAX_DELAY_SECONDS):
                raise HandlerError(f"pgpool.Retry: {what} must be a number of seconds above 0 "
                                   f"and at most {MAX_DELAY_SECONDS:,} (100 years), got "
                                   f"{value!r}")
        if self.cap < self.base:
            raise HandlerError(f"pgpool.Retry: cap ({self.cap!r}) is below base "
                               f"({self.base!r}): the cap must be at least the first delay")
        if not isinstance(self.jitter, bool):
            raise HandlerError(f"pgpool.Retry: jitter must be True or False, got "
                               f"{self.jitter!r}")
        object.__setattr__(self, "base", float(self.base))
        object.__setattr__(self, "cap", float(self.cap))
        on, never = _exception_types("on", self.on), _exception_types("never", self.never)
        object.__setattr__(self, "on", on)
        object.__setattr__(self, "never", never)
        both = [t.__name__ for t in on if t in never]
        if both:
            raise HandlerError(f"pgpool.Retry: {', '.join(both)} is in both on and never: "
                               "keep it in one of them")

    def delay(self, attempt: int) -> float:
        """Seconds until the job runs again after its ``attempt``-th failure (1-based)."""
        nominal = min(self.cap, self.base * 2.0 ** min(attempt - 1, 62))
        if not self.jitter:
            return nominal
        return nominal / 2 + random.uniform(0, nominal / 2)

    def retries(self, exc: BaseException) -> bool:
        """Whether a failure that raised ``exc`` may be retried (attempts left permitting):
        not an instance of a type in ``never``, and, when ``on`` is given, an instance of
        one of its types."""
        if self.never and isinstance(exc, self.never):
            return False
        return not self.on or isinstance(exc, self.on)


def _exception_types(what: str, value: object) -> tuple[type[BaseException], ...]:
    """``value`` (an exception type, or a tuple or a list of them) as a tuple; a
    `HandlerError` naming the culprit otherwise."""
    types = tuple(value) if isinstance(value, tuple | list) else (value,)
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise HandlerError(f"pgpool.Retry: {what} must be exception types (a type or a "
                               f"tuple of them), got {t!r}")
        if issubclass(t, Control):
            raise HandlerError(f"pgpool.Retry: {what} names {t.__name__}, which is not a "
                               "failure (it is never retried nor counted): leave it out")
    return types


class Control(Exception):
    """Base of the exceptions a handler raises to say what becomes of its job instead of
    failing the attempt: `Snooze`, `Discard`, `Cancel`."""


class Snooze(Control):
    """Raised by a handler: run the job again in ``seconds`` (a number or a timedelta,
    above 0 and at most 100 years), without using one of its attempts.

    The job is ``scheduled`` again with ``run_at`` moved on; `pgpool.current_job`'s
    ``attempt`` stays the same on its next run. A job snoozes at most `MAX_SNOOZES` times
    (``pgpool_jobs.snoozes``); a snooze past that fails the attempt like an error. A bad
    ``seconds`` raises `HandlerError` (which fails the attempt, naming it).
    """

    def __init__(self, seconds: float | timedelta) -> None:
        value = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if (not isinstance(value, int | float) or isinstance(value, bool)
                or not math.isfinite(value) or not 0 < value <= MAX_DELAY_SECONDS):
            raise HandlerError(f"pgpool.Snooze: seconds must be a number or a timedelta above "
                               f"0 and at most {MAX_DELAY_SECONDS:,} (100 years), got "
                               f"{seconds!r}")
        self.seconds = float(value)
        super().__init__(f"snoozed for {self.seconds:g}s")


class _Ending(Control):
    """A control exception that ends the job now, into ``pgpool_dead``, with ``reason`` as
    its ``last_error``."""

    def __init__(self, reason: str) -> None:
        if not isinstance(reason, str) or not reason.strip():
            raise HandlerError(f"pgpool.{type(self).__name__}: reason must be a non-empty "
                               f"string saying why, got {reason!r:.60}")
        self.reason = reason
        super().__init__(reason)


class Discard(_Ending):
    """Raised by a handler: the job cannot succeed (a payload it must refuse, say): it
    moves to ``pgpool_dead`` now, whatever attempts it has left, with ``reason =
    'discarded'`` and ``last_error`` the given ``reason``."""


class Cancel(_Ending):
    """Raised by a handler: the job is no longer wanted: it moves to ``pgpool_dead`` now,
    as an operator's ``pgpool cancel`` would move it, with ``reason = 'cancelled'`` and
    ``last_error`` the given ``reason``."""


class Interrupted(Control):
    """Raised by `current_job().checkpoint() <pgpool.worker.followups.RunningJob.checkpoint>`
    once the state is stored, when the job should stop there: its host is stopping (a
    deploy's SIGTERM: ``current_job().stopping``), or this attempt no longer holds the job
    (its lease was lost: then nothing was stored). Let it propagate: the job is handed
    back, ready at once, without using one of its attempts, and its next attempt resumes
    from ``current_job().checkpoint_state``."""


class SoftTimeout(Exception):
    """Raised in a handler when its attempt has run for its ``soft_timeout``
    (``@pgpool.handler(kind, timeout=H, soft_timeout=S)``): checkpoint and clean up before
    the hard timeout ends the worker at H. Left to propagate, it fails the attempt like
    any error (retried as its handler's `Retry` says); its next attempt may resume from
    the checkpoint (``current_job().checkpoint_state``)."""
