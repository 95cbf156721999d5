"""Structured log events, and the two formats the ``pgpool`` command writes its log in.

An *event* is a log record that also carries a name and named fields (`event`): in the
text format it reads as any other line; in the JSON format (``--log-format json``) the
name and the fields become keys of the line's object, so a program (a log shipper, the
test suite) reads the figures instead of parsing a sentence. Which events exist, and
their fields, is part of pgpool's contract (see the dispatcher); the wording of messages
is not.

The CLI's one-line errors (``pgpool: error: ...``) and notices are not log records: they
stay plain text in both formats. Payloads are never logged, in either.
"""

from __future__ import annotations

import json
import logging
import socket
from datetime import UTC, datetime
from typing import Final, TextIO

#: The formats of ``--log-format`` / ``PGPOOL_LOG_FORMAT``; the first is the default.
LOG_FORMATS: Final = ("text", "json")
#: The text format's line (unchanged since the first release: people grep it).
TEXT_FORMAT: Final = "%(asctime)s pgpool[%(process)d] %(levelname)s %(name)s: %(message)s"
#: The keys every JSON line has; an event's fields sit beside them and may not reuse them.
BASE_KEYS: Final = frozenset({"time", "level", "host", "logger", "pid", "message", "event"})


def event(logger: logging.Logger, level: int, name: str, message: str, *args: object,
          **fields: object) -> None:
    """Log ``message % args`` at ``level`` as the event ``name`` with ``fields``.

    Field values should be JSON values (str, int, float, bool, None, lists, dicts);
    anything else is written as its ``str``. Field names must not be one of `BASE_KEYS`
    (a TypeError: a bug in the caller, caught by any test that emits the event).
    """
    clash = BASE_KEYS.intersection(fields)
    if clash:
        raise TypeError(f"event {name!r}: field names {sorted(clash)} are reserved")
    logger.log(level, message, *args, extra={"event": name, "fields": fields},
               stacklevel=2)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO 8601, UTC, milliseconds),
    ``level``, ``host`` (the hostname), ``logger``, ``pid``, ``message``; for events also
    ``event`` and its fields (events about one attempt carry ``job_id``, ``kind`` and
    ``attempt``); ``exception`` (the formatted traceback) when the record carries one."""

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


def configure(level: str, log_format: str, stream: TextIO) -> None:
    """Send the root logger's records at ``level`` and above to ``stream`` in
    ``log_format`` (one of `LOG_FORMATS`)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
