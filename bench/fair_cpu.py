"""Fairness by CPU time: two tenants flood, one of 100 ms CPU jobs and one of 1 ms, and
each one's share of the CPU their jobs used, with ``pgpool run --fair-by cpu`` and by job
count (the default), side by side.

    python bench/fair_cpu.py [--seconds 30] [--window 10] [--warmup 0] [--procs 2]
                             [--batch 50] [--heavy-ms 100] [--light-ms 1] [--rounds 1]
                             [--dsn DSN] [--json]

In a scratch schema (dropped afterwards), for each mode in turn (cpu, then count, for
``--rounds`` rounds): a real dispatcher (``pgpool run``, handlers from bench/fairjobs.py)
is started and warmed up; both tenants' backlogs are enqueued in one transaction, deep
enough that neither runs dry; ``--warmup`` and ``--seconds`` later the dispatcher is
stopped. Each job spins on the CPU for its milliseconds and records its tenant, when it
ended and the CPU time it measured itself: the shares are those, over the warm-up, per
``--window`` seconds after it and over the ``--seconds``, not what pgpool recorded. Each
mode starts with no recorded usage. Then, without a dispatcher, what a fair claim costs by
count and by CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

import pgpool
from pgpool.db import dsn as dsnlib
from pgpool.sql import jobs as sql

BENCH = Path(__file__).parent
KIND = "fair.burn"
TENANTS = ("heavy", "light")
#: Backlogs this many times what the workers could run in the time, so neither runs dry.
DEPTH = 1.5
#: Where the tables go: stdout, or stderr with --json (stdout is then the JSON alone).
human = sys.stdout


def say(text: str) -> None:
    print(text, file=human, flush=True)


def drain_warmup(conn: psycopg.Connection, host: subprocess.Popen[bytes]) -> None:
    """One job without a tenant, run: the host's workers are up (not part of a figure)."""
    pgpool.enqueue(conn, KIND, {"ms": 0, "tenant": "warmup"})
    deadline = time.monotonic() + 120
    while conn.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0]:
        if host.poll() is not None:
            raise SystemExit(f"pgpool run exited ({host.returncode})")
        if time.monotonic() > deadline:
            raise SystemExit("the warm-up job did not run in 120 s")
        time.sleep(0.05)


