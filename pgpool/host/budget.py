"""The fleet's claim budget: how the hosts share it, and the token bucket that holds one
host's share.

A single primary sustains roughly 10k claims/s (WAL and vacuum, not the claim query, are
the limit), so the whole fleet shares one budget of claims per second: the one set with
``pgpool budget set`` (a row in ``pgpool_fleet``), else the host's ``--max-claims-per-sec``
(default 10,000). The hosts share it by demand, at every registry beat (`pgpool.host.parts.hosts`):

- A host's **demand** is what it asks for: unbounded if its budget held it back (it was
  throttled while jobs were known to wait) at any time since its last beat, else
  `DEMAND_HEADROOM` times the claims per second it made, and never less than the floor. A
  host that has just started asks for the floor.
- The **fair shares** (`fair_shares`) give every counted host its demand, scaled up in
  proportion when the demands add up to less than the budget (so each has room to grow),
  else max-min fair: the hosts that want more split equally what the others leave. The
  fair shares add up to the budget.
- A host takes its fair share only out of what the others' published shares leave free
  (`share`): one host grows only once the others have shrunk, so the shares in force never
  add up to more than the budget. Beats are serialised by a lock, so two hosts never grow
  into the same room. The exception is the **floor** (`floor`: 1% of the budget, less in
  a fleet of over ten hosts, so all floors together stay under 10%): a host always gets
  it, so a new or idle host can claim at once; until the others' next beats, each such
  host may put the fleet over the budget by its floor.
- A host counts while its row was beaten within `COUNTED_BEATS` of its beat intervals; a
  crashed host stops counting then, long before its row is pruned. A host applies its
  share until `GRANT_BEATS` beat intervals after it sent the beat that granted it, and
  falls back to its floor after that (it is cut off from the database, and the others
  will stop counting it).

A claim of ``n`` jobs spends ``n`` tokens; tokens refill at the share's rate, up to one
second's worth, so a host can claim in bursts but not above its share.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ..sql.fleet import COUNTED_LEASES
from .lease import Lease

#: The budget when neither ``pgpool budget set`` nor ``--max-claims-per-sec`` gives one.
DEFAULT_MAX_CLAIMS_PER_SEC: Final = 10_000.0
#: A host's floor: this share of the budget...
MIN_SHARE: Final = 0.01
#: ...but all the counted hosts' floors together at most this share.
FLOORS_AT_MOST: Final = 0.10
#: A host that was not throttled asks for this many times the claims per second it made.
DEMAND_HEADROOM: Final = 1.5
#: Another host's row counts for this many of its beat intervals after its last beat.
COUNTED_BEATS: Final = COUNTED_LEASES / Lease(1.0).beat_interval
#: A host's share holds for this many of its beat intervals after the beat that set it
#: was sent: less than `COUNTED_BEATS`, so it lapses before the others stop counting it.
GRANT_BEATS: Final = 1.5


@dataclass(frozen=True, slots=True)
class Peer:
    """Another counted host, as its row says at this beat."""

    demand: float  #: claims/s it asks for; math.inf when it wants more than it got
    share: float  #: the share it applies now


def floor(budget: float, hosts: int) -> float:
    """The share every one of ``hosts`` counted hosts gets whatever the others want."""
    return budget * min(MIN_SHARE, FLOORS_AT_MOST / max(1, hosts))


def demand(claims_per_sec: float | None, throttled: bool, floor_share: float) -> float:
    """What a host asks for: unbounded when throttled since its last beat, else headroom over
    the rate it claimed at (unknown at its first beat: then the floor)."""
    if throttled:
        return math.inf
    return max(floor_share, DEMAND_HEADROOM * (claims_per_sec or 0.0))


def fair_shares(budget: float, demands: Sequence[float]) -> list[float]:
    """Each demand's fair share of ``budget``; they add up to ``budget``.

    Demands that fit are scaled up in proportion; otherwise max-min fairness (water
    filling): every host gets its demand or the common level, whichever is less, with the
    level set so the shares add up to the budget.
    """
    total = sum(demands)
    if total <= budget:
        if total <= 0:
            return [budget / len(demands)] * len(demands)
        return [d * budget / total for d in demands]
    shares = [0.0] * len(demands)
    left, count = budget, len(demands)
    for i in sorted(range(len(demands)), key=lambda i: demands[i]):
        level = left / count
        shares[i] = min(demands[i], level)
        left -= shares[i]
        count -= 1
    return shares


def share(budget: float, own_demand: float, peers: Sequence[Peer]) -> tuple[float, float]:
    """(this host's share, its floor), given its demand and the other counted hosts.

    Its fair share, but no more than the others' shares leave free, and at least its floor
    (see the module docstring). Values from other rows are clamped to the budget, so a
    nonsensical row cannot take more than the whole of it.
    """
    own_floor = floor(budget, 1 + len(peers))
    fair = fair_shares(budget, [own_demand, *(p.demand for p in peers)])[0]
    taken = sum(min(budget, max(0.0, p.share)) for p in peers)
    return max(own_floor, min(fair, budget - taken)), own_floor


class ClaimBudget:
    """One host's token bucket, refilled at the share `grant` last set.

    Before the first grant, and once a grant has lapsed, the bucket refills at the floor.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``rate``: the floor to use until the first `grant`."""
        self._clock = clock
        self._granted = self._floor = rate
        self._until = -math.inf
        self._last = clock()
        self._tokens = self.burst
        #: Claims the budget held back since the start (the registry compares at each beat).
        self.throttles = 0
        #: Whether the last claim was held back: a loop may still be waiting for tokens, a
        #: wait that can outlast a beat interval.
        self.held_back = False

    def grant(self, rate: float, *, floor_rate: float, until: float) -> None:
        """Refill at ``rate`` until ``until`` (a ``clock`` time), then at ``floor_rate``."""
        self._refill()  # the tokens so far accrued at the old rate
        self._granted, self._floor, self._until = rate, floor_rate, until
        self._tokens = min(self._tokens, self.burst)

    @property
    def rate(self) -> float:
        """This host's share now, in claimed jobs per second."""
        return self._granted if self._clock() < self._until else self._floor

    @property
    def burst(self) -> float:
        return max(1.0, self.rate)

    def available(self) -> int:
        """Jobs this host may claim right now."""
        self._refill()
        return int(self._tokens + 1e-9)  # 0.05 s x 1000/s must make 50, not 49.999...

    def take(self, jobs: int, *, backlog: bool) -> bool:
        """Spend ``jobs`` tokens if there are that many, else nothing.

        ``backlog``: whether jobs are known to wait (the last claim came back full). Only
        then does a refusal count as the budget holding this host back (`throttles`,
        `held_back`): an idle host polling an empty queue wants nothing more.
        """
        refused = self.available() < jobs
        self.held_back = refused and backlog
        self.throttles += self.held_back
        if refused:
            return False
        self._tokens -= jobs
        return True

    def spend(self, jobs: int) -> None:
        """Spend ``jobs`` tokens (negative: give them back), whether there are or not."""
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
