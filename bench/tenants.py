"""Tenant fairness under a flood: other tenants' pickup lag, the flood's throughput, and
what tenants and concurrency keys cost at enqueue and claim.

    python bench/tenants.py [--flood 50000] [--procs 2] [--batch 20] [--dsn DSN]

In a scratch schema (dropped afterwards), with one real dispatcher (``pgpool run``,
handlers from bench/tenantjobs.py, each job 1 ms of sleep):

1. unflooded: 300 jobs of tenants a, b, c trickle in (one every 10 ms); their pickup lag
   (enqueue to handler start) p50/p99;
2. flooded: ``--flood`` jobs of one tenant are seeded due, then the same trickle: the
   same lag figures, and the flood's throughput meanwhile;
3. the flood alone, as long again: its throughput when nobody else needs capacity.

Then, without a dispatcher: the claim statement's time (p50/p99 of 200 claims of 50) with
1, 10 and 100 tenants waiting beside the flood; and enqueue's cost with and without a
tenant and a concurrency key (2,000 single enqueues; enqueue_many of 50,000).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

import pgpool
from pgpool.db import dsn as dsnlib
from pgpool.sql import jobs as sql
from pgpool.sql.jobs import SWEEP

BENCH = Path(__file__).parent
KIND = "tenants.work"
TRICKLE = 300
TRICKLE_GAP = 0.01
WORK_MS = 1


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def seed_flood(conn: psycopg.Connection, n: int, tenant: str = "flood") -> None:
    conn.execute("INSERT INTO pgpool_jobs (kind, payload, tenant) "
                 "SELECT %s, %s::jsonb, %s FROM generate_series(1, %s)",
                 (KIND, f'{{"ms": {WORK_MS}}}', tenant, n))
    conn.execute("VACUUM ANALYZE pgpool_jobs")


def flood_left(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM pgpool_jobs WHERE tenant = 'flood'").fetchone()[0]


def trickle(conn: psycopg.Connection, record: Path) -> list[float]:
    """Enqueue the other tenants' jobs one by one; their lags once all have started."""
    for f in record.glob("*.log"):
        f.unlink()
    for i in range(TRICKLE):
        tenant = "abc"[i % 3]
        pgpool.enqueue(conn, KIND, {"t": time.time(), "tenant": tenant, "ms": WORK_MS},
                       tenant=tenant)
        time.sleep(TRICKLE_GAP)
    deadline = time.monotonic() + 300
    while True:
        lags = [float(line.split()[1]) for f in record.glob("*.log")
                for line in f.read_text().splitlines()]
        if len(lags) >= TRICKLE:
            return lags
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(lags)} of {TRICKLE} trickled jobs started in 300 s")
        time.sleep(0.05)


def timed(n: int, fn: Callable[[], object]) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def run_flood(dsn: str, args: argparse.Namespace, record: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGPOOL_")}
    env.update(PGPOOL_DSN=dsn, TENANTS_RECORD=str(record), PYTHONPATH=str(BENCH))
    host = subprocess.Popen(
        [sys.executable, "-m", "pgpool", "run", "--handlers", "tenantjobs", "--procs",
         str(args.procs), "--batch", str(args.batch), "--log-level", "WARNING"],
        cwd=BENCH, env=env)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # Warm up: the host's workers started and ran a job (not part of any figure).
            pgpool.enqueue(conn, KIND, {})
            while conn.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0]:
                if host.poll() is not None:
                    raise SystemExit(f"pgpool run exited ({host.returncode})")
                time.sleep(0.05)
            quiet = trickle(conn, record)
            seed_flood(conn, args.flood)
            before, started = flood_left(conn), time.monotonic()
            flooded = trickle(conn, record)
            mid, seconds = flood_left(conn), time.monotonic() - started
            time.sleep(seconds)  # the flood alone, as long again
            alone = mid - flood_left(conn)
    finally:
        host.terminate()
        host.wait(60)
    print(f"other tenants' pickup lag (3 tenants, {TRICKLE} jobs, one per "
          f"{TRICKLE_GAP * 1000:.0f} ms; {args.procs} workers, batch {args.batch}, "
          f"{WORK_MS} ms jobs):")
    print(f"  unflooded:                  p50 {pct(quiet, .5) * 1000:6.1f} ms  "
          f"p99 {pct(quiet, .99) * 1000:6.1f} ms")
    print(f"  {args.flood:,} flood jobs ahead: p50 {pct(flooded, .5) * 1000:6.1f} ms  "
          f"p99 {pct(flooded, .99) * 1000:6.1f} ms")
    print(f"flood throughput: {(before - mid) / seconds:,.0f} jobs/s beside the others, "
          f"{alone / seconds:,.0f} jobs/s alone")


