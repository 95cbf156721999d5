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

Wherever a kind is taken, a `pgpool.Handler` may name it instead, with what its own
``enqueue`` applies: its defaults under the options given, its payload type checked and
encoded. A Handler is a `TypedKind`, the part of it these functions use, defined here:
`pgpool.registry` (where Handler is) imports this module, not the other way round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, Unpack, overload

import orjson

from . import hooks, tracing
from .errors import ConfigError, PayloadError, SchemaError
from .job import MANY, EnqueueOptions, JobOptions, ManyOptions
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
#: COPY data goes out in small pieces, so PostgreSQL inserts one while the next is being
#: encoded: with 1 MiB pieces, enqueue_many of 20,000 small jobs ran at about 0.7 of a raw
#: COPY of pre-built rows; with 16 KiB pieces, at about the same speed.
_COPY_CHUNK: Final = 1 << 14
# A JSON \u0000 escape: preceded by an even number of backslashes (an odd one would make
# it the literal text "\u0000", which jsonb stores fine).
_NUL_ESCAPE: Final = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
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
        raise PayloadError(f"payload must be a dict (a JSON object), not "
                           f"{type(payload).__name__}: {_not_a_dict(payload)}")
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
    if has_nul(data):
        raise PayloadError(
            "payload contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store: "
            "remove it or encode the binary data (e.g. base64)"
        )
    return data


def _not_a_dict(payload: object) -> str:
    """What to do with a payload that is not a dict: enqueue a typed one through its
    handler (named when one registered in this process takes its type), wrap another."""
    # Looked up, not imported: pgpool.registry imports this module, and a payload can be of
    # a registered handler's type only once it is loaded (as pgpool.payloads finds pydantic).
    registry = sys.modules.get("pgpool.registry")
    takers = [] if registry is None else [
        h for h in registry.registered().values() if h.payload_type is type(payload)]
    if takers:
        named = " or ".join(f"{h.kind!r} ({h.qualname})" for h in takers)
        name = takers[0].fn.__name__
        return (f"it is the payload type of handler {named}: enqueue it with "
                f"{name}.enqueue(conn, payload), which checks and encodes it, or pass the "
                f"handler as the kind: pgpool.enqueue(conn, {name}, payload)")
    pydantic = sys.modules.get("pydantic")
    if (dataclasses.is_dataclass(payload) and not isinstance(payload, type)) or (
            pydantic is not None and isinstance(payload, pydantic.BaseModel)):
        return ("a dataclass or a pydantic model is a typed handler's payload: enqueue it "
                "with that handler's .enqueue(conn, payload), which checks and encodes it, "
                "or pass the handler as the kind: pgpool.enqueue(conn, handler, payload)")
    return 'wrap the value, e.g. {"items": [...]}'


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


def has_nul(data: bytes) -> bool:
    """Whether JSON text ``data`` holds a NUL character, which jsonb cannot store."""
    return b"\\u0000" in data and _NUL_ESCAPE.search(data) is not None


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


def _enqueue_params(kind: str, payload: Any, options: JobOptions,
                    payload_as: Callable[[bytes], object] = _jsonb) -> dict[str, Any]:
    """The parameters of `sql.ENQUEUE`, checked, with the encoded payload passed through
    ``payload_as``."""
    check_name("kind", kind)
    data = encode_payload(payload)
    # meta: the trace context, when a span is current (see `insert`).
    return {**options.columns(), "kind": kind, "payload": payload_as(data), "meta": None}


#: No option given: every default.
DEFAULTS: Final = JobOptions()

#: A kind's payload type (``dict[str, Any]`` for a plain handler's).
P = TypeVar("P")


class TypedKind(Generic[P]):
    """A kind that knows its payload type and its enqueue defaults: what every function
    that takes a kind takes in its place. `pgpool.Handler` is one (`pgpool.registry`
    imports this module, so the enqueue functions know a Handler by this class)."""

    kind: str

    def prepare(self, payload: Any, options: Mapping[str, Any]) -> tuple[Any, JobOptions]:
        """(the payload to store, the options) of one job of this kind with ``options``."""
        raise NotImplementedError

    def prepare_many(self, payloads: Iterable[Any], options: Mapping[str, Any]
                     ) -> tuple[Iterable[Any], JobOptions]:
        """(the payloads to store, the options) of many jobs of this kind at once."""
        raise NotImplementedError


