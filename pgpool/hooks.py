"""Lifecycle hooks: your functions, called when a job starts and ends in a worker, and after
an enqueue in the process that enqueued, for error reporting (Sentry and the like), metrics
or audit trails. `on_start` hooks are called as ``fn(job)`` with the `JobInfo`, before the
handler; `on_end` hooks as ``fn(job, outcome, exc)`` after it, with an `Outcome` and the
exception the handler raised (or None); `on_enqueue` hooks as ``fn(enqueued)`` with an
`Enqueued`, after an enqueue call that inserted jobs.

Register worker hooks at the import of a handler module: every worker imports the handler
modules when it starts (the dispatcher does too, and runs no job). Register ``on_enqueue``
in the application, once; one registered in a handler module also hears the jobs its
handlers enqueue, and the periodic ticks its dispatcher enqueues. Hooks run in the order
registered, in the calling thread, so keep them quick. A hook's own exception never fails
the job nor the enqueue: it is logged once per hook and process (the first time, with its
traceback), and the job goes on.

In a worker, ``on_start`` and ``on_end`` run while the job is current (`pgpool.current_job`
returns it, log records name it) and inside the job's consumer span when OpenTelemetry is
in use (`pgpool.tracing`). ``on_end`` is not called for an attempt that ends its worker
process: a timeout, a crash, a lost lease, a shutdown past its grace period; the dispatcher
records those (its logs, ``last_error``, metrics).

A worker with no ``on_start`` or ``on_end`` hook and without OpenTelemetry loaded pays one
check per job (`watched`); a producer with no ``on_enqueue`` hook, one per enqueue call.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from . import tracing
from .errors import ConfigError
from .job import JobInfo
from .logs import event
from .retry import Cancel, Discard, Snooze

log = logging.getLogger("pgpool.hooks")


class Outcome(StrEnum):
    """How a handler's run ended, as ``on_end`` hooks see it. A `str`: compare it with
    ``"done"``, ``"failed"``... More outcomes may come: test for the ones a hook handles
    rather than assume these."""

    #: The handler returned: the job succeeded.
    DONE = "done"
    #: The handler raised ``exc``: the attempt failed (retried later, or dead-lettered when
    #: it was the last, its `pgpool.Retry` does not retry the error, or its payload does
    #: not fit its type: `pgpool.PayloadDecodeError`).
    FAILED = "failed"
    #: The handler raised `pgpool.Snooze`: the job runs again later, no attempt used.
    SNOOZED = "snoozed"
    #: The handler raised `pgpool.Discard`: the job is dead-lettered as discarded.
    DISCARDED = "discarded"
    #: The handler raised `pgpool.Cancel`: the job is dead-lettered as cancelled.
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What ``on_enqueue`` hooks are told of an enqueue call that inserted jobs. Never the
    payloads: a hook that needs them has them at the call site."""

    kind: str
    queue: str
    #: The new job's id, from `pgpool.enqueue`; None from `pgpool.enqueue_many` (COPY
    #: returns no ids).
    job_id: int | None
    #: How many jobs the call inserted (1 from `pgpool.enqueue`).
    count: int


H = TypeVar("H", bound=Callable[..., object])

_on_start: list[Callable[..., object]] = []  # fn(job)
_on_end: list[Callable[..., object]] = []  # fn(job, outcome, exc)
_on_enqueue: list[Callable[..., object]] = []  # fn(enqueued)
#: Hooks whose failure was logged in this process: logged once each.
_failed: set[Callable[..., object]] = set()


def on_start(fn: H) -> H:
    """Call ``fn(job)`` in the worker before each job's handler runs; returns ``fn``, so
    it works as a decorator. Registering a function twice registers it once."""
    return _register(_on_start, fn, "on_start")


