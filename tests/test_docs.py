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
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

from pgpool import hooks, registry, schedules

ROOT = Path(__file__).parent.parent
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


CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
#: Lines every command's help repeats; the page states them once.
_COMMON_HELP = re.compile(r"^  (-h, --help|--log-level|--log-format) .*\n(^ {20,}.*\n)*", re.M)


def command_helps() -> dict[str, str]:
    """``pgpool ... --help`` of every command and subcommand, as 100 columns wide, without
    the options every command has (the page's "Global options")."""
    import argparse
    import os

    from pgpool.cli.command import build_parser

    os.environ["COLUMNS"] = "100"  # argparse reads it at format time
    found: dict[str, str] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        text = parser.format_help()
        found[path] = _COMMON_HELP.sub("", text).rstrip() if path != "pgpool" else text.rstrip()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")

    walk(build_parser(), "pgpool")
    return found


def test_the_cli_reference_shows_every_commands_help_as_it_is() -> None:
    blocks = dict(re.findall(r"<!-- help: (pgpool[\w -]*?) -->\n```text\n(.*?)\n```",
                             CLI_PAGE.read_text(), re.S))
    for path, text in command_helps().items():
        assert path in blocks, f"{CLI_PAGE.name} has no `<!-- help: {path} -->` block"
        assert blocks[path] == text, f"{CLI_PAGE.name}: the help of `{path}` is now:\n{text}"


def test_the_configuration_page_names_every_variable_pgpool_reads() -> None:
    read = set()
    for source in (ROOT / "pgpool").rglob("*.py"):
        read |= set(re.findall(r"PGPOOL_[A-Z_]+[A-Z]", source.read_text()))
    read.discard("PGPOOL_BENCH_STAMPS")  # set by pgpool bench for the workers it starts
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    assert not {v for v in read if f"`{v}`" not in page}


def test_the_code_map_names_every_module() -> None:
    # A row per module of the API (the top level) and per wing; each wing's row names its
    # modules (the front ends' own folders are described, not listed).
    page = (ROOT / "docs" / "development.md").read_text()
    package = ROOT / "pgpool"
    wings = {f"{p.parent.relative_to(package)}/" for p in package.rglob("__init__.py")
             if p.parent != package and p.parent.parent in (package, package / "host")}
    modules = {p.name for p in package.glob("*.py")}
    for listed in ("host", "host/parts", "worker", "db", "sql", "cli", "testing"):
        modules |= {p.name for p in (package / listed).glob("*.py") if p.name != "__init__.py"}
    missing = {m for m in modules | wings if f"`{m}`" not in page}
    assert not missing, f"the code map in docs/development.md misses {sorted(missing)}"


def test_the_readmes_links_lead_to_files_that_exist() -> None:
    # The site's links are checked by `make docs --strict`; the README is not part of it.
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert local and not [link for link in local if not (ROOT / link).exists()]
