"""PostgreSQL queues behind a pinned xmin horizon: a hand-written loop, PgQueuer and pgpool
drain the same no-op jobs on one server, with and without a long transaction open (issue 32).

    python bench/peers.py [--dsn DSN] [--jobs 200000] [--rounds 2] [--pin both|off|on]
                          [--systems loop,pgqueuer,pgpool] [--interval 4] [--json]

Why: a long transaction elsewhere (a report, a ``pg_dump``, a session idle in a
transaction) pins the xmin horizon, so no vacuum can remove the rows that claimed jobs leave
behind, and every claim walks them: the most reported pain of every PostgreSQL queue. Issue
32's targets: pgpool's pinned drain at >= 0.8 of its unpinned one and >= 1.5x PgQueuer's
pinned rate on the same server; under the pin, every interval of each of two back-to-back
batches at >= 0.8 of that batch's first, and the second batch at >= 0.8 of the first.

The systems (`PROCS` processes and claims of `BATCH` jobs each), all in one scratch schema
(`pgpool.bench.scratch`, dropped at the end with everything in it):

- ``loop``: bench/vs_loop.py's hand-written loop, each process repeating BEGIN; a ``SELECT
  ... FOR NO KEY UPDATE SKIP LOCKED`` of 50 ready jobs; each job run in-process; one DELETE
  of their ids; COMMIT. Its jobs are pgpool's, COPY-loaded by `pgpool.enqueue_many`.
- ``pgqueuer``: PgQueuer (``pip install pgqueuer==1.6.0``; imported only for this row,
  which is left out with a one-line note when it is not installed), its tables installed by
  its API in the scratch schema. Its jobs are loaded by its producer's batch enqueue, 10,000
  a statement (it has no COPY). Its consumers are two processes (bench/pgqueuer_side.py), each
  PgQueuer's own runner (``pgqueuer.run``, what ``pgq run`` calls, on uvloop as ``pgq run``
  does) of one QueueManager in drain mode with ``batch_size`` 50, on PgQueuer's psycopg 3
  async driver, its other settings PgQueuer's defaults. Two processes: an asyncio consumer
  uses one core, and the other systems run two processes on the two cores of the machine
  these figures come from; each claims 50, as they do.
- ``pgpool``: a real ``pgpool run --procs 2 --batch 50 --burst``, its claim budget lifted.

Every job is ``{"do": "noop"}``, run as a pgpool worker runs it: decoded by orjson, then the
bench handler (`pgpool.bench.jobs`). A turn is one system, pinned or not: its table
vacuumed, then (pinned: another session takes a REPEATABLE READ snapshot, `drains.pinned`)
``--rounds`` rounds back to back, each loading ``--jobs`` jobs and draining them, with no
vacuum between them; the snapshot is released after the last drain. With ``--pin both``
each system has a turn of each: the unpinned turns in ``--systems`` order, then the pinned
ones in the reverse order, so that no system always goes first and every system's two
turns are centred on the run's middle. The VM's speed drifts by up to 15% within minutes:
compare figures within one run only.

Timing, the same for every system (`cliff.drive`): the clock starts when the first job in
claim order is claimed (a primary key lookup every 20 ms) and stops when no job is left;
the jobs left are counted every ``--interval`` seconds. Per round: the mean rate and the
rate of each interval; per turn: the mean of its rounds' rates, its slowest interval
against the first (the lowest of its rounds) and its later rounds against round 1 (the
lowest). Per system: jobs/s not pinned and pinned, and pinned / not.

It prints a table like the issue's, a line per turn and round, pgpool's figures against
the issue's targets and the command that reproduces the run; ``--json`` prints all of it
as one JSON object instead. A system that fails, stalls or leaves a job undone ends the run
with one line (``peers: error: ...``, exit 1), its processes killed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import IO, Any, Final

import cliff  # bench/ is on the path: this script's directory
import drains
import pgqueuer_side
import psycopg
import vs_loop

import pgpool
from pgpool.bench import queries
from pgpool.bench.jobs import KIND
from pgpool.bench.options import BenchError
from pgpool.bench.progress import Progress
from pgpool.bench.scratch import expect_empty

#: The systems, in their default order.
SYSTEMS: Final = ("loop", "pgqueuer", "pgpool")
#: Every system's processes and jobs per claim: the issue's workload.
PROCS: Final = 2
BATCH: Final = 50
#: The issue's targets for pgpool: pinned / not pinned, pinned against PgQueuer's pinned,
#: the slowest interval against the first and the later rounds against round 1 (pinned).
TARGETS: Final = {"pinned_to_not": 0.8, "pinned_to_pgqueuer_pinned": 1.5,
                  "slowest_to_first_interval": 0.8, "later_to_round_1": 0.8}


def main() -> int:
    parser = drains.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: as `pgpool run` resolves it)")
    parser.add_argument("--jobs", type=drains.at_least(10), default=200_000,
                        help="jobs loaded per round (default 200000, at least 10)")
    parser.add_argument("--rounds", type=drains.at_least(1), default=2,
                        help="rounds back to back per turn (default 2)")
    parser.add_argument("--pin", choices=("both", "off", "on"), default="both",
                        help="turns without and with a REPEATABLE READ snapshot held open, or "
                             "only one of them (default both)")
    parser.add_argument("--systems", type=_systems, default=list(SYSTEMS),
                        help=f"which, in this order (default {','.join(SYSTEMS)})")
    parser.add_argument("--interval", type=drains.count_interval, default=4.0,
                        help="seconds between counts of the jobs left (default 4)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return drains.script_main(parser, run, render)


def _systems(text: str) -> list[str]:
    names = text.split(",")
    if not set(names) <= set(SYSTEMS) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: name each of {', '.join(SYSTEMS)} at most once, with commas")
    return names


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Every turn, in a scratch schema; returns the report as a JSON-ready dict. Raises
    `BenchError` if a system fails, stalls or leaves a job undone."""
    systems, pgqueuer_version = _available(args.systems)
    if not systems:
        raise BenchError("no system left to run")
    turns: list[dict[str, Any]] = []
    with drains.session(args.dsn, progress) as s:
        if pgqueuer_version:
            progress.step("installing PgQueuer's tables")
            asyncio.run(pgqueuer_side.install(s.scratch.dsn))
        for system, pin in _schedule(systems, args.pin):
            turns.append(_turn(s, system, pin, args, progress))
    by_system = {system: _compare(system, turns) for system in systems}
    return {"server": s.server, "schema": s.scratch.name,
            "options": {"jobs": args.jobs, "rounds": args.rounds, "pin": args.pin,
                        "systems": systems, "interval": args.interval, "procs": PROCS,
                        "batch": BATCH, "max_claims_per_sec": drains.UNTHROTTLED},
            "pgqueuer_version": pgqueuer_version,
            "left_out": [system for system in args.systems if system not in systems],
            "turns": turns, "systems": by_system, "targets": TARGETS,
            "pgpool_to_targets": _against_targets(by_system),
            "command": _command(args)}


