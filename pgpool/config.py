"""Run configuration and host facts (how many CPUs this process may really use)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .retry import RetryPolicy

#: Attempts a job gets when neither its producer nor its handler says otherwise.
DEFAULT_MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class RunConfig:
    """Everything `pgpool.dispatcher.Dispatcher` needs; the CLI validates the values."""

    dsn: str
    modules: tuple[str, ...]
    procs: int
    queues: tuple[str, ...] = ("default",)
    batch: int = 50
    lease: float = 30.0
    timeout: float | None = None
    grace: float = 30.0
    burst: bool = False
    poll: float = 1.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def _cgroup_quota() -> float | None:
    # cgroup v2: "max 100000" or "<quota> <period>"
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    # cgroup v1
    try:
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        p = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if q <= 0 or p <= 0 else q / p
    except (OSError, ValueError):
        return None
