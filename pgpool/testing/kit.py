"""Testing handlers: what a test asserts about the jobs its code enqueued, running those jobs
in the test's own process, and calling one handler without a database.

- `enqueued`, `assert_enqueued`, `refute_enqueued`: the live jobs (``pgpool_jobs``), and
  assertions whose failure lists the jobs of that kind that are there, payloads included
  (the test's own data: it is what the reader needs).
- `drain`: runs the ready jobs one at a time, as a host of its own would: each is claimed
  with the job protocol's claim statements (`pgpool.sql.jobs`), run by the worker's own
  `pgpool.worker.main.run_job` (so `pgpool.current_job` works and an exception fails the
  attempt), its next state decided by the completer's `pgpool.host.completer.decide` and
  written with its ack statement (`pgpool.host.completer.ack_statement`). The rows it leaves
  are those a ``pgpool run --burst`` leaves: done jobs deleted, failed ones scheduled for
  their retry or moved to ``pgpool_dead``, with the same error text. What it does not do:
  enforce handler timeouts, cap memory, or name the job in what a handler prints.
- `run_handler`: one call of a handler, with `pgpool.current_job` saying what it is told,
  and no database; it returns what the handler returned and what it enqueued through its
  job (`HandlerRun`), as its success would write it.

The pytest fixtures that give a test a migrated schema (``pgpool_conn``, ``pgpool_dsn``,
``pgpool_aconn``) are `pgpool.testing.plugin`'s.
"""

from __future__ import annotations

import inspect
import math
import os
import secrets
import socket
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson
import psycopg
from psycopg.rows import tuple_row

from .. import names, registry
from ..enqueue import encode_payload, schema_required
from ..errors import GroupNotFound, HandlerError
from ..host.attempt import AttemptEnd, Job
from ..host.claimer import RawJsonLoader
from ..host.completer import (
    RECORDING,
    Ack,
    ack_statement,
    as_kept,
    decide,
    follow_up_groups,
    keep_of,
)
from ..host.config import DEFAULT_MAX_ATTEMPTS
from ..ops import JobState
from ..outcomes import Member
from ..retry import Retry
from ..sql import jobs as sql
from ..sql import testing as tsql
from ..worker import ipc
from ..worker.main import run_job

#: The lease of a job `drain` claims: no heartbeat extends it, and no host's reaper may take
#: the job back while a test's handler runs, however slowly.
LEASE: Final = 3600.0
#: Longest payload shown per job in a failed assertion's message, in characters.
SHOWN_PAYLOAD_CHARS: Final = 300


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """A live job (a row of ``pgpool_jobs``), as `enqueued` reads it.

    ``state`` is ready (due now), scheduled (due later: delayed, or waiting out a retry's
    backoff), running, or parked / done (a host could not write its ack). ``attempts``
    counts its claims so far. ``max_attempts`` is None while the producer left it to the
    handler (the first claim sets it). ``tenant`` is None for a job without one.
    """

    id: int
    kind: str
    queue: str
    payload: dict[str, Any]
    priority: int
    run_at: datetime
    state: JobState
    attempts: int
    max_attempts: int | None
    tenant: str | None
    concurrency_key: str | None
    unique_key: str | None


@dataclass(frozen=True, slots=True)
class Counts:
    """What `drain` did: attempts that succeeded (``done``: the job is deleted), failed with
    attempts left (``retried``: scheduled again after the backoff), or failed for good
    (``dead``: moved to ``pgpool_dead``, its last attempt failed, its handler's
    `pgpool.Retry` does not retry the error, or its payload does not fit the handler's
    type); and what handlers asked for: ``snoozed``
    (`pgpool.Snooze`: scheduled for later, no attempt used), ``discarded`` and
    ``cancelled`` (`pgpool.Discard`, `pgpool.Cancel`: moved to ``pgpool_dead`` with that
    reason)."""

    done: int = 0
    retried: int = 0
    dead: int = 0
    snoozed: int = 0
    discarded: int = 0
    cancelled: int = 0


