"""The suite's one helper module: fixtures, and the helpers the test modules share.

The suite runs in parallel processes (pytest-xdist), each with a real PostgreSQL database
of its own for the whole session: ``PGPOOL_TEST_DSN`` points the suite at a server you run
(each process creates a database there and drops it at the end); otherwise each starts a
throwaway embedded PostgreSQL in a temporary directory and deletes it at the end. A test
gets its process's migrated schema (through ``search_path`` in the DSN), emptied before it
starts, so tests never see each other's rows; one that changes the schema's definition
is marked ``own_schema`` and gets a schema of its own (`dsn`).

The CLI checks run ``cli.main`` in this process (`run_pgpool`), and the commands that start
processes or servers run as real processes. The tests whose timing is their subject run in
one process of their own, one after another (the ``xdist_group`` "timing").

Test modules import helpers from here only, never from each other. Tests observe a running
``pgpool`` through its structured log events (``--log-format json``), counters and table
rows, not through the wording of log sentences; the one-line user errors
(``pgpool: error: ...``) are the user contract and are asserted as text. Every wait has a
deadline and never blocks past it.
"""

from __future__ import annotations

import asyncio
import atexit
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import IO, Any, NamedTuple, NoReturn

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.cli.passwords import masked_args
from pgpool.db import embedded
from pgpool.sql import common as sql
from pgpool.sql.common import listen_statement

TESTS = Path(__file__).parent
BENCH = TESTS.parent / "bench"
#: The command line of a dispatcher running the test handlers (tests/testjobs.py).
RUN = ("run", "--handlers", "testjobs")
#: Environment for a `pgpool` whose log a test reads: one JSON object per line.
JSON_LOGS = {"PGPOOL_LOG_FORMAT": "json"}
#: A DSN nobody answers, with a password that must never reach the user's screen.
SECRET = "s3cret-pw"
UNREACHABLE = f"postgresql://u:{SECRET}@127.0.0.1:1/db"
#: Put in payloads that must never be logged or echoed.
MARKER = "PAYLOAD-MARKER-123"


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts a background job with SIGINT ignored, and every process the suite
    # starts would inherit that: `pgpool status --watch` could not be interrupted. The
    # suite's processes start as from a terminal.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _worker() -> str:
    """This pytest process's name among the suite's parallel workers (pytest-xdist's
    ``gw0``, ``gw1``...; ``main`` when the suite runs in one process)."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """A database of this worker's own, dropped at the end, on the server ``PGPOOL_TEST_DSN``
    gives, else on the suite's throwaway embedded PostgreSQL (`_embedded_server`)."""
    server = os.environ.get("PGPOOL_TEST_DSN") or _embedded_server()
    name = f"pgpool_test_{_worker()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    yield make_conninfo(server, dbname=name)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE {} WITH (FORCE)").format(pgsql.Identifier(name)))


def _embedded_server() -> str:
    """The DSN of the embedded PostgreSQL that the suite's parallel workers share (in a
    directory named for the run): the first to call this starts it, the others attach,
    and the last one to exit stops it and deletes it (`pgpool.db.embedded`'s handles)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    # A short path: the server's Unix socket lives in its data directory.
    base = (Path("/tmp") / f"pgpool-test-{run[:16]}" if run
            else Path(tempfile.mkdtemp(prefix="pgpool-test-", dir="/tmp")))
    # Registered first, so it runs after the server's own exit handler: the last process
    # to exit deletes the data directory, and then this its parent.
    atexit.register(lambda: base.rmdir() if base.exists() and not any(base.iterdir()) else None)
    dsn = embedded.start(base / "pg", delete_on_exit=True)
    # The suite's own throwaway server need not survive a crash: no waits on the disk.
    # (Never a server given by PGPOOL_TEST_DSN, nor the clusters whose crashes are a
    # test's subject: those are `own_server`'s.)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(pgsql.SQL("ALTER SYSTEM SET {} = off").format(pgsql.Identifier(setting)))
        conn.execute("SELECT pg_reload_conf()")
    return dsn


@pytest.fixture
def own_server() -> Iterator[Any]:
    """A dedicated PostgreSQL (`chaos_cluster.Postgres`) that a test may stop and restart:
    doing that to the session's server would break every other test."""
    sys.path.insert(0, str(BENCH))
    from chaos_cluster import Postgres

    pg = Postgres.start()
    yield pg
    pg.stop()


