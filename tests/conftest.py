"""The suite's fixtures; the helpers the test modules share are in tests/support/, one
module per concern (`commands`, `processes`, `installations`...), on the path by
``pythonpath`` in pyproject.toml, as tests/handlers/ is (the handler modules).

The suite runs in parallel processes (pytest-xdist), each with a real PostgreSQL database
of its own for the whole session: ``PGPOOL_TEST_DSN`` points the suite at a server you run
(each process creates a database there and drops it at the end); otherwise each starts a
throwaway embedded PostgreSQL in a temporary directory and deletes it at the end. A test
gets its process's migrated schema (through ``search_path`` in the DSN), emptied before it
starts, so tests never see each other's rows; one that changes the schema's definition
is marked ``own_schema`` and gets a schema of its own (`dsn`).

The CLI checks run ``cli.main`` in this process (`run_pgpool`), and the commands that start
processes or servers run as real processes. The tests whose timing is their subject run in
one process of their own, one after another (the ``xdist_group`` "timing"), and so do the
tests that run several hosts on the shared server (the ``xdist_group`` "fleet"): a host
holds about eleven connections, and two such tests at once with the rest of the suite went
past the server's max_connections (PostgreSQL's default, 100: "sorry, too many clients
already" as a host started).

Test modules import helpers from tests/support/ only, never from each other. Tests observe
a running ``pgpool`` through its structured log events (``--log-format json``), counters and
table rows, not through the wording of log sentences; the one-line user errors
(``pgpool: error: ...``) are the user contract and are asserted as text. Every wait has a
deadline and never blocks past it.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from commands import JSON_LOGS, pgpool_cmd, pgpool_env, run_pgpool
from dbtools import as_role
from installations import (
    Installation,
    RoleInstallation,
    embedded_server,
    new_schema,
    xdist_worker,
)
from processes import HOST_PATHS, Pgpool, stop_leftovers
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from webs import fresh_snapshot, kept_webs, stop_kept_webs

import pgpool
from pgpool.host import claimer as claimer_module


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts a background job with SIGINT ignored, and every process the suite
    # starts would inherit that: `pgpool status --watch` could not be interrupted. The
    # suite's processes start as from a terminal.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """A database of this worker's own, dropped at the end, on the server ``PGPOOL_TEST_DSN``
    gives, else on the suite's throwaway embedded PostgreSQL (`embedded_server`)."""
    server = os.environ.get("PGPOOL_TEST_DSN") or embedded_server()
    name = f"pgpool_test_{xdist_worker()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    yield make_conninfo(server, dbname=name)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE {} WITH (FORCE)").format(pgsql.Identifier(name)))


@pytest.fixture
def own_server() -> Iterator[Any]:
    """A dedicated PostgreSQL (`chaos_cluster.Postgres`) that a test may stop and restart:
    doing that to the session's server would break every other test."""
    from chaos_cluster import Postgres

    pg = Postgres.start()
    yield pg
    pg.stop()


@pytest.fixture(scope="module")
def role_installation(server_dsn: str) -> Iterator[RoleInstallation]:
    """A `RoleInstallation` shared by the tests of a module that one pytest process runs
    (each should `empty` it first): migrating a schema and creating roles for every test
    would cost more than the tests."""
    suffix = uuid.uuid4().hex[:8]
    app, worker = f"pgpool_app_{suffix}", f"pgpool_worker_{suffix}"
    with new_schema(server_dsn) as owner, psycopg.connect(owner, autocommit=True) as conn:
        pgpool.migrate(conn)
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
        for role in (app, worker):
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(role)))
        try:
            applied = run_pgpool(owner, "grants", "--app", app, "--worker", worker, "--apply")
            assert applied.returncode == 0, applied.stderr
            yield RoleInstallation(schema, owner, app, as_role(owner, app), worker,
                                   as_role(owner, worker))
        finally:
            for role in (app, worker):
                conn.execute(pgsql.SQL("DROP OWNED BY {0} CASCADE; DROP ROLE {0}").format(
                    pgsql.Identifier(role)))


@pytest.fixture(scope="session")
def installation(server_dsn: str) -> Installation:
    return Installation(server_dsn)


