"""Structured log events, and the two formats the ``pgpool`` command writes its log in.

An *event* is a log record that also carries a name and named fields (`event`): in the
text format it reads as any other line; in the JSON format (``--log-format json``) the
name and the fields become keys of the line's object, so a program (a log shipper, the
test suite) reads the figures instead of parsing a sentence. Which events exist, and
their fields, is part of pgpool's contract (see the dispatcher); the wording of messages
is not.

The CLI's one-line errors (``pgpool: error: ...``) and notices are not log records: they
stay plain text in both formats. Payloads are never logged, in either.

A failed job's error text is user data too (a handler's exception often quotes its
payload), so a log line shows as much of it as the operator chose (`LOG_ERRORS`, ``pgpool
run --log-errors``): its exception's type only, the first line of its message
(`error_message`: bounded, with what looks like a secret masked, `mask_secrets`), or its
traceback as well (masked alike).

Worker processes log in the same format at the same level (`configure_worker`), and each
record emitted while a job runs, a handler's own ``logging`` calls included, names that job:
``job_id``, ``kind`` and ``attempt`` fields in JSON, a ``[kind#id attempt N]`` prefix on the
message in text (what a handler prints is prefixed ``[kind#id]``: `pgpool.worker.output`).
"""

from __future__ import annotations

import json
import logging
import re
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

#: What a failed job's log line shows of its error (``--log-errors`` /
#: ``PGPOOL_LOG_ERRORS``): nothing but its exception's type, the first line of its message
#: (the default; the traceback at DEBUG), or the traceback too. See `error_message`.
LOG_ERRORS: Final = ("none", "message", "traceback")
DEFAULT_LOG_ERRORS: Final = "message"
#: The longest error message a log line shows, its ellipsis included.
MAX_MESSAGE_CHARS: Final = 300
#: What a secret in logged error text is replaced with (as a password in ``--dsn`` is).
MASK: Final = "***"
#: The first line of the error text a worker stores for an exception (then its innermost
#: frames, indented, then the exception's type and message: `pgpool.worker.main.format_error`).
TRACEBACK_HEADER: Final = "Traceback (most recent call last):"


def event(logger: logging.Logger, level: int, name: str, message: str, *args: object,
          exc_info: BaseException | None = None, exc_text: str | None = None,
          **fields: object) -> None:
    """Log ``message % args`` at ``level`` as the event ``name`` with ``fields``, and the
    traceback of ``exc_info`` if given, or ``exc_text``, a traceback already formatted
    (written where a record's traceback goes: under the line in text, ``exception`` in
    JSON, and by any other `logging.Formatter` alike).

    Field values should be JSON values (str, int, float, bool, None, lists, dicts);
    anything else is written as its ``str``. Field names must not be one of `BASE_KEYS`
    (a TypeError: a bug in the caller, caught by any test that emits the event).
    """
    clash = BASE_KEYS.intersection(fields)
    if clash:
        raise TypeError(f"event {name!r}: field names {sorted(clash)} are reserved")
    extra = {"event": name, "fields": fields}
    if exc_text is None:
        logger.log(level, message, *args, exc_info=exc_info, extra=extra, stacklevel=2)
    elif logger.isEnabledFor(level):
        # `extra` may not set a record's own attributes: the record is made here instead.
        record = logger.makeRecord(logger.name, level, "(unknown file)", 0, message, args,
                                   None, extra=extra)
        record.exc_text = exc_text
        logger.handle(record)


#: ``scheme://user:PASSWORD@host`` in any URI (a DSN, a broker's or a web address): the
#: user info ends at the last ``@`` before a blank, a quote or a ``/``.
_URI_PASSWORD: Final = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:@/'\"]*:)([^\s/'\"]+)(?=@)",
                                  re.IGNORECASE)
#: The names whose values are masked: ``password=...`` (a key/value DSN, a URI's query)
#: and its kin, alone or at the end of a longer name (``db_password``, ``access_token``).
_SECRET_NAMES: Final = r"(?:password|passwd|pwd|secret(?:_?key)?|token|api_?key|access_?key)"
#: A value: quoted (backslash escapes), or up to a blank, a quote, ``&``, ``,``, ``;`` or a
#: closing bracket.
_VALUE: Final = r"""('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s&'",;)}\]]+)"""
#: ``name=value`` (``name = value``), and ``'name': value`` or ``"name": value`` (a Python
#: dict's or a JSON object's).
_NAMED_SECRET: Final = re.compile(
    rf"((?<![a-z0-9]){_SECRET_NAMES}\s*=\s*|['\"][\w-]*{_SECRET_NAMES}['\"]\s*:\s*){_VALUE}",
    re.IGNORECASE)
#: Control characters, which a log line shows escaped (a terminal would act on them).
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def mask_secrets(text: str) -> str:
    """``text`` with what looks like a secret replaced by `MASK`: the password of a URI
    (``postgresql://user:***@host``, any scheme's) and the value of ``password=``,
    ``secret=``, ``token=``, ``api_key=`` and their kin, as ``name=value`` or a dict's or
    JSON object's ``'name': value``, quoted or not. Best effort: a secret in any other form
    is left as it is."""
    if "://" in text:
        text = _URI_PASSWORD.sub(lambda m: m[1] + MASK, text)
    return _NAMED_SECRET.sub(lambda m: m[1] + MASK, text)


def error_message(error: str) -> str:
    """What a log line shows of a failed attempt's error text at ``--log-errors message``:
    the first line of its exception's type and message (after the frames of a traceback,
    `TRACEBACK_HEADER`), else its first line that is not blank; secrets masked
    (`mask_secrets`), control characters escaped, and cut to `MAX_MESSAGE_CHARS` with an
    ellipsis."""
    lines = error.splitlines()
    if lines and lines[0] == TRACEBACK_HEADER:  # the frames are indented, the message not
        line = next((ln for ln in lines[1:] if ln and not ln[0].isspace()), "")
    else:
        line = next((ln for ln in lines if ln.strip()), "")
    line = mask_secrets(line.strip())
    if _CONTROL.search(line):
        line = _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", line)
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[:MAX_MESSAGE_CHARS - 3] + "..."
    return line


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
        elif record.exc_text:  # formatted already (`event`'s ``exc_text``)
            line["exception"] = record.exc_text
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
