"""Structured log events, and the two formats the ``pgpool`` command writes its log in.

An *event* is a log record that also carries a name and named fields (`event`): in the
text format it reads as any other line; in the JSON format (``--log-format json``) the
name and the fields become keys of the line's object, so a program (a log shipper, the
test suite) reads the figures instead of parsing a sentence. Which events exist, and
their fields, is part of pgpool's contract (see the dispatcher); the wording of messages
is not.

The CLI's one-line errors (``pgpool: error: ...``) and notices are not log records: they
stay plain text in both formats. Payloads are never logged, in either.

Worker processes log in the same format at the same level (`configure_worker`), and each
record emitted while a job runs, a handler's own ``logging`` calls included, names that job:
``job_id``, ``kind`` and ``attempt`` fields in JSON, a ``[kind#id attempt N]`` prefix on the
message in text (what a handler prints is prefixed ``[kind#id]``: `pgpool.worker.output`).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final, TextIO

#: The formats of ``--log-format`` / ``PGPOOL_LOG_FORMAT``; the first is the default.
LOG_FORMATS: Final = ("text", "json")
#: The text format's line (unchanged since the first release: people grep it).
TEXT_FORMAT: Final = "%(asctime)s pgpool[%(process)d] %(levelname)s %(name)s: %(message)s"
#: The keys every JSON line has; an event's fields sit beside them and may not reuse them.
BASE_KEYS: Final = frozenset({"time", "level", "host", "logger", "pid", "message", "event"})


def event(logger: logging.Logger, level: int, name: str, message: str, *args: object,
          exc_info: BaseException | None = None, **fields: object) -> None:
    """Log ``message % args`` at ``level`` as the event ``name`` with ``fields``, and the
    traceback of ``exc_info`` if given.

    Field values should be JSON values (str, int, float, bool, None, lists, dicts);
    anything else is written as its ``str``. Field names must not be one of `BASE_KEYS`
    (a TypeError: a bug in the caller, caught by any test that emits the event).
    """
    clash = BASE_KEYS.intersection(fields)
    if clash:
        raise TypeError(f"event {name!r}: field names {sorted(clash)} are reserved")
    logger.log(level, message, *args, exc_info=exc_info,
               extra={"event": name, "fields": fields}, stacklevel=2)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO 8601, UTC, milliseconds),
    ``level``, ``host`` (the hostname), ``logger``, ``pid``, ``message``; ``job_id``,
    ``kind`` and ``attempt`` for a record emitted in a worker while a job ran (`JobStamp`);
    for events also ``event`` and its fields (events about one attempt carry ``job_id``,
    ``kind`` and ``attempt``); ``exception`` (the formatted traceback) when the record
    carries one."""

    def __init__(self) -> None:
        super().__init__()
        self._host = socket.gethostname()

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "host": self._host,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        job = getattr(record, "pgpool_job", None)
        if job is not None:
            line["job_id"], line["kind"], line["attempt"] = job
        name = getattr(record, "event", None)
        if name is not None:
            line["event"] = name
            line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # ASCII only: the line survives any terminal or log file encoding.
        return json.dumps(line, default=str)


#: A record's job, as (id, kind, attempt), or None between jobs.
RunningJob = Callable[[], "tuple[int, str, int] | None"]


class JobStamp(logging.Filter):
    """Stamps each record with the job running when it was emitted (``pgpool_job``: the
    formatters' fields and prefix), as ``running()`` tells it; lets every record through.

    A filter on the worker's handler, not a record factory: a record costs nothing more
    until it is emitted, and a job costs nothing at all."""

    def __init__(self, running: RunningJob) -> None:
        super().__init__()
        self._running = running

    def filter(self, record: logging.LogRecord) -> bool:
        record.pgpool_job = self._running()
        return True


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, with the message of a record emitted during a job prefixed
    ``[kind#id attempt N] `` (see `JobStamp`)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        job = getattr(record, "pgpool_job", None)
        if job is None:
            return super().formatMessage(record)
        job_id, kind, attempt = job
        message = record.message
        record.message = f"[{kind}#{job_id} attempt {attempt}] {message}"
        try:
            return super().formatMessage(record)
        finally:
            record.message = message  # other handlers format the record as it was


def configure(level: str, log_format: str, stream: TextIO) -> None:
    """Send the root logger's records at ``level`` and above to ``stream`` in
    ``log_format`` (one of `LOG_FORMATS`)."""
    logging.basicConfig(level=level, handlers=[_handler(log_format, stream)])


def configure_worker(level: str, log_format: str, stream: TextIO, running: RunningJob
                     ) -> None:
    """`configure`, for a worker process: each record also names the job ``running()``
    returns (`JobStamp`). ``stream`` is the worker's own stderr, not the per-job stream
    that prefixes and bounds what handlers print (`pgpool.worker.output`): a log record is whole
    lines of its format already, and it does not count against the job's print budget."""
    handler = _handler(log_format, stream)
    handler.addFilter(JobStamp(running))
    logging.basicConfig(level=level, handlers=[handler])


def _handler(log_format: str, stream: TextIO) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    return handler
