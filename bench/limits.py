"""What a fleet-wide limit (`pgpool.Limit`) costs, how far a rate overshoots, and how a rate
per tenant holds with many tenants, measured side by side in one run (issue 36).

    python bench/limits.py [--dsn DSN] [--jobs 40000] [--procs 2] [--batch 50]
                           [--rounds 2] [--variants unlimited,concurrency,...]
                           [--tenants 0] [--rate 200] [--rated-jobs 2000]
                           [--tenant-count 50] [--tenant-rate 10] [--hog 10] [--pin]
                           [--json]

The cost: each round, each variant drains ``--jobs`` fresh no-op bench jobs (spread over
``--tenants`` tenants, if any), COPY-loaded into the just-vacuumed table of a scratch
schema (dropped at the end), with a real ``pgpool run --procs P --batch B --burst``, its
claim budget lifted (bench/drains.py). The variants differ only in the limit the bench
kind has, none reached:

- ``unlimited``: none; the plain claim, as every kind without a limit (the fair claim
  with ``--tenants``);
- ``concurrency``: ``Limit(concurrency=1_000_000)``: the limited claim, a slot per job;
- ``rate``: ``Limit(rate=100_000, per=1)``: the limited claim, a ring row per claim (its
  64 rows each let 1,562 jobs start in a window);
- ``tenant_concurrency``, ``tenant_rate``: the same ``by="tenant"`` (the rate 1,000 a
  second per tenant, and 40,000 jobs over 50 tenants come to a fraction of that): the
  scoped claim, a slot per job and a ring row per tenant a claim meets;
- ``tenant_rate_high``: ``Limit(rate=100_000, per=1, by="tenant")``, the largest rate
  there is, per tenant: each tenant's ring is 64 rows however high the rate.

With ``--pin``, each drain runs behind a pinned xmin horizon (another session holds a
REPEATABLE READ snapshot from its load to its end, so no vacuum removes the rows its claims
leave behind): what a limited kind's claim costs when a long transaction is open.

They take turns, in a new order each round. Per drain: jobs/s over the host's whole run
(start-up included, the same for all), and the CPU its processes used per job.

A rate per tenant with many tenants: ``--tenant-count`` tenants at ``Limit(rate=R,
per=1, by="tenant")`` (``--tenant-rate``), each with 3R jobs but the first, a hog with
``--hog`` times R, drained by the same host; every claim noted on the server (a trigger
on the scratch schema's table records each job's tenant and ``claimed_at``: what the
limit holds). Reported: the largest excess of any tenant in any one-second window (0 or
less: the rate held), and how busy the host kept while tenants waited: of the one-second
windows from the first claim, each tenant's with jobs left at its start, the share in
which that tenant got a claim (1.0: nobody that could go was kept waiting), and the
drain's seconds against the hog's own floor (hog - 1 windows).

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
import math
import time
from pathlib import Path
from typing import Any, Final

import psycopg
from drains import (  # bench/ is on the path: this script's directory
    Parser,
    add_drain_options,
    at_least,
    drain_to_exit,
    drains_in_turns,
    killed_on_exit,
    script_main,
    session,
    start_pgpool_run,
    timed_drain,
    with_bench_modules,
)

import pgpool
from pgpool.bench.jobs import KIND, STAMPS_ENV

#: The drains' variants: the limit the bench kind gets (none for ``unlimited``), in
#: bench/limitjobs.py's notation.
VARIANTS: Final = {"unlimited": None, "concurrency": "concurrency:1000000",
                   "rate": "rate:100000/1", "tenant_concurrency": "concurrency:1000000@tenant",
                   "tenant_rate": "rate:1000/1@tenant",
                   "tenant_rate_high": "rate:100000/1@tenant"}

#: The per-tenant check's claims, noted by a trigger on the scratch schema's pgpool_jobs.
NOTE_CLAIMS: Final = """
CREATE TABLE bench_claims (tenant text, at float8);
CREATE FUNCTION bench_note_claim() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, {schema}, pg_temp AS $$
BEGIN
    INSERT INTO bench_claims VALUES (NEW.tenant, extract(epoch FROM NEW.claimed_at));
    RETURN NULL;