def _available(systems: list[str]) -> tuple[list[str], str | None]:
    """The systems that can run, and PgQueuer's version if it is one of them: without
    PgQueuer installed, a one-line note and its row left out."""
    if "pgqueuer" not in systems:
        return systems, None
    version = pgqueuer_side.installed()
    if version is None:
        print(f"peers: note: PgQueuer is not installed, its row is left out (pip install "
              f"{pgqueuer_side.PGQUEUER})", file=sys.stderr)
        return [system for system in systems if system != "pgqueuer"], None
    return systems, version


def _schedule(systems: list[str], pin: str) -> list[tuple[str, bool]]:
    """The turns, (system, pinned), in order (see the module's text)."""
    if pin == "both":
        return [(s, False) for s in systems] + [(s, True) for s in reversed(systems)]
    return [(s, pin == "on") for s in systems]


def _turn(s: drains.Session, system: str, pin: bool, args: argparse.Namespace,
          progress: Progress) -> dict[str, Any]:
    """One system's ``args.rounds`` rounds back to back, under one pin if ``pin``."""
    conn = s.conn
    queue = pgqueuer_side.PGQUEUER_JOBS if system == "pgqueuer" else drains.PGPOOL_JOBS
    # The turn starts on a vacuumed table, as the previous turn's dead rows (the loop's and
    # pgpool's share a table) are not this one's.
    conn.execute(pgqueuer_side.VACUUM_PGQUEUER if system == "pgqueuer" else queries.VACUUM)
    rounds = []
    with drains.pinned(s.scratch.dsn if pin else None):
        for number in range(1, args.rounds + 1):
            what = f"{system}, {'pinned' if pin else 'not pinned'}, round {number}"
            progress.step(f"{what}: loading {args.jobs:,} jobs")
            started = time.monotonic()
            first_id = _load(conn, system, args.jobs)
            loaded = time.monotonic() - started
            progress.step(f"{what}: draining them")
            with open(s.tmp / f"{system}-{number}.log", "w+b") as log:
                side = _side(conn, system, s.scratch.dsn, log)
                figures = cliff.drive(conn, side, queue, args.jobs, first_id, args.interval,
                                      progress)
            if system != "pgqueuer":  # PgQueuer's side checks its own in `finish`
                expect_empty(conn, side.title, 0)
            progress.step(f"{what}: {figures['mean_jobs_per_s']:,.0f} jobs/s")
            rounds.append({"round": number, "load_seconds": loaded, **figures})
    rates = [r["mean_jobs_per_s"] for r in rounds]
    slowest = [r["slowest_to_first_interval"] for r in rounds]
    return {"system": system, "pinned": pin, "rounds": rounds,
            "jobs_per_s": statistics.fmean(rates),
            # None where a round had no rate in its first interval.
            "slowest_to_first_interval": None if None in slowest else min(slowest),
            "later_to_round_1": min((rate / rates[0] for rate in rates[1:]), default=None)}


