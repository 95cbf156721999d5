"""The scripts of bench/ run as a user runs them, against the test's database."""

from __future__ import annotations

import subprocess
import sys

import psycopg
from commands import pgpool_env
from places import BENCH

#: The scratch schemas of the bench scripts, which must be gone once a script ends.
BENCH_SCHEMAS = "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pgpool_bench_%'"


def run_bench_script(script: str, dsn: str, *args: str,
                     **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script>`` (one that drains in a scratch schema, as bench/cliff.py
    does) against ``dsn``."""
    return subprocess.run([sys.executable, str(BENCH / script), *args],
                          env=pgpool_env(dsn, **env), capture_output=True, text=True,
                          timeout=60)


def bench_script_error(result: subprocess.CompletedProcess[str], db: psycopg.Connection
                       ) -> str:
    """A bench script's run that failed: exit 1, no traceback, its scratch schema gone;
    returns its last line on stderr (the one-line error: progress lines come first)."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert db.execute(BENCH_SCHEMAS).fetchall() == []
    return result.stderr.strip().splitlines()[-1]
