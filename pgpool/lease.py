"""The lease: how long a claim holds a job, and every interval derived from it.

A claimed job belongs to its dispatcher until ``lease_until``. The dispatcher keeps that in
the future with heartbeats, and everything else about time in the fleet follows from the
lease's length, so it is all derived here, in one place:

- heartbeats, and the host registry's beats, every third of a lease: two can fail before a
  lease runs out;
- claiming stops once half a lease passed without a heartbeat (`at_risk_after`);
- held jobs are given up at 0.8 of a lease (`abandon_after`), before the server-side lease
  can expire and the reaper can hand them to another host;
- the reaper runs every third of a lease too (at most once a second);
- a host row is stale, and pruned, after `STALE_AFTER_LEASES` of that host's own leases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: A host is stale, and pruned, once it has not beaten for this many of its leases: it
#: beats every third of a lease, so that is nine missed beats.
STALE_AFTER_LEASES: Final = 3
#: Fraction of a lease without a successful heartbeat after which held jobs are given up.
ABANDON_AT: Final = 0.8
#: Seconds between heartbeat attempts after a failure (at most a beat interval).
RETRY_AFTER_FAILURE: Final = 0.5


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease length in seconds and the intervals that follow from it."""

    seconds: float

    @property
    def beat_interval(self) -> float:
        """Between heartbeats (and host registry beats), and their time limit."""
        return self.seconds / 3

    @property
    def retry_interval(self) -> float:
        """Between heartbeat attempts after one failed."""
        return min(RETRY_AFTER_FAILURE, self.beat_interval)

    @property
    def at_risk_after(self) -> float:
        """Without a heartbeat for this long, stop claiming: the database may be gone."""
        return self.seconds / 2

    @property
    def abandon_after(self) -> float:
        """Without a heartbeat for this long, give up every held job."""
        return ABANDON_AT * self.seconds

    @property
    def reaper_interval(self) -> float:
        """Between reaper passes."""
        return max(1.0, self.seconds / 3)