@contextmanager
def _new_schema(server_dsn: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    yield make_conninfo(server_dsn, options=f"-c search_path={name}")
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


class RoleInstallation(NamedTuple):
    """A pgpool installation in a schema of its own, with an application role and a worker
    role set up by ``pgpool grants --apply`` (`role_installation`)."""

    #: The schema, and a DSN to it as the tables' owner (the server's superuser).
    schema: str
    owner: str
    #: The roles' names, and DSNs to the schema as each.
    app_role: str
    app: str
    worker_role: str
    worker: str

    def empty(self) -> None:
        """Delete every row a test left, as the owner (the migration's rows stay)."""
        with psycopg.connect(self.owner, autocommit=True) as conn:
            conn.execute("DELETE FROM pgpool_jobs; DELETE FROM pgpool_dead; "
                         "DELETE FROM pgpool_done; DELETE FROM pgpool_groups; "
                         "DELETE FROM pgpool_hosts")


@pytest.fixture(scope="module")
def role_installation(server_dsn: str) -> Iterator[RoleInstallation]:
    """A `RoleInstallation` shared by the tests of a module that one pytest process runs
    (each should `empty` it first): migrating a schema and creating roles for every test
    would cost more than the tests."""
    suffix = uuid.uuid4().hex[:8]
    app, worker = f"pgpool_app_{suffix}", f"pgpool_worker_{suffix}"
    with _new_schema(server_dsn) as owner, psycopg.connect(owner, autocommit=True) as conn:
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


def as_role(dsn: str, role: str) -> str:
    """``dsn`` logging in as ``role`` instead."""
    limited = make_conninfo(dsn, user=role)
    assert conninfo_to_dict(limited)["user"] == role
    return limited


def with_options(dsn: str, *settings: str) -> str:
    """``dsn`` with server settings (``"lock_timeout=0"``) added to its ``options``."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=" ".join([options, *(f"-c {s}" for s in settings)]))


#: What a test may change in the shared installation and have undone by `reset`: rows. A
#: change to its definition (a table, column, index, trigger, function, constraint,
#: privilege, owner or storage option of its own, or another table's foreign key to it)
#: is not undone: a test that makes one is marked ``own_schema`` (see `dsn`).
_DEFINITION = """
SELECT md5(string_agg(item, ' | ' ORDER BY item)) FROM (
    SELECT format('rel %%s %%s %%s %%s %%s', relname, relkind, relowner, relacl,
                  reloptions) AS item
      FROM pg_class WHERE relnamespace = %(ns)s::regnamespace
    UNION ALL
    SELECT format('col %%s %%s %%s %%s %%s', attrelid::regclass, attname, atttypid,
                  attnotnull, pg_get_expr(d.adbin, d.adrelid))
      FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE c.relnamespace = %(ns)s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT format('con %%s %%s %%s', conrelid::regclass, conname, pg_get_constraintdef(k.oid))
      FROM pg_constraint k
     WHERE connamespace = %(ns)s::regnamespace OR confrelid IN (
           SELECT oid FROM pg_class WHERE relnamespace = %(ns)s::regnamespace)
    UNION ALL
    SELECT format('trg %%s %%s %%s', tgrelid::regclass, tgname, tgenabled)
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     WHERE c.relnamespace = %(ns)s::regnamespace
    UNION ALL
    SELECT format('fn %%s %%s %%s %%s', oid::regprocedure, proowner, proacl, md5(prosrc))
      FROM pg_proc WHERE pronamespace = %(ns)s::regnamespace
    UNION ALL
    SELECT format('ns %%s %%s', nspowner, nspacl) FROM pg_namespace
     WHERE oid = %(ns)s::regnamespace
) definition
"""


class _Installation:
    """This worker's migrated schema, shared by its tests and reset between them.

    Migrating a schema for every test cost more than most tests' own work. Each test gets
    the one schema instead with its rows put back as `migrate` left them: every row
    deleted, the id sequence restarted, then the rows migrate wrote put back from a copy.
    ``DELETE`` costs a sixth of ``TRUNCATE`` on the few rows most tests leave; after a test
    that left many, or many dead rows in pgpool_jobs, ``TRUNCATE`` follows, so that no
    test walks another's dead rows. After
    each test the definition is compared with the one migrate made (`_DEFINITION`): a test
    that changed it fails, and the schema is made anew.
    """

    #: Rows a reset deletes past which it truncates too.
    MANY_ROWS = 2000

    def __init__(self, server_dsn: str) -> None:
        self.name = "pgpool_t"
        self.dsn = make_conninfo(server_dsn, options=f"-c search_path={self.name}")
        self._admin = server_dsn
        self._conn: psycopg.Connection | None = None
        self._create()

    def _connection(self) -> psycopg.Connection:
        """The worker's own session on the server, opened again if a test ended it."""
        if self._conn is not None:
            try:
                self._conn.execute("SELECT")
            except psycopg.OperationalError:
                self._conn.close()
                self._conn = None
        if self._conn is None:
            self._conn = psycopg.connect(self._admin, autocommit=True)
            self._conn.execute("SET lock_timeout = '2s'")
        return self._conn

    def _create(self) -> None:
        conn = self._connection()
        for schema in (self.name, f"{self.name}_rows"):
            conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {0} CASCADE; CREATE SCHEMA {0}")
                         .format(pgsql.Identifier(schema)))
        conn.execute(pgsql.SQL("SET search_path = {}").format(pgsql.Identifier(self.name)))
        pgpool.migrate(conn)
        names = [t for (t,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace "
            "AND relkind IN ('r', 'p') ORDER BY relname", (self.name,))]
        self.tables = [pgsql.Identifier(self.name, t) for t in names]
        self.sequences = [pgsql.Identifier(self.name, t) for (t,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace "
            "AND relkind = 'S' ORDER BY relname", (self.name,))]
        # Copies of the rows migrate wrote (the versions, the fleet's one row), put back by
        # `reset`: (the table, its copy).
        self.seeded = []
        for name, table in zip(names, self.tables, strict=True):
            if conn.execute(pgsql.SQL("SELECT EXISTS (SELECT FROM {})").format(table)
                            ).fetchone()[0]:
                copy = pgsql.Identifier(f"{self.name}_rows", name)
                conn.execute(pgsql.SQL("CREATE TABLE {} AS TABLE {}").format(copy, table))
                self.seeded.append((table, copy))
        conn.execute("RESET search_path")  # names as `changed` will see them
        self.definition = self._definition(conn)

    def _definition(self, conn: psycopg.Connection) -> str:
        return conn.execute(_DEFINITION, {"ns": self.name}).fetchone()[0]

    def reset(self) -> None:
        """Every table as migrate left it, waiting out (or ending) the sessions of an
        earlier test still holding a lock on one."""
        conn = self._connection()
        for _ in range(5):
            try:
                with conn.transaction():
                    deleted = sum(conn.execute(pgsql.SQL("DELETE FROM {}").format(t)).rowcount
                                  for t in self.tables)
                    if deleted > self.MANY_ROWS or self._dead_jobs(conn) > self.MANY_ROWS:
                        conn.execute(pgsql.SQL("TRUNCATE {}").format(
                            pgsql.SQL(", ").join(self.tables)))
                    for sequence in self.sequences:
                        conn.execute(pgsql.SQL("ALTER SEQUENCE {} RESTART").format(sequence))
                    for table, copy in self.seeded:
                        conn.execute(pgsql.SQL("INSERT INTO {} SELECT * FROM {}")
                                     .format(table, copy))
                return
            except psycopg.errors.DeadlockDetected:
                continue  # TRUNCATE, with a kept `web`'s snapshot locking in another order
            except psycopg.errors.LockNotAvailable:
                # The session of a process the test before killed (its server has not
                # noticed yet), or a statement it left running: ended.
                conn.execute(
                    "SELECT pg_terminate_backend(l.pid) FROM pg_locks l "
                    "JOIN pg_class c ON c.oid = l.relation "
                    "WHERE l.database = (SELECT oid FROM pg_database "
                    "                    WHERE datname = current_database()) "
                    "AND c.relnamespace = %s::regnamespace "
                    "AND l.pid <> pg_backend_pid()", (self.name,))
        raise RuntimeError(f"could not reset the test schema {self.name}: its tables stayed "
                           "locked")

    def _dead_jobs(self, conn: psycopg.Connection) -> int:
        """The dead rows a test left in pgpool_jobs itself (it deleted what it made while
        the horizon was held): many would slow every claim of the next tests."""
        return conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
                            (f"{self.name}.pgpool_jobs",)).fetchone()[0]

    def changed(self) -> bool:
        """Whether the schema's definition is no longer migrate's (then it is made anew)."""
        if self._definition(self._connection()) == self.definition:
            return False
        self._create()
        return True


