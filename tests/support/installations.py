"""The suite's PostgreSQL: the throwaway server the parallel processes share, and the
installations on it (this process's migrated schema, reset between tests; new schemas; one
with an application role and a worker role)."""

from __future__ import annotations

import atexit
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgpool
from pgpool.db import embedded


def xdist_worker() -> str:
    """This pytest process's name among the suite's parallel workers (pytest-xdist's
    ``gw0``, ``gw1``...; ``main`` when the suite runs in one process)."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def embedded_server() -> str:
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


@contextmanager
def new_schema(server_dsn: str) -> Iterator[str]:
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


class Installation:
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
