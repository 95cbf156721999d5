"""The worker pool's own cost, side by side in one run: bare processes vs WorkerPool.

    python bench/pool_overhead.py [--jobs N] [--procs N] [--rounds R]

Both sides run the same CPU job (`pgpool.bench.jobs`: a SHA-256 chain of R rounds, the job
`pgpool bench --profile cpu` runs) N times over P processes; no database is involved. The
bare side splits the jobs evenly and runs them in a loop: the best any pool could do. The
ratio is pool / bare.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
from pathlib import Path

from pgpool.bench.jobs import KIND, sha256_chain

ROOT = Path(__file__).resolve().parent.parent


def bare_worker(jobs: int, rounds: int) -> None:
    for _ in range(jobs):
        sha256_chain(rounds)


def bare(jobs: int, procs: int, rounds: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    share = [jobs // procs + (i < jobs % procs) for i in range(procs)]
    ps = [ctx.Process(target=bare_worker, args=(n, rounds)) for n in share]
    started = time.perf_counter()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    return jobs / (time.perf_counter() - started)


async def pooled(jobs: int, procs: int, rounds: int) -> float:
    from pgpool.host.attempt import Job
    from pgpool.host.pool import WorkerPool

    done = 0
    finished = asyncio.get_running_loop().create_future()

    def on_outcome(outcome: object) -> None:
        nonlocal done
        done += 1
        if done == jobs:
            finished.set_result(None)

    pool = WorkerPool(procs=procs, modules=["pgpool.bench.jobs"], on_outcome=on_outcome,
                      on_returned=print, on_fatal=print)
    await pool.start()
    payload = f'{{"do": "cpu", "rounds": {rounds}}}'.encode()
    started = time.perf_counter()
    # Every claimed job has a lease deadline, so each one runs under an armed fence timer.
    deadline = time.monotonic() + 3600
    pool.submit([Job(i, KIND, "default", 1, 0, 1, payload, None, deadline=deadline)
                 for i in range(jobs)])
    await finished
    rate = jobs / (time.perf_counter() - started)
    await pool.stop(grace=10)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--procs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    # Interleave the sides so drift in the machine's speed hits both alike.
    bares, pools = [], []
    for _ in range(2):
        bares.append(bare(args.jobs, args.procs, args.rounds))
        pools.append(asyncio.run(pooled(args.jobs, args.procs, args.rounds)))
    b, p = max(bares), max(pools)
    print(f"{args.jobs} jobs x {args.rounds} SHA-256 rounds on {args.procs} processes "
          f"(best of 2 each)")
    print(f"bare processes: {b:,.0f} jobs/s ({1000 * args.procs / b:.2f} ms per job)")
    print(f"WorkerPool:     {p:,.0f} jobs/s; ratio {p / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
