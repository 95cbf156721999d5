"""Fixtures: a real PostgreSQL for the whole session, a fresh schema for every test.

``PGPOOL_TEST_DSN`` points the suite at a server you run; otherwise it starts a throwaway
embedded PostgreSQL in a temporary directory and deletes it at the end. Each test gets its
own schema (through ``search_path`` in the DSN), so tests never see each other's rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgpool
from pgpool import embedded

TESTS = Path(__file__).parent


@pytest.fixture(scope="session")
def server_dsn() -> str:
    given = os.environ.get("PGPOOL_TEST_DSN")
    if given:
        return given
    # A short path: the server's Unix socket lives in its data directory.
    base = Path(tempfile.mkdtemp(prefix="pgpool-test-", dir="/tmp"))
    return embedded.start(base / "pg", delete_on_exit=True)


@pytest.fixture
def dsn(server_dsn: str) -> Iterator[str]:
    """A DSN whose search_path is a new, empty schema."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    yield make_conninfo(server_dsn, options=f"-c search_path={name}")
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to a migrated schema."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        yield conn


@pytest.fixture
def record_dir(tmp_path: Path) -> Path:
    path = tmp_path / "record"
    path.mkdir()
    return path


def clean_env() -> dict[str, str]:
    """This process's environment without PGPOOL_* and PG* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PGPOOL_", "PG"))}


def pgpool_env(dsn: str, record_dir: Path | None = None, **extra: str) -> dict[str, str]:
    env = clean_env()
    env["PGPOOL_DSN"] = dsn
    env["PGPOOL_HOME"] = str(TESTS / ".never-used")  # fail loudly if the default is touched
    if record_dir is not None:
        env["TESTJOBS_RECORD"] = str(record_dir)
    env.update(extra)
    return env


def pgpool_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pgpool", *args]


def run_pgpool(dsn: str, *args: str, record_dir: Path | None = None, timeout: float = 120,
               **env: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, from tests/ so ``--handlers testjobs`` imports."""
    return subprocess.run(
        pgpool_cmd(*args), cwd=TESTS, env=pgpool_env(dsn, record_dir, **env),
        capture_output=True, text=True, timeout=timeout,
    )


_started: list[subprocess.Popen[str]] = []


def start_pgpool(dsn: str, *args: str, record_dir: Path | None = None,
                 **env: str) -> subprocess.Popen[str]:
    """Start the real CLI in the background; killed after the test if still running."""
    proc = subprocess.Popen(
        pgpool_cmd(*args), cwd=TESTS, env=pgpool_env(dsn, record_dir, **env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _started.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _no_leftover_dispatchers() -> Iterator[None]:
    # A failing test must not leave a dispatcher running (and its workers: they die with it).
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def read_records(record_dir: Path) -> list[tuple[int, int, int, str]]:
    """(job id, attempt, worker pid, event) lines written by tests/testjobs.py."""
    out = []
    for f in record_dir.glob("*.log"):
        for line in f.read_text().splitlines():
            job_id, attempt, pid, event = line.split()
            out.append((int(job_id), int(attempt), int(pid), event))
    return out


def wait_until(check: Callable[[], object], what: str, timeout: float = 30) -> object:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def make_version_1_schema(conn: psycopg.Connection) -> None:
    """Lay down pgpool's schema as version 1 left it, as an old deployment would have it."""
    from pgpool import schema

    conn.execute(schema._BOOKKEEPING)
    conn.execute(schema.MIGRATIONS[0].ddl)
    conn.execute("INSERT INTO pgpool_schema_version (version, description) VALUES (1, %s)",
                 (schema.MIGRATIONS[0].description,))
