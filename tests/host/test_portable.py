"""The portable path (`pgpool.worker.portable`), what macOS takes, forced on Linux with
``PGPOOL_PORTABLE=1``. The host tests that matter most run on both paths (the ``host_path``
fixture: a burst drain, workers killed and replaced, a hard timeout, SIGTERM with and past
its grace, a killed dispatcher); these check that the switch really changes the path, and
what the portable path refuses.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from commands import RUN, assert_user_error, run_pgpool
from processes import start_pgpool
from waits import wait_until


def fd_targets(pid: int) -> list[str]:
    """What each open descriptor of process ``pid`` refers to."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed while listed
            found.append(os.readlink(fd))
    return found


def processes() -> list[tuple[int, int, int, bytes]]:
    """(pid, parent pid, process group, title) of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
                title = (entry / "cmdline").read_bytes().rstrip(b"\0")
            except OSError:  # ended while listed
                continue
            found.append((int(entry.name), int(fields[1]), int(fields[2]), title))
    return found


def test_each_host_path_uses_its_own_way_to_watch_a_worker(dsn, host_path):
    # Linux: the dispatcher holds a pidfd per worker, and each worker's guard one of its
    # worker. The portable path: no pidfd anywhere; the guard waits for a lock on a deleted
    # temporary file that its worker holds.
    host = start_pgpool(dsn, *RUN, "--procs", "2", **host_path)
    host.event("started")
    workers = [pid for pid, parent, _, title in processes()
               if parent == host.pid and title.startswith(b"pgpool worker")]
    assert len(workers) == 2, workers
    pidfd = "anon_inode:[pidfd]"
    portable = bool(host_path)
    assert fd_targets(host.pid).count(pidfd) == (0 if portable else 2)
    for worker in workers:
        (guard,) = wait_until(
            lambda w=worker: [pid for pid, _, group, title in processes()
                              if group == w and title.startswith(b"pgpool fence")],
            "the worker's guard")
        held = fd_targets(guard)
        assert (pidfd in held) is not portable, held
        locks = [t for t in held if "pgpool-fence-" in t and t.endswith(" (deleted)")]
        assert len(locks) == portable, held
    assert host.stop() == 0, host.stderr


def test_max_memory_is_refused_on_the_portable_path(dsn):
    for args, env in ((("--max-memory", "512"), {}), ((), {"PGPOOL_MAX_MEMORY": "512"})):
        done = run_pgpool(dsn, *RUN, *args, "--burst", PGPOOL_PORTABLE="1", **env)
        assert_user_error(done, "--max-memory needs Linux", "RLIMIT_DATA", "PGPOOL_PORTABLE=1")


def test_a_bad_portable_switch_is_refused(dsn):
    done = run_pgpool(dsn, *RUN, "--burst", PGPOOL_PORTABLE="yes")
    assert_user_error(done, "PGPOOL_PORTABLE is 'yes'", "use 1", "or 0")
