"""Pickup latency of a latency-sensitive kind while another kind floods its queue.

    python bench/flood.py [--depths 0,100000,1000000] [--samples 200] [--dsn DSN] [--quick]

In a scratch schema (dropped afterwards), for each depth in turn: that many jobs of kind
``flood`` are due ahead of the sensitive kind in the same queue (same priority, due an
hour earlier) and no host serves them, so the flood stays whole while the sensitive jobs
run: the worst case for a claim that has to read past it. The sensitive kind's pickup
latency is then measured as ``pgpool bench`` does (`pgpool.bench.pickup`): a real ``pgpool
run --procs 1`` that serves it, jobs enqueued one at a time on an otherwise idle queue,
from the enqueue's commit to the handler starting in the worker. It prints p50 and p99 per
depth, and p99 against the unflooded p99 (the goal: under 2x at every depth).

With ``--serve-flood`` the same host also serves the flood's kind (`floodjobs`), seed 004's
case: the flood is put in once the host has run its first job, in one transaction, and
the sensitive jobs are enqueued while the host drains it (200,000 last about 20 s here;
the samples about 3 s).

It also times enqueueing, per job: ``pgpool.enqueue`` (due now, and delayed), many in one
transaction so the commit's flush does not drown the statement's own cost, and
``pgpool.enqueue_many`` (COPY); ``--enqueue-only`` does only that. Only pgpool's public API
and bench package are used, so ``PYTHONPATH=<an older checkout> python bench/flood.py``
measures that pgpool's claim and enqueue side by side with this one's (with an editable
install of this one, also put first on PYTHONPATH a ``sitecustomize.py`` that drops its
finder from ``sys.meta_path``, and run from outside the checkout).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Final

import psycopg
from drains import compile_pgpool, with_bench_modules  # bench/: this script's directory

import pgpool
from pgpool.bench.jobs import KIND
from pgpool.bench.options import BenchOptions
from pgpool.bench.pickup import measure_pickup
from pgpool.bench.progress import Progress
from pgpool.bench.scratch import scratch_schema
from pgpool.db import dsn as dsnlib

#: Tops the flood up to ``total`` jobs of kind ``flood``, due an hour ago (ahead of every
#: job enqueued now at the same priority), that no host serves.
FLOOD: Final = """
INSERT INTO pgpool_jobs (kind, payload, run_at)
SELECT 'flood', '{}', now() - interval '1 hour'
FROM generate_series(1, %(total)s - (SELECT count(*) FROM pgpool_jobs WHERE kind = 'flood'))
"""
#: After seeding: the flood's pages vacuumed and written out now, so that their write-back
#: does not land in the pickups' commits (CHECKPOINT needs a superuser or pg_checkpoint:
#: without, the pickups run beside it).
SETTLE: Final = ("VACUUM ANALYZE pgpool_jobs", "CHECKPOINT")
#: The enqueue timing's jobs go; the flood stays.
CLEAR: Final = "DELETE FROM pgpool_jobs WHERE kind <> 'flood'"

#: Jobs per enqueue timing: one transaction each, and one COPY.
SINGLE_ENQUEUES: Final = 2000
BULK_ENQUEUE: Final = 50_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="0,100000,1000000",
                        help="flood sizes, comma-separated (default 0,100000,1000000)")
    parser.add_argument("--samples", type=int, default=200,
                        help="sensitive jobs per depth (default 200)")
    parser.add_argument("--quick", action="store_true",
                        help="a small run (depths 0,2000,20000, 20 samples, fewer enqueues)")
    parser.add_argument("--enqueue-only", action="store_true",
                        help="time enqueueing only, not pickups")
    parser.add_argument("--serve-flood", action="store_true",
                        help="the host measured also serves the flood's kind, and drains it")
    parser.add_argument("--batch", type=int,
                        help="the host's --batch (default auto): with --serve-flood, a "
                             "sensitive job waits for the next claim, a batch's work away")
    parser.add_argument("--dsn")
    args = parser.parse_args()
    try:
        depths = sorted({int(d) for d in args.depths.split(",")})
    except ValueError:
        parser.error(f"--depths {args.depths!r}: give whole numbers, comma-separated")
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch {args.batch}: give a batch of at least 1, or leave it out (auto)")
    if args.quick:
        depths, args.samples = [0, 2000, 20_000], 20
    if depths[0] != 0:
        depths.insert(0, 0)  # the unflooded figure every ratio is against
    if args.serve_flood:
        os.environ["PYTHONPATH"] = with_bench_modules()  # the host finds floodjobs
        compile_pgpool()
    base = dsnlib.resolve(args.dsn)
    progress = Progress(sys.stderr)
    opts = BenchOptions(dsn=base, jobs=args.samples, procs=1, batch=args.batch or "auto",
                        profile="noop", backlog=0, max_claims_per_sec=None)
    scale = 10 if args.quick else 1
    rows = []
    with dsnlib.connect(base, autocommit=True) as admin, \
            scratch_schema(admin, base, progress) as scratch, \
            dsnlib.connect(scratch.dsn, autocommit=True) as conn, \
            tempfile.TemporaryDirectory() as tmp:
        pgpool.migrate(conn)
        enqueue_costs = time_enqueues(conn, SINGLE_ENQUEUES // scale, BULK_ENQUEUE // scale)
        for depth in [] if args.enqueue_only else depths:
            def seed(depth: int = depth) -> None:
                progress.step(f"flood of {depth:,}: seeding")
                conn.execute(FLOOD, {"total": depth})
                for statement in () if args.serve_flood else SETTLE:
                    try:
                        conn.execute(statement)
                    except psycopg.errors.InsufficientPrivilege:
                        progress.step(f"{statement}: not allowed to this role; going on "
                                      "without")

            run = Path(tmp) / f"depth-{depth}"
            run.mkdir()
            if args.serve_flood:  # its host drains it: seeded once the host has started
                pickup = measure_pickup(opts, scratch.dsn, conn, run, progress,
                                        also=("floodjobs",), warmed=seed)
            else:
                seed()
                pickup = measure_pickup(opts, scratch.dsn, conn, run, progress)
            rows.append((depth, pickup["p50_ms"], pickup["p99_ms"]))
    if rows:
        print(f"pickup of the sensitive kind, enqueue commit -> handler start, {args.samples} "
              f"jobs per depth; pgpool {pgpool.__version__}, schema {pgpool.SCHEMA_VERSION}")
        served = "this host drains it" if args.serve_flood else "no host serves it"
        print(f"{'flood due ahead (' + served + ')':>36}  {'p50 ms':>8}  {'p99 ms':>8}  "
              f"{'p99 / unflooded':>15}")
        unflooded = rows[0][2]
        for depth, p50, p99 in rows:
            print(f"{depth:>36,}  {p50:>8.2f}  {p99:>8.2f}  {p99 / unflooded:>14.2f}x")
    print("enqueue cost per job: " + ", ".join(
        f"{what} {us:.0f} µs" for what, us in enqueue_costs))
    return 0


def time_enqueues(conn: psycopg.Connection, singles: int, bulk: int
                  ) -> list[tuple[str, float]]:
    """Microseconds per job: ``singles`` enqueues in one transaction, due now and then
    delayed, and one COPY of ``bulk`` jobs; the jobs are deleted after each."""
    costs = []
    for what, delay in (("enqueue (due now)", None), ("enqueue (delayed)", timedelta(hours=1))):
        started = time.perf_counter()
        with conn.transaction():
            for i in range(singles):
                pgpool.enqueue(conn, KIND, {"n": i}, delay=delay)
        costs.append((what, (time.perf_counter() - started) / singles * 1e6))
        conn.execute(CLEAR)
    started = time.perf_counter()
    with conn.transaction():
        pgpool.enqueue_many(conn, KIND, ({"n": i} for i in range(bulk)))
    costs.append(("enqueue_many", (time.perf_counter() - started) / bulk * 1e6))
    conn.execute(CLEAR)
    return costs


if __name__ == "__main__":
    sys.exit(main())
