"""``pgpool db``: the embedded server kept up for an application's development loop, in a
PGPOOL_HOME of the test's own, by real ``pgpool`` processes: the commands that use the
embedded default attach to it and leave it up, an application reaches it with the URL in
each driver's form (Django's ``migrate`` too), and ``stop`` ends it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy
from commands import JSON_LOGS, RUN, assert_user_error, clean_env, pgpool_cmd, run_cli
from places import HANDLERS
from processes import Pgpool, alive
from waits import wait_until

import pgpool
from pgpool.cli import devdb
from pgpool.db import embedded

pytestmark = pytest.mark.soak  # starts an embedded cluster of its own: the soak tier


@pytest.fixture
def home() -> Iterator[Path]:
    """A PGPOOL_HOME of the test's own, under /tmp (see test_dsn's ``scratch``); its holder
    and server stopped afterwards if a failing test left them running."""
    base = Path(tempfile.mkdtemp(prefix="pgpool-db-", dir="/tmp"))
    yield base / "h"
    holder = devdb.running_holder(base / "h")
    if holder is not None:
        os.kill(holder.pid, signal.SIGTERM)
        wait_until(lambda: not alive(holder.pid), "the holder to exit", timeout=60)
    if embedded.running(base / "h" / "pg18") is not None:
        embedded.stop(base / "h" / "pg18")
    shutil.rmtree(base)


def server_pid(pgdata: Path) -> int:
    """The pid of the server running on ``pgdata`` (the first line of postmaster.pid)."""
    return int((pgdata / "postmaster.pid").read_text().split()[0])


DJANGO_MIGRATE = """
import django
from django.conf import settings
from django.core.management import call_command
from django.db import connection

exec(open(0).read())  # the DATABASES setting `pgpool db url --format django` printed
settings.configure(DATABASES=DATABASES, INSTALLED_APPS=["pgpool.contrib.django"])
django.setup()
call_command("migrate", verbosity=0)
print(connection.cursor().execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0])
"""


def test_the_development_server_stays_up_for_every_command_until_stopped(home: Path) -> None:
    env = {**clean_env(), "PGPOOL_HOME": str(home)}
    pgdata = home / "pg18"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(args, env)

    started = cli("db", "start")
    assert started.returncode == 0, started.stderr
    assert f"started the development server in {pgdata}" in started.stderr
    url = started.stdout.strip()
    assert url.endswith(f"?host={pgdata}")  # the socket in the data directory
    server = server_pid(pgdata)
    # Said again, with a notice when a configured database would take its place.
    again = run_cli(("db", "start"), {**env, "PGPOOL_DSN": "postgresql://elsewhere/db"})
    assert (again.returncode, again.stdout) == (0, started.stdout)
    assert f"already runs in {pgdata}" in again.stderr
    assert "notice: PGPOOL_DSN or the PG* environment configures a database" in again.stderr

    # Django's migrate with the settings `url --format django` prints (HOST: the socket
    # directory) installs pgpool's tables; `pgpool migrate` without a DSN uses the same
    # server, and leaves it up as it exits.
    django = cli("db", "url", "--format", "django")
    assert f'"HOST": "{pgdata}"' in django.stdout
    done = subprocess.run([sys.executable, "-c", DJANGO_MIGRATE], input=django.stdout,
                          cwd=HANDLERS, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr
    migrated = cli("migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "already at version" in migrated.stdout
    assert server_pid(pgdata) == server

    # A host without a DSN runs the application's jobs on it; status names its pid.
    host = Pgpool(pgpool_cmd(*RUN, "--procs", "1"), {**env, **JSON_LOGS})
    try:
        host.event("started", timeout=60)
        with psycopg.connect(url, autocommit=True) as app:
            pgpool.enqueue(app, "noop", {})
            wait_until(lambda: app.execute("SELECT count(*) FROM pgpool_jobs").fetchone()
                       == (0,), "the host to run the application's job")
        holder = devdb.running_holder(home)
        status = cli("db", "status")
        assert (status.returncode, status.stdout.splitlines()) == (0, [
            f"development server: running, held by pid {holder.pid} until `pgpool db stop`",
            f"data directory: {pgdata}",
            f"url: {url}",
            f"other pgpool processes using it: {host.pid}",
        ]), status.stderr
        engine = sqlalchemy.create_engine(
            cli("db", "url", "--format", "sqlalchemy").stdout.strip())
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT count(*) FROM pgpool_jobs")
                                ).scalar() == 0
        engine.dispose()
        assert cli("db", "url", "--format", "psycopg").stdout == started.stdout
        psql = cli("db", "psql", "--", "-tAc", "SELECT count(*) FROM pgpool_jobs")
        assert (psql.returncode, psql.stdout) == (0, "0\n"), psql.stderr

        # A holder killed outright leaves the server to its other holders, and the next
        # start adopts it.
        os.kill(holder.pid, signal.SIGKILL)
        wait_until(lambda: not alive(holder.pid), "the holder to die")
        orphaned = cli("db", "status")
        assert orphaned.returncode == 1
        assert orphaned.stdout == (
            f"development server: not running; the embedded server in {pgdata} runs until "
            f"the last pgpool process holding it exits (now: {host.pid}); `pgpool db start` "
            "keeps it up\n")
        assert cli("db", "start").returncode == 0
        assert server_pid(pgdata) == server

        # Stopped under the host still using it.
        stopped = cli("db", "stop")
        assert (stopped.returncode, stopped.stdout) == (
            0, f"pgpool: stopped the development server in {pgdata} (pgpool processes "
               f"{host.pid} were using it: they lose their connections)\n"), stopped.stderr
        assert embedded.running(pgdata) is None and not alive(server)
    finally:
        host.kill()
        host.wait(30)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5).close()
    for action in ("stop", "url", "psql"):
        assert_user_error(cli("db", action), "no development server runs", "pgpool db start")
    status = cli("db", "status")
    assert (status.returncode, status.stdout) == (
        1, f"development server: not running (`pgpool db start` starts it in {pgdata})\n")