@dataclass(frozen=True, slots=True)
class FollowUp:
    """A job a handler enqueued through its job (``current_job().enqueue`` or
    ``.enqueue_many``), as `run_handler` reports it: what the attempt's success would
    insert, checked and encoded as `pgpool.enqueue` checks and encodes it (a `pgpool.Handler`
    given as the kind: its defaults applied, its typed payload encoded).

    ``payload`` is the JSON object as stored (a tuple is a list, a dataclass a dict);
    ``run_at`` is timezone-aware (UTC), ``delay`` in seconds (0: none); ``tenant`` is None
    for a job without one. The fields not given compare as `pgpool.enqueue`'s defaults, so
    a test writes only those it asks for: ``FollowUp("email", {"to": 7}, queue="mail")``.
    """

    kind: str
    payload: dict[str, Any]
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None
    delay: float = 0.0
    unique_key: str | None = None
    max_attempts: int | None = None
    tenant: str | None = None
    concurrency_key: str | None = None


@dataclass(frozen=True, slots=True)
class FollowUpGroup:
    """A group a handler started through its job (``current_job().group``), as
    `run_handler` reports it: its ``members`` (jobs of one kind, with the options they
    share) and its callback ``then``, each a `FollowUp`."""

    members: list[FollowUp]
    then: FollowUp


@dataclass(frozen=True, slots=True)
class HandlerRun:
    """What `run_handler` saw a handler do: ``result``, what it returned (as it returned
    it), and what it enqueued through its job, in the order it did: ``enqueued``, the jobs
    (``current_job().enqueue`` and ``.enqueue_many``), and ``groups``
    (``current_job().group``). A worker writes these with the attempt's success, in the
    same transaction as its ack; here nothing is written anywhere."""

    result: Any
    enqueued: list[FollowUp] = field(default_factory=list)
    groups: list[FollowUpGroup] = field(default_factory=list)


#: The `Counts` field of each decision `drain` can meet.
_COUNTED: Final = {"done": "done", "retry": "retried", "dead": "dead", "snooze": "snoozed",
                   "discard": "discarded", "cancel": "cancelled"}
#: `drain(retries=True)`: a failed attempt's retry is due at once (a delay must be above 0).
_AT_ONCE: Final = Retry(base=1e-6, cap=1e-6, jitter=False)


def enqueued(conn: psycopg.Connection, kind: str | None = None) -> list[EnqueuedJob]:
    """The live jobs in ``conn``'s installation, of ``kind`` or of every kind, in id order.
    Jobs that succeeded are gone (deleted), and dead ones are in ``pgpool_dead``, not here.
    """
    with schema_required():
        rows = _cursor(conn).execute(tsql.ENQUEUED, {"kind": kind}).fetchall()
    return [EnqueuedJob(id_, kind_, queue, orjson.loads(payload), priority, run_at, state,
                        attempts, max_attempts, tenant or None, key, unique_key)
            for (id_, kind_, queue, payload, priority, run_at, state, attempts, max_attempts,
                 tenant, key, unique_key) in rows]


def assert_enqueued(conn: psycopg.Connection, kind: str, *, payload: Any = None,
                    queue: str | None = None, tenant: str | None = None,
                    priority: int | None = None, count: int | None = None
                    ) -> list[EnqueuedJob]:
    """Assert that jobs of ``kind`` matching the filters are enqueued: at least one, or
    exactly ``count``; return them. Raise `AssertionError` otherwise, listing the jobs of
    ``kind`` that are there (id, queue, state, payload), or the kinds there are.

    ``payload`` matches a job whose payload has each of its keys with an equal value (a
    subset; compared as JSON, so a tuple matches a list); a filter left None matches any.
    """
    __tracebackhide__ = True
    wanted = _Filter(payload, queue, tenant, priority)
    jobs = enqueued(conn, kind)
    matching = [job for job in jobs if wanted.matches(job)]
    if (len(matching) == count) if count is not None else bool(matching):
        return matching
    expected = ("a job" if count is None
                else f"exactly {count} job{'' if count == 1 else 's'}")
    raise AssertionError(
        f"expected {expected} of kind {kind!r}{wanted.describe()}; found {len(matching)} "
        f"matching. {_listing(conn, kind, jobs)}"
    )


