"""Operating the queue: inspect, repair and steer it (the ``pgpool jobs``, ``dead``,
``cancel``, ``retry``, ``pause``, ``resume`` and ``limits`` commands, as Python functions).

`show_job` finds a job live (``pgpool_jobs``) or kept as done (``pgpool_done``), with its
group's progress when it is a group's callback; `list_jobs` lists live jobs, the members of
one group among them (`JobFilter.group`).

Like `pgpool.enqueue`, each function takes a psycopg connection and runs in its current
transaction (as a savepoint), so an operator's fix can commit together with the caller's
own rows; on an autocommit connection it commits by itself. Each has an ``_async`` twin
for an `AsyncConnection`. A function that changes jobs checks everything first and
changes nothing when it raises (`JobNotFound`, `ConfigError`); with ``dry_run=True`` it
reports what it would do and rolls that back.

`replay_dead` and `purge_dead` work in batches. On an autocommit connection each batch is a
transaction of its own, so a large replay or purge never holds many locks for long, and a
replay with ``rate`` trickles: batches of about a tenth of a second's worth, each started no
sooner than its share of the rate allows. Inside a transaction everything goes in it, and
``rate`` is refused (nothing would trickle: the caller's commit publishes all at once).

Each function is written once, as a plan: a generator that yields the statements to run
(`_Query`) and the pauses of a trickle (`_Pause`), and gets each statement's rows back.
`_run` and `_run_async` execute a plan on a connection.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar

from .enqueue import outside_a_transaction, schema_required
from .errors import ConfigError, HandlerError, PgpoolError
from .limits import OVERRIDE_BY, Limit, Override
from .names import check_name
from .outcomes import GroupStatus, Progress, group_status_of, progress_of
from .sql import ops as sql
from .sql import outcomes as outcomes_sql
from .sql.common import int_array
from .sql.jobs import OPEN_TRANSACTION

if TYPE_CHECKING:  # see pgpool.enqueue: workers import pgpool and never this
    import psycopg

JobState = Literal["ready", "scheduled", "running", "waiting", "parked", "done"]
#: A live job's states; 'waiting' is a group's callback until its members have finished.
JOB_STATES: Final[tuple[JobState, ...]] = ("ready", "scheduled", "running", "waiting",
                                           "parked", "done")
#: Why a job is in ``pgpool_dead``: it failed (its last attempt, or an error its handler's
#: `pgpool.Retry` does not retry), it was cancelled (``pgpool cancel``, `pgpool.Cancel`), or
#: its handler discarded it (`pgpool.Discard`).
DeadReason = Literal["failed", "cancelled", "discarded"]
DEAD_REASONS: Final[tuple[DeadReason, ...]] = ("failed", "cancelled", "discarded")
#: Rows a listing returns when the caller gives no limit.
DEFAULT_LIMIT: Final = 100
#: The busiest scopes of a limit by tenant or by key that `limits` names, per kind.
TOP_SCOPES: Final = 3
#: Dead jobs per replay or purge batch (a replay with ``rate`` uses smaller ones).
BATCH: Final = 1000
#: A trickled replay sends about this many batches a second.
TRICKLE_BATCHES_PER_SEC: Final = 10


class JobNotFound(PgpoolError, LookupError):
    """An id names no job in the state the operation needs (an operation that changes jobs
    then changed none)."""


# --- what the functions return ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LiveJob:
    """A job in ``pgpool_jobs``. ``state`` is ready (due now), scheduled (due later: delayed
    or waiting out a retry's backoff), running, or waiting (a group's callback, until its
    members have finished). ``lease_left`` (seconds) and ``owner`` (the host's dispatcher
    id) are set while it runs. ``error`` is the summary line of the last failed attempt's
    error; ``last_error`` (the whole text) and ``payload`` are only read when asked for.
    ``group_id`` is the group it is a member of; ``group`` (read by `show_job` only) its
    own group's progress when it is a group's callback. ``checkpoint_at``: when its handler
    last stored a checkpoint (``current_job().checkpoint``; its content, user data, is
    ``checkpoint``, read with the payload only); ``progress``: what its running attempt
    last reported (``current_job().progress``)."""

    id: int
    kind: str
    queue: str
    state: JobState
    attempts: int
    max_attempts: int | None
    priority: int
    run_at: datetime
    lease_left: float | None
    owner: str | None
    error: str | None
    created_at: datetime
    last_error: str | None = None
    payload: Any = None
    group_id: int | None = None
    group: GroupStatus | None = None
    checkpoint_at: datetime | None = None
    checkpoint: Any = None
    progress: Progress | None = None

    @property
    def parked(self) -> bool:
        """The database refused its ack: 'parked', or 'done' (it succeeded, and neither
        its result nor its follow-ups were stored); ``last_error`` says why."""
        return self.state in ("parked", "done")

    def as_dict(self) -> dict[str, Any]:
        d = _jsonable(self) | {"parked": self.parked}
        if self.lease_left is not None:
            d["lease_left"] = round(self.lease_left, 3)
        return d


@dataclass(frozen=True, slots=True)
class DoneJob:
    """A job kept in ``pgpool_done``: it succeeded, and its kind or its host keeps
    outcomes (``keep=``, ``--keep-done``) or it is a member of a group; kept until
    ``keep_until``. ``result`` (what its handler returned, user data) is only read when
    asked for. ``group_id`` and ``group`` as in `LiveJob`."""

    id: int
    kind: str
    queue: str
    state: Literal["done"]
    tenant: str
    attempts: int
    created_at: datetime
    finished_at: datetime
    keep_until: datetime
    group_id: int | None
    result: Any = None
    group: GroupStatus | None = None

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass(frozen=True, slots=True)
class DeadJob:
    """A job in ``pgpool_dead``. ``reason`` is one of `DEAD_REASONS`; ``signature`` is its
    error signature (`sql.SIGNATURE`), ``error`` the error's summary line."""

    id: int
    kind: str
    queue: str
    reason: str
    attempts: int
    max_attempts: int | None
    priority: int
    died_at: datetime
    created_at: datetime
    signature: str
    error: str | None
    last_error: str | None = None
    payload: Any = None

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass(frozen=True, slots=True)
class DeadGroup:
    """Dead jobs of one kind that share a reason and an error signature."""

    kind: str
    reason: str
    signature: str
    count: int
    first_died_at: datetime
    last_died_at: datetime
    example_id: int

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(self)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    """A page of rows, and whether more matched than the limit let through."""

    rows: list[T]
    more: bool


