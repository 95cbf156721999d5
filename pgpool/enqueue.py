"""Putting jobs in the table: `enqueue`, `enqueue_many` and their async twins.

Each call runs on the caller's connection, inside the caller's current transaction, so a
job commits or rolls back together with the business rows that caused it (the outbox
property without an outbox). The wake-up NOTIFY is part of the same transaction, and
PostgreSQL delivers it only at commit: a rolled-back enqueue wakes nobody.

Payloads are encoded here, once, with orjson, and stored as jsonb. Validation happens before
anything is sent, so a bad payload raises `PayloadError` and leaves the transaction as it was.

Two things are added only when in use, each behind one check per call: a call made inside
an OpenTelemetry span records its trace context with the jobs (`pgpool.tracing`), and a
call that inserted jobs tells the ``on_enqueue`` hooks (`pgpool.hooks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import orjson

from . import hooks, tracing
from .errors import ConfigError, PayloadError, SchemaError
from .names import check_name
from .sql import jobs as sql

# psycopg is imported where it is used, not here: worker processes import pgpool (for
# @pgpool.handler) and never enqueue, and importing psycopg would add about 0.15 s of CPU
# to the start of every worker.
if TYPE_CHECKING:
    import psycopg

DEFAULT_MAX_PAYLOAD_BYTES: Final = 1024 * 1024
#: Deepest nesting of objects and arrays a payload may have, the payload itself counting as
#: one: orjson refuses to encode deeper data.
MAX_PAYLOAD_DEPTH: Final = 254
MAX_DELAY_SECONDS: Final = 100 * 366 * 86400
#: COPY data goes out in small pieces, so PostgreSQL inserts one while the next is being
#: encoded: with 1 MiB pieces, enqueue_many of 20,000 small jobs ran at about 0.7 of a raw
#: COPY of pre-built rows; with 16 KiB pieces, at about the same speed.
_COPY_CHUNK: Final = 1 << 14
_INT4_MAX: Final = 2**31 - 1
# A JSON \u0000 escape: preceded by an even number of backslashes (an odd one would make
# it the literal text "\u0000", which jsonb stores fine).
_NUL_ESCAPE: Final = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
#: Longest tenant or concurrency key, in characters: both are index keys, and a btree
#: entry must fit in a third of a page.
MAX_KEY_CHARS: Final = 200
#: COPY text format escapes for a text column (backslash first).
_COPY_ESCAPES: Final = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def max_payload_bytes() -> int:
    """The payload size limit: ``PGPOOL_MAX_PAYLOAD_BYTES``, default 1 MiB."""
    raw = os.environ.get("PGPOOL_MAX_PAYLOAD_BYTES")
    if raw is None:
        return DEFAULT_MAX_PAYLOAD_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(
            f"PGPOOL_MAX_PAYLOAD_BYTES={raw!r} is not a positive integer number of bytes"
        )
    return value


def encode_payload(payload: Any, *, limit: int | None = None) -> bytes:
    """Serialise a payload to JSON bytes, or raise `PayloadError` saying what to change."""
    if not isinstance(payload, dict):
        raise PayloadError(
            f"payload must be a dict (a JSON object), not {type(payload).__name__}: "
            'wrap the value, e.g. {"items": [...]}'
        )
    try:
        data = orjson.dumps(payload)
    except orjson.JSONEncodeError as exc:
        if _deeper_than(payload, MAX_PAYLOAD_DEPTH):
            raise too_deep() from None
        raise PayloadError(
            f"payload is not JSON-serialisable ({exc}): use dicts with str keys, lists, str, "
            "int, float, bool, None (datetimes and dataclasses are converted)"
        ) from None
    limit = max_payload_bytes() if limit is None else limit
    if len(data) > limit:
        raise PayloadError(
            f"payload is {len(data):,} bytes, over the {limit:,}-byte limit: store large data "
            "elsewhere and pass a reference, or raise PGPOOL_MAX_PAYLOAD_BYTES"
        )
    # orjson writes NaN and Infinity as null; refuse rather than silently change the data.
    if b"null" in data and has_non_finite(payload):
        raise PayloadError(
            "payload contains NaN or Infinity, which JSON cannot represent: "
            "replace them (e.g. with None or a string) before enqueueing"
        )
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise PayloadError(
            "payload contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store: "
            "remove it or encode the binary data (e.g. base64)"
        )
    return data


def too_deep() -> PayloadError:
    """The error for a payload nested deeper than `MAX_PAYLOAD_DEPTH` (or circular)."""
    return PayloadError(
        f"payload is nested more than {MAX_PAYLOAD_DEPTH} levels deep (objects and arrays "
        "within each other), or contains itself: flatten it"
    )


def _deeper_than(value: Any, depth: int) -> bool:
    """Whether ``value`` nests dicts, lists and tuples more than ``depth`` levels deep; looks
    at most ``depth + 1`` levels down, so a circular value cannot recurse forever."""
    if not isinstance(value, dict | list | tuple):
        return False
    if depth == 0:
        return True
    children = value.values() if isinstance(value, dict) else value
    return any(_deeper_than(v, depth - 1) for v in children)


def has_non_finite(value: Any) -> bool:
    """Whether ``value`` holds a NaN or an infinity (which orjson writes as null)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_non_finite(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(has_non_finite(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


def _check_names_and_limits(
    kind: str,
    queue: str,
    priority: int,
    run_at: datetime | None,
    max_attempts: int | None,
) -> None:
    check_name("kind", kind)
    check_name("queue", queue)
    if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > _INT4_MAX:
        raise ConfigError(f"priority must be an integer within ±{_INT4_MAX}, got {priority!r}")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise ConfigError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise ConfigError(
                "run_at is a naive datetime, which is ambiguous: pass a timezone-aware one, "
                "e.g. datetime.now(timezone.utc) + timedelta(minutes=5)"
            )
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool)
        or not 0 < max_attempts <= _INT4_MAX
    ):
        raise ConfigError(f"max_attempts must be a positive integer, got {max_attempts!r}")


def _check_group(what: str, value: str | None) -> None:
    """A tenant or concurrency key: None, or a non-empty string of at most `MAX_KEY_CHARS`."""
    if value is None:
        return
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_CHARS or "\x00" in value:
        raise ConfigError(
            f"{what} must be None or a non-empty string of at most {MAX_KEY_CHARS} characters "
            f"without NUL, got {value!r:.60}"
        )


def _delay_seconds(run_at: datetime | None, delay: float | timedelta | None) -> float:
    if delay is None:
        return 0.0
    if run_at is not None:
        raise ConfigError("pass either run_at or delay, not both")
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if (
        not isinstance(seconds, int | float) or isinstance(seconds, bool)
        or not math.isfinite(seconds) or not 0 <= seconds <= MAX_DELAY_SECONDS
    ):
        raise ConfigError(
            f"delay must be a number of seconds from 0 to {MAX_DELAY_SECONDS:,} (100 years), "
            f"got {delay!r}"
        )
    return float(seconds)


def _identity(data: bytes) -> bytes:
    return data


def _jsonb(data: bytes) -> object:
    """Already-encoded JSON, sent as jsonb without a second serialisation."""
    from psycopg.types.json import Jsonb

    return Jsonb(data, dumps=_identity)


def outside_a_transaction(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """True when ``conn`` is in manual-commit mode with no transaction open yet (the
    operator commands of `pgpool.ops` use it too)."""
    from psycopg import pq

    return not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE


@contextlib.contextmanager
def schema_required() -> Iterator[None]:
    """Turn "no such table" (or a column an older schema lacks) into a `SchemaError` telling
    the caller to migrate."""
    from psycopg.errors import UndefinedColumn, UndefinedTable

    try:
        yield
    except (UndefinedTable, UndefinedColumn) as exc:
        raise _missing_schema(exc) from None


def _enqueue_params(
    kind: str,
    payload: Any,
    queue: str,
    priority: int,
    run_at: datetime | None,
    delay: float | timedelta | None,
    unique_key: str | None,
    max_attempts: int | None,
    tenant: str | None,
    concurrency_key: str | None,
    payload_as: Callable[[bytes], object] = _jsonb,
) -> dict[str, Any]:
    """The parameters of `sql.ENQUEUE`, checked, with the encoded payload passed through
    ``payload_as``."""
    _check_names_and_limits(kind, queue, priority, run_at, max_attempts)
    _check_group("tenant", tenant)
    _check_group("concurrency_key", concurrency_key)
    seconds = _delay_seconds(run_at, delay)
    if unique_key is not None and (not isinstance(unique_key, str) or not unique_key):
        raise ConfigError("unique_key must be a non-empty string or None")
    if unique_key is not None and "\x00" in unique_key:
        raise ConfigError("unique_key must not contain NUL characters")
    data = encode_payload(payload)
    return {
        "queue": queue,
        "kind": kind,
        "payload": payload_as(data),
        "priority": priority,
        "run_at": run_at,
        "delay": seconds,
        "max_attempts": max_attempts,
        "unique_key": unique_key,
        "tenant": tenant or "",  # '' is the group of jobs without a tenant
        "concurrency_key": concurrency_key,
        "meta": None,  # the trace context, when a span is current: see `enqueue`
    }


def copy_rows(
    kind: str,
    payloads: Iterable[Any],
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    concurrency_key: str | None = None,
    meta: bytes | None = None,
) -> Iterator[tuple[bytes, int]]:
    """The rows `enqueue_many` sends for these jobs, in ``COPY pgpool_jobs`` text format
    (`sql.COPY_JOBS`, or `sql.COPY_JOBS_AT` with ``run_at``; with ``meta``, JSON text that
    ends every row, `sql.COPY_JOBS_META` or `sql.COPY_JOBS_AT_META`).

    Yields (piece, rows in it): pieces of about 16 KiB, each ending at a row boundary, so a
    COPY can insert one while the next is being encoded. The options are checked at the
    call (`ConfigError`); payloads as they are encoded (`PayloadError` naming a bad one's
    position, after the pieces before it were yielded).
    """
    check_options(kind, queue, priority, run_at, max_attempts, tenant, concurrency_key)
    return _encode_rows(kind, payloads, queue, priority, run_at, max_attempts, tenant,
                        concurrency_key, meta)


def check_options(kind: str, queue: str, priority: int, run_at: datetime | None,
                  max_attempts: int | None, tenant: str | None,
                  concurrency_key: str | None) -> None:
    """The options of jobs but their unique key and delay, checked as `enqueue` checks
    them (`ConfigError`)."""
    _check_names_and_limits(kind, queue, priority, run_at, max_attempts)
    _check_group("tenant", tenant)
    _check_group("concurrency_key", concurrency_key)


def _each_encoded(payloads: Iterable[Any]) -> Iterator[bytes]:
    """Each payload encoded, as it is consumed; a bad one raises `PayloadError` naming its
    position."""
    limit = max_payload_bytes()
    for i, payload in enumerate(payloads):
        try:
            yield encode_payload(payload, limit=limit)
        except PayloadError as exc:
            raise PayloadError(f"payload #{i} (0-based): {exc}") from None


def _encode_rows(
    kind: str,
    payloads: Iterable[Any],
    queue: str,
    priority: int,
    run_at: datetime | None,
    max_attempts: int | None,
    tenant: str | None,
    concurrency_key: str | None,
    meta: bytes | None,
) -> Iterator[tuple[bytes, int]]:
    limit = max_payload_bytes()
    tail = b"\t%d\t%s" % (priority, b"\\N" if max_attempts is None else b"%d" % max_attempts)
    tail += b"\t" + (tenant or "").translate(_COPY_ESCAPES).encode()
    tail += b"\t" + (b"\\N" if concurrency_key is None
                     else concurrency_key.translate(_COPY_ESCAPES).encode())
    if run_at is not None:  # scheduled: see sql.COPY_JOBS_AT
        tail += b"\t" + run_at.isoformat().encode() + b"\tscheduled"
    if meta is not None:  # see sql.COPY_JOBS_META
        tail += b"\t" + meta.replace(b"\\", b"\\\\")
    head = f"{queue}\t{kind}\t".encode()
    buf = bytearray()
    rows = 0  # in buf
    # The loop of `_each_encoded`, inline: a generator in between cost 2% of the encoding.
    for i, payload in enumerate(payloads):
        try:
            data = encode_payload(payload, limit=limit)
        except PayloadError as exc:
            raise PayloadError(f"payload #{i} (0-based): {exc}") from None
        # COPY text format: backslash is the only byte orjson output needs escaped.
        buf += head + data.replace(b"\\", b"\\\\") + tail + b"\n"
        rows += 1
        if len(buf) >= _COPY_CHUNK:
            yield bytes(buf), rows
            buf.clear()
            rows = 0
    if buf:
        yield bytes(buf), rows


def _missing_schema(exc: Exception) -> SchemaError:
    return SchemaError(
        f"pgpool's tables are missing from this database or older than this pgpool "
        f"({exc.__class__.__name__}): run `pgpool migrate` (or pgpool.migrate(conn)) first"
    )


def enqueue(
    conn: psycopg.Connection,
    kind: str,
    payload: dict[str, Any],
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    unique_key: str | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    concurrency_key: str | None = None,
) -> int | None:
    """Insert one job in ``conn``'s current transaction and return its id.

    Higher ``priority`` runs first. ``run_at`` (timezone-aware) or ``delay`` (seconds or a
    timedelta) defers it. With ``unique_key``, nothing is inserted and None is returned while
    a job of the same kind and key is in ``pgpool_jobs``: waiting (also for a retry),
    running, or parked; one that succeeded or was dead-lettered has left it and freed the
    key. ``max_attempts`` overrides the handler's limit. ``tenant`` puts it in a fairness
    group (claims interleave tenants: docs/guides/fairness.md); with ``concurrency_key``,
    no two jobs of one key run at once anywhere in the fleet. Raises `PayloadError` or
    `ConfigError` before sending anything when an argument is invalid.

    Called inside an OpenTelemetry span, it runs in a PRODUCER span of its own and the job
    carries that span's trace context (`pgpool.tracing`); the ``on_enqueue`` hooks are told
    of the job it inserts (`pgpool.hooks`).
    """
    params = _enqueue_params(kind, payload, queue, priority, run_at, delay, unique_key,
                             max_attempts, tenant, concurrency_key)
    with schema_required(), tracing.sending(kind, queue) as send:
        if send.meta is not None:
            params["meta"] = _jsonb(send.meta)
        row = conn.execute(sql.ENQUEUE, params).fetchone()
        job_id = None if row is None else row[0]
        send.sent(job_id, 1)
    hooks.enqueued(kind, queue, job_id, 0 if job_id is None else 1)
    return job_id


def enqueue_many(
    conn: psycopg.Connection,
    kind: str,
    payloads: Iterable[dict[str, Any]],
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    concurrency_key: str | None = None,
) -> int:
    """Insert many jobs of one kind through COPY in ``conn``'s current transaction.

    Returns how many were inserted; ``tenant`` and ``concurrency_key`` (as for `enqueue`)
    apply to every one of them. All or none: a bad payload raises `PayloadError` naming
    its position, and the COPY is abandoned. Traced, and told to the ``on_enqueue`` hooks,
    as `enqueue` is (one span and one hook call for all the jobs).
    """
    with tracing.sending(kind, queue, batch=True) as send:
        rows = copy_rows(kind, payloads, queue=queue, priority=priority, run_at=run_at,
                         max_attempts=max_attempts, tenant=tenant,
                         concurrency_key=concurrency_key, meta=send.meta)
        count = _copy(conn, rows, queue, run_at is not None, traced=send.meta is not None)
        send.sent(None, count)
    hooks.enqueued(kind, queue, None, count)
    return count


#: The COPY statement of `copy_rows`'s rows, by (scheduled: with ``run_at``, traced: with
#: ``meta``).
_COPY_STATEMENTS: Final = {(False, False): sql.COPY_JOBS, (True, False): sql.COPY_JOBS_AT,
                           (False, True): sql.COPY_JOBS_META,
                           (True, True): sql.COPY_JOBS_AT_META}


def _copy(conn: psycopg.Connection, rows: Iterator[tuple[bytes, int]], queue: str,
          scheduled: bool, *, traced: bool) -> int:
    """COPY the rows of `copy_rows` in ``conn``'s transaction; how many went in."""
    count = 0
    stmt = _COPY_STATEMENTS[scheduled, traced]
    if outside_a_transaction(conn):
        conn.execute(sql.OPEN_TRANSACTION)
    # A bad payload found mid-COPY rolls back to the savepoint: the caller's transaction
    # stays usable, with none of these rows in it.
    with schema_required(), conn.transaction(), conn.cursor() as cur:
        with cur.copy(stmt) as copy:
            for piece, n in rows:
                copy.write(piece)
                count += n
        if count:
            cur.execute(sql.NOTIFY_STAGE if scheduled else sql.NOTIFY, {"queue": queue})
    return count


async def enqueue_async(
    conn: psycopg.AsyncConnection,
    kind: str,
    payload: dict[str, Any],
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    unique_key: str | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    concurrency_key: str | None = None,
) -> int | None:
    """Async twin of `enqueue`, for a psycopg `AsyncConnection`."""
    params = _enqueue_params(kind, payload, queue, priority, run_at, delay, unique_key,
                             max_attempts, tenant, concurrency_key)
    with schema_required(), tracing.sending(kind, queue) as send:
        if send.meta is not None:
            params["meta"] = _jsonb(send.meta)
        row = await (await conn.execute(sql.ENQUEUE, params)).fetchone()
        job_id = None if row is None else row[0]
        send.sent(job_id, 1)
    hooks.enqueued(kind, queue, job_id, 0 if job_id is None else 1)
    return job_id


async def enqueue_many_async(
    conn: psycopg.AsyncConnection,
    kind: str,
    payloads: Iterable[dict[str, Any]],
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    concurrency_key: str | None = None,
) -> int:
    """Async twin of `enqueue_many`, for a psycopg `AsyncConnection`."""
    with tracing.sending(kind, queue, batch=True) as send:
        rows = copy_rows(kind, payloads, queue=queue, priority=priority, run_at=run_at,
                         max_attempts=max_attempts, tenant=tenant,
                         concurrency_key=concurrency_key, meta=send.meta)
        count = await _copy_async(conn, rows, queue, run_at is not None,
                                  traced=send.meta is not None)
        send.sent(None, count)
    hooks.enqueued(kind, queue, None, count)
    return count


async def _copy_async(conn: psycopg.AsyncConnection, rows: Iterator[tuple[bytes, int]],
                      queue: str, scheduled: bool, *, traced: bool) -> int:
    """Async twin of `_copy`."""
    count = 0
    stmt = _COPY_STATEMENTS[scheduled, traced]
    if outside_a_transaction(conn):
        await conn.execute(sql.OPEN_TRANSACTION)
    with schema_required():
        async with conn.transaction(), conn.cursor() as cur:
            async with cur.copy(stmt) as copy:
                for piece, n in rows:
                    await copy.write(piece)
                    count += n
            if count:
                await cur.execute(sql.NOTIFY_STAGE if scheduled else sql.NOTIFY,
                                  {"queue": queue})
    return count


def function_params(
    kind: str,
    payload: dict[str, Any],
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    unique_key: str | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    concurrency_key: str | None = None,
) -> dict[str, Any]:
    """The parameters of `sql.ENQUEUE_BY_FUNCTION` (a call of the SQL function
    ``pgpool_enqueue``) for one job, checked as `enqueue` checks its arguments: raises
    `PayloadError` or `ConfigError` before anything is sent. Plain values any PostgreSQL
    driver sends (the payload as JSON text), for drivers other than psycopg 3."""
    params = _enqueue_params(kind, payload, queue, priority, run_at, delay, unique_key,
                             max_attempts, tenant, concurrency_key, payload_as=bytes.decode)
    # The function takes run_at or delay (not both), and NULL for "no tenant".
    params.update(delay=None if run_at is not None else params["delay"], tenant=tenant,
                  max_payload_bytes=str(max_payload_bytes()))
    return params


def array_params(
    kind: str,
    payloads: Iterable[dict[str, Any]],
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    tenant: str | None = None,
    concurrency_key: str | None = None,
) -> dict[str, Any]:
    """The parameters of `sql.ENQUEUE_ARRAY` (the payloads as one JSON array, all or
    none, and ``total``, how many), checked as `enqueue_many` checks its arguments: a bad
    payload raises `PayloadError` naming its position, before anything is sent. For drivers
    other than psycopg 3, which have no ``COPY`` from Python, and for groups' members
    (`pgpool.groups`)."""
    check_options(kind, queue, priority, run_at, max_attempts, tenant, concurrency_key)
    encoded = list(_each_encoded(payloads))
    return {"kind": kind, "queue": queue, "priority": priority, "run_at": run_at,
            "max_attempts": max_attempts, "tenant": tenant or "",
            "concurrency_key": concurrency_key,
            "payloads": (b"[" + b",".join(encoded) + b"]").decode(), "total": len(encoded),
            "max_payload_bytes": str(max_payload_bytes())}
