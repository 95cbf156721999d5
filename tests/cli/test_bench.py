"""``pgpool bench``: real runs at a small size, isolation from the user's jobs, bad options.

No timing assertions: only that every figure is there and sane, that the jobs drained, and
that the throwaway schema is gone while the user's own queue is untouched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from commands import (
    UNREACHABLE,
    assert_user_error,
    pgpool_env,
    run_pgpool,
    without_password_warning,
)
from dbtools import explain_prepared
from places import BENCH

import pgpool
from pgpool.bench import queries
from pgpool.bench.ceilings import bare_claim
from pgpool.bench.jobs import KIND

BENCH_SCHEMAS = "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgpool_bench_%'"


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_bench_json_drains_in_its_own_schema(dsn: str, db: psycopg.Connection) -> None:
    mine = pgpool.enqueue(db, "user.kind", {"keep": True})
    done = run_pgpool(dsn, "bench", "--jobs", "200", "--profile", "noop", "--procs", "2",
                      "--batch", "50", "--backlog", "1000", "--max-claims-per-sec", "50000",
                      "--json", timeout=90)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)

    drive = report["drive"]
    assert report["options"] == {"jobs": 200, "procs": 2, "batch": 50, "profile": "noop",
                                 "backlog": 1000, "max_claims_per_sec": 50000}
    assert drive["jobs_drained"] == 200 and drive["batch"] == 50
    assert drive["claims"] > 0 and drive["ack_flushes"] > 0
    assert drive["claim_rtt_p99_ms"] >= drive["claim_rtt_p50_ms"] > 0
    assert drive["flush_p99_ms"] >= drive["flush_p50_ms"] > 0
    assert drive["mean_flush_size"] > 0
    # Every pooled statement is an autocommit transaction; the database counts more.
    assert drive["transactions"] >= drive["statements"] >= drive["claims"] + drive["ack_flushes"]
    assert drive["statements_per_job"] == drive["statements"] / 200
    # WAL: an insert and a claim's update and delete each write at least a record per job.
    wal = drive["wal_bytes_per_job"]
    assert wal["enqueue"] > 20 and wal["drain"] > 40
    assert wal["total"] == pytest.approx(wal["enqueue"] + wal["drain"])
    assert drive["queue_lag_samples"] == 4  # 1 in 64 of 200
    assert drive["queue_lag_p99_ms"] >= drive["queue_lag_p50_ms"] > 0
    assert drive["claims_per_s"] > 0 and drive["claim_budget_per_s"] == 50000  # one host
    assert drive["claim_budget_applied"] is True
    assert drive["cpu_seconds"]["workers"] > 0
    assert drive["ratio_to_one_transaction"] > 0 and drive["ratio_to_lease_cycle"] > 0

    ceiling = report["ceiling"]
    assert ceiling["batch"] == 50
    for cycle in ("one_transaction", "lease_cycle"):
        runs = ceiling[cycle]["runs"]
        assert [r["when"] for r in runs] == ["before the drive", "after the drive"]
        assert all(r["jobs"] == 200 and r["jobs_per_s"] > 0 for r in runs)
        assert ceiling[cycle]["jobs_per_s"] == pytest.approx(
            (runs[0]["jobs_per_s"] + runs[1]["jobs_per_s"]) / 2)

    pickup = report["pickup"]
    assert pickup["samples"] == 200 and pickup["procs"] == 1
    assert pickup["max_ms"] >= pickup["p99_ms"] >= pickup["p50_ms"] > 0
    assert pickup["floor_p99_ms"] >= pickup["floor_p50_ms"] > 0

    assert report["seed"]["ratio"] > 0 and report["seed"]["rounds"] == 3
    assert set(report["server"]) == {"version", "fsync", "synchronous_commit",
                                     "full_page_writes", "shared_buffers"}
    assert report["schema"].startswith("pgpool_bench_")

    # The schema, backlog rows included, is gone; the user's queue is as it was.
    assert db.execute(BENCH_SCHEMAS).fetchall() == []
    assert db.execute("SELECT id, kind, state FROM pgpool_jobs").fetchall() == [
        (mine, "user.kind", "ready")
    ]


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_bench_table_for_the_mixed_profile_and_auto_batch(
    dsn: str, db: psycopg.Connection
) -> None:
    done = run_pgpool(dsn, "bench", "--jobs", "30", "--profile", "mixed", "--procs", "2",
                      timeout=90)
    assert done.returncode == 0, done.stderr
    for label in ("PostgreSQL", "fsync=", "synchronous_commit=", "full_page_writes=",
                  "shared_buffers=", "SHA-256 rounds", "batch auto (settled at ",
                  "backlog 0 jobs", "seed: raw COPY", "ceiling: 1 transaction",
                  "ceiling: lease cycle", "steady", "vs ceilings", "predicted", "workers only",
                  "claim budget", "not applied here", "ack flushes", "transactions",
                  "statements", "queue lag", "pickup, idle queue", "pickup floor",
                  "; 30 jobs, `pgpool run --procs 1`", "CPU seconds"):
        assert label in done.stdout, label
    assert "30 jobs in" in done.stdout
    # Progress: one line per stage (stderr is not a terminal), ceilings after the drive.
    assert "pgpool bench: drained 30/30 jobs" in done.stderr
    assert "database ceilings (after the drive)" in done.stderr
    assert "before the drive" not in done.stderr
    assert db.execute(BENCH_SCHEMAS).fetchall() == []


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("statement", ["PICK", "PICK_JOBS", "LEASE_CLAIM"])
def test_hand_written_claims_read_the_ready_index_in_order(db: psycopg.Connection,
                                                            statement: str, mode: str) -> None:
    # The ceilings, the pickup floor and bench/vs_loop.py's loop stand for the best a loop
    # of one's own could do: a sort of every due job, or a scan of the table, would make
    # them no ceiling at all. The loops repeat the statement, so psycopg prepares it: the
    # generic plan counts too.
    pgpool.enqueue_many(db, KIND, ({"do": "noop"} for _ in range(3000)))
    db.execute("ANALYZE pgpool_jobs")
    plan = explain_prepared(db, getattr(queries, statement), bare_claim("owner", 50), mode,
                            "FORMAT JSON")
    nodes = list(_plan_nodes(plan))
    assert {"Index Scan", "pgpool_jobs_ready"} <= {
        v for n in nodes for k, v in n.items() if k in ("Node Type", "Index Name")}, nodes
    assert not [n for n in nodes if n["Node Type"] in ("Sort", "Seq Scan")], nodes


@pytest.mark.parametrize("option", [
    ("--jobs", "0"), ("--jobs", "abc"), ("--procs", "0"), ("--batch", "0"),
    ("--batch", "-3"), ("--profile", "fast"), ("--backlog", "-1"), ("--backlog", "1.5"),
    ("--backlog", "many"), ("--max-claims-per-sec", "0"),
], ids=lambda o: f"{o[0]}={o[1]}")
def test_bench_refuses_an_invalid_option_in_one_line(dsn: str, option: tuple[str, str]) -> None:
    name, value = option
    assert_user_error(run_pgpool(dsn, "bench", f"{name}={value}"), name)


def test_bench_says_in_one_line_it_cannot_connect(dsn: str) -> None:
    done = run_pgpool(dsn, "bench", "--dsn", UNREACHABLE, "--jobs", "10")
    assert_user_error(without_password_warning(done), "cannot connect")


@pytest.mark.soak  # a drain of thousands of jobs: `make soak-test`
def test_flood_bench_prints_its_table_at_a_small_size(dsn: str, db: psycopg.Connection
                                                      ) -> None:
    # bench/flood.py --quick: depths 0, 2,000 and 20,000, 20 pickups each, fewer enqueues.
    done = subprocess.run([sys.executable, str(BENCH / "flood.py"), "--quick"],
                          env=pgpool_env(dsn), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    table = [line.split() for line in lines[2:5]]
    assert [row[0] for row in table] == ["0", "2,000", "20,000"]
    for _, p50, p99, ratio in table:
        assert 0 < float(p50) <= float(p99)
        assert float(ratio.rstrip("x")) > 0
    assert table[0][3] == "1.00x"  # the unflooded p99, every ratio's reference
    assert lines[5].startswith("enqueue cost per job: enqueue (due now) ")
    assert db.execute(BENCH_SCHEMAS).fetchall() == []  # its scratch schema is gone
