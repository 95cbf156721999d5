"""pgpool: CPU-heavy jobs on every core of every host, with PostgreSQL as the only moving part.

The public API::

    @pgpool.handler(kind, *, timeout=None, retry=None, ...)     register fn(payload) -> None
    thumbnail.enqueue(conn, payload, ...) -> int | None         the Handler: its kind's jobs
    pgpool.Retry(attempts=None, base=1.0, cap=600.0, jitter=True, on=(), never=())
                                                                a handler's retry schedule
    pgpool.Limit(concurrency=N)                                 a kind's fleet-wide limit
                                                                (@handler(kind, limit=...))
    pgpool.periodic(name, cron, *, kind, payload=None, ...)     a schedule: jobs at its ticks
    pgpool.enqueue(conn, kind, payload, ...) -> int | None      in the caller's transaction
    pgpool.enqueue_many(conn, kind, payloads, ...) -> int       bulk, through COPY
    await pgpool.enqueue_async(aconn, ...), enqueue_many_async  the same on AsyncConnection
    pgpool.group(conn, kind, payloads, then=(kind, payload))    members and a callback run
                                                                once they have all finished
    pgpool.job_status(conn, id), pgpool.wait(conn, ids)         what became of jobs (kept
                                                                with @handler(keep=...))
    pgpool.group_status(conn, id), pgpool.group_members(conn, id)
                                                                a group's progress, members
    pgpool.migrate(conn)                                        create or upgrade the schema
    pgpool.current_job()                                        inside a handler: id, attempt,
                                                                .enqueue(...) follow-ups,
                                                                .checkpoint(state),
                                                                .checkpoint_state,
                                                                .progress(done, total, note),
                                                                .stopping
    raise pgpool.Snooze(seconds) / Discard(reason) / Cancel(reason)
                                 inside a handler: run later, unattempted / dead-letter now
    pgpool.Interrupted           raised by checkpoint() on a stopping host: let it propagate
    pgpool.SoftTimeout           raised in a handler at its soft_timeout: checkpoint, clean up
    pgpool.hooks.on_start / on_end / on_enqueue                 lifecycle hooks (pgpool.hooks)

Errors a caller can act on derive from `pgpool.PgpoolError`. ``pgpool.__version__`` is the
installed distribution's version (pyproject.toml is its one source).
"""

from typing import TYPE_CHECKING

from . import hooks
from .db.schema import migrate
from .enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from .errors import (
    CheckpointError,
    ConfigError,
    ConnectError,
    GroupNotFound,
    HandlerError,
    PayloadDecodeError,
    PayloadError,
    PgpoolError,
    SchemaError,
)
from .groups import Group, group, group_async
from .job import JobInfo
from .limits import Limit
from .outcomes import (
    GroupStatus,
    JobStatus,
    Member,
    Progress,
    group_members,
    group_members_async,
    group_status,
    group_status_async,
    job_status,
    job_status_async,
    job_statuses,
    job_statuses_async,
    wait,
    wait_async,
)
from .registry import Handler, handler
from .retry import Cancel, Discard, Interrupted, Retry, Snooze, SoftTimeout
from .schedules import periodic
from .worker.main import current_job

__version__: str
SCHEMA_VERSION: int
"""The schema version this pgpool needs: `migrate` brings a database to it, and the
commands refuse another (`pgpool.db.schema.SCHEMA_VERSION`)."""

if not TYPE_CHECKING:  # type checkers read the declarations above

    def __getattr__(name: str) -> object:
        # Read when asked, not at every import of pgpool (each worker's too):
        # importlib.metadata costs 50 ms to import, and the schema version is read from
        # the migrations' files.
        if name == "__version__":
            from importlib.metadata import version

            return version("pgpool")
        if name == "SCHEMA_VERSION":
            from .db.schema import SCHEMA_VERSION

            return SCHEMA_VERSION
        raise AttributeError(f"module 'pgpool' has no attribute {name!r}")

__all__ = [
    "SCHEMA_VERSION",
    "Cancel",
    "CheckpointError",
    "ConfigError",
    "ConnectError",
    "Discard",
    "Group",
    "GroupNotFound",
    "GroupStatus",
    "Handler",
    "HandlerError",
    "Interrupted",
    "JobInfo",
    "JobStatus",
    "Limit",
    "Member",
    "PayloadDecodeError",
    "PayloadError",
    "PgpoolError",
    "Progress",
    "Retry",
    "SchemaError",
    "Snooze",
    "SoftTimeout",
    "__version__",
    "current_job",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "group",
    "group_async",
    "group_members",
    "group_members_async",
    "group_status",
    "group_status_async",
    "handler",
    "hooks",
    "job_status",
    "job_status_async",
    "job_statuses",
    "job_statuses_async",
    "migrate",
    "periodic",
    "wait",
    "wait_async",
]
