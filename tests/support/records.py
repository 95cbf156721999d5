"""What the test handlers did (tests/handlers/testjobs.py's records and ticks)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def read_records(record_dir: Path) -> list[tuple[int, int, int, str]]:
    """(job id, attempt, worker pid, event) lines written by tests/handlers/testjobs.py."""
    out = []
    for f in record_dir.glob("*.log"):
        for line in f.read_text().splitlines():
            job_id, attempt, pid, event = line.split()
            out.append((int(job_id), int(attempt), int(pid), event))
    return out


def read_ticks(where: Path) -> dict[int, list[Any]]:
    """Every attempt of a tests/handlers/testjobs.py ``ticker`` job that ticked under ``where``
    ($TICKS_RECORD), by job, sorted by start, as ``chaos_checks.Attempt``: from its first
    tick to its last one plus a tick (its code may have run that long after the last
    record), or to its end record if it finished."""
    from chaos_checks import Attempt
    from testjobs import TICK

    ticks: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    finished = set()
    for f in where.glob("*.log"):
        ppid, _, pid = f.stem.partition("-")
        for line in f.read_text().split("\n")[:-1]:  # a line cut short by a kill is left out
            job, attempt, at = line.split()
            key = (int(job), int(attempt), int(pid), int(ppid))
            if at == "end":
                finished.add(key)
            else:
                ticks[key].append(int(at))
    attempts: dict[int, list[Any]] = defaultdict(list)
    for key, times in ticks.items():
        end = max(times) + (0 if key in finished else int(TICK * 1e9))
        attempts[key[0]].append(Attempt(*key, min(times), end))
    for runs in attempts.values():
        runs.sort(key=lambda a: a.start)
    return dict(attempts)


def starts(record_dir: Path) -> dict[int, list[int]]:
    """Worker pids by job id, one per recorded start (tests/handlers/testjobs.py)."""
    out: dict[int, list[int]] = {}
    for job_id, _, pid, what in read_records(record_dir):
        if what == "start":
            out.setdefault(job_id, []).append(pid)
    return out
