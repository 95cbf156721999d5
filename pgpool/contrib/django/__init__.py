"""pgpool for Django projects (the ``django`` extra).

- `enqueue` and `enqueue_many` put jobs in the table on Django's own connection, inside
  the caller's ``transaction.atomic()``: a job commits with the application's rows, or
  not at all.
- ``"pgpool.contrib.django"`` in ``INSTALLED_APPS`` is an app whose migration runs
  `pgpool.migrate`, so ``manage.py migrate`` installs pgpool's tables.
- `pgpool.contrib.django.tasks.PgpoolBackend` is a backend for Django's tasks framework
  (``django.tasks``, or the django-tasks package before Django 6), and
  ``pgpool run --handlers pgpool.contrib.django.worker`` runs the tasks.

Django's connection must use psycopg 3 (Django's postgresql backend prefers it to
psycopg2 when both are installed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from ...enqueue import insert, insert_many, prepared, prepared_many
from ...errors import ConfigError
from ...job import EnqueueOptions, ManyOptions
from ...registry import Handler

if TYPE_CHECKING:
    import psycopg

#: A handler's payload type.
P = TypeVar("P")

__all__ = ["connection_for", "enqueue", "enqueue_many"]


def connection_for(using: str = "default") -> psycopg.Connection[Any]:
    """The psycopg 3 connection under Django's database ``using``, connected, in the state
    Django left it (inside the caller's ``transaction.atomic()``, its transaction).

    Raises `ConfigError` when that database is not PostgreSQL on psycopg 3, or when the
    current atomic block has seen an error (Django refuses queries until it rolls back)."""
    import psycopg
    from django.db import connections

    wrapper = connections[using]
    if wrapper.vendor != "postgresql":
        raise ConfigError(f"Django database {using!r} is {wrapper.vendor}, not PostgreSQL: "
                          "pgpool's jobs live in PostgreSQL; pass using= a PostgreSQL alias")
    wrapper.ensure_connection()
    wrapper.validate_no_broken_transaction()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise ConfigError(
            f"Django database {using!r} uses {type(raw).__module__.split('.')[0]}, not "
            "psycopg 3: install psycopg (Django's postgresql backend prefers it to psycopg2), "
            "or enqueue with the SQL function pgpool_enqueue"
        )
    return raw


# Overloads, for a type checker, as `pgpool.enqueue`'s: a kind's name takes a dict, a
# Handler its payload type or a dict (checked at the call).
@overload
def enqueue(kind: str, payload: dict[str, Any], *, using: str = "default",
            **options: Unpack[EnqueueOptions]) -> int | None: ...
@overload
def enqueue(kind: Handler[P], payload: P | dict[str, Any], *, using: str = "default",
            **options: Unpack[EnqueueOptions]) -> int | None: ...
def enqueue(kind: str | Handler[Any], payload: Any, *, using: str = "default",
            **options: Any) -> int | None:
    """`pgpool.enqueue` on Django's database ``using``: inside ``transaction.atomic()`` the
    job is part of that transaction (rolled back with it); outside, it commits at once, as
    any query in Django's autocommit. ``kind`` is the kind's name, or its `pgpool.Handler`
    (its defaults apply, a typed payload is checked and encoded, as with
    ``handler.enqueue``). ``options`` are `pgpool.enqueue`'s (``queue``, ``priority``,
    ``run_at``, ``delay``, ``unique_key``, ``max_attempts``, ``tenant``,
    ``concurrency_key``). Returns the job's id, or None for a duplicate ``unique_key``."""
    name, payload, chosen = prepared(kind, payload, options)
    return insert(connection_for(using), name, payload, chosen)


@overload
def enqueue_many(kind: str, payloads: Iterable[dict[str, Any]], *, using: str = "default",
                 **options: Unpack[ManyOptions]) -> int: ...
@overload
def enqueue_many(kind: Handler[P], payloads: Iterable[P | dict[str, Any]], *,
                 using: str = "default", **options: Unpack[ManyOptions]) -> int: ...
def enqueue_many(kind: str | Handler[Any], payloads: Iterable[Any], *,
                 using: str = "default", **options: Any) -> int:
    """`pgpool.enqueue_many` (COPY, all or none) on Django's database ``using``, as
    `enqueue` (``kind`` too); returns how many jobs it inserted."""
    name, payloads, chosen = prepared_many(kind, payloads, options)
    return insert_many(connection_for(using), name, payloads, chosen)
