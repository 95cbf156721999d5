"""When a failed attempt runs again: capped exponential backoff with jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass


def backoff(failures: int, base: float, cap: float) -> float:
    """Seconds to wait before retrying the database after ``failures`` failures in a row:
    doubling from ``base``, capped at ``cap`` (no jitter: one process's own loop)."""
    return min(cap, base * 2.0 ** min(failures, 16))


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
