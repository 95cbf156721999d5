"""The pages that describe the tree stay true to it: the code map in docs/development.md
names every module and wing, and the README's links lead to files that exist."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

from places import ROOT

import pgpool


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


def _table_rows(page: Path) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in page.read_text().splitlines() if line.startswith("| ")]


def test_the_coming_from_tables_name_what_pgpool_has() -> None:
    # Each `pgpool.<name>` the tables cite exists; and a feature pgpool has since gained is
    # not "no equivalent" any more.
    gained = {"rq.md": ("`depends_on=`", "`on_success=`"),
              "procrastinate.md": ("Django integration",)}
    for page in sorted((ROOT / "docs" / "coming-from").glob("*.md")):
        for theirs, ours in _table_rows(page):
            for name in re.findall(r"`(pgpool(?:\.\w+)+)", ours):
                pkgutil.resolve_name(name)  # raises if it does not exist
            if theirs.startswith(gained.get(page.name, ())):
                assert "no equivalent" not in ours, f"{page.name}: {theirs} has one now"


def test_the_api_reference_names_each_object_as_it_is_imported() -> None:
    # A name importable from pgpool is documented, and anchored, as pgpool.<name>: not under
    # the module that defines it. pgpool.enqueue is also its module's name, which the docs'
    # reader takes for it: that one is given by its module's path, headed pgpool.enqueue.
    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    entries = re.findall(r"^::: (\S+)\n((?: {4}.*\n)*)", page, re.M)
    assert len(entries) > 50
    for identifier, options in entries:
        documented = pkgutil.resolve_name(identifier)
        name = identifier.rpartition(".")[2]
        if identifier != f"pgpool.{name}" and getattr(pgpool, name, None) is documented:
            assert f"heading: pgpool.{name}\n" in options, f"document pgpool.{name}"
        # Guides are linked from the docstrings the reference shows, not named as paths.
        members = getattr(documented, "__dict__", {})
        shown = [documented, *[members[n] for n in members if not n.startswith("_")]]
        for obj in shown:
            assert "docs/" not in (getattr(obj, "__doc__", None) or ""), identifier


def test_the_install_page_opens_with_the_install_command() -> None:
    # The commands first; the platforms' differences after them, at the end of the page.
    page = (ROOT / "docs" / "getting-started" / "install.md").read_text()
    first_block = re.search(r"^```(\w+)\n(.*?)^```$", page, re.M | re.S)
    assert first_block and first_block[1] == "sh" and "pip install" in first_block[2]
    assert first_block.start() < page.index("\n## ") < page.index("## macOS, for development")


#: The longest line of code a page shows: at 1280 px its text column holds about 110
#: characters of code (the table of contents in the navigation: mkdocs.yml). A program's
#: output (```text) is shown as it is printed, and scrolls.
CODE_WIDTH = 100


def test_code_fits_the_text_column() -> None:
    wide = [f"{page.relative_to(ROOT)}: {line[:60]}..."
            for page in sorted((ROOT / "docs").rglob("*.md"))
            for language, code in re.findall(r"^```(\w+)\n(.*?)^```$", page.read_text(),
                                             re.M | re.S)
            if language in ("python", "sh", "sql")
            for line in code.splitlines() if len(line) > CODE_WIDTH]
    assert not wide, f"lines of code wider than {CODE_WIDTH} characters:\n" + "\n".join(wide)
