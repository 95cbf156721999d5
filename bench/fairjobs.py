"""The handler `bench/fair_cpu.py` runs (``--handlers fairjobs``, with bench/ on the path).

``fair.burn`` spins on the CPU for ``payload["ms"]`` milliseconds of this process's CPU
time, then appends "<tenant> <wall-clock end> <CPU seconds it measured>" to
``$FAIR_RECORD/<pid>.log``: the bench computes each tenant's share of the CPU from these,
the jobs' own measurements, not from what pgpool records.
"""

from __future__ import annotations

import os
import time

import pgpool

_record: int | None = None  # this worker's record file, opened at its first job


@pgpool.handler("fair.burn")
def burn(payload: dict) -> None:
    global _record
    started = time.process_time()
    end = started + payload["ms"] / 1000
    while time.process_time() < end:
        pass
    used = time.process_time() - started
    if _record is None:
        _record = os.open(os.path.join(os.environ["FAIR_RECORD"], f"{os.getpid()}.log"),
                          os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_record, f"{payload['tenant']} {time.time():.6f} {used:.6f}\n".encode())
