"""``pgpool bench``: real runs at a small size, isolation from the user's jobs, bad options.

No timing assertions: only that every figure is there and sane, that the jobs drained, and
that the throwaway schema is gone while the user's own queue is untouched.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from conftest import run_pgpool
from test_user_errors import UNREACHABLE, assert_user_error

import pgpool

BENCH_SCHEMAS = "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgpool_bench_%'"


def test_bench_json_drains_in_its_own_schema(dsn: str, db: psycopg.Connection) -> None:
    mine = pgpool.enqueue(db, "user.kind", {"keep": True})
    done = run_pgpool(dsn, "bench", "--jobs", "500", "--profile", "noop", "--procs", "2",
                      "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)

    drive = report["drive"]
    assert report["options"] == {"jobs": 500, "procs": 2, "batch": 50, "profile": "noop"}
    assert drive["jobs_drained"] == 500
    assert drive["transactions_per_job"] > 0
    assert drive["claims"] > 0 and drive["ack_flushes"] > 0
    assert drive["claim_rtt_p99_ms"] >= drive["claim_rtt_p50_ms"] > 0
    assert drive["cpu_seconds"]["workers"] > 0
    assert report["ceiling"]["jobs_per_s"] > 0 and report["ceiling"]["jobs"] == 500
    assert report["seed"]["ratio"] > 0
    assert set(report["server"]) == {"version", "fsync", "synchronous_commit",
                                     "shared_buffers"}
    assert report["schema"].startswith("pgpool_bench_")

    assert db.execute(BENCH_SCHEMAS).fetchall() == []
    assert db.execute("SELECT id, kind, state FROM pgpool_jobs").fetchall() == [
        (mine, "user.kind", "ready")
    ]


def test_bench_table_for_the_mixed_profile(dsn: str, db: psycopg.Connection) -> None:
    done = run_pgpool(dsn, "bench", "--jobs", "150", "--profile", "mixed", "--procs", "2",
                      "--batch", "10", timeout=60)
    assert done.returncode == 0, done.stderr
    for label in ("PostgreSQL", "fsync=", "synchronous_commit=", "shared_buffers=",
                  "SHA-256 rounds", "seed: raw COPY", "database ceiling", "steady",
                  "predicted", "transactions", "CPU seconds"):
        assert label in done.stdout, label
    assert "150 jobs in" in done.stdout
    assert "pgpool bench:" in done.stderr  # progress lines
    assert db.execute(BENCH_SCHEMAS).fetchall() == []


@pytest.mark.parametrize("option", [
    ("--jobs", "0"), ("--jobs", "abc"), ("--procs", "0"), ("--batch", "0"),
    ("--batch", "-3"), ("--profile", "fast"),
], ids=lambda o: f"{o[0]}={o[1]}")
def test_bench_invalid_option(dsn: str, option: tuple[str, str]) -> None:
    name, value = option
    assert_user_error(run_pgpool(dsn, "bench", f"{name}={value}"), name)


def test_bench_unreachable_database(dsn: str) -> None:
    assert_user_error(run_pgpool(dsn, "bench", "--dsn", UNREACHABLE, "--jobs", "10"),
                      "cannot connect")
