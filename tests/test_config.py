"""Host facts and CLI plumbing that need no database."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import pgpool_cmd


def test_usable_cpus_respects_the_affinity_mask():
    code = ("import os; from pgpool.config import usable_cpus; "
            "os.sched_setaffinity(0, {0}); print(usable_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "1"


def test_invalid_log_level_in_the_environment_is_a_clear_error():
    env = {**os.environ, "PGPOOL_LOG_LEVEL": "verbose"}
    out = subprocess.run(pgpool_cmd("migrate", "--dsn", "host=/nonexistent"), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == ("pgpool: error: PGPOOL_LOG_LEVEL='VERBOSE' is not one of "
                                  "DEBUG, INFO, WARNING, ERROR")
