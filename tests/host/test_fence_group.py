"""The lease fence ends what a handler started, not only the worker: a real host whose
handler shells out (`testjobs.spawner`: a ``sh`` loop appending the wall-clock time to a
file every 50 ms), then its dispatcher is frozen with SIGSTOP for three leases, or killed.
Nobody on the dispatcher's side can act, so the worker's side must: nothing may be written
after the attempt's deadline, and the loop must be gone.

Times are compared on one clock: ``date`` and PostgreSQL's ``now()`` both read the
machine's wall clock (the test's server runs on this machine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psycopg
import pytest
from commands import RUN
from dbtools import one
from processes import Pgpool, alive, start_pgpool
from waits import wait_until

import pgpool
from pgpool.host.lease import FENCE_MARGIN

#: Long enough that half its margin (0.2 s) is many times what the end of the group takes
#: after the deadline (the worker's exit and one wake-up of its guard: a few ms, 0.1 s once
#: on a 2-core machine at load 8 with CPU steal).
LEASE = 4
#: Three leases: the worker's deadline is at most 0.9 of a lease after the freeze starts,
#: and anything left of the group would write on for the two leases after it.
FREEZE = 3 * LEASE

#: Its timing is its subject: these run one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("timing")


def start_loop(db: psycopg.Connection, dsn: str, tmp_path: Path, host_path: dict[str, str]
               ) -> tuple[Pgpool, int, int, Path]:
    """A host with one worker running a `spawner` job whose loop has written at least
    once: (the host, the job, the loop's pid, the file it writes)."""
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", str(LEASE), "--batch", "1",
                        **host_path)
    host.event("started")
    written = tmp_path / "times"
    job = pgpool.enqueue(db, "spawner", {"file": str(written), "seconds": 600})
    pid = Path(f"{written}.pid")
    wait_until(lambda: pid.exists() and times(written), "the handler's loop to write")
    return host, job, int(pid.read_text()), written


def times(written: Path) -> list[float]:
    """The times the loop wrote (a line cut short by a kill is left out)."""
    if not written.exists():
        return []
    return [float(line) for line in written.read_text().split("\n")[:-1] if line]


def end_loop(pid: int) -> None:
    """Kill the loop if the fence did not (a failing run must not leave it writing)."""
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.soak  # hosts frozen or racing for many seconds: `make soak-test`
def test_a_frozen_dispatcher_s_handler_subprocess_ends_at_the_deadline(db, dsn, tmp_path,
                                                                       host_path):
    host, job, loop, written = start_loop(db, dsn, tmp_path, host_path)
    try:
        os.kill(host.pid, signal.SIGSTOP)
        try:
            # The fault is a freeze of this length: holding it is the point, not a wait.
            time.sleep(FREEZE)
            ended = not alive(loop)
            # Frozen, the host cannot have extended the lease since: the row holds the end
            # of the last lease granted (a heartbeat in flight at SIGSTOP may have moved it
            # without the worker hearing of it: that only makes the bound looser).
            (lease_until,) = one(db, "SELECT extract(epoch FROM lease_until)::float8 "
                                     "FROM pgpool_jobs WHERE id = %s", job)
            last = max(times(written))
        finally:
            os.kill(host.pid, signal.SIGCONT)
    finally:
        end_loop(loop)
    # The deadline is (1 - FENCE_MARGIN) of a lease after the last statement that granted
    # one was sent, which is no later than the server's now() it used: lease_until minus
    # the margin. The group ends a wake-up or two later: half the margin is the bound.
    late = last - (lease_until - FENCE_MARGIN * LEASE)
    assert late < FENCE_MARGIN * LEASE / 2, (
        f"the handler's loop wrote {late:.3f}s past the deadline (lease ends {lease_until})")
    assert ended, "the handler's loop outlived the freeze"
    assert host.stop() == 0, host.stderr


def test_a_killed_dispatcher_s_handler_subprocess_ends_with_it(db, dsn, tmp_path, host_path):
    host, _, loop, written = start_loop(db, dsn, tmp_path, host_path)
    try:
        host.kill()
        host.proc.wait(30)
        killed = time.time()
        wait_until(lambda: not alive(loop), "the handler's loop to end", 10)
    finally:
        end_loop(loop)
    # Its worker died with it, and the group with the worker, at once: on Linux the kernel
    # killed the worker (PR_SET_PDEATHSIG) and the guard its group; on the portable path
    # the worker saw its task pipe close and killed its group itself. Not the fence: the
    # deadline is up to a lease away.
    assert max(times(written)) < killed + FENCE_MARGIN * LEASE / 2
