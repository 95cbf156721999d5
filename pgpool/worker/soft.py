"""Soft timeouts: `pgpool.SoftTimeout` raised in a handler ``soft_timeout`` seconds into an
attempt (``@pgpool.handler(kind, timeout=H, soft_timeout=S)``), before the hard timeout
(`pgpool.host.pool.WorkerPool.check_deadlines`) kills its worker at H.

  worker start: `wrap` the handlers that have one (the others are left as they are: the
     common path pays nothing)
  an attempt: its wrapped run `arm`s the timer thread for S seconds, calls the handler,
     `disarm`s
  at S: the timer thread sends `SIGNAL` to the handler's thread (the process's main
     thread); its Python handler raises `SoftTimeout` there, if the attempt it was armed
     for still runs

A Python signal handler runs between two bytecodes of the main thread: within
milliseconds of S in Python code, and in a blocking call that the signal interrupts
(``time.sleep``, a read of a pipe). Inside a long C call that holds on (a numpy
operation, a compression of a large buffer, a C extension's loop) it runs only once that
call returns to Python: SoftTimeout then comes late, and the hard timeout still ends the
worker at H. The handler may catch SoftTimeout (checkpoint, clean up, return or raise);
left to propagate, it fails the attempt like any exception.
"""

from __future__ import annotations

import inspect
import signal
import threading
import time
from typing import Any, Final

from ..registry import Handler
from ..retry import SoftTimeout

#: The signal soft timeouts reserve in a worker whose handlers have one: handlers must
#: not handle, ignore or block it.
SIGNAL: Final = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2


class _Timer:
    """One thread per worker, started at the first soft timeout armed: it waits for the
    armed deadline and signals the main thread when it passes."""

    def __init__(self) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._deadline: float | None = None
        self.armed = 0  # the number of the attempt armed; 0: none
        self._count = 0
        self._main = threading.main_thread().ident
        threading.Thread(target=self._run, name="pgpool-soft-timeout", daemon=True).start()

    def arm(self, seconds: float) -> int:
        with self._ready:
            self._count += 1
            self.armed = self._count
            self._deadline = time.monotonic() + seconds
            self._ready.notify()
            return self._count

    def disarm(self) -> None:
        with self._ready:
            self.armed = 0
            self._deadline = None

    def _run(self) -> None:
        with self._ready:
            while True:
                deadline = self._deadline
                if deadline is None:
                    self._ready.wait()
                    continue
                left = deadline - time.monotonic()
                if left > 0:
                    self._ready.wait(left)
                    continue
                self._deadline = None
                assert self._main is not None
                signal.pthread_kill(self._main, SIGNAL)


_timer: _Timer | None = None
#: The armed attempt's handler kind and soft timeout, for SoftTimeout's message.
_armed_for: tuple[str, float] = ("", 0.0)


def _raise(signum: int, frame: Any) -> None:
    """The signal's Python handler: raise SoftTimeout in the attempt still armed."""
    if _timer is None or not _timer.armed:
        return  # it ended meanwhile: nothing to interrupt
    _timer.armed = 0
    kind, seconds = _armed_for
    raise SoftTimeout(f"handler {kind!r} ran past its soft_timeout of {seconds:g}s")


def wrap(handlers: dict[str, Handler[Any]]) -> None:
    """Give each handler that has a soft timeout a run that arms it (in place: the worker's
    own registry). Call it once, in the worker's main thread, before any job runs."""
    soft = {kind: h for kind, h in handlers.items() if h.soft_timeout is not None}
    if not soft:
        return
    signal.signal(SIGNAL, _raise)
    for h in soft.values():
        h.run = _armed(h.kind, h.soft_timeout, h.run)  # type: ignore[arg-type]


def _armed(kind: str, seconds: float, run: Any) -> Any:
    def armed(payload: Any) -> Any:
        global _timer, _armed_for
        if _timer is None:
            _timer = _Timer()
        _armed_for = (kind, seconds)
        _timer.arm(seconds)
        try:
            result = run(payload)
            if inspect.iscoroutine(result):  # an ``async def`` runs while armed too
                import asyncio  # only async handlers need it: keeps worker start-up light

                result = asyncio.run(result)
            return result
        finally:
            _timer.disarm()

    return armed
