"""``pgpool db``: the embedded PostgreSQL kept up for an application's development loop.

The embedded server runs while a process holds it (`pgpool.db.embedded`): a ``pgpool
migrate`` or a ``pgpool run --burst`` stops it as it exits, under an application still
using it. ``pgpool db start`` starts a small detached process, the holder (this module run
as ``python -m pgpool.cli.devdb``), that starts the server (or attaches to it) in the same
data directory as every ``pgpool`` command without a DSN, and holds it until ``pgpool db
stop`` signals it: the other commands then attach to that server and leave it up when they
exit. The holder writes its pid and the server's DSN to `STATE` in ``$PGPOOL_HOME``.

``status`` says whether it runs, where, and who else holds it; ``url`` prints its DSN as
psycopg, SQLAlchemy or Django's settings take it; ``psql`` runs psql on it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Final, NamedTuple

from .. import extras
from ..db import dsn as dsnlib
from ..errors import ConfigError, ConnectError

# pgpool.db.embedded is imported by each action once the embedded extra is checked: this
# module is imported whenever the command line is parsed, with or without that extra.

#: In ``$PGPOOL_HOME``: the holder's pid and the server's DSN (JSON), written by the holder
#: once the server is up and removed when it exits; the holder's standard error; and the
#: lock that keeps two ``start`` or ``stop`` from crossing.
STATE: Final = "db.json"
LOG: Final = "db.log"
LOCK: Final = "db.lock"
#: How long ``stop`` waits for the holder, which stops the server with pg_ctl as it exits.
STOP_TIMEOUT: Final = 90.0
#: ``url --format``: the forms of the DSN.
FORMATS: Final = ("psycopg", "sqlalchemy", "django")
#: A DSN's parameters as the settings of a Django database, in Django's order.
DJANGO_SETTINGS: Final = {"dbname": "NAME", "user": "USER", "password": "PASSWORD",
                          "host": "HOST", "port": "PORT"}
#: The holder's command line: this module.
MODULE: Final = "pgpool.cli.devdb"
#: The signals that end the holder.
STOP_SIGNALS: Final = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
NOT_RUNNING: Final = "no development server runs: start one with `pgpool db start`"


class Holder(NamedTuple):
    """A running holder: its pid, and the DSN and data directory of the server it holds."""

    pid: int
    dsn: str
    pgdata: Path


def add_command(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``pgpool db`` and its actions to the ``pgpool`` parser's subcommands ``sub``."""
    db = sub.add_parser("db", parents=[common],
                        help="keep the embedded PostgreSQL up for an application's "
                             "development: start, stop, status, url, psql")
    actions = db.add_subparsers(dest="db_action", required=True, parser_class=type(db),
                                help="what to do")
    start = actions.add_parser("start", parents=[common],
                               help="start the embedded server, kept up until `pgpool db "
                                    "stop`, and print its URL")
    start.set_defaults(func=cmd_start)
    stop = actions.add_parser("stop", parents=[common],
                              help="stop it, even if other pgpool processes use it")
    stop.set_defaults(func=cmd_stop)
    status = actions.add_parser("status", parents=[common],
                                help="say whether it runs (exit 0) or not (exit 1), where, "
                                     "and which pgpool processes hold it")
    status.set_defaults(func=cmd_status)
    url = actions.add_parser("url", parents=[common], help="print its URL")
    url.add_argument("--format", choices=FORMATS, default="psycopg",
                     help="psycopg: a libpq URI, for psycopg, psycopg2, PGPOOL_DSN and "
                          "DATABASE_URL; sqlalchemy: a SQLAlchemy URL on psycopg 3; django: "
                          "a DATABASES setting, HOST being the socket directory (default "
                          "psycopg)")
    url.set_defaults(func=cmd_url)
    psql = actions.add_parser("psql", parents=[common],
                              help="run psql on it (the embedded package's, else the one "
                                   "on PATH)")
    psql.add_argument("psql_args", nargs=argparse.REMAINDER, metavar="-- ARG",
                      help="psql's own arguments, after --, e.g. -- -c 'SELECT 1'")
    psql.set_defaults(func=cmd_psql)


