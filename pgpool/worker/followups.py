"""Follow-up jobs: what a handler enqueues through its job (``current_job().enqueue``,
``.enqueue_many``, ``.group``: `RunningJob`), written with its success or not at all.

In the worker, each call checks and encodes its jobs at once, as `pgpool.enqueue` would
(a bad payload raises in the handler, where its author sees it), and keeps them on the
attempt it was made in (`Attempt`). When the handler returns, they go back to the
dispatcher with its outcome (`pgpool.worker.ipc.Finished`); when it raises, they are dropped with
the attempt. The dispatcher writes them in the transaction of the ack that records the
attempt's success (`pgpool.sql.jobs.ACK_OUTCOMES`, then `pgpool.sql.jobs.ENQUEUE_GROUP` for
each group), for the jobs that ack deleted only: so they exist if and only if that success
is recorded. An attempt whose lease was lost, or an ack written twice, adds none.

An attempt ends when its handler returns or raises. A call through its job after that (from
a thread the handler left running, or a job object kept past its attempt) raises, and adds
nothing to any attempt: the next job's success must not carry it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import orjson

from ..enqueue import function_params, prepared, prepared_many
from ..errors import CheckpointError, ConfigError, GroupNotFound
from ..groups import group_params
from ..job import NAMES, JobInfo, JobOptions
from ..outcomes import Member, group_members
from ..registry import Handler, registered
from ..retry import Interrupted
from . import ipc, long

if TYPE_CHECKING:  # workers import psycopg only to read a group's members
    import psycopg

#: Most follow-up jobs one attempt may enqueue (a group's members count as one): more
#: belong in a group, or in `pgpool.enqueue_many` from a connection of the handler's own.
MAX_FOLLOW_UPS: Final = 10_000


class FollowUps(NamedTuple):
    """An attempt's follow-ups, as the dispatcher writes them: the parameters of each
    job (`pgpool.enqueue.function_params`) and of each group (`pgpool.groups.group_params`)."""

    jobs: list[dict[str, Any]]
    groups: list[dict[str, Any]]


#: Guards every attempt's follow-ups: a thread its handler started may add one just as the
#: attempt ends.
_lock = threading.Lock()


def ended_message(job_id: int, left_behind: bool) -> str:
    """What a call through job ``job_id`` says once its attempt has ended: ``left_behind``
    when it comes from a thread other than its handler's."""
    how = (f"the job {job_id} that started this thread has finished" if left_behind
           else f"job {job_id}, which it was taken in, has finished")
    return f"pgpool.current_job() is used outside a running job: {how}"


#: `Attempt.state` before the attempt has read or stored a checkpoint.
_UNREAD: Final = object()


#: What reads a group's members in place of a database: group id -> its members.
MemberReader = Callable[[int], list[Member]]


class Attempt:
    """One attempt of a job while its handler runs: the follow-ups kept for it, and where
    its group's members are read: ``read_members`` (`pgpool.testing.run_handler` gives the
    members it was told of), else on ``conn`` (`pgpool.testing.drain` gives the test's,
    whose transaction holds them), else on a connection of its own to ``PGPOOL_DSN``. Once
    it has ended (`end`), what is asked of it raises and is kept nowhere."""

    __slots__ = ("_ended", "_groups", "_jobs", "_thread", "conn", "job_id", "progress",
                 "read_members", "state")

    def __init__(self, job_id: int, conn: psycopg.Connection[Any] | None = None,
                 read_members: MemberReader | None = None) -> None:
        self.job_id = job_id
        self.conn = conn
        self.read_members = read_members
        self._thread = threading.get_ident()  # the handler's
        self._jobs: list[dict[str, Any]] = []
        self._groups: list[dict[str, Any]] = []
        self._ended = False
        #: The checkpoint's JSON text as last read or stored (`pgpool.worker.long`);
        #: `_UNREAD` until then.
        self.state: bytes | object | None = _UNREAD
        #: The last progress reported, sent or not: (done, total, note); None: none yet.
        self.progress: tuple[float, float | None, str | None] | None = None

    def check(self, more: int = 0) -> None:
        """Raise unless this attempt is running with room for ``more`` follow-ups (the
        caller holds `_lock` when it adds them)."""
        if self._ended:
            raise RuntimeError(ended_message(self.job_id,
                                             threading.get_ident() != self._thread))
        if len(self._jobs) + len(self._groups) + more > MAX_FOLLOW_UPS:
            raise ConfigError(
                f"an attempt may enqueue at most {MAX_FOLLOW_UPS:,} follow-ups through its "
                "job: enqueue many jobs as one group (current_job().group), or with "
                "pgpool.enqueue_many on a connection of your own"
            )

    def keep(self, jobs: list[dict[str, Any]], groups: list[dict[str, Any]]) -> None:
        """Keep follow-ups checked and encoded, if this attempt still runs."""
        with _lock:
            self.check(len(jobs) + len(groups))
            self._jobs += jobs
            self._groups += groups

    def while_running(self, write: Callable[[], None]) -> None:
        """Call ``write`` if this attempt still runs, before it can end (`long.Guard`): a
        frame its handler sends the dispatcher never follows its outcome, nor is cut by
        another thread's."""
        with _lock:
            self.check()
            write()

    def end(self) -> FollowUps | None:
        """End the attempt: its follow-ups (None: none), which only its success writes."""
        with _lock:
            self._ended = True
        if not (self._jobs or self._groups):
            return None
        return FollowUps(self._jobs, self._groups)


