"""Versioned, idempotent schema migrations.

The migrations are SQL files, one each, in `pgpool.db.migrations` (whose docstring has the
format). They are read the first time something needs them (`MIGRATIONS`, `SCHEMA_VERSION`,
`migrate`, the version checks), not when pgpool is imported. `migrate` applies the
migrations the database lacks, in order, inside one transaction that holds an advisory
lock, so several hosts may run it at once: the first applies, the others wait and then
find nothing to do. The applied version is recorded in ``pgpool_schema_version``; `check`
is what ``pgpool run``, ``enqueue`` and ``status`` use to refuse a missing, older or newer
schema.

Where: pgpool is installed in the schema holding ``pgpool_schema_version`` that
``search_path`` leads to (`locate`), which need not be the first schema on the path (the
default ``"$user", public`` finds ``public`` even once a schema named after the role
exists). `migrate` runs its DDL there, explicitly, and everyone refuses a path on which two
installations, or a same-named table ahead of pgpool's, would mix. A migration waits at most
`LOCK_TIMEOUT` for each lock, so the heartbeats queued behind it are held up no longer, and
tries again later. Once it has its locks, a migration that works through a table's rows
holds that table for as long as that takes: those say so (`Migration.drain`), and
``pgpool migrate`` names them before it starts, since the fleet should be stopped for them.

Physical choices come from the field reports in ``shared/seeds``: the ready-job index is
partial (it stays as small as the backlog, not the table); nothing that a heartbeat touches
(``lease_until``) is indexed, so lease extensions stay HOT updates; fillfactor 80 leaves room
on each page for those updates; autovacuum is made aggressive on the one high-churn table.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from ..errors import SchemaError
from ..logs import event
from ..sql import install as sql
from .outage import backoff

if TYPE_CHECKING:  # imported by `pgpool` itself, so workers too: see pgpool.enqueue
    from importlib.resources.abc import Traversable

    import psycopg


class Migration(NamedTuple):
    version: int
    description: str
    ddl: str
    #: Set for a migration that holds a table the fleet writes for as long as it works
    #: through that table's rows: what it holds, which `pgpool migrate` says before it
    #: starts (the fleet should be stopped for it). None: catalog changes only.
    drain: str | None = None


#: Every migration, in order: the files of `pgpool.db.migrations`, read when first asked
#: for (`read_migrations`), not at import.
MIGRATIONS: tuple[Migration, ...]
#: The schema version this code expects: the last migration's.
SCHEMA_VERSION: int

#: A migration file's name: its version in four digits (``ls`` lists them in order), then
#: what it does.
_FILE_NAME = r"(\d{4})_[a-z0-9]+(?:_[a-z0-9]+)*\.sql"
#: The lines of a migration file's header: a field, and a line continuing the one above.
_FIELD = r"-- ([a-z]+):(.*)"
_CONTINUED = r"--  +(\S.*)"
_FIELDS = ("description", "drain")

if not TYPE_CHECKING:  # type checkers read the declarations above: a misspelt name stays an error

    def __getattr__(name: str) -> object:
        # Every process imports this module (workers too, which never migrate), and
        # reading the files costs about 8 ms, most of it importing importlib.resources.
        if name in ("MIGRATIONS", "SCHEMA_VERSION"):
            _load()
            return globals()[name]
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load() -> None:
    """Read `MIGRATIONS` and `SCHEMA_VERSION` from the files, unless done (or set by a test)."""
    global MIGRATIONS, SCHEMA_VERSION
    if "MIGRATIONS" not in globals():
        from importlib.resources import files

        migrations = read_migrations(files("pgpool.db.migrations"))
        # MIGRATIONS last: a thread that finds it set finds SCHEMA_VERSION set too.
        SCHEMA_VERSION = migrations[-1].version
        MIGRATIONS = migrations


def read_migrations(folder: Traversable) -> tuple[Migration, ...]:
    """The migrations in ``folder``, in order (`MIGRATIONS` are pgpool's own, read from
    `pgpool.db.migrations`, which describes the format): one ``NNNN_what_it_does.sql``
    file each, numbered from 1, its header giving its description and drain. A number may
    be missing (see `_applied`). Raises `SchemaError` naming the first file that breaks
    these rules."""
    found: dict[int, Traversable] = {}
    for entry in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if not entry.name.endswith(".sql"):
            continue  # the package's __init__.py
        named = re.fullmatch(_FILE_NAME, entry.name)
        if named is None:
            raise _malformed(entry, "is misnamed: name it NNNN_what_it_does.sql, NNNN its "
                                    "version in four digits, then lowercase words joined by _")
        version = int(named[1])
        if version in found:
            raise _malformed(entry, f"has the version of {found[version].name}: each "
                                    "migration has a number of its own")
        found[version] = entry
    if not found:
        raise SchemaError(f"pgpool's schema migrations are missing from {folder}: "
                          "reinstall pgpool")
    if 0 in found:
        raise _malformed(found[0], "is numbered 0: number the migrations from 1")
    return tuple(_read_migration(version, found[version]) for version in sorted(found))


def _read_migration(version: int, entry: Traversable) -> Migration:
    try:
        lines = entry.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise _malformed(entry, "is not UTF-8 text") from None
    header = list(itertools.takewhile(lambda line: line.startswith("--"), lines))
    fields: dict[str, str] = {}
    last = None
    for number, line in enumerate(header, 1):
        if field := re.fullmatch(_FIELD, line):
            last = field[1]
            if last not in _FIELDS or last in fields:
                which = "a second" if last in fields else "an unknown field"
                raise _malformed(entry, f"line {number}: {which} `{last}` in its header "
                                        f"(its fields are {' and '.join(_FIELDS)})")
            fields[last] = field[2].strip()
        elif (more := re.fullmatch(_CONTINUED, line)) and last:
            fields[last] = f"{fields[last]} {more[1].rstrip()}".lstrip()
        else:
            raise _malformed(entry, f"line {number} is neither a field of its header "
                                    "(`-- description: ...`) nor the continuation of one "
                                    "(`--` and two spaces or more): leave a blank line "
                                    "between the header and the SQL")
    if not fields.get("description"):
        raise _malformed(entry, "has no description: start it with `-- description: what "
                                "it does`, then a blank line and the SQL")
    ddl = "\n".join(lines[len(header):]).strip()
    if not ddl:
        raise _malformed(entry, "holds no SQL after its header")
    return Migration(version, fields["description"], ddl, fields.get("drain"))


def _malformed(entry: Traversable, problem: str) -> SchemaError:
    return SchemaError(f"pgpool's migration file {entry} {problem}")


BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS pgpool_schema_version (
    version     integer     PRIMARY KEY,
    description text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""

#: Seconds `migrate` waits for a table lock before it lets go and tries again. Every statement
#: on a table (heartbeats too) queues behind a waiting ACCESS EXCLUSIVE request, so this bounds
#: how long a migration can hold them up: a heartbeat runs every lease/3 and a lease is at
#: least 1 s, so half a second never costs a lease.
LOCK_TIMEOUT: Final = 0.5
#: Tries before `migrate` gives up; between them it backs off from 0.5 s, doubling to 10 s
#: (about 2.5 minutes in all with the defaults), so other sessions get through meanwhile.
LOCK_TRIES: Final = 20

log = logging.getLogger("pgpool.schema")


class Installation(NamedTuple):
    """Where pgpool's tables are, as seen through a connection's ``search_path``."""

    #: The schema holding the installation unqualified names resolve to, or None.
    schema: str | None
    #: Schemas of the database holding an installation that is not on ``search_path``.
    elsewhere: tuple[str, ...]


def locate(conn: psycopg.Connection) -> Installation:
    """Find pgpool's installation: the schema on ``conn``'s ``search_path`` holding
    ``pgpool_schema_version``. Raises `SchemaError` when that is ambiguous: two schemas on
    the path hold one, or a schema ahead of it holds a table of the same name as one of
    pgpool's (unqualified statements would then mix the two)."""
    return _installation(conn.execute(sql.INSTALLATIONS).fetchall())


