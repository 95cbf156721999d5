"""When a failed attempt runs again: capped exponential backoff with jitter."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

from .errors import first_line
from .logs import event

#: How many attempts of one job may go uncounted against its ``max_attempts``: attempts cut
#: off by a dispatcher's shutdown (its grace period ran out) and attempts whose host died
#: before they started. Bounded, so a job that always outlives the grace period cannot loop
#: through deploys forever: past the bound, such attempts count like any other. Claims handed
#: back unstarted are never counted, but they share the counter (``interruptions``), so
#: they use up this bound too.
FREE_INTERRUPTIONS = 3


def backoff(failures: int, base: float, cap: float) -> float:
    """Seconds to wait before retrying the database after ``failures`` failures in a row:
    doubling from ``base``, capped at ``cap`` (no jitter: one process's own loop)."""
    return min(cap, base * 2.0 ** min(failures, 16))


class Failures:
    """A run of failures of one repeated database activity, logged as state changes: once
    when it starts failing and once, with a summary, when it works again, instead of once
    per retry (a 10 s outage would otherwise log a line per retry of every part)."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log = logger
        self.what = what
        #: Failures in a row, and when the first of them happened (monotonic seconds).
        self.count = 0
        self._since = 0.0

    def failed(self, exc: BaseException) -> None:
        """Record a failure; log it if it is the first of a run."""
        if self.count == 0:
            self._since = time.monotonic()
            event(self._log, logging.WARNING, "failing",
                  "%s failing (%s: %s); retrying until it works", self.what,
                  type(exc).__name__, first_line(exc), what=self.what,
                  error=type(exc).__name__)
        self.count += 1

    def succeeded(self) -> None:
        """Record a success; after a run of failures, log how long it lasted."""
        if self.count:
            seconds = time.monotonic() - self._since
            event(self._log, logging.WARNING, "recovered",
                  "%s works again after %d failures in %.1fs", self.what, self.count,
                  seconds, what=self.what, failures=self.count, seconds=round(seconds, 3))
            self.count = 0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``base * 2**(attempt-1)`` seconds, capped at ``cap``, with "equal jitter".

    Half of the delay is fixed and half is random, so retries of jobs that failed together
    (a database blip, a downstream outage) spread out instead of returning as one wave,
    while no retry comes sooner than half its nominal delay.
    """

    base: float = 1.0
    cap: float = 600.0

    def delay(self, attempt: int) -> float:
        nominal = min(self.cap, self.base * 2.0 ** min(attempt - 1, 62))
        return nominal / 2 + random.uniform(0, nominal / 2)