def refute_enqueued(conn: psycopg.Connection, kind: str, *, payload: Any = None,
                    queue: str | None = None, tenant: str | None = None,
                    priority: int | None = None) -> None:
    """Assert that no job of ``kind`` matching the filters (as `assert_enqueued`'s) is
    enqueued; raise `AssertionError` listing those that are otherwise."""
    __tracebackhide__ = True
    wanted = _Filter(payload, queue, tenant, priority)
    matching = [job for job in enqueued(conn, kind) if wanted.matches(job)]
    if matching:
        raise AssertionError(
            f"expected no job of kind {kind!r}{wanted.describe()}; found {len(matching)}:\n"
            + "\n".join(_line(job) for job in matching)
        )


def drain(conn: psycopg.Connection, kinds: str | Iterable[str] | None = None, *,
          queues: str | Iterable[str] | None = None, raise_errors: bool = True,
          retries: bool = False) -> Counts:
    """Run the ready jobs of ``kinds`` (default: every kind with a handler registered in
    this process) in ``queues`` (default: all but the paused ones), one at a time in this
    process, until none is ready; the jobs their handlers enqueue run too, as do scheduled
    jobs once due. Returns how many attempts succeeded, were retried and died.

    Each job runs as a host runs it: claimed (with the handler's ``max_attempts`` when the
    producer gave none), its handler called with `pgpool.current_job` set (a group's
    callback reads its members on ``conn``, never through ``PGPOOL_DSN``), and acked, each
    step committed as it happens (on ``conn``: in its transaction, as savepoints, if one is
    open). A failed attempt with attempts left is scheduled for its retry after the usual
    backoff and not run again by this call; with ``retries=True`` its retry is due at once
    and runs, until the job succeeds or dies. Jobs of kinds with no handler, and jobs
    scheduled for later, are left as they are.

    ``raise_errors=True``: once a failed attempt is recorded, its exception is raised
    again, with its traceback, and nothing more runs. False: it is recorded and the drain
    goes on (a KeyboardInterrupt still stops it).

    Raises `HandlerError` when no handler is registered in this process (import the
    module that defines them first), or none for one of ``kinds``; `pgpool.SchemaError`
    when ``conn`` leads to no pgpool installation.
    """
    handlers = _handlers(kinds)
    keeps = {kind: h.keep for kind, h in handlers.items() if h.keep is not None}
    default = Retry()
    host = _Host(conn, handlers, None if queues is None else set(_names(queues)))
    counts: Counter[str] = Counter()
    ran: set[int] = set()
    while True:
        job = host.claim()
        if job is None:
            # A retry this call scheduled stays for later, as a host would leave it.
            if host.stage(set() if retries else ran):
                continue
            return Counts(**counts)
        ran.add(job.id)
        raised: list[BaseException] = []
        # On the test's connection, a group's callback reads the members the test's
        # transaction holds, never another database's through PGPOOL_DSN.
        result = run_job(handlers, job.wire(), (), raised, conn)
        policy = _AT_ONCE if retries else handlers[job.kind].retry or default
        keep = keep_of(job, keeps, None)
        ack = decide(as_kept(AttemptEnd.of(job, result), keep), policy, keep)
        host.ack(ack)
        counts[_COUNTED[ack.kind]] += 1
        # A failure, not what a handler asked for (a snooze, a discard, a cancel).
        failed = raised and (isinstance(result, ipc.Failed)
                             or (isinstance(result, ipc.Ended) and result.verdict == "final"))
        if failed and (raise_errors or isinstance(raised[0], KeyboardInterrupt)):
            raise raised[0]