def _load(conn: psycopg.Connection, system: str, n: int) -> int:
    """``n`` no-op jobs for ``system``, with consecutive ids; the first one's."""
    if system != "pgqueuer":
        pgpool.enqueue_many(conn, KIND, ({"do": "noop"} for _ in range(n)))
        return drains.last_id(conn) - n + 1
    return pgqueuer_side.enqueue(conn, [{"do": "noop"}] * n)


def _side(conn: psycopg.Connection, system: str, dsn: str, log: IO[bytes]) -> drains.Side:
    """What drains ``system``'s jobs on ``dsn``, its processes' output in ``log``."""
    if system == "loop":
        return vs_loop.Loop(dsn, PROCS, BATCH, log, "transaction")
    if system == "pgpool":
        return drains.Pgpool(dsn, PROCS, BATCH, log)
    return pgqueuer_side.PgQueuer(conn, dsn, PROCS, BATCH, log)


def _compare(system: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """``system``'s turns side by side: each by whether it was pinned, and pinned / not."""
    by_pin = {t["pinned"]: t for t in turns if t["system"] == system}
    off, on = by_pin.get(False), by_pin.get(True)
    return {"not_pinned_jobs_per_s": off and off["jobs_per_s"],
            "pinned_jobs_per_s": on and on["jobs_per_s"],
            "pinned_to_not": on["jobs_per_s"] / off["jobs_per_s"] if on and off else None,
            # The pinned turn's, if any: the targets are for it.
            "slowest_to_first_interval": (on or off)["slowest_to_first_interval"],
            "later_to_round_1": (on or off)["later_to_round_1"]}


def _against_targets(by_system: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """pgpool's figures for `TARGETS` (None where this run has none)."""
    mine, theirs = by_system.get("pgpool"), by_system.get("pgqueuer")
    if mine is None:
        return dict.fromkeys(TARGETS)
    pinned = mine["pinned_jobs_per_s"]
    return {"pinned_to_not": mine["pinned_to_not"],
            "pinned_to_pgqueuer_pinned": (pinned / theirs["pinned_jobs_per_s"]
                                          if pinned and theirs and theirs["pinned_jobs_per_s"]
                                          else None),
            "slowest_to_first_interval": mine["slowest_to_first_interval"],
            "later_to_round_1": mine["later_to_round_1"]}


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces the run (the DSN stays out: it may hold a
    password)."""
    dsn = " --dsn DSN" if args.dsn else ""
    return (f"python bench/peers.py{dsn} --jobs {args.jobs} --rounds {args.rounds} "
            f"--pin {args.pin} --systems {','.join(args.systems)} --interval {args.interval:g}")


def render(report: dict[str, Any]) -> str:
    """The report as text: the table, a line per turn, pgpool against the targets, and
    the command."""
    s, o = report["server"], report["options"]
    version = report["pgqueuer_version"]
    labels = {"loop": f"hand-written loop (claim {BATCH} + delete, {PROCS} processes)",
              "pgqueuer": f"PgQueuer {version} ({PROCS} consumers, batch {BATCH})",
              "pgpool": f"pgpool (`--procs {PROCS} --batch {BATCH}`, budget lifted)"}
    of = "pinned" if o["pin"] != "off" else "not pinned"
    lines = [f"{o['jobs']:,} no-op jobs per round, {o['rounds']} rounds back to back per "
             f"turn; PostgreSQL {s['version']} (fsync={s['fsync']}, synchronous_commit="
             f"{s['synchronous_commit']}, full_page_writes={s['full_page_writes']}, "
             f"shared_buffers={s['shared_buffers']})",
             "",
             f"| {o['jobs']:,} no-op jobs a round | not pinned, jobs/s | pinned, jobs/s | "
             f"pinned / not | slowest "
             f"{o['interval']:g} s interval / first, {of} | later round / round 1, {of} |",
             "|---|---:|---:|---:|---:|---:|"]
    for system, f in report["systems"].items():
        lines.append(f"| {labels[system]} | {_rate(f['not_pinned_jobs_per_s'])} | "
                     f"{_rate(f['pinned_jobs_per_s'])} | {drains.ratio(f['pinned_to_not'])} | "
                     f"{drains.ratio(f['slowest_to_first_interval'])} | "
                     f"{drains.ratio(f['later_to_round_1'])} |")
    lines.append("")
    for t in report["turns"]:
        rounds = "; ".join(
            f"{r['mean_jobs_per_s']:,.0f} jobs/s in {r['seconds']:.1f} s (slowest interval "
            f"{drains.ratio(r['slowest_to_first_interval'])} of the first, loaded in "
            f"{r['load_seconds']:.1f} s)" for r in t["rounds"])
        lines.append(f"{t['system']}, {'pinned' if t['pinned'] else 'not pinned'}: {rounds}")
    if "pgpool" in report["systems"]:
        got, want = report["pgpool_to_targets"], report["targets"]
        lines.append(
            f"pgpool against the targets: pinned / not {drains.ratio(got['pinned_to_not'])} "
            f"(>= {want['pinned_to_not']:g}), pinned / PgQueuer's pinned "
            f"{drains.ratio(got['pinned_to_pgqueuer_pinned'])} (>= "
            f"{want['pinned_to_pgqueuer_pinned']:g}), slowest interval / first "
            f"{drains.ratio(got['slowest_to_first_interval'])} (>= "
            f"{want['slowest_to_first_interval']:g}), later round / round 1 "
            f"{drains.ratio(got['later_to_round_1'])} (>= {want['later_to_round_1']:g})")
    lines.append(f"reproduce: {report['command']}")
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


if __name__ == "__main__":
    sys.exit(main())
