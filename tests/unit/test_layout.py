"""The tests' layout keeps its two rules: every folder of tests is collected (pyproject's
``testpaths`` names each one, in the order they are handed out), and no two modules share
a name (pytest imports them by name, with no ``__init__.py``; the folders are on the path)."""

from __future__ import annotations

import tomllib
from collections import Counter

from places import ROOT, TESTS

#: The folders with tests that their own make target runs: `make container-test` (podman)
#: and `make web-test` (Chromium).
OWN_TARGET = frozenset({"container", "web/browser"})


def test_every_folder_of_tests_is_collected() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    collected = {path.removeprefix("tests/") for path in options["ini_options"]["testpaths"]}
    folders = {str(p.parent.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")}
    assert folders - OWN_TARGET == collected


def test_no_two_modules_of_tests_share_a_name() -> None:
    # A package's modules (tests/handlers/djangoapp) are named through it.
    names = Counter(p.name for p in TESTS.rglob("*.py")
                    if p.name != "conftest.py" and not (p.parent / "__init__.py").exists())
    assert not [name for name, times in names.items() if times > 1]
