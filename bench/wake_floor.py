"""The floor of a per-job hand-off on this machine, without pgpool (issue 34).

    python bench/wake_floor.py [--job-ms 5] [--jobs 600] [--depth 2] [--pace-ms 0]

A parent process sends a child one job per pipe write (40 bytes) and waits in ``epoll``
for each result; the child burns ``--job-ms`` of CPU per job and writes a result back.
The parent keeps ``--depth`` jobs sent and not finished. With ``--pace-ms``, the parent
sleeps that long after each wake, so that one wake reads several results (pgpool's paced
reads, `pgpool.host.pool.PACE_SECONDS`). It prints the parent's CPU per job, read from
/proc/self/schedstat (the scheduler's own count of time on a CPU), and the jobs/s.

What it shows: the CPU a process pays per wake-up for little more than a read and a write,
which on a VM grows with the time it slept (an idle vCPU is slow to wake, a cold cache is
slow to run); pgpool's dispatcher pays it on the cores the jobs need.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import select
import time


def _runtime_ns() -> int:
    with open("/proc/self/schedstat") as f:
        return int(f.read().split()[0])


def _child(jobs: int, results: int, job_seconds: float) -> None:
    while True:
        data = os.read(jobs, 1 << 16)
        if not data:
            os._exit(0)
        for _ in range(len(data) // 40):
            until = time.thread_time() + job_seconds
            digest = b"x"
            while time.thread_time() < until:
                digest = hashlib.sha256(digest).digest()
            os.write(results, b"r" * 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-ms", type=float, default=5.0)
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--pace-ms", type=float, default=0.0)
    args = parser.parse_args()
    jobs_r, jobs_w = os.pipe()
    results_r, results_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(jobs_w)
        os.close(results_r)
        _child(jobs_r, results_w, args.job_ms / 1000)
    os.close(jobs_r)
    os.close(results_w)
    poll = select.epoll()
    poll.register(results_r, select.EPOLLIN)
    before, started = _runtime_ns(), time.monotonic()
    sent = done = 0
    while sent < min(args.depth, args.jobs):
        os.write(jobs_w, b"j" * 40)
        sent += 1
    while done < args.jobs:
        poll.poll()
        if args.pace_ms:
            time.sleep(args.pace_ms / 1000)
        finished = len(os.read(results_r, 1 << 16)) // 30
        done += finished
        more = min(finished, args.jobs - sent)
        if more:
            os.write(jobs_w, b"j" * 40 * more)
            sent += more
    spent, took = _runtime_ns() - before, time.monotonic() - started
    os.close(jobs_w)
    os.waitpid(pid, 0)
    print(f"jobs of {args.job_ms:g} ms, depth {args.depth}, pace {args.pace_ms:g} ms: parent "
          f"{spent / 1e3 / args.jobs:.1f} µs of CPU per job, {args.jobs / took:,.0f} jobs/s")


if __name__ == "__main__":
    main()
