"""A worker process: runs the handlers for the jobs its dispatcher sends, one at a time.

It imports the handler modules once, then loops: take the next job, run it (decoding its
payload with orjson here, not in the dispatcher), and write one outcome frame (`ipc.Done`
or `ipc.Failed`; `ipc.Snoozed` or `ipc.Ended` for a `pgpool.retry.Control` exception, an
error the handler's `pgpool.Retry` does not retry, or a payload that does not fit the
handler's type; `ipc.HandedBack` for `pgpool.Interrupted`) per job to the result pipe,
ringing the doorbell beside it when the dispatcher must act (`ipc.Outbox`: anything but a
plain success, and as its jobs run low, `_Inbox.wants_jobs`). A reader
thread (`_Inbox`) drains the task pipe meanwhile: jobs queue up in order, an `ipc.Stop` is
seen before the next job starts (a stopping dispatcher gets its unstarted jobs back,
`ipc.Returned`), an `ipc.Extend` moves the lease deadline at once, even while a handler
runs, and an `ipc.Drop` (jobs whose lease was lost) makes the worker skip those not started
(`ipc.Skipped`), or end at once with its process group if one of them is running; an
`ipc.Stored` or `ipc.Loaded` answers a handler's checkpoint (`pgpool.worker.long`), and
`ipc.Stop` also tells a running handler its host is stopping (``current_job().stopping``). Each
job runs under the fence's kernel timer (`pgpool.worker.fence`): past its deadline, the kernel
ends the process.
The worker ignores SIGINT and SIGTERM (the dispatcher decides when it stops) and dies with
its dispatcher: on Linux the kernel kills it (PR_SET_PDEATHSIG), and an idle worker also
sees its task pipe close; elsewhere (`pgpool.worker.portable`) the reader thread ends the worker
and its process group as soon as the pipe closes. It leads its own process group, which
the dispatcher kills with it, and which the fence's guard process kills once it has ended,
even if the dispatcher cannot. See `pgpool.host.pool` for the whole picture.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import os
import resource
import signal
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Final

import orjson
from setproctitle import setproctitle

from .. import hooks, logs, registry, schedules
from ..enqueue import has_non_finite
from ..errors import ConfigError, PayloadDecodeError, PgpoolError
from ..retry import MAX_REASON_CHARS, Cancel, Control, Discard, Interrupted, Snooze
from . import fence, ipc, long, output, portable, soft
from .followups import Attempt, FollowUps, MemberReader, RunningJob, ended_message

if TYPE_CHECKING:  # a worker never imports psycopg for its own use
    import psycopg

#: The `ipc.Retiring` reason of a worker that leaves after a MemoryError.
RETIRED_AFTER_MEMORY_ERROR = "retired after a MemoryError"
#: Longest error text stored with a failed attempt (the tail of the traceback is kept).
MAX_ERROR_CHARS = 4000
#: The default limit of a stored result (`max_result_bytes`).
DEFAULT_MAX_RESULT_BYTES: Final = 1024 * 1024
#: What a job runs in when no hook or tracing watches it.
_UNWATCHED: Final = contextlib.nullcontext()
#: The outcomes that carry an exception's type (``cause``).
_FAILURES = (ipc.Failed, ipc.Ended)


#: The attempt running in this process: its job as the dispatcher sent it, and its
#: follow-ups; None between attempts.
_now: tuple[ipc.WorkItem, Attempt] | None = None
#: Its `RunningJob`, made at the first `current_job` call: most handlers never ask, and
#: making one cost 2 µs a job.
_current: RunningJob | None = None
#: The name of the worker's own thread that reads its task pipe (`_Inbox`).
_INBOX_THREAD: Final = "pgpool-inbox"


class _LeftThreads:
    """The threads attempts left running, each with the job that started it: there,
    `current_job` raises rather than answer with whichever job runs now.

    A thread is taken to be an attempt's when it was first seen at that attempt's end; those
    alive before the first attempt, and the handler's own, belong to none. While the process
    has only a worker's own threads (its main one and the inbox's, which end with it), the
    count of threads says whether one started: no other could have ended meanwhile. Only
    then does an attempt's end cost less than a look at every thread."""

    def __init__(self) -> None:
        self.known: set[threading.Thread] | None = None
        self.only_own = False
        self.by: weakref.WeakKeyDictionary[threading.Thread, int] = (
            weakref.WeakKeyDictionary())

    def begin(self) -> None:
        """An attempt starts in this thread."""
        if self.known is None:
            self._seen(set(threading.enumerate()))
        elif self.by:  # a thread an attempt left, now running handlers itself (a test's)
            self.by.pop(threading.current_thread(), None)

    def ended(self, job_id: int) -> None:
        """Job ``job_id``'s attempt, run in this thread, has ended."""
        known = self.known
        assert known is not None  # begin() came first
        if self.only_own and threading.active_count() == len(known):
            return  # the common case: no thread started
        threads = threading.enumerate()
        if len(threads) == len(known) and known.issuperset(threads):
            return  # none started, none ended
        me = threading.current_thread()
        for thread in threads:
            if thread not in known and thread is not me:
                self.by[thread] = job_id
        self._seen({*threads, me})

    def _seen(self, threads: set[threading.Thread]) -> None:
        self.known = threads
        main = threading.main_thread()
        self.only_own = all(t is main or t.name == _INBOX_THREAD for t in threads)


