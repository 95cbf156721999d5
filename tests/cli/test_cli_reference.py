"""The command's reference pages stay true to it: docs/reference/cli.md shows each
command's ``--help`` as it is, and docs/reference/configuration.md names every variable
pgpool reads."""

from __future__ import annotations

import re

from places import ROOT

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
