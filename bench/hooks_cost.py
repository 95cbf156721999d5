"""What the handler author's observability costs: worker hooks and OpenTelemetry spans on a
real drain, and an ``on_enqueue`` hook and a traced enqueue on the producer's side, each
measured beside the plain case in one run (issue 23).

    python bench/hooks_cost.py [--dsn DSN] [--jobs 40000] [--enqueues 2000] [--procs 2]
                               [--batch 50] [--rounds 2] [--json]

The drains: each round, each variant gets ``--jobs`` fresh no-op bench jobs, COPY-loaded
into the just-vacuumed table of a scratch schema (`pgpool.bench.scratch`, dropped at the
end), drained by a real ``pgpool run --procs P --batch B --burst``, its claim budget
lifted. The variants differ only in the handler modules the host also imports:

- ``plain``: none, the case every kind that uses none of this is in;
- ``hooks``: bench/costhooks.py, an ``on_start`` and an ``on_end`` hook that do nothing;
- ``otel``: bench/costotel.py, the OpenTelemetry SDK with a batch span processor that
  exports to nowhere: each job runs in a consumer span.

The variants take turns, in a new order each round. Per drain: jobs/s over the host's
whole run (start-up included, the same for all) and the CPU the host's processes used
per job (the dispatcher and its workers, from this process's children's rusage).

The enqueues: ``--enqueues`` calls of `pgpool.enqueue` in one transaction, plain, with an
``on_enqueue`` hook that does nothing, and inside an OpenTelemetry span (the SDK as above),
each best of the rounds; µs per call.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Final

import psycopg
from drains import (  # bench/ is on the path: this script's directory
    Parser,
    add_drain_options,
    at_least,
    drains_in_turns,
    script_main,
    session,
    timed_drain,
    with_bench_modules,
)

import pgpool
from pgpool import hooks
from pgpool.bench.jobs import KIND
from pgpool.bench.progress import Progress

#: The drains' variants: the handler modules the host imports besides the bench's.
VARIANTS: Final = {"plain": (), "hooks": ("costhooks",), "otel": ("costotel",)}


def main() -> int:
    parser = Parser(description="Observability's cost beside the plain case")
    add_drain_options(parser)
    parser.add_argument("--enqueues", type=at_least(100), default=2000)
    return script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    with session(args.dsn, progress) as s:
        drains = drains_in_turns(s, list(VARIANTS), args, progress, drain)
        enqueues = enqueue_costs(s.conn, args.enqueues, args.rounds)
    return {"server": s.server, "jobs": args.jobs, "procs": args.procs,
            "batch": args.batch, "drains": drains, "enqueue_us": enqueues,
            "command": (f"python bench/hooks_cost.py --jobs {args.jobs} --enqueues "
                        f"{args.enqueues} --procs {args.procs} --batch {args.batch} "
                        f"--rounds {args.rounds}")}


def drain(conn: psycopg.Connection, dsn: str, tmp: Path, name: str,
          args: argparse.Namespace) -> dict[str, float]:
    """One drain of ``args.jobs`` fresh jobs by a host that also imports the variant's
    modules: jobs/s over its whole run and its processes' CPU µs per job."""
    return timed_drain(conn, dsn, tmp / f"{name}.log", args.jobs, args.procs, args.batch,
                       VARIANTS[name], PYTHONPATH=with_bench_modules())


def enqueue_costs(conn: psycopg.Connection, n: int, rounds: int) -> dict[str, float]:
    """µs per `pgpool.enqueue` call, best of ``rounds``: plain, with an ``on_enqueue``
    hook, inside an OpenTelemetry span (imported last: once loaded, it stays)."""
    def timed() -> float:
        with conn.transaction(force_rollback=True):
            t = time.perf_counter()
            for i in range(n):
                pgpool.enqueue(conn, KIND, {"do": "noop", "n": i})
            return 1e6 * (time.perf_counter() - t) / n

    costs = {"plain": min(timed() for _ in range(rounds))}
    with hooks.isolated():
        hooks.on_enqueue(lambda enqueued: None)
        costs["on_enqueue"] = min(timed() for _ in range(rounds))
    import costotel  # noqa: F401  (sets the SDK up)
    from opentelemetry import trace

    with trace.get_tracer("hooks_cost").start_as_current_span("request"):
        costs["traced"] = min(timed() for _ in range(rounds))
    return costs


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['jobs']:,} no-op jobs per drain, --procs {report['procs']} "
             f"--batch {report['batch']}"]
    plain = report["drains"]["plain"]
    for name, runs in report["drains"].items():
        for i, d in enumerate(runs):
            base = plain[i]
            lines.append(f"  {name:6} round {i + 1}: {d['jobs_per_s']:8,.0f} jobs/s "
                         f"({d['jobs_per_s'] / base['jobs_per_s']:.2f} of plain), "
                         f"{d['cpu_us_per_job']:6.1f} µs CPU a job "
                         f"({d['cpu_us_per_job'] - base['cpu_us_per_job']:+.1f})")
    e = report["enqueue_us"]
    lines.append(f"enqueue, µs a call: plain {e['plain']:.1f}, with an on_enqueue hook "
                 f"{e['on_enqueue']:.1f}, in a span {e['traced']:.1f}")
    lines.append(f"to repeat: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
