"""pgpool against a hand-written loop: the same jobs, the same machine, in turns (issue 20).

    python bench/vs_loop.py [--dsn DSN] [--profile noop|cpu] [--job-ms 5] [--jobs N] [--procs 2]
                            [--batch 50] [--pgpool-batch N|auto] [--rounds 2]
                            [--loop transaction|lease] [--checkout DIR] [--pgqueuer] [--json]

Why: issue 20 measures what pgpool costs against the simplest loop one could write
oneself, with targets: a no-op drain at >= 0.8 of the loop's jobs/s; 5 ms CPU jobs at
>= 0.97 of the loop's jobs/s and of procs ÷ job time; PostgreSQL CPU per job <= 1.2x the
loop's. A small VM's speed drifts by up to 20% over minutes, so the two sides take turns
within one run and each figure is compared with the other side's of the same round.

Each round, each side gets ``--jobs`` fresh jobs of the bench's ``--profile`` (``noop``
returns at once; ``cpu`` is a SHA-256 chain calibrated on this host to about ``--job-ms``,
5 ms by default,
`pgpool.bench.profiles`; 40,000 and 2,000 jobs by default), COPY-loaded by
`pgpool.enqueue_many` into the just-vacuumed table of a scratch schema
(`pgpool.bench.scratch`, dropped at the end). Round 1 runs the loop first, round 2 pgpool,
and so on, so that neither always goes first.

- The loop: ``--procs`` processes (this script, `LOOP_PROCESS`), each on its own
  connection, repeating: BEGIN; a pick of ``--batch`` jobs on the ready index, ``SELECT ...
  FOR NO KEY UPDATE SKIP LOCKED`` (`pgpool.bench.queries.PICK_JOBS`); each job run
  in-process as a pgpool worker runs it (``orjson.loads`` of the payload, then the
  registered bench handler); a DELETE of their ids; COMMIT; until the pick comes back
  empty. The issue's "hand-written loop (two processes, a SKIP LOCKED claim of 50 and a
  grouped delete)". With ``--loop lease``, the loop a queue with leases would write
  instead: the claim (`pgpool.bench.queries.LEASE_CLAIM`, an UPDATE of the picked rows to
  running) commits before the jobs run, and the DELETE commits after. Its jobs survive the
  loop's crash, which the one transaction's do not only by rolling back: the two commits
  and the UPDATE are what any lease costs the database, pgpool's included.
- pgpool: a real ``pgpool run --procs P --batch B --burst`` of the bench handlers, its
  claim budget lifted, until it exits 0; ``--pgpool-batch`` (a number, or ``auto``, its
  default sizing) gives it a batch of its own.
- With ``--checkout DIR``, the same ``pgpool run`` of another checkout (a directory with a
  ``pgpool`` package: main before a change, as a git worktree), run from that directory,
  byte-compiled as this one is. Its jobs live in a scratch schema of their own, migrated
  and loaded by that checkout (a subprocess with it on ``PYTHONPATH``), so that an older
  schema never meets this checkout's statements. Issue 34's "main before this issue".
- With ``--pgqueuer``, PgQueuer (``pip install pgqueuer==1.6.0``; not a pgpool dependency):
  bench/pgqueuer_side.py's consumers, two processes of PgQueuer's own runner claiming
  ``--batch``, its tables installed in the scratch schema and the same payloads loaded by
  its producer's batch enqueue.

Timing, the same for both sides and without process start-up: the clock starts when the
first job starts and stops when the last is done. One job in 64 of the profile's payloads
(`pgpool.bench.profiles.LAG_SAMPLE_EVERY`), the first one included, writes its start time
to a file (`pgpool.bench.jobs.STAMPS_ENV`) on either side; the earliest is the start. The
end: a primary key lookup of the last job in claim order every `POLL` s, then, once it is
gone, a count of the jobs left at every poll until there are none. The loop's processes
connect, then wait for a go, as pgpool's dispatcher waits for its workers before it
claims. (So pgpool's first hand-off to a worker, between its first claim and its first
job, is not timed; the loop has none.)

CPU per job, from the first job to the end: PostgreSQL's, every visible ``postgres``
process but the one serving the bench's own lookups (`pgpool.bench.cpu`; n/a when the
server's processes are not visible, and any other local server's count too); the
client's, the loop's processes or the dispatcher and its workers, read from /proc. The
loop's processes keep their connections until the end, so that their server processes'
CPU is still there to read.

For the cpu profile, the job is also timed in this process right before each side's
drain (the median of `JOB_TIMINGS` calls): procs ÷ that time is what the side's processes
could do if claiming cost nothing, and each side's jobs/s is given as a fraction of it.

Per round and side it prints jobs/s and the CPU per job, per round pgpool/loop of jobs/s
and of PostgreSQL CPU per job, then the mean of each ratio against its target and the
command that reproduces the run; ``--json`` prints all of it as one JSON object instead.
A side that fails, makes no progress for `STALL` seconds or leaves jobs behind ends the
run with one line (``vs_loop: error: ...``, exit 1), its processes killed.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import math
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Final, NamedTuple

import drains  # bench/ is on the path: this script's directory
import orjson
import pgqueuer_side
import psycopg
from drains import STALL, ratio, remaining

import pgpool
from pgpool import registry
from pgpool.bench import profiles, queries
from pgpool.bench.ceilings import bare_claim
from pgpool.bench.cpu import cpu_between, postgres_cpu, process_cpu, tree_cpu
from pgpool.bench.jobs import KIND, STAMPS_ENV
from pgpool.bench.options import BenchError
from pgpool.bench.progress import Progress
from pgpool.bench.scratch import expect_empty, scratch_schema, vacuum
from pgpool.cli.command import batch_or_auto
from pgpool.db import dsn as dsnlib
from pgpool.host.claimer import RawJsonLoader

#: Seconds between looks at the last job and the jobs left: the end is seen within this.
POLL: Final = 0.005
#: Calls of the cpu job timed before each drain (the median is reported).
JOB_TIMINGS: Final = 50
#: The sides in the order of odd rounds (even rounds reverse it): the loop and pgpool
#: always, PgQueuer (``--pgqueuer``) and another checkout's pgpool (``--checkout``) when
#: asked for.
SIDES: Final = ("loop", "pgqueuer", "checkout", "pgpool")
#: What ``--checkout``'s subprocess runs, with that checkout's pgpool: ``migrate`` its
#: scratch schema (``PGPOOL_DSN``), or ``load`` the JSON list of payloads on stdin as jobs
#: of the kind its second argument names.
CHECKOUT_SCRIPT: Final = """
import sys, orjson, pgpool, os
from pgpool.db import dsn as dsnlib
with dsnlib.connect(os.environ["PGPOOL_DSN"], autocommit=True) as conn:
    if sys.argv[1] == "migrate":
        pgpool.migrate(conn)
    else:
        pgpool.enqueue_many(conn, sys.argv[2], orjson.loads(sys.stdin.buffer.read()))
