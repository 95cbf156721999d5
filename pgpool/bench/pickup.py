"""Pickup latency on an idle queue, through a real ``pgpool run --procs 1`` subprocess, and
the floor no framework can beat: a LISTENing connection and a hand-written claim
(`queries.LEASE_CLAIM`, not pgpool's), committed.

Jobs are enqueued one at a time, each in its own committed transaction, `PICKUP_GAP` apart
so the queue is idle: latency runs from the commit returning to the handler starting, which
the handler reports through a FIFO (`jobs.STAMPS_ENV`) in ``CLOCK_MONOTONIC`` nanoseconds
(system-wide on Linux). The subprocess is stopped with SIGTERM and must exit 0.
"""

from __future__ import annotations

import os
import random
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Final

import psycopg
from psycopg.conninfo import make_conninfo

from ..db import dsn as dsnlib
from ..enqueue import enqueue
from ..sql import common as sql
from . import jobs, queries
from .ceilings import bare_claim
from .figures import quantile
from .jobs import KIND, STAMPS_ENV
from .options import BenchError, BenchOptions
from .progress import Progress
from .scratch import vacuum

#: Pickup jobs: min(this, --jobs), but at least `PICKUP_MIN`.
PICKUP_SAMPLES: Final = 200
PICKUP_MIN: Final = 20
#: Idle gap before each pickup job, seconds.
PICKUP_GAP: Final = (0.005, 0.020)
#: How long one pickup job may take to start before the run fails (polling is 1 s).
PICKUP_TIMEOUT: Final = 10.0
#: How long the pickup dispatcher may take to start, and to stop after SIGTERM.
SUBPROCESS_TIMEOUT: Final = 60.0

_STAMP_JOB: Final = {"do": "noop", "stamp": True}


def measure_pickup(opts: BenchOptions, dsn: str, conn: psycopg.Connection, tmp: Path,
                   progress: Progress, also: Sequence[str] = (),
                   warmed: Callable[[], None] | None = None,
                   checkout: Path | None = None) -> dict[str, Any]:
    """Pickup latency p50/p99/max over min(`PICKUP_SAMPLES`, ``opts.jobs``) jobs (at least
    `PICKUP_MIN`) and the floor's p50/p99, in ms; the FIFO and the subprocess's log go in
    ``tmp``. The host also serves the handler modules ``also`` (on its PYTHONPATH), and
    ``warmed`` is called once its first job has run, before the measured ones;
    ``checkout``: the pgpool of that directory runs the host (bench/pickups.py compares
    two checkouts). Raises `BenchError` if the subprocess fails, stalls or does not stop
    cleanly."""
    samples = max(PICKUP_MIN, min(PICKUP_SAMPLES, opts.jobs))
    vacuum(conn)
    progress.step(f"pickup latency: starting `pgpool run --procs 1`, then {samples} jobs "
                  "enqueued one at a time on an idle queue")
    app = f"pgpool-bench-pickup-{os.getpid()}-{secrets.token_hex(3)}"
    env = {"PGPOOL_LOG_LEVEL": "WARNING",
           "PGPOOL_DSN": make_conninfo(dsn, application_name=app)}  # not in `ps` output
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    command = [sys.executable, "-m", "pgpool", "run", "--handlers", jobs.__name__,
               *(arg for module in also for arg in ("--handlers", module)),
               "--procs", "1", "--batch", str(opts.batch)]
    with stamped(tmp, command, env, "the pickup dispatcher", checkout) as host:
        _await_listener(conn, app, host.proc, host.log)
        latencies = host.pickups(lambda: enqueue(conn, KIND, _STAMP_JOB), samples, warmed)
    floor = pickup_floor(dsn, conn, samples)
    return {"samples": len(latencies), "procs": 1,
            "p50_ms": quantile(latencies, 0.50), "p99_ms": quantile(latencies, 0.99),
            "max_ms": latencies[-1], "floor_p50_ms": quantile(floor, 0.50),
            "floor_p99_ms": quantile(floor, 0.99)}