_left = _LeftThreads()


def current_job() -> RunningJob:
    """The job being run by this worker process; only valid inside a handler (and in the
    threads it starts, while it runs).

    Useful for idempotency (key side effects on ``current_job().id``) and for logging;
    its ``enqueue``, ``enqueue_many`` and ``group`` add follow-ups, written with this
    attempt's success (`pgpool.worker.followups.RunningJob`). Raises `RuntimeError` outside a
    running job: between jobs, and in a thread a handler left running once its attempt
    has ended (even while another job runs).
    """
    global _current
    if _left.by:
        started_by = _left.by.get(threading.current_thread())
        if started_by is not None:
            raise RuntimeError(ended_message(started_by, left_behind=True))
    running = _now  # read once: the attempt may end meanwhile, in the handler's thread
    if running is None:
        raise RuntimeError("pgpool.current_job() is used outside a running job: call it in "
                           "a handler, or in a thread the handler started, while it runs")
    item, attempt = running
    job = _current
    if job is None or job._attempt is not attempt:
        job = _current = RunningJob(item.id, item.kind, item.queue,
                                    item.attempt - item.uncounted, item.max_attempts,
                                    item.attempt, attempt)
    return job


def main(index: int, modules: list[str], tasks: Connection, results: Connection,
         bell: Connection, parent_pid: int, max_tasks: int | None = None,
         max_memory: int | None = None, log: tuple[str, str] | None = None,
         cpu: bool = False) -> None:
    """Entry point of worker ``index``; returns when told to stop, when it retires, or when
    the dispatcher is gone.

    ``bell``: the doorbell beside the result pipe (`ipc.Outbox`). ``max_tasks``: retire
    after that many jobs. ``max_memory``: cap this process's private writable memory
    (RLIMIT_DATA) at that many bytes, so a runaway job fails with MemoryError instead of
    exhausting the host; the worker retires after one. ``log``: the
    dispatcher's log level and format, for this process's ``logging`` (handler modules'
    included); None leaves logging as Python starts it. ``cpu``: measure each attempt's
    CPU time and send it before its outcome (`ipc.Used`: ``pgpool run --fair-by cpu``).
    """
    try:
        _serve(index, modules, tasks, results, bell, parent_pid, max_tasks, max_memory, log,
               cpu)
    except BrokenPipeError:
        # The dispatcher is gone (killed) and nobody reads the results: the jobs' leases
        # run out and a reaper returns them. Not a failure to print a traceback for.
        return


