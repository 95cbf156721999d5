"""The dashboard's one snapshot loop: every open page is fed from it, so what the dashboard
costs the database does not grow with the number of browsers.

A snapshot is `pgpool.observe.collect` (one read-only transaction), taken on a connection of
its own in a thread, so the event loop never waits on the database. It is taken every
`PERIOD` seconds, and sooner after a notification on the installation's channel (new ready
work, an operator's pause or cancel): `DEBOUNCE` seconds after the first, so a burst of
enqueues costs one snapshot, and never less than `MIN_GAP` after the one before. So the
database sees at most 1 / `MIN_GAP` snapshots a second under any load, and 1 / `PERIOD`
when idle, whatever the number of streams.

The hub also keeps each queue's lag over the last hour (`HISTORY`), from its snapshots:
one sample at least every `SAMPLE_EVERY` seconds, the newest always the latest snapshot's;
and how fast the dead rows of ``pgpool_jobs`` grow (`pgpool.horizon.DeadRowsTrend`). Of
who holds back vacuum, a snapshot carries the query and client address only with
``--allow-payloads`` (`pgpool.horizon.for_dashboard`): it is sent to every page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson
import psycopg

from .. import horizon, observe
from ..db.outage import Failures, backoff
from ..errors import PgpoolError, first_line
from ..sql import common as sql

log = logging.getLogger("pgpool.web")

#: Seconds between snapshots when nothing is notified (the page's clocks and the running
#: counts, which no notification announces, are at most this old).
PERIOD: Final = 2.0
#: Seconds to wait after a notification for the rest of its burst.
DEBOUNCE: Final = 0.1
#: The least seconds between two snapshots: bounds the database cost under any load.
MIN_GAP: Final = 0.5
#: Seconds of lag history kept per queue, and the spacing of its samples.
HISTORY: Final = 3600.0
SAMPLE_EVERY: Final = 5.0
#: The ``application_name`` of the server's sessions, so an operator (and the tests) can
#: tell them apart in ``pg_stat_activity``.
APPLICATION_NAME: Final = "pgpool web"


class Hub:
    """The latest snapshot (as JSON) and the streams waiting for the next one."""

    def __init__(self, dsn: str, *, horizon_warn: float | None = horizon.HORIZON_WARN,
                 allow_payloads: bool = False) -> None:
        self._dsn = dsn
        self._horizon_warn = horizon_warn
        self._allow_payloads = allow_payloads
        self._trend = horizon.DeadRowsTrend()
        self._conn: psycopg.Connection | None = None
        self._conn_lock = threading.Lock()  # the connection is used from threads
        self._poke = asyncio.Event()
        self._changed = asyncio.Condition()
        self._history: dict[str, deque[tuple[float, float]]] = {}
        self._closed = False
        #: Bumped at every snapshot or failure; a stream sends what it has not seen.
        self.version = 0
        self.latest: bytes | None = None
        #: The last failure's one-line description, until a snapshot succeeds again.
        self.error: str | None = None
        #: `time.monotonic()` of the last snapshot that succeeded (0: none yet).
        self.taken_at = 0.0
        #: Snapshots taken, for the cost figures (bench/web_cost.py).
        self.snapshots = 0

    async def run(self) -> None:
        """Listen and take snapshots until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._listen())
            tasks.create_task(self._refresh())

    async def close(self) -> None:
        """End every stream (at shutdown) and drop the snapshot connection."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()
        await asyncio.to_thread(self._drop_connection)

    async def first(self, timeout: float) -> bytes | None:
        """The latest snapshot, waiting up to ``timeout`` seconds for the first one."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # not wait_for: see `_refresh`
                    await self._changed.wait_for(
                        lambda: self.latest is not None or self._closed)
        return self.latest

    async def updates(self) -> AsyncIterator[tuple[str, bytes]]:
        """(event, JSON) for the latest snapshot now, then for each new one; a failure is
        ("error", {"error": ...}). A slow reader skips to the latest: nothing queues up."""
        seen = 0
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda seen=seen: self.version != seen or self._closed)
                if self._closed:
                    return
                seen = self.version
                if self.error is not None:
                    item = ("error", orjson.dumps({"error": self.error}))
                elif self.latest is not None:
                    item = ("snapshot", self.latest)
                else:
                    continue
            yield item

    def healthy(self, within: float) -> bool:
        """Whether a snapshot succeeded in the last ``within`` seconds."""
        return self.taken_at > 0 and time.monotonic() - self.taken_at <= within

    # --- the loop -------------------------------------------------------------------------

    async def _listen(self) -> None:
        """Poke the snapshot loop at every notification on the installation's channel."""
        failures = Failures(log, "dashboard listener connection")
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self._dsn, autocommit=True, application_name=APPLICATION_NAME
                ) as conn:
                    row = await (await conn.execute(sql.CHANNEL)).fetchone()
                    await conn.execute(sql.listen_statement(row[0]))
                    failures.succeeded()
                    self._poke.set()  # anything sent while it was down was lost
                    async for _ in conn.notifies():
                        self._poke.set()
            except (psycopg.Error, OSError) as exc:
                failures.failed(exc)
                await asyncio.sleep(backoff(failures.count, 0.2, 10.0))

    async def _refresh(self) -> None:
        failures = Failures(log, "dashboard snapshot")
        last = -MIN_GAP
        while True:
            # Not wait_for: on Python 3.11 it swallows a cancel that comes as the poke
            # does, and this loop would then outlive the server's stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PERIOD):
                    await self._poke.wait()
            if self._poke.is_set():
                await asyncio.sleep(max(DEBOUNCE, last + MIN_GAP - time.monotonic()))
            self._poke.clear()
            last = time.monotonic()
            # Stamped before it reads: it shows every commit made before then. (Stamped
            # once read, a snapshot that began before a commit could look newer than it.)
            taken = time.time()
            try:
                report = await asyncio.to_thread(self._collect)
            except (psycopg.Error, OSError, PgpoolError) as exc:
                failures.failed(exc)
                await self._publish(None, f"cannot read the queue's status: {first_line(exc)}")
                await asyncio.sleep(backoff(failures.count, 0.2, PERIOD))
                continue
            failures.succeeded()
            await self._publish(report, None, taken)

    def _collect(self) -> dict[str, Any]:
        """One snapshot, on the hub's connection (in a thread); a failed connection is
        dropped and the next snapshot opens a new one."""
        with self._conn_lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self._dsn, autocommit=True,
                                                 connect_timeout=5,
                                                 application_name=APPLICATION_NAME)
                return observe.collect(self._conn, self._horizon_warn)
            except (psycopg.Error, OSError):
                self._drop_connection_locked()
                raise

    def _drop_connection(self) -> None:
        # A snapshot cancelled at shutdown may still run in its thread: wait for it.
        with self._conn_lock:
            self._drop_connection_locked()

    def _drop_connection_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    async def _publish(self, report: dict[str, Any] | None, error: str | None,
                       taken: float = 0.0) -> None:
        """Publish ``report`` (None: ``error`` instead), a snapshot that began reading at
        ``taken`` (Unix time)."""
        async with self._changed:
            if report is not None:
                self._record_lag(report, taken)
                self._trend.add(report["horizon"])
                report["horizon"] = horizon.for_dashboard(
                    report["horizon"], allow_payloads=self._allow_payloads)
                report["lag_history"] = {q: list(h) for q, h in self._history.items()}
                report["taken_at"] = taken
                self.latest = orjson.dumps(report)
                self.taken_at = time.monotonic()
                self.snapshots += 1
            self.error = error
            self.version += 1
            self._changed.notify_all()

    def _record_lag(self, report: dict[str, Any], now: float) -> None:
        """Add each queue's lag (0 when nothing is due) to its history; drop samples older
        than `HISTORY`, and queues with none left."""
        for q in report["queues"]:
            samples = self._history.setdefault(q["queue"], deque())
            sample = (round(now, 3), q["lag"] or 0.0)
            if len(samples) >= 2 and samples[-1][0] - samples[-2][0] < SAMPLE_EVERY:
                samples[-1] = sample  # too close to the one before: keep only the latest
            else:
                samples.append(sample)
        for name in list(self._history):
            samples = self._history[name]
            while samples and samples[0][0] < now - HISTORY:
                samples.popleft()
            if not samples:
                del self._history[name]