@pytest.fixture(scope="session")
def installation(server_dsn: str) -> _Installation:
    return _Installation(server_dsn)


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
        with _new_schema(server_dsn) as schema_dsn:
            yield schema_dsn
        return
    if "web" not in request.fixturenames:
        _stop_kept_webs()  # their sessions would count as listening, as readers...
    installation = request.getfixturevalue("installation")
    installation.reset()
    yield installation.dsn
    if installation.changed():
        pytest.fail("this test changed the definition of the shared test schema (a table, "
                    "trigger, privilege...): mark it `@pytest.mark.own_schema`")


@pytest.fixture
def other_dsn(server_dsn: str) -> Iterator[str]:
    """Another new, empty schema of the same database: a second installation."""
    with _new_schema(server_dsn) as schema_dsn:
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
def record_dir(tmp_path: Path) -> Path:
    path = tmp_path / "record"
    path.mkdir()
    return path


#: The two ways `pgpool run` can work on a host (`pgpool.worker.portable`), as the environment of a
#: `pgpool` process: Linux's own calls, and the portable path macOS takes, forced.
HOST_PATHS = {"linux": {}, "portable": {"PGPOOL_PORTABLE": "1"}}


@pytest.fixture(params=["linux", pytest.param("portable", marks=pytest.mark.soak)])
def host_path(request: pytest.FixtureRequest) -> dict[str, str]:
    """A test of a host's behaviour taking this runs once per `HOST_PATHS` entry: pass it
    to the `pgpool` it starts (``**host_path``). The portable path's runs are in the soak
    tier (`make soak-test`, which CI runs too): they repeat real hosts' slowest tests."""
    return HOST_PATHS[request.param]