def prepared(kind: str | TypedKind[Any], payload: Any, options: Mapping[str, Any], *,
             what: str = "enqueue") -> tuple[str, Any, JobOptions]:
    """(the kind's name, the payload to store, the options) of one job: a `TypedKind`'s
    defaults under ``options`` and its payload checked and encoded, or ``options`` alone
    for a kind's name (``what`` says who takes them in a `ConfigError`)."""
    if isinstance(kind, TypedKind):
        return kind.kind, *kind.prepare(payload, options)
    return kind, payload, JobOptions.of(options, what=what) if options else DEFAULTS


def prepared_many(kind: str | TypedKind[Any], payloads: Iterable[Any],
                  options: Mapping[str, Any], *, what: str = "enqueue_many",
                  allowed: frozenset[str] = MANY) -> tuple[str, Iterable[Any], JobOptions]:
    """`prepared` for many jobs of one kind (``allowed``: the options a kind's name may
    take), their payloads checked and encoded as they are consumed."""
    if isinstance(kind, TypedKind):
        return kind.kind, *kind.prepare_many(payloads, options)
    return kind, payloads, JobOptions.of(options, allowed=allowed, what=what)


def copy_rows(kind: str, payloads: Iterable[Any], options: JobOptions = DEFAULTS, *,
              meta: bytes | None = None) -> Iterator[tuple[bytes, int]]:
    """The rows `enqueue_many` sends for these jobs, in ``COPY pgpool_jobs`` text format
    (`sql.COPY_JOBS`, or `sql.COPY_JOBS_AT` with ``run_at``; with ``meta``, JSON text that
    ends every row, `sql.COPY_JOBS_META` or `sql.COPY_JOBS_AT_META`).

    Yields (piece, rows in it): pieces of about 16 KiB, each ending at a row boundary, so a
    COPY can insert one while the next is being encoded. The kind and options are checked
    at the call (`ConfigError`); payloads as they are encoded (`PayloadError` naming a bad
    one's position, after the pieces before it were yielded).
    """
    check_name("kind", kind)
    return _encode_rows(kind, payloads, options.for_many("enqueue_many"), meta)


def _each_encoded(payloads: Iterable[Any]) -> Iterator[bytes]:
    """Each payload encoded, as it is consumed; a bad one raises `PayloadError` naming its
    position."""
    limit = max_payload_bytes()
    for i, payload in enumerate(payloads):
        try:
            yield encode_payload(payload, limit=limit)
        except PayloadError as exc:
            raise PayloadError(f"payload #{i} (0-based): {exc}") from None


def _encode_rows(kind: str, payloads: Iterable[Any], options: JobOptions,
                 meta: bytes | None) -> Iterator[tuple[bytes, int]]:
    limit = max_payload_bytes()
    # The options' columns (`JobOptions.columns`), as COPY text: the same for every row.
    c = options.columns()
    max_attempts, concurrency_key = c["max_attempts"], c["concurrency_key"]
    tail = b"\t%d\t%s" % (c["priority"],
                           b"\\N" if max_attempts is None else b"%d" % max_attempts)
    tail += b"\t" + c["tenant"].translate(_COPY_ESCAPES).encode()
    tail += b"\t" + (b"\\N" if concurrency_key is None
                     else concurrency_key.translate(_COPY_ESCAPES).encode())
    if c["run_at"] is not None:  # scheduled: see sql.COPY_JOBS_AT
        tail += b"\t" + c["run_at"].isoformat().encode() + b"\tscheduled"
    if meta is not None:  # see sql.COPY_JOBS_META
        tail += b"\t" + meta.replace(b"\\", b"\\\\")
    head = f"{c['queue']}\t{kind}\t".encode()
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


# Overloads, for a type checker: a kind's name takes a dict; a Handler its payload type, or
# a dict that fits it (checked at the call). Options are checked by name and type.
@overload
def enqueue(conn: psycopg.Connection, kind: str, payload: dict[str, Any],
            **options: Unpack[EnqueueOptions]) -> int | None: ...
