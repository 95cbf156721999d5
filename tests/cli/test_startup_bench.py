"""``bench/startup.py``: a real run of two rounds times a host's start-up and a crashed
worker's replacement (with no spare worker and with one), and leaves no scratch schema
behind.

No timing assertions: only that the figures are there and sane.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, run_bench_script


@pytest.mark.soak  # four hosts started one after another: `make soak-test`
def test_startup_times_the_first_job_and_a_replacement(dsn: str, db: psycopg.Connection
                                                        ) -> None:
    done = run_bench_script("startup.py", dsn, "--rounds", "2", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["rounds"], figures["procs"]) == (2, 2)
    assert sorted(figures["replacement_s"]) == ["0", "1"]  # without a spare, and with one
    for f, target in ((figures["startup_s"], 0.25), *(
            (f, 0.05) for f in figures["replacement_s"].values())):
        # Wall-clock times of real processes: above zero, and below the host's timeout.
        assert 0 < f["median"] <= f["max"] < 120
        assert f["target"] == target
    assert db.execute(BENCH_SCHEMAS).fetchall() == []


def test_startup_refuses_a_bad_option_in_one_line(dsn: str) -> None:
    done = run_bench_script("startup.py", dsn, "--rounds", "0")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "startup.py: error: --rounds and --procs must be at least 1")
