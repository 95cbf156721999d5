"""Batch sizing from the throughput formula (``--batch auto``).

One host's throughput is about ``procs * batch / (claim_rtt + batch * job_time)``: each
claim costs a round trip, and its batch then keeps the workers busy for
``batch * job_time / procs``. `batch_for` picks the smallest batch for which claiming takes
`CLAIM_SHARE` of that time (``claim_rtt`` out of every ``batch * job_time / procs``
seconds) and which brings each worker `MIN_WORK` seconds of work at least: big batches for
short jobs (the round trips would otherwise starve the workers, and each claim and its ack
flush cost the dispatcher and the database a transaction), small ones for long jobs (a host
should not hoard work that other hosts could start now).
The dispatcher's two claim loops then have room to spare: each may wait on a claim while
the other's batch is being run. `BatchSizer` feeds it the dispatcher's
moving averages and smooths the result. A host that serves several kinds and holds no job
of one of them keeps its batch at `SHARED_MAX_BATCH` at most: a job of that kind would get
a prompt claim, which must not wait behind a big claim's or ack's commit.
"""

from __future__ import annotations

import math
from typing import Final

#: The share of the time the claim loop may spend waiting on claims.
CLAIM_SHARE: Final = 0.1
#: The least work, in seconds, a claim brings each worker. Sized by `CLAIM_SHARE` alone, 5
#: ms jobs on 2 workers came 13 a claim: a claim and an ack flush every 34 ms, 0.16 write
#: transactions a job; with this, 40 a claim, 0.08 a job, and the dispatcher's CPU a job
#: about 30% lower (in turns, a real `pgpool run`). A host makes at most 1 / MIN_WORK
#: claims a second for it, whatever its workers, and holds at most about 4 x MIN_WORK of
#: work per worker (`pgpool.host.scheduler.capacity`); jobs of a second or more still
#: come one or two a claim.
MIN_WORK: Final = 0.1
#: Bounds of an automatic batch: one job, and a size whose claim stays a few milliseconds.
MIN_BATCH: Final = 1
MAX_BATCH: Final = 1000
#: The most an automatic batch takes on a host that serves more than one kind and holds
#: no job of one of them: a job of that kind gets a prompt claim (`pgpool.host.scheduler`),
#: which commits behind the host's own claims and acks, and a claim or an ack of 1,000
#: short jobs writes about half a megabyte of WAL, whose flush every commit after it waits
#: for. `python bench/flood.py --depths 0,200000 --serve-flood`, the p99 of
#: a sensitive kind's pickup against its unflooded p99, in turns: 5.1 to 5.7 at 1,000 a
#: claim, 1.6 to 2.4 at 100, 1.1 to 2.0 (median 1.3) at 50.
SHARED_MAX_BATCH: Final = 50
#: The most a batch may grow in one step: the averages behind it need a few samples.
MAX_GROWTH: Final = 2.0


def batch_for(procs: int, claim_rtt: float, job_seconds: float, *,
              claim_share: float = CLAIM_SHARE, min_work: float = MIN_WORK,
              maximum: int = MAX_BATCH) -> int:
    """The smallest batch for which the claim round trip ``claim_rtt`` is ``claim_share``
    of the time ``procs`` workers take to run the batch, and which brings each of them
    ``min_work`` seconds of jobs at least; within [1, ``maximum``].

    With no job time measured yet (``job_seconds`` <= 0) jobs may be long: one per worker.
    """
    if job_seconds <= 0:
        return max(MIN_BATCH, min(maximum, procs))
    # The time each worker must get from one batch, then the jobs that take that long.
    wanted = procs * max(claim_rtt / claim_share, min_work) / job_seconds
    return max(MIN_BATCH, min(maximum, math.ceil(wanted)))


class BatchSizer:
    """The current automatic batch size, re-derived after each claim.

    Shrinks at once (a long job time must stop hoarding now) and grows at most
    `MAX_GROWTH` times per claim (a few quick jobs should not swing it to the maximum).
    """

    def __init__(self, procs: int, *, maximum: int = MAX_BATCH) -> None:
        self.procs = procs
        self.maximum = maximum
        self.batch = batch_for(procs, 0.0, 0.0, maximum=maximum)

    def update(self, claim_rtt: float, job_seconds: float, *, shared: bool = False) -> int:
        """Re-derive the batch from the latest moving averages and return it; at most
        `SHARED_MAX_BATCH` if ``shared``: a kind the host serves may get a prompt claim."""
        maximum = min(self.maximum, SHARED_MAX_BATCH) if shared else self.maximum
        target = batch_for(self.procs, claim_rtt, job_seconds, maximum=maximum)
        self.batch = min(target, max(self.batch + 1, round(self.batch * MAX_GROWTH)))
        return self.batch
