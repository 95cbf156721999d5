"""`make demo`: the main job, end to end, on the embedded PostgreSQL.

Migrates, enqueues a few thousand jobs of the example CPU-heavy kinds (hash chains, prime
sieves, Mandelbrot tiles) in one transaction, runs `pgpool run --burst` on every usable
CPU, then reads the outcome back from the database and prints it. `make demo` keeps the
embedded server's data in ``.pgpool/`` in the repo (``PGPOOL_HOME``). A user error (e.g.
``PGPOOL_EMBEDDED=0`` with no DSN, or no way to create the server's user as root) is one
line and exit status 2, as for the ``pgpool`` command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pgpool
from pgpool.db import dsn as dsnlib

ROOT = Path(__file__).resolve().parent.parent
JOBS_PER_KIND = {"hash.chain": 2000, "primes.sieve": 1000, "mandelbrot.tile": 500}


def payloads(kind: str, n: int) -> list[dict]:
    if kind == "hash.chain":
        return [{"seed": f"demo-{i}", "rounds": 3000} for i in range(n)]
    if kind == "primes.sieve":
        return [{"limit": 20_000 + i, "expect": None} for i in range(n)]
    return [{"x": -2.0 + (i % 25) * 0.1, "y": -1.2 + (i // 25) * 0.1, "size": 16,
             "step": 0.006, "max_iter": 60} for i in range(n)]


def main() -> int:
    os.chdir(ROOT)
    dsn = dsnlib.resolve(None)  # --dsn/PGPOOL_DSN if set, else the embedded server
    with dsnlib.connect(dsn) as conn:
        pgpool.migrate(conn)
        conn.execute("DELETE FROM pgpool_jobs WHERE kind = ANY(%s)", (list(JOBS_PER_KIND),))
        total = 0
        with conn.transaction():
            for kind, n in JOBS_PER_KIND.items():
                total += pgpool.enqueue_many(conn, kind, payloads(kind, n))
        dead_before = conn.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0]
    print(f"demo: enqueued {total} jobs: "
          + ", ".join(f"{n} {k}" for k, n in JOBS_PER_KIND.items()), flush=True)

    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pgpool", "run", "--handlers", "handlers.cpu", "--burst"],
        env={**os.environ, "PGPOOL_DSN": dsn},
    )
    elapsed = time.monotonic() - started
    if run.returncode != 0:
        print(f"demo: pgpool run exited with {run.returncode}", file=sys.stderr)
        return run.returncode

    with dsnlib.connect(dsn) as conn:
        left = conn.execute("SELECT count(*) FROM pgpool_jobs WHERE kind = ANY(%s)",
                            (list(JOBS_PER_KIND),)).fetchone()[0]
        dead = conn.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] - dead_before
    done = total - left - dead
    print(f"demo: ran {done} of {total} jobs in {elapsed:.1f}s "
          f"({done / elapsed:.0f} jobs/s including process start-up), "
          f"{dead} dead-lettered, {left} not finished")
    return 0 if done == total else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except pgpool.PgpoolError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        sys.exit(2)