class Stamped:
    """A process whose handlers write their start times to a FIFO (`stamped`)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: IO[bytes], reader: int,
                 title: str) -> None:
        self.proc, self.log, self.reader, self.title = proc, log, reader, title

    def pickups(self, enqueue_one: Callable[[], None], samples: int,
                warmed: Callable[[], None] | None = None) -> list[float]:
        """The pickup latencies of ``samples`` jobs, ms, sorted: each enqueued and committed
        by ``enqueue_one`` after an idle gap (`PICKUP_GAP`), timed from the commit to its
        handler's start. One job runs first, untimed (its worker's first); then
        ``warmed``."""
        enqueue_one()
        self.stamp(SUBPROCESS_TIMEOUT)
        if warmed is not None:
            warmed()
        latencies = []
        for _ in range(samples):
            time.sleep(random.uniform(*PICKUP_GAP))
            enqueue_one()
            committed = time.monotonic_ns()
            latencies.append((self.stamp(PICKUP_TIMEOUT) - committed) / 1e6)
        return sorted(latencies)

    def stamp(self, timeout: float) -> int:
        """The next handler start time written to the FIFO, in monotonic ns."""
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no pickup job started within {timeout:g}s")
            if select.select([self.reader], [], [], min(left, 0.5))[0]:
                line += os.read(self.reader, 64)
            else:
                self.check()
        return int(line)

    def check(self) -> None:
        """`BenchError` if the process has exited."""
        if self.proc.poll() is not None:
            raise BenchError(f"{self.title} exited with status {self.proc.returncode}: "
                             f"{last_line(self.log)}")


@contextmanager
def stamped(tmp: Path, command: list[str], env: dict[str, str], title: str,
            cwd: Path | None = None) -> Iterator[Stamped]:
    """Run ``command`` (``title`` in errors; ``env`` added to the environment, its output
    in ``tmp``) with its handlers' start times going to a FIFO in ``tmp``
    (`jobs.STAMPS_ENV`); on the way out, SIGTERM, which it must answer by exiting 0
    within `SUBPROCESS_TIMEOUT` (killed if anything went wrong)."""
    fifo = tmp / f"pickup-stamps-{secrets.token_hex(3)}"
    os.mkfifo(fifo)
    # A FIFO wakes the reader the moment a handler writes. Our own write end keeps it from
    # reporting end-of-file between the handlers' writes.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep_open = os.open(fifo, os.O_WRONLY)
    try:
        with open(tmp / f"{fifo.name}.log", "w+b") as log:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=cwd,
                                    env={**os.environ, STAMPS_ENV: str(fifo), **env})
            try:
                yield Stamped(proc, log, reader, title)
                proc.send_signal(signal.SIGTERM)
                try:
                    status = proc.wait(SUBPROCESS_TIMEOUT)
                except subprocess.TimeoutExpired:
                    raise BenchError(f"{title} did not stop within {SUBPROCESS_TIMEOUT:g}s "
                                     "of SIGTERM") from None
                if status != 0:
                    raise BenchError(f"{title} exited with status {status} after SIGTERM: "
                                     f"{last_line(log)}")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finally:
        os.close(reader)
        os.close(keep_open)


def pickup_floor(dsn: str, conn: psycopg.Connection, samples: int) -> list[float]:
    """The latency no framework can beat, in ms: from the enqueue's commit to the durable
    commit of a hand-written claim of 1 job (`queries.LEASE_CLAIM`, the lease cycle
    ceiling's), sent once a LISTENing connection got the notification (then the job is
    deleted)."""
    params = bare_claim("bench-pickup-floor", 1)
    latencies = []
    with dsnlib.connect(dsn, autocommit=True) as listener, \
            dsnlib.connect(dsn, autocommit=True) as claimer:
        listener.execute(sql.listen_statement(listener.execute(sql.CHANNEL).fetchone()[0]))
        for _ in range(samples):
            time.sleep(random.uniform(*PICKUP_GAP))
            enqueue(conn, KIND, _STAMP_JOB)
            committed = time.monotonic_ns()
            if not list(listener.notifies(timeout=PICKUP_TIMEOUT, stop_after=1)):
                raise BenchError(f"no notification within {PICKUP_TIMEOUT:g}s")
            ids = [r[0] for r in claimer.execute(queries.LEASE_CLAIM, params).fetchall()]
            latencies.append((time.monotonic_ns() - committed) / 1e6)
            if not ids:  # a floor that claimed nothing would be no floor at all
                raise BenchError("the pickup floor's claim found no job after its notification")
            claimer.execute(queries.DELETE, {"ids": ids})
    return sorted(latencies)


def _await_listener(conn: psycopg.Connection, app: str, proc: subprocess.Popen[bytes],
                    log: IO[bytes]) -> None:
    """Wait until the pickup dispatcher's LISTEN is in place: before that, a job enqueued
    would wait for its poll, not its notification."""
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    listen = sql.listen_statement(conn.execute(sql.CHANNEL).fetchone()[0])
    while not conn.execute(queries.LISTENING, {"app": app, "listen": listen}).fetchone():
        if proc.poll() is not None:
            raise BenchError(f"the pickup dispatcher exited with status {proc.returncode}: "
                             f"{last_line(log)}")
        if time.monotonic() > deadline:
            raise BenchError(f"the pickup dispatcher did not start within "
                             f"{SUBPROCESS_TIMEOUT:g}s")
        time.sleep(0.02)


def last_line(log: IO[bytes]) -> str:
    """The last line a subprocess wrote to ``log`` (opened ``w+b``), for an error message."""
    log.seek(0)
    lines = log.read().decode(errors="replace").splitlines()
    return lines[-1] if lines else "(no output)"