async def locate_async(conn: psycopg.AsyncConnection) -> Installation:
    """Async twin of `locate`."""
    return _installation(await (await conn.execute(sql.INSTALLATIONS)).fetchall())


def _installation(rows: list[tuple[str, int | None, list[str]]]) -> Installation:
    installed = [(name, pos, tables) for name, pos, tables in rows
                 if "pgpool_schema_version" in tables]
    on_path = [(name, pos, tables) for name, pos, tables in installed if pos is not None]
    elsewhere = tuple(name for name, pos, _ in installed if pos is None)
    if len(on_path) > 1:
        names = " and ".join(_quoted(name) for name, _, _ in on_path)
        raise SchemaError(
            f"pgpool is installed in {len(on_path)} schemas on this connection's search_path, "
            f"{names}, and statements would mix their tables: keep the one that holds your "
            f"jobs and drop the other's pgpool_* tables, or set search_path in the DSN "
            f"(options=-csearch_path=...) so that only one of them is on it"
        )
    if not on_path:
        return Installation(None, elsewhere)
    schema, pos, tables = on_path[0]
    shadows = sorted(f"{_quoted(name)}.{table}" for name, p, others in rows
                     if p is not None and p < pos for table in others if table in tables)
    if shadows:
        raise SchemaError(
            f"pgpool is installed in schema {_quoted(schema)}, but {', '.join(shadows)} "
            f"comes before it on search_path and would be used instead: rename or drop "
            f"it, or set search_path in the DSN (options=-csearch_path=...) to put "
            f"{_quoted(schema)} first"
        )
    return Installation(schema, elsewhere)


