"""Groups: many jobs and a callback that runs once, after every one of them has finished.

`group` inserts, in the caller's transaction and in one statement (`sql.ENQUEUE_GROUP`):

- the **callback**, a job in state 'waiting' that no host claims, whose id is the group's;
- the **members**, jobs of one kind whose ``group_id`` is that id;
- the group's row in ``pgpool_groups``: how many members it has.

The fan-in is decided by the acks themselves: each statement that finishes members (the
completer's ack, the reaper's burial of an expired last attempt, an operator's cancel)
counts them into their group's row in its own transaction (`pgpool.sql.common.COUNT_MEMBERS`),
and the one that counts the last makes the callback ready. No coordinator, no polling of
members, and whichever process dies at whatever point, a member is counted exactly when its
end is committed. A member that succeeded is recorded in ``pgpool_done`` with what its
handler returned (kept until its group is complete and its callback has finished, or
longer with ``keep=``), and one that died or was cancelled stays in ``pgpool_dead``: the
callback reads them with `pgpool.outcomes.group_members` (or
``current_job().group_members()``).

A handler starts a group the same way through its job (``current_job().group(...)``): the
group is then written with the handler's success, in the ack's transaction, and not at all
if the attempt fails (`pgpool.worker.followups`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from . import hooks
from .enqueue import array_params, encode_payload, prepared_many, schema_required
from .errors import ConfigError
from .job import JobOptions
from .names import check_name
from .registry import Handler
from .sql import jobs as sql

if TYPE_CHECKING:
    import psycopg

__all__ = ["Group", "group", "group_async", "group_params"]

#: The options of a callback (``then_options``): where and how it runs. It has no unique
#: key, and runs as soon as its group has finished.
THEN_OPTIONS: Final = frozenset({"queue", "priority", "max_attempts", "tenant",
                                 "concurrency_key"})


class Group(NamedTuple):
    """A group just enqueued: its id (its callback job's id) and its number of members."""

    id: int
    size: int


def group_params(
    kind: str | Handler[Any],
    payloads: Iterable[Any],
    then: tuple[str | Handler[Any], Any],
    *,
    then_options: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The parameters of `sql.ENQUEUE_GROUP`, checked: the members' as `enqueue_many`
    checks them (``options`` are its: ``queue``, ``priority``, ``run_at``,
    ``max_attempts``, ``tenant``, ``concurrency_key``), and the callback's ``then``, a
    (kind, payload) pair, as `enqueue` checks one job. A `pgpool.Handler` in place of
    either kind applies its defaults and type. The callback runs in the members' queue
    unless ``then_options`` (or its handler) says otherwise. Raises `PayloadError` or
    `ConfigError` before anything is sent."""
    name, payloads, members = _members(kind, payloads, options)
    params = array_params(name, payloads, members)
    then_kind, then_payload = _then(then)
    given = {"queue": members.queue} | dict(then_options or {})
    JobOptions.of(given, allowed=THEN_OPTIONS, what="then_options")  # names, said plainly
    if isinstance(then_kind, Handler):
        then_payload, callback = then_kind.prepare(then_payload, given)
        then_kind = then_kind.kind
        if callback.unique_key is not None:
            raise ConfigError(f"the callback's handler {then_kind!r} has a unique_key: a "
                              "group's callback has none (its group's id is its key)")
    else:
        callback = JobOptions.of(given)
        check_name("kind", then_kind)
    columns = callback.columns()
    return {**params, "then_kind": then_kind, "then_queue": columns["queue"],
            "then_payload": encode_payload(then_payload).decode(),
            "then_priority": columns["priority"], "then_max_attempts": columns["max_attempts"],
            "then_tenant": columns["tenant"], "then_concurrency_key": columns["concurrency_key"]}


def group(
    conn: psycopg.Connection,
    kind: str | Handler[Any],
    payloads: Iterable[Any],
    *,
    then: tuple[str | Handler[Any], Any],
    then_options: dict[str, Any] | None = None,
    **options: Any,
) -> Group:
    """Enqueue a group in ``conn``'s current transaction: one job of ``kind`` per payload,
    and the callback ``then`` = (kind, payload), which runs once every member has finished
    (succeeded, died, or was cancelled). Returns the group: its id, which is the callback
    job's, and its size. A group of no members has its callback ready at once.

    ``options`` apply to every member (those of `enqueue_many`); ``then_options``
    (``queue``, ``priority``, ``max_attempts``, ``tenant``, ``concurrency_key``) to the
    callback, which runs in the members' queue unless it says otherwise. Members have no
    unique key. Raises `PayloadError` or `ConfigError` before anything is sent."""
    params = group_params(kind, payloads, then, then_options=then_options, **options)
    with schema_required():
        row = conn.execute(sql.ENQUEUE_GROUP, params).fetchone()
    return _enqueued(params, row)


async def group_async(
    conn: psycopg.AsyncConnection,
    kind: str | Handler[Any],
    payloads: Iterable[Any],
    *,
    then: tuple[str | Handler[Any], Any],
    then_options: dict[str, Any] | None = None,
    **options: Any,
) -> Group:
    """Async twin of `group`, for a psycopg `AsyncConnection`."""
    params = group_params(kind, payloads, then, then_options=then_options, **options)
    with schema_required():
        row = await (await conn.execute(sql.ENQUEUE_GROUP, params)).fetchone()
    return _enqueued(params, row)


def _enqueued(params: dict[str, Any], row: tuple[Any, ...] | None) -> Group:
    """The group of ``params`` as `sql.ENQUEUE_GROUP` returned it; the hooks told."""
    assert row is not None  # the callback's INSERT always returns its row
    group_id = row[0]
    hooks.enqueued(params["kind"], params["queue"], None, params["total"])
    hooks.enqueued(params["then_kind"], params["then_queue"], group_id, 1)
    return Group(group_id, params["total"])


def _members(kind: str | Handler[Any], payloads: Iterable[Any],
             options: dict[str, Any]) -> tuple[str, Iterable[Any], JobOptions]:
    return prepared_many(kind, payloads, options, what="a group's members")


def _then(then: Any) -> tuple[str | Handler[Any], Any]:
    if not (isinstance(then, tuple) and len(then) == 2
            and isinstance(then[0], str | Handler)):
        raise ConfigError(f"then must be a (kind, payload) pair, the callback's, not "
                          f"{type(then).__name__}: e.g. then=('report.combine', "
                          "{'report_id': 7})")
    return then[0], then[1]
