"""Progress on a real host: a handler reporting in a tight loop is seen through
`pgpool.job_status`, ``pgpool jobs show``, ``pgpool jobs --state running`` and the web
API while it runs, written with the heartbeats (not a statement per call)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from commands import run_pgpool
from processes import start_pgpool
from waits import wait_until

import pgpool

LEASE = 2
TOTAL = 10**9


@pytest.mark.soak  # a real host running long jobs for 10 s or more: `make soak-test`
def test_progress_is_seen_while_the_job_runs(db, dsn, tmp_path: Path, web):
    release = tmp_path / "release"
    host = start_pgpool(dsn, "run", "--handlers", "longjobs", "--procs", "1", "--lease",
                        str(LEASE), "--poll", "0.2")
    host.event("started")
    job_id = pgpool.enqueue(db, "progressing", {"total": TOTAL, "release": str(release)})
    try:
        wait_until(lambda: pgpool.job_status(db, job_id).progress is not None,
                   "progress written")
        first = pgpool.job_status(db, job_id).progress
        assert first is not None and first.total == TOTAL and 0 < first.done < TOTAL
        assert first.note == f"frame {first.done:.0f}"
        wait_until(lambda: pgpool.job_status(db, job_id).progress.at > first.at,
                   "a later beat wrote the progress again")
        later = pgpool.job_status(db, job_id).progress
        assert later.done > first.done

        shown = run_pgpool(dsn, "jobs", "show", str(job_id)).stdout
        # Whole counts in full, however large: 1,026,671/1,000,000,000, not 1.02667e+06/1e+09.
        # The share is whatever the handler reached by now: 0% or 1% on a fast machine.
        assert re.search(r"\n  progress    \d{1,3}(,\d{3})*/1,000,000,000 \(\d+%\) frame \d+, "
                         r"[\d.]+m?s ago\n", shown), shown
        listed = run_pgpool(dsn, "jobs", "--state", "running").stdout.splitlines()
        assert listed[0].split()[-1] == "PROGRESS"
        assert re.search(r"\d{1,3}(,\d{3})*/1,000,000,000 \(\d+%\) frame \d+, [\d.]+m?s ago$",
                         listed[1]), listed[1]

        _, base = web()
        with urllib.request.urlopen(f"{base}/api/jobs?state=running") as answer:
            (row,) = json.load(answer)["jobs"]
        assert row["id"] == job_id and row["progress"]["total"] == TOTAL
        assert "note" not in row["progress"]  # the handler's words: --allow-payloads
    finally:
        release.touch()
    wait_until(lambda: pgpool.job_status(db, job_id).state == "unknown", "the job ended")
    assert host.stop() == 0