"""
#: What each round compares, pgpool's figure over the loop's.
RATIOS: Final = ("jobs_per_s", "postgres_cpu_per_job")
#: ``--jobs`` by profile.
DEFAULT_JOBS: Final = {"noop": 40_000, "cpu": 2_000}
#: The issue's targets: pgpool's jobs/s against the loop's (and, for cpu, against procs ÷
#: job time), at least; its PostgreSQL CPU per job against the loop's, at most.
JOBS_TARGET: Final = {"noop": 0.8, "cpu": 0.97}
#: Issue 34's: cpu jobs shorter than 2 ms at least 0.9 of the loop (the hand-off's cost
#: per job weighs more on them).
SHORT_CPU_JOB_MS: Final = 2.0
SHORT_CPU_TARGET: Final = 0.9
POSTGRES_TARGET: Final = 1.2
#: How the loop commits (``--loop``), as the report names it.
LOOP_CYCLES: Final = {"transaction": "claim, jobs and delete in one transaction",
                      "lease": "the claim committed, then the delete"}
#: The first argument of the loop's processes (this script run again): not for users.
LOOP_PROCESS: Final = "--loop-process"


def main() -> int:
    parser = drains.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: as `pgpool run` resolves it)")
    parser.add_argument("--profile", choices=tuple(DEFAULT_JOBS), default="noop",
                        help="noop returns at once, cpu is a ~5 ms SHA-256 chain (default noop)")
    parser.add_argument("--job-ms", type=_job_ms, default=profiles.CPU_JOB_SECONDS * 1000,
                        help="the cpu profile's job length in ms, calibrated on this host "
                             "(default 5)")
    parser.add_argument("--jobs", type=drains.at_least(1),
                        help="jobs per side and round (default 40000 for noop, 2000 for cpu)")
    parser.add_argument("--procs", type=drains.at_least(1), default=2,
                        help="the loop's processes and pgpool's workers (default 2)")
    parser.add_argument("--batch", type=drains.at_least(1), default=50,
                        help="jobs per claim (default 50)")
    parser.add_argument("--pgpool-batch", type=batch_or_auto,
                        help="pgpool's --batch, a number or auto (default: --batch)")
    parser.add_argument("--rounds", type=drains.at_least(1), default=2, help="(default 2)")
    parser.add_argument("--loop", choices=LOOP_CYCLES, default="transaction",
                        help="the loop's claim and delete in one transaction, or each "
                             "committed (a lease) (default transaction)")
    add_other_sides(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return drains.script_main(parser, run, render)


def checkout_dir(text: str) -> Path:
    path = Path(text).resolve()
    if not (path / "pgpool" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text!r} holds no pgpool package: give a checkout "
                                         "(git worktree add DIR COMMIT)")
    return path


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Every round, in a scratch schema; returns the report as a JSON-ready dict. Raises
    `BenchError` if a side fails, stalls or leaves jobs behind."""
    n = args.jobs or DEFAULT_JOBS[args.profile]
    sides = [side for side in SIDES if side in ("loop", "pgpool")
             or (side == "pgqueuer" and args.pgqueuer)
             or (side == "checkout" and args.checkout)]
    version = pgqueuer_side.version("--pgqueuer") if args.pgqueuer else None
    progress.step(f"calibrating the {args.profile} profile")
    cpu_rounds, _ = profiles.calibrate(args.profile, args.job_ms / 1000)
    payloads = profiles.payloads(args.profile, n, cpu_rounds)
    job = {"do": "cpu", "rounds": cpu_rounds} if args.profile == "cpu" else None
    rounds: list[dict[str, Any]] = []
    with (drains.session(args.dsn, progress) as (server, scratch, conn, tmp),
          contextlib.ExitStack() as stack):
        places = _places(sides, args, scratch.dsn, conn, stack, progress)
        for number in range(1, args.rounds + 1):
            order = sides if number % 2 else sides[::-1]
            figures = {}
            for side in order:
                place = places[side]
                progress.step(f"round {number}, {side}: loading {n:,} jobs")
                last = place.load(payloads)
                progress.step(f"round {number}, {side}: draining them")
                with open(tmp / f"{side}.log", "w+b") as log:
                    figures[side] = drain(place, _side(side, place, args, log), n, last, job,
                                          tmp / f"{side}.stamps")
                progress.step(f"round {number}, {side}: {figures[side]['jobs_per_s']:,.0f} "
                              "jobs/s")
            rounds.append({"round": number, "order": list(order), **figures,
                           "to_loop": {side: _ratios(figures["loop"], figures[side])
                                       for side in sides if side != "loop"}})
    means: dict[str, Any] = {"to_loop": {
        side: {key: _mean(r["to_loop"][side][key] for r in rounds) for key in RATIOS}
        for side in sides if side != "loop"}}
    if job:
        means["to_reference"] = {side: _mean(r[side]["to_reference"] for r in rounds)
                                 for side in sides}
    return {"server": server, "schema": scratch.name,
            "options": {"profile": args.profile, "jobs": n, "procs": args.procs,
                        "batch": args.batch, "pgpool_batch": args.pgpool_batch or args.batch,
                        "rounds": args.rounds, "loop": args.loop,
                        "cpu_job_rounds": cpu_rounds, "job_ms": args.job_ms,
                        "max_claims_per_sec": drains.UNTHROTTLED, "sides": sides,
                        "checkout": args.checkout and describe(args.checkout),
                        "pgqueuer_version": version},
            "rounds": rounds, "mean": means,
            "targets": {"jobs_per_s": _jobs_target(args),
                        "postgres_cpu_per_job": POSTGRES_TARGET},
            "command": _command(args, n)}


