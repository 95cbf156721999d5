"""What keeping outcomes costs, beside the plain case, measured in one run (issue 24).

    python bench/outcomes_cost.py [--dsn DSN] [--jobs 40000] [--flushes 200] [--procs 2]
                                  [--batch 50] [--rounds 2] [--json]

The ack flush: ``--flushes`` flushes of 50 acks each (the completer's batch), written with
the statement the completer picks (`pgpool.host.completer.ack_statement`) on jobs made
running by this host beforehand, the variants taking turns flush by flush:

- ``plain``: jobs of a kind that keeps nothing: `sql.ACK_DONE`, as before outcomes existed;
- ``keep``: every job kept (``keep=``), each with a small result: `sql.ACK_OUTCOMES`;
- ``member``: every job a member of one group, kept nothing but its record.

µs per flush, median and p90 of the flushes.

The drains: each round, each variant gets ``--jobs`` fresh no-op bench jobs, COPY-loaded
into the just-vacuumed table of a scratch schema, drained by a real ``pgpool run --procs P
--batch B --burst``: ``plain``, and ``keep`` (``PGPOOL_KEEP_DONE=1h``: every success
recorded in ``pgpool_done``). Jobs/s over the host's whole run and its processes' CPU per
job, variants in a new order each round (as bench/hooks_cost.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Final

import psycopg
from drains import (  # bench/ is on the path: this script's directory
    Parser,
    add_drain_options,
    at_least,
    drains_in_turns,
    script_main,
    session,
    timed_drain,
)

import pgpool
from pgpool.bench import queries
from pgpool.bench.jobs import KIND
from pgpool.bench.options import BenchError
from pgpool.bench.progress import Progress
from pgpool.host.attempt import Job
from pgpool.host.completer import Ack, ack_statement

#: Acks per flush: the completer's batch.
FLUSH: Final = 50
#: The drains' variants: the environment the host gets besides the plain one.
DRAINS: Final = {"plain": {}, "keep": {"PGPOOL_KEEP_DONE": "1h"}}
#: The ack flush's variants.
FLUSHES: Final = ("plain", "keep", "member")
OWNER: Final = "outcomes-cost"


def main() -> int:
    parser = Parser(description="Keeping outcomes' cost beside the plain case")
    add_drain_options(parser)
    parser.add_argument("--flushes", type=at_least(10), default=200)
    return script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    with session(args.dsn, progress) as s:
        progress.step(f"{args.flushes} ack flushes of {FLUSH} per variant")
        flushes = flush_costs(s.conn, args.flushes)
        drains = drains_in_turns(s, list(DRAINS), args, progress, drain)
    return {"server": s.server, "jobs": args.jobs, "procs": args.procs,
            "batch": args.batch, "flush_us": flushes, "drains": drains,
            "command": (f"python bench/outcomes_cost.py --jobs {args.jobs} --flushes "
                        f"{args.flushes} --procs {args.procs} --batch {args.batch} "
                        f"--rounds {args.rounds}")}


def flush_costs(conn: psycopg.Connection, flushes: int) -> dict[str, dict[str, float]]:
    """µs per ack flush of `FLUSH` jobs for each variant: median and p90."""
    group = pgpool.group(conn, KIND, [], then=(KIND, {"do": "noop"}))
    conn.execute("UPDATE pgpool_groups SET total = 2147483647, completed_at = NULL "
                 "WHERE id = %s", (group.id,))
    seconds: dict[str, list[float]] = {name: [] for name in FLUSHES}
    for i in range(flushes):
        for name in FLUSHES[i % 3:] + FLUSHES[:i % 3]:
            acks = running_acks(conn, name)
            query, params = ack_statement(acks, OWNER)
            started = time.perf_counter()
            conn.execute(query, params)
            seconds[name].append(time.perf_counter() - started)
    conn.execute(queries.EMPTY)
    conn.execute("DELETE FROM pgpool_done")
    return {name: {"median": 1e6 * statistics.median(s),
                   "p90": 1e6 * statistics.quantiles(s, n=10)[-1]}
            for name, s in seconds.items()}


def running_acks(conn: psycopg.Connection, variant: str) -> list[Ack]:
    """`FLUSH` jobs enqueued and made running by `OWNER`, and the acks of their success
    as the completer builds them for ``variant``."""
    group_id = None
    if variant == "member":
        group_id = conn.execute("SELECT max(id) FROM pgpool_groups").fetchone()[0]
    rows = conn.execute(
        "INSERT INTO pgpool_jobs (queue, kind, payload, state, attempts, locked_by, "
        "lease_until, group_id) SELECT 'default', %s, '{}', 'running', 1, %s, "
        "now() + interval '1 hour', %s FROM generate_series(1, %s) RETURNING id",
        (KIND, OWNER, group_id, FLUSH)).fetchall()
    acks = []
    for (job_id,) in rows:
        job = Job(job_id, KIND, "default", 1, 0, 20, b"{}", None, group_id=group_id)
        if variant == "keep":
            acks.append(Ack.done(job, 3600.0, b'{"score": 0.5}'))
        else:
            acks.append(Ack.done(job))
    return acks


def drain(conn: psycopg.Connection, dsn: str, tmp: Path, name: str,
          args: argparse.Namespace) -> dict[str, float]:
    """One drain of ``args.jobs`` fresh jobs by a host with the variant's environment
    (`timed_drain`), checking that the keep variant kept every job and the plain none."""
    figures = timed_drain(conn, dsn, tmp / f"{name}.log", args.jobs, args.procs,
                          args.batch, **DRAINS[name])
    kept = conn.execute("SELECT count(*) FROM pgpool_done").fetchone()[0]
    if kept != (args.jobs if name == "keep" else 0):
        raise BenchError(f"the {name} drain kept {kept} of {args.jobs} jobs")
    conn.execute("TRUNCATE pgpool_done")
    return figures


def render(report: dict[str, Any]) -> str:
    f = report["flush_us"]
    base = f["plain"]["median"]
    lines = [f"ack flush of {FLUSH} successes, µs (median, p90), ratio of plain's median:"]
    for name, cost in f.items():
        lines.append(f"  {name:6}: {cost['median']:7.0f} {cost['p90']:7.0f}  "
                     f"({cost['median'] / base:.2f})")
    lines.append(f"drains of {report['jobs']:,} no-op jobs, --procs {report['procs']} "
                 f"--batch {report['batch']}:")
    plain = report["drains"]["plain"]
    for name, runs in report["drains"].items():
        for i, d in enumerate(runs):
            lines.append(f"  {name:5} round {i + 1}: {d['jobs_per_s']:8,.0f} jobs/s "
                         f"({d['jobs_per_s'] / plain[i]['jobs_per_s']:.2f} of plain), "
                         f"{d['cpu_us_per_job']:6.1f} µs CPU a job "
                         f"({d['cpu_us_per_job'] - plain[i]['cpu_us_per_job']:+.1f})")
    lines.append(f"to repeat: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
