"""Handlers: the `Handler` object, registration, and handler-module loading.

A handler module is a plain module whose functions carry ``@pgpool.handler(kind)``, which
replaces each with a `Handler`: still callable as the function, and with the kind's
enqueue methods and defaults. Importing the module registers those handlers in this
process's registry. Both the dispatcher (to know which kinds it may claim, and their
timeouts and attempt limits) and every worker (to run them) import the same modules. A
job's kind never causes an import: only the configured modules are loaded, from
``--handlers``, ``PGPOOL_HANDLERS`` or installed packages' ``pgpool.handlers`` entry points.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias, TypeVar, Unpack, overload

from .enqueue import TypedKind, insert, insert_async, insert_many, insert_many_async
from .errors import ConfigError, HandlerError, PayloadError
from .job import MANY, EnqueueOptions, JobOptions, ManyOptions
from .limits import Limit
from .names import check_name
from .retry import Retry
from .sql import fleet as fleet_sql

if TYPE_CHECKING:  # see pgpool.enqueue: workers never import psycopg
    import psycopg
    from _typeshed import DataclassInstance

    from .payloads import Codec

    class _Model(Protocol):
        """A pydantic model, as a type checker sees one (pydantic is not imported)."""

        def model_dump(self) -> dict[str, Any]: ...

ENTRY_POINT_GROUP: Final = "pgpool.handlers"


#: The payload type of a handler: what its function takes (``dict[str, Any]`` for a plain
#: handler, a TypedDict, a dataclass or a pydantic model for a typed one).
P = TypeVar("P")

#: The payload type of a handler that takes a dict of its fields too: a dataclass or a
#: pydantic model (a TypedDict's instances are dicts already).
Built = TypeVar("Built", bound="DataclassInstance | _Model")

#: A handler's default key: a string, or a function of the payload computing one per job.
Key: TypeAlias = str | Callable[[Any], str | None] | None


class Handler(TypedKind[P]):
    """A registered handler: what ``@pgpool.handler(kind)`` turns a function into.

    Calling it calls the function as written (``thumbnail(payload)``). ``enqueue``,
    ``enqueue_many`` and their async twins put jobs of its kind in the table with its
    defaults (``queue``, ``priority``, ``tenant``, ``unique_key``, ``concurrency_key``),
    each overridable per call; for a typed handler they check and encode the payload first.
    ``timeout`` and ``max_attempts`` are the kind's limits, which hosts apply (see
    `handler`). Generic in the payload type ``P``, so a type checker sees a wrong payload;
    a dataclass's or pydantic model's handler takes a dict of its fields too, as at run
    time. Every function that takes a kind takes a Handler in its place
    (`pgpool.enqueue(conn, thumbnail, payload)`, `pgpool.group`, ``current_job().enqueue``,
    the integrations), with what its own ``enqueue`` applies.
    """

    def __init__(
        self,
        kind: str,
        fn: Callable[[P], Any],
        timeout: float | None = None,
        max_attempts: int | None = None,
        *,
        retry: Retry | None = None,
        queue: str | None = None,
        priority: int | None = None,
        tenant: str | None = None,
        unique_key: Key = None,
        concurrency_key: Key = None,
        codec: Codec | None = None,
        keep: float | None = None,
        soft_timeout: float | None = None,
        cpus: int = 1,
        limit: Limit | None = None,
    ) -> None:
        self.kind = kind
        """The kind of job it runs."""
        self.fn = fn
        """The function as written."""
        self.timeout = timeout
        """Seconds an attempt may run before its worker is killed; None: the host's."""
        self.soft_timeout = soft_timeout
        """Seconds after which `pgpool.SoftTimeout` is raised in an attempt; None: never."""
        self.cpus = cpus
        """The host's worker slots (``--procs``) an attempt takes while it runs."""
        self.max_attempts = max_attempts
        """Attempts a job of this kind gets when its producer did not say; None: 20."""
        self.retry = retry
        """Its retry schedule and which exceptions it retries; None: the host's default."""
        self.queue = queue
        """An enqueue default, as are ``priority`` and ``tenant``: None when not set (then
        `pgpool.enqueue`'s own default applies)."""
        self.priority = priority
        self.tenant = tenant
        self.unique_key = unique_key
        """A string, or a function of the (typed) payload called per job."""
        self.concurrency_key = concurrency_key
        """A string, or a function of the (typed) payload called per job."""
        self.payload_type: type | None = None if codec is None else codec.type
        """The payload's declared type (a TypedDict, a dataclass or a pydantic model); None
        for a plain handler, whose payload is the JSON object as stored."""
        self._codec = codec
        self.run: Callable[[Any], Any] = fn if codec is None else _decoding(fn, codec)
        """What a worker calls with a job's payload as decoded from JSON: the function, with
        the payload decoded into its type first (typed handlers: `PayloadError` naming the
        field when it does not fit). An ``async def``'s coroutine comes back, to be run."""
        self.limit = limit
        """Its fleet-wide limit (`pgpool.Limit`), which hosts apply at claim; None: none."""
        self.keep = keep
        """Seconds a success of this kind is kept in ``pgpool_done`` with what the handler
        returned (`pgpool.outcomes`); None: not kept (unless the host keeps all)."""
        # The defaults enqueue applies (max_attempts is not one: hosts apply the kind's
        # limit at claim, as for jobs enqueued by kind); a key that is a function of the
        # payload is computed per job (`prepare`).
        self.defaults = _defaults(queue, priority, tenant, unique_key, concurrency_key)
        """Its enqueue defaults, checked: the keys that are functions are not among them."""
        self._key_functions = {name: key for name, key in (
            ("unique_key", unique_key), ("concurrency_key", concurrency_key)) if callable(key)}
        functools.update_wrapper(self, fn)  # its name, module, docstring, __wrapped__

    @property
    def qualname(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def __call__(self, payload: P) -> Any:
        """Call the function as written, with ``payload`` as given."""
        return self.fn(payload)

    def _check_width(self, widest: tuple[int | None] | None) -> None:
        """Warn, once per kind and process, when the widest live host (``widest``: its
        ``--procs``, None when no host is live) has fewer slots than this kind's ``cpus``:
        its jobs would wait until a wider host starts."""
        procs = None if widest is None else widest[0]
        if procs is None or procs >= self.cpus or self.kind in _warned_wide:
            return
        _warned_wide.add(self.kind)
        log.warning("kind %r takes %d cpus, more than every live host's --procs (at most "
                    "%d): its jobs wait until a host with --procs %d or more runs it",
                    self.kind, self.cpus, procs, self.cpus)

    def __repr__(self) -> str:
        return f"<pgpool.Handler {self.kind!r}: {self.qualname}>"

    # The methods that take a payload are overloaded, for a type checker: a dataclass's or
    # pydantic model's handler takes a dict of its fields too (`pgpool.payloads` checks that
    # it fits), any other takes its payload type (a TypedDict's: a dict literal checked
    # against it).
    @overload
    def encode(self: Handler[Built], payload: Built | dict[str, Any]) -> dict[str, Any]: ...
    @overload
    def encode(self, payload: P) -> dict[str, Any]: ...
    def encode(self, payload: Any) -> dict[str, Any]:
        """``payload`` as it is stored: checked against a typed handler's payload type
        (`PayloadError` naming the field), given back as is for a plain handler."""
        if self._codec is None:
            encoded: dict[str, Any] = payload  # a plain handler's is the dict
            return encoded
        return self._codec.encode(payload)[0]

    def decode(self, stored: Any) -> P:
        """A stored payload (the JSON object) as the function receives it: decoded into a
        typed handler's payload type (`PayloadError` naming the field when it does not
        fit), as is for a plain handler."""
        decoded: P = stored if self._codec is None else self._codec.decode(stored)
        return decoded

    @overload
    def enqueue(self: Handler[Built], conn: psycopg.Connection[Any],
                payload: Built | dict[str, Any],
                **options: Unpack[EnqueueOptions]) -> int | None: ...
    @overload
    def enqueue(self, conn: psycopg.Connection[Any], payload: P,
                **options: Unpack[EnqueueOptions]) -> int | None: ...
    def enqueue(self, conn: psycopg.Connection[Any], payload: Any,
                **options: Any) -> int | None:
        """`pgpool.enqueue` of a job of this kind: its id, or None for a duplicate
        ``unique_key``. The handler's defaults apply unless an option is given; a typed
        payload (an instance of its type, or a dict that fits it) is checked and encoded
        first (`PayloadError` naming the field, nothing sent)."""
        data, chosen = self.prepare(payload, options)
        if self.cpus > 1:
            self._check_width(conn.execute(fleet_sql.WIDEST_LIVE_HOST, _STALE).fetchone())
        return insert(conn, self.kind, data, chosen)

    @overload
    async def enqueue_async(self: Handler[Built], conn: psycopg.AsyncConnection[Any],
                            payload: Built | dict[str, Any],
                            **options: Unpack[EnqueueOptions]) -> int | None: ...
    @overload
    async def enqueue_async(self, conn: psycopg.AsyncConnection[Any], payload: P,
                            **options: Unpack[EnqueueOptions]) -> int | None: ...
    async def enqueue_async(self, conn: psycopg.AsyncConnection[Any], payload: Any,
                            **options: Any) -> int | None:
        """Async twin of `enqueue`, for a psycopg `AsyncConnection`."""
        data, chosen = self.prepare(payload, options)
        if self.cpus > 1:
            self._check_width(await (await conn.execute(fleet_sql.WIDEST_LIVE_HOST,
                                                        _STALE)).fetchone())
        return await insert_async(conn, self.kind, data, chosen)

    @overload
    def enqueue_many(self: Handler[Built], conn: psycopg.Connection[Any],
                     payloads: Iterable[Built | dict[str, Any]],
                     **options: Unpack[ManyOptions]) -> int: ...
    @overload
    def enqueue_many(self, conn: psycopg.Connection[Any], payloads: Iterable[P],
                     **options: Unpack[ManyOptions]) -> int: ...
    def enqueue_many(self, conn: psycopg.Connection[Any], payloads: Iterable[Any],
                     **options: Any) -> int:
        """`pgpool.enqueue_many` of jobs of this kind, through COPY, all or none: how many
        were inserted. A typed payload that does not fit fails the call (`PayloadError`
        naming its position and field) and none is inserted.

        Raises `ConfigError` for a handler with a ``unique_key`` (COPY does not
        deduplicate), and for one whose ``concurrency_key`` is a function unless the call
        gives the one key all its jobs get."""
        data, chosen = self.prepare_many(payloads, options)
        if self.cpus > 1:
            self._check_width(conn.execute(fleet_sql.WIDEST_LIVE_HOST, _STALE).fetchone())
        return insert_many(conn, self.kind, data, chosen)

    @overload
    async def enqueue_many_async(self: Handler[Built], conn: psycopg.AsyncConnection[Any],
                                 payloads: Iterable[Built | dict[str, Any]],
                                 **options: Unpack[ManyOptions]) -> int: ...
    @overload
    async def enqueue_many_async(self, conn: psycopg.AsyncConnection[Any],
                                 payloads: Iterable[P],
                                 **options: Unpack[ManyOptions]) -> int: ...
    async def enqueue_many_async(self, conn: psycopg.AsyncConnection[Any],
                                 payloads: Iterable[Any], **options: Any) -> int:
        """Async twin of `enqueue_many`, for a psycopg `AsyncConnection`."""
        data, chosen = self.prepare_many(payloads, options)
        if self.cpus > 1:
            self._check_width(await (await conn.execute(fleet_sql.WIDEST_LIVE_HOST,
                                                        _STALE)).fetchone())
        return await insert_many_async(conn, self.kind, data, chosen)

    def prepare(self, payload: Any, options: Mapping[str, Any]) -> tuple[Any, JobOptions]:
        """What `enqueue` inserts for ``payload`` with ``options``: (the payload to store,
        the options), the handler's defaults under the given options, and the keys computed
        from the payload where a default is a function. `PayloadError` when a typed
        payload does not fit; `ConfigError` for a bad option."""
        data: Any = payload
        typed: Any = payload
        if self._codec is not None:
            data, typed = self._codec.encode(payload)
        if self._key_functions:
            options = {**{name: key(typed) for name, key in self._key_functions.items()
                          if name not in options}, **options}
        return data, JobOptions.of(options, over=self.defaults, what=f"{self.kind}.enqueue")

    def prepare_many(self, payloads: Iterable[Any], options: Mapping[str, Any]
                     ) -> tuple[Iterable[Any], JobOptions]:
        """What `enqueue_many` inserts: (the payloads to store, encoded one by one as they
        are consumed, the options). `ConfigError` for a default COPY cannot apply."""
        if self.unique_key is not None:
            raise ConfigError(
                f"handler {self.kind!r} has a unique_key, which enqueue_many cannot apply "
                "(COPY does not deduplicate): enqueue its jobs one by one with .enqueue"
            )
        if "concurrency_key" in self._key_functions and "concurrency_key" not in options:
            raise ConfigError(
                f"handler {self.kind!r} computes its concurrency_key per payload, and "
                "enqueue_many gives all its jobs one: pass concurrency_key= to this call, or "
                "enqueue the jobs one by one with .enqueue"
            )
        chosen = JobOptions.of(options, over=self.defaults, allowed=MANY,
                               what=f"{self.kind}.enqueue_many")
        codec = self._codec
        return (payloads if codec is None else _encoded(codec, payloads)), chosen


def _encoded(codec: Codec, payloads: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The payloads checked and encoded one by one, as COPY consumes them."""
    for i, payload in enumerate(payloads):
        try:
            yield codec.encode(payload)[0]
        except PayloadError as exc:
            raise PayloadError(f"payload #{i} (0-based): {exc}") from None


log = logging.getLogger("pgpool.enqueue")

_registry: dict[str, Handler[Any]] = {}
#: Kinds whose enqueue warned that no live host is wide enough (`Handler._check_width`).
_warned_wide: set[str] = set()
#: `fleet_sql.WIDEST_LIVE_HOST`'s parameters: a host is live as `pgpool status` says.
_STALE: Final = {"stale_leases": fleet_sql.STALE_AFTER_LEASES}
#: Longest ``keep=``: 100 years, as a delay's limit.
MAX_KEEP_SECONDS: Final = 100 * 366 * 86400


def handler(
    kind: str,
    *,
    timeout: float | None = None,
    max_attempts: int | None = None,
    retry: Retry | None = None,
    queue: str | None = None,
    priority: int | None = None,
    tenant: str | None = None,
    unique_key: Key = None,
    concurrency_key: Key = None,
    keep: float | timedelta | None = None,
    soft_timeout: float | None = None,
    cpus: int = 1,
    limit: Limit | None = None,
) -> Callable[[Callable[[P], Any]], Handler[P]]:
    """Register ``fn(payload)`` as the handler for jobs of ``kind``; return its `Handler`.

    ``timeout`` (seconds) is a hard limit per attempt: past it the worker running the job is
    killed and replaced, and the attempt fails. ``soft_timeout`` (seconds, below
    ``timeout``) is a warning before it: `pgpool.SoftTimeout` is raised in the handler that
    many seconds into an attempt, so it can checkpoint and clean up (within milliseconds in
    Python code; inside a long C call, once that call returns to Python). ``max_attempts``
    is how many attempts a job of this kind gets when its producer did not say; after the
    last failure it moves to ``pgpool_dead``. A raised exception fails the attempt;
    returning normally succeeds it. ``cpus`` is how many of a host's ``--procs`` slots an
    attempt takes while it runs (a handler that uses several cores: numpy, a thread pool,
    a subprocess; ``current_job().cpus`` says how many it may use): a host never runs more
    slots than it has, and a host with fewer ``--procs`` does not claim the kind.
    ``retry`` (a `pgpool.Retry`) replaces the default retry schedule for this kind's jobs;
    its ``attempts`` is then the handler's ``max_attempts`` (give one or the other).
    An ``async def`` handler is run to completion in a fresh event loop per attempt.

    ``queue``, ``priority``, ``tenant``, ``unique_key`` and ``concurrency_key`` are what the
    handler's ``enqueue`` methods use when a call does not say; ``unique_key`` and
    ``concurrency_key`` may be functions of the payload, called per job.

    When ``fn``'s payload parameter is annotated with a TypedDict, a dataclass or a
    pydantic v2 model, the payload is typed: the enqueue methods check and encode it, and
    workers decode the stored JSON into that type before calling ``fn`` (see
    [Typed payloads](../guides/handlers.md#typed-payloads) for the supported field types;
    another raises `HandlerError` here, naming it). Any other annotation, or none, leaves
    the payload a plain dict.

    ``keep`` (seconds, or a timedelta) keeps each success of this kind that long in
    ``pgpool_done``, with the value the handler returned (JSON, at most
    ``PGPOOL_MAX_RESULT_BYTES``, 1 MiB by default), for `pgpool.job_status` and
    `pgpool.wait` to report; a value that cannot be stored dead-letters the job with the
    reason. Without ``keep`` (and without the host's ``--keep-done``), a returned value is
    dropped and a warning naming the kind and the value's type, never the value, is logged
    once per kind and host; a member of a group keeps its value for its callback either way.

    ``limit`` (a `pgpool.Limit`) bounds how many jobs of this kind run at once in the whole
    fleet, whatever the number of hosts (see [Limits](../guides/limits.md)).

    ``fn`` must be a plain function (``def`` or ``async def``) defined at the top level of
    its module, since workers import it by module and name; a generator, a method, a class,
    a lambda, a nested function or a non-callable raises `HandlerError`.
    """
    check_name("kind", kind)
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise HandlerError(f"handler {kind!r}: timeout must be a positive number of seconds")
    if soft_timeout is not None and (
            not isinstance(soft_timeout, int | float) or isinstance(soft_timeout, bool)
            or not 0 < soft_timeout < (timeout or math.inf)):
        raise HandlerError(f"handler {kind!r}: soft_timeout must be a positive number of "
                           f"seconds below its timeout ({timeout}), got {soft_timeout!r}")
    if not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 1:
        raise HandlerError(f"handler {kind!r}: cpus must be a positive integer (the worker "
                           f"slots an attempt takes), got {cpus!r}")
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise HandlerError(f"handler {kind!r}: max_attempts must be a positive integer")
    if retry is not None:
        if not isinstance(retry, Retry):
            raise HandlerError(f"handler {kind!r}: retry must be a pgpool.Retry(...), got a "
                               f"{type(retry).__name__}")
        if retry.attempts is not None:
            if max_attempts is not None:
                raise HandlerError(f"handler {kind!r}: max_attempts and retry=Retry(attempts="
                                   "...) both set the attempts: give only one of them")
            max_attempts = retry.attempts
    _check_defaults(kind, queue, priority, tenant, unique_key, concurrency_key)
    if limit is not None and not isinstance(limit, Limit):
        raise HandlerError(f"handler {kind!r}: limit must be a pgpool.Limit(...), got a "
                           f"{type(limit).__name__}")
    kept = keep_seconds(f"handler {kind!r}: keep", keep)

    def register(fn: Callable[[P], Any]) -> Handler[P]:
        if isinstance(fn, Handler):  # stacked: one function for two kinds
            fn = fn.fn
        _check_function(kind, fn)
        codec = None
        if _maybe_typed(fn):
            from .payloads import codec_for  # only typed handlers' processes import it

            codec = codec_for(kind, fn)
        new = Handler(kind, fn, float(timeout) if timeout else None, max_attempts,
                      retry=retry, queue=queue, priority=priority, tenant=tenant,
                      unique_key=unique_key, concurrency_key=concurrency_key, codec=codec,
                      keep=kept,
                      soft_timeout=None if soft_timeout is None else float(soft_timeout),
                      cpus=cpus, limit=limit)
        old = _registry.get(kind)
        if old is not None and old.qualname != new.qualname:
            raise HandlerError(
                f"kind {kind!r} is registered twice, by {old.qualname} and {new.qualname}: "
                "give one of them another kind"
            )
        _registry[kind] = new
        return new

    return register


def _check_defaults(kind: str, queue: object, priority: object, tenant: object,
                    unique_key: object, concurrency_key: object) -> None:
    """Refuse bad enqueue defaults at registration, not at the first enqueue."""
    for name, value in (("unique_key", unique_key), ("concurrency_key", concurrency_key)):
        if value is not None and not isinstance(value, str) and not callable(value):
            raise HandlerError(f"handler {kind!r}: {name} must be a string or a function "
                               "of the payload that returns one")
    try:
        _defaults(queue, priority, tenant, unique_key, concurrency_key)
    except ConfigError as exc:
        raise HandlerError(f"handler {kind!r}: {exc}") from None


def _defaults(queue: Any, priority: Any, tenant: Any, unique_key: Any,
              concurrency_key: Any) -> JobOptions:
    """A handler's enqueue defaults (None: not set), checked; its keys that are functions
    of the payload are left out (computed per job)."""
    return JobOptions("default" if queue is None else queue,
                      0 if priority is None else priority, tenant=tenant,
                      unique_key=None if callable(unique_key) else unique_key,
                      concurrency_key=None if callable(concurrency_key) else concurrency_key)


def _check_function(kind: str, fn: object) -> None:
    """Refuse what a worker could not run as a handler, naming what to write instead."""
    fix = "decorate a plain `def` (or `async def`) at the top level of a module"
    if not inspect.isfunction(fn):
        what = ("a class" if inspect.isclass(fn) else "a method" if inspect.ismethod(fn)
                else f"a {type(fn).__name__}" if callable(fn)
                else f"not callable (a {type(fn).__name__})")
        raise HandlerError(f"handler {kind!r} is {what}: {fix}")
    where = f"{fn.__module__}.{fn.__qualname__}"
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise HandlerError(f"handler {kind!r} ({where}) is a generator function, whose body "
                           "would never run: use return instead of yield")
    if "<" in fn.__qualname__ or "." in fn.__qualname__:
        # <lambda>, f.<locals>.g, or Class.method: workers import handlers by module and name.
        raise HandlerError(f"handler {kind!r} ({where}) cannot be imported by its module and "
                           f"name: {fix}")


def _maybe_typed(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s payload parameter has an annotation that may be a payload type (a
    TypedDict, dataclass or pydantic model); False, at a glance, for none, a dict or Any."""
    code = fn.__code__
    raw = fn.__annotations__.get(code.co_varnames[0]) if code.co_argcount else None
    if raw is None:
        return False
    if isinstance(raw, str):  # from __future__ import annotations
        head = raw.replace("typing.", "").split("[", 1)[0].strip()
        return head not in ("dict", "Dict", "Mapping", "Any", "object")
    return raw not in (dict, Any, object) and getattr(raw, "__origin__", None) is not dict


def _decoding(fn: Callable[[Any], Any], codec: Codec) -> Callable[[Any], Any]:
    """``fn`` taking the stored JSON, decoded into its payload type (`PayloadError` naming
    the field when it does not fit)."""

    def call(payload: Any) -> Any:
        return fn(codec.decode(payload))

    return call


def keep_seconds(what: str, keep: float | timedelta | None) -> float | None:
    """``keep=`` as seconds: None (or 0) keeps nothing; a positive number of seconds or a
    timedelta, up to 100 years. `HandlerError` naming ``what`` otherwise."""
    seconds = keep.total_seconds() if isinstance(keep, timedelta) else keep
    if seconds is None or (seconds == 0 and not isinstance(seconds, bool)):
        return None
    if (not isinstance(seconds, int | float) or isinstance(seconds, bool)
            or not 0 < seconds <= MAX_KEEP_SECONDS):
        raise HandlerError(f"{what} must be a number of seconds above 0 (at most 100 years) "
                           f"or a timedelta, got {keep!r}")
    return float(seconds)


def registered() -> dict[str, Handler[Any]]:
    """A copy of this process's registry: kind -> Handler."""
    return dict(_registry)


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Handlers registered inside are forgotten on leaving, and the registry is as it was:
    for code that declares handlers of its own in a process that goes on (the examples of
    the documentation, run by the test suite)."""
    kept = dict(_registry)
    try:
        yield
    finally:
        _registry.clear()
        _registry.update(kept)


def resolve_modules(cli_modules: Iterable[str] | None) -> list[str]:
    """The handler modules to import: ``--handlers`` if given, else ``PGPOOL_HANDLERS``."""
    modules = list(cli_modules or [])
    if not modules:
        env = os.environ.get("PGPOOL_HANDLERS", "")
        modules = [m.strip() for m in env.split(",") if m.strip()]
    for m in modules:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", m):
            raise ConfigError(
                f"invalid handler module name {m!r}: give a dotted Python module path "
                "such as myapp.jobs"
            )
    return modules


def load(modules: Iterable[str],
         entry_points: Mapping[str, str] | None = None) -> dict[str, Handler[Any]]:
    """Import the handler modules, then the ``entry_points`` modules (`entry_point_modules`:
    a dispatcher finds them once, and passes them on to its workers among ``modules``,
    since reading the installed packages' metadata cost each worker 60 ms at its start);
    return the registry.

    The current directory is importable first, as with ``python -m``. Raises `HandlerError`
    with the module's own error when one fails to import, when nothing got registered, and
    when a handler is no longer its module's attribute of the same name (workers could not
    be sure to run the same function).
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    for name in modules:
        _import(name, f"handler module {name!r}")
    for name, what in (entry_points or {}).items():
        _import(name, what)
    if not _registry:
        raise HandlerError(
            "no handlers registered: pass --handlers MODULE (a module using "
            "@pgpool.handler), set PGPOOL_HANDLERS, or install a package with a "
            f"{ENTRY_POINT_GROUP!r} entry point"
        )
    for h in _registry.values():
        found = getattr(sys.modules.get(h.fn.__module__), h.fn.__qualname__, None)
        # The Handler, or its function (registered by a call rather than as a decorator).
        if (found.fn if isinstance(found, Handler) else found) is not h.fn:
            raise HandlerError(
                f"handler {h.kind!r} ({h.qualname}) cannot be imported by its module and name "
                "once the module is loaded: keep the decorated function under its own name"
            )
    return registered()


def entry_point_modules() -> dict[str, str]:
    """The modules of the installed ``pgpool.handlers`` entry points, each with how an error
    names it: what `load` imports after the handler modules given."""
    from importlib.metadata import entry_points  # 50 ms to import: only when needed

    return {ep.value.split(":")[0]: f"entry point {ep.name!r} ({ep.value})"
            for ep in entry_points(group=ENTRY_POINT_GROUP)}


def select(handlers: dict[str, Handler[Any]],
           kinds: Iterable[str] | None) -> dict[str, Handler[Any]]:
    """The handlers of ``kinds`` only (``pgpool run --kinds``: a pool serving some of the
    kinds its modules register); all of them when ``kinds`` is None. Raises `ConfigError`
    naming the registered kinds when one of ``kinds`` is not among them."""
    if kinds is None:
        return handlers
    wanted = list(dict.fromkeys(kinds))
    unknown = [k for k in wanted if k not in handlers]
    if unknown:
        raise ConfigError(
            f"--kinds names {', '.join(map(repr, unknown))}, which no handler module "
            f"registers: the registered kinds are {', '.join(sorted(handlers))}"
        )
    return {k: handlers[k] for k in wanted}


def _import(module: str, what: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise HandlerError(
                f"{what} not found: check the name, and run pgpool from the directory that "
                "contains it or install it in this environment"
            ) from None
        raise HandlerError(f"{what} failed to import: {_last_line(exc)}") from None
    except HandlerError:
        raise
    except BaseException as exc:  # a handler module may raise anything, even SystemExit
        raise HandlerError(f"{what} failed to import: {_last_line(exc)}") from None


def _last_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, SyntaxError):  # its text already names the file and line
        return f"{type(exc).__name__}: {text}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen ")]
    if not frames:
        return f"{type(exc).__name__}: {text}"
    last = frames[-1]
    return f"{type(exc).__name__}: {text} ({os.path.basename(last.filename)}, line {last.lineno})"
