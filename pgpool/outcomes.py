"""What became of a job, waiting for jobs to finish, and what a group's members did.

A job is in one of three tables (`pgpool.sql.outcomes.STATUSES`):

- ``pgpool_jobs`` while it waits (ready, scheduled, parked; a group's callback
  'waiting' for its members) or runs;
- ``pgpool_done`` once it succeeded, if its kind or its host keeps outcomes
  (``@pgpool.handler(keep=...)``, ``pgpool run --keep-done``) or it is a member of a
  group, with what its handler returned, until ``keep_until``;
- ``pgpool_dead`` once it died, was discarded or cancelled.

A job in none is 'unknown': it succeeded and nothing kept it, or it never existed (or its
enqueue has not committed). `wait` returns when none of its jobs is in ``pgpool_jobs``
any more: the acks that record outcomes (and the reaper's and a cancel's dead letters)
notify its channel (`pgpool.sql.common.OUR_FINISHED_CHANNEL`) once per statement, and a
poll every ``poll`` seconds catches the rest (a kind that keeps nothing is acked without
notifying anyone: its ack costs what it did before outcomes existed). It listens on the
caller's own connection: no other server connection is opened.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

from .enqueue import schema_required
from .errors import ConfigError, GroupNotFound
from .sql import long as long_sql
from .sql import outcomes as sql
from .sql.common import listen_statement

if TYPE_CHECKING:
    import psycopg

__all__ = ["GroupStatus", "JobStatus", "Member", "State", "group_members",
           "group_members_async", "group_status", "group_status_async", "job_status",
           "job_status_async", "job_statuses", "job_statuses_async", "wait", "wait_async"]

State = Literal["ready", "scheduled", "running", "waiting", "parked", "done", "dead",
                "cancelled", "unknown"]
#: The states of a job that has finished (or, 'unknown', of one pgpool no longer knows).
FINISHED: Final = frozenset({"done", "dead", "cancelled", "unknown"})
#: Seconds between `wait`'s polls when no notification comes.
DEFAULT_POLL: Final = 1.0


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What a job is now. ``result`` is what its handler returned, decoded from JSON (done
    and kept); ``error`` its last error (dead or cancelled, or a live job's failed attempt);
    ``finished_at`` when it succeeded or died; ``attempts`` its claims so far.

    ``parked``: the database refused its ack, and it was parked in ``pgpool_jobs``
    (`pgpool.host.isolate`); ``error`` says why. Parked and 'done', it succeeded, but neither
    its result nor its follow-ups were stored (``result`` is None); 'parked', it waits for
    an operator (``pgpool retry``, ``pgpool cancel``)."""

    id: int
    state: State
    kind: str | None = None
    queue: str | None = None
    attempts: int = 0
    result: Any = None
    error: str | None = None
    finished_at: datetime | None = None
    group_id: int | None = None
    parked: bool = False
    #: When its handler last stored a checkpoint (``current_job().checkpoint``), kept
    #: across attempts while the job is live; None: none stored. Its content is the
    #: handler's data: `pgpool jobs show --payload` shows it.
    checkpoint_at: datetime | None = None
    #: The last progress its running attempt reported (``current_job().progress``).
    progress: Progress | None = None

    @property
    def finished(self) -> bool:
        """Done, dead, cancelled, or unknown: no host will run it again."""
        return self.state in FINISHED


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a running job is, as its handler last reported (``current_job().progress``):
    ``done`` of ``total`` (None: unknown) with a short ``note``; ``at``, when a heartbeat
    wrote it (at most a beat, a third of a lease, after the report)."""

    done: float
    total: float | None
    note: str | None
    at: datetime

    @property
    def fraction(self) -> float | None:
        """``done / total`` within 0 and 1; None without a total."""
        if not self.total:
            return None
        return min(1.0, max(0.0, self.done / self.total))


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """A group's progress: ``done`` and ``dead`` (cancelled included) of ``total`` members
    finished, and its callback's state (as `JobStatus.state`)."""

    id: int
    total: int
    done: int
    dead: int
    created_at: datetime
    completed_at: datetime | None
    callback: State

    @property
    def finished(self) -> int:
        return self.done + self.dead


def group_status_of(group_id: int, row: tuple[Any, ...]) -> GroupStatus:
    """The group ``group_id`` from its row of `pgpool.sql.outcomes.GROUP` (not a method:
    the class shows its reader only what it holds)."""
    total, done, dead, created_at, completed_at, callback = row
    return GroupStatus(group_id, total, done, dead, created_at, completed_at,
                       callback or "unknown")


