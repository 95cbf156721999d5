"""Soft timeouts on a real host: `pgpool.SoftTimeout` reaches a handler at its
``soft_timeout``, in a pure-Python loop and in ``time.sleep``, well before its hard
timeout. (How close to S it comes is measured by bench/long_jobs.py, not asserted here.)"""

from __future__ import annotations

import pytest
from processes import start_pgpool
from waits import wait_until

import pgpool


@pytest.mark.parametrize("payload", [{}, {"sleep": True}], ids=["python-loop", "sleep"])
def test_soft_timeout_is_raised_in_the_handler_before_its_hard_timeout(db, dsn, payload):
    host = start_pgpool(dsn, "run", "--handlers", "longjobs", "--procs", "1")
    host.event("started")
    job_id = pgpool.enqueue(db, "soft_spin", payload)
    wait_until(lambda: pgpool.job_status(db, job_id).state == "done", "the job returned",
               timeout=30)
    result = pgpool.job_status(db, job_id).result
    assert 1.0 <= result["after"] < 20
    assert result["message"] == "handler 'soft_spin' ran past its soft_timeout of 1s"
    assert host.stop() == 0


def test_a_soft_timeout_not_below_the_timeout_is_refused():
    with pytest.raises(pgpool.HandlerError, match="soft_timeout must be a positive number of "
                                                  r"seconds below its timeout \(5\), got 5"):
        pgpool.handler("too_soft", timeout=5, soft_timeout=5)
