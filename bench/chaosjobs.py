"""The chaos soak's handler: a little CPU work per job, every attempt recorded durably.

Imported by real worker processes (``pgpool run --handlers chaosjobs`` from ``bench/``, or
with ``bench/`` on ``PYTHONPATH``). Each attempt appends two lines to a per-process file
``$CHAOS_RECORD/<dispatcher pid>-<worker pid>.log``, each written with one ``write`` and
made durable with ``fdatasync`` before the handler goes on::

    <job id> <claim> <worker pid> <start_ns> -            before the work starts
    <job id> <claim> <worker pid> <start_ns> <end_ns>     after the work, before returning

Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process on the
host, so they compare with the fault times the soak driver takes. An attempt killed while
it ran leaves its start line without a matching end line. A line without its trailing
newline (the process died inside ``write``) is to be ignored by readers.
"""

from __future__ import annotations

import hashlib
import os
import time

import pgpool

#: The environment variable naming the directory the records go to (chaos_cluster.RECORD_ENV).
RECORD_ENV = "CHAOS_RECORD"
#: The job kind the soak enqueues (chaos_cluster.KIND).
KIND = "chaos.record"

_fd: int | None = None


def _append(line: str) -> None:
    """Append ``line`` to this process's record file and make it durable."""
    global _fd
    if _fd is None:
        where = os.environ.get(RECORD_ENV)
        if not where:
            raise RuntimeError(f"{RECORD_ENV} is not set: chaos jobs have nowhere to record")
        name = os.path.join(where, f"{os.getppid()}-{os.getpid()}.log")
        _fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line.encode())
    os.fdatasync(_fd)


def spin(ms: float) -> None:
    """Burn about ``ms`` milliseconds of CPU (SHA-256 rounds until the time is up)."""
    deadline = time.perf_counter_ns() + int(ms * 1_000_000)
    digest = b"chaos"
    while time.perf_counter_ns() < deadline:
        for _ in range(20):
            digest = hashlib.sha256(digest).digest()


@pgpool.handler(KIND)
def record(payload: dict) -> None:
    """Record the start, spin ``payload["ms"]`` ms of CPU (default 2), then sleep
    ``payload["sleep"]`` seconds if given (a long job that leaves the CPU to others), and
    record the end.

    Never fails on its own: any re-run of a chaos job is caused by something outside it.
    """
    job = pgpool.current_job()
    pid = os.getpid()
    start = time.monotonic_ns()
    _append(f"{job.id} {job.claim} {pid} {start} -\n")
    spin(float(payload.get("ms", 2)))
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    end = time.monotonic_ns()
    _append(f"{job.id} {job.claim} {pid} {start} {end}\n")