@overload
def enqueue(conn: psycopg.Connection, kind: TypedKind[P], payload: P | dict[str, Any],
            **options: Unpack[EnqueueOptions]) -> int | None: ...
def enqueue(conn: psycopg.Connection, kind: str | TypedKind[Any], payload: Any,
            **options: Any) -> int | None:
    """Insert one job in ``conn``'s current transaction and return its id.

    ``kind`` is the kind's name, or its `pgpool.Handler`, whose own ``enqueue`` this then
    is: the handler's defaults apply where an option is not given, and a typed payload (an
    instance of its payload type, or a dict that fits it) is checked and encoded.

    The options: ``queue`` (default "default") and ``priority`` (default 0; higher runs
    first). ``run_at`` (timezone-aware) or ``delay`` (seconds or a timedelta) defers it.
    With ``unique_key``, nothing is inserted and None is returned while a job of the same
    kind and key is in ``pgpool_jobs``: waiting (also for a retry), running, or parked; one
    that succeeded or was dead-lettered has left it and freed the key. ``max_attempts``
    overrides the handler's limit. ``tenant`` puts it in a fairness group (claims
    interleave tenants: see [Tenants](../guides/fairness.md#tenants)); with
    ``concurrency_key``, no two jobs of one key run at once anywhere in the fleet. Raises
    `PayloadError` or `ConfigError` before sending anything when an argument is invalid.

    Called inside an OpenTelemetry span, it runs in a PRODUCER span of its own and the job
    carries that span's trace context (`pgpool.tracing`); the ``on_enqueue`` hooks are told
    of the job it inserts (`pgpool.hooks`).
    """
    return insert(conn, *prepared(kind, payload, options))


def insert(conn: psycopg.Connection, kind: str, payload: Any, options: JobOptions
           ) -> int | None:
    """`enqueue` with its options made (`Handler.enqueue` comes here with its own)."""
    params = _enqueue_params(kind, payload, options)
    with schema_required(), tracing.sending(kind, options.queue) as send:
        if send.meta is not None:
            params["meta"] = _jsonb(send.meta)
        row = conn.execute(sql.ENQUEUE, params).fetchone()
        job_id = None if row is None else row[0]
        send.sent(job_id, 1)
    hooks.enqueued(kind, options.queue, job_id, 0 if job_id is None else 1)
    return job_id


@overload
def enqueue_many(conn: psycopg.Connection, kind: str, payloads: Iterable[dict[str, Any]],
                 **options: Unpack[ManyOptions]) -> int: ...
@overload
def enqueue_many(conn: psycopg.Connection, kind: TypedKind[P],
                 payloads: Iterable[P | dict[str, Any]],
                 **options: Unpack[ManyOptions]) -> int: ...
def enqueue_many(conn: psycopg.Connection, kind: str | TypedKind[Any], payloads: Iterable[Any],
                 **options: Any) -> int:
    """Insert many jobs of one kind through COPY in ``conn``'s current transaction.

    Returns how many were inserted. ``kind`` as for `enqueue` (a `pgpool.Handler`: its
    ``enqueue_many``); the options are `enqueue`'s but ``delay`` and ``unique_key``, and
    apply to every job. All or none: a bad payload raises `PayloadError` naming its
    position, and the COPY is abandoned. Traced, and told to the ``on_enqueue`` hooks, as
    `enqueue` is (one span and one hook call for all the jobs).
    """
    return insert_many(conn, *prepared_many(kind, payloads, options))


def insert_many(conn: psycopg.Connection, kind: str, payloads: Iterable[Any],
                options: JobOptions) -> int:
    """`enqueue_many` with its options made (`Handler.enqueue_many` comes here)."""
    queue = options.queue
    with tracing.sending(kind, queue, batch=True) as send:
        rows = copy_rows(kind, payloads, options, meta=send.meta)
        count = _copy(conn, rows, queue, options.run_at is not None,
                      traced=send.meta is not None)
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


