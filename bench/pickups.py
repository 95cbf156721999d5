"""Idle pickup side by side: pgpool, another checkout's pgpool and PgQueuer, each beside
the floor a bare listener reaches, in turns (issue 34).

    python bench/pickups.py [--dsn DSN] [--samples 200] [--rounds 2] [--checkout DIR]
                            [--pgqueuer] [--json]

Why: issue 34's target for an idle host is a pickup p50 within 0.3 ms of the bare floor
and a p99 of at most 3 ms, and its table puts pgpool's pickup beside PgQueuer's and a
hand-written loop's. A small VM's speed drifts by up to 15% within minutes, so the sides
take turns within one run (the order reversed every other round) and each is compared
with the floor measured right after it.

A side's pickup: jobs enqueued one at a time, each in its own committed transaction after
an idle gap of 5 to 20 ms (`pgpool.bench.pickup.PICKUP_GAP`), timed from the commit
returning to the handler starting (the bench handler writes its start to a FIFO); one job
first, untimed, warms the worker.

- ``pgpool``: a real ``pgpool run --procs 1`` (`pgpool.bench.pickup.measure_pickup`).
- ``checkout`` (``--checkout DIR``): the same with another checkout's pgpool (main before
  a change, as a git worktree), run from that directory, in a scratch schema it migrated
  itself (bench/vs_loop.py's ``--checkout``).
- ``pgqueuer`` (``--pgqueuer``; ``pip install pgqueuer==1.6.0``, not a pgpool
  dependency, nor is asyncpg, which it needs here): one consumer of bench/pgqueuer_side.py,
  PgQueuer's own runner in continuous mode with ``batch_size`` 50 on its asyncpg driver,
  woken by its table's trigger; the jobs enqueued by its producer. On its psycopg 3
  driver (bench/peers.py's drains) every pickup took a second: its notifications are
  awaited on the connection its queries use, a second at a time. Its first job may wait
  for its poll (PgQueuer's default dequeue timeout) if it comes before its LISTEN.
- The floor, after each side (`pgpool.bench.pickup.pickup_floor`): a LISTENing connection
  and a hand-written claim of the job, committed. What a loop that listened would reach;
  no framework does better.

It prints per round and side p50, p99 and the largest pickup in ms, the floor measured
after it and p50 less that floor, then each side's medians over the rounds against the
issue's targets and the command that reproduces the run; ``--json`` prints all of it as
one JSON object instead. A side that fails or stalls ends the run with one line
(``pickups: error: ...``, exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
from pathlib import Path
from typing import Any, Final

import drains  # bench/ is on the path: this script's directory
import orjson
import pgqueuer_side
import psycopg
import vs_loop

from pgpool.bench.figures import quantile
from pgpool.bench.jobs import KIND
from pgpool.bench.options import BenchOptions
from pgpool.bench.pickup import measure_pickup, pickup_floor, stamped
from pgpool.bench.progress import Progress

#: The sides in the order of odd rounds (even rounds reverse it).
SIDES: Final = ("pgpool", "checkout", "pgqueuer")
#: Jobs per claim of each side's host (PgQueuer's batch_size too), as bench/peers.py's.
BATCH: Final = 50
#: Issue 34's targets: p50 over the floor at most, p99 at most (ms).
TARGETS: Final = {"p50_over_floor_ms": 0.3, "p99_ms": 3.0}


def main() -> int:
    parser = drains.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: as `pgpool run` resolves it)")
    parser.add_argument("--samples", type=drains.at_least(20), default=200,
                        help="jobs timed per side and round (default 200, at least 20)")
    parser.add_argument("--rounds", type=drains.at_least(1), default=2, help="(default 2)")
    vs_loop.add_other_sides(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return drains.script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Every round, in scratch schemas; returns the report as a JSON-ready dict. Raises
    `BenchError` if a side fails or stalls."""
    sides = [side for side in SIDES if side == "pgpool"
             or (side == "checkout" and args.checkout)
             or (side == "pgqueuer" and args.pgqueuer)]
    pgqueuer_version = pgqueuer_side.version("--pgqueuer") if args.pgqueuer else None
    opts = BenchOptions(dsn="", jobs=args.samples, procs=1, batch=BATCH,
                        profile="noop", backlog=0, max_claims_per_sec=None)
    rounds: list[dict[str, Any]] = []
    with (drains.session(args.dsn, progress) as s, contextlib.ExitStack() as stack):
        # Each side's schema (its DSN) and this script's connection to it.
        places = dict.fromkeys(("pgpool", "pgqueuer"), (s.scratch.dsn, s.conn))
        if args.checkout:
            place = stack.enter_context(
                vs_loop.checkout_place(args.dsn, args.checkout, progress))
            places["checkout"] = (place.dsn, place.conn)
        if args.pgqueuer:
            progress.step("installing PgQueuer's tables")
            asyncio.run(pgqueuer_side.install(s.scratch.dsn))
        for number in range(1, args.rounds + 1):
            order = sides if number % 2 else sides[::-1]
            figures = {}
            for side in order:
                dsn, conn = places[side]
                progress.step(f"round {number}, {side}: {args.samples} pickups")
                if side == "pgqueuer":
                    f = _pgqueuer_pickup(dsn, conn, s.tmp, args.samples)
                else:
                    f = measure_pickup(opts, dsn, conn, s.tmp, progress,
                                       checkout=args.checkout if side == "checkout" else None)
                f["p50_over_floor_ms"] = f["p50_ms"] - f["floor_p50_ms"]
                figures[side] = f
                progress.step(f"round {number}, {side}: p50 {f['p50_ms']:.2f} ms, floor "
                              f"{f['floor_p50_ms']:.2f} ms")
            rounds.append({"round": number, "order": list(order), **figures})
    medians = {side: {key: statistics.median(r[side][key] for r in rounds)
                      for key in ("p50_ms", "p99_ms", "floor_p50_ms", "p50_over_floor_ms")}
               for side in sides}
    return {"server": s.server, "options": {
                "samples": args.samples, "rounds": args.rounds, "sides": sides,
                "checkout": args.checkout and vs_loop.describe(args.checkout),
                "pgqueuer_version": pgqueuer_version},
            "rounds": rounds, "median": medians, "targets": TARGETS,
            "command": _command(args)}


