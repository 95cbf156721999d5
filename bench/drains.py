"""What the bench scripts that drain jobs with a real ``pgpool run`` share (bench/cliff.py,
bench/vs_loop.py, bench/peers.py): their command lines and one-line errors, a migrated
scratch schema, the ``pgpool run --burst`` subprocess and its checks, what any side of a
drain offers (`Side`), and the queue tables' marker jobs and jobs left (`Queue`).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Final, NamedTuple, NoReturn, Protocol

import psycopg

import pgpool
from pgpool.bench import jobs
from pgpool.bench.options import BenchError
from pgpool.bench.pickup import last_line
from pgpool.bench.progress import Progress
from pgpool.bench.scratch import Scratch, scratch_schema, server_facts
from pgpool.db import dsn as dsnlib
from pgpool.errors import PgpoolError

#: Jobs left: every row is a job not yet done (pgpool deletes a job once it succeeds, and
#: the hand-written loops delete what they ran).
REMAINING: Final = "SELECT count(*) FROM pgpool_jobs"
#: The id the last COPY gave its last job (the table's identity hands out consecutive ids,
#: and nothing else inserts into the scratch schema).
LAST_ID: Final = (
    "SELECT pg_sequence_last_value(pg_get_serial_sequence('pgpool_jobs', 'id')::regclass)"
)
#: The state of each marker job: 'ready' until claimed, NULL once done (deleted).
MARKERS: Final = """
SELECT m.id, j.state
FROM unnest(%(ids)s::bigint[]) AS m(id) LEFT JOIN pgpool_jobs AS j USING (id)
"""


class Queue(NamedTuple):
    """A queue table, as a drain's watch reads it: every row a job not yet done."""

    #: How many jobs are left.
    remaining: str
    #: The state of each job of ``%(ids)s``: (id, state), NULL once done (deleted).
    markers: str
    #: A job's state until it is claimed.
    ready: str


#: pgpool's table, which the hand-written loops drain too.
PGPOOL_JOBS: Final = Queue(REMAINING, MARKERS, "ready")

#: Seconds without progress (or, once drained, without the processes exiting) that fail
#: the run.
STALL: Final = 60.0
#: Seconds between looks at a draining host's progress (`drain_to_exit`).
POLL: Final = 1.0
#: The largest `pgpool run --max-claims-per-sec` accepts: a budget a drain never meets.
UNTHROTTLED: Final = 10_000_000


class Parser(argparse.ArgumentParser):
    """The scripts' command line: a bad option is one line, ``<script>: error: ...``, and
    exit status 2 (argparse would print the usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{script_name(self)}: error: {message}\n")


def script_name(parser: argparse.ArgumentParser) -> str:
    """``cliff`` for bench/cliff.py: how the script names itself in its errors."""
    return Path(parser.prog).stem


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number no less than ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value
    return parse


def count_interval(text: str) -> float:
    """An argparse ``type``: seconds between counts of the jobs left, more than 0 and at most
    half of `STALL` (a stall is noticed at a count)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= STALL / 2:
        raise argparse.ArgumentTypeError(f"{value:g} is not in (0, {STALL / 2:g}]")
    return value


def script_main(parser: Parser,
                run: Callable[[argparse.Namespace, Progress], dict[str, Any]],
                render: Callable[[dict[str, Any]], str]) -> int:
    """Parse the command line (which has ``--json``), run, print the report (as one JSON
    object with ``--json``); the exit status. A failure is one line on stderr, no
    traceback: the run's own checks raise `BenchError`, and the database's errors are the
    user's to act on too."""
    args = parser.parse_args()
    name = script_name(parser)
    try:
        report = run(args, Progress(sys.stderr))
    except (PgpoolError, psycopg.Error) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    print(json.dumps(report) if args.json else render(report))
    return 0


class Session(NamedTuple):
    """Where a script drains its jobs."""

    server: dict[str, str]
    scratch: Scratch
    #: Autocommit, on the scratch schema, migrated.
    conn: psycopg.Connection
    #: A temporary directory for the subprocesses' output.
    tmp: Path


@contextmanager
def session(cli_dsn: str | None, progress: Progress) -> Iterator[Session]:
    """A migrated scratch schema on the database ``--dsn`` names (resolved as `pgpool run`
    resolves it); the schema and the temporary directory are gone on the way out."""
    base = dsnlib.resolve(cli_dsn)
    with (dsnlib.connect(base, autocommit=True) as admin,
          scratch_schema(admin, base, progress) as scratch,
          dsnlib.connect(scratch.dsn, autocommit=True) as conn,
          tempfile.TemporaryDirectory(prefix="pgpool-bench-") as tmp):
        server = server_facts(admin)
        compile_pgpool()
        pgpool.migrate(conn)
        yield Session(server, scratch, conn, Path(tmp))


def compile_pgpool() -> None:
    """Byte-compile the pgpool this script imports (this checkout's, or an older one's on
    PYTHONPATH), so that the hosts it starts load it as an installed wheel's: where
    PYTHONDONTWRITEBYTECODE is set (this project's machines), nothing else writes the .pyc
    files, every host and worker compiles pgpool at each start, and an older checkout
    measured side by side with a compiled one drains slower by that alone (the fair claim
    over 50 tenants looked 1.18 times as fast as its tree before; compiled, 1.0)."""
    compileall.compile_dir(Path(pgpool.__file__).parent, quiet=1)


