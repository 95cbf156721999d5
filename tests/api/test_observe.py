"""Logs and traces that follow a job: a handler's ``logging`` in the worker's log, lifecycle
hooks (`pgpool.hooks`), and OpenTelemetry spans across a real enqueue and a real `pgpool
run` (`pgpool.tracing`). The handlers and worker hooks are
tests/handlers/testobserve.py's."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from commands import pgpool_env, run_pgpool
from jsonlogs import events, log_records, only_event
from places import HANDLERS

import pgpool
import pgpool.hooks
from pgpool import hooks

OBSERVE = ("run", "--handlers", "testobserve", "--procs", "1", "--burst")
#: A text log line (tests/cli/test_logs.py's), its message's job prefix apart.
TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} pgpool\[(\d+)\] (DEBUG|INFO|WARNING|ERROR) "
    r"([\w.]+): (.*)")


# --- a handler's logging ----------------------------------------------------------------------


def test_a_handlers_log_records_are_json_lines_naming_the_job(db, dsn) -> None:
    job = pgpool.enqueue(db, "logs", {"n": 7})
    done = run_pgpool(dsn, *OBSERVE, "--log-format", "json")
    assert done.returncode == 0, done.stderr
    # Every line is a whole JSON object: the records did not go through the print capture.
    assert len(log_records(done.stderr)) == len(done.stderr.splitlines()), done.stderr
    mine = [r for r in log_records(done.stderr) if r["logger"] == "testobserve"]
    assert [(r["level"], r["message"]) for r in mine] == [
        ("INFO", "info from the handler 7"), ("WARNING", "warning from the handler")]
    for record in mine:
        assert (record["job_id"], record["kind"], record["attempt"]) == (job, "logs", 1)
        assert record["pid"] != only_event(done.stderr, "started")["pid"]  # a worker's
    # The dispatcher's own records name no job unless they are about one.
    assert "job_id" not in only_event(done.stderr, "started")
    # What it prints still goes to stdout, prefixed, apart from the log.
    assert f"[logs#{job}] printed by the handler" in done.stdout.splitlines()


def test_in_text_a_handlers_records_are_prefixed_with_the_job(db, dsn) -> None:
    job = pgpool.enqueue(db, "logs", {"n": 8})
    done = run_pgpool(dsn, *OBSERVE)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert all(TEXT_LINE.fullmatch(line) for line in lines), done.stderr
    mine = [TEXT_LINE.fullmatch(line).groups() for line in lines if " testobserve: " in line]
    assert [(level, message) for _, level, _, message in mine] == [
        ("INFO", f"[logs#{job} attempt 1] info from the handler 8"),
        ("WARNING", f"[logs#{job} attempt 1] warning from the handler")]


def test_the_log_level_applies_to_the_workers(db, dsn) -> None:
    pgpool.enqueue(db, "logs", {"n": 9})
    done = run_pgpool(dsn, *OBSERVE, PGPOOL_LOG_LEVEL="WARNING", PGPOOL_LOG_FORMAT="json")
    assert done.returncode == 0, done.stderr
    mine = [r["message"] for r in log_records(done.stderr) if r["logger"] == "testobserve"]
    assert mine == ["warning from the handler"]


# --- lifecycle hooks --------------------------------------------------------------------------


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_worker_hooks_see_each_job_start_and_end_with_its_outcome(db, dsn, tmp_path) -> None:
    record = tmp_path / "hooks.jsonl"
    ok = pgpool.enqueue(db, "observed", {})
    bad = pgpool.enqueue(db, "observed", {"fail": True}, max_attempts=1)
    done = run_pgpool(dsn, *OBSERVE, OBSERVE_RECORD=str(record))
    assert done.returncode == 0, done.stderr
    lines = read_lines(record)
    starts = {r["job"]: r for r in lines if r["hook"] == "start"}
    ends = {r["job"]: r for r in lines if r["hook"] == "end"}
    assert set(starts) == set(ends) == {ok, bad}
    assert [r["hook"] for r in lines] == ["start", "end", "start", "end"]  # one at a time
    for job in (ok, bad):
        assert starts[job]["kind"] == "observed" and starts[job]["attempt"] == 1
        assert starts[job]["current"] == ends[job]["current"] == job  # the job is current
    assert (ends[ok]["outcome"], ends[ok]["done"], ends[ok]["exc"]) == ("done", True, None)
    assert (ends[bad]["outcome"], ends[bad]["done"], ends[bad]["exc"]) == (
        "failed", False, "ValueError")
    # No OpenTelemetry in this worker: pgpool imported none.
    assert not any(r["otel"] for r in ends.values())
    assert db.execute("SELECT id FROM pgpool_dead").fetchall() == [(bad,)]


def test_a_failing_hook_fails_no_job_and_is_logged_once(db, dsn, tmp_path) -> None:
    jobs = [pgpool.enqueue(db, "observed", {}) for _ in range(3)]
    done = run_pgpool(dsn, *OBSERVE, "--log-format", "json", OBSERVE_FAILING_HOOKS="1",
                      OBSERVE_RECORD=str(tmp_path / "hooks.jsonl"))
    assert done.returncode == 0, done.stderr
    assert only_event(done.stderr, "finished")["done"] == 3
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone() == (0,)
    failed = events(done.stderr, "hook_failed")
    assert sorted((e["stage"], e["error"]) for e in failed) == [
        ("on_end", "KeyError"), ("on_start", "RuntimeError")]
    start = next(e for e in failed if e["stage"] == "on_start")
    assert start["hook"] == "testobserve.broken_start" and start["level"] == "ERROR"
    assert "on_start hook broken on purpose" in start["exception"]
    assert start["job_id"] in jobs and start["kind"] == "observed"  # the job it ran for
    # The hooks registered before the broken ones ran for every job all the same.
    assert len(read_lines(tmp_path / "hooks.jsonl")) == 6


def test_on_enqueue_hooks_hear_of_each_call_that_inserted_jobs(db, dsn, caplog) -> None:
    heard: list[hooks.Enqueued] = []

    with hooks.isolated():
        @pgpool.hooks.on_enqueue
        def listen(enqueued: hooks.Enqueued) -> None:
            heard.append(enqueued)

        pgpool.hooks.on_enqueue(listen)  # registered once
        one = pgpool.enqueue(db, "observed", {"secret": 1}, queue="q1", unique_key="u")
        assert pgpool.enqueue(db, "observed", {}, unique_key="u") is None  # nothing inserted
        assert pgpool.enqueue_many(db, "observed", [{}, {}], queue="q2") == 2
        assert pgpool.enqueue_many(db, "observed", []) == 0

        async def twins() -> int | None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                job = await pgpool.enqueue_async(conn, "observed", {})
                await pgpool.enqueue_many_async(conn, "observed", [{}] * 3)
                return job

        two = asyncio.run(twins())

        @pgpool.hooks.on_enqueue
        def broken(enqueued: hooks.Enqueued) -> None:
            raise RuntimeError("on_enqueue hook broken on purpose")

        with caplog.at_level(logging.ERROR, logger="pgpool.hooks"):
            pgpool.enqueue(db, "observed", {})
            pgpool.enqueue(db, "observed", {})
    assert [(e.kind, e.queue, e.job_id, e.count) for e in heard] == [
        ("observed", "q1", one, 1), ("observed", "q2", None, 2),
        ("observed", "default", two, 1), ("observed", "default", None, 3),
        ("observed", "default", two + 4, 1), ("observed", "default", two + 5, 1)]
    # Both enqueues with the broken hook inserted their job; its failure was logged once.
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone() == (9,)
    (logged,) = [r for r in caplog.records if r.name == "pgpool.hooks"]
    assert re.fullmatch(r"on_enqueue hook test_observe\.\S+\.broken failed \(RuntimeError\), "
                        r"which fails nothing else; its later failures in this process are "
                        r"not logged", logged.getMessage()), logged.getMessage()
    # Gone with the isolation: no hook hears this one.
    pgpool.enqueue(db, "observed", {})
    assert len(heard) == 6


def test_a_hook_must_be_callable() -> None:
    with pytest.raises(pgpool.ConfigError, match="takes a function, not a str"):
        pgpool.hooks.on_start("not a function")


# --- OpenTelemetry ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def producer_spans() -> Any:
    """This test process traces with the SDK, into an in-memory exporter."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # set once per process: maybe by a docs page
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def hex_id(value: int, digits: int) -> str:
    return f"0x{value:0{digits}x}"


