"""``pgpool`` commands running in the background (`Pgpool`, `start_pgpool`), killed after
the test that started them if still running (`stop_leftovers`), and whether a process
runs (`alive`)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import pytest
from commands import JSON_LOGS, pgpool_cmd, pgpool_env
from jsonlogs import events, log_records
from places import HANDLERS

#: The two ways `pgpool run` can work on a host (`pgpool.worker.portable`), as the
#: environment of a `pgpool` process: Linux's own calls, and the portable path macOS takes,
#: forced.
HOST_PATHS = {"linux": {}, "portable": {"PGPOOL_PORTABLE": "1"}}


class Pgpool:
    """A `pgpool` command running in the background (see `start_pgpool`).

    Two threads read its stdout and stderr as they arrive. So waiting for a log line has a
    real deadline (a blocking ``readline`` on the pipe would sit past any timeout until
    the process writes or exits), and a process that writes a lot never stalls on a full
    pipe. Its workers inherit the pipes: end of output means they have exited too.
    """

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(args, cwd=HANDLERS, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self._changed = threading.Condition()
        self._out: list[str] = []
        self._err: list[str] = []
        self._err_ended = False
        self._err_from = 0  # `forget_output`: the lines before are an earlier test's
        self._readers = [threading.Thread(target=self._read, args=(pipe, lines), daemon=True)
                         for pipe, lines in ((self.proc.stdout, self._out),
                                             (self.proc.stderr, self._err))]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe: IO[str], lines: list[str]) -> None:
        with pipe:
            for line in pipe:
                with self._changed:
                    lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._err_ended = self._err_ended or lines is self._err
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.kill()

    @property
    def stdout(self) -> str:
        with self._changed:
            return "".join(self._out)

    @property
    def stderr(self) -> str:
        with self._changed:
            return "".join(self._err[self._err_from:])

    def forget_output(self) -> None:
        """From now on `stderr`, `events` and the waits see only what it writes next: a
        process kept for the next test shows that test its own lines only."""
        with self._changed:
            self._err_from = len(self._err)

    def wait_for_line(self, matches: Callable[[str], object], what: str,
                      timeout: float = 30, *, end_ok: bool = False) -> str | None:
        """The first stderr line (from the start) for which ``matches`` is truthy; fails
        naming ``what`` after ``timeout`` seconds, or as soon as stderr ends without one
        (with ``end_ok``, returns None then: the process exited first)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            seen = self._err_from
            while True:
                for line in self._err[seen:]:
                    if matches(line):
                        return line
                seen = len(self._err)
                if self._err_ended:
                    if end_ok:
                        return None
                    self._fail(f"pgpool exited ({self.proc.poll()}) before {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    self._fail(f"timed out after {timeout}s waiting for {what}")
                self._changed.wait(left)

    def event(self, name: str, timeout: float = 30, *, end_ok: bool = False
              ) -> dict[str, Any] | None:
        """The first ``name`` event in its log (which must be ``--log-format json``, the
        default of `start_pgpool`), waiting for it at most ``timeout`` seconds; as
        `wait_for_line`, None with ``end_ok`` if the process exits without it."""
        def is_event(line: str) -> bool:
            return any(r.get("event") == name for r in log_records(line))

        line = self.wait_for_line(is_event, f"the {name!r} event", timeout, end_ok=end_ok)
        return None if line is None else log_records(line)[0]

    def events(self, name: str) -> list[dict[str, Any]]:
        """Every ``name`` event logged so far."""
        return events(self.stderr, name)

    def wait(self, timeout: float = 60) -> int:
        """Wait until it exits and its output has ended (its workers are gone too); its
        exit status. Fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._fail(f"pgpool still running after {timeout}s")
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                self._fail(f"pgpool's output still open {timeout}s on (a worker left behind?)")
        return self.proc.returncode

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send ``sig`` and `wait`; the exit status."""
        self.send_signal(sig)
        return self.wait(timeout)

    def _fail(self, message: str) -> NoReturn:
        pytest.fail(f"{message}\nstderr so far:\n{self.stderr}")


_started: list[Pgpool] = []


def start_pgpool(dsn: str, *args: str, record_dir: Path | None = None,
                 wrapper: Sequence[str] = (), **env: str) -> Pgpool:
    """Start the real CLI in the background, logging JSON (``PGPOOL_LOG_FORMAT`` in ``env``
    overrides it); killed after the test if still running. ``wrapper``: a command that
    runs it (``unshare ...``)."""
    proc = Pgpool([*wrapper, *pgpool_cmd(*args)],
                  pgpool_env(dsn, record_dir, **{**JSON_LOGS, **env}))
    _started.append(proc)
    return proc


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop_leftovers() -> None:
    """Kill what `start_pgpool` started that still runs (and its workers: they die with
    it): a failing test must not leave a dispatcher running."""
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
