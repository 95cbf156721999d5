"""The handler `bench/fleet.py` runs (``--handlers fleetjobs``, with bench/ on the path).

``fleet.noop`` does nothing but record that it ran: one line, "<job id> <attempt>
<CLOCK_MONOTONIC ns at its start>", appended to ``$FLEET_RECORD`` with one ``write()``
under O_APPEND, so the lines of every worker of every host never mix. The bench reads
them for the pickup latency and to find jobs lost or run twice.
"""

from __future__ import annotations

import os
import time

import pgpool


@pgpool.handler("fleet.noop", max_attempts=1)
def noop(payload: dict) -> None:
    started = time.monotonic_ns()
    job = pgpool.current_job()
    line = f"{job.id} {job.claim} {started}\n".encode()
    fd = os.open(os.environ["FLEET_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