def _serve(index: int, modules: list[str], tasks: Connection, results: Connection,
           bell: Connection, parent_pid: int, max_tasks: int | None, max_memory: int | None,
           log: tuple[str, str] | None, cpu: bool) -> None:
    # Lead a process group of its own before any handler code runs: the dispatcher kills
    # the whole group, so whatever a handler starts dies with the attempt.
    os.setpgid(0, 0)
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fence.reserve()
    prefix = f"pgpool worker {index}"
    setproctitle(f"{prefix}: starting")
    if log is not None:  # before the handler modules import: they may log as they load
        logs.configure_worker(*log, sys.stderr, _running)
    rfd = tasks.fileno()
    outbox = ipc.Outbox(results.fileno(), bell.fileno())
    try:  # ends the group once this process ends, whether or not the dispatcher can act
        fence.guard_group(f"pgpool fence of worker {index}")
    except OSError as exc:
        outbox.send(ipc.encode(ipc.Broken(f"cannot start the lease fence: {exc}")))
        return
    schedules.skip_time_checks()
    try:
        handlers = registry.load(modules)
        soft.wrap(handlers)
        max_result_bytes()  # a bad PGPOOL_MAX_RESULT_BYTES stops the host at its start
    except PgpoolError as exc:
        outbox.send(ipc.encode(ipc.Broken(str(exc))))
        return
    if max_memory is not None:
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (max_memory, max_memory))
        except (ValueError, OSError) as exc:
            reason = (f"cannot cap worker memory at {max_memory // 2**20} MiB ({exc}): the "
                      "worker already uses more after importing handlers; raise --max-memory")
            outbox.send(ipc.encode(ipc.Broken(reason)))
            return
    streams = output.install()  # handlers' prints name their job, and are bounded
    long.open_channel(outbox)
    outbox.send(ipc.encode(ipc.Ready(os.getpid())))
    finished = 0

    timer = fence.Fence()
    inbox = _Inbox(rfd, timer)
    idle_title = f"{prefix}: idle"
    setproctitle(idle_title)
    while True:
        if not inbox.pending:  # about to wait for work: nothing runs, nothing to fence
            timer.disarm()
        job = inbox.next()
        if job is None:  # told to stop, or the dispatcher closed the pipe: it is gone
            timer.disarm()
            if inbox.stopping:
                outbox.send(ipc.encode(ipc.Returned(inbox.take_all())))
            return
        seq, item = job
        if inbox.skip(seq):  # its lease was lost while it waited: it must not start
            outbox.send(ipc.encode(ipc.Skipped(item.id)))
            if not inbox.pending:
                setproctitle(idle_title)
            continue
        if not timer.start(seq, item.deadline):
            # Its lease may be gone already: it must not start. End the way the timer
            # would have, so the pool reads it the same way.
            os.kill(os.getpid(), fence.SIGNAL)
        setproctitle(f"{prefix}: {item.kind}#{item.id}")
        before = cpu_seconds() if cpu else 0.0
        outcome = run_job(handlers, item, streams)
        inbox.finished()
        frame = ipc.encode(outcome)
        if cpu:  # --fair-by cpu: what the attempt used, in the same write as its outcome
            frame = ipc.encode(ipc.Used(cpu_seconds() - before)) + frame
        # A plain success wakes the dispatcher only when this worker needs more jobs.
        outbox.send(frame, ring=type(outcome) is not ipc.Done or inbox.wants_jobs())
        finished += 1
        retire = None
        if isinstance(outcome, _FAILURES) and outcome.cause == "MemoryError":
            retire = RETIRED_AFTER_MEMORY_ERROR  # its heap may be left fragmented
        elif max_tasks is not None and finished >= max_tasks:
            retire = f"recycled after {finished} jobs"
        if retire:
            timer.disarm()
            outbox.send(ipc.encode(ipc.Retiring(retire)))
            return
        if not inbox.pending:
            setproctitle(idle_title)


