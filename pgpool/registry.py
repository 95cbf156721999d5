"""Handler registration and handler-module loading.

A handler module is a plain module whose functions carry ``@pgpool.handler(kind)``.
Importing it registers those functions in this process's registry. Both the dispatcher
(to know which kinds it may claim, and their timeouts and attempt limits) and every worker
(to run them) import the same modules. A job's kind never causes an import: only the
configured modules are loaded, from ``--handlers``, ``PGPOOL_HANDLERS`` or installed
packages' ``pgpool.handlers`` entry points.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Final, TypeVar

from .errors import ConfigError, HandlerError

ENTRY_POINT_GROUP: Final = "pgpool.handlers"

#: Kinds and queue names: short, printable, no whitespace; safe in logs and process titles.
NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")

F = TypeVar("F", bound=Callable[[dict[str, Any]], None])


@dataclass(frozen=True)
class Handler:
    kind: str
    fn: Callable[[dict[str, Any]], None]
    timeout: float | None
    max_attempts: int | None

    @property
    def qualname(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


_registry: dict[str, Handler] = {}


def check_name(what: str, value: object) -> str:
    """Validate a kind or queue name; raise `ConfigError` naming the rule otherwise."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ConfigError(
            f"invalid {what} {value!r}: use 1-128 characters from letters, digits and _ . : / -"
            ", starting with a letter, digit or _"
        )
    return value


def handler(
    kind: str, *, timeout: float | None = None, max_attempts: int | None = None
) -> Callable[[F], F]:
    """Register ``fn(payload: dict) -> None`` as the handler for jobs of ``kind``.

    ``timeout`` (seconds) is a hard limit per attempt: past it the worker running the job is
    killed and replaced, and the attempt fails. ``max_attempts`` is how many attempts a job
    of this kind gets when its producer did not say; after the last failure it moves to
    ``pgpool_dead``. A raised exception fails the attempt; returning normally succeeds it.
    An ``async def`` handler is run to completion in a fresh event loop per attempt.
    """
    check_name("kind", kind)
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise HandlerError(f"handler {kind!r}: timeout must be a positive number of seconds")
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise HandlerError(f"handler {kind!r}: max_attempts must be a positive integer")

    def register(fn: F) -> F:
        new = Handler(kind, fn, float(timeout) if timeout else None, max_attempts)
        old = _registry.get(kind)
        if old is not None and old.qualname != new.qualname:
            raise HandlerError(
                f"kind {kind!r} is registered twice, by {old.qualname} and {new.qualname}: "
                "give one of them another kind"
            )
        _registry[kind] = new
        return fn

    return register


def registered() -> dict[str, Handler]:
    """A copy of this process's registry: kind -> Handler."""
    return dict(_registry)


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
    with the module's own error when one fails to import, and when nothing got registered.
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
    return registered()


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
