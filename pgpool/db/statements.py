"""pgpool's long statements, their placeholders converted once.

psycopg turns a query's ``%(name)s`` placeholders into PostgreSQL's ``$1, $2...`` at every
execution, with a regular expression over the whole text, and keeps the result only for
queries of 4,096 characters or fewer (psycopg 3.2 and 3.3; it guards its cache against ORMs'
one-off statements). The host's fair, limited and scoped claims, its acks that record
outcomes and its reaper are longer: each execution parsed them again, 30 to 65 µs of the
dispatcher's CPU a statement, measured (10 µs for a short one, cached).

`execute` converts a statement the first time it sees it and sends it through a raw cursor
(no parsing) with the parameters in order. The cache holds pgpool's own statements only, a
fixed set: never a text built per call.

    text with %(name)s ──convert once──▶ (b"... $1 ... $2", ("name", ...))
    params dict ──in that order──▶ AsyncRawCursor.execute(query, [values], prepare=...)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import psycopg

#: A placeholder, an escaped percent sign, or a percent sign that is neither (an error).
_PERCENT: Final = re.compile(r"%\((\w+)\)s|%%|%")

#: Each statement seen, converted: its text for PostgreSQL and its parameters' names in the
#: order of their numbers.
_converted: dict[str, tuple[bytes, tuple[str, ...]]] = {}


def convert(statement: str) -> tuple[bytes, tuple[str, ...]]:
    """``statement`` with its ``%(name)s`` placeholders numbered ``$1, $2...`` in order of
    first use (a name used again gets its number again) and ``%%`` as ``%``, and the names in
    the order of their numbers. A lone ``%`` is a ValueError, as psycopg's."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            if match.group(0) == "%":
                raise ValueError(f"a lone % at character {match.start()} of a statement: "
                                 "write %% for a percent sign")
            return "%"
        return f"${names.setdefault(name, len(names) + 1)}"

    text = _PERCENT.sub(number, statement)
    return text.encode(), tuple(names)


async def execute(conn: psycopg.AsyncConnection, statement: str,
                  params: Mapping[str, object], *, prepare: bool | None = None
                  ) -> psycopg.AsyncRawCursor:
    """Run ``statement`` (with ``%(name)s`` placeholders, as ``conn.execute`` takes) with
    ``params`` on ``conn``, converted once for all calls: the cursor, as
    ``conn.execute``'s. ``prepare`` as in psycopg. A name missing from ``params`` is a
    KeyError; names the statement does not use are ignored."""
    converted = _converted.get(statement)
    if converted is None:
        converted = _converted[statement] = convert(statement)
    query, names = converted
    cur = psycopg.AsyncRawCursor(conn)
    return await cur.execute(query, [params[name] for name in names], prepare=prepare)
