"""What serving Prometheus metrics costs the dispatcher, side by side in one run.

    python bench/metrics_overhead.py [--jobs N] [--rounds R] [--procs P]

Runs ``pgpool bench --profile noop`` (the dispatcher's per-job cost is all there is) R times
without and R times with ``--metrics``, alternating, each in its own scratch schema, and
prints each drive's steady jobs/s and the dispatcher's CPU per job, then the median of the
pairwise ratios (with / without). Noop jobs are the worst case: with real work the
instruments' microseconds per job vanish beside the job.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def drive(jobs: int, procs: int, metrics: bool) -> tuple[float, float]:
    """(steady jobs/s, dispatcher CPU µs per job) of one `pgpool bench` drive."""
    cmd = [sys.executable, "-m", "pgpool", "bench", "--profile", "noop", "--jobs", str(jobs),
           "--procs", str(procs), "--json", *(["--metrics"] if metrics else [])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    d = json.loads(out)["drive"]
    return d["steady_jobs_per_s"], 1e6 * d["cpu_seconds"]["dispatcher"] / d["jobs_drained"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args()
    rate_ratios, cpu_ratios = [], []
    for r in range(args.rounds):
        off = drive(args.jobs, args.procs, metrics=False)
        on = drive(args.jobs, args.procs, metrics=True)
        rate_ratios.append(on[0] / off[0])
        cpu_ratios.append(on[1] / off[1])
        print(f"round {r + 1}: without {off[0]:8.0f} jobs/s {off[1]:5.1f} µs CPU/job | "
              f"with metrics {on[0]:8.0f} jobs/s {on[1]:5.1f} µs CPU/job")
    print(f"median ratio with/without: jobs/s {statistics.median(rate_ratios):.3f}, "
          f"dispatcher CPU per job {statistics.median(cpu_ratios):.3f}")


if __name__ == "__main__":
    main()
