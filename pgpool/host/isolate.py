"""Writing a batch so that a row that cannot be written does not stop the others.

The completer's acks and the reaper's returns are written as one statement per batch: fast,
but all-or-nothing. When the database refuses a batch because of one of its rows (an
application's foreign key or trigger, a unique violation, a lock held past
``lock_timeout``), `isolate` bisects it: each half is written on its own, and so on down to
the single rows that still fail. Everything else commits, in ``log2(batch)`` extra
statements per bad row. The caller decides what a rejected row becomes (see
`pgpool.host.completer` and `pgpool.host.parts.reaper`: it is parked, visibly).

A batch cancelled by ``statement_timeout`` is bisected too: its rows may each cost a scan
(an application's foreign key to a job on an unindexed column), so that halves fit where
the whole did not. Rows cost about the same, so every later part as large as the one
cancelled is halved before it is tried: a pass pays one timeout per halving, not one per
part. A single row that still runs past the timeout is rejected like one refused on a
lock: the caller tries it again alone a few times before it parks it.

Only errors about the data, its locks and its size start a bisection (`row_error`). Any
other failure (the connection lost, the server restarting, a missing privilege) would fail
every half too: it stops the pass and is raised as `Interrupted`, which names the items
not yet written, so the caller keeps exactly those and retries them later.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

import psycopg

from ..logs import event

T = TypeVar("T")
R = TypeVar("R")

#: SQLSTATE classes about the rows written: 22 data exception, 23 integrity constraint
#: violation (foreign key, unique, check, not null, exclusion), P0 PL/pgSQL (a trigger's
#: RAISE, ASSERT). Class 42 (a missing table or privilege) is deliberately absent: it is
#: about the whole statement, and bisecting it would reject every row.
ROW_ERROR_CLASSES: Final = ("22", "23", "P0")
#: Waits on one row that another transaction holds: ``lock_not_available`` (our
#: ``lock_timeout``) and ``deadlock_detected``. About a row, but maybe only for a while.
LOCK_ERRORS: Final = frozenset({"55P03", "40P01"})
#: ``query_canceled``: the write ran past ``statement_timeout`` (or an operator cancelled
#: it). Maybe about the number of rows, maybe about one slow row, maybe only for a while.
TIMEOUT_ERRORS: Final = frozenset({"57014"})


def row_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the database refusing some row of a write (a constraint, a
    trigger, a lock held too long) or the write running too long, rather than the
    connection or the server failing."""
    state = getattr(exc, "sqlstate", None) or ""
    return (state.startswith(ROW_ERROR_CLASSES) or state in LOCK_ERRORS
            or state in TIMEOUT_ERRORS)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` may pass when its row is tried again, alone: a lock wait that gave
    up (`LOCK_ERRORS`) or the statement timeout (`TIMEOUT_ERRORS`)."""
    return getattr(exc, "sqlstate", None) in LOCK_ERRORS | TIMEOUT_ERRORS


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is a write cancelled by the statement timeout (`TIMEOUT_ERRORS`)."""
    return getattr(exc, "sqlstate", None) in TIMEOUT_ERRORS


def describe(exc: BaseException) -> str:
    """``Type (SQLSTATE)``: names an error without its message, which may quote data."""
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__} ({state})" if state else type(exc).__name__


@dataclass
class Isolated(Generic[T, R]):
    """What `isolate` wrote: ``results`` of each committed write, in order, and the
    ``rejected`` items, each with the error it alone still caused; ``timeouts``, the writes
    the statement timeout cancelled (a sign that a batch costs a scan per row), and
    ``limit``, the most items per write it ended with."""

    results: list[R] = field(default_factory=list)
    rejected: list[tuple[T, BaseException]] = field(default_factory=list)
    timeouts: int = 0
    limit: int | None = None


class Interrupted(Exception):
    """A failure that is not about the rows stopped `isolate`: ``error`` is that failure,
    ``left`` the items not written (committed ones are not among them), ``done`` what was
    written and rejected before it."""

    def __init__(self, error: BaseException, left: list[T], done: Isolated[T, R]) -> None:
        super().__init__(str(error))
        self.error = error
        self.left = left
        self.done = done


async def isolate(items: Sequence[T], write: Callable[[list[T]], Awaitable[R]], *,
                  alone: Callable[[T], bool] | None = None,
                  limit: int | None = None) -> Isolated[T, R]:
    """Write ``items`` with ``write`` (one transaction per call), bisecting around the items
    the database refuses or that make a write run too long (`row_error`); returns what
    committed and what was rejected.

    Items for which ``alone`` is true are written one per call, after the others: ones
    already known to wait for a lock or to run long must not make a whole batch wait
    again. Parts of more than ``limit`` items are halved before they are written; a write
    of n items cancelled by the statement timeout lowers it to n // 2. Raises
    `Interrupted` on any other failure. ``write`` must commit all of its items or none,
    and must be safe to call again for items whose write failed.
    """
    out: Isolated[T, R] = Isolated(limit=limit)
    if alone is None:
        single, batch = [], list(items)
    else:
        single = [item for item in items if alone(item)]
        batch = [item for item in items if not alone(item)]
    # A stack, the last part next: the batch first, then the single items in order.
    todo: list[list[T]] = [[item] for item in reversed(single)] + ([batch] if batch else [])
    while todo:
        part = todo.pop()
        if out.limit is not None and len(part) > out.limit:
            mid = len(part) // 2
            todo += [part[mid:], part[:mid]]
            continue
        try:
            out.results.append(await write(part))
        except (psycopg.Error, OSError) as exc:
            if not row_error(exc):
                left = [item for rest in (part, *reversed(todo)) for item in rest]
                raise Interrupted(exc, left, out) from exc
            if timed_out(exc):
                out.timeouts += 1
                if len(part) > 1:  # not about one row: every part this large would time out
                    out.limit = len(part) // 2
            if len(part) == 1:
                out.rejected.append((part[0], exc))
            else:
                mid = len(part) // 2
                todo += [part[mid:], part[:mid]]
    return out


#: Rows the database refused to write, each with the error it gave.
Refused = list[tuple[T, BaseException]]


async def park(refused: Refused[T], write: Callable[[Refused[T]], Awaitable[list[int]]]
               ) -> tuple[set[int], Refused[tuple[T, BaseException]]]:
    """Park the rows the database refused (the completer's acks, the reaper's returns, the
    stager's stagings), each with its reason: ``write`` is one park statement of a part,
    which returns the ids it parked. Bisected as any write (`isolate`): (the ids parked,
    the rows the database refused to park too, each with that error). A row not parked
    and not refused was taken by another host meanwhile."""
    written = await isolate(refused, write)
    return {job_id for ids in written.results for job_id in ids}, written.rejected


def report_parked(log: logging.Logger, refused: Refused[int], parked: set[int],
                  again: Refused[tuple[int, BaseException]], *, what: str) -> None:
    """Log each job of ``refused`` that `park` parked, and each it could not; ``what`` says
    what the database refused, e.g. "to return it (its lease expired)"."""
    for job_id, exc in refused:
        if job_id in parked:
            event(log, logging.ERROR, "parked",
                  f"job %d: the database refused {what} (%s); parked, see last_error",
                  job_id, describe(exc), job_id=job_id, state="parked", error=describe(exc))
    for (job_id, _), exc in again:
        event(log, logging.ERROR, "park_refused",
              f"job %d: the database refused {what}, and to park it (%s)", job_id,
              describe(exc), job_id=job_id, error=describe(exc))


async def whole_or_bisected(whole: Callable[[], Awaitable[R]],
                            bisected: Callable[[], Awaitable[R]]) -> R:
    """``whole()``, the next batch in one statement; if the database refuses it for a row's
    sake (`row_error`), ``bisected()``, the same batch written by `isolate`. Any other
    error propagates, as does the one that interrupted the bisection: nothing is kept, the
    caller's next pass reads the batch again (the reaper's and the stager's passes)."""
    try:
        return await whole()
    except psycopg.Error as exc:
        if not row_error(exc):
            raise
    try:
        return await bisected()
    except Interrupted as stopped:
        raise stopped.error from None
