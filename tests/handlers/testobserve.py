"""Handlers and hooks for tests/api/test_observe.py: logging from a handler, lifecycle
hooks, tracing. A module of its own, not testjobs: its hooks are registered at import, so
only the runs given ``--handlers testobserve`` have them.

- ``OBSERVE_RECORD`` (a file): each ``on_start`` and ``on_end`` hook call appends a JSON line.
- ``OBSERVE_FAILING_HOOKS``: an ``on_start`` and an ``on_end`` hook that raise, besides.
- ``OBSERVE_SPANS`` (a directory): this process traces with the OpenTelemetry SDK, and every
  span that ends is written to ``spans-<pid>.json`` there, with every one before it (read
  from the SDK's in-memory exporter).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pgpool
import pgpool.hooks

log = logging.getLogger("testobserve")


@pgpool.handler("logs")
def logs(payload: dict) -> None:
    log.info("info from the handler %d", payload["n"])
    log.warning("warning from the handler")
    print("printed by the handler")


@pgpool.handler("observed")
def observed(payload: dict) -> None:
    if "opentelemetry.trace" in sys.modules:  # the handler's own span, a child of pgpool's
        from opentelemetry import trace

        with trace.get_tracer("testobserve").start_as_current_span("inner"):
            pass
    if payload.get("fail"):
        raise ValueError("failing on purpose")


def _record(line: dict) -> None:
    with open(os.environ["OBSERVE_RECORD"], "a") as f:
        f.write(json.dumps(line) + "\n")


if os.environ.get("OBSERVE_RECORD"):
    @pgpool.hooks.on_start
    def started(job: pgpool.JobInfo) -> None:
        _record({"hook": "start", "job": job.id, "kind": job.kind, "attempt": job.attempt,
                 "current": pgpool.current_job().id, "pid": os.getpid()})

    @pgpool.hooks.on_end
    def ended(job: pgpool.JobInfo, outcome: pgpool.hooks.Outcome,
              exc: BaseException | None) -> None:
        _record({"hook": "end", "job": job.id, "outcome": outcome,
                 "done": outcome == pgpool.hooks.Outcome.DONE,
                 "exc": None if exc is None else type(exc).__name__,
                 "current": pgpool.current_job().id,
                 "otel": any(m.startswith("opentelemetry") for m in sys.modules)})


if os.environ.get("OBSERVE_FAILING_HOOKS"):
    @pgpool.hooks.on_start
    def broken_start(job: pgpool.JobInfo) -> None:
        raise RuntimeError("on_start hook broken on purpose")

    @pgpool.hooks.on_end
    def broken_end(job: pgpool.JobInfo, outcome: str, exc: BaseException | None) -> None:
        raise KeyError("on_end hook broken on purpose")


if os.environ.get("OBSERVE_SPANS"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    _exporter = InMemorySpanExporter()

    class _Dump(SpanProcessor):
        """After the exporter has a span: all of them to the file, replaced whole."""

        def on_end(self, span: ReadableSpan) -> None:
            path = Path(os.environ["OBSERVE_SPANS"]) / f"spans-{os.getpid()}.json"
            spans = [json.loads(s.to_json()) for s in _exporter.get_finished_spans()]
            path.with_suffix(".tmp").write_text(json.dumps(spans))
            path.with_suffix(".tmp").replace(path)

    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(_exporter))
    _provider.add_span_processor(_Dump())
    trace.set_tracer_provider(_provider)