class Place(NamedTuple):
    """Where a side's jobs live."""

    #: The scratch schema's DSN, which the side's processes get.
    dsn: str
    #: This script's connection to that schema: its lookups, and loads.
    conn: psycopg.Connection
    #: Its queue's table, as the drive looks at it.
    queue: drains.Queue
    #: Loads the payloads on a vacuumed table; returns the last job's id in claim order.
    load: Callable[[list[dict[str, Any]]], int]


def _places(sides: list[str], args: argparse.Namespace, dsn: str, conn: psycopg.Connection,
            stack: contextlib.ExitStack, progress: Progress) -> dict[str, Place]:
    """Each side's `Place`: the loop's and pgpool's are the scratch schema's pgpool table,
    PgQueuer's its own tables in that schema, another checkout's a schema of its own."""
    def load_pgpool(payloads: list[dict[str, Any]]) -> int:
        vacuum(conn)
        pgpool.enqueue_many(conn, KIND, payloads)
        return drains.last_id(conn)

    shared = Place(dsn, conn, drains.PGPOOL_JOBS, load_pgpool)
    places = {"loop": shared, "pgpool": shared}
    if "pgqueuer" in sides:
        progress.step("installing PgQueuer's tables")
        asyncio.run(pgqueuer_side.install(dsn))

        def load_pgqueuer(payloads: list[dict[str, Any]]) -> int:
            conn.execute(pgqueuer_side.VACUUM_PGQUEUER)
            return pgqueuer_side.enqueue(conn, payloads) + len(payloads) - 1

        places["pgqueuer"] = Place(dsn, conn, pgqueuer_side.PGQUEUER_JOBS, load_pgqueuer)
    if "checkout" in sides:
        places["checkout"] = stack.enter_context(
            checkout_place(args.dsn, args.checkout, progress))
    return places


