"""A worker process: runs the handlers for the jobs its dispatcher sends, one at a time.

It imports the handler modules once, then loops: read frames from the task pipe, run each
job (decoding its payload with orjson here, not in the dispatcher), and write one outcome
frame (`ipc.Done` or `ipc.Failed`) per job to the result pipe. Before starting each job it
looks for an `ipc.Stop` frame without blocking, so a stopping dispatcher gets its unstarted
jobs back (`ipc.Returned`). The worker ignores SIGINT and SIGTERM (the dispatcher decides
when it stops) and dies with its dispatcher: on Linux the kernel kills it
(PR_SET_PDEATHSIG), and an idle worker also sees its task pipe close. It leads its own
process group, which the dispatcher kills with it. See `pgpool.pool` for the whole picture.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import resource
import select
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection

import orjson
from setproctitle import setproctitle

from . import ipc, output, registry
from .errors import PgpoolError

#: Longest error text stored with a failed attempt (the tail of the traceback is kept).
MAX_ERROR_CHARS = 4000


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The job the current worker is running, for handlers that want it."""

    id: int
    kind: str
    queue: str
    attempt: int
    max_attempts: int


_current: JobInfo | None = None


def current_job() -> JobInfo:
    """The job being run by this worker process; only valid inside a handler.

    Useful for idempotency (key side effects on ``current_job().id``) and for logging.
    """
    if _current is None:
        raise RuntimeError("pgpool.current_job() is only available inside a running handler")
    return _current


def main(index: int, modules: list[str], tasks: Connection, results: Connection,
         parent_pid: int, max_tasks: int | None = None,
         max_memory: int | None = None) -> None:
    """Entry point of worker ``index``; returns when told to stop, when it retires, or when
    the dispatcher is gone.

    ``max_tasks``: retire after that many jobs. ``max_memory``: cap this process's private
    writable memory (RLIMIT_DATA) at that many bytes, so a runaway job fails with
    MemoryError instead of exhausting the host; the worker retires after one.
    """
    # Lead a process group of its own before any handler code runs: the dispatcher kills
    # the whole group, so whatever a handler starts dies with the attempt.
    os.setpgid(0, 0)
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    prefix = f"pgpool worker {index}"
    setproctitle(f"{prefix}: starting")
    rfd, wfd = tasks.fileno(), results.fileno()
    try:
        handlers = registry.load(modules)
    except PgpoolError as exc:
        ipc.write_all(wfd, ipc.encode(ipc.Broken(str(exc))))
        return
    if max_memory is not None:
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (max_memory, max_memory))
        except (ValueError, OSError) as exc:
            reason = (f"cannot cap worker memory at {max_memory // 2**20} MiB ({exc}): the "
                      "worker already uses more after importing handlers; raise --max-memory")
            ipc.write_all(wfd, ipc.encode(ipc.Broken(reason)))
            return
    streams = output.install()  # handlers' prints name their job, and are bounded
    ipc.write_all(wfd, ipc.encode(ipc.Ready(os.getpid())))
    finished = 0

    decoder = ipc.Decoder()
    poller = select.poll()
    poller.register(rfd, select.POLLIN)
    pending: deque[ipc.WorkItem] = deque()
    idle_title = f"{prefix}: idle"
    setproctitle(idle_title)
    while True:
        # Block only when there is nothing to run; otherwise just peek for Stop.
        if not pending or poller.poll(0):
            data = os.read(rfd, 1 << 16)
            if not data:
                return  # the dispatcher closed the pipe: it is gone
            for message in decoder.feed(data):
                match message:
                    case ipc.Jobs():
                        pending.extend(message.jobs)
                    case ipc.Stop():
                        returned = ipc.Returned([job.id for job in pending])
                        ipc.write_all(wfd, ipc.encode(returned))
                        return
        if pending:
            job = pending.popleft()
            setproctitle(f"{prefix}: {job.kind}#{job.id}")
            outcome = _run(handlers, job, streams)
            ipc.write_all(wfd, ipc.encode(outcome))
            finished += 1
            retire = None
            if isinstance(outcome, ipc.Failed) and outcome.cause == "MemoryError":
                retire = "retired after a MemoryError"  # its heap may be left fragmented
            elif max_tasks is not None and finished >= max_tasks:
                retire = f"recycled after {finished} jobs"
            if retire:
                ipc.write_all(wfd, ipc.encode(ipc.Retiring(retire)))
                return
            if not pending:
                setproctitle(idle_title)


def _run(handlers: dict[str, registry.Handler], job: ipc.WorkItem,
         streams: tuple[output.JobStream, ...]) -> ipc.Done | ipc.Failed:
    global _current
    started = time.perf_counter()
    _current = JobInfo(job.id, job.kind, job.queue, job.attempt, job.max_attempts)
    for stream in streams:
        stream.begin(f"{job.kind}#{job.id}")
    try:
        handler = handlers.get(job.kind)
        if handler is None:
            raise LookupError(f"no handler for kind {job.kind!r} in this worker")
        result = handler.fn(orjson.loads(job.payload))
        if inspect.iscoroutine(result):  # an ``async def`` handler
            import asyncio  # only async handlers need it: keeps worker start-up light

            asyncio.run(result)
    except BaseException as exc:  # a handler may raise anything, SystemExit included
        return ipc.Failed(job.id, format_error(exc), type(exc).__name__,
                          time.perf_counter() - started)
    finally:
        _current = None
        for stream in streams:
            stream.end()
    return ipc.Done(job.id, time.perf_counter() - started)


def format_error(exc: BaseException) -> str:
    """The error text stored with a failed attempt: the innermost frames and the message,
    each bounded, as valid UTF-8 without NUL bytes."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    if len(frames) > MAX_ERROR_CHARS // 2:
        frames = "  ...\n" + frames[-(MAX_ERROR_CHARS // 2):]
    message = "".join(traceback.format_exception_only(exc))
    if len(message) > MAX_ERROR_CHARS // 2:
        message = message[: MAX_ERROR_CHARS // 2] + "... (truncated)\n"
    return clean_text("Traceback (most recent call last):\n" + frames + message)


def clean_text(text: str) -> str:
    """Make text storable in a PostgreSQL text column."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\0")


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the dispatcher died before prctl took effect
        os._exit(1)
