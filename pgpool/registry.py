"""Handler registration and handler-module loading.

A handler module is a plain module whose functions carry ``@pgpool.handler(kind)``.
Importing it registers those functions in this process's registry. Both the dispatcher
(to know which kinds it may claim, and their timeouts and attempt limits) and every worker
(to run them) import the same modules. A job's kind never causes an import: only the
configured modules are loaded, from ``--handlers``, ``PGPOOL_HANDLERS`` or installed
packages' ``pgpool.handlers`` entry points.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Final, TypeVar

from .errors import ConfigError, HandlerError
from .retry import Retry

ENTRY_POINT_GROUP: Final = "pgpool.handlers"

log = logging.getLogger("pgpool.registry")

#: Kinds and queue names: short, printable, no whitespace; safe in logs and process titles.
NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")

F = TypeVar("F", bound=Callable[[dict[str, Any]], None])


@dataclass(frozen=True)
class Handler:
    """A registered handler. ``fn`` is what a worker calls: the decorated function, wrapped
    (by `handler`) so that a value it returns is dropped with a warning."""

    kind: str
    fn: Callable[[dict[str, Any]], Any]  # None, or a coroutine for the worker to run
    timeout: float | None
    max_attempts: int | None
    #: The handler's retry schedule; None: the dispatcher's default.
    retry: Retry | None = None

    @property
    def qualname(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


_registry: dict[str, Handler] = {}
#: Kinds whose handler returned a value in this process: the warning is given once per kind.
_returned_values: set[str] = set()


def check_name(what: str, value: object) -> str:
    """Validate a kind or queue name; raise `ConfigError` naming the rule otherwise."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ConfigError(
            f"invalid {what} {value!r}: use 1-128 characters from letters, digits and _ . : / -"
            ", starting with a letter, digit or _"
        )
    return value


def name_arg(what: str) -> Callable[[str], str]:
    """`check_name` as an argparse ``type``: a bad name is the parser's one-line error."""
    def parse(text: str) -> str:
        try:
            return check_name(what, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def handler(
    kind: str, *, timeout: float | None = None, max_attempts: int | None = None,
    retry: Retry | None = None,
) -> Callable[[F], F]:
    """Register ``fn(payload: dict) -> None`` as the handler for jobs of ``kind``.

    ``timeout`` (seconds) is a hard limit per attempt: past it the worker running the job is
    killed and replaced, and the attempt fails. ``max_attempts`` is how many attempts a job
    of this kind gets when its producer did not say; after the last failure it moves to
    ``pgpool_dead``. A raised exception fails the attempt; returning normally succeeds it.
    ``retry`` (a `pgpool.Retry`) replaces the default retry schedule for this kind's jobs;
    its ``attempts`` is then the handler's ``max_attempts`` (give one or the other).
    An ``async def`` handler is run to completion in a fresh event loop per attempt.

    A value the handler returns is ignored (the attempt still succeeds), and a warning
    naming the kind and the value's type, never the value, is logged once per kind and
    process: nothing stores results, and failing would repeat the job's side effects.

    ``fn`` must be a plain function (``def`` or ``async def``) defined at the top level of
    its module, since workers import it by module and name; a generator, a method, a class,
    a lambda, a nested function or a non-callable raises `HandlerError`.
    """
    check_name("kind", kind)
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise HandlerError(f"handler {kind!r}: timeout must be a positive number of seconds")
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

    def register(fn: F) -> F:
        _check_function(kind, fn)
        new = Handler(kind, _returning_none(kind, fn), float(timeout) if timeout else None,
                      max_attempts, retry)
        old = _registry.get(kind)
        if old is not None and old.qualname != new.qualname:
            raise HandlerError(
                f"kind {kind!r} is registered twice, by {old.qualname} and {new.qualname}: "
                "give one of them another kind"
            )
        _registry[kind] = new
        return fn

    return register


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


def _returning_none(kind: str, fn: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    """``fn``, with a returned value (also an ``async def``'s) dropped with a warning."""

    @functools.wraps(fn)
    def call(payload: dict[str, Any]) -> Any:
        result = fn(payload)
        if inspect.iscoroutine(result):  # the worker runs it to completion
            return _awaited(kind, result)
        _ignore_result(kind, result)
        return None

    return call


async def _awaited(kind: str, coroutine: Coroutine[Any, Any, Any]) -> None:
    _ignore_result(kind, await coroutine)


def _ignore_result(kind: str, result: object) -> None:
    if result is None or kind in _returned_values:
        return
    _returned_values.add(kind)
    # The type only: a returned value may hold the payload's data.
    log.warning("handler %r returned a %s, which pgpool ignores: return None, and store "
                "results yourself (logged once per kind and worker)", kind,
                type(result).__name__)


def registered() -> dict[str, Handler]:
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


def load(modules: Iterable[str]) -> dict[str, Handler]:
    """Import the handler modules and entry points; return the registry.

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
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _import(ep.value.split(":")[0], f"entry point {ep.name!r} ({ep.value})")
    if not _registry:
        raise HandlerError(
            "no handlers registered: pass --handlers MODULE (a module using "
            "@pgpool.handler), set PGPOOL_HANDLERS, or install a package with a "
            f"{ENTRY_POINT_GROUP!r} entry point"
        )
    for h in _registry.values():
        module = sys.modules.get(h.fn.__module__)
        if getattr(module, h.fn.__qualname__, None) is None:
            raise HandlerError(
                f"handler {h.kind!r} ({h.qualname}) cannot be imported by its module and name "
                "once the module is loaded: keep the decorated function under its own name"
            )
    return registered()


def select(handlers: dict[str, Handler], kinds: Iterable[str] | None) -> dict[str, Handler]:
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
