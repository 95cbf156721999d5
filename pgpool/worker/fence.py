"""The lease fence: a worker ends itself, from the kernel, when its job's lease may be gone.

The dispatcher is what normally stops a job whose lease is lost, but a dispatcher that
cannot act (frozen, swapped out, its event loop blocked) would let its workers run on while
another host's reaper hands their jobs to someone else. So every job reaches its worker
with a deadline (`ipc.WorkItem.deadline`, a `time.monotonic()` time a margin before the
server-side lease can end, see `pgpool.host.lease`), and after each successful heartbeat the
dispatcher sends each worker one `ipc.Extend` that moves the deadline of every job it was
sent before.

While a job runs, a kernel timer (``setitimer(ITIMER_REAL)``) is armed for its deadline.
SIGALRM keeps its default action, so when the timer expires the kernel terminates the
process: whatever the handler is doing (C code, ``time.sleep``, holding the GIL), and even
if the whole host was frozen with SIGSTOP in between (a pending fatal signal is acted on
before the process returns to user space on SIGCONT). SIGALRM is blocked in every thread
but the one that runs handlers, so that thread is the one that takes it. The pool reads a
worker's death by SIGALRM as `DEADLINE_PASSED`.

The timer ends the worker only, and its dispatcher, which kills a dead worker's process
group (what the handler started: ffmpeg, a shell loop), may be the very process that cannot
act. So each worker also starts a guard (`guard_group`): a small process in the worker's
process group that waits on a pidfd of the worker and SIGKILLs the whole group, itself
included, as soon as the worker has ended, whoever ended it: the timer, the kernel after
the dispatcher died (PR_SET_PDEATHSIG), a crash, or the worker's own return. The rest of
the group thus runs past the deadline only while the kernel tears the worker down and the
guard is woken: milliseconds (more for a worker holding gigabytes), taken from the lease's
margin. That holds after a whole host is thawed past the deadline too: the worker runs no
more code, and what it started runs for that long. The guard is no child of the worker
(a handler waiting for "any child" never sees it) and holds none of its descriptors but
the pidfd. A process that leaves the group (setsid, setpgid, a double-forking daemon)
escapes it, as it escapes the dispatcher's kill. Making the worker a child subreaper would
not catch those: the worker is dead, and its orphans re-parented past it, by the time
anything could act on them.

Where there are no pidfds (macOS, `pgpool.worker.portable`), the guard waits instead for a POSIX
record lock (``lockf``) on a deleted temporary file, which the worker takes before it forks
the guard and holds until it ends: the kernel releases it as the process exits, however it
exits, and a child never inherits it, so nothing a handler starts can keep it. As prompt as
a pidfd, with one condition: the worker must not close that file, and no handler has a
reason to. On macOS the guard keeps its worker's process title (see `_guard`).

Extensions arrive on the task pipe, which a reader thread drains while a handler runs
(`pgpool.worker`); it re-arms the timer under `Fence`'s lock. That thread needs the GIL for
a few microseconds per message: a handler that holds the GIL without a break for longer
than its deadline is away is ended even though its lease holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import select
import signal
import sys
import tempfile
import threading
import time
from typing import Final

from setproctitle import setproctitle

from . import portable

#: The signal the fence reserves: handlers must not handle, ignore or block it, nor arm
#: ``signal.alarm`` / ``setitimer(ITIMER_REAL)``.
SIGNAL: Final = signal.SIGALRM
#: How the pool describes a worker the fence ended.
DEADLINE_PASSED: Final = "lease deadline passed"


class Fence:
    """The timer of one worker process. `start` before each job and `disarm` before
    waiting for work, on the handler thread; `extend` may be called from any thread.

    Between two jobs the timer stays armed: the worker is only writing an outcome then,
    and jobs claimed together (or extended together) share one deadline, so most jobs
    cost no system call at all.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: float | None = None  # the deadline the timer is set for; None: off
        self._extended_until = -math.inf  # the last `Extend`...
        self._extended_upto = 0  # ...covers the jobs numbered below this

    def start(self, seq: int, deadline: float) -> bool:
        """Arm the timer for job number ``seq`` (counted from 0 in the order received) whose
        own deadline is ``deadline``. False if that has already passed: the job must not
        start."""
        with self._lock:
            if seq < self._extended_upto:
                deadline = max(deadline, self._extended_until)
            if deadline == math.inf:
                self._off()
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if deadline != self._armed:
                signal.setitimer(signal.ITIMER_REAL, left)
                self._armed = deadline
            return True

    def disarm(self) -> None:
        """No job is running or about to: turn the timer off."""
        with self._lock:
            self._off()

    def extend(self, until: float, received: int) -> None:
        """Every job numbered below ``received`` may run until ``until``. Never shortens
        the armed timer, and never re-arms one that has already expired (its signal is
        pending: the process ends anyway)."""
        with self._lock:
            self._extended_until, self._extended_upto = until, received
            if self._armed is not None and until > self._armed:
                left = until - time.monotonic()
                if left > 0:
                    signal.setitimer(signal.ITIMER_REAL, left)
                    self._armed = until

    def _off(self) -> None:
        if self._armed is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._armed = None


def reserve() -> None:
    """Give the fence's signal its default action (terminate), in case the interpreter's
    parent left it otherwise."""
    signal.signal(SIGNAL, signal.SIG_DFL)


def guard_group(title: str) -> None:
    """Start the guard of this process's group (see the module's text), named ``title``.
    Call it in a process group leader before any handler code runs, and before any thread
    starts (it forks). Raises OSError if the guard cannot be started."""
    me = os.pidfd_open(os.getpid()) if portable.PIDFD else _held_lock()
    try:
        # Fork twice: the guard is orphaned at once, so it is no child of this process.
        middle = os.fork()
        if middle == 0:
            try:
                if os.fork() == 0:
                    _guard(me, title)  # never returns: it ends with the group
                os._exit(0)
            finally:
                os._exit(1)
        _, status = os.waitpid(middle, 0)
        if status:
            raise OSError("cannot fork the lease fence's guard process")
    finally:
        if portable.PIDFD:  # a lock's file stays open: closing it would release the lock
            os.close(me)


def _held_lock() -> int:
    """A descriptor of a new, deleted temporary file on which this process holds a lock."""
    fd, path = tempfile.mkstemp(prefix="pgpool-fence-")
    os.unlink(path)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _guard(worker: int, title: str) -> None:
    """Wait for the worker to end (``worker``: its pidfd, or the file of its lock), then
    SIGKILL this process group, this process included."""
    try:
        # Only SIGKILL (or SIGSTOP) may stop it: not a signal a handler sends its own group.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        # Hold nothing of the worker's: its pipes must close when it dies, and the output
        # of a host ends when its workers do.
        for fd in map(int, os.listdir("/proc/self/fd" if portable.LINUX else "/dev/fd")):
            if fd > 2 and fd != worker:
                with contextlib.suppress(OSError):  # the listing's own, closed already
                    os.close(fd)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        # On macOS, setproctitle crashes a process forked without exec (py-setproctitle
        # issues 113 and 165): there the guard keeps the title its worker had.
        if sys.platform != "darwin":
            setproctitle(title)
        if portable.PIDFD:
            ended = select.poll()
            ended.register(worker, select.POLLIN)
            ended.poll()  # a pidfd turns readable once its process has exited
        else:
            fcntl.lockf(worker, fcntl.LOCK_EX)  # granted once the worker has ended
    finally:
        # On an error too: a worker must not run handlers without its guard.
        os.killpg(0, signal.SIGKILL)
