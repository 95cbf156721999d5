"""OpenTelemetry tracing of jobs: an enqueue records the trace it happens in with the job,
and the worker runs the handler in a span linked to it.

Optional (the ``pgpool[otel]`` extra installs ``opentelemetry-api``); the application
configures the SDK and its exporter, in the producer and in a handler module. pgpool never
imports OpenTelemetry itself: each step first checks that the application did
(``sys.modules``, `loaded`), so a process without it pays a dictionary lookup per call.

The producer: an enqueue call made while a valid span is current runs in a PRODUCER span
``send <queue>`` (``messaging.operation.type`` "send"), and the jobs it inserts carry that
span's W3C trace context (``traceparent``, ``tracestate``) in their ``meta`` column. Its own
span rather than the caller's: the messaging conventions pair a PRODUCER span with the
CONSUMER spans that link to it, and it times the insert. It ends when the call returns;
the jobs exist for others once the caller's transaction commits. Without a current span,
nothing is recorded (``meta`` stays NULL). (With a current span but no tracer provider set
in the process, OpenTelemetry's no-op tracer makes no span, and the jobs carry the
current span's context.)

The consumer: each run of a handler is a CONSUMER span ``process <queue>``
(``messaging.operation.type`` "process"), the root of a trace of its own, linked to the
producer's span (a job may run long after, and many times): a link, not a parent, as the
messaging conventions have it. The handler's own spans are its children. A handler that
raises has the exception recorded on it, ``error.type`` set and the status ERROR.

Attributes, after the OpenTelemetry semantic conventions for messaging: ``messaging.system``
"pgpool", ``messaging.destination.name`` (the queue), ``messaging.operation.type`` and
``messaging.operation.name``, ``messaging.message.id`` (the job id, as text: of one job),
``messaging.batch.message_count`` (`pgpool.enqueue_many`), and pgpool's own
``messaging.pgpool.job.kind`` and ``messaging.pgpool.job.attempt`` (the attempt as counted
against ``max_attempts``).
"""

from __future__ import annotations

import functools
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import orjson

from .job import JobInfo

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

#: The module whose presence says the application uses OpenTelemetry in this process.
API: Final = "opentelemetry.trace"
#: ``messaging.system``.
SYSTEM: Final = "pgpool"

_tracer: Tracer | None = None


def loaded() -> bool:
    """Whether OpenTelemetry's API is imported in this process: only then can a span be
    current, or a tracer provider be set."""
    return API in sys.modules


def _get_tracer() -> Tracer:
    global _tracer
    if _tracer is None:
        from importlib.metadata import version

        from opentelemetry import trace

        # A tracer got before the application sets its provider follows it once set.
        _tracer = trace.get_tracer("pgpool", version("pgpool"))
    return _tracer


@functools.cache
def _propagator() -> Any:
    """The W3C trace-context propagator, made once (each traced enqueue and job uses it)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


class _Span:
    """A span made current for a ``with`` block: ended, and the context before it back, on
    leaving."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self._token: Token[Context] | None = None

    def __enter__(self) -> Self:
        from opentelemetry import context, trace

        self._token = context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        from opentelemetry import context

        if self._token is not None:
            context.detach(self._token)
        self.span.end()

    def failed(self, exc: BaseException) -> None:
        """The work in the span raised ``exc``: recorded, ``error.type``, status ERROR."""
        from opentelemetry.trace import Status, StatusCode

        self.span.record_exception(exc)
        cls = type(exc)
        self.span.set_attribute("error.type", cls.__qualname__ if cls.__module__ == "builtins"
                                else f"{cls.__module__}.{cls.__qualname__}")
        self.span.set_status(Status(StatusCode.ERROR, cls.__name__))


class Send(_Span):
    """The PRODUCER span of one enqueue call; `meta` is what its jobs carry."""

    def __init__(self, kind: str, queue: str, batch: bool) -> None:
        from opentelemetry import trace

        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue,
            "messaging.pgpool.job.kind": kind,
        }
        super().__init__(_get_tracer().start_span(
            f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes))
        self._batch = batch
        carrier: dict[str, str] = {}
        _propagator().inject(carrier, context=trace.set_span_in_context(self.span))
        #: The jobs' ``meta``: the span's trace context as JSON (None if it has none to give).
        self.meta: bytes | None = orjson.dumps(carrier) if carrier else None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self.failed(exc)
        super().__exit__(exc_type, exc, tb)

    def sent(self, job_id: int | None, count: int) -> None:
        """What the call inserted: ``job_id`` (`pgpool.enqueue`) or ``count`` jobs."""
        if self._batch:
            self.span.set_attribute("messaging.batch.message_count", count)
        elif job_id is not None:
            self.span.set_attribute("messaging.message.id", str(job_id))


class _Unsent:
    """What an enqueue call runs in when no span is current (the usual case): no span, no
    ``meta``, nothing to record."""

    meta: bytes | None = None

    def __enter__(self) -> _Unsent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def sent(self, job_id: int | None, count: int) -> None:
        pass


_UNSENT: Final = _Unsent()


def sending(kind: str, queue: str, *, batch: bool = False) -> Send | _Unsent:
    """A `Send` span for an enqueue call made now, or a stand-in that records nothing when
    no valid span is current. Either is a context manager with ``meta`` and ``sent``."""
    if API not in sys.modules:
        return _UNSENT
    from opentelemetry import trace

    if not trace.get_current_span().get_span_context().is_valid:
        return _UNSENT
    return Send(kind, queue, batch)


def processing(job: JobInfo, meta: bytes | None) -> _Span:
    """The CONSUMER span of one run of ``job``'s handler, linked to the producer's span
    that ``meta`` names (none: no link). Call only when `loaded`."""
    from opentelemetry import context, trace

    links = []
    carrier = orjson.loads(meta) if meta is not None else None
    if isinstance(carrier, dict):  # anything else is not ours: no link
        producer = trace.get_current_span(_propagator().extract(carrier)).get_span_context()
        if producer.is_valid:
            links.append(trace.Link(producer))
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "messaging.pgpool.job.kind": job.kind,
        "messaging.pgpool.job.attempt": job.attempt,
    }
    # An empty context: the root of a trace of its own, whatever is current.
    return _Span(_get_tracer().start_span(
        f"process {job.queue}", context=context.Context(), kind=trace.SpanKind.CONSUMER,
        links=links, attributes=attributes))
