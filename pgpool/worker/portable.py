"""What `pgpool run` uses beyond POSIX, and the portable path it takes where that is missing.

On Linux, the production platform, a host uses the kernel's own calls:

- the dispatcher notices a worker's exit through a pidfd, which turns readable when the
  process ends (`pgpool.host.pool`);
- a worker dies with its dispatcher: the kernel kills it (PR_SET_PDEATHSIG, `pgpool.worker`);
- the fence's guard waits for its worker's end through a pidfd (`pgpool.worker.fence`);
- ``--max-memory`` caps a worker with RLIMIT_DATA, which Linux counts over every private
  writable mapping, malloc's mmap'd arenas included.

Elsewhere (macOS, where many handlers are written and tested), the portable path:

- a thread per worker waits for its exit (``waitpid``, which also reaps it) and hands it to
  the event loop;
- a worker ends itself and its process group when its task pipe closes: nothing but the
  dispatcher's end closes it while the worker runs. A handler that holds the GIL keeps
  the worker from seeing it; the fence's timer then ends the worker at its lease deadline;
- the guard waits for a POSIX record lock (``lockf``) that its worker holds until it ends:
  such locks are not inherited, so no child of a handler can keep it;
- ``--max-memory`` is refused: macOS does not enforce RLIMIT_DATA on mmap'd memory.

The fence's timer (``setitimer``, SIGALRM) and the process groups are POSIX, the same on
both paths.

``PGPOOL_PORTABLE=1`` takes the portable path on Linux too: a development and testing switch,
so that the suite runs that path on the machines that run the rest of it.
"""

from __future__ import annotations

import os
import sys
from typing import Final

from ..errors import ConfigError

#: The switch, read once when pgpool is imported; workers inherit the environment.
SWITCH: Final = "PGPOOL_PORTABLE"
FORCED: Final = os.environ.get(SWITCH) == "1"
#: pidfds (Linux 5.3): a descriptor that turns readable when a process ends.
PIDFD: Final = hasattr(os, "pidfd_open") and not FORCED
#: The rest of Linux's own: PR_SET_PDEATHSIG, and RLIMIT_DATA as a memory cap.
LINUX: Final = sys.platform.startswith("linux") and not FORCED


def check(max_memory: int | None) -> None:
    """`ConfigError` if the switch holds something else than 0 or 1, or if ``--max-memory``
    is given where RLIMIT_DATA does not cap a worker's memory."""
    value = os.environ.get(SWITCH, "0")
    if value not in ("0", "1"):
        raise ConfigError(f"{SWITCH} is {value!r}: use 1 (the portable path that macOS "
                          "takes, for development and tests) or 0 (the default)")
    if max_memory and not LINUX:
        where = f"{SWITCH}=1 asks for the portable path" if FORCED else f"this is {sys.platform}"
        raise ConfigError(f"--max-memory needs Linux, where RLIMIT_DATA caps a worker's "
                          f"memory, and {where}: leave out --max-memory and PGPOOL_MAX_MEMORY")