@dataclass(frozen=True, slots=True)
class Member:
    """A finished member of a group: 'done' with its ``result``, or 'dead' or 'cancelled'
    with its ``error``."""

    id: int
    state: State
    result: Any = None
    error: str | None = None


def job_status(conn: psycopg.Connection, job_id: int) -> JobStatus:
    """What job ``job_id`` is now (see the module's docstring); 'unknown' when no table
    holds it."""
    return job_statuses(conn, [job_id])[job_id]


async def job_status_async(conn: psycopg.AsyncConnection, job_id: int) -> JobStatus:
    """Async twin of `job_status`."""
    return (await job_statuses_async(conn, [job_id]))[job_id]


def job_statuses(conn: psycopg.Connection, ids: Iterable[int]) -> dict[int, JobStatus]:
    """`job_status` of each of ``ids``, in one query."""
    wanted = _ids(ids)
    with schema_required():
        rows = conn.execute(sql.STATUSES, {"ids": wanted}).fetchall()
    return _statuses(wanted, rows)


async def job_statuses_async(conn: psycopg.AsyncConnection,
                             ids: Iterable[int]) -> dict[int, JobStatus]:
    """Async twin of `job_statuses`."""
    wanted = _ids(ids)
    with schema_required():
        rows = await (await conn.execute(sql.STATUSES, {"ids": wanted})).fetchall()
    return _statuses(wanted, rows)


def wait(conn: psycopg.Connection, ids: Iterable[int], *, timeout: float | None = None,
         poll: float = DEFAULT_POLL) -> dict[int, JobStatus]:
    """Wait until every job of ``ids`` has finished (see `JobStatus.finished`), and return
    their statuses. Woken by the acks' notification, with a poll every ``poll`` seconds as
    a backstop; ``conn`` must be in autocommit mode (a notification reaches a session only
    between transactions), and is the only server connection used. Raises `TimeoutError`
    after ``timeout`` seconds, naming the jobs still unfinished."""
    wanted, deadline = _waiting(conn, ids, timeout, poll)
    channel = conn.execute(sql.FINISHED_CHANNEL).fetchone()
    assert channel is not None  # the installation's channel: always a row
    listen = listen_statement(channel[0])
    conn.execute(listen)
    try:
        while True:
            statuses = job_statuses(conn, wanted)
            left = _left(statuses, deadline)
            if left is None:
                return statuses
            # One notification is enough to ask again; several may have come meanwhile.
            for _ in conn.notifies(timeout=min(poll, left), stop_after=1):
                pass
    finally:
        conn.execute("UN" + listen)


async def wait_async(conn: psycopg.AsyncConnection, ids: Iterable[int], *,
                     timeout: float | None = None,
                     poll: float = DEFAULT_POLL) -> dict[int, JobStatus]:
    """Async twin of `wait`."""
    wanted, deadline = _waiting(conn, ids, timeout, poll)
    channel = await (await conn.execute(sql.FINISHED_CHANNEL)).fetchone()
    assert channel is not None
    listen = listen_statement(channel[0])
    await conn.execute(listen)
    try:
        while True:
            statuses = await job_statuses_async(conn, wanted)
            left = _left(statuses, deadline)
            if left is None:
                return statuses
            async for _ in conn.notifies(timeout=min(poll, left), stop_after=1):
                pass
    finally:
        await conn.execute("UN" + listen)


def group_status(conn: psycopg.Connection, group_id: int) -> GroupStatus:
    """Group ``group_id``'s progress. Raises `GroupNotFound` when there is no such group
    (or it was pruned)."""
    with schema_required():
        row = conn.execute(sql.GROUP, {"id": group_id}).fetchone()
    if row is None:
        raise GroupNotFound(no_group(group_id))
    return group_status_of(group_id, row)


async def group_status_async(conn: psycopg.AsyncConnection, group_id: int) -> GroupStatus:
    """Async twin of `group_status`."""
    with schema_required():
        row = await (await conn.execute(sql.GROUP, {"id": group_id})).fetchone()
    if row is None:
        raise GroupNotFound(no_group(group_id))
    return group_status_of(group_id, row)


def group_members(conn: psycopg.Connection, group_id: int) -> list[Member]:
    """The finished members of group ``group_id``, in id order: each done one with what its
    handler returned, each dead or cancelled one with its last error. In a group's callback,
    every member is there. Raises `GroupNotFound` when there is no such group (or it was
    pruned)."""
    with schema_required():
        rows = conn.execute(sql.GROUP_MEMBERS, {"id": group_id}).fetchall()
    return _members(group_id, rows)


