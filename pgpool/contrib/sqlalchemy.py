"""Enqueueing from SQLAlchemy 2: `enqueue` and `enqueue_many` on a `Session` or
`Connection`, `enqueue_async` and `enqueue_many_async` on an `AsyncSession` or
`AsyncConnection` (the ``pgpool[sqlalchemy]`` extra).

Each call runs on the session's own connection, inside its current transaction (begun if
none is), so the job commits or rolls back with the session's rows. With the psycopg 3
dialect (``postgresql+psycopg://``), the DBAPI connection under SQLAlchemy's is a psycopg
connection, and the call is `pgpool.enqueue`'s own on it: the same checks, encoding,
``COPY`` and wake-up NOTIFY. With another PostgreSQL driver (psycopg2, asyncpg, pg8000),
the arguments get the same checks in Python and the job goes in through the SQL function
``pgpool_enqueue``, which inserts the same row and sends the same NOTIFY (the job carries
no trace context: see docs/guides/sqlalchemy.md).

``kind`` may be a `pgpool.Handler` instead of a kind's name: its defaults apply and a
typed payload is checked and encoded first, as with ``handler.enqueue``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any, Final, TypeAlias, TypeVar, Unpack, overload

import psycopg

try:
    from sqlalchemy import TextClause, text
    from sqlalchemy.engine import Connection
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session
except ImportError:  # pragma: no cover - the extra is missing
    raise ImportError(
        "pgpool.contrib.sqlalchemy needs SQLAlchemy 2 with greenlet: "
        "pip install 'pgpool[sqlalchemy]'"
    ) from None

from pgpool import ConfigError, Handler, SchemaError, hooks
from pgpool.enqueue import (
    array_params,
    function_params,
    insert,
    insert_async,
    insert_many,
    insert_many_async,
    prepared,
    prepared_many,
)
from pgpool.job import EnqueueOptions, ManyOptions
from pgpool.sql import jobs as sql

__all__ = ["enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async"]

#: What the sync functions take: a session, or a Core connection.
Bind: TypeAlias = Session | scoped_session[Any] | Connection
#: What the async twins take.
AsyncBind: TypeAlias = AsyncSession | async_scoped_session[Any] | AsyncConnection
#: A handler's payload type.
P = TypeVar("P")


# The overloads let a type checker see a misspelt option, a kind's payload that is not a
# dict, or a handler's that is neither its payload type nor a dict (a dict is checked at
# the call: inferring the handler's type and a dict literal's together, mypy would refuse
# a literal that fits a TypedDict), as `pgpool.enqueue`'s do.
@overload
def enqueue(session: Bind, kind: Handler[P], payload: P | dict[str, Any],
            **options: Unpack[EnqueueOptions]) -> int | None: ...
@overload
def enqueue(session: Bind, kind: str, payload: dict[str, Any],
            **options: Unpack[EnqueueOptions]) -> int | None: ...


def enqueue(
    session: Bind,
    kind: str | Handler[Any],
    payload: Any,
    **options: Any,
) -> int | None:
    """`pgpool.enqueue` on ``session``'s connection, in its transaction: the job's id, or
    None for a duplicate ``unique_key``. The job commits with the session's next
    ``commit()`` and is gone with a rollback.

    ``kind`` is a kind's name, or a `pgpool.Handler` (its defaults apply, a typed payload is
    checked and encoded). ``options`` are those of `pgpool.enqueue`. A bad payload or
    option raises `PayloadError` or `ConfigError` before anything is sent, leaving the
    transaction usable; an engine on another database than PostgreSQL raises `ConfigError`.
    """
    conn = _connection(session)
    name, payload, chosen = prepared(kind, payload, options)
    driver = conn.connection.driver_connection
    if isinstance(driver, psycopg.Connection):
        return insert(driver, name, payload, chosen)
    params = function_params(name, payload, chosen)
    with _schema_required():
        job_id: int | None = conn.execute(_ENQUEUE, params).scalar_one()
    hooks.enqueued(name, params["queue"], job_id, 0 if job_id is None else 1)
    return job_id


@overload
def enqueue_many(session: Bind, kind: Handler[P], payloads: Iterable[P | dict[str, Any]],
                 **options: Unpack[ManyOptions]) -> int: ...
@overload
def enqueue_many(session: Bind, kind: str, payloads: Iterable[dict[str, Any]],
                 **options: Unpack[ManyOptions]) -> int: ...
def enqueue_many(
    session: Bind,
    kind: str | Handler[Any],
    payloads: Iterable[Any],
    **options: Any,
) -> int:
    """`pgpool.enqueue_many` (all or none) on ``session``'s connection, in its
    transaction: how many jobs were inserted. A bad payload raises `PayloadError` naming its
    position, none of the jobs is inserted and the transaction stays usable. ``kind`` and
    ``options`` as for `enqueue`."""
    conn = _connection(session)
    name, payloads, chosen = prepared_many(kind, payloads, options)
    driver = conn.connection.driver_connection
    if isinstance(driver, psycopg.Connection):
        return insert_many(driver, name, payloads, chosen)
    params = array_params(name, payloads, chosen)
    with _schema_required():
        count: int = conn.execute(_ENQUEUE_MANY, params).one()[0]
    hooks.enqueued(name, params["queue"], None, count)
    return count


@overload
async def enqueue_async(session: AsyncBind, kind: Handler[P], payload: P | dict[str, Any],
                        **options: Unpack[EnqueueOptions]) -> int | None: ...
@overload
async def enqueue_async(session: AsyncBind, kind: str, payload: dict[str, Any],
                        **options: Unpack[EnqueueOptions]) -> int | None: ...
async def enqueue_async(
    session: AsyncBind,
    kind: str | Handler[Any],
    payload: Any,
    **options: Any,
) -> int | None:
    """Async twin of `enqueue`, for an `AsyncSession` or `AsyncConnection` of an engine
    made by ``create_async_engine("postgresql+psycopg://...")`` (or another async
    PostgreSQL driver, such as ``postgresql+asyncpg://``)."""
    conn = await _async_connection(session)
    name, payload, chosen = prepared(kind, payload, options)
    driver = (await conn.get_raw_connection()).driver_connection
    if isinstance(driver, psycopg.AsyncConnection):
        return await insert_async(driver, name, payload, chosen)
    params = function_params(name, payload, chosen)
    with _schema_required():
        job_id: int | None = (await conn.execute(_ENQUEUE, params)).scalar_one()
    hooks.enqueued(name, params["queue"], job_id, 0 if job_id is None else 1)
    return job_id


@overload
async def enqueue_many_async(session: AsyncBind, kind: Handler[P],
                             payloads: Iterable[P | dict[str, Any]],
                             **options: Unpack[ManyOptions]) -> int: ...
@overload
async def enqueue_many_async(session: AsyncBind, kind: str,
                             payloads: Iterable[dict[str, Any]],
                             **options: Unpack[ManyOptions]) -> int: ...
async def enqueue_many_async(
    session: AsyncBind,
    kind: str | Handler[Any],
    payloads: Iterable[Any],
    **options: Any,
) -> int:
    """Async twin of `enqueue_many`, for an `AsyncSession` or `AsyncConnection`."""
    conn = await _async_connection(session)
    name, payloads, chosen = prepared_many(kind, payloads, options)
    driver = (await conn.get_raw_connection()).driver_connection
    if isinstance(driver, psycopg.AsyncConnection):
        return await insert_many_async(driver, name, payloads, chosen)
    params = array_params(name, payloads, chosen)
    with _schema_required():
        count: int = (await conn.execute(_ENQUEUE_MANY, params)).one()[0]
    hooks.enqueued(name, params["queue"], None, count)
    return count


def _as_text(statement: str) -> TextClause:
    """A statement of `pgpool.sql` (``%(name)s`` parameters) as SQLAlchemy's ``text()``
    (``:name``), which each dialect turns into its driver's own parameter style."""
    return text(re.sub(r"%\((\w+)\)s", r":\1", statement))


_ENQUEUE: Final = _as_text(sql.ENQUEUE_BY_FUNCTION)
_ENQUEUE_MANY: Final = _as_text(sql.ENQUEUE_ARRAY)


@contextlib.contextmanager
def _schema_required() -> Iterator[None]:
    """A database without the function (pgpool not installed, or older than migration 16)
    gets the `SchemaError` that `pgpool.enqueue` gives for missing tables."""
    try:
        yield
    except DBAPIError as exc:
        code = getattr(exc.orig, "pgcode", None) or getattr(exc.orig, "sqlstate", None)
        if code not in ("42883", "42P01"):  # undefined_function, undefined_table
            raise
        raise SchemaError(
            "pgpool's SQL function pgpool_enqueue is missing from this database or not on "
            "the connection's search_path: run `pgpool migrate` (or pgpool.migrate(conn)) "
            "first"
        ) from None


def _connection(session: object) -> Connection:
    """``session``'s connection, in a transaction SQLAlchemy knows of, on PostgreSQL."""
    if isinstance(session, AsyncSession | async_scoped_session | AsyncConnection):
        raise ConfigError(
            f"{type(session).__name__} is async: await "
            "pgpool.contrib.sqlalchemy.enqueue_async (or enqueue_many_async) instead"
        )
    if isinstance(session, Session | scoped_session):
        conn = session.connection()  # the session's transaction begins here if it had none
    elif isinstance(session, Connection):
        conn = session
    else:
        raise ConfigError(
            "pgpool.contrib.sqlalchemy.enqueue takes a SQLAlchemy Session or Connection, "
            f"not {type(session).__name__}"
        )
    _check_dialect(conn.dialect)
    # SQLAlchemy commits only a transaction it began: without this, a job enqueued on a
    # Connection that had not executed anything yet would be rolled back at its close.
    if not conn.in_transaction():
        conn.begin()
    return conn


async def _async_connection(session: object) -> AsyncConnection:
    """Async twin of `_connection`."""
    if isinstance(session, AsyncSession | async_scoped_session):
        conn = await session.connection()
    elif isinstance(session, AsyncConnection):
        conn = session
    elif isinstance(session, Session | scoped_session | Connection):
        raise ConfigError(
            f"{type(session).__name__} is not async: call "
            "pgpool.contrib.sqlalchemy.enqueue (or enqueue_many) instead"
        )
    else:
        raise ConfigError(
            "pgpool.contrib.sqlalchemy.enqueue_async takes a SQLAlchemy AsyncSession or "
            f"AsyncConnection, not {type(session).__name__}"
        )
    _check_dialect(conn.dialect)
    if not conn.in_transaction():
        await conn.begin()
    return conn


def _check_dialect(dialect: Any) -> None:
    if dialect.name != "postgresql":
        raise ConfigError(
            f"pgpool's jobs live in PostgreSQL, and this engine is {dialect.name}"
            f"+{dialect.driver}: enqueue on a session of the PostgreSQL database that holds "
            "pgpool's tables"
        )