def one(db: psycopg.Connection, query: str, *params: object) -> Any:
    """The first row of ``query``, or None."""
    return db.execute(query, params).fetchone()


# --- the real CLI in a subprocess ---------------------------------------------------------


def clean_env() -> dict[str, str]:
    """This process's environment without PGPOOL_* and PG* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PGPOOL_", "PG"))}


def pgpool_env(dsn: str, record_dir: Path | None = None, **extra: str) -> dict[str, str]:
    env = clean_env()
    env["PGPOOL_DSN"] = dsn
    env["PGPOOL_HOME"] = str(TESTS / ".never-used")  # fail loudly if the default is touched
    # One worker unless the test asks for more (--procs, or PGPOOL_PROCS in ``extra``): the
    # workers are most of what starting a host costs, and one per core (the default) is
    # what test_config checks, not something the hosts here need.
    env["PGPOOL_PROCS"] = "1"
    if record_dir is not None:
        env["TESTJOBS_RECORD"] = str(record_dir)
    env.update(extra)
    return env


def pgpool_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pgpool", *args]


#: The commands `run_pgpool` runs as a real process: they start worker processes or a
#: server (`run`, `web`, `bench`), or the embedded PostgreSQL (`dsn`).
OWN_PROCESS = frozenset({"run", "web", "bench", "dsn"})


def run_pgpool(dsn: str, *args: str, record_dir: Path | None = None, timeout: float = 120,
               **env: str) -> subprocess.CompletedProcess[str]:
    """`run_cli` with ``args`` and the environment of `pgpool_env`. Pass ``**JSON_LOGS`` to
    read its events with `events` / `only_event`."""
    return run_cli(args, pgpool_env(dsn, record_dir, **env), timeout)


def run_cli(args: Sequence[str], env: dict[str, str], timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``args`` and ``env`` as its whole environment, from tests/ (so
    ``--handlers testjobs`` imports): its exit status and output.

    A command whose subject is its output and what it did to the database runs in this
    process (`cli_in_process`): the suite pays for importing psycopg once, not once per
    check. A real subprocess runs the rest: `OWN_PROCESS`, a command with no DSN (which
    falls back to the embedded server), and one whose ``--dsn`` holds a password (the
    process title is rewritten, and a warning printed)."""
    command = next((a for a in args if not a.startswith("-")), None)
    has_dsn = env.get("PGPOOL_DSN") or any(a.startswith("--d") for a in args)
    in_process = (has_dsn and masked_args(args) == list(args)
                  and (command not in OWN_PROCESS or _refused_by_the_parser(args)))
    if in_process:
        return cli_in_process(args, env)
    return subprocess.run(pgpool_cmd(*args), cwd=TESTS, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _refused_by_the_parser(args: Sequence[str]) -> bool:
    """Whether the command line parser ends the command (a bad option, ``--help``): then
    even `OWN_PROCESS` starts nothing, and `cli_in_process` shows what a process would."""
    from pgpool.cli import command as cli

    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        try:
            cli.build_parser().parse_args(list(args))
        except SystemExit:
            return True
    return False


def cli_in_process(args: Sequence[str], env: dict[str, str]
                   ) -> subprocess.CompletedProcess[str]:
    """``cli.main(args)`` in this process as ``python -m pgpool`` would run it: ``env`` as
    the whole environment, tests/ as the working directory, stdout and stderr captured,
    and a `SystemExit` (argparse's) turned into the exit status. The environment, the
    directory and logging are put back afterwards."""
    from pgpool.cli import command as cli

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    saved_logging = (root.level, root.handlers[:])
    root.handlers[:] = []  # as in a new process: else `logs.configure` would add nothing
    os.environ.clear()
    os.environ.update(env)
    os.chdir(TESTS)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
                code = 1 if isinstance(exc.code, str) else exc.code or 0
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        for handler in root.handlers:
            if handler not in saved_logging[1]:
                handler.close()
        root.setLevel(saved_logging[0])
        root.handlers[:] = saved_logging[1]
    return subprocess.CompletedProcess(["pgpool", *args], code, out.getvalue(),
                                       err.getvalue())


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


def log_records(text: str) -> list[dict[str, Any]]:
    """The JSON log records among the lines of ``text`` (other lines are skipped: the
    one-line errors and notices are plain text in both formats)."""
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def events(text: str, name: str) -> list[dict[str, Any]]:
    """The records of the event ``name`` in a ``--log-format json`` log."""
    return [r for r in log_records(text) if r.get("event") == name]


def only_event(text: str, name: str) -> dict[str, Any]:
    """The one record of the event ``name`` (a failure names what was there instead)."""
    found = events(text, name)
    assert len(found) == 1, f"expected one {name!r} event, got {len(found)}:\n{text}"
    return found[0]


class Pgpool:
    """A `pgpool` command running in the background (see `start_pgpool`).

    Two threads read its stdout and stderr as they arrive. So waiting for a log line has a
    real deadline (a blocking ``readline`` on the pipe would sit past any timeout until
    the process writes or exits), and a process that writes a lot never stalls on a full
    pipe. Its workers inherit the pipes: end of output means they have exited too.
    """

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(args, cwd=TESTS, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self._changed = threading.Condition()
        self._out: list[str] = []
        self._err: list[str] = []
        self._err_ended = False
        self._err_from = 0  # `forget_output`: the lines before are an earlier test's
        self._readers = [threading.Thread(target=self._read, args=(pipe, lines), daemon=True)
                         for pipe, lines in ((self.proc.stdout, self._out),
                                             (self.proc.stderr, self._err))]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe: IO[str], lines: list[str]) -> None:
        with pipe:
            for line in pipe:
                with self._changed:
                    lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._err_ended = self._err_ended or lines is self._err
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.kill()

    @property
    def stdout(self) -> str:
        with self._changed:
            return "".join(self._out)

    @property
    def stderr(self) -> str:
        with self._changed:
            return "".join(self._err[self._err_from:])

    def forget_output(self) -> None:
        """From now on `stderr`, `events` and the waits see only what it writes next: a
        process kept for the next test shows that test its own lines only."""
        with self._changed:
            self._err_from = len(self._err)

    def wait_for_line(self, matches: Callable[[str], object], what: str,
                      timeout: float = 30, *, end_ok: bool = False) -> str | None:
        """The first stderr line (from the start) for which ``matches`` is truthy; fails
        naming ``what`` after ``timeout`` seconds, or as soon as stderr ends without one
        (with ``end_ok``, returns None then: the process exited first)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            seen = self._err_from
            while True:
                for line in self._err[seen:]:
                    if matches(line):
                        return line
                seen = len(self._err)
                if self._err_ended:
                    if end_ok:
                        return None
                    self._fail(f"pgpool exited ({self.proc.poll()}) before {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    self._fail(f"timed out after {timeout}s waiting for {what}")
                self._changed.wait(left)

    def event(self, name: str, timeout: float = 30, *, end_ok: bool = False
              ) -> dict[str, Any] | None:
        """The first ``name`` event in its log (which must be ``--log-format json``, the
        default of `start_pgpool`), waiting for it at most ``timeout`` seconds; as
        `wait_for_line`, None with ``end_ok`` if the process exits without it."""
        def is_event(line: str) -> bool:
            return any(r.get("event") == name for r in log_records(line))

        line = self.wait_for_line(is_event, f"the {name!r} event", timeout, end_ok=end_ok)
        return None if line is None else log_records(line)[0]

    def events(self, name: str) -> list[dict[str, Any]]:
        """Every ``name`` event logged so far."""
        return events(self.stderr, name)

    def wait(self, timeout: float = 60) -> int:
        """Wait until it exits and its output has ended (its workers are gone too); its
        exit status. Fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._fail(f"pgpool still running after {timeout}s")
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                self._fail(f"pgpool's output still open {timeout}s on (a worker left behind?)")
        return self.proc.returncode

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send ``sig`` and `wait`; the exit status."""
        self.send_signal(sig)
        return self.wait(timeout)

    def _fail(self, message: str) -> NoReturn:
        pytest.fail(f"{message}\nstderr so far:\n{self.stderr}")


_started: list[Pgpool] = []


def start_pgpool(dsn: str, *args: str, record_dir: Path | None = None,
                 wrapper: Sequence[str] = (), **env: str) -> Pgpool:
    """Start the real CLI in the background, logging JSON (``PGPOOL_LOG_FORMAT`` in ``env``
    overrides it); killed after the test if still running. ``wrapper``: a command that
    runs it (``unshare ...``)."""
    proc = Pgpool([*wrapper, *pgpool_cmd(*args)],
                  pgpool_env(dsn, record_dir, **{**JSON_LOGS, **env}))
    _started.append(proc)
    return proc


#: The ``pgpool web`` processes kept from one test to the next, by (DSN, arguments,
#: environment): starting one costs more than most web tests' own work.
_kept_webs: dict[tuple[Any, ...], tuple[Pgpool, str]] = {}


def _stop_kept_webs(keep: object = None) -> None:
    for key in [k for k in _kept_webs if k != keep]:
        proc, _ = _kept_webs.pop(key)
        if proc.poll() is None:
            proc.stop()


@pytest.fixture(scope="session", autouse=True)
def _kept_webs_stop() -> Iterator[None]:
    yield
    _stop_kept_webs()


def _fresh_snapshot(dsn: str, base: str, env: dict[str, str]) -> None:
    """Wait until the ``pgpool web`` at ``base`` serves a snapshot taken after the reset
    of its installation: it keeps the last one it took, which shows the test before's rows.
    A notification on the installation's channel makes it take one at once."""
    import base64
    import urllib.request

    since = time.time()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SELECT pg_notify({sql.OUR_CHANNEL}, 'default')")
    request = urllib.request.Request(base + "/api/snapshot")
    if "PGPOOL_WEB_USER" in env:
        user = f"{env['PGPOOL_WEB_USER']}:{env['PGPOOL_WEB_PASSWORD']}"
        request.add_header("Authorization", "Basic " + base64.b64encode(user.encode()).decode())

    def taken_since() -> bool:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer).get("taken_at", 0) > since

    wait_until(taken_since, "the kept pgpool web's snapshot of the reset installation")


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
                _stop_kept_webs(keep=key)
            kept = _kept_webs.get(key)
            if kept is not None and kept[0].poll() is None:
                kept[0].forget_output()
                _fresh_snapshot(dsn, kept[1], env)
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
            _kept_webs[key] = (proc, base)
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
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def assert_user_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The CLI contract for user errors (exit 2, exactly one line ``pgpool: error: ...`` on
    stderr naming each of ``needles``, no traceback, no password or payload echoed);
    returns the line for further checks."""
    where = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == 2, where
    assert "Traceback" not in result.stderr, where
    assert result.stderr.startswith("pgpool: error:"), where
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, (
        f"not exactly one line on stderr\n{where}"
    )
    assert result.stdout == "", where
    line = result.stderr.rstrip("\n")
    for needle in needles:
        assert needle in line, f"{needle!r} missing from the error line\n{where}"
    assert SECRET not in line, f"the password leaked into the error\n{where}"
    assert MARKER not in line, f"the payload leaked into the error\n{where}"
    return line


def without_password_warning(result: subprocess.CompletedProcess[str]
                             ) -> subprocess.CompletedProcess[str]:
    """``result`` without the warning that a password was given on the command line, which
    must be its first stderr line (then `assert_user_error` applies to the rest)."""
    warning, _, rest = result.stderr.partition("\n")
    assert warning.startswith("pgpool: warning: --dsn holds a password"), result.stderr
    assert SECRET not in warning, result.stderr
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, rest)


def status_json(dsn: str) -> dict[str, Any]:
    """``pgpool status --json``, parsed."""
    done = run_pgpool(dsn, "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def in_registry(dsn: str, work: Callable[[AsyncConnectionPool], Awaitable[Any]]) -> Any:
    """Run ``work(pool)`` on a small async pool like the dispatcher's (autocommit)."""
    async def main() -> Any:
        async with AsyncConnectionPool(dsn, min_size=2, max_size=2,
                                       kwargs={"autocommit": True}) as pool:
            return await work(pool)

    return asyncio.run(main())