@dataclass(frozen=True, slots=True)
class RunningJob(JobInfo):
    """What `pgpool.current_job` returns in a handler: the job (`pgpool.JobInfo`), and the
    follow-ups it may enqueue, written with this attempt's success or not at all. Its
    methods work from any thread while the attempt runs, and raise once it has ended."""

    #: The attempt it was made for; None: made by hand, never running.
    _attempt: Attempt | None = field(default=None, compare=False, repr=False)

    def enqueue(self, kind: str | Handler[Any], payload: Any, **options: Any) -> None:
        """Enqueue a job once this attempt has succeeded: it is inserted in the transaction
        of the ack that records the success, and never if the attempt fails (or is cut
        off, or its lease is lost). ``options`` are `pgpool.enqueue`'s; the payload and
        options are checked now (`PayloadError`, `ConfigError`). No id is returned: the
        job does not exist yet."""
        attempt = self._running(1)
        name, payload, chosen = prepared(kind, payload, options, what="current_job().enqueue")
        attempt.keep([_job_params(name, payload, chosen)], [])

    def enqueue_many(self, kind: str | Handler[Any], payloads: Iterable[Any],
                     **options: Any) -> int:
        """`enqueue` for many jobs of one kind (``options`` as `pgpool.enqueue_many`'s);
        how many."""
        # A kind's name takes any option: each job is inserted on its own
        # (`pgpool.sql.jobs.ACK_OUTCOMES`).
        name, payloads, chosen = prepared_many(kind, payloads, options, allowed=NAMES,
                                               what="current_job().enqueue_many")
        listed = list(payloads)
        attempt = self._running(len(listed))
        attempt.keep([_job_params(name, payload, chosen) for payload in listed], [])
        return len(listed)

    def group(self, kind: str | Handler[Any], payloads: Iterable[Any], *,
              then: tuple[str | Handler[Any], Any],
              then_options: dict[str, Any] | None = None, **options: Any) -> int:
        """Start a group (`pgpool.group`) once this attempt has succeeded, written in the
        same transaction as its ack; its number of members. A callback that starts a
        group chains a second fan-out after the first."""
        attempt = self._running(1)
        params = group_params(kind, payloads, then, then_options=then_options, **options)
        attempt.keep([], [params])
        return int(params["total"])

    def group_members(self) -> list[Member]:
        """In a group's callback: the group's members, every one finished, each done one
        with what its handler returned, each dead or cancelled one with its last error
        (`pgpool.group_members`, on a connection of its own to the host's database,
        ``PGPOOL_DSN``, which ``pgpool run`` sets for its workers; under
        `pgpool.testing.drain`, on the test's connection; under `pgpool.testing.run_handler`,
        the members it was given). Raises `GroupNotFound` in a job that is not a group's
        callback."""
        attempt = self._running()
        if attempt.read_members is not None:
            return attempt.read_members(self.id)
        conn = attempt.conn
        try:
            if conn is not None:
                return group_members(conn, self.id)
            import psycopg  # not at import: workers that never call this never load it

            # Empty is a DSN: `pgpool run` on the PG* environment sets it so.
            dsn = os.environ.get("PGPOOL_DSN")
            if dsn is None:
                raise ConfigError("current_job().group_members() needs PGPOOL_DSN, which "
                                  "pgpool run sets for its workers: elsewhere, call "
                                  "pgpool.group_members(conn, current_job().id)")
            with psycopg.connect(dsn, autocommit=True) as own:
                return group_members(own, self.id)
        except GroupNotFound:
            raise GroupNotFound(
                f"current_job().group_members(): job {self.id} ({self.kind}) is not a "
                "group's callback: only the callback of pgpool.group(..., then=...) has "
                "members to read") from None

    # --- long jobs (pgpool.worker.long) ---------------------------------------------------

    def checkpoint(self, state: Any) -> None:
        """Store ``state`` (JSON: dicts, lists, str, int, float, bool, None; at most 1 MiB
        of it, ``PGPOOL_MAX_CHECKPOINT_BYTES``) as this job's checkpoint, and return once it
        is stored. A later attempt of the job (after a crash, a lost lease, a deploy or a
        retry) reads it back as `checkpoint_state`. Only the attempt that holds the job's
        lease stores it. Raises `pgpool.CheckpointError` (nothing stored) for a state that
        cannot be stored, and `pgpool.Interrupted` once it is stored when the host is
        `stopping` (let it propagate: the job is handed back, its attempt not used, and
        resumes elsewhere), or when this attempt no longer holds the job (nothing stored)."""
        attempt = self._running()
        data = long.encode(state)
        refused = long.store(self.id, self.claim, data, attempt.while_running, attempt.conn)
        if refused == ipc.NOT_HELD:
            raise Interrupted(f"job {self.id}'s checkpoint was not stored: {refused}")
        if refused is not None:  # the database refused it (an application's trigger...)
            raise CheckpointError(f"current_job().checkpoint(): job {self.id}'s checkpoint "
                                  f"was not stored: {refused}")
        attempt.state = data
        if long.stopping:
            raise Interrupted(f"job {self.id} stopped at its checkpoint: its host is "
                              "stopping; it is handed back and resumes from there")

    @property
    def checkpoint_state(self) -> Any:
        """The state last stored with `checkpoint` (by an earlier attempt, or this one),
        decoded; None when none was."""
        attempt = self._running()
        state = attempt.state
        if state is _UNREAD:
            # A first claim has nothing to read: no round trip for it.
            state = None if self.claim == 1 else long.load(
                self.id, self.claim, attempt.while_running, attempt.conn)
            attempt.state = state
        return None if state is None else orjson.loads(state)  # type: ignore[arg-type]

    def progress(self, done: float, total: float | None = None,
                 note: str | None = None) -> None:
        """Report how far the job is: ``done`` of ``total`` (None: unknown), and a short
        ``note`` (at most 200 characters are kept). Cheap enough for a tight loop: only
        the latest report is kept, and sent to the host at an attempt's first report and
        then at most once a heartbeat; the host writes it with its next beat
        (`pgpool.job_status`'s ``progress``, ``pgpool jobs show``). A report that is sent
        is checked first: `pgpool.ConfigError` for a value that is not a number (the first
        report is always sent)."""
        attempt = self._attempt
        # The common call keeps the report and returns: nothing is checked nor sent.
        if attempt is None or attempt._ended or long.beat or attempt.progress is None:
            self._report(done, total, note)
        else:
            attempt.progress = (done, total, note)

    def _report(self, done: float, total: float | None, note: str | None) -> None:
        """`progress`, checked and sent."""
        attempt = self._running()
        refused = long.check_progress(done, total, note)
        if refused is not None:
            raise ConfigError(f"current_job().progress(): {refused}")
        attempt.progress = (done, total, note)
        long.send_progress(self.id, self.claim, done, total,
                           None if note is None else note[:long.MAX_NOTE_CHARS],
                           attempt.while_running)

    @property
    def cpus(self) -> int:
        """How many cores this job may use: its handler's ``cpus`` (the host's worker
        slots it takes while it runs)."""
        handler = registered().get(self.kind)
        return 1 if handler is None else handler.cpus

    @property
    def stopping(self) -> bool:
        """The host running this job is stopping (a deploy's SIGTERM): `checkpoint` soon,
        which then raises `pgpool.Interrupted`; the job resumes elsewhere."""
        return long.stopping

    def _running(self, more: int = 0) -> Attempt:
        """Its attempt, while it runs with room for ``more`` follow-ups (checked again as
        they are kept: it may end meanwhile)."""
        if self._attempt is None:
            raise RuntimeError(f"pgpool.current_job() is used outside a running job: job "
                               f"{self.id}'s object was made by hand, not by a worker")
        self._attempt.check(more)
        return self._attempt


def _job_params(kind: str, payload: Any, options: JobOptions) -> dict[str, Any]:
    """A follow-up job's parameters, checked and encoded as `pgpool.enqueue` does."""
    params = function_params(kind, payload, options)
    run_at: datetime | None = params["run_at"]
    # Plain values for the pipe and the ack's arrays: run_at as seconds since the epoch,
    # '' for no tenant (the column's value).
    params["run_at"] = None if run_at is None else run_at.timestamp()
    params["tenant"] = params["tenant"] or ""
    return params
