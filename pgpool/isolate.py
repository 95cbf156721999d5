"""Writing a batch so that a row that cannot be written does not stop the others.

The completer's acks and the reaper's returns are written as one statement per batch: fast,
but all-or-nothing. When the database refuses a batch because of one of its rows (an
application's foreign key or trigger, a unique violation, a lock held past
``lock_timeout``), `isolate` bisects it: each half is written on its own, and so on down to
the single rows that still fail. Everything else commits, in ``log2(batch)`` extra
statements per bad row. The caller decides what a rejected row becomes (see
`pgpool.completer` and `pgpool.reaper`: it is parked, visibly).

Only errors about the data start a bisection (`row_error`). Any other failure (the
connection lost, the server restarting, a statement timeout, a missing privilege) would
fail every half too: it stops the pass and is raised as `Interrupted`, which names the
items not yet written, so the caller keeps exactly those and retries them later.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

import psycopg

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


def row_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the database refusing some row of a write (a constraint, a
    trigger, a lock held too long), rather than the connection or the server failing."""
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith(ROW_ERROR_CLASSES) or state in LOCK_ERRORS


def lock_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock wait that gave up (`LOCK_ERRORS`)."""
    return getattr(exc, "sqlstate", None) in LOCK_ERRORS


def describe(exc: BaseException) -> str:
    """``Type (SQLSTATE)``: names an error without its message, which may quote data."""
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__} ({state})" if state else type(exc).__name__


@dataclass
class Isolated(Generic[T, R]):
    """What `isolate` wrote: ``results`` of each committed write, in order, and the
    ``rejected`` items, each with the error it alone still caused."""

    results: list[R] = field(default_factory=list)
    rejected: list[tuple[T, BaseException]] = field(default_factory=list)


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
                  alone: Callable[[T], bool] | None = None) -> Isolated[T, R]:
    """Write ``items`` with ``write`` (one transaction per call), bisecting around the items
    the database refuses (`row_error`); returns what committed and what was rejected.

    Items for which ``alone`` is true are written one per call, after the others: ones
    already known to wait for a lock must not make a whole batch wait again. Raises
    `Interrupted` on any other failure. ``write`` must commit all of its items or none,
    and must be safe to call again for items whose write failed.
    """
    out: Isolated[T, R] = Isolated()
    if alone is None:
        single, batch = [], list(items)
    else:
        single = [item for item in items if alone(item)]
        batch = [item for item in items if not alone(item)]
    # A stack, the last part next: the batch first, then the single items in order.
    todo: list[list[T]] = [[item] for item in reversed(single)] + ([batch] if batch else [])
    while todo:
        part = todo.pop()
        try:
            out.results.append(await write(part))
        except (psycopg.Error, OSError) as exc:
            if not row_error(exc):
                left = [item for rest in (part, *reversed(todo)) for item in rest]
                raise Interrupted(exc, left, out) from exc
            if len(part) == 1:
                out.rejected.append((part[0], exc))
            else:
                mid = len(part) // 2
                todo += [part[mid:], part[:mid]]
    return out