def listen_sql(db: psycopg.Connection) -> str:
    """The ``LISTEN`` statement of the installation ``db``'s search_path leads to, as a
    dispatcher's listener sends it (and ``pg_stat_activity`` shows it)."""
    return listen_statement(one(db, sql.CHANNEL)[0])


def listeners(db: psycopg.Connection) -> list[int]:
    """The pids of the sessions LISTENing on the channel of ``db``'s installation."""
    return [pid for (pid,) in db.execute(
        "SELECT pid FROM pg_stat_activity WHERE query = %s AND datname = current_database() "
        "ORDER BY pid", (listen_sql(db),))]


# --- what the test handlers did, and waiting ----------------------------------------------


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def read_records(record_dir: Path) -> list[tuple[int, int, int, str]]:
    """(job id, attempt, worker pid, event) lines written by tests/testjobs.py."""
    out = []
    for f in record_dir.glob("*.log"):
        for line in f.read_text().splitlines():
            job_id, attempt, pid, event = line.split()
            out.append((int(job_id), int(attempt), int(pid), event))
    return out


def read_ticks(where: Path) -> dict[int, list[Any]]:
    """Every attempt of a tests/testjobs.py ``ticker`` job that ticked under ``where``
    ($TICKS_RECORD), by job, sorted by start, as ``chaos_checks.Attempt``: from its first
    tick to its last one plus a tick (its code may have run that long after the last
    record), or to its end record if it finished."""
    sys.path.insert(0, str(BENCH))
    from chaos_checks import Attempt
    from testjobs import TICK

    ticks: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    finished = set()
    for f in where.glob("*.log"):
        ppid, _, pid = f.stem.partition("-")
        for line in f.read_text().split("\n")[:-1]:  # a line cut short by a kill is left out
            job, attempt, at = line.split()
            key = (int(job), int(attempt), int(pid), int(ppid))
            if at == "end":
                finished.add(key)
            else:
                ticks[key].append(int(at))
    attempts: dict[int, list[Any]] = defaultdict(list)
    for key, times in ticks.items():
        end = max(times) + (0 if key in finished else int(TICK * 1e9))
        attempts[key[0]].append(Attempt(*key, min(times), end))
    for runs in attempts.values():
        runs.sort(key=lambda a: a.start)
    return dict(attempts)