def test_a_job_runs_in_a_consumer_span_linked_to_its_producers(db, dsn, tmp_path,
                                                                producer_spans) -> None:
    from opentelemetry import trace

    producer_spans.clear()
    with trace.get_tracer("test").start_as_current_span("request") as request:
        ok = pgpool.enqueue(db, "observed", {}, queue="traced")
        bad = pgpool.enqueue(db, "observed", {"fail": True}, queue="traced", max_attempts=1)
        assert pgpool.enqueue_many(db, "observed", [{}, {}], queue="traced") == 2
    trace_id = request.get_span_context().trace_id
    sends = [s for s in producer_spans.get_finished_spans() if s.name == "send traced"]
    assert len(sends) == 3
    for send in sends:
        assert send.kind == trace.SpanKind.PRODUCER
        assert send.parent.span_id == request.get_span_context().span_id
        assert {k: send.attributes[k] for k in ("messaging.system", "messaging.operation.type",
                                                "messaging.operation.name",
                                                "messaging.destination.name",
                                                "messaging.pgpool.job.kind")} == {
            "messaging.system": "pgpool", "messaging.operation.type": "send",
            "messaging.operation.name": "send", "messaging.destination.name": "traced",
            "messaging.pgpool.job.kind": "observed"}
    assert [s.attributes.get("messaging.message.id") for s in sends] == [str(ok), str(bad),
                                                                         None]
    assert sends[2].attributes["messaging.batch.message_count"] == 2
    # Each job carries its send span's W3C trace context.
    metas = [m for (m,) in db.execute("SELECT meta FROM pgpool_jobs ORDER BY id")]
    expected = [sends[0], sends[1], sends[2], sends[2]]
    for meta, send in zip(metas, expected, strict=True):
        context = send.get_span_context()
        assert meta == {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                                       f"{context.trace_flags:02x}"}
        assert context.trace_id == trace_id

    done = run_pgpool(dsn, *OBSERVE, "--queue", "traced", OBSERVE_SPANS=str(tmp_path))
    assert done.returncode == 0, done.stderr
    (dump,) = tmp_path.glob("spans-*.json")  # the one worker's
    spans = json.loads(dump.read_text())
    consumers = {int(s["attributes"]["messaging.message.id"]): s for s in spans
                 if s["name"] == "process traced"}
    assert sorted(consumers) == sorted([ok, bad, bad + 1, bad + 2])
    by_job = dict(zip([ok, bad, bad + 1, bad + 2], expected, strict=True))
    for job, span in consumers.items():
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["parent_id"] is None  # a trace of its own...
        assert span["context"]["trace_id"] != hex_id(trace_id, 32)
        producer = by_job[job].get_span_context()  # ...linked to the producer's send span
        assert [link["context"] for link in span["links"]] == [{
            "trace_id": hex_id(producer.trace_id, 32), "span_id": hex_id(producer.span_id, 16),
            "trace_state": "[]"}]
        assert span["attributes"] == {
            "messaging.system": "pgpool", "messaging.operation.type": "process",
            "messaging.operation.name": "process", "messaging.destination.name": "traced",
            "messaging.message.id": str(job), "messaging.pgpool.job.kind": "observed",
            "messaging.pgpool.job.attempt": 1,
            **({"error.type": "ValueError"} if job == bad else {})}
        # The handler's own span is a child of it.
        (inner,) = [s for s in spans if s["name"] == "inner"
                    and s["context"]["trace_id"] == span["context"]["trace_id"]]
        assert inner["parent_id"] == span["context"]["span_id"]
    assert consumers[ok]["status"]["status_code"] == "UNSET"
    assert consumers[ok]["events"] == []
    failed = consumers[bad]
    assert failed["status"] == {"status_code": "ERROR", "description": "ValueError"}
    (exception,) = failed["events"]
    assert exception["name"] == "exception"
    assert exception["attributes"]["exception.type"] == "ValueError"
    assert exception["attributes"]["exception.message"] == "failing on purpose"
    # The dead letter keeps the trace context it was enqueued with.
    assert db.execute("SELECT id, meta FROM pgpool_dead").fetchall() == [(bad, metas[1])]