class _Inbox:
    """The task pipe, read on a thread of its own so that an `ipc.Extend` reaches the fence
    while a handler runs. Jobs wait in `pending` in the order sent, each with its number
    (counted from 0), which tells `Fence` which extensions cover it.

    The thread blocks the fence's signal, so only the handler thread can take it.

    A job is pending, running (handed out by `next` until `finished`) or over, and an
    `ipc.Drop` acts on which: a dropped job is skipped if it is still pending, ended with
    the worker if it is running, and left alone once it is over (its outcome is on its way;
    the dispatcher drops the result).
    """

    def __init__(self, rfd: int, timer: fence.Fence) -> None:
        self._rfd = rfd
        self._timer = timer
        self._ready = threading.Condition(threading.Lock())
        self.pending: deque[tuple[int, ipc.WorkItem]] = deque()
        #: The last `ipc.Jobs.ring_at`, and whether a plain success rang for more jobs
        #: since that frame came (`wants_jobs`).
        self._ring_at = ipc.RING_ALWAYS
        self._asked = False
        self._received = 0
        self._dropped: set[int] = set()  # numbers of pending jobs not to start (ipc.Drop)
        self._running: ipc.WorkItem | None = None  # handed out by next(), not finished
        self._drops = False  # a Drop has come: see finished()
        self.stopping = False
        self._closed = False
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {fence.SIGNAL})
        try:  # the thread inherits this thread's mask, blocked at its first instruction
            threading.Thread(target=self._read, name=_INBOX_THREAD, daemon=True).start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def next(self) -> tuple[int, ipc.WorkItem] | None:
        """The next job to run, waiting for one; None once Stop came or the pipe closed."""
        with self._ready:
            while True:
                while not (self.pending or self.stopping or self._closed):
                    self._ready.wait()
                if self.stopping or self._closed:
                    return None
                # A Drop still in the pipe is not waited for: a job it names that starts
                # meanwhile is running when the Drop is handled, and `_drop` ends the worker
                # for it (the pool then reports it lost). Rare, and no check on every job.
                seq, item = self.pending.popleft()
                if seq not in self._dropped:
                    self._running = item
                return seq, item

    def skip(self, seq: int) -> bool:
        """Whether job ``seq``, just taken from `next`, was dropped: it must not start."""
        if seq not in self._dropped:  # only pending jobs are added: this cannot change now
            return False
        with self._ready:
            self._dropped.discard(seq)
        return True

    def finished(self) -> None:
        """The running job is over; called before its outcome is written, so that a `Drop`
        that ends the worker for it never ends it after the outcome went out.

        No lock on the way of every job: this stores `_running`, then reads `_drops`;
        `_drop` stores `_drops`, then reads `_running` (under the lock). One of the two
        sees the other's store: either the drop finds this job over, or this waits for the
        drop's decision, which may be to end the process."""
        self._running = None
        if self._drops:
            with self._ready:
                pass

    def wants_jobs(self) -> bool:
        """Whether a plain success just written should ring the doorbell: when no job
        waits (this worker is about to idle), and once per `ipc.Jobs` frame when at most
        its ``ring_at`` wait (the dispatcher tops the worker up then, if it has jobs; if it
        has none, it sends them once a claim brings some, having read what was written).
        Never while ``ring_at`` is negative: the dispatcher reads as the pipe fills."""
        ring_at = self._ring_at
        if ring_at < 0:
            return False
        if not self.pending:
            return True
        if len(self.pending) > ring_at or self._asked:
            return False
        with self._ready:  # not asked again for a frame that came meanwhile
            asked, self._asked = self._asked, True
        return not asked

    def take_all(self) -> list[int]:
        """The ids of the jobs not started, which the worker hands back."""
        with self._ready:
            ids = [item.id for _, item in self.pending]
            self.pending.clear()
            return ids

    def _read(self) -> None:
        decoder = ipc.Decoder()
        while True:
            data = os.read(self._rfd, 1 << 16)  # releases the GIL while it waits
            if not data:
                if not portable.LINUX:
                    # Only the dispatcher's end closes the pipe while this worker runs:
                    # where the kernel does not kill the worker with it, end the worker and
                    # whatever its handler started now.
                    os.killpg(0, signal.SIGKILL)
                with self._ready:
                    self._closed = True
                    self._ready.notify()
                return
            for message in decoder.feed(data):
                match message:
                    case ipc.Jobs():
                        with self._ready:
                            start = self._received
                            self.pending.extend(enumerate(message.jobs, start))
                            self._received = start + len(message.jobs)
                            self._ring_at, self._asked = message.ring_at, False
                            self._ready.notify()
                    case ipc.Extend():
                        self._timer.extend(message.until, self._received)
                        long.extended()
                    case ipc.Stop():
                        long.stop()
                        with self._ready:
                            self.stopping = True
                            self._ready.notify()
                    case ipc.Drop():
                        self._drop(set(message.jobs))
                    case ipc.Stored() | ipc.Loaded():
                        long.answer(message)

    def _drop(self, lost: set[tuple[int, int]]) -> None:
        self._drops = True  # before `_running` is read: see finished()
        with self._ready:
            running = self._running
            if running is not None and (running.id, running.attempt) in lost:
                # It started before the dispatcher knew it had: end it, and whatever its
                # handler started, before it can run on (the lock keeps its outcome from
                # going out meanwhile, and the next job from starting).
                os.killpg(0, signal.SIGKILL)
            self._dropped.update(seq for seq, item in self.pending
                                 if (item.id, item.attempt) in lost)