@dataclass(frozen=True, slots=True)
class ScopeUse:
    """The use of one scope of a limit by tenant or by key (``tenant:T``, ``key:K``): its
    ``running`` jobs holding a slot, and the rows of its ring used in the last period."""

    scope: str
    running: int
    rate_used: int


@dataclass(frozen=True, slots=True)
class LimitUse:
    """A kind's limit as the database knows it (`limits`): the operator's ``override``
    (None: the code's limit holds), when it was set, and the use: ``running`` jobs holding
    a slot of its concurrency limit, ``rate_used`` rows of its rate's rings used in the
    last period, and its ``ready`` jobs (due now). The limit in force, as the hosts apply it
    (the override over the code's limit the hosts publish): ``concurrency``, ``rate`` and
    ``per`` (all None: no registered host declares one and there is no override); of the
    ready jobs, ``waiting`` wait on it: more than it lets start within the fleet's target
    lag, so more hosts would not start them sooner (`pgpool_hosts_wanted` does not count
    them). A limit by tenant or by key: ``scopes`` in use (holding slots or with rows used
    in that period), and the `TOP_SCOPES` busiest, busiest first (``top``)."""

    kind: str
    override: Override | None
    set_at: datetime | None
    running: int
    rate_used: int
    ready: int
    concurrency: int | None
    rate: int | None
    per: float | None
    waiting: int
    scopes: int = 0
    top: tuple[ScopeUse, ...] = ()

    def in_force(self) -> str:
        """The limit in force as `Override.describe` says it (``-``: none known)."""
        if self.concurrency is None and self.rate is None:
            return "-"
        return Override(self.concurrency, self.rate, self.per, "").describe()

    def as_json(self) -> dict[str, Any]:
        """What ``pgpool limits --json`` and ``pgpool status --json`` say of it."""
        o = self.override
        return {"kind": self.kind,
                "override": None if o is None else {
                    "concurrency": o.concurrency, "rate": o.rate, "per": o.per, "by": o.by,
                    "set_by": o.set_by,
                    "set_at": self.set_at.isoformat() if self.set_at else None},
                "in_force": None if self.concurrency is None and self.rate is None else {
                    "concurrency": self.concurrency, "rate": self.rate, "per": self.per},
                "running": self.running, "rate_used": self.rate_used, "ready": self.ready,
                "waiting": self.waiting, "scopes": self.scopes,
                "top": [{"scope": t.scope, "running": t.running, "rate_used": t.rate_used}
                        for t in self.top]}


def limit_uses(rows: Iterable[Sequence[Any]]) -> list[LimitUse]:
    """The rows of `sql.LIMITS` (run with ``top`` = `TOP_SCOPES`), as `LimitUse`."""
    return [LimitUse(kind, None if set_by is None
                     else Override(concurrency, rate, per, set_by, by), set_at, running, used,
                     ready, in_concurrency, in_rate, in_per, waiting, scopes,
                     tuple(ScopeUse(*scope) for scope in top))
            for (kind, concurrency, rate, per, set_by, set_at, running, used, ready,
                 in_concurrency, in_rate, in_per, waiting, by, scopes, top) in rows]


@dataclass(slots=True)
class Replayed:
    """What a replay did: ``moved`` back to ready, ``skipped`` (a live job of that kind
    holds its unique key: it stays dead), ``seconds`` it took; a dry run moves nothing and
    counts the matching jobs as ``would_move``.

    Groups (see `replay_dead`): ``refused`` stayed dead, members of the groups
    ``refused_groups``, whose callbacks have not run yet; ``outside`` were moved back
    outside the groups ``outside_groups``, whose callbacks have run; ``waiting`` are
    callbacks moved back to wait for their groups' members. `notes` says so."""

    moved: int = 0
    skipped: int = 0
    batches: int = 0
    seconds: float = 0.0
    would_move: int = 0
    refused: int = 0
    refused_groups: list[int] = field(default_factory=list)
    outside: int = 0
    outside_groups: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)

    def notes(self) -> list[str]:
        """What the replay did besides moving jobs back, a sentence each: the same words
        for the CLI and the dashboard."""
        notes = []
        if self.skipped:
            notes.append(f"{self.skipped} stayed dead: a live job of the same kind holds its "
                         "unique key")
        if self.refused:
            notes.append(f"{self.refused} stayed dead: "
                         + _pending_members(self.refused, self.refused_groups)
                         + ": replay " + ("it after the callback has run" if self.refused == 1
                                          else "them after the callbacks have run"
                                          if len(self.refused_groups) > 1
                                          else "them after the callback has run"))
        if self.outside:
            one_group = len(self.outside_groups) == 1
            notes.append(
                f"{self.outside} replayed outside "
                + ("its" if self.outside == 1 else "their") + " group"
                + ("" if one_group else "s") + ": the callback"
                + (f" of group {self.outside_groups[0]} has" if one_group else
                   f"s of groups {_ids_text(self.outside_groups)} have")
                + " run already, and nothing reads the replayed "
                + ("job's end" if self.outside == 1 else "jobs' ends"))
        if len(self.waiting) == 1:
            notes.append(f"1 of them waits again: the callback of group {self.waiting[0]} "
                         "runs once its members have all finished")
        elif self.waiting:
            notes.append(f"{len(self.waiting)} of them wait again: the callbacks of groups "
                         f"{_ids_text(self.waiting)} run once their members have all "
                         "finished")
        return notes


