"""Every Python example in README.md and docs/ runs, so a renamed argument breaks a test
and not a reader.

Each page is one test: its ```python blocks (and its hidden
``<!-- invisible-code-block: python -->`` set-up) run in order in one namespace, against a
new, migrated schema of its own on the real test server. The namespace starts with:

- ``conn``: an autocommit psycopg connection to that installation;
- ``dsn``: a DSN leading to it, for examples that open their own connections.

Its ```sql blocks run too, on ``conn``, each in a transaction rolled back afterwards, so the
queries users are told to run stay true to the tables.

Handlers, schedules and hooks a page declares are forgotten after it. Blocks that are not
Python or SQL to run are fenced as ``text`` or ``sh``. The one way to leave a Python block
out is ``<!-- skip: next "why" -->``, and it is allowed only where the code is another
library's (the "Coming from" pages); a skip anywhere else fails the page.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from unittest import SkipTest

import psycopg
import pytest
from places import ROOT
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


@pytest.fixture
def forget_declarations() -> Any:
    """The handlers, schedules and hooks a page declares are forgotten after it."""
    with registry.isolated(), schedules.isolated(), hooks.isolated():
        yield


@pytest.mark.own_schema
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_run(page: Path, db: psycopg.Connection, dsn: str,
                          forget_declarations: None) -> None:
    document = _sybil.parse(page)
    document.namespace.update(conn=db, dsn=dsn, __name__="docs_example")
    skipped = 0
    for example in document.examples():
        try:
            example.evaluate()
        except SkipTest:
            skipped += 1
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