def test_every_way_to_enqueue_records_the_trace_context(db, dsn, producer_spans) -> None:
    from opentelemetry import trace

    later = datetime.now(UTC) + timedelta(hours=1)

    async def twins() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await pgpool.enqueue_async(conn, "observed", {}, queue="a1")
            await pgpool.enqueue_many_async(conn, "observed", [{}], queue="a2", run_at=later)

    producer_spans.clear()
    with trace.get_tracer("test").start_as_current_span("request"):
        pgpool.enqueue(db, "observed", {}, queue="s1", delay=3600)
        pgpool.enqueue_many(db, "observed", [{"x": "back\\slash"}], queue="s2", run_at=later)
        asyncio.run(twins())
    sends = {s.attributes["messaging.destination.name"]: s.get_span_context()
             for s in producer_spans.get_finished_spans() if s.name.startswith("send ")}
    rows = db.execute("SELECT queue, state, meta->>'traceparent' FROM pgpool_jobs").fetchall()
    assert sorted(rows) == sorted(
        (queue, "ready" if queue == "a1" else "scheduled",
         f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}")
        for queue, c in sends.items())


def test_without_a_current_span_a_job_carries_no_trace_context(db, dsn) -> None:
    pgpool.enqueue(db, "observed", {})
    pgpool.enqueue_many(db, "observed", [{}, {}])
    assert db.execute("SELECT meta FROM pgpool_jobs").fetchall() == [(None,)] * 3


def test_pgpool_imports_no_opentelemetry_of_its_own(dsn) -> None:
    # A process that never imports OpenTelemetry (it is installed here): pgpool does not
    # either, enqueueing or not, and works where importing it would fail.
    script = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # any import of it fails\n"
        "import psycopg, pgpool\n"
        "with psycopg.connect(sys.argv[1], autocommit=True) as conn:\n"
        "    pgpool.enqueue(conn, 'observed', {})\n"
        "    pgpool.enqueue_many(conn, 'observed', [{}])\n"
        "    assert conn.execute('SELECT count(*) FROM pgpool_jobs WHERE meta IS NULL'"
        "                        ).fetchone() == (2,)\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry.')]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", script, dsn], cwd=HANDLERS,
                            env=pgpool_env(dsn), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
