"""A burst on a host that started on an idle queue: the plans its claims keep.

    python bench/burst_after_idle.py [--jobs 200000] [--rounds 2] [--dsn DSN]

A host prepares its claims once and keeps their generic plans (`pgpool.sql.jobs`'s
``GENERIC_PLANS``), made from the table's statistics of that moment. In a scratch schema
(dropped afterwards), each round: the table holds a few jobs scheduled for tomorrow (a
periodic schedule's, say) and two due now, analyzed, as a quiet queue's table is; a real
``pgpool run --procs 2`` (its claim budget lifted) starts and takes them, then a trickle
of jobs one at a time (`TRICKLE`), its claims prepared and planned on that table; then
``--jobs`` no-op jobs come in one transaction (its notification wakes the host), and the
host drains them. Printed: the drain's jobs/s, from the burst's commit to the last job
done, and whether autovacuum analyzed the table meanwhile (which makes the plans again).
Only pgpool's public API and bench package are used, so ``PYTHONPATH=<an older checkout>
python bench/burst_after_idle.py`` measures that pgpool side by side with this one (run
from outside the checkout).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import IO, Final

import psycopg
from drains import session, start_pgpool_run

import pgpool
from pgpool.bench.jobs import KIND
from pgpool.bench.progress import Progress

#: ``jobs`` no-op jobs due now, and ``later`` due tomorrow.
SEED: Final = """
INSERT INTO pgpool_jobs (kind, payload, run_at, state)
SELECT %(kind)s, '{"do": "noop"}', now() + (g > %(jobs)s)::int * interval '1 day',
       CASE WHEN g > %(jobs)s THEN 'scheduled' ELSE 'ready' END
FROM generate_series(1, %(jobs)s + %(later)s) AS g
"""
#: Jobs due and not done.
LEFT: Final = "SELECT count(*) FROM pgpool_jobs WHERE state IN ('ready', 'running')"
#: When autovacuum last analyzed the jobs table (NULL: never).
ANALYZED: Final = ("SELECT last_autoanalyze FROM pg_stat_user_tables "
                   "WHERE relid = 'pgpool_jobs'::regclass")
#: Jobs scheduled for tomorrow, left in the table through the round.
LATER: Final = 20
#: Jobs enqueued one at a time, each taken before the next, before the burst: psycopg
#: prepares a statement at its fifth run, and a host that has run a trickle of jobs has
#: prepared its claims.
TRICKLE: Final = 10
#: How long the drain may take before the run fails.
TIMEOUT: Final = 600.0


def drain(dsn: str, conn: psycopg.Connection, jobs: int, log: IO[bytes]
          ) -> tuple[float, bool]:
    """(jobs/s, whether autovacuum analyzed the table during the drain) of one round, the
    host's output in ``log``."""
    conn.execute(SEED, {"kind": KIND, "jobs": 2, "later": LATER})
    conn.execute("VACUUM ANALYZE pgpool_jobs")
    before = conn.execute(ANALYZED).fetchone()[0]
    host = start_pgpool_run(dsn, 2, "auto", log, burst=False)

    def left() -> int:
        if host.poll() is not None:
            raise SystemExit(f"pgpool: `pgpool run` exited with status {host.returncode}")
        return int(conn.execute(LEFT).fetchone()[0])

    try:
        deadline = time.monotonic() + TIMEOUT
        for _ in range(TRICKLE):  # its claims prepared and planned on this table
            pgpool.enqueue(conn, KIND, {"do": "noop"})
            while left():
                time.sleep(0.005)
        time.sleep(0.5)  # and idle
        with conn.transaction():  # one commit, one notification
            conn.execute(SEED, {"kind": KIND, "jobs": jobs - 1, "later": 0})
            pgpool.enqueue(conn, KIND, {"do": "noop"})
        started = time.monotonic()
        while left():
            if time.monotonic() > deadline:
                raise SystemExit(f"pgpool: the drain did not end within {TIMEOUT:g}s")
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        analyzed = conn.execute(ANALYZED).fetchone()[0] != before
    finally:
        host.terminate()
        host.wait()
    conn.execute("DELETE FROM pgpool_jobs")
    return jobs / elapsed, analyzed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000, help="the burst (default 200000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--dsn")
    args = parser.parse_args()
    if args.jobs < 1000 or args.rounds < 1:
        parser.error("--jobs must be at least 1000, --rounds at least 1")
    progress = Progress(sys.stderr)
    with session(args.dsn, progress) as s:
        for n in range(1, args.rounds + 1):
            progress.step(f"round {n} of {args.rounds}")
            with open(s.tmp / f"round-{n}.log", "wb") as log:
                rate, analyzed = drain(s.scratch.dsn, s.conn, args.jobs, log)
            print(f"round {n}: {rate:,.0f} jobs/s, autovacuum analyzed the table during the "
                  f"drain: {'yes' if analyzed else 'no'} (pgpool {pgpool.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
