"""What the hand-off costs the dispatcher per job, for two checkouts in turns (issue 34).

    python bench/handoff.py --dsn DSN --checkout BEFORE --checkout AFTER
                            [--job-ms 5] [--jobs 4000] [--rounds 4] [--warm 3] [--span 5]

Each checkout (a directory with a ``pgpool`` package, run with it on ``PYTHONPATH``) gets
a scratch schema of its own in the database (``pgpool_bench_<random>``, migrated by that
checkout, dropped at the end): the database's own pgpool tables are never touched. In
turns, round after round, each side: empties its schema's jobs table, enqueues ``--jobs``
bench jobs (the cpu
profile calibrated to ``--job-ms`` on this machine, `pgpool.bench.profiles`; 0 means
no-op jobs), starts ``pgpool run --procs 2 --batch 50 --burst`` with its claim budget
lifted, and measures in steady state: from ``--warm`` seconds after the start, for
``--span`` seconds, the jobs finished (from the table) and the CPU time of the dispatcher
process and of its workers (from /proc). It prints per round and side: jobs/s and the CPU
per job of each, then each side's medians. A side that finishes its jobs before the span
ends is an error: give more jobs.

The dispatcher runs on the cores its workers need: every microsecond it spends per job is
taken from the jobs. The machine's speed drifts, so only figures of one run, in turns,
compare.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgpool.bench.cpu import tree_cpu
from pgpool.bench.profiles import calibrate

SEED = """
import json, sys, psycopg, pgpool
dsn, payload, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
with psycopg.connect(dsn, autocommit=True) as conn:
    conn.execute("DELETE FROM pgpool_jobs")
    conn.execute("VACUUM ANALYZE pgpool_jobs")
with psycopg.connect(dsn) as conn:
    pgpool.enqueue_many(conn, "pgpool.bench", [payload] * n)
"""


def _checkout(path: str) -> str:
    if not os.path.isdir(os.path.join(path, "pgpool")):
        raise argparse.ArgumentTypeError(f"{path!r} holds no pgpool package: give a checkout")
    return os.path.abspath(path)


@contextmanager
def scratch(dsn: str, checkout: str) -> Iterator[str]:
    """A schema of its own for ``checkout``, migrated by it: the DSN that reaches it."""
    name = f"pgpool_bench_{secrets.token_hex(6)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        reach = make_conninfo(dsn, options=f"-c search_path={name}")
        subprocess.run([sys.executable, "-m", "pgpool", "migrate"], check=True,
                       stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": checkout, "PGPOOL_DSN": reach})
        yield reach
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def _left(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0]


def measure(checkout: str, dsn: str, payload: dict, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": checkout, "PGPOOL_DSN": dsn}
    subprocess.run([sys.executable, "-c", SEED, dsn, json.dumps(payload), str(args.jobs)],
                   env=env, check=True)
    host = subprocess.Popen(
        [sys.executable, "-m", "pgpool", "run", "--procs", "2", "--batch", "50", "--burst",
         "--max-claims-per-sec", "1000000", "--handlers", "pgpool.bench.jobs"],
        env=env, cwd="/tmp", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            time.sleep(args.warm)
            cpu0, left0, t0 = tree_cpu([host.pid]), _left(conn), time.monotonic()
            time.sleep(args.span)
            cpu1, left1, t1 = tree_cpu([host.pid]), _left(conn), time.monotonic()
        if left1 == 0:
            raise SystemExit(f"handoff: error: {checkout} finished its jobs within the span: "
                             "give more --jobs")
    finally:
        host.wait(timeout=600)
    jobs = left0 - left1
    dispatcher = cpu1[host.pid] - cpu0[host.pid]
    workers = sum(cpu1[p] - cpu0.get(p, 0.0) for p in cpu1 if p != host.pid)
    return {"jobs_per_s": jobs / (t1 - t0), "dispatcher_us": 1e6 * dispatcher / jobs,
            "workers_us": 1e6 * workers / jobs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("PGPOOL_DSN"),
                        help="the database (default: $PGPOOL_DSN)")
    parser.add_argument("--checkout", type=_checkout, action="append", required=True,
                        help="a checkout to measure (give two)")
    parser.add_argument("--job-ms", type=float, default=5.0)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warm", type=float, default=3.0)
    parser.add_argument("--span", type=float, default=5.0)
    args = parser.parse_args()
    if not args.dsn:
        parser.error("give --dsn or set PGPOOL_DSN")
    if args.job_ms > 0:
        rounds, _ = calibrate("cpu", args.job_ms / 1000)
        payload = {"do": "cpu", "rounds": rounds}
    else:
        payload = {"do": "noop"}
    figures: dict[str, list[dict]] = {path: [] for path in args.checkout}
    with scratch(args.dsn, args.checkout[0]) as first, \
            scratch(args.dsn, args.checkout[-1]) as last:
        sides = [(args.checkout[0], first), (args.checkout[-1], last)]
        for n in range(args.rounds):
            for path, dsn in sides if n % 2 == 0 else sides[::-1]:
                got = measure(path, dsn, payload, args)
                figures[path].append(got)
                print(f"round {n + 1} {path}: {got['jobs_per_s']:,.0f} jobs/s, dispatcher "
                      f"{got['dispatcher_us']:.1f} µs/job, workers "
                      f"{got['workers_us']:.1f} µs/job", flush=True)
    for path, rows in figures.items():
        print(f"median {path}: " + ", ".join(
            f"{key} {statistics.median(r[key] for r in rows):,.1f}"
            for key in ("jobs_per_s", "dispatcher_us", "workers_us")))
    print(f"command: python bench/handoff.py --dsn DSN --job-ms {args.job_ms:g} --jobs "
          f"{args.jobs} --rounds {args.rounds} "
          + " ".join(f"--checkout {p}" for p in args.checkout))


if __name__ == "__main__":
    main()