def wait_until(check: Callable[[], object], what: str, timeout: float = 30,
               interval: float = 0.02) -> Any:
    """Poll ``check`` every ``interval`` seconds until it returns something truthy, and
    return that; fail naming ``what`` after ``timeout`` seconds. ``check`` must not block
    (a database query or a file read; to wait for a log line use `Pgpool.event`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def insert_old_job(conn: psycopg.Connection, kind: str = "record") -> int:
    """A due job, inserted with the columns every schema version has (`pgpool.enqueue`
    needs the current one); its id."""
    return conn.execute("INSERT INTO pgpool_jobs (kind, payload) VALUES (%s, '{}') "
                        "RETURNING id", (kind,)).fetchone()[0]


def make_version_1_schema(conn: psycopg.Connection) -> None:
    """Lay down pgpool's schema as version 1 left it, as an old deployment would have it."""
    from pgpool.db import schema

    conn.execute(schema.BOOKKEEPING)
    conn.execute(schema.MIGRATIONS[0].ddl)
    conn.execute("INSERT INTO pgpool_schema_version (version, description) VALUES (1, %s)",
                 (schema.MIGRATIONS[0].description,))


def explain_prepared(db: psycopg.Connection, query: str, params: dict[str, Any],
                     mode: str, options: str = "ANALYZE, FORMAT JSON") -> dict[str, Any]:
    """EXPLAIN (``options``, which must include FORMAT JSON) of ``query`` run as a prepared
    statement under ``plan_cache_mode`` ``mode``: the generic plan is the one a long-running
    dispatcher ends up using. Returns the top plan node."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
    casts = dict(re.findall(r"%\((\w+)\)s(::[\w\[\]]+)", query))
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}", query)
    db.execute(f"SET plan_cache_mode = {mode}")
    db.execute(f"PREPARE pgpool_q AS {numbered}")
    try:
        # Literal arguments: EXECUTE cannot infer the types of bound parameters.
        args = pgsql.SQL(", ").join(pgsql.SQL("{}{}").format(pgsql.Literal(params[n]),
                                                              pgsql.SQL(casts.get(n, "")))
                                    for n in names)
        (plan,) = db.execute(pgsql.SQL("EXPLAIN ({}) EXECUTE pgpool_q({})")
                             .format(pgsql.SQL(options), args)).fetchone()[0]
    finally:
        db.execute("DEALLOCATE pgpool_q")
        db.execute("RESET plan_cache_mode")
    return plan["Plan"]


def queue_counts(db: psycopg.Connection, queue: str) -> dict[str, int]:
    """A queue's ready, scheduled and running jobs and its dead letters, straight from the
    tables: what status, the dashboard and the metrics must agree with."""
    ready, scheduled, running = one(
        db, "SELECT count(*) FILTER (WHERE state = 'ready'),"
            " count(*) FILTER (WHERE state = 'scheduled'),"
            " count(*) FILTER (WHERE state = 'running') FROM pgpool_jobs WHERE queue = %s",
        queue)
    (dead,) = one(db, "SELECT count(*) FROM pgpool_dead WHERE queue = %s", queue)
    return {"ready": ready, "scheduled": scheduled, "running": running, "dead": dead}


@asynccontextmanager
async def record_claimer(dsn: str, lease: Any, owner: str
                         ) -> AsyncIterator[tuple[AsyncConnectionPool, Any]]:
    """A small pool set up as a dispatcher's (`configure_connection`, ``lease``'s timeouts)
    and a `Claimer` of ``record`` jobs on it, as host ``owner``."""
    from pgpool.host.claimer import Claimer, configure_connection
    from pgpool.registry import Handler

    async with AsyncConnectionPool(
            dsn, min_size=2, max_size=2, kwargs={"autocommit": True},
            configure=lambda conn: configure_connection(conn, lease)) as pool:
        yield pool, Claimer(pool, owner, queues=("default",),
                            handlers={"record": Handler("record", print, None, None)},
                            lease=lease, max_attempts=20, timeout=None)


def reaper_passes(db: psycopg.Connection, dsn: str, lease: Any, jobs: int, passes: int,
                  hold: int | None = None) -> list[tuple[tuple[int, int], str]]:
    """Claim ``jobs`` ready ``record`` jobs as a host that then died (owner gone:1:aa), let
    every lease run out on a started attempt, and run a real `Reaper` ``passes`` times: what
    each pass reaped (revived, buried) and the state of the row left after it. With ``hold``,
    another connection holds that job FOR KEY SHARE meanwhile, so deleting it waits on a
    lock."""
    from pgpool.host.parts.reaper import Reaper

    async def main() -> list[tuple[tuple[int, int], str]]:
        async with record_claimer(dsn, lease, "gone:1:aa") as (pool, claimer):
            assert len(await claimer.claim(jobs)) == jobs
            async with pool.connection() as conn:
                await conn.execute("UPDATE pgpool_jobs SET lease_until = now() - interval "
                                   "'1s', started = true")
            async with await psycopg.AsyncConnection.connect(dsn) as holder:
                if hold is not None:
                    await holder.execute("SELECT FROM pgpool_jobs WHERE id = %s FOR KEY SHARE",
                                         (hold,))
                reaper = Reaper(pool, interval=1)
                reaped = []
                for _ in range(passes):
                    done = await reaper.reap()
                    reaped.append((done, db.execute("SELECT state FROM pgpool_jobs")
                                   .fetchone()[0]))
                return reaped

    return asyncio.run(main())


# --- the xmin horizon (pgpool.horizon) ----------------------------------------------------

#: Dead rows `pile_dead_rows` leaves in pgpool_jobs: past `pgpool.horizon.MIN_DEAD`, where
#: the vacuum keeper vacuums and the horizon's warning counts them as piling up.
PILED = 20_500


def hold_horizon(dsn: str, how: str, application_name: str = "report-tool"
                 ) -> psycopg.Connection:
    """A session left idle in a transaction that holds back vacuum, as a forgotten ``psql``
    or a reporting job would: ``"write"`` (a transaction id: it wrote), or ``"snapshot"``
    (a REPEATABLE READ transaction that only read: a snapshot, no id). Its query has two
    lines and `MARKER` in the second. Close it (or roll back) to let go."""
    conn = psycopg.connect(dsn, application_name=application_name)
    if how == "snapshot":
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(f"SELECT count(*) FROM pgpool_jobs -- the report\n-- {MARKER}")
    else:
        conn.execute(f"SELECT txid_current() -- the forgotten one\n-- {MARKER}")
    return conn


def dead_rows(db: psycopg.Connection, table: str = "pgpool_jobs") -> int:
    """The server's count of dead rows in ``table`` (what vacuum and pgpool read)."""
    return one(db, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
               table)[0]


def pile_dead_rows(db: psycopg.Connection, rows: int = PILED) -> None:
    """Leave ``rows`` dead rows in pgpool_jobs, as a queue that ran as many jobs, and wait
    until the server's statistics count them (call it with the horizon held: then no
    vacuum removes them meanwhile)."""
    with db.transaction():
        db.execute("INSERT INTO pgpool_jobs (kind, payload) "
                   "SELECT 'piled', '{}' FROM generate_series(1, %s)", (rows,))
    db.execute("DELETE FROM pgpool_jobs WHERE kind = 'piled'")
    db.execute("SELECT pg_stat_force_next_flush()")
    wait_until(lambda: dead_rows(db) >= rows, "the statistics to count the dead rows")
