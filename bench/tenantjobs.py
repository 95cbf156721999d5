"""The handler `bench/tenants.py` runs (``--handlers tenantjobs``, with bench/ on the path).

``tenants.work`` sleeps ``payload["ms"]`` milliseconds, standing in for real work. A job
whose payload carries ``t`` (the wall-clock time it was enqueued) appends "<tenant> <lag
seconds>" to ``$TENANTS_RECORD/<pid>.log`` as it starts: its pickup lag.
"""

from __future__ import annotations

import os
import time

import pgpool


@pgpool.handler("tenants.work")
def work(payload: dict) -> None:
    if "t" in payload:
        lag = time.time() - payload["t"]
        line = f"{payload['tenant']} {lag:.6f}\n".encode()
        fd = os.open(os.path.join(os.environ["TENANTS_RECORD"], f"{os.getpid()}.log"),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    time.sleep(payload.get("ms", 0) / 1000)
