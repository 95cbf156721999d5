"""How fast a host starts, and replaces a worker that died: two figures of issue 34.

    python bench/startup.py [--rounds 10] [--procs 2] [--spare-workers 0,1] [--dsn DSN]
                            [--json]

In a scratch schema (dropped afterwards), each round:

- **start-up**: one job is due; ``pgpool run --burst --procs P`` is started, and the figure
  runs from just before the process is started to the job's handler starting in a worker
  (the handler writes ``time.monotonic_ns()`` to a file, `pgpool.bench.jobs`). It covers
  the interpreter, the imports, the database checks and connections, the workers' own
  start (a fresh interpreter each, importing the handler modules) and the first claim.
  Target: 0.25 s on a warm machine.
- **replacement**: ``pgpool run --burst --procs 1 --spare-workers N`` with one job due,
  which ends its worker process (``os._exit``: a crash) after 6.5 s (as in a host that has
  been up for that long: its spare workers have started), and a second one enqueued once
  the first runs; the figure runs from that crash to the second job's handler starting, in
  the worker that replaced it.
  It covers noticing the death, settling the crashed job, and starting a new worker (with
  no spare: a fresh interpreter importing the handler modules) or taking a spare, and
  handing it the job. Once per ``--spare-workers`` value each round, in turns.
  Target: 50 ms.

It prints the median and the slowest of each over the rounds. Rounds are sequential, on
an otherwise idle machine: the figures are wall-clock times of short events, and a busy
machine inflates them (a 2-core machine running anything else: by 2x or more).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final, cast

import psycopg
from drains import compile_pgpool  # bench/ is on the path: this script's directory

import pgpool
from pgpool.bench.jobs import KIND, STAMPS_ENV
from pgpool.bench.progress import Progress
from pgpool.bench.scratch import scratch_schema
from pgpool.db import dsn as dsnlib
from pgpool.host.pool import SPARES_AFTER

#: How long one host may take to start and drain its jobs before the run fails.
HOST_TIMEOUT: Final = 120.0
TARGETS: Final = {"startup": 0.25, "replacement": 0.050}
#: Seconds the crashing job waits before it ends its worker: the spares have started
#: (`SPARES_AFTER` after the pool's start) and imported their modules.
CRASH_AFTER: Final = SPARES_AFTER + 1.5


def start_host(dsn: str, procs: int, stamps: Path, *options: str) -> subprocess.Popen[str]:
    """Start ``pgpool run --burst`` on ``dsn`` with ``options``."""
    env = {**os.environ, STAMPS_ENV: str(stamps), "PGPOOL_DSN": dsn,
           "PGPOOL_LOG_LEVEL": "WARNING"}
    return subprocess.Popen([sys.executable, "-m", "pgpool", "run", "--burst", "--procs",
                             str(procs), "--handlers", "pgpool.bench.jobs", *options],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def wait_host(host: subprocess.Popen[str]) -> None:
    """Wait for ``host`` to exit 0 (within `HOST_TIMEOUT`)."""
    try:
        _, stderr = host.communicate(timeout=HOST_TIMEOUT)
    except subprocess.TimeoutExpired:
        host.kill()
        host.wait()
        raise SystemExit(f"pgpool: `pgpool run` did not end within {HOST_TIMEOUT:g}s") from None
    # The crashed job's failure is logged at WARNING: only the exit status tells.
    if host.returncode != 0:
        last = (stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"pgpool: `pgpool run` exited with status {host.returncode}: {last}")


def wait_for_stamp(stamps: Path, host: subprocess.Popen[str]) -> None:
    """Wait until a handler has written its start time, or the host has ended."""
    deadline = time.monotonic() + HOST_TIMEOUT
    while not stamps.read_text() and host.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def read_stamps(stamps: Path) -> list[int]:
    """The handlers' start times written so far, in order; the file is emptied."""
    values = [int(line) for line in stamps.read_text().split()]
    stamps.write_text("")
    return values


def startup(conn: psycopg.Connection, dsn: str, procs: int, stamps: Path) -> float:
    """Seconds from exec to the first job's handler starting."""
    pgpool.enqueue(conn, KIND, {"do": "noop", "stamp": True})
    started = time.monotonic_ns()
    wait_host(start_host(dsn, procs, stamps))
    (first,) = read_stamps(stamps)
    return (first - started) / 1e9


def replacement(conn: psycopg.Connection, dsn: str, spares: int, stamps: Path) -> float:
    """Seconds from a worker's crash to the next job's handler starting, with ``spares``
    spare workers."""
    pgpool.enqueue(conn, KIND, {"do": "exit", "stamp": True, "after": CRASH_AFTER})
    host = start_host(dsn, 1, stamps, "--spare-workers", str(spares))
    # The next job only once the crashing one runs: enqueued together, the host's two claim
    # loops could each take one, and the one that answered first would run first.
    wait_for_stamp(stamps, host)
    pgpool.enqueue(conn, KIND, {"do": "noop", "stamp": True})
    wait_host(host)
    crashed, replaced = read_stamps(stamps)
    return (replaced - crashed) / 1e9 - CRASH_AFTER


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds (default 10)")
    parser.add_argument("--procs", type=int, default=2,
                        help="workers of the start-up's host (default 2)")
    parser.add_argument("--spare-workers", default="0,1", metavar="N,...",
                        help="the replacement's --spare-workers values, each timed every "
                             "round (default 0,1)")
    parser.add_argument("--dsn")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.rounds < 1 or args.procs < 1:
        parser.error("--rounds and --procs must be at least 1")
    try:
        spare_counts = [int(n) for n in args.spare_workers.split(",")]
    except ValueError:
        parser.error(f"--spare-workers: {args.spare_workers!r} is not a list of integers")
    base = dsnlib.resolve(args.dsn)
    progress = Progress(sys.stderr)
    startups: list[float] = []
    replacements: dict[int, list[float]] = {n: [] for n in spare_counts}
    with dsnlib.connect(base, autocommit=True) as admin, \
            scratch_schema(admin, base, progress) as scratch, \
            dsnlib.connect(scratch.dsn, autocommit=True) as conn, \
            tempfile.TemporaryDirectory() as tmp:
        compile_pgpool()  # start-up as from an installed wheel, not compiling pgpool
        pgpool.migrate(conn)
        stamps = Path(tmp) / "stamps"
        stamps.write_text("")
        for n in range(1, args.rounds + 1):
            progress.step(f"round {n} of {args.rounds}")
            startups.append(startup(conn, scratch.dsn, args.procs, stamps))
            turn = spare_counts if n % 2 else spare_counts[::-1]
            for spares in turn:
                replacements[spares].append(replacement(conn, scratch.dsn, spares, stamps))
    figures: dict[str, object] = {
        "rounds": args.rounds, "procs": args.procs,
        "startup_s": {"median": statistics.median(startups), "max": max(startups),
                      "target": TARGETS["startup"]},
        "replacement_s": {
            str(spares): {"median": statistics.median(times), "max": max(times),
                          "target": TARGETS["replacement"]}
            for spares, times in replacements.items()},
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{args.rounds} rounds; start-up with --procs {args.procs}, replacement with "
          "--procs 1")
    rows = [("start-up (exec to first job)", figures["startup_s"])]
    rows += [(f"replacement, {spares} spare{'s' * (spares != 1)}",
              cast(dict, figures["replacement_s"])[str(spares)]) for spares in spare_counts]
    for name, f in rows:
        f = cast(dict, f)
        print(f"{name:32s} median {1000 * f['median']:7.1f} ms, slowest "
              f"{1000 * f['max']:7.1f} ms (target {1000 * f['target']:g} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