@contextlib.contextmanager
def checkout_place(cli_dsn: str | None, checkout: Path, progress: Progress
                   ) -> Iterator[Place]:
    """``--checkout``'s `Place`: a scratch schema of its own, migrated and loaded by that
    checkout, so that its statements only ever meet its own schema."""
    base = dsnlib.resolve(cli_dsn)
    with (dsnlib.connect(base, autocommit=True) as admin,
          scratch_schema(admin, base, progress) as scratch):
        # Byte-compiled as this checkout is (`drains.compile_pgpool`): else its every
        # process compiles it at start.
        compileall.compile_dir(checkout / "pgpool", quiet=1)
        _in_checkout(checkout, scratch.dsn, "migrate")
        with dsnlib.connect(scratch.dsn, autocommit=True) as conn:
            def load(payloads: list[dict[str, Any]]) -> int:
                vacuum(conn)
                _in_checkout(checkout, scratch.dsn, "load", orjson.dumps(payloads))
                return drains.last_id(conn)

            yield Place(scratch.dsn, conn, drains.PGPOOL_JOBS, load)


def _in_checkout(checkout: Path, dsn: str, what: str, payloads: bytes = b"") -> None:
    """Run `CHECKOUT_SCRIPT` with ``checkout``'s pgpool: ``migrate``, or ``load`` the
    JSON ``payloads``. `BenchError` with its last line if it fails."""
    done = subprocess.run([sys.executable, "-c", CHECKOUT_SCRIPT, what, KIND], input=payloads,
                          capture_output=True, cwd=checkout,
                          env={**os.environ, "PGPOOL_DSN": dsn, "PYTHONPATH": str(checkout)})
    if done.returncode:
        lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
        raise BenchError(f"the checkout {checkout} could not {what} its schema: {lines[-1]}")