END $$;
CREATE TRIGGER bench_note_claim AFTER UPDATE OF state ON pgpool_jobs FOR EACH ROW
    WHEN (NEW.state = 'running') EXECUTE FUNCTION bench_note_claim()"""


def variants(text: str) -> list[str]:
    """argparse type: ``--variants``, names of `VARIANTS` separated by commas."""
    names = text.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown variant {unknown[0] if unknown else text!r}"
                                         f": give some of {', '.join(VARIANTS)}")
    return names


def main() -> int:
    parser = Parser(description="A limit's cost beside an unlimited kind, a rate's "
                                "overshoot, and a rate per tenant with many tenants")
    add_drain_options(parser)
    parser.add_argument("--variants", type=variants, default=list(VARIANTS))
    parser.add_argument("--tenants", type=at_least(0), default=0)
    parser.add_argument("--rate", type=at_least(1), default=200)
    parser.add_argument("--rated-jobs", type=at_least(100), default=2000)
    parser.add_argument("--tenant-count", type=at_least(2), default=50)
    parser.add_argument("--tenant-rate", type=at_least(1), default=10)
    parser.add_argument("--hog", type=at_least(4), default=10)
    parser.add_argument("--pin", action="store_true",
                        help="each drain behind a pinned xmin horizon")
    return script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Any) -> dict[str, Any]:
    with session(args.dsn, progress) as s:
        drains = drains_in_turns(s, args.variants, args, progress, drain)
        progress.step(f"overshoot: {args.rated_jobs:,} jobs at {args.rate}/s")
        overshoot = rate_overshoot(s.conn, s.scratch.dsn, s.tmp, args)
        progress.step(f"per tenant: {args.tenant_count} tenants at {args.tenant_rate}/s each")
        per_tenant = tenant_rates(s.conn, s.scratch, s.tmp, args)
    return {"server": s.server, "jobs": args.jobs, "procs": args.procs, "batch": args.batch,
            "tenants": args.tenants, "drains": drains, "overshoot": overshoot,
            "per_tenant": per_tenant,
            "command": (f"python bench/limits.py --jobs {args.jobs} --procs {args.procs} "
                        f"--batch {args.batch} --rounds {args.rounds} "
                        f"--variants {','.join(args.variants)} --tenants {args.tenants} "
                        f"--rate {args.rate} --rated-jobs {args.rated_jobs} "
                        f"--tenant-count {args.tenant_count} --tenant-rate "
                        f"{args.tenant_rate} --hog {args.hog}"
                        + (" --pin" if args.pin else ""))}


def drain(conn: psycopg.Connection, dsn: str, tmp: Path, name: str,
          args: argparse.Namespace) -> dict[str, float]:
    """One drain of ``args.jobs`` fresh jobs, the bench kind limited as ``name`` says."""
    limit = VARIANTS[name]
    if limit is None:
        return timed_drain(conn, dsn, tmp / f"{name}.log", args.jobs, args.procs, args.batch,
                           tenants=args.tenants, pin=args.pin)
    return timed_drain(conn, dsn, tmp / f"{name}.log", args.jobs, args.procs, args.batch,
                       ("limitjobs",), tenants=args.tenants, pin=args.pin,
                       PYTHONPATH=with_bench_modules(), PGPOOL_BENCH_LIMIT=limit)


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
                                PYTHONPATH=with_bench_modules(),
                                PGPOOL_BENCH_LIMIT=f"rate:{args.rate}/1",
                                **{STAMPS_ENV: str(stamps)})
        with killed_on_exit([host]):
            drain_to_exit(host, log, conn)
        seconds = time.perf_counter() - started
    starts = sorted(int(line) / 1e9 for line in stamps.read_text().split())
    if len(starts) != args.rated_jobs:
        raise SystemExit(f"bench/limits.py: {len(starts)} of {args.rated_jobs} stamped jobs "
                         "started")
    most = max(bisect.bisect_left(starts, t + 1.0) - i for i, t in enumerate(starts))
    return {"rate": args.rate, "jobs": args.rated_jobs, "most_in_a_second": most,
            # The last window opens ceil(N / R) - 1 seconds after the first.
            "seconds": seconds, "ideal_seconds": math.ceil(args.rated_jobs / args.rate) - 1}


def tenant_rates(conn: psycopg.Connection, scratch: Any, tmp: Path,
                 args: argparse.Namespace) -> dict[str, float]:
    """``args.tenant_count`` tenants at ``args.tenant_rate`` a second each, the first with
    ``args.hog`` windows' worth of jobs and the others with three: the largest excess of
    any tenant in any one-second window, and how busy the drain kept (see the module's
    docstring)."""
    rate, count = args.tenant_rate, args.tenant_count
    conn.execute(NOTE_CLAIMS.format(schema=scratch.name))
    try:
        for n in range(count):
            pgpool.enqueue_many(conn, KIND, ({"do": "noop"} for _ in range(
                rate * (args.hog if n == 0 else 3))), tenant=f"t{n:03}")
        conn.execute("VACUUM ANALYZE pgpool_jobs")
        with open(tmp / "per_tenant.log", "w+b") as log:
            started = time.perf_counter()
            host = start_pgpool_run(scratch.dsn, args.procs, args.batch, log, ("limitjobs",),
                                    PYTHONPATH=with_bench_modules(),
                                    PGPOOL_BENCH_LIMIT=f"rate:{rate}/1@tenant")
            with killed_on_exit([host]):
                drain_to_exit(host, log, conn)
            seconds = time.perf_counter() - started
        claims: dict[str, list[float]] = {}
        for tenant, at in conn.execute("SELECT tenant, at FROM bench_claims ORDER BY at"):
            claims.setdefault(tenant, []).append(at)
    finally:
        conn.execute("DROP TABLE bench_claims; DROP FUNCTION bench_note_claim() CASCADE")
    jobs_ = rate * (args.hog + 3 * (count - 1))
    if sum(map(len, claims.values())) != jobs_:
        raise SystemExit(f"bench/limits.py: {sum(map(len, claims.values()))} claims of "
                         f"{jobs_} per-tenant jobs")
    excess = max(bisect.bisect_left(at, t + 1.0) - i - rate
                 for at in claims.values() for i, t in enumerate(at))
    first = min(at[0] for at in claims.values())
    last = max(at[-1] for at in claims.values())
    waited = served = 0
    for at in claims.values():
        for k in range(math.ceil(last - first) + 1):  # the windows [first + k, first + k + 1)
            start = first + k
            if at[-1] >= start:  # jobs left at the window's start
                waited += 1
                served += bisect.bisect_left(at, start + 1) > bisect.bisect_left(at, start)
    return {"tenants": count, "rate": rate, "jobs": jobs_, "largest_excess": excess,
            "served_while_waiting": served / waited, "claims_seconds": last - first,
            "floor_seconds": args.hog - 1, "seconds": seconds}


def render(report: dict[str, Any]) -> str:
    spread = f" over {report['tenants']} tenants" if report["tenants"] else ""
    lines = [f"{report['jobs']:,} no-op jobs per drain{spread}, --procs {report['procs']} "
             f"--batch {report['batch']}, no limit reached"]
    base = report["drains"].get("unlimited")
    for name, runs in report["drains"].items():
        for i, d in enumerate(runs):
            against = "" if base is None else (
                f" ({d['jobs_per_s'] / base[i]['jobs_per_s']:.2f} of unlimited)")
            cpu = "" if base is None else (
                f" ({d['cpu_us_per_job'] - base[i]['cpu_us_per_job']:+.1f})")
            lines.append(f"  {name:18} round {i + 1}: {d['jobs_per_s']:8,.0f} jobs/s{against}, "
                         f"{d['cpu_us_per_job']:6.1f} µs CPU a job{cpu}")
    o = report["overshoot"]
    lines.append(f"rate {o['rate']}/s, {o['jobs']:,} jobs: at most {o['most_in_a_second']} "
                 f"started in any second (excess {o['most_in_a_second'] - o['rate']:+d}), "
                 f"drained in {o['seconds']:.1f} s (the rate allows {o['ideal_seconds']:.1f})")
    t = report["per_tenant"]
    lines.append(f"rate {t['rate']}/s per tenant, {t['tenants']} tenants, {t['jobs']:,} jobs: "
                 f"largest excess of a tenant in any second {t['largest_excess']:+d}; each "
                 f"tenant with jobs left served in {t['served_while_waiting']:.0%} of its "
                 f"windows; claims over {t['claims_seconds']:.1f} s (the hog's floor "
                 f"{t['floor_seconds']} s), the drain {t['seconds']:.1f} s")
    lines.append(f"to repeat: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