def migrate(conn: psycopg.Connection, *, lock_timeout: float = LOCK_TIMEOUT,
            tries: int = LOCK_TRIES) -> list[int]:
    """Bring pgpool's schema on ``conn`` up to `SCHEMA_VERSION`; return the versions applied.

    Migrates the installation `locate` finds, wherever it sits on ``search_path``; with
    none, installs into the first existing schema on it. Safe to call concurrently from
    many processes and to call again (it then applies nothing). Runs in a transaction of
    its own, or in a savepoint if ``conn`` is already inside one (then leaving the
    session's settings as they were). A lock it waits for longer than ``lock_timeout``
    seconds is let go and tried again, up to ``tries`` times. Raises `SchemaError` when the
    database is newer than this code, when the installation is ambiguous, or when the
    locks stayed taken.
    """
    import psycopg  # see TYPE_CHECKING above

    if tries < 1:
        raise ValueError(f"tries must be at least 1, not {tries}")
    _load()
    attempt = 0
    while True:
        attempt += 1
        try:
            return _migrate_once(conn, lock_timeout)
        except psycopg.errors.LockNotAvailable:
            if attempt >= tries:
                raise _locked_out(conn, lock_timeout, tries) from None
            delay = backoff(attempt, 0.25, 10.0)
            if attempt == 1:
                event(log, logging.WARNING, "migrate_waiting",
                      "migration waits for sessions holding pgpool's tables; trying again "
                      "up to %d times", tries - 1, tries=tries, lock_timeout=lock_timeout)
            time.sleep(delay)


def _migrate_once(conn: psycopg.Connection, lock_timeout: float) -> list[int]:
    schema = locate(conn).schema
    if schema is None:
        schema = _row(conn.execute(sql.CURRENT_SCHEMA).fetchone())[0]
        if schema is None:
            raise SchemaError(
                "the connection's search_path names no existing schema to create pgpool's "
                "tables in: create the schema first, or fix search_path in the DSN"
            )
    elif _version(conn) == SCHEMA_VERSION:
        return []  # nothing to do, and no DDL privilege needed to find that out
    from psycopg.sql import Identifier

    applied: list[int] = []
    with conn.transaction():
        saved = _row(conn.execute(sql.MIGRATE_SAVED).fetchone())
        conn.execute(sql.MIGRATE_SEARCH_PATH,
                     {"search_path": Identifier(schema).as_string(conn)})
        conn.execute(sql.MIGRATE_LOCK)
        conn.execute(sql.MIGRATE_LOCK_TIMEOUT, {"lock_timeout": f"{lock_timeout * 1000:.0f}ms"})
        conn.execute(BOOKKEEPING)
        recorded = set(_row(conn.execute(sql.SCHEMA_VERSIONS).fetchone())[0])
        current = _applied(recorded)
        if current > SCHEMA_VERSION:
            raise SchemaError(_too_new(current))
        for m in MIGRATIONS:
            if m.version not in recorded:
                conn.execute(m.ddl)
                conn.execute(sql.MIGRATE_RECORD, (m.version, m.description))
                applied.append(m.version)
        conn.execute(sql.MIGRATE_RESTORE,
                     {"search_path": saved[0], "lock_timeout": saved[1]})
    return applied