def _side(side: str, place: Place, args: argparse.Namespace, log: IO[bytes]) -> drains.Side:
    """What drains ``side``'s jobs, its processes' output in ``log``."""
    if side == "loop":
        return Loop(place.dsn, args.procs, args.batch, log, args.loop)
    if side == "pgqueuer":
        return pgqueuer_side.PgQueuer(place.conn, place.dsn, args.procs, args.batch, log)
    return drains.Pgpool(place.dsn, args.procs, args.pgpool_batch or args.batch, log,
                         args.checkout if side == "checkout" else None)


def describe(checkout: Path) -> str:
    """The checkout and, where git knows it, its commit."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return f"{checkout} ({done.stdout.strip()})" if done.returncode == 0 else str(checkout)


class Loop:
    """The hand-written loop's processes (`loop_process`), driven through their pipes: a
    `drains.Side`."""

    title = "the loop"
    #: How the errors name one of its processes.
    process = "a loop process"

    def __init__(self, dsn: str, procs: int, batch: int, log: IO[bytes], cycle: str) -> None:
        self.dsn, self.count, self.batch, self.log = dsn, procs, batch, log
        self.cycle = cycle
        self.procs: list[subprocess.Popen[bytes]] = []
        #: Jobs each process ran, by index, once it found nothing more to claim.
        self.ran: dict[int, int] = {}

    def start(self, env: dict[str, str]) -> None:
        """Start the processes; once all are connected, tell them to go."""
        env = {**os.environ, "PGPOOL_DSN": self.dsn, **env}
        for _ in range(self.count):
            self.procs.append(subprocess.Popen(
                [sys.executable, __file__, LOOP_PROCESS, str(self.batch), self.cycle],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env))
        for proc in self.procs:
            self._line(proc, "connecting")
        for proc in self.procs:
            # A process that died meanwhile is named by the next `check`.
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(b"go\n")
                proc.stdin.flush()

    def check(self, conn: psycopg.Connection, claimed: bool) -> None:
        """`BenchError` if a process has exited, or if all of them found nothing to claim
        with jobs left."""
        for proc in self.procs:
            if proc.poll() is not None:
                drains.check_running(proc, self.log, drains.how_far(conn, claimed), self.process)
        waiting = {proc.stdout: i for i, proc in enumerate(self.procs) if i not in self.ran}
        for out in select.select(list(waiting), [], [], 0)[0]:
            line = out.readline()
            if line:  # else it has just exited: the next check says so
                self.ran[waiting[out]] = int(line)
        if len(self.ran) == self.count and (left := remaining(conn)):
            raise BenchError(f"the loop's processes found no job to claim with {left:,} "
                             "jobs left")

    def finish(self, n: int) -> None:
        """Once the jobs are drained: `BenchError` unless every process says how many jobs
        it ran, ``n`` in all, and exits 0 when told to."""
        for i, proc in enumerate(self.procs):
            if i not in self.ran:
                self.ran[i] = int(self._line(proc, "finishing its last batch"))
            proc.stdin.close()  # its cue to disconnect and exit
        for proc in self.procs:
            drains.expect_exit(proc, self.log, self.process)
        if sum(self.ran.values()) != n:
            raise BenchError(f"the loop's processes ran {sum(self.ran.values()):,} jobs, not "
                             f"{n:,}")

    def _line(self, proc: subprocess.Popen[bytes], doing: str) -> bytes:
        """The next line ``proc`` writes; `BenchError` if it exits or takes `STALL`
        seconds first (``doing``: what it was doing)."""
        if not select.select([proc.stdout], [], [], STALL)[0]:
            raise BenchError(f"{self.process} took over {STALL:g}s {doing}")
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            drains.check_running(proc, self.log, f"while {doing}", self.process)
        return line


def drain(place: Place, side: drains.Side, n: int, last: int, job: dict[str, Any] | None,
          stamps: Path) -> dict[str, Any]:
    """Drain the ``n`` jobs just loaded in ``place`` (``last``: the last one's id in claim
    order) with ``side``, its jobs' start times in ``stamps``; its figures. Its processes
    are killed if anything goes wrong. ``job``: the cpu profile's job, timed here first."""
    job_seconds = _time_job(job) if job else None
    stamps.write_bytes(b"")
    with drains.killed_on_exit(side.procs):
        figures = _watch(place, side, stamps, last, n)
        side.finish(n)
    if place.queue is drains.PGPOOL_JOBS:  # PgQueuer's `finish` counts its successes
        expect_empty(place.conn, side.title, 0)
    if job_seconds is not None:
        reference = side.count / job_seconds
        figures |= {"job_seconds": job_seconds, "reference_jobs_per_s": reference,
                    "to_reference": figures["jobs_per_s"] / reference}
    return figures