def run_handler(kind_or_fn: str | Callable[..., Any], payload: Any, *,
                attempt: int = 1, max_attempts: int | None = None, job_id: int = 1,
                queue: str = "default", members: Iterable[Member] | None = None
                ) -> HandlerRun:
    """Call the handler registered for a kind (or the `pgpool.Handler`, or the function
    decorated as one) with ``payload``, as a worker calls it, without a database: the
    payload checked and encoded as the handler's ``.enqueue`` does (a typed handler takes
    an instance of its payload type or a dict that fits) and decoded as the worker does
    (a tuple arrives as a list, a dataclass as a new instance),
    an ``async def`` handler run to completion, and `pgpool.current_job` giving ``job_id``,
    ``queue``, ``attempt`` and ``max_attempts`` (default: the handler's, else 20).

    ``members``: what ``current_job().group_members()`` returns, for a group's callback
    (`pgpool.Member` objects; each ``result`` goes through JSON, as a stored one does).
    Without it, ``group_members()`` raises `pgpool.GroupNotFound`, as in a job that is not
    a callback; no database is ever read.

    Returns a `HandlerRun`: what the handler returned (``.result``) and what it enqueued
    through its job (``.enqueued``, ``.groups``), checked and encoded as its success would
    write them. Raises what the handler raises (and what it enqueued is dropped, as a
    failed attempt's is). Raises `HandlerError` if no handler is registered for it (import
    its module first) and `pgpool.PayloadError` for a payload `pgpool.enqueue` would
    refuse.
    """
    handler = _handler_of(kind_or_fn)
    max_attempts = max_attempts or handler.max_attempts or DEFAULT_MAX_ATTEMPTS
    if not 1 <= attempt <= max_attempts:
        raise ValueError(f"attempt must be from 1 to max_attempts ({max_attempts}), "
                         f"not {attempt}")
    names.check_name("queue", queue)
    told = None if members is None else _told_members(members)
    fn = handler.fn  # the function itself: what the worker calls drops what it returns
    returned: list[Any] = []

    def call(stored: dict[str, Any]) -> Any:
        result = fn(handler.decode(stored))
        if inspect.iscoroutine(result):  # the worker runs it
            return _kept(result, returned)
        returned.append(result)
        return None

    def read_members(group_id: int) -> list[Member]:
        if told is None:
            raise GroupNotFound(
                f"current_job().group_members(): job {group_id} ({handler.kind}) was run by "
                "run_handler without members=: pass members=[pgpool.Member(id, 'done', "
                "result=...), ...] to run it as a group's callback")
        return list(told)

    job = ipc.WorkItem(job_id, attempt, 0, max_attempts, handler.kind, queue,
                       encode_payload(handler.encode(payload)), math.inf)
    raised: list[BaseException] = []
    ended = run_job({handler.kind: registry.Handler(handler.kind, call)}, job, (), raised,
                    read_members=read_members)
    if raised:
        raise raised[0]
    jobs, groups = (ended.follow if isinstance(ended, ipc.Finished) else None) or ([], [])
    return HandlerRun(returned[0], [_follow_up(params) for params in jobs],
                      [_follow_up_group(params) for params in groups])


def _told_members(members: Iterable[Member]) -> list[Member]:
    """``run_handler``'s ``members=``, as a callback reads them: each result through JSON."""
    told = []
    for i, member in enumerate(members):
        if not isinstance(member, Member):
            raise TypeError(f"members are pgpool.Member(id, state, result=..., error=...) "
                            f"objects, not {type(member).__name__} (members[{i}])")
        try:
            result = _as_json(member.result)
        except orjson.JSONEncodeError as exc:
            raise ValueError(f"members[{i}].result is not JSON-serialisable ({exc}): a "
                             "member's result is what its handler returned, stored as JSON"
                             ) from None
        told.append(Member(member.id, member.state, result, member.error))
    return told


def _follow_up(params: dict[str, Any]) -> FollowUp:
    """A follow-up job from its parameters (`pgpool.worker.followups`: ``run_at`` in
    seconds since the epoch, '' for no tenant, the payload as JSON text)."""
    run_at = params["run_at"]
    return FollowUp(params["kind"], orjson.loads(params["payload"]), params["queue"],
                    params["priority"],
                    None if run_at is None else datetime.fromtimestamp(run_at, UTC),
                    params["delay"] or 0.0, params["unique_key"], params["max_attempts"],
                    params["tenant"] or None, params["concurrency_key"])


def _follow_up_group(params: dict[str, Any]) -> FollowUpGroup:
    """A follow-up group from its parameters (`pgpool.groups.group_params`)."""
    members = [FollowUp(params["kind"], payload, params["queue"], params["priority"],
                        params["run_at"], 0.0, None, params["max_attempts"],
                        params["tenant"] or None, params["concurrency_key"])
               for payload in orjson.loads(params["payloads"])]
    then = FollowUp(params["then_kind"], orjson.loads(params["then_payload"]),
                    params["then_queue"], params["then_priority"], None, 0.0, None,
                    params["then_max_attempts"], params["then_tenant"] or None,
                    params["then_concurrency_key"])
    return FollowUpGroup(members, then)


