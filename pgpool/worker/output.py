"""What handlers print: each line names the job that wrote it, and each job's share is bounded.

A worker replaces its ``sys.stdout`` and ``sys.stderr`` with `JobStream`s over the streams it
inherited from the dispatcher (its stdout and stderr). While a job runs, each line it writes
is prefixed ``[kind#id] ``, and once a job has written `LIMIT` characters to a stream the
rest is dropped, with one line saying how much: a handler that prints 20 MB cannot flood the
host's log. Between jobs, writes pass through unchanged.

This covers everything written through ``sys.stdout``/``sys.stderr`` (``print``, logging's
stream handlers, ``traceback.print_exc``). Output that C code or a child process writes
straight to file descriptor 1 or 2 bypasses it, unprefixed and unbounded.
"""

from __future__ import annotations

import io
import sys
from typing import Final, TextIO

#: Characters of output each job may write to each stream.
LIMIT: Final = 64 * 1024


class JobStream(io.TextIOBase):
    """A text stream that prefixes the running job's lines and bounds each job's share."""

    def __init__(self, raw: TextIO, limit: int = LIMIT) -> None:
        self._raw = raw
        self._limit = limit
        self._label: str | None = None
        self._written = 0
        self._dropped = 0
        self._at_line_start = True

    def begin(self, label: str) -> None:
        """A job starts: prefix its lines with ``[label] ``."""
        self._label = label
        self._written = self._dropped = 0
        self._at_line_start = True

    def end(self) -> None:
        """The job ended: finish its last line, say what was dropped, and flush."""
        if self._written or self._dropped:  # most jobs print nothing: no flush for them
            if not self._at_line_start:
                self._raw.write("\n")
            if self._dropped:
                self._raw.write(f"[{self._label}] ... {self._dropped} more characters of "
                                f"output dropped (a job may write {self._limit} per stream)\n")
            self._raw.flush()
        self._label = None

    def write(self, text: str) -> int:
        if self._label is None:
            return self._raw.write(text)
        room = self._limit - self._written
        kept = text[:max(0, room)]
        self._dropped += len(text) - len(kept)
        self._written += len(kept)
        if kept:
            prefix = f"[{self._label}] "
            lines = kept.split("\n")
            out = [(prefix if self._at_line_start else "") + lines[0]]
            out += [prefix + line if line else "" for line in lines[1:]]
            self._raw.write("\n".join(out))
            self._at_line_start = kept.endswith("\n")
        return len(text)

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._raw.encoding


def install() -> tuple[JobStream, JobStream]:
    """Put `JobStream`s in place of this process's ``sys.stdout`` and ``sys.stderr``."""
    sys.stdout = out = JobStream(sys.stdout)
    sys.stderr = err = JobStream(sys.stderr)
    return out, err
