"""The job kind `pgpool bench` runs: one handler whose payload says what each job does.

Payload ``{"do": "noop"}`` returns at once; ``{"do": "cpu", "rounds": R}`` computes a
SHA-256 chain of R rounds (pure CPU; `pgpool.bench.profiles` calibrates R to about 5 ms on
the host); ``{"do": "sleep"}`` sleeps a random 2-5 ms; ``{"do": "exit"}`` ends its worker
process at once (``bench/startup.py`` times the worker's replacement). With ``"stamp":
true`` as well, the job first appends its start time (``time.monotonic_ns()``, one line)
to the file or FIFO named by the environment variable `STAMPS_ENV`, if set: that is how
the bench measures queue lag and pickup latency without a database round trip; an
``"exit"`` job with ``"after": S`` sleeps S seconds after its stamp, then ends. Workers
import this module as ``pgpool.bench.jobs``: it and the package's ``__init__`` import
neither psycopg nor asyncio.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from typing import Any, Final

from ..registry import handler

#: The kind every bench job has.
KIND: Final = "pgpool.bench"

#: Bounds of the ``sleep`` job, in seconds.
SLEEP_MIN: Final = 0.002
SLEEP_MAX: Final = 0.005

#: Where stamped jobs write their start time (set by the bench before workers start).
STAMPS_ENV: Final = "PGPOOL_BENCH_STAMPS"


def sha256_chain(rounds: int) -> bytes:
    """Hash a fixed seed ``rounds`` times, each round hashing the previous digest."""
    digest = b"pgpool-bench"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest


@handler(KIND, max_attempts=1)
def bench_job(payload: dict[str, Any]) -> None:
    """Run one bench job as its payload describes (see the module docstring)."""
    if payload.get("stamp"):
        _stamp()
    action = payload["do"]
    if action == "cpu":
        sha256_chain(payload["rounds"])
    elif action == "sleep":
        time.sleep(random.uniform(SLEEP_MIN, SLEEP_MAX))
    elif action == "exit":  # the worker dies with the job: bench/startup.py's replacement
        time.sleep(payload.get("after", 0))
        os._exit(1)
    elif action != "noop":
        raise ValueError(f"unknown bench action {action!r}")


def _stamp() -> None:
    path = os.environ.get(STAMPS_ENV)
    if not path:
        return
    # One write() of one short line with O_APPEND: lines from several workers never mix.
    # O_NONBLOCK: a FIFO nobody reads any more fails the job instead of hanging the worker.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    try:
        os.write(fd, b"%d\n" % time.monotonic_ns())
    finally:
        os.close(fd)
