"""An I/O-like example kind: waits instead of computing (an HTTP call, a disk read)."""

from __future__ import annotations

import time

import pgpool


@pgpool.handler("sleep", timeout=300)
def sleep(payload: dict) -> None:
    time.sleep(float(payload.get("seconds", 0.01)))
