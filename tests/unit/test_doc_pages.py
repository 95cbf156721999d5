"""The pages that describe the tree stay true to it: the code map in docs/development.md
names every module and wing, and the README's links lead to files that exist."""

from __future__ import annotations

import re

from places import ROOT


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
