"""The bench's scratch schema, and the table upkeep and checks between its stages.

Every stage works in a schema of its own, ``pgpool_bench_<random>``, reached through the
DSN's ``search_path`` and dropped at the end, also on error and Ctrl-C: the user's own
pgpool tables are never read or written.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..db import dsn as dsnlib
from ..errors import PgpoolError
from . import queries
from .jobs import KIND
from .options import BenchError
from .progress import Progress


class Scratch(NamedTuple):
    """The scratch schema: its name, and a DSN whose ``search_path`` is that schema."""

    name: str
    dsn: str


@contextmanager
def scratch_schema(admin: psycopg.Connection, dsn: str, progress: Progress) -> Iterator[Scratch]:
    """Create a new scratch schema through ``admin``, and drop it on the way out, whatever
    happened (on a fresh connection: ``admin`` may be the reason for leaving)."""
    name = f"pgpool_bench_{secrets.token_hex(6)}"
    admin.execute(pgsql.SQL(queries.CREATE_SCHEMA).format(pgsql.Identifier(name)))
    try:
        yield Scratch(name, _schema_dsn(dsn, name))
    finally:
        progress.step(f"dropping schema {name}")
        _drop_schema(dsn, name)


def _schema_dsn(dsn: str, name: str) -> str:
    """``dsn`` with ``search_path`` set to ``name``, keeping any other ``options``."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c search_path={name}".strip())


def _drop_schema(dsn: str, name: str) -> None:
    """Drop the scratch schema on a fresh connection; warn (not raise) if that fails."""
    try:
        with dsnlib.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL(queries.DROP_SCHEMA).format(pgsql.Identifier(name)))
    except (PgpoolError, psycopg.Error) as exc:
        print(f"pgpool: warning: could not drop schema {name} ({exc}); drop it by hand",
              file=sys.stderr)


def server_facts(conn: psycopg.Connection) -> dict[str, str]:
    """The server's version and durability settings, as the report prints them."""
    row = conn.execute(queries.SERVER_FACTS).fetchone()
    assert row is not None
    return dict(zip(("version", "fsync", "synchronous_commit", "full_page_writes",
                     "shared_buffers"), row, strict=True))


def vacuum(conn: psycopg.Connection) -> None:
    """Start a stage on a vacuumed table, as autovacuum (aggressive on this table) keeps a
    live queue: otherwise the dead rows the previous stage left slow the next one down."""
    conn.execute(queries.VACUUM)


def expect_empty(conn: psycopg.Connection, what: str, backlog: int) -> None:
    """No job left due or running, none dead-lettered, and the backlog rows intact; else
    `BenchError` blaming ``what``."""
    row = conn.execute(queries.LEFTOVERS).fetchone()
    assert row is not None
    if row != (0, backlog, 0):
        raise BenchError(f"{what} left {row[0]} jobs queued and {row[2]} dead-lettered; "
                         f"{row[1]} jobs not yet due, expected {backlog} (the backlog)")


def add_backlog(conn: psycopg.Connection, jobs: int) -> None:
    """``--backlog``: ``jobs`` no-op jobs due in a day, then fresh planner statistics. They
    stay for the rest of the run: the deep table a claim must skip (pgpool deletes finished
    jobs, so rows not yet due are what makes a queue table deep)."""
    conn.execute(queries.BACKLOG, {"kind": KIND, "n": jobs})
    conn.execute(queries.ANALYZE)
