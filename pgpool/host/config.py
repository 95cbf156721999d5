"""Run configuration and host facts (how many CPUs this process may really use)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from ..errors import ConfigError
from ..logs import DEFAULT_LOG_ERRORS
from ..retry import Retry

#: Attempts a job gets when neither its producer nor its handler says otherwise.
DEFAULT_MAX_ATTEMPTS = 20
#: How long dead jobs are kept before a host prunes them (``--dead-retention``).
DEFAULT_DEAD_RETENTION = 30 * 86_400.0
#: Seconds between two ``summary`` events (``--log-summary``; why 60: `pgpool.host.summary`).
DEFAULT_LOG_SUMMARY = 60.0

#: What the fair claim evens out between tenants (``pgpool run --fair-by``).
FairBy = Literal["count", "cpu"]
FAIR_BY: Final[tuple[FairBy, ...]] = ("count", "cpu")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in a duration like ``90s``, ``15m``, ``2h``, ``7d``, ``1w``, ``1h30m`` or ``0``;
    raise `ConfigError` naming the format otherwise."""
    spec = text.strip().lower()
    if spec == "0":
        return 0.0
    parts = _DURATION.findall(spec)
    if not parts or "".join(n + u for n, u in parts) != spec:
        raise ConfigError(f"{text!r} is not a duration: write a number and a unit, s, m, h, "
                          "d or w (e.g. 90s, 15m, 2h, 7d, 1h30m)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass(frozen=True)
class RunConfig:
    """Everything `pgpool.host.dispatcher.Dispatcher` needs; the CLI validates the values."""

    dsn: str
    modules: tuple[str, ...]
    procs: int
    queues: tuple[str, ...] = ("default",)
    #: Jobs per claim, or "auto": sized from the measured claim round trip and job time.
    batch: int | Literal["auto"] = "auto"
    lease: float = 30.0
    timeout: float | None = None
    grace: float = 30.0
    burst: bool = False
    poll: float = 1.0
    #: The backstop poll of an idle host (nothing ready, its listener connected): every way
    #: a job becomes ready notifies the hosts, so this only bounds a lost notification.
    idle_poll: float = 30.0
    #: Replace a worker after this many jobs (None: never).
    max_tasks_per_child: int | None = None
    #: Workers kept started beside ``procs``, to replace one that ends at once.
    spare_workers: int = 1
    #: Cap each worker's private writable memory at this many bytes (None: no cap).
    max_memory: int | None = None
    #: Claims per second for the whole fleet when ``pgpool budget set`` set none (None:
    #: pgpool.host.budget.DEFAULT_MAX_CLAIMS_PER_SEC); the hosts share it by demand.
    max_claims_per_sec: float | None = None
    #: The most running jobs of one tenant across the fleet (None: no cap;
    #: docs/guides/fairness.md says how far concurrent claims can overshoot it).
    tenant_cap: int | None = None
    #: What the fair claim evens out between tenants: their jobs ("count") or the CPU time
    #: their jobs use ("cpu": docs/guides/fairness.md, "Fairness by CPU time").
    fair_by: FairBy = "count"
    #: The retry schedule of kinds whose handler gives none (``retry=``).
    retry: Retry = field(default_factory=Retry)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: Serve /metrics and /healthz on this TCP port (None: not at all; 0: any free port).
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    #: Seconds dead jobs are kept before one live host prunes them (None: kept forever).
    dead_retention: float | None = DEFAULT_DEAD_RETENTION
    #: Seconds every success is kept in ``pgpool_done`` with its result, when its handler
    #: does not say (``keep=``); None: only those kinds' are.
    keep_done: float | None = None
    #: The workers' log level and format (`pgpool.logs.LOG_FORMATS`), the dispatcher's:
    #: handlers' ``logging`` calls go where its records go. None: workers leave logging
    #: as Python starts it (a dispatcher embedded in a program with logging of its own).
    log_level: str | None = None
    log_format: str = "text"
    #: What the events of failed attempts show of their error (`pgpool.logs.LOG_ERRORS`).
    log_errors: str = DEFAULT_LOG_ERRORS
    #: Log each success too (``job_done``), with its run time; the other outcomes always are.
    log_jobs: bool = False
    #: Seconds between the ``summary`` events while jobs end (`pgpool.host.summary`); None:
    #: no summary.
    log_summary: float | None = DEFAULT_LOG_SUMMARY


#: Where cgroup controllers are mounted, and this process's cgroup membership (parameters of
#: the functions below so that tests can give a fake tree).
CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
SELF_CGROUP: Final = Path("/proc/self/cgroup")
#: What `auto_procs` keeps out of a memory limit for the dispatcher, its small init and the
#: interpreter overhead of each worker beyond --max-memory (the dispatcher's RSS is well under).
DISPATCHER_RESERVE: Final = 128 * 2**20
#: cgroup v1 reports "no limit" as a huge number (the page-rounded int64 maximum).
_V1_UNLIMITED: Final = 2**60


def usable_cpus(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    quota = _cgroup_quota(root, self_cgroup)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def memory_limit(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int | None:
    """The tightest cgroup memory limit on this process's cgroup path, in bytes; None if
    there is none."""
    limits = []
    for level in _own_levels(root, self_cgroup):  # cgroup v2: "max" or bytes
        try:
            value = (level / "memory.max").read_text().strip()
            if value != "max":
                limits.append(int(value))
        except (OSError, ValueError):
            pass
    if limits:
        return min(limits)
    try:  # cgroup v1
        value = int((root / "memory" / "memory.limit_in_bytes").read_text())
        return None if value <= 0 or value >= _V1_UNLIMITED else value
    except (OSError, ValueError):
        return None


def workers_that_fit(max_memory: int | None, root: Path = CGROUP_ROOT,
                     self_cgroup: Path = SELF_CGROUP) -> int | None:
    """How many workers capped at ``max_memory`` bytes each fit in the cgroup memory limit
    after `DISPATCHER_RESERVE` (at least 1); None without a cap or a limit."""
    limit = memory_limit(root, self_cgroup)
    if not max_memory or limit is None:
        return None
    return max(1, (limit - DISPATCHER_RESERVE) // max_memory)


def auto_procs(max_memory: int | None, root: Path = CGROUP_ROOT,
               self_cgroup: Path = SELF_CGROUP) -> int:
    """``--procs auto``: the usable CPUs, but no more workers than `workers_that_fit`."""
    cpus = usable_cpus(root, self_cgroup)
    return min(cpus, workers_that_fit(max_memory, root, self_cgroup) or cpus)


def _own_levels(root: Path, self_cgroup: Path) -> list[Path]:
    """The cgroup v2 directories from this process's own up to ``root``."""
    try:  # cgroup v2: "0::/path"
        own = next(line[3:] for line in self_cgroup.read_text().splitlines()
                   if line.startswith("0::"))
    except (OSError, StopIteration):
        own = "/"
    level = root / own.strip("/")
    levels = [level]
    while level != root and root in level.parents:
        level = level.parent
        levels.append(level)
    return levels


def _cgroup_quota(root: Path, self_cgroup: Path) -> float | None:
    """The tightest CPU quota on this process's cgroup path, in CPUs; None if unlimited."""
    quotas = []
    for level in _own_levels(root, self_cgroup):  # each may set "<quota> <period>" or "max ..."
        try:
            quota, period = (level / "cpu.max").read_text().split()[:2]
            if quota != "max":
                quotas.append(int(quota) / int(period))
        except (OSError, ValueError):
            pass
    if quotas:
        return min(quotas)
    try:  # cgroup v1
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if q <= 0 or p <= 0 else q / p
    except (OSError, ValueError):
        return None
