"""``bench/limits.py``: a real run at a small size drains every variant, holds the rate it
measures the overshoot of and the rate per tenant, and reports each figure; its scratch
schema is gone after it.

No timing assertions: only that the figures are there and sane.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, run_bench_script


@pytest.mark.soak  # three drains and two rated runs with real hosts: `make soak-test`
def test_limits_drains_each_variant_and_reports_the_limits_held(
        dsn: str, db: psycopg.Connection) -> None:
    done = run_bench_script("limits.py", dsn, "--jobs", "1000", "--rounds", "1",
                            "--variants", "unlimited,concurrency,tenant_rate",
                            "--rated-jobs", "100", "--tenant-count", "2", "--tenant-rate",
                            "10", "--hog", "4", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["command"] == (
        "python bench/limits.py --jobs 1000 --procs 2 --batch 50 --rounds 1 --variants "
        "unlimited,concurrency,tenant_rate --tenants 0 --rate 200 --rated-jobs 100 "
        "--tenant-count 2 --tenant-rate 10 --hog 4")
    assert list(report["drains"]) == ["unlimited", "concurrency", "tenant_rate"]
    for (drain,) in report["drains"].values():  # one round each
        assert drain["jobs_per_s"] > 0 and drain["cpu_us_per_job"] > 0
    # 100 jobs at 200 a second: all in the first window, which the rate allows.
    overshoot = report["overshoot"]
    assert (overshoot["jobs"], overshoot["ideal_seconds"]) == (100, 0)
    assert 0 < overshoot["most_in_a_second"] <= 200
    per_tenant = report["per_tenant"]
    assert per_tenant["tenants"] == 2 and per_tenant["largest_excess"] <= 0
    assert 0 < per_tenant["served_while_waiting"] <= 1
    assert db.execute(BENCH_SCHEMAS).fetchall() == []