def claim_costs(conn: psycopg.Connection, flood: int) -> None:
    params = {"queues": ["default"], "kinds": [KIND], "kind_max_attempts": [5],
              "owner": "bench", "lease": 30, "limit": 50, "after": "", **SWEEP, "tenant_cap": None}
    print("claim of 50 (one statement, autocommit): p50 / p99 of 200, and the pages one "
          "touches (shared buffers; does not depend on the machine's load):")
    for label, flooded, tenants in (("no tenants, empty", 0, 0),
                                    (f"{flood:,} of one tenant", flood, 0),
                                    (f"{flood:,} + 10 tenants", flood, 10),
                                    (f"{flood:,} + 100 tenants", flood, 100)):
        conn.execute("DELETE FROM pgpool_jobs")
        if flooded:
            seed_flood(conn, flooded)
        for t in range(tenants):
            seed_flood(conn, 200, tenant=f"t{t:03}")
        conn.execute("INSERT INTO pgpool_jobs (kind, payload) SELECT %s, '{}' "
                     "FROM generate_series(1, 10000)", (KIND,))
        conn.execute("VACUUM ANALYZE pgpool_jobs")

        def claim() -> None:
            conn.execute(sql.CLAIM, params).fetchall()

        for cap in (None, 5):
            params["tenant_cap"] = cap
            conn.execute("UPDATE pgpool_jobs SET state = 'ready', locked_by = NULL "
                          "WHERE state = 'running'")
            conn.execute("VACUUM ANALYZE pgpool_jobs")
            t = timed(200, claim)
            (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.CLAIM,
                                   params).fetchone()[0]
            pages = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get(
                "Shared Read Blocks", 0)
            print(f"  {label:26} cap {cap or '-':>2}: {pct(t, .5) * 1000:6.2f} / "
                  f"{pct(t, .99) * 1000:6.2f} ms, {pages} pages")


def enqueue_costs(conn: psycopg.Connection) -> None:
    print("enqueue (autocommit, each its own transaction), p50 / p99 of 2,000:")
    for label, extra in (("plain", {}), ("tenant", {"tenant": "acme"}),
                         ("tenant + concurrency_key", {"tenant": "acme",
                                                        "concurrency_key": "acct-1"})):
        conn.execute("DELETE FROM pgpool_jobs")
        conn.execute("VACUUM pgpool_jobs")
        t = timed(2000, lambda extra=extra: pgpool.enqueue(conn, KIND, {"n": 1}, **extra))
        conn.execute("DELETE FROM pgpool_jobs")
        started = time.perf_counter()
        with conn.transaction():
            pgpool.enqueue_many(conn, KIND, ({"n": i} for i in range(50_000)), **extra)
        rate = 50_000 / (time.perf_counter() - started)
        print(f"  {label:26}: {pct(t, .5) * 1000:.3f} / {pct(t, .99) * 1000:.3f} ms; "
              f"enqueue_many {rate:,.0f} rows/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=50_000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--dsn")
    args = parser.parse_args()
    base = dsnlib.resolve(args.dsn)
    schema = f"pgpool_tenants_bench_{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(base, options=f"-c search_path={schema}")
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn, \
                    tempfile.TemporaryDirectory() as record:
                pgpool.migrate(conn)
                run_flood(dsn, args, Path(record))
                claim_costs(conn, args.flood)
                enqueue_costs(conn)
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
