"""The bench's progress lines on stderr (the report itself goes to stdout)."""

from __future__ import annotations

from typing import TextIO


class Progress:
    """Progress on ``stream``: one line per stage; during the drive, a line rewritten in
    place on a terminal, or a new line every few seconds otherwise (logs stay short)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._open = False  # an in-place line is showing, without its newline
        #: Seconds between `update` calls.
        self.interval = 0.5 if self._tty else 5.0

    def step(self, message: str) -> None:
        """A stage begins (or ends): a line of its own."""
        self._end_line()
        print(f"pgpool bench: {message}", file=self._stream, flush=True)

    def update(self, message: str) -> None:
        """How a long stage is going: replaces the previous update on a terminal."""
        if not self._tty:
            self.step(message)
            return
        self._stream.write(f"\rpgpool bench: {message}\x1b[K")
        self._stream.flush()
        self._open = True

    def _end_line(self) -> None:
        if self._open:
            self._stream.write("\n")
            self._open = False