def run_mode(dsn: str, args: argparse.Namespace, cpu: bool, record: Path) -> dict[str, Any]:
    """One run of ``args.seconds``: the CPU and jobs per tenant per window."""
    for f in record.glob("*.log"):
        f.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGPOOL_")}
    env.update(PGPOOL_DSN=dsn, FAIR_RECORD=str(record),
               PYTHONPATH=os.pathsep.join([str(BENCH), str(BENCH.parent)]))
    host = subprocess.Popen(
        [sys.executable, "-m", "pgpool", "run", "--handlers", "fairjobs", "--procs",
         str(args.procs), "--batch", str(args.batch), "--log-level", "WARNING",
         "--fair-by", "cpu" if cpu else "count"], cwd=BENCH, env=env)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            drain_warmup(conn, host)
            conn.execute("TRUNCATE pgpool_tenant_cpu")
            ms = {"heavy": args.heavy_ms, "light": args.light_ms}
            with conn.transaction():
                for tenant in TENANTS:
                    # What the workers could run in the time, and what a host holds.
                    n = math.ceil(DEPTH * args.procs * (args.warmup + args.seconds) * 1000
                                  / ms[tenant]) + args.procs + 3 * args.batch
                    pgpool.enqueue_many(conn, KIND, ({"ms": ms[tenant], "tenant": tenant}
                                                     for _ in range(n)), tenant=tenant)
            started = time.time() + args.warmup  # the windows' start
            time.sleep(args.warmup + args.seconds)
            left = dict(conn.execute("SELECT tenant, count(*) FROM pgpool_jobs "
                                     "GROUP BY tenant").fetchall())
    finally:
        host.send_signal(signal.SIGTERM)
        host.wait(120)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The next run starts on a clean table: the dead index entries of these jobs would
        # slow its first claims, which walk the ready index from the start.
        conn.execute("DELETE FROM pgpool_jobs")
        conn.execute("VACUUM pgpool_jobs")
    dry = [t for t in TENANTS if not left.get(t)]
    if dry:
        raise SystemExit(f"{', '.join(dry)} ran out of jobs: raise DEPTH")
    # The windows, and the warm-up last (index -1).
    windows = math.ceil(args.seconds / args.window) + 1
    cpu_used: dict[str, list[float]] = defaultdict(lambda: [0.0] * windows)
    jobs: dict[str, list[int]] = defaultdict(lambda: [0] * windows)
    for f in record.glob("*.log"):
        for line in f.read_text().splitlines():
            tenant, ended, used = line.split()
            at = float(ended) - started
            if tenant in TENANTS and -args.warmup <= at < args.seconds:
                w = int(at // args.window) if at >= 0 else -1
                cpu_used[tenant][w] += float(used)
                jobs[tenant][w] += 1
    return {"cpu": {t: cpu_used[t] for t in TENANTS}, "jobs": {t: jobs[t] for t in TENANTS}}


def shares(run: dict[str, Any], w: slice) -> tuple[dict[str, float], dict[str, int]]:
    """Each tenant's share of the CPU (percent) and jobs over windows ``w``."""
    cpu = {t: sum(run["cpu"][t][w]) for t in TENANTS}
    total = sum(cpu.values()) or 1.0
    return ({t: 100 * cpu[t] / total for t in TENANTS},
            {t: sum(run["jobs"][t][w]) for t in TENANTS})


def report(mode: str, run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    say(f"--fair-by {mode}: {args.procs} workers, batch {args.batch}, heavy "
          f"{args.heavy_ms:g} ms jobs, light {args.light_ms:g} ms jobs, {args.seconds:g} s "
          f"after a warm-up of {args.warmup:g} s")
    say("  window       heavy CPU  light CPU  heavy jobs  light jobs  CPU used")
    out: dict[str, Any] = {"windows": []}
    windows = len(run["cpu"]["heavy"]) - 1
    rows: list[tuple[str, slice]] = [("warmup", slice(-1, None))] if args.warmup else []
    rows += [(str(i), slice(i, i + 1)) for i in range(windows)]
    for i, w in [*rows, ("overall", slice(0, windows))]:
        pct, count = shares(run, w)
        used = sum(sum(run["cpu"][t][w]) for t in TENANTS)
        label = (i if not i.isdigit() else f"{int(i) * args.window:g}-"
                 f"{min((int(i) + 1) * args.window, args.seconds):g} s")
        say(f"  {label:11} {pct['heavy']:9.1f}% {pct['light']:9.1f}% "
              f"{count['heavy']:11,} {count['light']:11,} {used:8.1f} s")
        row = {"heavy_cpu_pct": round(pct["heavy"], 2), "light_cpu_pct": round(pct["light"], 2),
               "heavy_jobs": count["heavy"], "light_jobs": count["light"],
               "cpu_seconds": round(used, 3)}
        if i.isdigit():
            out["windows"].append(row)
        else:
            out[i] = row
    return out


def claim_costs(conn: psycopg.Connection, rounds: int = 200) -> dict[str, Any]:
    """The fair claim of 50 by job count and by CPU, in turns, each rolled back: its time
    (p50 and p99 of ``rounds``) with 2 and with 100 tenants waiting (200 jobs each, and
    the usage of a window recorded for each)."""
    params = {"queues": ["default"], "kinds": [KIND], "kind_max_attempts": [5],
              "owner": "bench", "lease": 30, "limit": 50, "after": "", "tenant_cap": None}
    say(f"fair claim of 50, rolled back: p50 / p99 of {rounds}, by count and by cpu in "
          "turns")
    out: dict[str, Any] = {}
    for tenants in (2, 100):
        conn.execute("DELETE FROM pgpool_jobs")
        conn.execute("TRUNCATE pgpool_tenant_cpu")
        for t in range(tenants):
            name = f"t{t:03}"
            conn.execute("INSERT INTO pgpool_jobs (kind, payload, tenant) "
                         "SELECT %s, '{}', %s FROM generate_series(1, 200)", (KIND, name))
            conn.execute("INSERT INTO pgpool_tenant_cpu (tenant, bucket, cpu, attempts) "
                         "SELECT %s, now() - b * interval '5 seconds', 1.0, 100 "
                         "FROM generate_series(0, 6) AS b", (name,))
        conn.execute("VACUUM ANALYZE pgpool_jobs")
        conn.execute("ANALYZE pgpool_tenant_cpu")
        times: dict[str, list[float]] = {"count": [], "cpu": []}
        for _ in range(rounds):
            for mode, statement in (("count", sql.CLAIM), ("cpu", sql.CLAIM_CPU)):
                with conn.transaction():
                    started = time.perf_counter()
                    conn.execute(statement, params).fetchall()
                    times[mode].append(time.perf_counter() - started)
                    raise psycopg.Rollback
        for mode, t in times.items():
            t.sort()
            p50, p99 = t[len(t) // 2] * 1000, t[int(0.99 * len(t))] * 1000
            say(f"  {tenants:3} tenants, by {mode:5}: {p50:6.2f} / {p99:6.2f} ms")
            out[f"{tenants}_{mode}"] = {"p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}
    conn.execute("DELETE FROM pgpool_jobs")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--heavy-ms", type=float, default=100.0)
    parser.add_argument("--light-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dsn")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.seconds, args.window, args.procs, args.batch, args.rounds) <= 0 or (
            args.warmup < 0):
        parser.error("--seconds, --window, --procs, --batch and --rounds must be positive, "
                     "--warmup not negative")
    global human
    human = sys.stderr if args.json else sys.stdout
    base = dsnlib.resolve(args.dsn)
    schema = f"pgpool_bench_fair_cpu_{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(base, options=f"-c search_path={schema}")
    results: dict[str, Any] = {"cpu": [], "count": []}
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                pgpool.migrate(conn)
            with tempfile.TemporaryDirectory() as record:
                for _ in range(args.rounds):
                    for mode in ("cpu", "count"):
                        run = run_mode(dsn, args, mode == "cpu", Path(record))
                        results[mode].append(report(mode, run, args))
            with psycopg.connect(dsn, autocommit=True) as conn:
                results["claims"] = claim_costs(conn)
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
    if args.json:
        print(json.dumps({"args": vars(args) | {"dsn": None}, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
