"""CPU seconds: of this process and its children (`resource`), and of the local PostgreSQL.

PostgreSQL's share is read from ``/proc`` for every visible process named ``postgres``, so
it is there only when the server runs on this host and this user may see it (Linux).
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator
from pathlib import Path


def rusage_seconds(usage: resource.struct_rusage) -> float:
    """User plus system CPU seconds of a `resource.getrusage` sample."""
    return usage.ru_utime + usage.ru_stime


def postgres_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each visible process named ``postgres``, by pid."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for entry in _proc_dirs():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm_end = stat.rfind(")")
        if stat[stat.find("(") + 1:comm_end] != "postgres":
            continue
        fields = stat[comm_end + 2:].split()
        found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def _proc_dirs() -> Iterator[Path]:
    with contextlib.suppress(OSError):
        yield from (p for p in Path("/proc").iterdir() if p.name.isdigit())


def postgres_cpu_between(before: dict[int, float], after: dict[int, float]) -> float | None:
    """CPU used between two `postgres_cpu` samples by the processes alive at the end; None
    if none was seen."""
    if not after:
        return None
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
