"""``bench/limited_claim.py``: a real run at a small size claims every job once, each way
in turn, and reports each way's figures; its scratch schema is gone after it.

No timing assertions: only that the figures are there and sane.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, run_bench_script


@pytest.mark.soak  # a scratch schema, a ring of 64 rows, 48 claims: `make soak-test`
def test_limited_claim_claims_every_job_in_turns_and_reports_each_way(
        dsn: str, db: psycopg.Connection) -> None:
    done = run_bench_script("limited_claim.py", dsn, "--jobs", "1200", "--batch", "25",
                            "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["command"] == "python bench/limited_claim.py --jobs 1200 --batch 25"
    ways = report["ways"]
    assert list(ways) == ["plain", "concurrency", "rate", "granted", "concurrency_planned",
                          "rate_planned"]
    # In turns, 25 at a time, none limited: 200 each, in eight full claims (two left out).
    assert [w["jobs"] for w in ways.values()] == [200] * 6
    assert [w["claims"] for w in ways.values()] == [6] * 6
    for w in ways.values():
        assert w["median_ms"] > 0 and w["mean_ms"] > 0
        assert w["of_plain"] == w["median_ms"] / ways["plain"]["median_ms"]
    assert db.execute(BENCH_SCHEMAS).fetchall() == []
