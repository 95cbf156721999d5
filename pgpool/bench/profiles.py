"""The job profiles: calibrating them on this host, and the payloads a run enqueues.

``noop``; ``cpu``, a SHA-256 chain (`jobs.sha256_chain`) whose length is calibrated here to
take about `CPU_JOB_SECONDS`; ``sleep``, a random 2-5 ms; ``mixed``, the three in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

from .jobs import bench_job, sha256_chain

#: Target duration of one ``cpu`` job, seconds.
CPU_JOB_SECONDS: Final = 0.005
#: One seeded job in this many records its start, for the queue lag.
LAG_SAMPLE_EVERY: Final = 64


def calibrate(profile: str, cpu_seconds: float = CPU_JOB_SECONDS
              ) -> tuple[int | None, float]:
    """(SHA-256 rounds for a cpu job of about ``cpu_seconds`` or None, the profile's mean
    job time in s)."""
    noop = _mean_seconds(lambda: None, 1000)
    if profile == "noop":
        return None, noop
    rounds = 2000
    for times in (3, 10):  # a rough probe, then a refinement at about the target length
        took = _mean_seconds(partial(sha256_chain, rounds), times)
        rounds = max(1, round(rounds * cpu_seconds / took))
    cpu = _mean_seconds(lambda: sha256_chain(rounds), 10)
    if profile == "cpu":
        return rounds, cpu
    sleep = _mean_seconds(lambda: bench_job({"do": "sleep"}), 30)
    if profile == "sleep":
        return None, sleep
    return rounds, (noop + cpu + sleep) / 3


def _mean_seconds(fn: Callable[[], object], times: int) -> float:
    """Mean seconds per call over ``times`` calls, the lowest of three tries: a try
    disturbed by the rest of the machine only ever reads high."""
    tries = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(times):
            fn()
        tries.append((time.perf_counter() - started) / times)
    return min(tries)


def payloads(profile: str, jobs: int, rounds: int | None) -> list[dict[str, Any]]:
    """The profile's payloads; one in `LAG_SAMPLE_EVERY` asks its handler for a stamp."""
    kinds = {"noop": [{"do": "noop"}], "cpu": [{"do": "cpu", "rounds": rounds}],
             "sleep": [{"do": "sleep"}]}
    cycle = kinds.get(profile) or [*kinds["noop"], *kinds["cpu"], *kinds["sleep"]]
    return [{**cycle[i % len(cycle)], "stamp": True} if i % LAG_SAMPLE_EVERY == 0
            else cycle[i % len(cycle)] for i in range(jobs)]
