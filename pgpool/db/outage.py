"""Outages of a repeated database activity: logged once when they start and once when they
end, and the pause before the next try (`backoff`).

Every loop that talks to the database for as long as the process lives (the dispatcher's
parts, its claim loops, the dashboard's listener) rides out an outage by trying again; this
module is what they share. A job's own retries are `pgpool.retry`'s.
"""

from __future__ import annotations

import logging
import time

from ..errors import first_line
from ..logs import event


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