# --- drain's host -------------------------------------------------------------------------


class _Host:
    """`drain`'s side of the job protocol on ``conn``: one claim, stage or ack at a time,
    as a host of its own (its owner name starts with ``pgpool.testing``)."""

    def __init__(self, conn: psycopg.Connection, handlers: dict[str, registry.Handler[Any]],
                 queues: set[str] | None) -> None:
        self._conn = conn
        self._cursor = _cursor(conn)
        self._queues = queues
        self._owner = f"pgpool.testing:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
        kinds = sorted(handlers)
        #: A claim's parameters but its queues, as `pgpool.host.claimer.Claimer` sends them.
        self._params: dict[str, object] = {
            "kinds": kinds,
            "kind_max_attempts": [handlers[k].max_attempts or DEFAULT_MAX_ATTEMPTS
                                  for k in kinds],
            "owner": self._owner,
            "lease": LEASE,
            "tenant_cap": None,
            "limit": 1,
            **sql.SWEEP,  # one job at a time, from the start
        }
        #: The fair claim's cursor (see `Claimer._fair_order`): the last tenant served.
        self._after = ""

    def claim(self) -> Job | None:
        """Claim the next ready job: the plain claim, then the fair one if that took none
        (as the claimer does while the last fair claim saw nothing needing it); None if
        none is ready."""
        with schema_required():
            queues = [q for (q,) in self._cursor.execute(tsql.QUEUES).fetchall()
                      if self._queues is None or q in self._queues]
            if not queues:
                return None
            params = {**self._params, "queues": queues}
            row = self._one(sql.CLAIM_PLAIN, params) or self._claim_fair(params)
        if row is None:
            return None
        id_, kind, queue, attempt, interruptions, max_attempts, payload, waited = row[:8]
        return Job(id_, kind, queue, attempt, interruptions, max_attempts, payload, None,
                   waited=waited, snoozes=row[10], meta=row[11], group_id=row[12])

    def _claim_fair(self, params: dict[str, object]) -> tuple[Any, ...] | None:
        walked: set[str] = set()
        while True:
            row = self._one(sql.CLAIM, {**params, "after": self._after})
            if row is None or row[8] is None:  # nothing claimed, nor a walk stopped short
                return None
            # The tenant served; with no job, where a walk past many tenants that gave
            # nothing stopped: the next walk goes on from there.
            self._after = row[8]
            if row[0] is not None:
                return row
            if self._after in walked:
                return None
            walked.add(self._after)

    def stage(self, skip: set[int]) -> bool:
        """Make the due scheduled jobs ready but those in ``skip``, as the stager does;
        whether there were any."""
        with schema_required(), self._conn.transaction():
            ids = [i for (i,) in self._cursor.execute(tsql.DUE, {"skip": list(skip)})]
            if not ids:
                return False
            self._cursor.execute(sql.STAGE_DUE, {"ids": ids, "limit": len(ids)})
        return True

    def ack(self, ack: Ack) -> None:
        """Write ``ack`` with the completer's statement (and its follow-up groups)."""
        query, params = ack_statement([ack], self._owner)
        with schema_required(), self._conn.transaction():
            self._cursor.execute(query, params)
            if query in RECORDING:
                row = self._cursor.fetchone()
                assert row is not None  # its final SELECT returns one row
                for group in follow_up_groups([ack], row[-1]):
                    self._cursor.execute(sql.ENQUEUE_GROUP, group)

    def _one(self, query: str, params: dict[str, object]) -> tuple[Any, ...] | None:
        with self._conn.transaction():
            return self._cursor.execute(query, params).fetchone()


async def _kept(coroutine: Coroutine[Any, Any, Any], returned: list[Any]) -> None:
    returned.append(await coroutine)


# --- looking things up --------------------------------------------------------------------


