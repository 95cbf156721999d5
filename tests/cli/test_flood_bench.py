"""``bench/flood.py --serve-flood``, ``bench/notified_drain.py`` and
``bench/burst_after_idle.py``: real runs, small, that
print their figures and leave no scratch schema behind.

No timing assertions: only that the figures are there and sane.
"""

from __future__ import annotations

import re

import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, run_bench_script


@pytest.mark.soak  # a host per depth, draining a flood: `make soak-test`
def test_flood_measures_a_host_that_drains_the_flood_itself(dsn: str, db: psycopg.Connection
                                                             ) -> None:
    done = run_bench_script("flood.py", dsn, "--quick", "--serve-flood", "--batch", "20")
    assert done.returncode == 0, done.stderr
    assert "this host drains it" in done.stdout
    rows = re.findall(r"^\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", done.stdout, re.M)
    assert [depth for depth, *_ in rows] == ["0", "2,000", "20,000"]
    assert all(0 < float(p50) <= float(p99) < 10_000 for _, p50, p99, _ in rows)
    assert db.execute(BENCH_SCHEMAS).fetchall() == []


@pytest.mark.soak  # a host draining while a producer enqueues: `make soak-test`
def test_notified_drain_reports_the_drain_and_the_other_write_transactions(dsn: str,
                                                                db: psycopg.Connection) -> None:
    done = run_bench_script("notified_drain.py", dsn, "--jobs", "3000", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    (rate, writes), = re.findall(
        r"^round 1: ([\d,]+) jobs/s, ([\d,]+) other write transactions/s", done.stdout, re.M)
    assert int(rate.replace(",", "")) > 0 and int(writes.replace(",", "")) > 0
    assert db.execute(BENCH_SCHEMAS).fetchall() == []


def test_notified_drain_refuses_a_bad_option_in_one_line(dsn: str) -> None:
    done = run_bench_script("notified_drain.py", dsn, "--jobs", "10")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "notified_drain.py: error: --jobs must be at least 1000, --rounds at least 1, "
        "--every-ms above 0")


@pytest.mark.soak  # a host that idles, then drains a burst: `make soak-test`
def test_burst_after_idle_reports_the_drain(dsn: str, db: psycopg.Connection) -> None:
    done = run_bench_script("burst_after_idle.py", dsn, "--jobs", "3000", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    (rate, _), = re.findall(
        r"^round 1: ([\d,]+) jobs/s, autovacuum analyzed the table during the drain: "
        r"(yes|no)", done.stdout, re.M)
    assert int(rate.replace(",", "")) > 0
    assert db.execute(BENCH_SCHEMAS).fetchall() == []


def test_burst_after_idle_refuses_a_bad_option_in_one_line(dsn: str) -> None:
    done = run_bench_script("burst_after_idle.py", dsn, "--rounds", "0")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "burst_after_idle.py: error: --jobs must be at least 1000, --rounds at least 1")
