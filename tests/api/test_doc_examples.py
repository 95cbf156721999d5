"""Every Python example in README.md and docs/ runs, so a renamed argument breaks a test
and not a reader.

Each page is one test: its ```python blocks (and its hidden
``<!-- invisible-code-block: python -->`` set-up) run in order in one namespace, against a
new, migrated schema of its own on the real test server, whose DSN is in ``PGPOOL_DSN`` (as
a ``postgresql://`` URI). The namespace starts with, for the hidden blocks:

- ``conn``: an autocommit psycopg connection to that installation;
- ``dsn``: a DSN leading to it, for set-up that opens its own connections.

A reader sees only the visible blocks, so these run as shown after the page's visible
set-up: none uses a name that only a hidden block (or the namespace above) defines, short
of a function or class a hidden block stands in for, called in a function the page shows
(the reader's own code). Its ```sql blocks run too, on ``conn``, each in a transaction
rolled back afterwards, so the queries users are told to run stay true to the tables.

Handlers, schedules and hooks a page declares are forgotten after it. Blocks that are not
Python or SQL to run are fenced as ``text`` or ``sh``. The one way to leave a Python block
out is ``<!-- skip: next "why" -->``, and it is allowed only where the code is another
library's (the "Coming from" pages); a skip anywhere else fails the page.
"""

from __future__ import annotations

import builtins
import re
import symtable
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import SkipTest
from urllib.parse import quote, urlencode

import psycopg
import pytest
from places import ROOT
from psycopg.conninfo import conninfo_to_dict
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

from pgpool import hooks, registry, schedules

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
#: The pages whose skipped blocks are other libraries' code, shown beside ours.
SKIPS_ALLOWED = ROOT / "docs" / "coming-from"



def _run_sql(example: Example) -> None:
    conn: psycopg.Connection = example.namespace["conn"]
    with conn.transaction():
        conn.execute(example.parsed)
        raise psycopg.Rollback


_sybil = Sybil(parsers=[PythonCodeBlockParser(), CodeBlockParser("sql", _run_sql), SkipParser()])
#: A page's Python blocks and skips only, to read what they define and use.
_python = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


@pytest.fixture
def forget_declarations() -> Any:
    """The handlers, schedules and hooks a page declares are forgotten after it."""
    with registry.isolated(), schedules.isolated(), hooks.isolated():
        yield


def as_uri(dsn: str) -> str:
    """`dsn` as a ``postgresql://`` URI, the form every driver and SQLAlchemy read."""
    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.pop("user", "")), safe="")
    password = parts.pop("password", None)
    if password:
        user += ":" + quote(str(password), safe="")
    database = quote(str(parts.pop("dbname", "")), safe="")
    return f"postgresql://{user}@/{database}?{urlencode(parts, quote_via=quote)}"