def _pgqueuer_pickup(dsn: str, conn: psycopg.Connection, tmp: Path,
                     samples: int) -> dict[str, Any]:
    """PgQueuer's pickups and the floor after them, as `measure_pickup` gives pgpool's."""
    from pgqueuer.db import SyncPsycopgDriver  # imported here: not a pgpool dependency
    from pgqueuer.queries import SyncQueries

    enqueue = SyncQueries(SyncPsycopgDriver(conn)).enqueue
    payload = orjson.dumps({"do": "noop", "stamp": True})
    command = [sys.executable, pgqueuer_side.__file__, str(BATCH), "continuous"]
    conn.execute(pgqueuer_side.VACUUM_PGQUEUER)
    with stamped(tmp, command, {"PGPOOL_DSN": dsn}, "the PgQueuer consumer") as consumer:
        latencies = consumer.pickups(lambda: enqueue(KIND, payload, 0), samples)
    floor = pickup_floor(dsn, conn, samples)
    return {"samples": len(latencies), "procs": 1,
            "p50_ms": quantile(latencies, 0.50), "p99_ms": quantile(latencies, 0.99),
            "max_ms": latencies[-1], "floor_p50_ms": quantile(floor, 0.50),
            "floor_p99_ms": quantile(floor, 0.99)}


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces the run (the DSN stays out: it may hold a
    password)."""
    dsn = " --dsn DSN" if args.dsn else ""
    return (f"python bench/pickups.py{dsn} --samples {args.samples} --rounds {args.rounds}"
            f"{vs_loop.other_options(args)}")


def render(report: dict[str, Any]) -> str:
    """The report as text: a line per round and side, each side's medians against the
    targets, and the command."""
    s, o, t = report["server"], report["options"], report["targets"]
    lines = [f"idle pickup, {o['samples']} jobs per side and round, each committed alone "
             f"after an idle gap; PostgreSQL {s['version']} (fsync={s['fsync']}, "
             f"synchronous_commit={s['synchronous_commit']})"]
    lines += vs_loop.other_sides(o)
    width = max(map(len, o["sides"]))
    for r in report["rounds"]:
        for side in r["order"]:
            f = r[side]
            lines.append(f"round {r['round']} {side:<{width}}  p50 {f['p50_ms']:.2f} ms, p99 "
                         f"{f['p99_ms']:.2f} ms, max {f['max_ms']:.2f} ms; floor after it "
                         f"p50 {f['floor_p50_ms']:.2f} ms, p99 {f['floor_p99_ms']:.2f} ms; "
                         f"p50 over the floor {f['p50_over_floor_ms']:+.2f} ms")
    for side, m in report["median"].items():
        line = (f"median {side}: p50 {m['p50_ms']:.2f} ms ({m['p50_over_floor_ms']:+.2f} over "
                f"the floor's {m['floor_p50_ms']:.2f}), p99 {m['p99_ms']:.2f} ms")
        if side == "pgpool":
            line += (f" (targets: at most +{t['p50_over_floor_ms']:g} over the floor, p99 at "
                     f"most {t['p99_ms']:g})")
        lines.append(line)
    lines.append(f"reproduce: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
