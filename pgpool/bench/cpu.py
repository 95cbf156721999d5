"""CPU seconds: of this process and its children (`resource`), of the local PostgreSQL, and
of a tree of processes (``/proc``).

PostgreSQL's share is read from ``/proc`` for every visible process named ``postgres``, so
it is there only when the server runs on this host and this user may see it (Linux).
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple


class _Stat(NamedTuple):
    """What ``/proc/<pid>/stat`` says of one process, CPU in seconds (user + system)."""

    pid: int
    comm: str
    ppid: int
    cpu: float
    #: Of its children that have ended and that it has waited for.
    children_cpu: float


def rusage_seconds(usage: resource.struct_rusage) -> float:
    """User plus system CPU seconds of a `resource.getrusage` sample."""
    return usage.ru_utime + usage.ru_stime


def postgres_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each visible process named ``postgres``, by pid."""
    return {s.pid: s.cpu for s in _stats() if s.comm == "postgres"}


def tree_cpu(roots: Iterable[int]) -> dict[int, float]:
    """CPU seconds of each process under ``roots`` (the roots and their descendants), by
    pid: its own, plus its ended children's, so that a worker replaced meanwhile counts."""
    stats = list(_stats())
    children: dict[int, list[int]] = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s.pid)
    tree, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return {s.pid: s.cpu + s.children_cpu for s in stats if s.pid in tree}


def process_cpu(pid: int) -> tuple[float, float] | None:
    """(its own CPU seconds, its ended and waited-for children's) of process ``pid``;
    None once it is gone."""
    s = _stat(Path(f"/proc/{pid}"))
    return None if s is None else (s.cpu, s.children_cpu)


def _stats() -> Iterator[_Stat]:
    for entry in _proc_dirs():
        s = _stat(entry)
        if s is not None:
            yield s


def _stat(entry: Path) -> _Stat | None:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # The name may hold spaces and parentheses: it ends at the last ")".
    comm_end = stat.rfind(")")
    fields = stat[comm_end + 2:].split()
    return _Stat(int(entry.name), stat[stat.find("(") + 1:comm_end], int(fields[1]),
                 (int(fields[11]) + int(fields[12])) / ticks,
                 (int(fields[13]) + int(fields[14])) / ticks)


def _proc_dirs() -> Iterator[Path]:
    with contextlib.suppress(OSError):
        yield from (p for p in Path("/proc").iterdir() if p.name.isdigit())


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float | None:
    """CPU used between two samples (`postgres_cpu`, `tree_cpu`) by the processes alive at
    the end; None if none was seen."""
    if not after:
        return None
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