def with_bench_modules() -> str:
    """A host's PYTHONPATH that also finds the handler modules of bench/ (this directory),
    and still finds first what the caller's PYTHONPATH finds (an older checkout's pgpool,
    to measure it side by side)."""
    return os.pathsep.join(p for p in (str(Path(__file__).parent),
                                       os.environ.get("PYTHONPATH", "")) if p)


@contextmanager
def pinned(dsn: str | None) -> Iterator[None]:
    """With a DSN, a session holding a REPEATABLE READ snapshot open (the xmin horizon
    pinned) until the block ends; with None, nothing."""
    if dsn is None:
        yield
        return
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgpool_jobs")  # takes the snapshot
        yield
        holder.rollback()


def start_pgpool_run(dsn: str, procs: int, batch: int | str, log: IO[bytes],
                     handlers: Iterable[str] = (), *, burst: bool = True,
                     checkout: Path | None = None, **env: str) -> subprocess.Popen[bytes]:
    """``pgpool run --burst`` (without ``burst``: a host that waits for work until it is
    stopped) of the bench jobs on ``dsn``, its claims unthrottled, its output in ``log``,
    with the handler modules ``handlers`` imported too and ``env`` added to its
    environment. ``checkout``: the pgpool of that directory runs instead of the one on
    the path (``python -m`` looks in its working directory first)."""
    # The DSN goes in the environment: `ps` shows a command line to every user.
    env = {**os.environ, "PGPOOL_DSN": dsn, "PGPOOL_LOG_LEVEL": "WARNING", **env}
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    modules = [arg for module in (jobs.__name__, *handlers) for arg in ("--handlers", module)]
    return subprocess.Popen(
        [sys.executable, "-m", "pgpool", "run", *modules,
         "--procs", str(procs), "--batch", str(batch), *(["--burst"] if burst else []),
         "--max-claims-per-sec", str(UNTHROTTLED)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=checkout,
    )


def add_drain_options(parser: Parser) -> None:
    """The options of a script that times drains by variant (bench/hooks_cost.py,
    bench/outcomes_cost.py): ``--dsn``, ``--jobs``, ``--procs``, ``--batch``,
    ``--rounds``, ``--json``."""
    parser.add_argument("--dsn", help="the database (default: as `pgpool run` finds it)")
    parser.add_argument("--jobs", type=at_least(1000), default=40_000)
    parser.add_argument("--procs", type=at_least(1), default=2)
    parser.add_argument("--batch", type=at_least(1), default=50)
    parser.add_argument("--rounds", type=at_least(1), default=2)
    parser.add_argument("--json", action="store_true", help="one JSON object")


def drains_in_turns(s: Session, names: list[str], args: argparse.Namespace,
                    progress: Progress, drain: Callable[..., dict[str, float]]
                    ) -> dict[str, list[dict[str, float]]]:
    """``args.rounds`` rounds of ``drain(conn, dsn, tmp, name, args)`` for each variant of
    ``names``, in a new order each round so that none always runs first (the machine's
    speed drifts): each variant's figures, round by round."""
    drains: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            progress.step(f"round {r + 1}: {name} drain of {args.jobs:,} jobs")
            drains[name].append(drain(s.conn, s.scratch.dsn, s.tmp, name, args))
    return drains


def timed_drain(conn: psycopg.Connection, dsn: str, log_path: Path, jobs_: int, procs: int,
                batch: int, handlers: Iterable[str] = (), tenants: int = 0,
                pin: bool = False, **env: str) -> dict[str, float]:
    """``jobs_`` fresh no-op bench jobs (spread evenly over ``tenants`` tenants, if any),
    COPY-loaded into the just-vacuumed table, drained by `start_pgpool_run` (with
    ``handlers`` and ``env``; with ``pin``, the xmin horizon `pinned` through the drain):
    jobs/s over the host's whole run and its processes' CPU µs per job (this process's
    children's rusage)."""
    for n in range(max(1, tenants)):
        pgpool.enqueue_many(conn, jobs.KIND, ({"do": "noop"} for _ in range(n, jobs_,
                                                                            max(1, tenants))),
                            tenant=f"t{n:03}" if tenants else None)
    conn.execute("VACUUM ANALYZE pgpool_jobs")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "w+b") as log, pinned(dsn if pin else None):
        started = time.perf_counter()
        host = start_pgpool_run(dsn, procs, batch, log, handlers, **env)
        with killed_on_exit([host]):
            drain_to_exit(host, log, conn)
        seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if remaining(conn):
        raise BenchError(f"the drain left {remaining(conn)} jobs (its log: {log_path})")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"jobs_per_s": jobs_ / seconds, "cpu_us_per_job": 1e6 * cpu / jobs_}


#: How the errors name the dispatcher.
PGPOOL_RUN: Final = "`pgpool run`"