def on_end(fn: H) -> H:
    """Call ``fn(job, outcome, exc)`` in the worker after each job's handler returned
    (`Outcome.DONE`, ``exc`` None) or raised (`Outcome.FAILED`, ``exc`` the exception);
    returns ``fn``, so it works as a decorator."""
    return _register(_on_end, fn, "on_end")


def on_enqueue(fn: H) -> H:
    """Call ``fn(enqueued)`` (an `Enqueued`) after each `pgpool.enqueue`,
    `pgpool.enqueue_many` or async twin in this process that inserted jobs (a unique key's
    duplicate inserts nothing, and calls nothing). It runs inside the caller's transaction,
    which may still roll back. Returns ``fn``, so it works as a decorator."""
    return _register(_on_enqueue, fn, "on_enqueue")


def _register(hooks: list[Callable[..., object]], fn: H, name: str) -> H:
    if not callable(fn):
        raise ConfigError(f"pgpool.hooks.{name} takes a function, not a "
                          f"{type(fn).__name__}: decorate a def with @pgpool.hooks.{name}")
    if fn not in hooks:
        hooks.append(fn)
    return fn


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Hooks registered inside are forgotten on leaving: for code that registers hooks of
    its own in a process that goes on (the documentation's examples, run by the tests)."""
    kept = [list(hooks) for hooks in (_on_start, _on_end, _on_enqueue)]
    try:
        yield
    finally:
        for hooks, was in zip((_on_start, _on_end, _on_enqueue), kept, strict=True):
            hooks[:] = was


# --- the worker's side ----------------------------------------------------------------------


def watched() -> bool:
    """Whether a job must run inside `watching`: a start or end hook is registered, or
    OpenTelemetry is loaded in this process. The one check a worker makes per job."""
    return bool(_on_start or _on_end) or tracing.API in sys.modules


@contextlib.contextmanager
def watching(job: JobInfo, meta: bytes | None) -> Iterator[None]:
    """Run the handler call inside: in the job's consumer span when OpenTelemetry is loaded
    (linked to the trace context in ``meta``), after the ``on_start`` hooks and before the
    ``on_end`` hooks. The handler's exception goes on out, as it came in."""
    with tracing.processing(job, meta) if tracing.loaded() else _NO_SPAN as span:
        _call_each(_on_start, "on_start", job)
        try:
            yield
        except BaseException as exc:
            outcome = outcome_of(exc)
            if span is not None and outcome == Outcome.FAILED:
                span.failed(exc)
            _call_each(_on_end, "on_end", job, outcome, exc)
            raise
        _call_each(_on_end, "on_end", job, Outcome.DONE, None)


#: What `watching` runs in when OpenTelemetry is not loaded: no span.
_NO_SPAN = contextlib.nullcontext()


def outcome_of(exc: BaseException) -> Outcome:
    """The outcome of a handler that raised ``exc``."""
    match exc:
        case Snooze():
            return Outcome.SNOOZED
        case Discard():
            return Outcome.DISCARDED
        case Cancel():
            return Outcome.CANCELLED
    return Outcome.FAILED


# --- the producer's side --------------------------------------------------------------------


def enqueued(kind: str, queue: str, job_id: int | None, count: int) -> None:
    """Tell the ``on_enqueue`` hooks of an enqueue call that inserted ``count`` jobs (no
    hook, or no job: nothing to do)."""
    if _on_enqueue and count:
        _call_each(_on_enqueue, "on_enqueue", Enqueued(kind, queue, job_id, count))


def _call_each(hooks: list[Callable[..., object]], name: str, *args: object) -> None:
    for fn in hooks:
        try:
            fn(*args)
        except BaseException as exc:  # a hook may raise anything: the job goes on
            if fn in _failed:
                continue
            _failed.add(fn)
            where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
            event(log, logging.ERROR, "hook_failed",
                  "%s hook %s failed (%s), which fails nothing else; its later failures in "
                  "this process are not logged", name, where, type(exc).__name__,
                  exc_info=exc, hook=where, stage=name, error=type(exc).__name__)