def _own_schema(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("own_schema") is not None


@pytest.fixture
def dsn(request: pytest.FixtureRequest, server_dsn: str) -> Iterator[str]:
    """A DSN whose search_path is a migrated installation with no jobs, dead letters, hosts,
    pauses or schedules: this worker's, shared by its tests and reset for each. A test
    must not change its definition.

    A test marked ``own_schema`` (whose subject is migrating, or that changes the tables'
    definition: a trigger, a privilege, an application's foreign key) gets a new, empty
    schema of its own instead, dropped after it; `db` migrates it."""
    if _own_schema(request):
        with new_schema(server_dsn) as schema_dsn:
            yield schema_dsn
        return
    if "web" not in request.fixturenames:
        stop_kept_webs()  # their sessions would count as listening, as readers...
    installation = request.getfixturevalue("installation")
    installation.reset()
    yield installation.dsn
    if installation.changed():
        pytest.fail("this test changed the definition of the shared test schema (a table, "
                    "trigger, privilege...): mark it `@pytest.mark.own_schema`")


@pytest.fixture
def other_dsn(server_dsn: str) -> Iterator[str]:
    """Another new, empty schema of the same database: a second installation."""
    with new_schema(server_dsn) as schema_dsn:
        yield schema_dsn


@pytest.fixture
def fresh_dsn(server_dsn: str) -> Iterator[str]:
    """A DSN of a new, empty database with the server's default search_path
    (``"$user", public``), for tests about where pgpool's tables are found."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield make_conninfo(server_dsn, dbname=name)
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def db(request: pytest.FixtureRequest, dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the installation of `dsn` (migrated first when the
    test has a schema of its own)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if _own_schema(request):
            pgpool.migrate(conn)
        yield conn


@pytest.fixture
def costly_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Claims' sweeps made too costly to run on their own: only `Claimer.sweep_next` (a
    host that handed jobs back, a burst host that reaped) starts one."""
    monkeypatch.setattr(claimer_module, "CHEAP_SWEEP", -1.0)
    monkeypatch.setattr(claimer_module, "SWEEPS_AT_CURSORS_COST", -1.0)
    for name in ("SWEEP_EVERY", "SWEEP_COST", "SWEEP_MAX_GAP"):
        monkeypatch.setattr(claimer_module, name, 1e9)


@pytest.fixture
def record_dir(tmp_path: Path) -> Path:
    path = tmp_path / "record"
    path.mkdir()
    return path


@pytest.fixture(params=["linux", pytest.param("portable", marks=pytest.mark.soak)])
def host_path(request: pytest.FixtureRequest) -> dict[str, str]:
    """A test of a host's behaviour taking this runs once per `HOST_PATHS` entry: pass it
    to the `pgpool` it starts (``**host_path``). The portable path's runs are in the soak
    tier (`make soak-test`, which CI runs too): they repeat real hosts' slowest tests."""
    return HOST_PATHS[request.param]


@pytest.fixture(scope="session", autouse=True)
def _kept_webs_stop() -> Iterator[None]:
    yield
    stop_kept_webs()


@pytest.fixture
def web(request: pytest.FixtureRequest, dsn: str
        ) -> Iterator[Callable[..., tuple[Pgpool, str]]]:
    """``web(*args, **env)`` starts ``pgpool web`` on `dsn`, on a free port of 127.0.0.1,
    with ``args`` (``--read-write``...) and returns (the process, its base URL) once it
    serves.

    On the shared installation the process is kept for the next test that asks for the
    same configuration, which sees only the log lines written from then on; the first
    request of a test stops those kept with any other (a test may count the sessions
    listening). A test that stops its web gets a new one next time. With ``own_schema``
    each is stopped after the test, before the schema is dropped (a snapshot in flight
    would deadlock with the DROP)."""
    shared = not _own_schema(request)
    started: list[Pgpool] = []

    def start(*args: str, **env: str) -> tuple[Pgpool, str]:
        key = (dsn, args, tuple(sorted(env.items())))
        if shared:
            if not started:
                stop_kept_webs(keep=key)
            kept = kept_webs.get(key)
            if kept is not None and kept[0].poll() is None:
                kept[0].forget_output()
                fresh_snapshot(dsn, kept[1], env)
                started.append(kept[0])
                return kept
        proc = Pgpool([*pgpool_cmd("web", "--port", "0", *args)],
                      pgpool_env(dsn, **{**JSON_LOGS, **env}))
        started.append(proc)
        try:
            port = proc.event("web_started")["port"]
        except BaseException:
            proc.kill()
            raise
        base = f"http://127.0.0.1:{port}"
        if shared:
            kept_webs[key] = (proc, base)
        return proc, base

    yield start
    if not shared:
        for proc in started:
            if proc.poll() is None:
                proc.stop()


@pytest.fixture(autouse=True)
def _no_leftover_dispatchers() -> Iterator[None]:
    # A failing test must not leave a dispatcher running (and its workers: they die with it).
    yield
    stop_leftovers()