class Side(Protocol):
    """What drains the jobs of a round: its processes, started, checked while they work
    and finished (`Pgpool`; `Loop` in bench/vs_loop.py, `PgQueuer` in bench/peers.py)."""

    #: How the errors name it.
    title: str
    #: How many jobs it runs at once (its processes or workers).
    count: int
    #: Its processes, once started (for `killed_on_exit`).
    procs: list[subprocess.Popen[bytes]]

    def start(self, env: dict[str, str]) -> None:
        """Start its processes, with ``env`` added to their environment."""

    def check(self, conn: psycopg.Connection, claimed: bool) -> None:
        """`BenchError` if it has failed (``claimed``: whether it had claimed a job)."""

    def finish(self, n: int) -> None:
        """Once the jobs are drained: `BenchError` unless it ran ``n`` jobs and exits."""


class Pgpool:
    """A real ``pgpool run --burst`` (`start_pgpool_run`; of ``checkout``, if given), a
    `Side`."""

    def __init__(self, dsn: str, procs: int, batch: int | str, log: IO[bytes],
                 checkout: Path | None = None) -> None:
        self.dsn, self.count, self.batch, self.log = dsn, procs, batch, log
        self.checkout = checkout
        self.title = PGPOOL_RUN if checkout is None else f"{PGPOOL_RUN} of {checkout}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, env: dict[str, str]) -> None:
        self.procs.append(start_pgpool_run(self.dsn, self.count, self.batch, self.log,
                                           checkout=self.checkout, **env))

    def check(self, conn: psycopg.Connection, claimed: bool) -> None:
        if self.procs[0].poll() is not None:
            check_running(self.procs[0], self.log, how_far(conn, claimed), self.title)

    def finish(self, n: int) -> None:
        # That it ran all n jobs is `expect_empty`'s to check: a failed job is
        # dead-lettered, not left.
        expect_exit(self.procs[0], self.log, self.title)


def how_far(conn: psycopg.Connection, claimed: bool, queue: Queue = PGPOOL_JOBS) -> str:
    """How far a drain of ``queue`` was, for an error."""
    return (f"with {remaining(conn, queue):,} jobs left" if claimed
            else "before it claimed a job")


def check_running(proc: subprocess.Popen[Any], log: IO[bytes], when: str,
                  title: str = PGPOOL_RUN) -> None:
    """`BenchError` if ``proc`` (``title`` in the message; its output in ``log``) has
    exited (``when``: how far the drain was)."""
    if proc.poll() is not None:
        raise BenchError(f"{title} exited with status {proc.returncode} {when}: "
                         f"{last_line(log)}")


def expect_exit(proc: subprocess.Popen[Any], log: IO[bytes], title: str = PGPOOL_RUN
                ) -> None:
    """Once the jobs are drained: `BenchError` unless ``proc`` (``title`` in the message;
    its output in ``log``) exits 0 within `STALL` seconds."""
    try:
        status = proc.wait(STALL)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{title} did not exit within {STALL:g}s of the jobs being "
                         "drained") from None
    if status != 0:
        raise BenchError(f"{title} exited with status {status}: {last_line(log)}")


def drain_to_exit(proc: subprocess.Popen[Any], log: IO[bytes], conn: psycopg.Connection,
                  title: str = PGPOOL_RUN) -> None:
    """Wait for the burst host ``proc`` to drain the table and exit 0: `BenchError` if no
    job leaves the table for `STALL` seconds, or once none is left, if ``proc`` does not
    exit within `STALL` seconds more (`expect_exit`). A drain may take as long as it
    takes while it moves."""
    left, moved = remaining(conn), time.monotonic()
    while left:
        try:
            proc.wait(POLL)
        except subprocess.TimeoutExpired:
            now_left = remaining(conn)
            if now_left < left:
                left, moved = now_left, time.monotonic()
            elif time.monotonic() - moved > STALL:
                raise BenchError(f"{title} drained no job for {STALL:g}s, {left:,} left "
                                 f"(its log: {log.name})") from None
        else:
            break
    expect_exit(proc, log, title)


@contextmanager
def killed_on_exit(procs: Iterable[subprocess.Popen[Any]]) -> Iterator[None]:
    """Kill (and reap) those of ``procs`` still running on the way out, however it goes."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def marker_states(conn: psycopg.Connection, ids: dict[str, int], queue: Queue = PGPOOL_JOBS
                  ) -> dict[str, str | None]:
    """The state of each marker job (named: id) of ``queue``, by name; None once done."""
    states = dict(conn.execute(queue.markers, {"ids": list(ids.values())}).fetchall())
    return {name: states[i] for name, i in ids.items()}


def remaining(conn: psycopg.Connection, queue: Queue = PGPOOL_JOBS) -> int:
    """How many jobs of ``queue`` are left."""
    return conn.execute(queue.remaining).fetchone()[0]


def last_id(conn: psycopg.Connection) -> int:
    """The id of the last job loaded: the last in claim order of a COPY just made."""
    return conn.execute(LAST_ID).fetchone()[0]


def ratio(value: float | None) -> str:
    """A ratio for the text report, or n/a."""
    return "n/a" if value is None else f"{value:.2f}"
