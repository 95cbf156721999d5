"""PID 1 duties, for `pgpool run` started as the first process of a PID namespace.

PID 1 has two duties that no other process has. Every orphan in its namespace is
re-parented to it (a handler's grandchild whose parent exited, a daemon that double-forked),
and it must reap them or they stay ``<defunct>`` for good. And the kernel delivers it only
the signals it has installed a handler for. A container started without an init
(``docker run`` without ``--init``, ``unshare --pid --fork``) makes the dispatcher PID 1.

So then `pgpool run` splits in two before anything else starts: PID 1 stays a minimal init
that forwards SIGTERM and SIGINT to the dispatcher, reaps every process that ends up its
child, and exits with the dispatcher's status (128 + the signal if one killed it). The
dispatcher runs as its only child, exactly as anywhere else; its workers are its own
children, so the init never takes the exit status of a process the dispatcher waits for,
and may reap whatever it is given without asking what it is.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import NoReturn

from setproctitle import setproctitle

#: The signals the dispatcher acts on: a graceful stop, and a hard one if repeated.
FORWARDED = (signal.SIGTERM, signal.SIGINT)


def split_if_pid1(early_signals: list[int]) -> None:
    """If this process is PID 1, fork: the child returns and goes on as the dispatcher; this
    process becomes its init and never returns.

    ``early_signals`` holds the signals the caller's handlers recorded so far (they must
    be installed for `FORWARDED` before this call, or a signal in between is lost): the
    child keeps those, and the init forwards any recorded after the fork.
    """
    if os.getpid() != 1:
        return
    seen = len(early_signals)
    child = os.fork()
    if child == 0:
        return
    _init(child, early_signals, seen)


def _init(child: int, early_signals: list[int], seen: int) -> NoReturn:
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    for sig in early_signals[seen:]:  # recorded between the fork and the line above
        forward(sig, None)
    setproctitle(f"pgpool init: dispatcher {child}")
    while True:
        pid, status = os.wait()  # any child: the dispatcher, or an orphan to reap
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)
