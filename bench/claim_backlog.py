"""Claim latency under a deep backlog: does a claim stay cheap when the table is huge?

    python bench/claim_backlog.py [--rows 1000000] [--backlog due|future] [--dsn DSN]

Seeds ``--rows`` jobs in a scratch schema (dropped afterwards): all due now (``due``: a
bulk enqueue waiting to run) or all scheduled a day ahead plus 10,000 due (``future``).
Then times 200 claims of 50 jobs with pgpool's claim statement and prints p50/p99.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import psycopg
from psycopg.conninfo import make_conninfo

import pgpool
from pgpool.db import dsn as dsnlib
from pgpool.sql import jobs as sql
from pgpool.sql.jobs import SWEEP


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--backlog", choices=("due", "future"), default="due")
    parser.add_argument("--dsn")
    args = parser.parse_args()
    base = dsnlib.resolve(args.dsn)
    schema = f"pgpool_claim_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            with psycopg.connect(make_conninfo(base, options=f"-c search_path={schema}"),
                                 autocommit=True) as conn:
                pgpool.migrate(conn)
                due, state = (("now()", "ready") if args.backlog == "due"
                              else ("now() + interval '1 day'", "scheduled"))
                conn.execute("INSERT INTO pgpool_jobs (kind, payload, run_at, state) "
                             f"SELECT 'k', '{{}}', {due}, '{state}' "
                             "FROM generate_series(1, %s)", (args.rows,))
                if args.backlog == "future":
                    conn.execute("INSERT INTO pgpool_jobs (kind, payload) "
                                 "SELECT 'k', '{}' FROM generate_series(1, 10000)")
                conn.execute("VACUUM ANALYZE pgpool_jobs")
                params = {"queues": ["default"], "kinds": ["k"], "kind_max_attempts": [20],
                          "owner": "bench", "lease": 30, "limit": 50, "after": "", **SWEEP,
                          "tenant_cap": None}
                times = []
                for _ in range(200):
                    started = time.perf_counter()
                    conn.execute(sql.CLAIM, params).fetchall()
                    times.append(time.perf_counter() - started)
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
    times.sort()
    print(f"{args.rows:,} {args.backlog} rows: claim of 50 p50 {times[100] * 1000:.2f} ms, "
          f"p99 {times[197] * 1000:.2f} ms (200 claims, durable commits)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
