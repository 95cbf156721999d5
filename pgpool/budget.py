"""The fleet's claim budget: a token bucket holding this host's share of claims per second.

A single primary sustains roughly 10k claims/s (WAL and vacuum, not the claim query, are
the limit), so the whole fleet shares ``--max-claims-per-sec`` (default 10,000). Each host
takes ``fleet rate / live hosts``, with the live-host count read from ``pgpool_hosts`` on
every registry beat. A claim of ``n`` jobs spends ``n`` tokens; tokens refill at the share's
rate, up to one second's worth, so a host can claim in bursts but not above its share.
Each host records its claims per second and the budget in ``pgpool_hosts`` at every beat;
``pgpool status`` sums the live hosts' rates against the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ClaimBudget:
    def __init__(self, fleet_rate: float, hosts: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``hosts()`` is the number of live hosts sharing ``fleet_rate`` (this one included)."""
        self.fleet_rate = fleet_rate
        self._hosts = hosts
        self._clock = clock
        self._last = clock()
        self._tokens = self.burst

    @property
    def rate(self) -> float:
        """This host's share, in claimed jobs per second."""
        return self.fleet_rate / max(1, self._hosts())

    @property
    def burst(self) -> float:
        return max(1.0, self.rate)

    def available(self) -> int:
        """Jobs this host may claim right now."""
        self._refill()
        return int(self._tokens + 1e-9)  # 0.05 s x 1000/s must make 50, not 49.999...

    def spend(self, jobs: int) -> None:
        self._refill()
        self._tokens -= jobs

    def wait_for(self, jobs: int) -> float:
        """Seconds until ``jobs`` tokens are available (0 if they are)."""
        self._refill()
        missing = min(jobs, self.burst) - self._tokens
        return max(0.0, missing / self.rate)

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
