"""Host facts and CLI plumbing that need no database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from commands import pgpool_cmd

from pgpool.host.config import DISPATCHER_RESERVE, auto_procs, memory_limit, usable_cpus


def test_usable_cpus_respects_the_affinity_mask():
    code = ("import os; from pgpool.host.config import usable_cpus; "
            "os.sched_setaffinity(0, {0}); print(usable_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "1"


def test_invalid_log_level_in_the_environment_is_a_clear_error():
    env = {**os.environ, "PGPOOL_LOG_LEVEL": "verbose"}
    out = subprocess.run(pgpool_cmd("migrate", "--dsn", "host=/nonexistent"), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == ("pgpool: error: PGPOOL_LOG_LEVEL='VERBOSE' is not one of "
                                  "DEBUG, INFO, WARNING, ERROR")


# --- cgroup limits, from fake trees (config's root and /proc/self/cgroup are parameters) ---


def cgroup_tree(tmp_path: Path, own: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    root.mkdir(exist_ok=True)
    membership = tmp_path / "self-cgroup"
    membership.write_text(f"0::{own}\n")
    return root, membership


def test_cgroup_v2_limits_are_the_tightest_on_the_path(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path, "/pod/ctr", {
        "cpu.max": "max 100000", "pod/cpu.max": "50000 100000", "pod/ctr/cpu.max": "max 100000",
        "memory.max": "max", "pod/memory.max": "1073741824", "pod/ctr/memory.max": "536870912",
    })
    assert usable_cpus(*tree) == 1  # half a CPU still gets one worker
    assert memory_limit(*tree) == 512 * 2**20


def test_cgroup_v1_limits_and_unlimited(tmp_path: Path) -> None:
    tree = cgroup_tree(tmp_path / "limited", "/", {
        "cpu/cpu.cfs_quota_us": "100000", "cpu/cpu.cfs_period_us": "100000",
        "memory/memory.limit_in_bytes": "268435456"})
    assert (usable_cpus(*tree), memory_limit(*tree)) == (1, 256 * 2**20)
    free = cgroup_tree(tmp_path / "free", "/", {
        "cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000",
        "memory/memory.limit_in_bytes": "9223372036854771712"})
    assert (usable_cpus(*free), memory_limit(*free)) == (len(os.sched_getaffinity(0)), None)


@pytest.mark.parametrize(("limit_mib", "max_memory_mib", "expected"), [
    (None, 100, "cpus"),   # no memory limit: one worker per CPU
    (1024, None, "cpus"),  # no per-worker cap: nothing to divide the limit by
    (128 + 100, 100, 1),   # room for the dispatcher and one worker
    (128 + 199, 100, 1),   # a second worker would not fit
    (100, 100, 1),         # never fewer than one
    (128 + 100_000, 100, "cpus"),
])
def test_procs_auto_fits_workers_in_the_memory_limit(
    tmp_path: Path, limit_mib: int | None, max_memory_mib: int | None, expected: object
) -> None:
    tree = cgroup_tree(tmp_path, "/", {} if limit_mib is None
                       else {"memory.max": str(limit_mib * 2**20)})
    cpus = len(os.sched_getaffinity(0))
    assert DISPATCHER_RESERVE == 128 * 2**20
    assert auto_procs(max_memory_mib and max_memory_mib * 2**20, *tree) == (
        cpus if expected == "cpus" else expected)