@overload
async def enqueue_async(conn: psycopg.AsyncConnection, kind: str, payload: dict[str, Any],
                        **options: Unpack[EnqueueOptions]) -> int | None: ...
@overload
async def enqueue_async(conn: psycopg.AsyncConnection, kind: TypedKind[P],
                        payload: P | dict[str, Any],
                        **options: Unpack[EnqueueOptions]) -> int | None: ...
async def enqueue_async(conn: psycopg.AsyncConnection, kind: str | TypedKind[Any],
                        payload: Any, **options: Any) -> int | None:
    """Async twin of `enqueue`, for a psycopg `AsyncConnection`."""
    return await insert_async(conn, *prepared(kind, payload, options))


async def insert_async(conn: psycopg.AsyncConnection, kind: str, payload: Any,
                       options: JobOptions) -> int | None:
    """Async twin of `insert`."""
    params = _enqueue_params(kind, payload, options)
    with schema_required(), tracing.sending(kind, options.queue) as send:
        if send.meta is not None:
            params["meta"] = _jsonb(send.meta)
        row = await (await conn.execute(sql.ENQUEUE, params)).fetchone()
        job_id = None if row is None else row[0]
        send.sent(job_id, 1)
    hooks.enqueued(kind, options.queue, job_id, 0 if job_id is None else 1)
    return job_id


@overload
async def enqueue_many_async(conn: psycopg.AsyncConnection, kind: str,
                             payloads: Iterable[dict[str, Any]],
                             **options: Unpack[ManyOptions]) -> int: ...
@overload
async def enqueue_many_async(conn: psycopg.AsyncConnection, kind: TypedKind[P],
                             payloads: Iterable[P | dict[str, Any]],
                             **options: Unpack[ManyOptions]) -> int: ...
async def enqueue_many_async(conn: psycopg.AsyncConnection, kind: str | TypedKind[Any],
                             payloads: Iterable[Any], **options: Any) -> int:
    """Async twin of `enqueue_many`, for a psycopg `AsyncConnection`."""
    return await insert_many_async(conn, *prepared_many(kind, payloads, options))


async def insert_many_async(conn: psycopg.AsyncConnection, kind: str,
                            payloads: Iterable[Any], options: JobOptions) -> int:
    """Async twin of `insert_many`."""
    queue = options.queue
    with tracing.sending(kind, queue, batch=True) as send:
        rows = copy_rows(kind, payloads, options, meta=send.meta)
        count = await _copy_async(conn, rows, queue, options.run_at is not None,
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


def function_params(kind: str, payload: Any, options: JobOptions) -> dict[str, Any]:
    """The parameters of `sql.ENQUEUE_BY_FUNCTION` (a call of the SQL function
    ``pgpool_enqueue``) for one job, checked as `enqueue` checks its arguments: raises
    `PayloadError` or `ConfigError` before anything is sent. Plain values any PostgreSQL
    driver sends (the payload as JSON text), for drivers other than psycopg 3."""
    params = _enqueue_params(kind, payload, options, payload_as=bytes.decode)
    # The function takes run_at or delay (not both), and NULL for "no tenant".
    params.update(delay=None if options.run_at is not None else params["delay"],
                  tenant=options.tenant, max_payload_bytes=str(max_payload_bytes()))
    return params


def array_params(kind: str, payloads: Iterable[Any], options: JobOptions) -> dict[str, Any]:
    """The parameters of `sql.ENQUEUE_ARRAY` (the payloads as one JSON array, all or
    none, and ``total``, how many), checked as `enqueue_many` checks its arguments: a bad
    payload raises `PayloadError` naming its position, before anything is sent. For drivers
    other than psycopg 3, which have no ``COPY`` from Python, and for groups' members
    (`pgpool.groups`)."""
    check_name("kind", kind)
    columns = options.for_many("a group's members or an array of jobs").columns()
    del columns["delay"], columns["unique_key"]
    encoded = list(_each_encoded(payloads))
    return {**columns, "kind": kind,
            "payloads": (b"[" + b",".join(encoded) + b"]").decode(), "total": len(encoded),
            "max_payload_bytes": str(max_payload_bytes())}