def cmd_start(args: argparse.Namespace) -> int:
    embedded = _embedded()
    home = embedded.home()
    with _locked(home):
        holder = running_holder(home)
        if holder is None:
            holder = _spawn(home, embedded.default_pgdata())
            print(f"pgpool: started the development server in {holder.pgdata} (held by "
                  f"pid {holder.pid} until `pgpool db stop`)", file=sys.stderr)
        else:
            print(f"pgpool: the development server already runs in {holder.pgdata} (held by "
                  f"pid {holder.pid})", file=sys.stderr)
    if dsnlib.configured(None) is not None:
        print("pgpool: notice: PGPOOL_DSN or the PG* environment configures a database, "
              "which pgpool commands here use instead of this server: unset it to use this "
              "one", file=sys.stderr)
    print(holder.dsn)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    embedded = _embedded()
    home = embedded.home()
    with _locked(home):
        holder = running_holder(home)
        if holder is None:
            raise ConfigError(NOT_RUNNING)
        others = [pid for pid in embedded.holders(holder.pgdata) if pid != holder.pid]
        os.kill(holder.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while _alive(holder.pid):  # it stops the server, unless others hold it too
            if time.monotonic() > deadline:
                raise ConnectError(f"the holder (pid {holder.pid}) did not exit within "
                                   f"{STOP_TIMEOUT:g} s: see {home / LOG}")
            time.sleep(0.05)
        if embedded.running(holder.pgdata) is not None:
            embedded.stop(holder.pgdata)
    ended = (f" (pgpool processes {', '.join(map(str, others))} were using it: they lose "
             "their connections)") if others else ""
    print(f"pgpool: stopped the development server in {holder.pgdata}{ended}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    embedded = _embedded()
    home = embedded.home()
    holder = running_holder(home)
    pgdata = embedded.default_pgdata() if holder is None else holder.pgdata
    others = [pid for pid in embedded.holders(pgdata) if holder is None or pid != holder.pid]
    users = ", ".join(map(str, others)) or "none"
    if holder is None:
        dsn = embedded.running(pgdata)
        if dsn is None:
            print(f"development server: not running (`pgpool db start` starts it in {pgdata})")
        else:
            print(f"development server: not running; the embedded server in {pgdata} runs "
                  f"until the last pgpool process holding it exits (now: {users}); `pgpool db "
                  "start` keeps it up")
        return 1
    print(f"development server: running, held by pid {holder.pid} until `pgpool db stop`")
    print(f"data directory: {holder.pgdata}")
    print(f"url: {holder.dsn}")
    print(f"other pgpool processes using it: {users}")
    return 0


def cmd_url(args: argparse.Namespace) -> int:
    holder = running_holder(_embedded().home())
    if holder is None:
        raise ConfigError(NOT_RUNNING)
    print(url(holder.dsn, args.format))
    return 0


def cmd_psql(args: argparse.Namespace) -> int:
    embedded = _embedded()
    holder = running_holder(embedded.home())
    if holder is None:
        raise ConfigError(NOT_RUNNING)
    program = embedded.psql()
    if program is None:
        raise ConfigError(f"no psql found (neither the embedded package's nor on PATH): "
                          f"connect any client to {holder.dsn}")
    given = args.psql_args[1:] if args.psql_args[:1] == ["--"] else args.psql_args
    # Replaced by psql, which then owns the terminal and its Ctrl-C.
    os.execv(program, [program, holder.dsn, *given])


def url(dsn: str, form: str) -> str:
    """The DSN of the server as ``form`` (one of `FORMATS`) takes it."""
    if form == "sqlalchemy":
        return dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    if form == "django":
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(dsn)
        entry = {"ENGINE": "django.db.backends.postgresql",
                 **{setting: params[key] for key, setting in DJANGO_SETTINGS.items()
                    if params.get(key)}}
        return f"DATABASES = {json.dumps({'default': entry}, indent=4)}"
    return dsn


def running_holder(home: Path) -> Holder | None:
    """The holder whose state ``home`` has, if it still runs (a holder killed without
    removing its state, or a pid since reused, is not)."""
    try:
        state = json.loads((home / STATE).read_text())
        holder = Holder(int(state["pid"]), str(state["dsn"]), Path(state["pgdata"]))
    except (OSError, ValueError, KeyError, TypeError):  # none, or not one a holder wrote
        return None
    return holder if _alive(holder.pid) and _is_holder(holder.pid) else None


def hold(pgdata: Path, state: Path) -> None:
    """The holder's life: start (or attach to) the server on ``pgdata``, say so on stdout
    (one JSON line: ``{"pid", "dsn"}``, or ``{"error"}``), write ``state``, and wait for a
    stop signal; then exit, which stops the server unless another process holds it."""
    # Blocked from the start: a stop during the server's start waits for it, then ends it.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        dsn = _embedded().start(pgdata)
    except (ConfigError, ConnectError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return
    _write(state, {"pid": os.getpid(), "dsn": dsn, "pgdata": str(pgdata)})
    print(json.dumps({"pid": os.getpid(), "dsn": dsn}), flush=True)
    # The starting command reads one line and exits: nothing more goes to its pipe.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    try:
        signal.sigwait(STOP_SIGNALS)
    finally:
        state.unlink(missing_ok=True)


def _spawn(home: Path, pgdata: Path) -> Holder:
    """Start a holder of the server on ``pgdata``, with its state in ``home``, detached (a
    session of its own: a terminal's Ctrl-C or hangup does not reach it); its first line
    says how the start went."""
    with open(home / LOG, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", MODULE, str(pgdata), str(home / STATE)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True)
    assert process.stdout is not None
    with process.stdout:
        line = process.stdout.readline()
    try:
        said = json.loads(line)
    except ValueError:
        raise ConnectError(f"the process starting the development server exited (status "
                           f"{process.wait()}): see {home / LOG}") from None
    if "error" in said:
        process.wait()
        raise ConnectError(said["error"])
    return Holder(said["pid"], said["dsn"], pgdata)


@contextmanager
def _locked(home: Path) -> Iterator[None]:
    """Held by ``start`` and ``stop``: two at once would spawn two holders, or stop one
    being spawned."""
    import fcntl

    home.mkdir(parents=True, exist_ok=True)
    with open(home / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _embedded() -> ModuleType:
    """`pgpool.db.embedded`, once the embedded extra is known to be installed (else the
    one-line error naming it)."""
    extras.require("embedded", "pgpool db")
    from ..db import embedded

    return embedded


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _is_holder(pid: int) -> bool:
    import psutil

    try:
        return MODULE in psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON in one step: a reader never sees half of it."""
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(data))
    partial.replace(path)


if __name__ == "__main__":
    hold(Path(sys.argv[1]), Path(sys.argv[2]))
