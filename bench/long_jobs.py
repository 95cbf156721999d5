"""What long jobs' tools cost, measured inside real workers of a real ``pgpool run``
(issue 35).

    python bench/long_jobs.py [--dsn DSN] [--calls 1000000] [--rounds 20] [--turns 2]
                              [--soft 10] [--json]

- progress: one job runs ``--calls`` iterations of ``--rounds`` SHA-256 rounds (a CPU job
  of some seconds), without and with a ``current_job().progress(i, calls)`` call per
  iteration, the two loops alternated ``--turns`` times in the same worker: the cost of a
  call, and what 1,000,000 of them add to that job's time;
- soft timeout: ``--soft`` jobs spin in a pure-Python loop until their ``soft_timeout``
  (0.5 s): how late `pgpool.SoftTimeout` came;
- checkpoint: one job stores 50 checkpoints each of 1 KiB and of 256 KiB: the time each
  took, from the handler's call to the stored answer (through the dispatcher).

The host (``--procs 1``, lease 30 s: a heartbeat every 10 s) runs on a scratch schema
(`pgpool.bench.scratch`) dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg
from drains import (  # bench/ is on the path: this script's directory
    Parser,
    at_least,
    expect_exit,
    killed_on_exit,
    script_main,
    session,
    start_pgpool_run,
)

import pgpool
from pgpool.bench.progress import Progress


def main() -> int:
    parser = Parser(description="Long jobs' progress, soft timeout and checkpoint costs")
    parser.add_argument("--dsn", help="the database (default: as `pgpool run` finds it)")
    parser.add_argument("--calls", type=at_least(1000), default=1_000_000)
    parser.add_argument("--rounds", type=at_least(1), default=20)
    parser.add_argument("--turns", type=at_least(1), default=2)
    parser.add_argument("--soft", type=at_least(1), default=10)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    return script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    with session(args.dsn, progress) as s:
        progress.step("running the jobs")
        ids = {
            "progress": [pgpool.enqueue(s.conn, "long_bench_progress", {
                "calls": args.calls, "rounds": args.rounds, "turns": args.turns})],
            "soft": [pgpool.enqueue(s.conn, "long_bench_soft", {}) for _ in range(args.soft)],
            "checkpoint": [pgpool.enqueue(s.conn, "long_bench_checkpoint",
                                          {"count": 50, "size": size})
                           for size in (1024, 256 * 1024)],
        }
        results = drain(s.conn, s.scratch.dsn, s.tmp, ids)
    loops = results["progress"][0]
    plain, with_calls = min(loops["plain"]), min(loops["progress"])
    return {
        "server": s.server, "calls": args.calls, "rounds": args.rounds,
        "plain_s": loops["plain"], "progress_s": loops["progress"],
        "ns_per_call": 1e9 * (with_calls - plain) / args.calls,
        "share": (with_calls - plain) / plain,
        "soft_late_s": results["soft"],
        "checkpoint_ms": {"1KiB": _ms(results["checkpoint"][0]),
                          "256KiB": _ms(results["checkpoint"][1])},
        "command": (f"python bench/long_jobs.py --calls {args.calls} --rounds {args.rounds}"
                    f" --turns {args.turns} --soft {args.soft}"),
    }


def drain(conn: psycopg.Connection, dsn: str, tmp: Path,
          ids: dict[str, list[int]]) -> dict[str, list[Any]]:
    """Run every job on a ``pgpool run --burst`` host; each job's result by name."""
    with open(tmp / "host.log", "w+b") as log:
        path = [str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])]
        host = start_pgpool_run(dsn, 1, 1, log, ["longbench"], PYTHONPATH=os.pathsep.join(path))
        every = [i for group in ids.values() for i in group]
        with killed_on_exit([host]):
            pgpool.wait(conn, every, timeout=3600)
            expect_exit(host, log)
    statuses = pgpool.job_statuses(conn, every)
    results = {}
    for name, group in ids.items():
        if any(statuses[i].state != "done" for i in group):
            raise SystemExit(f"long_jobs.py: error: a {name} job did not succeed: "
                             f"{[statuses[i].error for i in group]}")
        results[name] = [statuses[i].result for i in group]
    return results


def _ms(seconds: list[float]) -> dict[str, float]:
    ms = sorted(1e3 * s for s in seconds)
    return {"median": statistics.median(ms), "p95": ms[int(0.95 * (len(ms) - 1))]}


def render(report: dict[str, Any]) -> str:
    late = sorted(report["soft_late_s"])
    c = report["checkpoint_ms"]
    return "\n".join([
        f"progress: {report['calls']:,} iterations of {report['rounds']} SHA-256 rounds: "
        f"plain {min(report['plain_s']):.2f}s, with a progress call each "
        f"{min(report['progress_s']):.2f}s (best of {len(report['plain_s'])}, alternated): "
        f"{report['ns_per_call']:.0f} ns a call, {report['share']:+.2%} of the job",
        f"soft timeout (0.5 s, pure-Python loop, {len(late)} jobs): late by "
        f"{1e3 * late[0]:.1f} to {1e3 * late[-1]:.1f} ms (median "
        f"{1e3 * statistics.median(late):.1f} ms)",
        f"checkpoint, ms from the call to its stored answer: 1 KiB median "
        f"{c['1KiB']['median']:.2f} (p95 {c['1KiB']['p95']:.2f}), 256 KiB median "
        f"{c['256KiB']['median']:.2f} (p95 {c['256KiB']['p95']:.2f})",
        f"to repeat: {report['command']}",
    ])


if __name__ == "__main__":
    sys.exit(main())
