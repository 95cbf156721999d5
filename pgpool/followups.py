"""Follow-up jobs: what a handler enqueues through its job (``current_job().enqueue``,
``.enqueue_many``, ``.group``: `RunningJob`), written with its success or not at all.

In the worker, each call checks and encodes its jobs at once, as `pgpool.enqueue` would
(a bad payload raises in the handler, where its author sees it), and keeps them here. When
the handler returns, they go back to the dispatcher with its outcome (`pgpool.ipc.Finished`);
when it raises, they are dropped with the attempt. The dispatcher writes them in the
transaction of the ack that records the attempt's success (`pgpool.sql.jobs.ACK_OUTCOMES`,
then `pgpool.sql.jobs.ENQUEUE_GROUP` for each group), for the jobs that ack deleted only:
so they exist if and only if that success is recorded. An attempt whose lease was lost, or
an ack written twice, adds none.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from .enqueue import function_params
from .errors import ConfigError, GroupNotFound
from .groups import group_params
from .job import JobInfo
from .outcomes import Member, group_members
from .registry import Handler

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


_jobs: list[dict[str, Any]] = []
_groups: list[dict[str, Any]] = []


@dataclass(frozen=True, slots=True)
class RunningJob(JobInfo):
    """What `pgpool.current_job` returns in a handler: the job (`pgpool.JobInfo`), and the
    follow-ups it may enqueue, written with this attempt's success or not at all."""

    #: The connection `group_members` reads on: the test's under `pgpool.testing.drain`
    #: (its transaction holds the members); None in a worker, which opens its own.
    _conn: psycopg.Connection[Any] | None = field(default=None, compare=False, repr=False)

    def enqueue(self, kind: str | Handler[Any], payload: Any, **options: Any) -> None:
        """Enqueue a job once this attempt has succeeded: it is inserted in the transaction
        of the ack that records the success, and never if the attempt fails (or is cut
        off, or its lease is lost). ``options`` are `pgpool.enqueue`'s; the payload and
        options are checked now (`PayloadError`, `ConfigError`). No id is returned: the
        job does not exist yet."""
        enqueue(kind, payload, options)

    def enqueue_many(self, kind: str | Handler[Any], payloads: Iterable[Any],
                     **options: Any) -> int:
        """`enqueue` for many jobs of one kind (``options`` as `pgpool.enqueue_many`'s);
        how many."""
        return enqueue_many(kind, payloads, options)

    def group(self, kind: str | Handler[Any], payloads: Iterable[Any], *,
              then: tuple[str | Handler[Any], Any],
              then_options: dict[str, Any] | None = None, **options: Any) -> int:
        """Start a group (`pgpool.group`) once this attempt has succeeded, written in the
        same transaction as its ack; its number of members. A callback that starts a
        group chains a second fan-out after the first."""
        return group(kind, payloads, then, then_options, options)

    def group_members(self) -> list[Member]:
        """In a group's callback: the group's members, every one finished, each done one
        with what its handler returned, each dead or cancelled one with its last error
        (`pgpool.group_members`, on a connection of its own to the host's database,
        ``PGPOOL_DSN``, which ``pgpool run`` sets for its workers; under
        `pgpool.testing.drain`, on the test's connection). Raises `GroupNotFound` in a job
        that is not a group's callback."""
        try:
            if self._conn is not None:
                return group_members(self._conn, self.id)
            import psycopg  # not at import: workers that never call this never load it

            dsn = os.environ.get("PGPOOL_DSN")
            if not dsn:
                raise ConfigError("current_job().group_members() needs PGPOOL_DSN, which "
                                  "pgpool run sets for its workers: elsewhere, call "
                                  "pgpool.group_members(conn, current_job().id)")
            with psycopg.connect(dsn, autocommit=True) as conn:
                return group_members(conn, self.id)
        except GroupNotFound:
            raise GroupNotFound(
                f"current_job().group_members(): job {self.id} ({self.kind}) is not a "
                "group's callback: only the callback of pgpool.group(..., then=...) has "
                "members to read") from None


def enqueue(kind: str | Handler[Any], payload: Any, options: dict[str, Any]) -> None:
    """Keep a follow-up job of the running attempt (`pgpool.job.JobInfo.enqueue`)."""
    if isinstance(kind, Handler):
        payload, options = kind.prepare(payload, options)
        kind = kind.kind
    _room(1)
    params = function_params(kind, payload, **options)
    run_at: datetime | None = params["run_at"]
    # Plain values for the pipe and the ack's arrays: run_at as seconds since the epoch,
    # '' for no tenant (the column's value).
    params["run_at"] = None if run_at is None else run_at.timestamp()
    params["tenant"] = params["tenant"] or ""
    _jobs.append(params)


def enqueue_many(kind: str | Handler[Any], payloads: Iterable[Any],
                 options: dict[str, Any]) -> int:
    """Keep follow-up jobs of one kind (`pgpool.job.JobInfo.enqueue_many`); how many."""
    if isinstance(kind, Handler):
        payloads, options = kind.prepare_many(payloads, options)
        kind = kind.kind
    listed = list(payloads)
    _room(len(listed))
    for payload in listed:
        enqueue(kind, payload, options)
    return len(listed)


def group(kind: str | Handler[Any], payloads: Iterable[Any], then: Any,
          then_options: dict[str, Any] | None, options: dict[str, Any]) -> int:
    """Keep a follow-up group (`pgpool.job.JobInfo.group`); its number of members."""
    _room(1)
    params = group_params(kind, payloads, then, then_options=then_options, **options)
    _groups.append(params)
    return int(params["total"])


def pending() -> bool:
    """Whether the running attempt has kept any follow-up."""
    return bool(_jobs or _groups)


def take() -> FollowUps | None:
    """The running attempt's follow-ups, now its handler has returned (None: none), and
    forget them."""
    if not (_jobs or _groups):
        return None
    taken = FollowUps(list(_jobs), list(_groups))
    drop()
    return taken


def drop() -> None:
    """Forget the follow-ups kept so far: the attempt failed, or a new one starts."""
    _jobs.clear()
    _groups.clear()


def _room(n: int) -> None:
    if len(_jobs) + len(_groups) + n > MAX_FOLLOW_UPS:
        raise ConfigError(
            f"an attempt may enqueue at most {MAX_FOLLOW_UPS:,} follow-ups through its job: "
            "enqueue many jobs as one group (current_job().group), or with "
            "pgpool.enqueue_many on a connection of your own"
        )