def _cursor(conn: psycopg.Connection) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor on ``conn`` whatever its row factory, with payloads as their JSON text (the
    worker decodes them; a loader the application set on ``conn`` does not apply)."""
    cursor = conn.cursor(row_factory=tuple_row)
    cursor.adapters.register_loader("jsonb", RawJsonLoader)
    return cursor


def _names(names: str | Iterable[str]) -> list[str]:
    return [names] if isinstance(names, str) else list(names)


def _handlers(kinds: str | Iterable[str] | None) -> dict[str, registry.Handler[Any]]:
    handlers = registry.registered()
    if not handlers:
        raise HandlerError("no handler is registered in this process: import the module "
                           "that defines your handlers (with @pgpool.handler) in the test "
                           "before draining")
    if kinds is None:
        return handlers
    wanted = _names(kinds)
    unknown = [k for k in wanted if k not in handlers]
    if unknown:
        raise HandlerError(
            f"no handler is registered for {', '.join(map(repr, unknown))} in this process: "
            f"import the module that defines it (registered: {', '.join(sorted(handlers))})")
    return {k: handlers[k] for k in wanted}


def _handler_of(kind_or_fn: str | Callable[..., Any]) -> registry.Handler[Any]:
    handlers = registry.registered()
    if isinstance(kind_or_fn, registry.Handler):
        kind_or_fn = kind_or_fn.kind
    if isinstance(kind_or_fn, str):
        if kind_or_fn in handlers:
            return handlers[kind_or_fn]
        raise HandlerError(f"no handler is registered for kind {kind_or_fn!r} in this "
                           "process: import the module that defines it")
    for handler in handlers.values():
        if handler.fn is kind_or_fn:
            return handler
    name = getattr(kind_or_fn, "__qualname__", type(kind_or_fn).__name__)
    raise HandlerError(f"{name} is not a registered handler: decorate it with "
                       "@pgpool.handler(kind), or give its kind")


# --- assertions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Filter:
    """What `assert_enqueued` and `refute_enqueued` look for; None matches anything."""

    payload: Any
    queue: str | None
    tenant: str | None
    priority: int | None

    def matches(self, job: EnqueuedJob) -> bool:
        if self.payload is not None:
            subset = _as_json(self.payload)
            if not isinstance(subset, dict) or any(
                    key not in job.payload or job.payload[key] != value
                    for key, value in subset.items()):
                return False
        return ((self.queue is None or job.queue == self.queue)
                and (self.tenant is None or job.tenant == self.tenant)
                and (self.priority is None or job.priority == self.priority))

    def describe(self) -> str:
        parts = [f"{name}={value!r}" for name, value in (
            ("queue", self.queue), ("tenant", self.tenant), ("priority", self.priority))
            if value is not None]
        if self.payload is not None:
            parts.append(f"payload including {_shown(_as_json(self.payload))}")
        return f" with {', '.join(parts)}" if parts else ""


def _as_json(value: Any) -> Any:
    """``value`` as a job's payload holds it: encoded as `pgpool.enqueue` does, decoded."""
    return orjson.loads(orjson.dumps(value))


def _shown(payload: Any) -> str:
    text = orjson.dumps(payload).decode()
    if len(text) > SHOWN_PAYLOAD_CHARS:
        text = text[:SHOWN_PAYLOAD_CHARS] + "... (cut)"
    return text


def _line(job: EnqueuedJob) -> str:
    extra = "".join(f" {name}={value!r}" for name, value in (
        ("tenant", job.tenant), ("concurrency_key", job.concurrency_key),
        ("unique_key", job.unique_key)) if value is not None)
    return (f"  id={job.id} queue={job.queue!r} state={job.state} priority={job.priority}"
            f"{extra} payload={_shown(job.payload)}")


def _listing(conn: psycopg.Connection, kind: str, jobs: list[EnqueuedJob]) -> str:
    """The jobs of ``kind`` there are, or, when there is none, how many of each kind."""
    if jobs:
        return (f"The jobs of kind {kind!r} ({len(jobs)}):\n"
                + "\n".join(_line(job) for job in jobs))
    counts = _cursor(conn).execute(tsql.KIND_COUNTS).fetchall()
    if not counts:
        return "No job of any kind is enqueued."
    there = ", ".join(f"{other!r} ({n})" for other, n in counts)
    return f"No job of kind {kind!r} is enqueued; the kinds enqueued: {there}."