async def group_members_async(conn: psycopg.AsyncConnection, group_id: int) -> list[Member]:
    """Async twin of `group_members`."""
    with schema_required():
        rows = await (await conn.execute(sql.GROUP_MEMBERS, {"id": group_id})).fetchall()
    return _members(group_id, rows)


def no_group(group_id: int) -> str:
    """Why ``group_id`` names no group, and where a group's id comes from."""
    return (f"no group has id {group_id}: a group's id is its callback job's (`pgpool.group` "
            "returns it), and a group is forgotten once its callback and its members' "
            "records are gone")


def _members(group_id: int, rows: list[tuple[Any, ...]]) -> list[Member]:
    # No row: no group (an empty list would pass for a group of no finished member).
    if not rows:
        raise GroupNotFound(no_group(group_id))
    return [Member(*row) for row in rows if row[0] is not None]


def _ids(ids: Iterable[int]) -> list[int]:
    wanted = list(dict.fromkeys(ids))
    if any(not isinstance(i, int) or isinstance(i, bool) for i in wanted):
        raise ConfigError(f"job ids are integers, got {wanted!r:.80}")
    return wanted


def _statuses(wanted: list[int], rows: list[tuple[Any, ...]]) -> dict[int, JobStatus]:
    found = {row[0]: _status(*row) for row in rows}
    return {i: found.get(i) or JobStatus(i, "unknown") for i in wanted}


def _status(job_id: int, state: State, kind: str, queue: str, attempts: int, result: Any,
            error: str | None, finished_at: datetime | None, group_id: int | None,
            parked: bool, checkpoint_at: datetime | None, progress: dict[str, Any] | None,
            progress_at: datetime | None) -> JobStatus:
    """A row of `sql.STATUSES`."""
    return JobStatus(job_id, state, kind, queue, attempts, result, error, finished_at,
                     group_id, parked, checkpoint_at, progress_of(progress, progress_at))


def progress_of(progress: dict[str, Any] | None, at: datetime | None) -> Progress | None:
    """A job's progress as its ``progress`` and ``progress_at`` columns hold it."""
    if progress is None or at is None:
        return None
    return Progress(progress["done"], progress.get("total"), progress.get("note"), at)


def _waiting(conn: psycopg.Connection | psycopg.AsyncConnection, ids: Iterable[int],
             timeout: float | None, poll: float) -> tuple[list[int], float]:
    """The ids to wait for and the monotonic deadline, after checking the arguments."""
    if not conn.autocommit:
        raise ConfigError(
            "pgpool.wait needs a connection in autocommit mode: PostgreSQL delivers the "
            "notification it waits for only between transactions; open it with "
            "autocommit=True (or set conn.autocommit = True outside a transaction)")
    if not poll > 0 or (timeout is not None and not timeout >= 0):
        raise ConfigError(f"poll must be above 0 and timeout 0 or more seconds, got "
                          f"poll={poll!r}, timeout={timeout!r}")
    wanted = _ids(ids)
    return wanted, time.monotonic() + (timeout if timeout is not None else float("inf"))


def _left(statuses: dict[int, JobStatus], deadline: float) -> float | None:
    """None when every job finished; else the seconds left to wait (`TimeoutError` past
    the deadline)."""
    unfinished = [i for i, s in statuses.items() if not s.finished]
    if not unfinished:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"{len(unfinished)} of {len(statuses)} jobs not finished "
                           f"(first: {unfinished[:5]})")
    return left



def store_checkpoint(conn: psycopg.Connection, job_id: int, claim: int, state: str) -> bool:
    """Store checkpoint ``state`` (JSON text) of claim ``claim`` of job ``job_id`` on
    ``conn``, as `pgpool.testing.drain` does in the test's process (a host stores them
    through its dispatcher: `pgpool.host.long`); whether that claim still runs."""
    params = {"id": job_id, "attempt": claim, "state": state}
    return conn.execute(long_sql.CHECKPOINT_IN_PROCESS, params).rowcount == 1


def load_checkpoint(conn: psycopg.Connection, job_id: int) -> str | None:
    """Job ``job_id``'s stored checkpoint, as JSON text, or None (`store_checkpoint`)."""
    row = conn.execute(long_sql.LOAD_CHECKPOINT_IN_PROCESS, {"id": job_id}).fetchone()
    return None if row is None else row[0]
