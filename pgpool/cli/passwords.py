"""A password given on the command line (``--dsn postgresql://u:PASSWORD@...``).

Any user of the host can read a process's arguments (``ps``, ``/proc/PID/cmdline``). The
``pgpool`` command rewrites them as the first thing it does, with every password in a
``--dsn`` value replaced by ``***``, and warns: the password was readable while the
interpreter started, so it belongs in ``PGPOOL_DSN``, ``PGPASSWORD`` or ``~/.pgpass``.

Only the standard library and setproctitle here: this runs before the slow imports.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Final

MASK: Final = "***"

#: The spellings argparse accepts for ``--dsn`` (unique prefixes; ``--d`` is ambiguous with
#: ``enqueue --delay``, so there it is an error anyway, and masking it harmless).
_DSN_OPTIONS: Final = ("--d", "--ds", "--dsn")
#: ``scheme://user:PASSWORD@``: libpq ends the user info at the first ``@`` or ``/``.
_URI_PASSWORD: Final = re.compile(r"^(postgres(?:ql)?://[^:@/]*:)([^@/]+)(?=@)", re.IGNORECASE)
#: ``?password=...`` or ``&password=...`` in a URI's query.
_QUERY_PASSWORD: Final = re.compile(r"([?&]password=)([^&#]+)", re.IGNORECASE)
#: ``password=...`` in a key/value DSN, quoted (backslash escapes) or not.
_KV_PASSWORD: Final = re.compile(
    r"((?:^|\s)password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s'\\]|\\.)+)")


def mask_password(dsn: str) -> str:
    """``dsn`` with any password in it replaced by `MASK` (unchanged if it holds none)."""
    if re.match(r"postgres(?:ql)?://", dsn, re.IGNORECASE):
        dsn = _URI_PASSWORD.sub(lambda m: m[1] + MASK, dsn)
        return _QUERY_PASSWORD.sub(lambda m: m[1] + MASK, dsn)
    return _KV_PASSWORD.sub(lambda m: m[1] + MASK, dsn)


def masked_args(args: Sequence[str]) -> list[str]:
    """``args`` with the password of each ``--dsn`` value masked."""
    out = list(args)
    for i, arg in enumerate(out):
        option, eq, value = arg.partition("=")
        if option not in _DSN_OPTIONS:
            continue
        if eq:
            out[i] = f"{option}={mask_password(value)}"
        elif i + 1 < len(out):
            out[i + 1] = mask_password(out[i + 1])
    return out


def hide_passwords() -> None:
    """If a ``--dsn`` argument of this process holds a password, rewrite the process's
    command line without it (what ``ps`` shows) and warn on stderr."""
    args = sys.argv[1:]
    masked = masked_args(args)
    if masked == args:
        return
    from setproctitle import setproctitle

    setproctitle(" ".join(["pgpool", *masked]))
    print("pgpool: warning: --dsn holds a password, which other users of this host can read "
          "in the process list: put the DSN in PGPOOL_DSN, or the password in PGPASSWORD or "
          "~/.pgpass, instead", file=sys.stderr, flush=True)
