"""When a failed attempt of a job runs again: capped exponential backoff with jitter, and
which attempts are not counted against ``max_attempts``.

Worker processes import this module (through `pgpool.config`): it stays free of psycopg and
asyncio. The loops that retry the database itself are `pgpool.outage`'s."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: How many attempts of one job may go uncounted against its ``max_attempts``: attempts cut
#: off by a dispatcher's shutdown (its grace period ran out) and attempts whose host died
#: before they started. Bounded, so a job that always outlives the grace period cannot loop
#: through deploys forever: past the bound, such attempts count like any other. Claims handed
#: back unstarted are never counted, but they share the counter (``interruptions``), so
#: they use up this bound too.
FREE_INTERRUPTIONS = 3


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
