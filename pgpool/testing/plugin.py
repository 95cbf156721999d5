"""pgpool's pytest plugin, active wherever pgpool is installed (the ``pytest11`` entry point
``pgpool``; ``-p no:pgpool`` turns it off): fixtures that give each test an installation of
its own.

- ``pgpool_dsn``: a DSN whose ``search_path`` leads to a new schema, migrated for the test
  and dropped after it (sessions the test left holding its tables are ended first).
- ``pgpool_conn``: an autocommit psycopg ``Connection`` to it.
- ``pgpool_aconn``: the same as an ``AsyncConnection``, for async tests run by
  pytest-asyncio (in either mode) or, where that is not installed, anyio.

A test that asks for several of them gets one schema. The server is the one
``PGPOOL_TEST_DSN`` names (the fixtures create and drop schemas in its database, and change
nothing else there), else a throwaway embedded PostgreSQL, started the first time a test
asks, in a new temporary directory, and stopped and deleted when the session's process
exits; the workers of pytest-xdist share one. ``PGPOOL_EMBEDDED=0`` refuses it.

Loading the plugin costs the import of pgpool (without psycopg) and nothing else: no
server, connection or psycopg until a test asks for a fixture. Every name it adds starts
with ``pgpool_`` (or ``_pgpool_``), so a project's own fixtures are left alone.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    import psycopg

try:  # pytest-asyncio runs only the async fixtures marked as its own in its strict mode
    from pytest_asyncio import fixture as _async_fixture
except ImportError:  # anyio's plugin runs any async fixture its tests ask for
    _async_fixture = pytest.fixture  # type: ignore[assignment]  # the same, less a keyword

#: Where the fixtures look for a server of the user's.
TEST_DSN = "PGPOOL_TEST_DSN"


@pytest.fixture(scope="session")
def _pgpool_server(request: pytest.FixtureRequest) -> str:
    """The DSN of the server the tests' schemas go on: ``PGPOOL_TEST_DSN``, else the
    session's throwaway embedded PostgreSQL."""
    configured = os.environ.get(TEST_DSN)
    if configured:
        from pgpool.db.dsn import normalise
        from pgpool.errors import PgpoolError

        try:
            return normalise(configured, TEST_DSN)
        except PgpoolError as exc:
            error = str(exc)
        _fail(error)
    if os.environ.get("PGPOOL_EMBEDDED") == "0":
        _fail(f"{TEST_DSN} is not set, and PGPOOL_EMBEDDED=0 refuses the embedded server: "
              f"set {TEST_DSN} to a server whose database the tests may create schemas in")
    from pgpool import extras

    if extras.missing("embedded"):
        _fail(f"{TEST_DSN} is not set, and the embedded server is not installed: "
              f"{extras.install_hint('embedded')}, or set {TEST_DSN} to a server whose "
              "database the tests may create schemas in")
    return _throwaway_server(getattr(request.config, "workerinput", None))


def _throwaway_server(workerinput: dict[str, Any] | None) -> str:
    """Start (or, as another pytest-xdist worker of the same run, attach to) an embedded
    PostgreSQL in a temporary directory, deleted by the last process using it as it exits
    (`pgpool.db.embedded`'s handles); its DSN."""
    import psycopg
    from psycopg import sql

    from pgpool.db import embedded
    from pgpool.errors import PgpoolError
    from pgpool.sql import testing as tsql

    if workerinput is not None:  # a directory named for the run: every worker finds it
        base = Path(tempfile.gettempdir()) / f"pgpool-kit-{workerinput['testrunuid'][:16]}"
        base.mkdir(exist_ok=True)
    else:
        base = Path(tempfile.mkdtemp(prefix="pgpool-kit-"))
    # Registered before the server's own exit handler, so it runs after it: once the last
    # process has deleted the data directory, this removes its parent.
    atexit.register(_remove_if_empty, base)
    try:
        dsn, error = embedded.start(base / "pg", delete_on_exit=True), None
    except PgpoolError as exc:
        dsn, error = "", str(exc)
    if error is not None:
        _fail(f"{error}; for the tests, {TEST_DSN} may name a server instead")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in tsql.THROWAWAY_SETTINGS:
            conn.execute(sql.SQL(tsql.SETTING_OFF).format(sql.Identifier(setting)))
        conn.execute(tsql.RELOAD)
    return dsn


def _remove_if_empty(path: Path) -> None:
    if path.exists() and not any(path.iterdir()):
        path.rmdir()


@pytest.fixture
def pgpool_dsn(_pgpool_server: str) -> Iterator[str]:
    """A DSN leading to a new schema of its own, migrated, on the test server; dropped after
    the test."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    import pgpool
    from pgpool.db.dsn import describe
    from pgpool.errors import first_line
    from pgpool.sql import testing as tsql

    schema = f"pgpool_test_{uuid.uuid4().hex[:12]}"
    with _connect(_pgpool_server) as admin:
        try:
            admin.execute(sql.SQL(tsql.CREATE_SCHEMA).format(sql.Identifier(schema)))
            error = None
        except psycopg.Error as exc:
            error = first_line(exc)
    if error is not None:
        _fail(f"cannot create a schema in the database at {describe(_pgpool_server)} "
              f"({error}): grant the role CREATE on it, or point {TEST_DSN} at another")
    options = conninfo_to_dict(_pgpool_server).get("options") or ""
    dsn = make_conninfo(_pgpool_server, options=f"{options} -c search_path={schema}".strip())
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            pgpool.migrate(conn)
        yield dsn
    finally:
        _drop_schema(_pgpool_server, schema)


def _drop_schema(server: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    from pgpool.sql import testing as tsql

    drop = sql.SQL(tsql.DROP_SCHEMA).format(sql.Identifier(schema))
    with _connect(server) as admin:
        admin.execute(tsql.DROP_LOCK_TIMEOUT)
        for _ in range(3):
            try:
                admin.execute(drop)
                return
            except psycopg.errors.LockNotAvailable:
                admin.execute(tsql.END_SCHEMA_SESSIONS, {"schema": schema})
        admin.execute(drop)


def _connect(server: str) -> psycopg.Connection:
    """An autocommit session on the test server; a test fails with one line if there is
    none."""
    from pgpool.db.dsn import connect
    from pgpool.errors import ConnectError

    try:
        return connect(server, autocommit=True)
    except ConnectError as exc:
        error = str(exc)
    _fail(error)


def _fail(error: str) -> NoReturn:
    """Fail the test with one line, no traceback (called outside the ``except`` block, so
    that pytest shows no chained exception either)."""
    pytest.fail(f"pgpool's fixtures: {error}", pytrace=False)


@pytest.fixture
def pgpool_conn(pgpool_dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test's own migrated schema (`pgpool_dsn`)."""
    import psycopg

    with psycopg.connect(pgpool_dsn, autocommit=True) as conn:
        yield conn


@_async_fixture
async def pgpool_aconn(pgpool_dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """An autocommit async connection to the test's own migrated schema (`pgpool_dsn`)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(pgpool_dsn, autocommit=True) as conn:
        yield conn