def run_job(handlers: dict[str, registry.Handler[Any]], job: ipc.WorkItem,
            streams: tuple[output.JobStream, ...] = (),
            raised: list[BaseException] | None = None,
            conn: psycopg.Connection[Any] | None = None,
            read_members: MemberReader | None = None,
            ) -> ipc.Done | ipc.Failed | ipc.Finished | Controlled:
    """Run one attempt of ``job`` with its handler, `current_job` set meanwhile, and return
    its outcome: done (finished, with what it returned and its follow-ups, when it has
    either: `_finished`), failed, or what a handler's control exception or its `Retry` asks
    for (`_controlled`). ``streams``: what prints go to (`output.install`). ``raised``: if
    given, gets the exception that ended the attempt (`pgpool.testing` runs jobs with
    this, and re-raises it in the test). ``conn``: what a group's callback reads its
    members on (`RunningJob.group_members`; `pgpool.testing.drain` gives the test's);
    ``read_members``: what gives them instead (`pgpool.testing.run_handler`'s)."""
    global _now, _current
    started = time.perf_counter()
    _left.begin()
    attempt = Attempt(job.id, conn, read_members)
    _now = (job, attempt)
    for stream in streams:
        stream.begin(f"{job.kind}#{job.id}")
    handler = None
    try:
        handler = handlers.get(job.kind)
        if handler is None:
            raise LookupError(f"no handler for kind {job.kind!r} in this worker")
        # Lifecycle hooks, tracing (pgpool.hooks); one call site either way, so that a
        # failure's stored traceback is the same whether they are in use or not.
        with hooks.watching(current_job(), job.meta) if hooks.watched() else _UNWATCHED:
            value = _call(handler, job)
    except BaseException as exc:  # a handler may raise anything, SystemExit included
        if raised is not None:
            raised.append(exc)
        elapsed = time.perf_counter() - started
        # A payload that does not fit its type fails alike on every attempt: final,
        # whatever the handler's Retry says.
        if isinstance(exc, Control | PayloadDecodeError) or (
                handler is not None and handler.retry is not None
                and not handler.retry.retries(exc)):
            return _controlled(job.id, exc, elapsed)
        return ipc.Failed(job.id, format_error(exc), type(exc).__name__, elapsed)
    finally:
        # In this order: a thread the handler left sees it as left (`current_job`) before
        # the attempt ends, and what it asked for before then is the attempt's.
        _left.ended(job.id)
        follow = attempt.end()  # a failure's are dropped with it: only a success has any
        _now = _current = None
        for stream in streams:
            stream.end()
    elapsed = time.perf_counter() - started
    if value is None and follow is None:  # the common case: nothing to record
        return ipc.Done(job.id, elapsed)
    return _finished(job.id, value, elapsed, follow)


def _finished(job_id: int, value: Any, elapsed: float,
              follow: FollowUps | None) -> ipc.Finished:
    """A success that returned ``value`` or enqueued follow-ups: the value as JSON, or why
    it cannot be stored (the dispatcher dead-letters the job for it only if its outcome is
    kept)."""
    result = error = None
    if value is not None:
        try:
            result = orjson.dumps(value)
        except orjson.JSONEncodeError as exc:
            error = (f"its handler returned a {type(value).__name__} that is not "
                     f"JSON-serialisable ({exc}): return dicts with str keys, lists, str, "
                     "int, float, bool or None")
        else:
            limit = max_result_bytes()
            if len(result) > limit:
                error = (f"its handler returned {len(result):,} bytes of JSON, over the "
                         f"{limit:,}-byte limit of a stored result: store large data "
                         "elsewhere and return a reference, or raise "
                         "PGPOOL_MAX_RESULT_BYTES")
            elif b"null" in result and has_non_finite(value):
                error = ("its handler returned NaN or Infinity, which JSON cannot "
                         "represent: return None or a string in their place")
            if error is not None:
                result = None
    return ipc.Finished(job_id, elapsed, result, error, follow)


