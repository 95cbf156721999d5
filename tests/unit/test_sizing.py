"""``--batch auto``: the batch the throughput formula asks for, and how it moves."""

from __future__ import annotations

import pytest

from pgpool.host.sizing import CLAIM_SHARE, MAX_BATCH, BatchSizer, batch_for


def test_short_jobs_get_big_batches_long_jobs_small_ones() -> None:
    # 2 workers, 2 ms claims: 1 ms jobs need 40 per claim so the claim loop waits 10% of
    # the time; 1 s jobs need one; 10 us jobs would need 4,000 and get the maximum.
    assert batch_for(2, 0.002, 0.001) == 40
    assert batch_for(2, 0.002, 1.0) == 1
    assert batch_for(2, 0.002, 0.00001) == MAX_BATCH
    assert batch_for(16, 0.002, 0.005) == 64


@pytest.mark.parametrize(("procs", "rtt", "job"), [(1, 0.001, 0.0001), (8, 0.003, 0.002),
                                                   (64, 0.0005, 0.05)])
def test_the_batch_keeps_the_claim_loop_within_its_share(procs: int, rtt: float,
                                                         job: float) -> None:
    # The claim loop waits rtt for every batch, which the workers take
    # batch * job / procs to run: that share is at most CLAIM_SHARE, and one job less
    # would exceed it (the batch is the smallest that fits).
    batch = batch_for(procs, rtt, job)
    assert rtt / (batch * job / procs) <= CLAIM_SHARE + 1e-9
    if batch > 1:
        assert rtt / ((batch - 1) * job / procs) > CLAIM_SHARE


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