def _locked_out(conn: psycopg.Connection, lock_timeout: float, tries: int) -> SchemaError:
    schema = locate(conn).schema or _row(conn.execute(sql.CURRENT_SCHEMA).fetchone())[0]
    holders = [pid for (pid,) in conn.execute(sql.LOCK_HOLDERS, {"schema": schema})]
    who = (f"sessions with pid {', '.join(map(str, holders))} hold locks on them now"
           if holders else "the sessions holding them have let go since")
    return SchemaError(
        f"the migration could not lock pgpool's tables in schema {_quoted(schema)} in "
        f"{tries} tries of {lock_timeout:g} s ({who}): let long transactions on them finish "
        f"or end them (pg_stat_activity shows them), then run `pgpool migrate` again"
    )


def to_drain_for(current: int | None) -> list[Migration]:
    """The migrations an upgrade from version ``current`` applies that need the fleet
    stopped (`Migration.drain`); none for a new installation (its tables are empty)."""
    if current is None:
        return []
    _load()
    return [m for m in MIGRATIONS if m.version > current and m.drain]


def schema_version(conn: psycopg.Connection) -> int | None:
    """The recorded version of the installation `locate` finds, or None when there is none
    on ``search_path``. Raises `SchemaError` when that is ambiguous."""
    return None if locate(conn).schema is None else _version(conn)


def check(conn: psycopg.Connection) -> None:
    """Raise `SchemaError` unless ``conn``'s ``search_path`` leads to exactly one pgpool
    installation, at exactly the version this code needs (``run``, ``enqueue``, ``status``)."""
    found = locate(conn)
    check_version(None if found.schema is None else _version(conn), found.elsewhere)


async def check_async(conn: psycopg.AsyncConnection) -> None:
    """Async twin of `check`."""
    found = await locate_async(conn)
    version = None
    if found.schema is not None:
        version = _applied(_row(await (await conn.execute(sql.SCHEMA_VERSIONS)).fetchone())[0])
    check_version(version, found.elsewhere)


def _version(conn: psycopg.Connection) -> int:
    return _applied(_row(conn.execute(sql.SCHEMA_VERSIONS).fetchone())[0])


def _applied(recorded: Iterable[int]) -> int:
    """The version a database whose ``pgpool_schema_version`` lists ``recorded`` is at:
    the last of `MIGRATIONS` before the first it lacks (or its newest, when it is newer
    than this code). Migrations are written on branches in parallel, each taking the next
    number, so one may be merged before a lower-numbered one: a database that applied it
    first is not at the newest version until `migrate` has applied the one it lacks too."""
    _load()
    done = set(recorded)
    newest = max(done, default=0)
    if newest > SCHEMA_VERSION:
        return newest
    reached = 0
    for m in MIGRATIONS:
        if m.version not in done:
            break
        reached = m.version
    return reached


def _row(row: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """The row of a statement that always returns one."""
    assert row is not None
    return row


def check_version(found: int | None, elsewhere: tuple[str, ...] = ()) -> None:
    """Raise `SchemaError` unless ``found`` is exactly the version this code needs;
    ``elsewhere``, the schemas off ``search_path`` that hold pgpool, hint at a DSN that
    misses its schema when ``found`` is None."""
    _load()
    if found is None and elsewhere:
        names = ", ".join(_quoted(name) for name in elsewhere[:3])
        more = f" and {len(elsewhere) - 3} more" if len(elsewhere) > 3 else ""
        raise SchemaError(
            f"pgpool's tables are in no schema on this connection's search_path, but "
            f"schema {names}{more} of this database holds them: put that schema on "
            f"search_path in the DSN (options=-csearch_path=...), or run `pgpool migrate` "
            f"to install pgpool in the schema search_path names"
        )
    if found is None:
        raise SchemaError(
            "pgpool's tables are missing from this database: run `pgpool migrate` "
            "against the same database first"
        )
    if found > SCHEMA_VERSION:
        raise SchemaError(_too_new(found))
    if found < SCHEMA_VERSION:
        raise SchemaError(
            f"the pgpool schema is at version {found} but this pgpool needs {SCHEMA_VERSION}: "
            "run `pgpool migrate` to upgrade it"
        )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _too_new(found: int) -> str:
    return (
        f"the pgpool schema is at version {found}, newer than this pgpool understands "
        f"({SCHEMA_VERSION}): upgrade pgpool on this host to use this database"
    )
