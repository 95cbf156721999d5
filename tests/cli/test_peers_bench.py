"""``bench/peers.py``, queues side by side behind a pinned xmin horizon: a real run at a
small size drains every turn of the hand-written loop and pgpool (and of PgQueuer where it
is installed: not a pgpool dependency, so not in CI) and reports the table's figures; a bad
option, and PgQueuer asked for where it is missing, are one line.

No timing assertions: only that the figures are there and sane.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, run_bench_script
from commands import pgpool_env
from places import BENCH

HAS_PGQUEUER = importlib.util.find_spec("pgqueuer") is not None
SYSTEMS = ["loop", "pgqueuer", "pgpool"] if HAS_PGQUEUER else ["loop", "pgpool"]


def peers(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`run_bench_script`, with more time where PgQueuer runs: its consumers take seconds to
    start and to stop, in each of its drains."""
    if not HAS_PGQUEUER:
        return run_bench_script("peers.py", dsn, *args)
    return subprocess.run([sys.executable, str(BENCH / "peers.py"), *args],
                          env=pgpool_env(dsn), capture_output=True, text=True, timeout=180)


@pytest.mark.soak  # drains of thousands of jobs: `make soak-test`
def test_peers_drains_every_turn_and_reports_the_table(dsn: str, db: psycopg.Connection
                                                       ) -> None:
    done = peers(dsn, "--jobs", "2000", "--rounds", "2", "--pin", "both",
                 "--systems", ",".join(SYSTEMS), "--interval", "0.5", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["options"]["max_claims_per_sec"] == 10_000_000  # never throttled
    assert report["left_out"] == []
    assert report["command"] == ("python bench/peers.py --jobs 2000 --rounds 2 --pin both "
                                 f"--systems {','.join(SYSTEMS)} --interval 0.5")
    # Unpinned turns in the order asked, then the pinned ones in the reverse order.
    assert [(t["system"], t["pinned"]) for t in report["turns"]] == (
        [(s, False) for s in SYSTEMS] + [(s, True) for s in reversed(SYSTEMS)])
    for t in report["turns"]:
        rounds = t["rounds"]
        assert [r["round"] for r in rounds] == [1, 2]
        for r in rounds:
            # The run checks that each drain ran every job (else exit 1).
            assert r["jobs"] == 2000
            assert r["intervals"][-1]["jobs_left"] == 0  # drained
            assert r["intervals"][-1]["end_s"] == r["seconds"] > 0
            assert r["mean_jobs_per_s"] == 2000 / r["seconds"]
            assert r["load_seconds"] > 0 and r["startup_seconds"] > 0
        rates = [r["mean_jobs_per_s"] for r in rounds]
        assert t["jobs_per_s"] == pytest.approx(sum(rates) / 2)
        assert t["later_to_round_1"] == rates[1] / rates[0]
        slowest = [r["slowest_to_first_interval"] for r in rounds]
        assert t["slowest_to_first_interval"] == (None if None in slowest else min(slowest))
    turns = {(t["system"], t["pinned"]): t for t in report["turns"]}
    assert list(report["systems"]) == SYSTEMS
    for system, f in report["systems"].items():
        off, on = turns[system, False], turns[system, True]
        assert f["not_pinned_jobs_per_s"] == off["jobs_per_s"]
        assert f["pinned_jobs_per_s"] == on["jobs_per_s"]
        assert f["pinned_to_not"] == on["jobs_per_s"] / off["jobs_per_s"]
        assert f["later_to_round_1"] == on["later_to_round_1"]  # the pinned turn's
    assert set(report["pgpool_to_targets"]) == set(report["targets"])
    assert db.execute(BENCH_SCHEMAS).fetchall() == []  # its scratch schema is gone

    # The text report: the table has a row a system and every column filled.
    sys.path.insert(0, str(BENCH))
    from peers import render

    text = render(report)
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(SYSTEMS)
    assert table[0].split(" | ")[1:3] == ["not pinned, jobs/s", "pinned, jobs/s"]
    for row in table[1:]:
        cells = row.split(" | ")
        assert len(cells) == 6 and "n/a" not in cells[1:4], row  # rates and their ratio
    assert "pgpool against the targets: pinned / not" in text
    assert f"reproduce: {report['command']}" in text


def test_a_bad_option_is_one_line(dsn: str) -> None:
    done = peers(dsn, "--systems", "loop,nope")
    assert done.returncode == 2
    assert done.stderr == ("peers: error: argument --systems: 'loop,nope': name each of loop, "
                           "pgqueuer, pgpool at most once, with commas\n")


@pytest.mark.skipif(HAS_PGQUEUER, reason="PgQueuer is installed here")
def test_pgqueuer_missing_is_a_note(dsn: str) -> None:
    done = peers(dsn, "--systems", "pgqueuer")
    assert done.returncode == 1
    assert done.stderr == ("peers: note: PgQueuer is not installed, its row is left out (pip "
                           "install pgqueuer==1.6.0)\npeers: error: no system left to run\n")
