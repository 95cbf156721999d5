"""What every side part is to the dispatcher (`Part`), and the loop each runs its step in
(`Loop`).

A part repeats one step for as long as its host runs: every so often, or at once when
something wakes it. The database may go away at any time, and a part rides that out by
trying again: the outage is logged once when it starts (``failing``) and once when it ends
(``recovered``), under the part's own logger (`pgpool.db.outage.Failures`). Anything else a
step raises is a bug: it ends the part, and the dispatcher stops the host
(`pgpool.host.dispatcher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, NoReturn, Protocol

import psycopg

from ...db.outage import Failures

#: The failures a step rides out: the database's, and the network's.
EXPECTED: tuple[type[BaseException], ...] = (psycopg.Error, OSError)


class Connections(Protocol):
    """Where a part gets its connections: the dispatcher's pool, or an elected part's
    fenced transactions (`pgpool.host.parts.leader.Fenced`)."""

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection, for the ``async with`` block."""
        ...


class Part(Protocol):
    """A side part of a dispatcher, supervised by it: started with the host, cancelled at
    its end, and any other end of `run` stops the host."""

    #: What the logs call the part (``part_failed``'s ``part``) and its task's name.
    name: str

    async def run(self) -> None:
        """Work until cancelled, riding out the database's and the network's failures."""
        ...

    def wake(self) -> None:
        """Take the next step now rather than at its time: a notification, or this host's
        own work, says there is something to do."""
        ...


class LoopPart:
    """A `Part` that repeats its `step` in a `Loop`, ``self._loop``, which the part builds
    with the timing it needs."""

    name: str
    _loop: Loop

    async def run(self) -> None:
        await self._loop.run(self.step)

    def wake(self) -> None:
        self._loop.wake()

    async def step(self) -> float | None:
        """What the part does, once; the seconds until the next step, or None for the
        loop's interval. Raises the database's and the network's errors, which the loop
        rides out."""
        raise NotImplementedError


class Loop:
    """Runs a part's step, again and again until cancelled.

    After a step the loop waits for the seconds the step returned (None: ``interval``), or
    after a failure ``retry`` seconds (a function of the failures in a row, for a backoff;
    None: ``interval``); `wake` ends a wait at once. Options for the parts that need them:
    ``timeout`` fails a step that runs longer (a ``TimeoutError``, ridden out like a
    database error); ``min_gap`` keeps a step started by `wake` at least that long after
    the start of the one before; ``wait_first`` waits ``interval`` before the first step;
    ``fixed_rate`` counts each wait from the start of the step before, not its end;
    ``reached`` says whether a step that did not fail talked to the database at all (one
    that did not cannot end an outage).
    """

    def __init__(self, log: logging.Logger, what: str, *, interval: float,
                 retry: float | Callable[[int], float] | None = None,
                 timeout: float | None = None, min_gap: float = 0.0,
                 wait_first: bool = False, fixed_rate: bool = False,
                 reached: Callable[[], bool] | None = None) -> None:
        """``log`` and ``what`` name the part in its outage's log events."""
        self.interval = interval
        self._failures = Failures(log, what)
        self._retry = retry
        self._timeout = timeout
        self._errors = EXPECTED + ((TimeoutError,) if timeout is not None else ())
        self._min_gap = min_gap
        self._wait_first = wait_first
        self._fixed_rate = fixed_rate
        self._reached = reached
        self._woken = asyncio.Event()

    def wake(self) -> None:
        """End the current wait: the next step starts now (or ``min_gap`` after the last)."""
        self._woken.set()

    def working(self) -> None:
        """The step in progress reached the database: end an outage now, for a step that
        lasts as long as its connection (the listener's)."""
        self._failures.succeeded()

    async def run(self, step: Callable[[], Awaitable[float | None]]) -> NoReturn:
        """Repeat ``step`` until cancelled; it returns the seconds until the next one, or
        None for ``interval``. Raises what ``step`` raises but the failures it rides out."""
        began = time.monotonic()
        if self._wait_first:
            await self._wait(self.interval, began)
        while True:
            began = time.monotonic()
            try:
                async with asyncio.timeout(self._timeout):
                    wait = await step()
                if self._reached is None or self._reached():
                    self._failures.succeeded()
            except self._errors as exc:
                if asyncio.current_task().cancelling():
                    # The host is stopping this part: a cancel that came with the failure
                    # (asyncio.timeout turns one that meets its deadline into TimeoutError)
                    # must end the loop, or the dispatcher waits for it forever.
                    raise asyncio.CancelledError from exc
                self._failures.failed(exc)
                wait = self._after_failure()
            if wait is None:
                wait = self.interval
            if self._fixed_rate:
                wait -= time.monotonic() - began
            await self._wait(wait, began)

    def _after_failure(self) -> float:
        if self._retry is None:
            return self.interval
        if callable(self._retry):
            return self._retry(self._failures.count)
        return self._retry

    async def _wait(self, seconds: float, began: float) -> None:
        """Wait ``seconds``, or until woken (and then ``min_gap`` after ``began``)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self._woken.wait()
                if self._min_gap:
                    # Woken: wake-ups that arrive meanwhile are served by the same step.
                    await asyncio.sleep(began + self._min_gap - time.monotonic())
        self._woken.clear()
