"""Seed N jobs, drain them with `pgpool run --burst`, report throughput and database cost.

    python bench/drain.py [--jobs N] [--kind noop|cpu] [--procs N] [--batch N] [--dsn DSN]

`noop` jobs (a zero-second sleep) expose the framework's own cost; `cpu` jobs are SHA-256
chains of about a millisecond. Transactions are counted from pg_stat_database
(xact_commit) around the drain, so they include every claim, ack flush, heartbeat, reaper
pass and LISTEN connection of the run. Durability is left as the server has it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pgpool
from pgpool import dsn as dsnlib

ROOT = Path(__file__).resolve().parent.parent
KINDS = {
    "noop": ("sleep", "handlers.io", {"seconds": 0}),
    "cpu": ("hash.chain", "handlers.cpu", {"seed": "bench", "rounds": 2000}),
}


def commits(conn) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT xact_commit FROM pg_stat_database "
                        "WHERE datname = current_database()").fetchone()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--kind", choices=KINDS, default="noop")
    parser.add_argument("--procs", type=int, default=0, help="default: usable CPUs")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--dsn")
    args = parser.parse_args()
    kind, module, payload = KINDS[args.kind]
    os.chdir(ROOT)
    dsn = dsnlib.resolve(args.dsn)
    with dsnlib.connect(dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        conn.execute("DELETE FROM pgpool_jobs")
        t = time.perf_counter()
        pgpool.enqueue_many(conn, kind, [payload] * args.jobs)
        seeded = time.perf_counter() - t
        version = conn.execute("SHOW server_version").fetchone()[0]
        durability = conn.execute(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit')").fetchone()
        before = commits(conn)
        cmd = [sys.executable, "-m", "pgpool", "run", "--handlers", module, "--burst",
               "--batch", str(args.batch), "--log-level", "WARNING"]
        if args.procs:
            cmd += ["--procs", str(args.procs)]
        t = time.perf_counter()
        run = subprocess.run(cmd, env={**os.environ, "PGPOOL_DSN": dsn})
        elapsed = time.perf_counter() - t
        after = commits(conn)
        left = conn.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0]
    if run.returncode != 0 or left:
        print(f"drain failed: exit {run.returncode}, {left} jobs left", file=sys.stderr)
        return 1
    tx = after - before
    print(f"PostgreSQL {version}, fsync={durability[0]}, synchronous_commit={durability[1]}")
    print(f"seeded {args.jobs} {args.kind} jobs by COPY in {seeded:.2f}s "
          f"({args.jobs / seeded:,.0f} rows/s)")
    print(f"drained in {elapsed:.2f}s including start-up: {args.jobs / elapsed:,.0f} jobs/s; "
          f"{tx} transactions = {tx / args.jobs:.3f} per job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
