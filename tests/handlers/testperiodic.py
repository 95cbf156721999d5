"""Periodic schedules used by tests/api/test_schedules.py (``--handlers testperiodic``).

Two schedules tick every second into queue ``ticks``, which no test host serves, so every
job they enqueue stays in ``pgpool_jobs`` as the record of the ticks enqueued (the payload
carries its schedule and tick). ``TESTPERIODIC_SCHEDULES=0`` declares neither (the same
code with the schedules removed); ``TESTPERIODIC_CRON`` (and ``TESTPERIODIC_TZ``) declares
one more, ``custom``, to try bad expressions and time zones.
"""

from __future__ import annotations

import os

import pgpool

#: The bounded catch-up: large enough that a host late by a few seconds on a loaded machine
#: still enqueues every tick, small enough that a test's downtime can exceed it.
CATCH_UP = 5


@pgpool.handler("tick")
def tick(payload: dict) -> None:
    pass


if os.environ.get("TESTPERIODIC_SCHEDULES", "1") == "1":
    pgpool.periodic("every-second", "* * * * * *", kind="tick", queue="ticks",
                    payload={"schedule": "every-second"}, catch_up=CATCH_UP)
    pgpool.periodic("every-second-latest", "* * * * * *", kind="tick", queue="ticks",
                    payload={"schedule": "every-second-latest"}, timezone="Europe/Paris")

if "TESTPERIODIC_CRON" in os.environ:
    pgpool.periodic("custom", os.environ["TESTPERIODIC_CRON"], kind="tick",
                    timezone=os.environ.get("TESTPERIODIC_TZ", "UTC"))
