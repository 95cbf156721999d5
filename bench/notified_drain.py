"""What a busy host's notifications cost: a drain while a producer keeps enqueueing.

    python bench/notified_drain.py [--jobs 200000] [--every-ms 2] [--rounds 2] [--dsn DSN]

In a scratch schema (dropped afterwards), each round: ``--jobs`` no-op jobs are due; a real
``pgpool run --procs 2`` drains them while a producer enqueues one more job every
``--every-ms`` in its own transaction, each sending the host a notification while it is
busy (the case where a notification may start a prompt claim: `pgpool.host.scheduler`).
It prints the drain's jobs/s and the server's other write transactions per second (claims,
acks, heartbeats: every transaction but the producer's that was given a transaction id). They
are read from the transaction id counter, which is exact at once; ``pg_stat_database``'s
commit count lags by up to a second per backend, too long for a short round. Only pgpool's
public API and bench package are used, so ``PYTHONPATH=<an older checkout> python
bench/notified_drain.py`` measures that pgpool side by side with this one (run from
outside the checkout).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from typing import Final

import psycopg
from drains import session

import pgpool
from pgpool.bench import jobs as bench_jobs
from pgpool.bench.jobs import KIND
from pgpool.bench.progress import Progress

SEED: Final = """
INSERT INTO pgpool_jobs (kind, payload)
SELECT %(kind)s, '{"do": "noop"}' FROM generate_series(1, %(jobs)s)
"""
LEFT: Final = "SELECT count(*) FROM pgpool_jobs WHERE state IN ('ready', 'running')"
#: The next transaction id, read without taking one.
NEXT_XID: Final = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
#: How long the drain may take before the run fails.
TIMEOUT: Final = 600.0
#: The drain ends when fewer jobs than this are left: the producer's trickle.
REST: Final = 100


def drain(dsn: str, conn: psycopg.Connection, jobs: int, every: float) -> tuple[float, float]:
    """(jobs/s, other write transactions/s) of one drain of ``jobs`` while a producer
    enqueues one job every ``every`` seconds, timed from the host's first claim to fewer
    than `REST` left."""
    conn.execute(SEED, {"kind": KIND, "jobs": jobs})
    conn.execute("VACUUM ANALYZE pgpool_jobs")
    host = subprocess.Popen(
        [sys.executable, "-m", "pgpool", "run", "--procs", "2", "--handlers",
         bench_jobs.__name__],
        env={**os.environ, "PGPOOL_DSN": dsn, "PGPOOL_LOG_LEVEL": "WARNING"},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    stop = threading.Event()
    produced = 0

    def produce() -> None:
        nonlocal produced
        with psycopg.connect(dsn, autocommit=True) as own:
            while not stop.is_set():
                pgpool.enqueue(own, KIND, {"do": "noop"})
                produced += 1
                time.sleep(every)

    def left() -> int:
        if host.poll() is not None:
            raise SystemExit(f"pgpool: `pgpool run` exited with status {host.returncode}")
        return int(conn.execute(LEFT).fetchone()[0])

    producer = threading.Thread(target=produce)
    try:
        deadline = time.monotonic() + TIMEOUT
        while (first := left()) == jobs:  # until the host claims
            time.sleep(0.005)
        xid = conn.execute(NEXT_XID).fetchone()[0]
        started = time.monotonic()
        producer.start()
        while (last := left()) >= REST:
            if time.monotonic() > deadline:
                raise SystemExit(f"pgpool: the drain did not end within {TIMEOUT:g}s")
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        stop.set()
        producer.join()
        others = conn.execute(NEXT_XID).fetchone()[0] - xid - produced
    finally:
        stop.set()
        host.terminate()
        host.wait()
    conn.execute("DELETE FROM pgpool_jobs")
    return (first + produced - last) / elapsed, others / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000, help="jobs due (default 200000)")
    parser.add_argument("--every-ms", type=float, default=2.0,
                        help="the producer's pace, ms between jobs (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--dsn")
    args = parser.parse_args()
    if args.jobs < 1000 or args.rounds < 1 or args.every_ms <= 0:
        parser.error("--jobs must be at least 1000, --rounds at least 1, --every-ms above 0")
    progress = Progress(sys.stderr)
    with session(args.dsn, progress) as s:
        for n in range(1, args.rounds + 1):
            progress.step(f"round {n} of {args.rounds}")
            rate, others = drain(s.scratch.dsn, s.conn, args.jobs, args.every_ms / 1000)
            print(f"round {n}: {rate:,.0f} jobs/s, {others:,.0f} other write transactions/s "
                  f"(pgpool {pgpool.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
