"""`pgpool.db.statements`: a statement converted once runs as psycopg would run it, on a
real server, and what psycopg refuses it refuses too."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from pgpool.db import statements

#: A name used twice, an escaped percent sign, a NULL and an array.
QUERY = ("SELECT %(a)s::int + %(b)s::int * %(a)s::int, 7 %% 3, %(c)s::text IS NULL, "
         "cardinality(%(d)s::int[]), '%%(not)s'")
PARAMS = {"a": 2, "b": 5, "c": None, "d": [1, 2, 3], "unused": object()}


def test_a_name_used_again_keeps_its_number_and_a_double_percent_is_one() -> None:
    query, names = statements.convert(QUERY)
    assert names == ("a", "b", "c", "d")
    assert query == (b"SELECT $1::int + $2::int * $1::int, 7 % 3, $3::text IS NULL, "
                     b"cardinality($4::int[]), '%(not)s'")


def test_a_lone_percent_sign_is_refused_with_what_to_write() -> None:
    with pytest.raises(ValueError, match=r"a lone % at character 9 .* write %% "):
        statements.convert("SELECT 7 % 3")


def test_it_returns_what_psycopg_returns_for_the_same_statement(dsn: str) -> None:
    async def both() -> tuple[list[tuple], list[tuple]]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            ours = await (await statements.execute(conn, QUERY, PARAMS)).fetchall()
            theirs = await (await conn.execute(QUERY, {k: PARAMS[k] for k in "abcd"})
                            ).fetchall()
            again = await (await statements.execute(conn, QUERY, PARAMS, prepare=True)
                           ).fetchall()
        return ours + again, theirs + theirs

    ours, theirs = asyncio.run(both())
    assert ours == theirs == [(12, 1, True, 3, "%(not)s")] * 2


def test_a_missing_parameter_is_named(dsn: str) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await statements.execute(conn, QUERY, {"a": 1})

    with pytest.raises(KeyError, match="'b'"):
        asyncio.run(run())
