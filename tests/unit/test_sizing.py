"""``--batch auto``: the batch the throughput formula asks for, and how it moves."""

from __future__ import annotations

import pytest

from pgpool.host.sizing import (
    CLAIM_SHARE,
    MAX_BATCH,
    MIN_WORK,
    SHARED_MAX_BATCH,
    BatchSizer,
    batch_for,
)


def test_short_jobs_get_big_batches_long_jobs_small_ones() -> None:
    # 2 workers, 2 ms claims: 5 ms jobs need 40 per claim to bring each worker 0.1 s of
    # work (8 would keep the claim loop at 10% of the time); 1 s jobs need one; 10 us
    # jobs would need 20,000 and get the maximum.
    assert batch_for(2, 0.002, 0.005) == 40
    assert batch_for(2, 0.002, 1.0) == 1
    assert batch_for(2, 0.002, 0.00001) == MAX_BATCH
    # A slow claim round trip asks for more than the least work: 16 workers, 20 ms.
    assert batch_for(16, 0.020, 0.005) == 640


@pytest.mark.parametrize(("procs", "rtt", "job"), [(1, 0.001, 0.0001), (8, 0.003, 0.002),
                                                   (64, 0.0005, 0.05)])
def test_the_batch_keeps_the_claim_loop_within_its_share(procs: int, rtt: float,
                                                         job: float) -> None:
    # The claim loop waits rtt for every batch, which the workers take
    # batch * job / procs to run: that share is at most CLAIM_SHARE, and one job less
    # would exceed it (the batch is the smallest that fits).
    batch = batch_for(procs, rtt, job, min_work=0)
    assert rtt / (batch * job / procs) <= CLAIM_SHARE + 1e-9
    if batch > 1:
        assert rtt / ((batch - 1) * job / procs) > CLAIM_SHARE


@pytest.mark.parametrize(("procs", "job"), [(2, 0.005), (16, 0.005), (4, 0.03)])
def test_a_claim_brings_each_worker_the_least_work(procs: int, job: float) -> None:
    # With fast claims (1 ms), the least work decides: each worker gets MIN_WORK seconds
    # of jobs from a batch, and one job less would give it less; so a host makes at most
    # 1 / MIN_WORK claims a second for it, whatever its workers.
    batch = batch_for(procs, 0.001, job)
    assert batch * job / procs >= MIN_WORK - 1e-9
    assert (batch - 1) * job / procs < MIN_WORK
    assert (procs / job) / batch <= 1 / MIN_WORK + 1e-9  # claims per second


def test_before_any_job_finished_one_job_per_worker() -> None:
    assert batch_for(4, 0.002, 0.0) == 4
    assert BatchSizer(6).batch == 6


def test_the_sizer_grows_by_at_most_double_and_shrinks_at_once() -> None:
    sizer = BatchSizer(2)
    seen = [sizer.update(0.002, 0.00001) for _ in range(12)]
    assert seen[:5] == [4, 8, 16, 32, 64]
    assert seen[-1] == MAX_BATCH
    assert sizer.update(0.002, 1.0) == 1  # jobs turned long: stop hoarding now


def test_the_maximum_bounds_the_batch() -> None:
    sizer = BatchSizer(2, maximum=100)
    for _ in range(20):
        sizer.update(0.002, 0.00001)
    assert sizer.batch == 100


def test_a_host_of_several_kinds_is_bounded_by_the_shared_maximum() -> None:
    sizer = BatchSizer(2)
    for _ in range(20):
        sizer.update(0.002, 0.00001, shared=True)
    assert sizer.batch == SHARED_MAX_BATCH
    # Long jobs ask for less than the bound: the formula's batch, as for one kind.
    assert sizer.update(0.002, 0.005, shared=True) == sizer.update(0.002, 0.005) == 40
