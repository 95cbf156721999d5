"""``bench/pickups.py``, idle pickup side by side: a real run at a small size times pgpool
and another checkout's pgpool (and PgQueuer where it is installed: not a pgpool dependency,
so not in CI), each beside the floor measured after it; a bad option, and PgQueuer asked
for where it is missing, are one line.

No timing assertions: only that the figures are there and sane.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, run_bench_script
from commands import pgpool_env
from places import BENCH, ROOT

HAS_PGQUEUER = importlib.util.find_spec("pgqueuer") is not None


def pickups(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`run_bench_script`, with more time where PgQueuer runs: its consumer's first job
    may wait for its poll."""
    if not HAS_PGQUEUER:
        return run_bench_script("pickups.py", dsn, *args)
    return subprocess.run([sys.executable, str(BENCH / "pickups.py"), *args],
                          env=pgpool_env(dsn), capture_output=True, text=True, timeout=180)


@pytest.mark.soak  # real hosts started and stopped each round: `make soak-test`
def test_pickups_times_every_side_beside_its_floor(dsn: str, db: psycopg.Connection,
                                                   tmp_path: Path) -> None:
    checkout = tmp_path / "before"  # a copy of this checkout stands for main before
    shutil.copytree(ROOT / "pgpool", checkout / "pgpool",
                    ignore=shutil.ignore_patterns("__pycache__"))
    done = pickups(dsn, "--samples", "20", "--rounds", "2", "--checkout", str(checkout),
                   *(["--pgqueuer"] if HAS_PGQUEUER else []), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    sides = ["pgpool", "checkout", *(["pgqueuer"] if HAS_PGQUEUER else [])]
    assert report["options"]["sides"] == sides
    assert report["options"]["checkout"] == str(checkout)  # not a git checkout: no commit
    first, second = report["rounds"]
    assert first["order"] == sides and second["order"] == sides[::-1]
    for r in (first, second):
        for side in sides:
            f = r[side]
            assert f["samples"] == 20
            assert 0 < f["p50_ms"] <= f["p99_ms"] <= f["max_ms"]
            assert 0 < f["floor_p50_ms"] <= f["floor_p99_ms"]
            assert f["p50_over_floor_ms"] == f["p50_ms"] - f["floor_p50_ms"]
    for side in sides:
        assert report["median"][side]["p50_ms"] == (
            (first[side]["p50_ms"] + second[side]["p50_ms"]) / 2)
    assert report["targets"] == {"p50_over_floor_ms": 0.3, "p99_ms": 3.0}
    assert report["command"] == ("python bench/pickups.py --samples 20 --rounds 2 "
                                 "--checkout DIR" + (" --pgqueuer" if HAS_PGQUEUER else ""))
    assert db.execute(BENCH_SCHEMAS).fetchall() == []  # both scratch schemas are gone


def test_a_bad_option_is_one_line(dsn: str) -> None:
    done = run_bench_script("pickups.py", dsn, "--samples", "5")
    assert done.returncode == 2
    assert done.stderr == "pickups: error: argument --samples: 5 is less than 20\n"
    done = run_bench_script("pickups.py", dsn, "--checkout", "tests")
    assert done.returncode == 2
    assert done.stderr == ("pickups: error: argument --checkout: 'tests' holds no pgpool "
                           "package: give a checkout (git worktree add DIR COMMIT)\n")


@pytest.mark.skipif(HAS_PGQUEUER, reason="PgQueuer is installed here: nothing is missing")
def test_pgqueuer_asked_for_where_it_is_missing_is_one_line(dsn: str,
                                                            db: psycopg.Connection) -> None:
    done = run_bench_script("pickups.py", dsn, "--pgqueuer")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "pickups: error: --pgqueuer: PgQueuer is not installed (pip install "
        "pgqueuer==1.6.0)")
    assert db.execute(BENCH_SCHEMAS).fetchall() == []
