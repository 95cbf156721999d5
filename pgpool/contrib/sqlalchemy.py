"""Enqueueing from SQLAlchemy 2: `enqueue` and `enqueue_many` on a `Session` or
`Connection`, `enqueue_async` and `enqueue_many_async` on an `AsyncSession` or
`AsyncConnection` (the ``pgpool[sqlalchemy]`` extra).

Each call runs on the session's own connection, inside its current transaction (begun if
none is), so the job commits or rolls back with the session's rows. With the psycopg 3
dialect (``postgresql+psycopg://``), the DBAPI connection under SQLAlchemy's is a psycopg
connection, and the call is `pgpool.enqueue`'s own on it: the same checks, encoding,
``COPY`` and wake-up NOTIFY. Another driver gets a `ConfigError` naming the fix.

``kind`` may be a `pgpool.Handler` instead of a kind's name: its defaults apply and a
typed payload is checked and encoded first, as with ``handler.enqueue``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias, Unpack, overload

import psycopg

try:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session
except ImportError:  # pragma: no cover - the extra is missing
    raise ImportError(
        "pgpool.contrib.sqlalchemy needs SQLAlchemy 2 with greenlet: "
        "pip install 'pgpool[sqlalchemy]'"
    ) from None

import pgpool
from pgpool import ConfigError, Handler
from pgpool.registry import EnqueueOptions, ManyOptions

__all__ = ["enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async"]

#: What the sync functions take: a session, or a Core connection.
Bind: TypeAlias = Session | scoped_session[Any] | Connection
#: What the async twins take.
AsyncBind: TypeAlias = AsyncSession | async_scoped_session[Any] | AsyncConnection


# The overloads let a type checker see a misspelt option, or a kind's payload that is not a
# dict. A handler's payload is Any here, checked at the call: inferring the handler's type
# and a dict literal's together, mypy refuses a literal that fits a TypedDict.
@overload
def enqueue(session: Bind, kind: Handler[Any], payload: Any,
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
    transaction usable; an engine on another driver than psycopg 3 raises `ConfigError`.
    """
    conn = _psycopg_connection(session)
    if isinstance(kind, Handler):
        return kind.enqueue(conn, payload, **options)
    return pgpool.enqueue(conn, kind, payload, **options)


@overload
def enqueue_many(session: Bind, kind: Handler[Any], payloads: Iterable[Any],
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
    """`pgpool.enqueue_many` (``COPY``, all or none) on ``session``'s connection, in its
    transaction: how many jobs were inserted. A bad payload raises `PayloadError` naming its
    position, none of the jobs is inserted and the transaction stays usable. ``kind`` and
    ``options`` as for `enqueue`."""
    conn = _psycopg_connection(session)
    if isinstance(kind, Handler):
        return kind.enqueue_many(conn, payloads, **options)
    return pgpool.enqueue_many(conn, kind, payloads, **options)


@overload
async def enqueue_async(session: AsyncBind, kind: Handler[Any], payload: Any,
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
    made by ``create_async_engine("postgresql+psycopg://...")``."""
    conn = await _psycopg_async_connection(session)
    if isinstance(kind, Handler):
        return await kind.enqueue_async(conn, payload, **options)
    return await pgpool.enqueue_async(conn, kind, payload, **options)


@overload
async def enqueue_many_async(session: AsyncBind, kind: Handler[Any], payloads: Iterable[Any],
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
    conn = await _psycopg_async_connection(session)
    if isinstance(kind, Handler):
        return await kind.enqueue_many_async(conn, payloads, **options)
    return await pgpool.enqueue_many_async(conn, kind, payloads, **options)


def _psycopg_connection(session: object) -> psycopg.Connection[Any]:
    """The psycopg connection under ``session``'s, in a transaction SQLAlchemy knows of."""
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
    # SQLAlchemy commits only a transaction it began: without this, a job enqueued on a
    # Connection that had not executed anything yet would be rolled back at its close.
    if not conn.in_transaction():
        conn.begin()
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise _not_psycopg(conn.dialect)
    return driver


async def _psycopg_async_connection(session: object) -> psycopg.AsyncConnection[Any]:
    """Async twin of `_psycopg_connection`."""
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
    if not conn.in_transaction():
        await conn.begin()
    driver = (await conn.get_raw_connection()).driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        raise _not_psycopg(conn.dialect)
    return driver


def _not_psycopg(dialect: Any) -> ConfigError:
    fix = "create it with a postgresql+psycopg:// URL (psycopg 3 comes with pgpool)"
    if dialect.name == "postgresql":  # another PostgreSQL driver: the SQL function works
        fix += (", or enqueue with the SQL function: session.execute(text(\"SELECT "
                "pgpool_enqueue(:kind, CAST(:payload AS jsonb))\"), ...)")
    return ConfigError(f"pgpool.contrib.sqlalchemy enqueues through psycopg 3, and this "
                       f"engine is {dialect.name}+{dialect.driver}: {fix}")
