"""Which database the CLI uses: --dsn > PGPOOL_DSN > the PG* environment > embedded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
from conftest import TESTS, clean_env, pgpool_cmd
from psycopg.conninfo import conninfo_to_dict

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=2"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(pgpool_cmd(*args), cwd=TESTS, env={**clean_env(), **env},
                          capture_output=True, text=True, timeout=120)


def tables(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = "
                            "current_schema() AND tablename LIKE 'pgpool%%'").fetchone()[0]


def test_dsn_option_beats_pgpool_dsn_which_beats_the_pg_environment(dsn, tmp_path):
    home = str(tmp_path / "never-used")
    assert cli("migrate", "--dsn", dsn, PGPOOL_DSN=UNREACHABLE, PGPOOL_HOME=home
               ).returncode == 0
    assert cli("migrate", PGPOOL_DSN=dsn, PGHOST="/nonexistent", PGDATABASE="nope",
               PGPOOL_HOME=home).returncode == 0
    failed = cli("migrate", PGPOOL_DSN=UNREACHABLE, PGPOOL_HOME=home)
    assert failed.returncode == 2 and "cannot connect" in failed.stderr
    assert not Path(home).exists()  # no embedded server was started for any of these


def test_the_pg_environment_is_used_when_no_dsn_is_configured(dsn, tmp_path):
    p = conninfo_to_dict(dsn)
    env = {"PGHOST": p["host"], "PGDATABASE": p.get("dbname", "postgres"),
           "PGUSER": p.get("user", "postgres"), "PGOPTIONS": p["options"],
           "PGPOOL_HOME": str(tmp_path / "never-used")}
    if p.get("port"):
        env["PGPORT"] = p["port"]
    done = cli("migrate", **env)
    assert done.returncode == 0, done.stderr
    assert tables(dsn) == 4
    assert not (tmp_path / "never-used").exists()


def test_embedded_default_starts_once_is_reused_and_stops(tmp_path):
    home = tmp_path / "h"
    first = cli("migrate", PGPOOL_HOME=str(home))
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("using the embedded PostgreSQL in") == 1
    assert "migrated to version" in first.stdout
    assert (home / "pg18" / "PG_VERSION").exists()
    second = cli("migrate", PGPOOL_HOME=str(home))  # the same data directory, kept
    assert second.returncode == 0, second.stderr
    assert "already at version" in second.stdout
    # Stopped cleanly when the last pgpool process using it exited.
    assert not (home / "pg18" / "postmaster.pid").exists()