def _watch(place: Place, side: drains.Side, stamps: Path, last: int,
           n: int) -> dict[str, Any]:
    """Start ``side``, wait for its first job to start, then for the table to be empty;
    the drain's figures: its time, jobs/s and CPU per job."""
    conn, queue = place.conn, place.queue
    launched = time.monotonic()
    side.start({STAMPS_ENV: str(stamps)})
    while not stamps.stat().st_size:
        side.check(conn, claimed=False)
        if time.monotonic() - launched > STALL:
            raise BenchError(f"{side.title} claimed no job within {STALL:g}s of starting")
        time.sleep(POLL)
    roots = [proc.pid for proc in side.procs]
    # pgpool's one root is its dispatcher: its own CPU apart from its workers'. Read
    # after the tree at the start and before it at the end: its window lies within the
    # tree's, so its share never exceeds the whole for a tick counted in one and not the
    # other.
    postgres, client = _server_cpu(conn), tree_cpu(roots)
    dispatcher = process_cpu(roots[0]) if len(roots) == 1 else None
    size, progressed, fewest, last_done = stamps.stat().st_size, time.monotonic(), n, False
    while True:
        time.sleep(POLL)
        # Until the last job in claim order is done, a primary key lookup: a count of the
        # jobs left at every poll would cost PostgreSQL far more.
        last_done = (last_done
                     or drains.marker_states(conn, {"last": last}, queue)["last"] is None)
        if last_done:
            end = time.monotonic()  # a statement sees the table as of its start
            left = remaining(conn, queue)
            if left == 0:
                break
            if left < fewest:
                fewest, progressed = left, end
        # Jobs starting are progress too (one in 64 writes a stamp).
        if (grown := stamps.stat().st_size) > size:
            size, progressed = grown, time.monotonic()
        side.check(conn, claimed=True)
        if time.monotonic() - progressed > STALL:
            raise BenchError(f"{side.title} made no progress for {STALL:g}s "
                             f"({remaining(conn, queue):,} jobs left)")
    postgres_used = cpu_between(postgres, _server_cpu(conn))
    dispatcher_now = process_cpu(roots[0]) if dispatcher is not None else None
    client_used = cpu_between(client, tree_cpu(roots))
    dispatcher_used = None
    if dispatcher is not None and dispatcher_now is not None:
        dispatcher_used = dispatcher_now[0] - dispatcher[0]
    started = min(map(int, stamps.read_bytes().split())) / 1e9  # monotonic_ns, system-wide
    seconds = end - started
    return {"jobs": n, "seconds": seconds, "jobs_per_s": n / seconds,
            "startup_seconds": started - launched,
            "postgres_us_per_job": _per_job(postgres_used, n),
            "client_us_per_job": _per_job(client_used, n),
            "dispatcher_us_per_job": _per_job(dispatcher_used, n)}