@pytest.mark.own_schema
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_run(page: Path, db: psycopg.Connection, dsn: str,
                          forget_declarations: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # A page's visible set-up reads the database from PGPOOL_DSN, as an application would.
    monkeypatch.setenv("PGPOOL_DSN", as_uri(dsn))
    document = _sybil.parse(page)
    document.namespace.update(conn=db, dsn=dsn, __name__="docs_example")
    skipped = 0
    try:
        for example in document.examples():
            try:
                example.evaluate()
            except SkipTest:
                skipped += 1
    finally:
        if document.namespace["conn"] is not db:  # the page's own, from its set-up
            document.namespace["conn"].close()
    if skipped and not page.is_relative_to(SKIPS_ALLOWED):
        pytest.fail(f"{page.relative_to(ROOT)} skips {skipped} example(s): only another "
                    "library's code may be skipped; make ours run")


def test_every_page_with_python_has_examples_the_parser_sees() -> None:
    # A fence the parser does not recognise (```Python, ```py) would silently never run.
    for page in PAGES:
        fences = re.findall(r"^```(\S+)", page.read_text(), re.M)
        odd = {f for f in fences if f.lower() in ("py", "python3", "pycon") or
               (f.lower() == "python" and f != "python")}
        assert not odd, f"{page.relative_to(ROOT)}: fence as ```python, not {odd}"


# What a page's hidden set-up defines is invisible to its reader: a visible block that needs
# one of those names does not run as shown. The namespace the test gives each page counts as
# hidden set-up too.
HARNESS = frozenset({"conn", "dsn"})
#: The symbol tables of comprehensions, which run where they stand (not when called).
_INLINE_SCOPES = frozenset({"listcomp", "setcomp", "dictcomp", "genexpr"})


def _scopes(table: symtable.SymbolTable, deferred: bool = False
            ) -> Iterator[tuple[symtable.SymbolTable, bool]]:
    """Each scope of a block, and whether its code runs only when called (a function)."""
    yield table, deferred
    for child in table.get_children():
        runs_later = deferred or (child.get_type() == "function"
                                  and child.get_name() not in _INLINE_SCOPES)
        yield from _scopes(child, runs_later)


def hidden_names_used(page: Path) -> list[tuple[int, str]]:
    """Each name a visible Python block of `page` uses that only its hidden blocks define,
    with the block's line. A function a visible block defines may call a function or class
    the page does not show (the reader's own code, ``make_thumbnail(...)``), which a hidden
    block stands in for; everything else a visible block uses, it or an earlier visible
    block defines, or it is a builtin. Skipped blocks (another library's code) run nowhere."""
    document = _python.parse(page)
    hidden: set[str] = set(HARNESS)
    stand_ins: set[str] = set()
    shown = set(dir(builtins))
    found: list[tuple[int, str]] = []
    skip_next = False
    for example in document.examples():
        text = document.text[example.start:example.end]
        if not isinstance(example.parsed, str):  # a skip directive
            skip_next = "next" in text
            continue
        if skip_next:
            skip_next = False
            continue
        table = symtable.symtable(example.parsed, str(page), "exec")
        defined = {s.get_name() for s in table.get_symbols()
                   if s.is_assigned() or s.is_imported() or s.is_namespace()}
        if text.startswith("<!--"):
            hidden |= defined - shown
            stand_ins |= {s.get_name() for s in table.get_symbols() if s.is_namespace()}
            continue
        for scope, deferred in _scopes(table):
            for symbol in scope.get_symbols():
                name = symbol.get_name()
                if not symbol.is_referenced() or name in shown or name in defined:
                    continue
                if scope is not table and not symbol.is_global():
                    continue  # a function's own name, or its enclosing function's
                if name in hidden and not (deferred and name in stand_ins):
                    found.append((example.line, name))
        shown |= defined
    return sorted(set(found))


def test_visible_examples_use_no_name_only_hidden_set_up_defines() -> None:
    # Each page's visible blocks run as shown after its visible set-up: a reader who copies
    # them never meets a name that only the test's hidden blocks define.
    found = [f"{page.relative_to(ROOT)}:{line}: {name}"
             for page in PAGES for line, name in hidden_names_used(page)]
    assert not found, ("visible examples use names only hidden set-up defines (define them "
                       "in a visible block):\n" + "\n".join(found))


def test_the_hidden_names_check_tells_set_up_from_stand_ins(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent("""\
        <!-- invisible-code-block: python
        def make_thumbnail(image_id): pass
        order_id = 1001
        -->

        ```python
        import pgpool

        @pgpool.handler("thumbnail")
        def thumbnail(payload: dict) -> None:
            make_thumbnail(payload["image_id"])  # the reader's own code
        ```

        ```python
        pgpool.enqueue(conn, "thumbnail", {"image_id": order_id})
        make_thumbnail(7)
        ```

        <!-- skip: next "another library's code" -->

        ```python
        print(conn, dsn)
        ```

        ```python
        conn = object()
        print(conn, [order_id for _ in range(2)], lambda: dsn)
        ```
        """))
    assert hidden_names_used(page) == [
        (14, "conn"), (14, "make_thumbnail"), (14, "order_id"),
        (25, "dsn"), (25, "order_id")]
