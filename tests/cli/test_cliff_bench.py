"""``bench/cliff.py``, the second big batch: a real run at a small size drains every round
and reports each figure; a dispatcher that fails ends the run with a one-line error.

No timing assertions: only that the figures are there and sane.
"""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, bench_script_error, run_bench_script


def cliff(dsn: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_bench_script("cliff.py", dsn, *args, **env)


@pytest.mark.soak  # a drain of thousands of jobs: `make soak-test`
def test_cliff_drains_every_round_and_reports_its_figures(dsn: str, db: psycopg.Connection
                                                          ) -> None:
    # Batch 1: a tenth of the jobs takes 200 claims, far more than one 20 ms poll even when
    # a loaded machine delays the polls (with batch 5, 40 claims fitted in one, once).
    done = cliff(dsn, "--jobs", "2000", "--rounds", "2", "--batch", "1", "--interval", "0.5",
                 "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["options"]["max_claims_per_sec"] == 10_000_000  # never throttled
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["jobs"] == 2000
        intervals = r["intervals"]
        assert intervals[-1]["jobs_left"] == 0  # drained
        assert intervals[-1]["end_s"] == r["seconds"] > 0
        assert r["mean_jobs_per_s"] == 2000 / r["seconds"]
        # Jobs left only go down, and every interval's rate matches its counts.
        lefts = [2000] + [i["jobs_left"] for i in intervals]
        assert lefts == sorted(lefts, reverse=True)
        assert all(i["jobs_per_s"] >= 0 for i in intervals)
        assert r["first_tenth_jobs_per_s"] > 0 and r["last_tenth_jobs_per_s"] > 0
        assert r["last_to_first_tenth"] == (r["last_tenth_jobs_per_s"]
                                            / r["first_tenth_jobs_per_s"])
        assert 0 < r["slowest_to_first_interval"] <= 1
        assert r["startup_seconds"] > 0 and r["load_seconds"] > 0
        table = r["table"]
        assert set(table) == {"n_dead_tup", "last_autovacuum", "last_autovacuum_age_s",
                              "autovacuum_count"}
        assert table["n_dead_tup"] >= 0 and table["autovacuum_count"] >= 0
    assert rounds[0]["mean_to_round_1"] == 1
    assert rounds[1]["mean_to_round_1"] == (rounds[1]["mean_jobs_per_s"]
                                            / rounds[0]["mean_jobs_per_s"])
    assert db.execute(BENCH_SCHEMAS).fetchall() == []  # its scratch schema is gone


@pytest.mark.soak  # a drain of thousands of jobs: `make soak-test`
def test_cliff_prints_its_table(dsn: str) -> None:
    done = cliff(dsn, "--jobs", "500", "--rounds", "2", "--batch", "5", "--interval", "0.5")
    assert done.returncode == 0, done.stderr
    for label in ("round 1: drained in", "round 2: drained in", "per 0.5s interval (jobs/s)",
                  "first 10% rate", "last 10% rate", "last/first", "slowest interval",
                  "n_dead_tup", "last_autovacuum", "autovacuum_count",
                  "round 2 / round 1 mean rate"):
        assert label in done.stdout, label


def test_a_failing_dispatcher_ends_the_run_with_one_line(dsn: str, db: psycopg.Connection
                                                         ) -> None:
    # `pgpool run` reads PGPOOL_KINDS: a kind no handler registers makes it exit at once.
    error = bench_script_error(
        cliff(dsn, "--jobs", "100", "--rounds", "1", PGPOOL_KINDS="nope"), db)
    assert error.startswith("cliff: error: `pgpool run` exited with status 2 before it "
                            "claimed a job: "), error