def _server_cpu(conn: psycopg.Connection) -> dict[int, float]:
    """`postgres_cpu` without the server process of ``conn``: the bench's own lookups, a
    few every poll, are neither side's cost."""
    cpu = postgres_cpu()
    cpu.pop(conn.info.backend_pid, None)
    return cpu


def _per_job(cpu_seconds: float | None, n: int) -> float | None:
    return None if cpu_seconds is None else cpu_seconds / n * 1e6


def _time_job(job: dict[str, Any]) -> float:
    """Median seconds of `JOB_TIMINGS` calls of the bench handler on ``job``, here."""
    run_job = registry.registered()[KIND].run
    times = []
    for _ in range(JOB_TIMINGS):
        started = time.perf_counter()
        run_job(job)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _ratios(loop: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """A side's figures over the loop's (`RATIOS`), for one round; None where n/a."""
    pg_loop, pg_other = loop["postgres_us_per_job"], other["postgres_us_per_job"]
    return {"jobs_per_s": other["jobs_per_s"] / loop["jobs_per_s"],
            "postgres_cpu_per_job": pg_other / pg_loop if pg_loop and pg_other else None}


def _job_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 10_000:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not a job length in ms (above 0, at "
                                         "most 10000)")
    return value


def _jobs_target(args: argparse.Namespace) -> float:
    if args.profile == "cpu" and args.job_ms < SHORT_CPU_JOB_MS:
        return SHORT_CPU_TARGET
    return JOBS_TARGET[args.profile]


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _command(args: argparse.Namespace, n: int) -> str:
    """The command line that reproduces the run (the DSN stays out: it may hold a
    password)."""
    dsn = " --dsn DSN" if args.dsn else ""
    job_ms = f" --job-ms {args.job_ms:g}" if args.profile == "cpu" else ""
    own = f" --pgpool-batch {args.pgpool_batch}" if args.pgpool_batch else ""
    return (f"python bench/vs_loop.py{dsn} --profile {args.profile}{job_ms} --jobs {n} "
            f"--procs {args.procs} --batch {args.batch}{own} --rounds {args.rounds} "
            f"--loop {args.loop}{other_options(args)}")


def add_other_sides(parser: argparse.ArgumentParser) -> None:
    """``--checkout DIR`` and ``--pgqueuer``: the sides measured beside this checkout's
    pgpool, here and in bench/pickups.py."""
    parser.add_argument("--checkout", type=checkout_dir, metavar="DIR",
                        help="another pgpool checkout to measure beside this one (main "
                             "before a change, as a git worktree)")
    parser.add_argument("--pgqueuer", action="store_true",
                        help="measure PgQueuer too (pip install pgqueuer==1.6.0, and asyncpg "
                             "for bench/pickups.py)")


def other_options(args: argparse.Namespace) -> str:
    """``--checkout`` and ``--pgqueuer`` as a reproducing command line gives them."""
    return ((" --checkout DIR" if args.checkout else "")
            + (" --pgqueuer" if args.pgqueuer else ""))


def other_sides(options: dict[str, Any]) -> list[str]:
    """A report's lines that say what the checkout and PgQueuer sides were, if any."""
    lines = []
    if options["checkout"]:
        lines.append(f"checkout: the pgpool of {options['checkout']}")
    if options["pgqueuer_version"]:
        lines.append(f"pgqueuer: PgQueuer {options['pgqueuer_version']}")
    return lines


def render(report: dict[str, Any]) -> str:
    """The report as text: a line per round and side, a line of ratios per round and side,
    the means against their targets, and the command."""
    s, o, t = report["server"], report["options"], report["targets"]
    lines = [f"pgpool against a hand-written loop ({LOOP_CYCLES[o['loop']]}): {o['jobs']:,} "
             f"{o['profile']} jobs per side and round, {o['procs']} processes each, batch "
             f"{o['batch']}"
             + (f" (pgpool {o['pgpool_batch']})" if o['pgpool_batch'] != o['batch'] else "")
             + "; PostgreSQL "
             f"{s['version']} (fsync={s['fsync']}, "
             f"synchronous_commit={s['synchronous_commit']})"]
    lines += other_sides(o)
    width = max(map(len, o["sides"]))
    for r in report["rounds"]:
        for side in r["order"]:
            f = r[side]
            line = (f"round {r['round']} {side:<{width}}  {f['jobs_per_s']:>9,.0f} jobs/s in "
                    f"{f['seconds']:.2f}s; CPU per job: PostgreSQL "
                    f"{_us(f['postgres_us_per_job'])}, client {_us(f['client_us_per_job'])}")
            if f["dispatcher_us_per_job"] is not None:
                line += f" (dispatcher {_us(f['dispatcher_us_per_job'])})"
            if "to_reference" in f:
                line += (f"; {ratio(f['to_reference'])} of procs ÷ job time "
                         f"({f['reference_jobs_per_s']:,.0f} jobs/s, job "
                         f"{f['job_seconds'] * 1e3:.2f} ms)")
            lines.append(line)
        for side, p in r["to_loop"].items():
            lines.append(f"round {r['round']} {side}/loop: jobs/s {ratio(p['jobs_per_s'])}, "
                         f"PostgreSQL CPU per job {ratio(p['postgres_cpu_per_job'])}")
    for side, m in report["mean"]["to_loop"].items():
        line = (f"mean {side}/loop: jobs/s {ratio(m['jobs_per_s'])}, PostgreSQL CPU per job "
                f"{ratio(m['postgres_cpu_per_job'])}")
        if side == "pgpool":
            line = (f"mean pgpool/loop: jobs/s {ratio(m['jobs_per_s'])} (target >= "
                    f"{t['jobs_per_s']:g}), PostgreSQL CPU per job "
                    f"{ratio(m['postgres_cpu_per_job'])} (target <= "
                    f"{t['postgres_cpu_per_job']:g})")
        lines.append(line)
    if "to_reference" in report["mean"]:
        m = report["mean"]["to_reference"]
        lines.append("mean of procs ÷ job time: " + ", ".join(
            f"{side} {ratio(value)}" + (f" (target >= {t['jobs_per_s']:g})"
                                        if side == "pgpool" else "")
            for side, value in m.items()))
    lines.append(f"reproduce: {report['command']}")
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} µs"