@functools.cache
def max_result_bytes() -> int:
    """The stored result's size limit: ``PGPOOL_MAX_RESULT_BYTES``, default 1 MiB."""
    raw = os.environ.get("PGPOOL_MAX_RESULT_BYTES")
    try:
        value = DEFAULT_MAX_RESULT_BYTES if raw is None else int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"PGPOOL_MAX_RESULT_BYTES={raw!r} is not a positive integer "
                          "number of bytes")
    return value


Controlled = ipc.Snoozed | ipc.Ended | ipc.HandedBack


def _controlled(job_id: int, exc: BaseException, elapsed: float) -> Controlled:
    """The outcome of an attempt that raised a control exception (`pgpool.Snooze`,
    `Discard`, `Cancel`), a `PayloadDecodeError`, or an error its handler's `pgpool.Retry`
    does not retry."""
    if isinstance(exc, Snooze):
        return ipc.Snoozed(job_id, exc.seconds, elapsed)
    if isinstance(exc, Interrupted):
        return ipc.HandedBack(job_id, elapsed)
    if isinstance(exc, PayloadDecodeError):
        # Its message says it all; a traceback would show pgpool's frames only.
        return ipc.Ended(job_id, "final", clean_text(str(exc))[:MAX_ERROR_CHARS],
                         type(exc).__name__, elapsed)
    if isinstance(exc, Discard | Cancel):
        verdict: ipc.Verdict = "discard" if isinstance(exc, Discard) else "cancel"
        reason = clean_text(exc.reason)
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS] + "... (truncated)"
        return ipc.Ended(job_id, verdict, reason, type(exc).__name__, elapsed)
    return ipc.Ended(job_id, "final", format_error(exc), type(exc).__name__, elapsed)


def _call(handler: registry.Handler[Any], job: ipc.WorkItem) -> Any:
    """What the handler returns for ``job`` (an ``async def``'s coroutine run first)."""
    result = handler.run(orjson.loads(job.payload))
    if inspect.iscoroutine(result):  # an ``async def`` handler
        import asyncio  # only async handlers need it: keeps worker start-up light

        return asyncio.run(result)
    return result


def cpu_seconds() -> float:
    """CPU seconds, user and system, this process has used, with those of the children it
    waited for (a handler's subprocesses): read before and after an attempt."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _running() -> tuple[int, str, int] | None:
    """The running job as log records name it (`pgpool.logs.JobStamp`)."""
    running = _now
    if running is None:
        return None
    job = running[0]
    return job.id, job.kind, job.attempt - job.uncounted


def format_error(exc: BaseException) -> str:
    """The error text stored with a failed attempt: the innermost frames and the message,
    each bounded, as valid UTF-8 without NUL bytes."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    if len(frames) > MAX_ERROR_CHARS // 2:
        # Whole lines: every line of the frames stays indented, so the message is the
        # first line that is not (`pgpool.logs.error_message`).
        cut = frames.find("\n", len(frames) - MAX_ERROR_CHARS // 2 - 1) + 1
        frames = "  ...\n" + frames[cut:]
    message = "".join(traceback.format_exception_only(exc))
    if len(message) > MAX_ERROR_CHARS // 2:
        message = message[: MAX_ERROR_CHARS // 2] + "... (truncated)\n"
    return clean_text(f"{logs.TRACEBACK_HEADER}\n{frames}{message}")


def clean_text(text: str) -> str:
    """Make text storable in a PostgreSQL text column."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\0")


def _die_with_parent(parent_pid: int) -> None:
    """On Linux, have the kernel SIGKILL this worker when its dispatcher dies (elsewhere
    the task pipe's end does: `_Inbox`); exit if the dispatcher is gone already."""
    if portable.LINUX:
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the dispatcher died before prctl took effect
        os._exit(1)
