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
- the dispatcher's statements wait at most `lock_timeout` for a lock and run at most
  `statement_timeout` (pgpool.host.claimer sets both on each pooled connection, unless the
  DSN, role or database sets them): a heartbeat fails well before its beat interval is
  over, and an ack held up by another transaction's lock on one row gives up and
  isolates that row (pgpool.host.isolate) instead of waiting for as long as the lock is held;
- a host row is stale, and pruned, after `sql.fleet.STALE_AFTER_LEASES` of its own leases;
- each worker is fenced: the kernel ends it at its running job's `deadline` (pgpool.worker.fence),
  a `FENCE_MARGIN` share of a lease before the lease can run out on the server, unless an
  extension (after a heartbeat) arrived in time. A job is handed to a worker only with at
  least `MIN_LEFT_TO_START` of a lease left before that deadline.

Deadlines are CLOCK_MONOTONIC times (`time.monotonic()`), one clock for every process on
the host. They are counted from the moment a claim or heartbeat statement was sent, which
is no later than the server's ``now()`` that its ``lease_until = now() + lease`` used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: Fraction of a lease without a successful heartbeat after which held jobs are given up.
ABANDON_AT: Final = 0.8
#: Seconds between heartbeat attempts after a failure (at most a beat interval).
RETRY_AFTER_FAILURE: Final = 0.5
#: Share of a lease a worker's deadline keeps short of the server-side lease: room for the
#: kernel to act on the timer, and for the rate of the host's clock and the server's to
#: differ. Below 1 - `ABANDON_AT`, so a dispatcher that can act gives jobs up first.
FENCE_MARGIN: Final = 0.1
#: Share of a lease that must be left before a job's deadline for it to be sent to a
#: worker: a claim that took longer than the rest of the lease (it waited behind a lock, or
#: the dispatcher stalled) hands its jobs back instead of starting them.
MIN_LEFT_TO_START: Final = 0.25
#: Share of a lease the dispatcher's statements may wait for one row lock, and its bounds
#: in seconds: long enough for a short application transaction that locks a job row (an
#: INSERT of a row referencing it takes FOR KEY SHARE) to commit, far shorter than a beat.
LOCK_TIMEOUT_SHARE: Final = 1 / 30
LOCK_TIMEOUT_BOUNDS: Final = (0.1, 5.0)
#: Share of a lease one statement may run, and its bounds in seconds: a heartbeat that
#: cannot finish within half a beat interval fails on the server, and is retried, instead
#: of running on behind a lock or a stalled server while the lease runs out. Acks and
#: claims take milliseconds; the floor leaves a loaded server room with short leases.
STATEMENT_TIMEOUT_SHARE: Final = 1 / 6
STATEMENT_TIMEOUT_BOUNDS: Final = (0.5, 30.0)


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

    @property
    def lock_timeout(self) -> float:
        """Seconds a statement of the dispatcher waits for a row lock before it fails."""
        low, high = LOCK_TIMEOUT_BOUNDS
        return min(high, max(low, LOCK_TIMEOUT_SHARE * self.seconds))

    @property
    def statement_timeout(self) -> float:
        """Seconds a statement of the dispatcher may run before the server cancels it."""
        low, high = STATEMENT_TIMEOUT_BOUNDS
        return min(high, max(low, STATEMENT_TIMEOUT_SHARE * self.seconds))

    def deadline(self, sent_at: float) -> float:
        """The worker deadline of a lease granted (or extended) by a statement sent at
        ``sent_at`` (`time.monotonic()`): the server's lease ends no sooner than
        ``sent_at + seconds``; the worker stops `FENCE_MARGIN` of a lease before that."""
        return sent_at + (1 - FENCE_MARGIN) * self.seconds

    @property
    def min_left_to_start(self) -> float:
        """Seconds that must be left before a job's deadline for a worker to start it."""
        return MIN_LEFT_TO_START * self.seconds