def loop_process(batch: int, cycle: str) -> int:
    """One process of the hand-written loop (``cycle``: `LOOP_CYCLES`), on the DSN in
    ``PGPOOL_DSN``. On its pipes:
    it writes a line once connected and starts at the first line it reads; once a pick
    comes back empty it writes how many jobs it ran, then keeps its connection (whose
    server process's CPU the bench reads at the end) until its stdin closes."""
    run_job = registry.registered()[KIND].run  # what a worker calls
    params = bare_claim("bench-loop", batch)
    with dsnlib.connect(os.environ["PGPOOL_DSN"], autocommit=True) as conn:
        # Payloads as the raw JSON bytes, as pgpool's claimer has them: decoded by orjson
        # per job, as a worker does.
        conn.adapters.register_loader("jsonb", RawJsonLoader)
        print("connected", flush=True)
        sys.stdin.readline()
        ran = 0
        lease = cycle == "lease"
        claim = queries.LEASE_CLAIM if lease else queries.PICK_JOBS
        while True:
            # Autocommit for a lease: the claim commits, then the delete.
            with contextlib.nullcontext() if lease else conn.transaction():
                picked = conn.execute(claim, params).fetchall()
                for _, payload in picked:
                    run_job(orjson.loads(payload))
                if picked:
                    conn.execute(queries.DELETE, {"ids": [id_ for id_, _ in picked]})
            if not picked:
                break
            ran += len(picked)
        print(ran, flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == [LOOP_PROCESS]:
        sys.exit(loop_process(int(sys.argv[2]), sys.argv[3]))
    sys.exit(main())
