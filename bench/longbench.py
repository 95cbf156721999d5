"""Handlers of bench/long_jobs.py (``--handlers longbench``, bench/ on PYTHONPATH), each
timing itself inside a real worker and returning its figures (kept: ``keep``)."""

from __future__ import annotations

import time
from typing import Any

import pgpool
from pgpool.bench.jobs import sha256_chain


@pgpool.handler("long_bench_progress", keep=3600)
def progress_cost(payload: dict[str, Any]) -> dict[str, list[float]]:
    """``calls`` iterations of ``rounds`` SHA-256 rounds each, without and with a
    ``current_job().progress`` call per iteration, alternated ``turns`` times: the seconds
    of each loop."""
    job = pgpool.current_job()
    calls, rounds = payload["calls"], payload["rounds"]
    times: dict[str, list[float]] = {"plain": [], "progress": []}
    for turn in range(payload["turns"]):
        for side in ("plain", "progress") if turn % 2 == 0 else ("progress", "plain"):
            started = time.perf_counter()
            if side == "plain":
                for _ in range(calls):
                    sha256_chain(rounds)
            else:
                for i in range(calls):
                    sha256_chain(rounds)
                    job.progress(i, calls)
            times[side].append(time.perf_counter() - started)
    return times


@pgpool.handler("long_bench_soft", timeout=30, soft_timeout=0.5, keep=3600)
def soft_lateness(payload: dict[str, Any]) -> float:
    """A pure-Python loop until its soft timeout: the seconds past 0.5 it came."""
    started = time.perf_counter()
    try:
        n = 0
        while True:
            n += 1
    except pgpool.SoftTimeout:
        return time.perf_counter() - started - 0.5


@pgpool.handler("long_bench_checkpoint", keep=3600)
def checkpoint_cost(payload: dict[str, Any]) -> list[float]:
    """``count`` checkpoints of a state of ``size`` bytes: the seconds of each."""
    job = pgpool.current_job()
    state = {"blob": "x" * payload["size"]}
    times = []
    for _ in range(payload["count"]):
        started = time.perf_counter()
        job.checkpoint(state)
        times.append(time.perf_counter() - started)
    return times