@dataclass(slots=True)
class Purged:
    """What a purge did: ``deleted`` (a dry run deletes nothing and counts what it would as
    ``would_delete``), in ``batches``, in ``seconds``; ``kept`` matched but stayed,
    members of the groups ``kept_groups`` whose callbacks have not run yet (see
    `purge_dead`). `notes` says so."""

    deleted: int = 0
    batches: int = 0
    seconds: float = 0.0
    would_delete: int = 0
    kept: int = 0
    kept_groups: list[int] = field(default_factory=list)

    def notes(self) -> list[str]:
        """What the purge left, a sentence each: the same words for the CLI and the
        dashboard."""
        if not self.kept:
            return []
        one = self.kept == 1
        return [f"{self.kept} dead job{'' if one else 's'} stay{'s' if one else ''}: "
                + _pending_members(self.kept, self.kept_groups)
                + f": --force deletes {'it' if one else 'them'} too"]


def _pending_members(count: int, groups: list[int]) -> str:
    """``count`` members of ``groups`` whose callbacks have not run yet, in words."""
    if count == 1:
        return (f"member of group {groups[0]}, whose callback has not run yet (it reads the "
                "member's end)")
    if len(groups) == 1:
        return (f"members of group {groups[0]}, whose callback has not run yet (it reads "
                "their ends)")
    return (f"members of groups {_ids_text(groups)}, whose callbacks have not run yet (they "
            "read their ends)")


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A cancelled job: its id, what it was doing, and the host running it (if it was)."""

    id: int
    was: JobState
    owner: str | None


@dataclass(frozen=True, slots=True)
class Retried:
    """``now``: jobs made due now; ``already_due``: ready jobs that were due anyway."""

    now: list[int]
    already_due: list[int]


# --- checks and formatting (before the filters, whose defaults are checked at import) -----

_BIGINT_MAX: Final = 2**63 - 1


def parse_job_id(text: str) -> int:
    """A job id (or a group's: its callback's) as typed on a command line or in a URL:
    ASCII digits (``str.isdigit`` takes "²", which ``int`` refuses) of a positive bigint;
    `ConfigError` otherwise."""
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= _BIGINT_MAX:
        raise ConfigError(f"{text[:40]!r} is not a job id (a positive integer)")
    return int(text)


def _check_ids(ids: Iterable[int]) -> list[int]:
    """The distinct ids, in order; `ConfigError` for none or a non-id."""
    out = list(dict.fromkeys(ids))
    if not out:
        raise ConfigError("no job ids given: pass at least one")
    bad = [i for i in out if not isinstance(i, int) or isinstance(i, bool)
           or not 0 < i <= _BIGINT_MAX]
    if bad:
        raise ConfigError(f"{bad[0]!r} is not a job id (a positive integer)")
    return out


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                              or not 0 < limit <= _BIGINT_MAX):
        raise ConfigError(f"limit must be a positive integer, got {limit!r}")


def _check_seconds(what: str, value: float | None) -> None:
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)
                              or not math.isfinite(value) or value < 0):
        raise ConfigError(f"{what} must be a non-negative number of seconds, got {value!r}")


def _ids_text(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:10]))
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def _is(ids: list[int]) -> str:
    return "is" if len(ids) == 1 else "are"


def _span(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _jsonable(row: Any) -> dict[str, Any]:
    out = {}
    for name in row.__dataclass_fields__:
        value = getattr(row, name)
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, GroupStatus):
            value = {**_jsonable(value), "finished": value.finished}
        elif isinstance(value, Progress):
            value = {**_jsonable(value), "fraction": value.fraction}
        out[name] = value
    return out


# --- filters ------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeadFilter:
    """Which dead jobs an operation takes; every field left None matches all. ``error`` is a
    substring of the stored error, ``signature`` an exact error signature (as ``dead list
    --group`` prints it), ``since``/``older_than`` seconds since the job died. Raises
    `ConfigError` when made with fields that are malformed or cannot both hold."""

    ids: Sequence[int] | None = None
    queue: str | None = None
    kind: str | None = None
    error: str | None = None
    signature: str | None = None
    reason: DeadReason | None = None
    since: float | None = None
    older_than: float | None = None

    def __post_init__(self) -> None:
        if self.ids is not None:
            _check_ids(self.ids)
        for what in ("queue", "kind"):
            if getattr(self, what) is not None:
                check_name(what, getattr(self, what))
        if self.reason is not None and self.reason not in DEAD_REASONS:
            raise ConfigError(f"reason must be one of {', '.join(DEAD_REASONS)}, got "
                              f"{self.reason!r}")
        for what in ("since", "older_than"):
            _check_seconds(what, getattr(self, what))
        if (self.since is not None and self.older_than is not None
                and self.older_than >= self.since):
            raise ConfigError(
                "conflicting filters: no job died both within the last "
                f"{_span(self.since)} (since) and more than {_span(self.older_than)} ago "
                "(older than): make older-than shorter than since"
            )
        if self.error == "" or self.signature == "":
            raise ConfigError("an empty error or signature filter: leave it out to match all")

    @property
    def empty(self) -> bool:
        """No field set: it matches every dead job."""
        return all(getattr(self, f) is None for f in self.__dataclass_fields__)

    def params(self) -> dict[str, Any]:
        return {
            "ids": None if self.ids is None else int_array(self.ids),
            "queue": self.queue, "kind": self.kind, "error": self.error,
            "signature": self.signature, "reason": self.reason, "since": self.since,
            "older_than": self.older_than, "after_died": None, "after_id": None,
        }


@dataclass(frozen=True)
class JobFilter:
    """Which live jobs to list; None matches all. ``older_than``: enqueued more than that
    many seconds ago. ``group``: only the members of this group (its id, the callback
    job's). ``after``: only jobs past this (run_at, id) in the listing's order, the last
    row of the page before (`Listing.rows`), to page through a long list. Raises
    `ConfigError` when made with a malformed field."""

    queue: str | None = None
    kind: str | None = None
    state: JobState | None = None
    older_than: float | None = None
    after: tuple[datetime, int] | None = None
    group: int | None = None

    def __post_init__(self) -> None:
        for what in ("queue", "kind"):
            if getattr(self, what) is not None:
                check_name(what, getattr(self, what))
        if self.state is not None and self.state not in JOB_STATES:
            raise ConfigError(f"state must be one of {', '.join(JOB_STATES)}, "
                              f"got {self.state!r}")
        _check_seconds("older_than", self.older_than)
        if self.after is not None:
            _check_ids([self.after[1]])
        if self.group is not None:
            _check_ids([self.group])

    def params(self) -> dict[str, Any]:
        run_at, after_id = self.after or (None, None)
        return {"queue": self.queue, "kind": self.kind, "state": self.state,
                "older_than": self.older_than, "group": self.group,
                "after_run_at": run_at, "after_id": after_id}


# --- plans: what each function does, independent of sync or async -------------------------

@dataclass(frozen=True, slots=True)
class _Query:
    statement: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Pause:
    seconds: float


Rows = list[tuple[Any, ...]]
R = TypeVar("R")
Plan = Generator[_Query | _Pause, Rows, R]


def _list_jobs(where: JobFilter, limit: int, payload: bool) -> Plan[Listing[LiveJob]]:
    _check_limit(limit)
    rows = yield _Query(sql.JOBS_LIST, {**where.params(), "limit": limit, "full": False,
                                        "payload": payload})
    return Listing([_live(r) for r in rows[:limit]], len(rows) > limit)


def _live(row: tuple[Any, ...]) -> LiveJob:
    """A row of `sql.JOBS_LIST` or `sql.JOBS_BY_ID`."""
    *columns, checkpoint_at, checkpoint, progress, progress_at = row
    return replace(LiveJob(*columns), checkpoint_at=checkpoint_at, checkpoint=checkpoint,
                   progress=progress_of(progress, progress_at))


def _show_job(job_id: int, payload: bool, result: bool) -> Plan[LiveJob | DoneJob]:
    _check_ids([job_id])
    rows = yield _Query(sql.JOBS_BY_ID, {"ids": int_array([job_id]), "full": True,
                                         "payload": payload})
    found: LiveJob | DoneJob
    if rows:
        found = _live(rows[0])
    else:
        rows = yield _Query(sql.DONE_BY_ID, {"id": job_id, "result": result})
        if not rows:
            yield from _nowhere(job_id)
        found = DoneJob(*rows[0])
    # Its own group, when it is a group's callback (a group's id is its callback's).
    group = yield _Query(outcomes_sql.GROUP, {"id": job_id})
    if group:
        found = replace(found, group=group_status_of(job_id, group[0]))
    return found


def _list_dead(where: DeadFilter, limit: int, payload: bool) -> Plan[Listing[DeadJob]]:
    _check_limit(limit)
    rows = yield _Query(sql.DEAD_LIST, {**where.params(), "limit": limit, "full": False,
                                        "payload": payload})
    return Listing([DeadJob(*r) for r in rows[:limit]], len(rows) > limit)


def _group_dead(where: DeadFilter, limit: int) -> Plan[Listing[DeadGroup]]:
    _check_limit(limit)
    rows = yield _Query(sql.DEAD_GROUPS, {**where.params(), "limit": limit})
    return Listing([DeadGroup(*r) for r in rows[:limit]], len(rows) > limit)


def _show_dead(job_id: int, payload: bool) -> Plan[DeadJob]:
    _check_ids([job_id])
    rows = yield _Query(sql.DEAD_LIST, {**DeadFilter(ids=[job_id]).params(), "limit": 1,
                                        "full": True, "payload": payload})
    if not rows:
        raise JobNotFound(f"no dead job has id {job_id}: `pgpool jobs show {job_id}` shows "
                          "it if it is still live")
    return DeadJob(*rows[0])


def _replay_dead(where: DeadFilter, limit: int | None, rate: float | None,
                 dry_run: bool) -> Plan[Replayed]:
    _check_limit(limit)
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"rate must be a positive number of jobs per second, got {rate!r}")
    result = Replayed()
    started = time.monotonic()
    params = where.params()
    if dry_run:
        rows = yield _Query(sql.DEAD_COUNT, {**params, "limit": limit,
                                             "keep_pending": False})
        result.would_move = rows[0][0]
        return result
    size = BATCH if rate is None else max(1, min(BATCH, math.ceil(
        rate / TRICKLE_BATCHES_PER_SEC)))
    picked_total = 0
    while limit is None or picked_total < limit:
        if rate is not None and picked_total:
            # The next batch starts once the rate allows what was picked so far.
            wait = started + picked_total / rate - time.monotonic()
            if wait > 0:
                yield _Pause(wait)
        want = size if limit is None else min(size, limit - picked_total)
        rows = yield _Query(sql.REPLAY_DEAD, {**params, "limit": want})
        (picked, moved, after_died, after_id, _, refused, refused_groups, outside,
         outside_groups, waiting) = rows[0]
        picked_total += picked
        result.moved += moved
        result.skipped += picked - moved - refused
        result.refused += refused
        result.refused_groups = sorted({*result.refused_groups, *refused_groups})
        result.outside += outside
        result.outside_groups = sorted({*result.outside_groups, *outside_groups})
        result.waiting += waiting
        result.batches += 1
        if picked < want:
            break
        params = {**params, "after_died": after_died, "after_id": after_id}
    result.seconds = time.monotonic() - started
    return result


def _purge_dead(where: DeadFilter, limit: int | None, dry_run: bool,
                force: bool) -> Plan[Purged]:
    _check_limit(limit)
    result = Purged()
    started = time.monotonic()
    params = {**where.params(), "keep_pending": not force}
    if dry_run:
        rows = yield _Query(sql.DEAD_COUNT, {**params, "limit": limit})
        result.would_delete = rows[0][0]
    else:
        while limit is None or result.deleted < limit:
            want = BATCH if limit is None else min(BATCH, limit - result.deleted)
            rows = yield _Query(sql.PURGE_DEAD, {**params, "limit": want})
            result.deleted += rows[0][0]
            result.batches += 1
            if rows[0][0] < want:
                break
    if not force:
        rows = yield _Query(sql.DEAD_PENDING, params)
        result.kept, result.kept_groups = rows[0]
    result.seconds = time.monotonic() - started
    return result


def _cancel(ids: Iterable[int]) -> Plan[list[Cancelled]]:
    wanted = _check_ids(ids)
    rows = yield _Query(sql.CANCEL_LOCK, {"ids": int_array(wanted)})
    found = {r[0] for r in rows}
    if len(found) < len(wanted):
        yield from _not_found([i for i in wanted if i not in found], "live")
    kept = [i for i, state, _ in rows if state == "done"]
    if kept:
        raise JobNotFound(f"job {_ids_text(kept)} succeeded (kept as done because the "
                          "database refused to delete it; see its last_error): nothing to "
                          "cancel, and as a dead job a replay would run it again; delete it "
                          "once nothing references it; nothing was changed")
    stopping = [i for i, state, owner in rows if state == "running" and owner is None]
    if stopping:
        raise JobNotFound(f"job {_ids_text(stopping)} {_is(stopping)} already cancelled: "
                          "its attempt may run until its lease ends, then it moves to the "
                          "dead jobs (`pgpool dead list --reason cancelled`); nothing was "
                          "changed")
    yield _Query(sql.CANCEL, {"ids": int_array(wanted)})
    if any(state == "running" for _, state, _ in rows):
        yield _Query(sql.NOTIFY_CONTROL, {})  # its host stops the worker now, not at a poll
    return [Cancelled(*r) for r in rows]


def _retry(ids: Iterable[int]) -> Plan[Retried]:
    wanted = _check_ids(ids)
    rows = yield _Query(sql.JOBS_LOCK, {"ids": int_array(wanted)})
    states: dict[int, str] = dict(rows)
    if len(states) < len(wanted):
        yield from _not_found([i for i in wanted if i not in states], "waiting")
    running = [i for i, state in states.items() if state == "running"]
    if running:
        raise JobNotFound(f"job {_ids_text(running)} {_is(running)} running, not waiting "
                          "to retry: nothing to do (`pgpool cancel` stops a running job)")
    kept = [i for i, state in states.items() if state == "done"]
    if kept:
        raise JobNotFound(f"job {_ids_text(kept)} succeeded (kept as done because the "
                          "database refused to delete it; see its last_error): nothing to "
                          "retry; delete it once nothing references it")
    callbacks = [i for i, state in states.items() if state == "waiting"]
    if callbacks:
        raise JobNotFound(f"job {_ids_text(callbacks)} {_is(callbacks)} a group's callback "
                          "waiting for its members: it runs once they have all finished "
                          f"(`pgpool jobs show {callbacks[0]}` shows its group's progress); "
                          "nothing was changed")
    scheduled = [i for i, state in states.items() if state in ("scheduled", "parked")]
    if scheduled:
        yield _Query(sql.RETRY_NOW, {"ids": int_array(scheduled)})
    return Retried(scheduled, [i for i, state in states.items() if state == "ready"])


def _set_paused(queue: str, paused: bool, force: bool = False) -> Plan[bool]:
    """Pause or resume ``queue``; True if that changed it. Every host hears of a change at
    once (`sql.NOTIFY_CONTROL`). ``force`` pauses a queue nothing uses yet."""
    check_name("queue", queue)
    if not force:
        yield from _check_queue_known(queue)
    rows = yield _Query(sql.PAUSE if paused else sql.RESUME, {"queue": queue})
    if rows:
        yield _Query(sql.NOTIFY_CONTROL, {})
    return bool(rows)


def _set_limit(kind: str, concurrency: int | None, rate: int | None,
               per: float | None, by: str | None) -> Plan[Override]:
    """Check the override as a `Limit` would be checked, store it, tell the hosts."""
    check_name("kind", kind)
    if by is not None and by not in OVERRIDE_BY:
        raise ConfigError(f"limit of kind {kind}: by must be one of "
                          f"{', '.join(OVERRIDE_BY)}, got {by!r}")
    if concurrency is None and rate is None and by is None:
        raise ConfigError(f"limit of kind {kind}: give concurrency=N, rate=R (per seconds), "
                          "by (what it is counted per), or several")
    if concurrency is not None or rate is not None:  # by alone changes no number
        try:
            Limit(concurrency=concurrency, rate=rate, per=1.0 if per is None else per)
        except HandlerError as exc:
            raise ConfigError(str(exc).replace("pgpool.Limit: ", f"limit of kind {kind}: ")
                              ) from None
    if per is not None and rate is None:
        raise ConfigError(f"limit of kind {kind}: per needs a rate: give rate=R too")
    rows = yield _Query(sql.SET_LIMIT, {"kind": kind, "concurrency": concurrency,
                                        "rate": rate, "per": per, "by": by})
    yield _Query(sql.NOTIFY_CONTROL, {})
    return Override(concurrency, rate, per, rows[0][1], by)


def _reset_limit(kind: str) -> Plan[bool]:
    check_name("kind", kind)
    rows = yield _Query(sql.RESET_LIMIT, {"kind": kind})
    if rows:
        yield _Query(sql.NOTIFY_CONTROL, {})
    return bool(rows)


def _limits() -> Plan[list[LimitUse]]:
    return limit_uses((yield _Query(sql.LIMITS, {"top": TOP_SCOPES})))


def _queue_known(queue: str) -> Plan[bool]:
    check_name("queue", queue)
    rows = yield _Query(sql.QUEUE_KNOWN, {"queue": queue})
    return bool(rows[0][0])


def _paused() -> Plan[dict[str, datetime]]:
    rows = yield _Query(sql.PAUSED, {})
    return dict(rows)


def _check_queue_known(queue: str) -> Plan[None]:
    if not (yield from _queue_known(queue)):
        raise ConfigError(f"unknown queue {queue!r}: no job, dead job, live host or pause "
                          "names it; check the name (`pgpool status` lists the queues)")


def _nowhere(job_id: int) -> Plan[None]:
    """Raise `JobNotFound` for a job that `show_job` finds neither live nor kept: what is
    known of it, in plain words (a look changes nothing, so it says nothing of changes)."""
    if (yield _Query(sql.DEAD_IDS, {"ids": int_array([job_id])})):
        raise JobNotFound(f"job {job_id} is dead-lettered: `pgpool dead show {job_id}` shows "
                          f"it (`pgpool dead replay --id {job_id}` runs it again)")
    raise JobNotFound(f"job {job_id} is not in the queue, not dead-lettered and not kept: "
                      "either it finished and nothing kept it (a success is kept only with "
                      "keep= on its handler or `pgpool run --keep-done`), or it never existed")


def _not_found(ids: list[int], what: str,
               why: str = "finished, purged, or never enqueued") -> Plan[None]:
    """Raise `JobNotFound` for ``ids``, saying which are dead jobs."""
    rows = yield _Query(sql.DEAD_IDS, {"ids": int_array(ids)})
    dead = [r[0] for r in rows]
    missing = [i for i in ids if i not in set(dead)]
    parts = []
    if missing:
        parts.append(f"no {what} job has id {_ids_text(missing)} ({why})")
    if dead:
        ref = str(dead[0]) if len(dead) == 1 else "ID"
        parts.append(f"job {_ids_text(dead)} {_is(dead)} dead (`pgpool dead show {ref}`; "
                     f"`pgpool dead replay --id {ref}` runs it again)")
    raise JobNotFound("; ".join(parts) + "; nothing was changed")


# --- running plans ------------------------------------------------------------------------

def _batched(conn: psycopg.Connection | psycopg.AsyncConnection, dry_run: bool) -> bool:
    """Whether each statement of a plan commits on its own (see the module docstring)."""
    return conn.autocommit and not dry_run


def _run(conn: psycopg.Connection, plan: Plan[R], *, dry_run: bool = False,
         batched: bool = False) -> R:
    """Execute ``plan`` in ``conn``'s transaction (a savepoint; rolled back for a dry run),
    or, ``batched`` on an autocommit connection, each statement in a transaction of its own."""
    if outside_a_transaction(conn):
        conn.execute(OPEN_TRANSACTION)  # the caller commits, as after enqueue
    each = batched and _batched(conn, dry_run)
    with schema_required(), (contextlib.nullcontext() if each
                              else conn.transaction(force_rollback=dry_run)):
        try:
            step = next(plan)
            while True:
                rows: Rows = []
                if isinstance(step, _Pause):
                    time.sleep(step.seconds)
                else:
                    with conn.transaction() if each else contextlib.nullcontext():
                        cur = conn.execute(step.statement, step.params)
                        rows = cur.fetchall() if cur.description else []
                step = plan.send(rows)
        except StopIteration as stop:
            result: R = stop.value
            return result


async def _run_async(conn: psycopg.AsyncConnection, plan: Plan[R], *, dry_run: bool = False,
                     batched: bool = False) -> R:
    """Async twin of `_run`."""
    import asyncio  # here: worker processes import pgpool.cli, and so this module

    if outside_a_transaction(conn):
        await conn.execute(OPEN_TRANSACTION)
    each = batched and _batched(conn, dry_run)
    with schema_required():
        async with (contextlib.nullcontext() if each
                    else conn.transaction(force_rollback=dry_run)):
            try:
                step = next(plan)
                while True:
                    rows: Rows = []
                    if isinstance(step, _Pause):
                        await asyncio.sleep(step.seconds)
                    else:
                        async with (conn.transaction() if each
                                    else contextlib.nullcontext()):
                            cur = await conn.execute(step.statement, step.params)
                            rows = await cur.fetchall() if cur.description else []
                    step = plan.send(rows)
            except StopIteration as stop:
                result: R = stop.value
                return result


def _check_rate(conn: psycopg.Connection | psycopg.AsyncConnection, rate: float | None,
                dry_run: bool) -> None:
    if rate is not None and not dry_run and not conn.autocommit:
        raise ConfigError("a replay with a rate needs an autocommit connection: inside a "
                          "transaction nothing trickles, the commit publishes every job at once")


# --- the public functions -----------------------------------------------------------------

def list_jobs(conn: psycopg.Connection, where: JobFilter = JobFilter(), *,
              limit: int = DEFAULT_LIMIT, payload: bool = False) -> Listing[LiveJob]:
    """Live jobs matching ``where``, oldest first (by due time), at most ``limit``.
    Payloads are read only with ``payload=True``: they are user data."""
    return _run(conn, _list_jobs(where, limit, payload))


async def list_jobs_async(conn: psycopg.AsyncConnection, where: JobFilter = JobFilter(), *,
                          limit: int = DEFAULT_LIMIT, payload: bool = False
                          ) -> Listing[LiveJob]:
    """Async twin of `list_jobs`."""
    return await _run_async(conn, _list_jobs(where, limit, payload))


def show_job(conn: psycopg.Connection, job_id: int, *, payload: bool = False,
             result: bool = False) -> LiveJob | DoneJob:
    """One job: live (`LiveJob`, with its whole last error), or kept as done after its
    success (`DoneJob`); a group's callback with its group's progress (``group``).
    ``payload`` and ``result`` are user data, read only when asked for. `JobNotFound` when
    it is in neither table (it says so when the job is dead)."""
    return _run(conn, _show_job(job_id, payload, result))


async def show_job_async(conn: psycopg.AsyncConnection, job_id: int, *,
                         payload: bool = False, result: bool = False) -> LiveJob | DoneJob:
    """Async twin of `show_job`."""
    return await _run_async(conn, _show_job(job_id, payload, result))


def list_dead(conn: psycopg.Connection, where: DeadFilter = DeadFilter(), *,
              limit: int = DEFAULT_LIMIT, payload: bool = False) -> Listing[DeadJob]:
    """Dead jobs matching ``where``, newest first, at most ``limit``."""
    return _run(conn, _list_dead(where, limit, payload))


async def list_dead_async(conn: psycopg.AsyncConnection, where: DeadFilter = DeadFilter(),
                          *, limit: int = DEFAULT_LIMIT, payload: bool = False
                          ) -> Listing[DeadJob]:
    """Async twin of `list_dead`."""
    return await _run_async(conn, _list_dead(where, limit, payload))


def group_dead(conn: psycopg.Connection, where: DeadFilter = DeadFilter(), *,
               limit: int = DEFAULT_LIMIT) -> Listing[DeadGroup]:
    """Dead jobs matching ``where`` counted by (kind, reason, error signature), largest
    first."""
    return _run(conn, _group_dead(where, limit))


async def group_dead_async(conn: psycopg.AsyncConnection, where: DeadFilter = DeadFilter(),
                           *, limit: int = DEFAULT_LIMIT) -> Listing[DeadGroup]:
    """Async twin of `group_dead`."""
    return await _run_async(conn, _group_dead(where, limit))


def show_dead(conn: psycopg.Connection, job_id: int, *, payload: bool = False) -> DeadJob:
    """One dead job, with its whole last error; `JobNotFound` if there is none."""
    return _run(conn, _show_dead(job_id, payload))


async def show_dead_async(conn: psycopg.AsyncConnection, job_id: int, *,
                          payload: bool = False) -> DeadJob:
    """Async twin of `show_dead`."""
    return await _run_async(conn, _show_dead(job_id, payload))


def replay_dead(conn: psycopg.Connection, where: DeadFilter, *, limit: int | None = None,
                rate: float | None = None, dry_run: bool = False) -> Replayed:
    """Move dead jobs matching ``where`` (at most ``limit``, oldest death first) back to
    ready: same id, attempts from 0, due now. ``rate`` (jobs per second, autocommit
    connections only) trickles them. A job whose unique key a live job holds stays dead
    (counted as skipped). ``DeadFilter()`` matches every dead job.

    A member of a group whose callback is still waiting goes back into its group, which
    counts its new end instead of the old; one whose group is complete but whose callback
    has not run yet stays dead (counted as refused: the callback reads its end); one whose
    callback has run goes back outside its group (counted as outside). A group's callback
    goes back waiting while its group is not complete (listed in ``waiting``), and ready
    once it is."""
    _check_rate(conn, rate, dry_run)
    return _run(conn, _replay_dead(where, limit, rate, dry_run), dry_run=dry_run,
                batched=True)


async def replay_dead_async(conn: psycopg.AsyncConnection, where: DeadFilter, *,
                            limit: int | None = None, rate: float | None = None,
                            dry_run: bool = False) -> Replayed:
    """Async twin of `replay_dead`."""
    _check_rate(conn, rate, dry_run)
    return await _run_async(conn, _replay_dead(where, limit, rate, dry_run),
                            dry_run=dry_run, batched=True)


def purge_dead(conn: psycopg.Connection, where: DeadFilter, *, limit: int | None = None,
               dry_run: bool = False, force: bool = False) -> Purged:
    """Delete dead jobs matching ``where`` (``DeadFilter()``: all of them), oldest death
    first, in batches of `BATCH` (each its own transaction on an autocommit connection).
    A member of a group whose callback has not run yet is kept (the callback reads its
    end; counted as ``kept``) unless ``force``."""
    return _run(conn, _purge_dead(where, limit, dry_run, force), dry_run=dry_run,
                batched=True)


async def purge_dead_async(conn: psycopg.AsyncConnection, where: DeadFilter, *,
                           limit: int | None = None, dry_run: bool = False,
                           force: bool = False) -> Purged:
    """Async twin of `purge_dead`."""
    return await _run_async(conn, _purge_dead(where, limit, dry_run, force),
                            dry_run=dry_run, batched=True)


def cancel(conn: psycopg.Connection, ids: Iterable[int], *,
           dry_run: bool = False) -> list[Cancelled]:
    """Cancel live jobs: each moves to ``pgpool_dead`` with reason ``cancelled`` and an
    error saying when and what it was doing, so a ready, scheduled or parked one never
    runs. A running one's host kills its worker within about a second (a notification,
    then the host's poll as a backstop) and the attempt is never retried; its row stays,
    holding its concurrency and unique keys, until its lease ends (the attempt may run
    until then), and then moves to ``pgpool_dead``. All or nothing: an id that is not a
    live job, a job kept as done (it succeeded) or a job cancelled already raises
    `JobNotFound` and nothing is cancelled."""
    return _run(conn, _cancel(ids), dry_run=dry_run)


async def cancel_async(conn: psycopg.AsyncConnection, ids: Iterable[int], *,
                       dry_run: bool = False) -> list[Cancelled]:
    """Async twin of `cancel`."""
    return await _run_async(conn, _cancel(ids), dry_run=dry_run)


def retry(conn: psycopg.Connection, ids: Iterable[int], *, dry_run: bool = False) -> Retried:
    """Make scheduled jobs (waiting out a retry's backoff, or delayed) and parked jobs
    ready and due now. All or nothing: an id that is not a waiting job (missing, dead,
    running, kept as done, a group's callback waiting for its members) raises
    `JobNotFound`."""
    return _run(conn, _retry(ids), dry_run=dry_run)


async def retry_async(conn: psycopg.AsyncConnection, ids: Iterable[int], *,
                      dry_run: bool = False) -> Retried:
    """Async twin of `retry`."""
    return await _run_async(conn, _retry(ids), dry_run=dry_run)


def pause(conn: psycopg.Connection, queue: str, *, force: bool = False,
          dry_run: bool = False) -> bool:
    """Pause ``queue`` fleet-wide: every host stops claiming from it within about a second
    (running jobs finish), and it stays paused across restarts until `resume`. False if it
    was paused already. An unknown queue (no job, dead job or host names it) raises
    `ConfigError` unless ``force`` (to pause a queue before it is used)."""
    return _run(conn, _set_paused(queue, True, force), dry_run=dry_run)


async def pause_async(conn: psycopg.AsyncConnection, queue: str, *, force: bool = False,
                      dry_run: bool = False) -> bool:
    """Async twin of `pause`."""
    return await _run_async(conn, _set_paused(queue, True, force), dry_run=dry_run)


def resume(conn: psycopg.Connection, queue: str, *, dry_run: bool = False) -> bool:
    """Resume a paused ``queue``; False if it was not paused."""
    return _run(conn, _set_paused(queue, False), dry_run=dry_run)


async def resume_async(conn: psycopg.AsyncConnection, queue: str, *,
                       dry_run: bool = False) -> bool:
    """Async twin of `resume`."""
    return await _run_async(conn, _set_paused(queue, False), dry_run=dry_run)


def paused(conn: psycopg.Connection) -> dict[str, datetime]:
    """The paused queues, and when each was paused."""
    return _run(conn, _paused())


async def paused_async(conn: psycopg.AsyncConnection) -> dict[str, datetime]:
    """Async twin of `paused`."""
    return await _run_async(conn, _paused())


def queue_known(conn: psycopg.Connection, queue: str) -> bool:
    """Whether any job, dead job, live host or pause names ``queue``."""
    return _run(conn, _queue_known(queue))


async def queue_known_async(conn: psycopg.AsyncConnection, queue: str) -> bool:
    """Async twin of `queue_known`."""
    return await _run_async(conn, _queue_known(queue))


def set_limit(conn: psycopg.Connection, kind: str, *, concurrency: int | None = None,
              rate: int | None = None, per: float | None = None, by: str | None = None,
              dry_run: bool = False) -> Override:
    """Override the limit of ``kind`` on every host (`pgpool.Limit`; see
    [Limits](../guides/limits.md#changing-a-limit-live)): ``concurrency`` and ``rate``
    (jobs per ``per`` seconds, 1 if not given) replace the code's, and so does ``by``
    ("tenant", "concurrency_key", or "kind" for the kind as a whole; it may be given
    alone); a field not given keeps the code's, until `reset_limit`.
    Replaces an earlier override of the kind. Hosts apply it within a poll interval (at
    once when they hear the notification), and each logs it with who set it. A bad value
    raises `ConfigError`."""
    return _run(conn, _set_limit(kind, concurrency, rate, per, by), dry_run=dry_run)


async def set_limit_async(conn: psycopg.AsyncConnection, kind: str, *,
                          concurrency: int | None = None, rate: int | None = None,
                          per: float | None = None, by: str | None = None,
                          dry_run: bool = False) -> Override:
    """Async twin of `set_limit`."""
    return await _run_async(conn, _set_limit(kind, concurrency, rate, per, by),
                            dry_run=dry_run)


def reset_limit(conn: psycopg.Connection, kind: str, *, dry_run: bool = False) -> bool:
    """Drop the override of ``kind``: the code's limit (or none) holds again. False if it
    had none."""
    return _run(conn, _reset_limit(kind), dry_run=dry_run)


async def reset_limit_async(conn: psycopg.AsyncConnection, kind: str, *,
                            dry_run: bool = False) -> bool:
    """Async twin of `reset_limit`."""
    return await _run_async(conn, _reset_limit(kind), dry_run=dry_run)


def limits(conn: psycopg.Connection) -> list[LimitUse]:
    """The kinds with an override, or with jobs holding a limit's slots or a rate's rows:
    each one's override and use. (The code's limits live in the hosts' handlers, not in
    the database.)"""
    return _run(conn, _limits())


async def limits_async(conn: psycopg.AsyncConnection) -> list[LimitUse]:
    """Async twin of `limits`."""
    return await _run_async(conn, _limits())


__all__ = [
    "Cancelled", "DeadFilter", "DeadGroup", "DeadJob", "DoneJob", "JobFilter",
    "JobNotFound", "LimitUse", "Listing", "LiveJob", "Purged", "Replayed", "Retried",
    "ScopeUse",
    "cancel", "cancel_async", "group_dead", "group_dead_async", "limits", "limits_async",
    "list_dead", "list_dead_async", "list_jobs", "list_jobs_async", "pause", "pause_async",
    "paused", "paused_async", "purge_dead", "purge_dead_async", "queue_known",
    "queue_known_async", "replay_dead", "replay_dead_async", "reset_limit",
    "reset_limit_async", "resume", "resume_async", "retry", "retry_async", "set_limit",
    "set_limit_async", "show_dead", "show_dead_async", "show_job", "show_job_async",
]
