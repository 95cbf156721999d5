"""What a fleet-wide limit (`pgpool.Limit`) costs, and how far a rate overshoots, measured
side by side in one run (issue 36).

    python bench/limits.py [--dsn DSN] [--jobs 40000] [--procs 2] [--batch 50]
                           [--rounds 2] [--rate 200] [--rated-jobs 2000] [--json]

The cost: each round, each variant drains ``--jobs`` fresh no-op bench jobs, COPY-loaded
into the just-vacuumed table of a scratch schema (dropped at the end), with a real
``pgpool run --procs P --batch B --burst``, its claim budget lifted (bench/drains.py). The
variants differ only in the limit the bench kind has, none reached:

- ``unlimited``: none; the plain claim, as every kind without a limit;
- ``concurrency``: ``Limit(concurrency=1_000_000)``: the limited claim, a slot per job;
- ``rate``: ``Limit(rate=100_000, per=1)``: the limited claim, a ring row per job.

They take turns, in a new order each round. Per drain: jobs/s over the host's whole run
(start-up included, the same for all), and the CPU its processes used per job.

The overshoot of a rate: ``--rated-jobs`` no-op jobs of the kind at ``Limit(rate=R,
per=1)`` (``--rate``), each stamping its start in its worker (``time.monotonic_ns()``),
drained by the same host: the most starts in any one-second window, against R. The limit
holds at the claim, on the server's clock; the starts follow the claims by the host's
hand-off, so that is what the excess measures. (A concurrency limit's overshoot is 0 by
construction, held by a unique index: tests/host/test_limited_hosts.py checks it from the
jobs' own times across crashes.)
"""

from __future__ import annotations

import argparse
import bisect
import time
from pathlib import Path
from typing import Any, Final

import psycopg
from drains import (  # bench/ is on the path: this script's directory
    Parser,
    add_drain_options,
    at_least,
    drains_in_turns,
    expect_exit,
    killed_on_exit,
    script_main,
    session,
    start_pgpool_run,
    timed_drain,
)

import pgpool
from pgpool.bench.jobs import KIND, STAMPS_ENV

#: The drains' variants: the limit the bench kind gets (none for ``unlimited``).
VARIANTS: Final = {"unlimited": None, "concurrency": "concurrency:1000000",
                   "rate": "rate:100000/1"}


def main() -> int:
    parser = Parser(description="A limit's cost beside an unlimited kind, and a rate's "
                                "overshoot")
    add_drain_options(parser)
    parser.add_argument("--rate", type=at_least(1), default=200)
    parser.add_argument("--rated-jobs", type=at_least(100), default=2000)
    return script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Any) -> dict[str, Any]:
    with session(args.dsn, progress) as s:
        drains = drains_in_turns(s, list(VARIANTS), args, progress, drain)
        progress.step(f"overshoot: {args.rated_jobs:,} jobs at {args.rate}/s")
        overshoot = rate_overshoot(s.conn, s.scratch.dsn, s.tmp, args)
    return {"server": s.server, "jobs": args.jobs, "procs": args.procs, "batch": args.batch,
            "drains": drains, "overshoot": overshoot,
            "command": (f"python bench/limits.py --jobs {args.jobs} --procs {args.procs} "
                        f"--batch {args.batch} --rounds {args.rounds} --rate {args.rate} "
                        f"--rated-jobs {args.rated_jobs}")}


def drain(conn: psycopg.Connection, dsn: str, tmp: Path, name: str,
          args: argparse.Namespace) -> dict[str, float]:
    """One drain of ``args.jobs`` fresh jobs, the bench kind limited as ``name`` says."""
    limit = VARIANTS[name]
    if limit is None:
        return timed_drain(conn, dsn, tmp / f"{name}.log", args.jobs, args.procs, args.batch)
    return timed_drain(conn, dsn, tmp / f"{name}.log", args.jobs, args.procs, args.batch,
                       ("limitjobs",), PYTHONPATH=str(Path(__file__).parent),
                       PGPOOL_BENCH_LIMIT=limit)


def rate_overshoot(conn: psycopg.Connection, dsn: str, tmp: Path,
                   args: argparse.Namespace) -> dict[str, float]:
    """The most jobs started in any one-second window at ``args.rate`` a second, from the
    workers' stamps, and the drain's seconds."""
    stamps = tmp / "stamps"
    stamps.touch()
    conn.execute("DELETE FROM pgpool_limit_ticks")  # the drains' ring: a ring of its own
    pgpool.enqueue_many(conn, KIND, ({"do": "noop", "stamp": True}
                                     for _ in range(args.rated_jobs)))
    conn.execute("VACUUM ANALYZE pgpool_jobs")
    with open(tmp / "overshoot.log", "w+b") as log:
        started = time.perf_counter()
        host = start_pgpool_run(dsn, args.procs, args.batch, log, ("limitjobs",),
                                PYTHONPATH=str(Path(__file__).parent),
                                PGPOOL_BENCH_LIMIT=f"rate:{args.rate}/1",
                                **{STAMPS_ENV: str(stamps)})
        with killed_on_exit([host]):
            expect_exit(host, log)
        seconds = time.perf_counter() - started
    starts = sorted(int(line) / 1e9 for line in stamps.read_text().split())
    if len(starts) != args.rated_jobs:
        raise SystemExit(f"bench/limits.py: {len(starts)} of {args.rated_jobs} stamped jobs "
                         "started")
    most = max(bisect.bisect_left(starts, t + 1.0) - i for i, t in enumerate(starts))
    return {"rate": args.rate, "jobs": args.rated_jobs, "most_in_a_second": most,
            "seconds": seconds, "ideal_seconds": args.rated_jobs / args.rate - 1}


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['jobs']:,} no-op jobs per drain, --procs {report['procs']} "
             f"--batch {report['batch']}, no limit reached"]
    base = report["drains"]["unlimited"]
    for name, runs in report["drains"].items():
        for i, d in enumerate(runs):
            lines.append(f"  {name:11} round {i + 1}: {d['jobs_per_s']:8,.0f} jobs/s "
                         f"({d['jobs_per_s'] / base[i]['jobs_per_s']:.2f} of unlimited), "
                         f"{d['cpu_us_per_job']:6.1f} µs CPU a job "
                         f"({d['cpu_us_per_job'] - base[i]['cpu_us_per_job']:+.1f})")
    o = report["overshoot"]
    lines.append(f"rate {o['rate']}/s, {o['jobs']:,} jobs: at most {o['most_in_a_second']} "
                 f"started in any second (excess {o['most_in_a_second'] - o['rate']:+d}), "
                 f"drained in {o['seconds']:.1f} s (the rate allows {o['ideal_seconds']:.1f})")
    lines.append(f"to repeat: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
