"""The rule for kind, queue and schedule names, checked wherever a name comes in: at
registration, at enqueue, on the command line."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Final

from .errors import ConfigError

#: Kinds and queue names: short, printable, no whitespace; safe in logs and process titles.
NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")


def check_name(what: str, value: object) -> str:
    """Validate a kind or queue name; raise `ConfigError` naming the rule otherwise."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ConfigError(
            f"invalid {what} {value!r}: use 1-128 characters from letters, digits and _ . : / -"
            ", starting with a letter, digit or _"
        )
    return value


def name_arg(what: str) -> Callable[[str], str]:
    """`check_name` as an argparse ``type``: a bad name is the parser's one-line error."""
    def parse(text: str) -> str:
        try:
            return check_name(what, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse
