"""The second big batch: how fast a real dispatcher drains a big batch of jobs, round after
round, on the table the previous round left behind (issue 20).

    python bench/cliff.py [--dsn DSN] [--jobs 400000] [--rounds 2] [--procs 2] [--batch 50]
                          [--interval 4] [--pin] [--json]

In a scratch schema (`pgpool.bench.scratch`, dropped afterwards), each round COPY-loads
``--jobs`` no-op bench jobs (`pgpool.enqueue_many`, kind `pgpool.bench.jobs.KIND`) and
drains them with a real ``pgpool run --procs P --batch B --burst``, its claim budget lifted
so that it is never throttled. Nothing vacuums the table between rounds: the dead rows a
drain leaves (in the table and in its ready index) are the point, and only autovacuum, with
pgpool's own settings for the table, cleans up after them, as in production.

The clock starts when the dispatcher claims the first job (its start-up is reported apart).
The jobs left are counted every ``--interval`` seconds, which gives a rate per interval.
The first and last tenth are timed by job: the COPY gives the jobs consecutive ids, all due
at the same time at one priority, so the claim order is the id order, and a primary key
lookup every `POLL` seconds sees when the job at 0%, 10%, 90% and 100% of that order is
claimed. Per round it prints the drain time and mean rate, the rate of each interval, the
claim rates over the first and last tenth and their ratio, the slowest interval against
the first, and the table's dead rows and autovacuum runs; at the end each later round's mean
rate against round 1's. ``--json`` prints all of it as one JSON object instead.

With ``--pin``, another session holds a REPEATABLE READ snapshot open from before the
first load to the end of the last round, as a long report, a ``pg_dump`` or a session left
idle in a transaction would: it pins the xmin horizon, so no vacuum can remove a row that
any round's claims and acks leave dead.

A dispatcher that exits before the jobs are drained, makes no progress for `STALL` seconds
or does not exit once they are drained ends the run with an error (exit 1), killed.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from itertools import pairwise
from typing import Any, Final

import psycopg
from drains import (  # bench/ is on the path: this script's directory
    PGPOOL_JOBS,
    STALL,
    UNTHROTTLED,
    Parser,
    Pgpool,
    Queue,
    Side,
    at_least,
    count_interval,
    killed_on_exit,
    last_id,
    marker_states,
    pinned,
    ratio,
    remaining,
    script_main,
    session,
)

import pgpool
from pgpool.bench.jobs import KIND
from pgpool.bench.options import BenchError
from pgpool.bench.progress import Progress

#: What autovacuum did for the jobs table (statistics, so a little behind).
TABLE_STATS: Final = """
SELECT n_dead_tup, last_autovacuum, autovacuum_count,
       extract(epoch FROM now() - last_autovacuum)::float8
FROM pg_stat_user_tables WHERE relid = 'pgpool_jobs'::regclass
"""

#: Seconds between looks at the marker jobs: the resolution of the claim times (a primary
#: key lookup of four rows, cheap next to the drive's own statements).
POLL: Final = 0.02
#: The marker jobs, by their place in the claim order: the first job, the one after the
#: first tenth, the one before the last tenth, and the last job (see `drive`).
MARKER_NAMES: Final = ("first", "tenth", "ninth", "last")


def main() -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: as `pgpool run` resolves it)")
    parser.add_argument("--jobs", type=at_least(10), default=400_000,
                        help="jobs loaded per round (default 400000, at least 10)")
    parser.add_argument("--rounds", type=at_least(1), default=2, help="(default 2)")
    parser.add_argument("--procs", type=at_least(1), default=2,
                        help="worker processes of the dispatcher (default 2)")
    parser.add_argument("--batch", type=at_least(1), default=50,
                        help="jobs per claim (default 50)")
    parser.add_argument("--interval", type=count_interval, default=4.0,
                        help=f"seconds between counts of the jobs left (default 4, at most "
                             f"{STALL / 2:g}: a stall is noticed at a count)")
    parser.add_argument("--pin", action="store_true",
                        help="hold a REPEATABLE READ snapshot open through every round (a "
                             "pinned xmin horizon)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Every round, in a scratch schema; returns the report as a JSON-ready dict. Raises
    `BenchError` if a dispatcher fails or stalls."""
    rounds: list[dict[str, Any]] = []
    with (session(args.dsn, progress) as (server, scratch, conn, tmp),
          pinned(scratch.dsn if args.pin else None)):
        for number in range(1, args.rounds + 1):
            progress.step(f"round {number}: loading {args.jobs:,} jobs (COPY, no vacuum)")
            started = time.monotonic()
            pgpool.enqueue_many(conn, KIND, ({"do": "noop"} for _ in range(args.jobs)))
            loaded = time.monotonic() - started
            last = last_id(conn)
            progress.step(f"round {number}: draining with `pgpool run --procs {args.procs} "
                          f"--batch {args.batch} --burst`")
            with open(tmp / f"round-{number}.log", "w+b") as log:
                dispatcher = Pgpool(scratch.dsn, args.procs, args.batch, log)
                drained = drive(conn, dispatcher, PGPOOL_JOBS, args.jobs, last - args.jobs + 1,
                                args.interval, progress)
            rounds.append({"round": number, "load_seconds": loaded, **drained,
                           "table": table_stats(conn)})
    for r in rounds:
        r["mean_to_round_1"] = r["mean_jobs_per_s"] / rounds[0]["mean_jobs_per_s"]
    return {"server": server, "schema": scratch.name,
            "options": {"jobs": args.jobs, "rounds": args.rounds, "procs": args.procs,
                        "batch": args.batch, "interval": args.interval, "pin": args.pin,
                        "max_claims_per_sec": UNTHROTTLED},
            "rounds": rounds}


def drive(conn: psycopg.Connection, side: Side, queue: Queue, n: int, first_id: int,
          interval: float, progress: Progress) -> dict[str, Any]:
    """Drain the ``n`` jobs just loaded into ``queue`` (consecutive ids from ``first_id`` on,
    claimed in id order) with ``side``, counting the jobs left every ``interval`` seconds;
    return the round's figures. Its processes are killed if anything goes wrong."""
    tenth = n // 10
    # From "first" to "tenth", and from "ninth" to "last", `tenth` jobs are claimed.
    ids = dict(zip(MARKER_NAMES, (first_id, first_id + tenth, first_id + n - 1 - tenth,
                                  first_id + n - 1), strict=True))
    with killed_on_exit(side.procs):
        launched = time.monotonic()
        side.start({})
        claimed: dict[str, float] = {}  # marker -> seconds since the first claim
        samples = [(0.0, n)]  # (seconds since the first claim, jobs left)
        while True:
            time.sleep(POLL)
            side.check(conn, claimed=False)
            start = time.monotonic()  # a statement sees the table as of its start
            if marker_states(conn, ids, queue)["first"] != queue.ready:
                break
            if start - launched > STALL:
                raise BenchError(f"{side.title} claimed no job within {STALL:g}s of starting")
        startup = start - launched
        claimed["first"] = 0.0  # the clock's start
        next_count, last_progress, fewest = interval, 0.0, n  # fewest jobs left seen
        while True:
            time.sleep(POLL)
            now = time.monotonic() - start
            states = marker_states(conn, ids, queue)
            for name, state in states.items():
                if state != queue.ready and name not in claimed:
                    claimed[name] = now
                    last_progress = now
            exited = any(proc.poll() is not None for proc in side.procs)
            # Once the last job in claim order is done, only a batch or two is in flight:
            # count at every poll, so that the drain's end is seen within one.
            if now >= next_count or states["last"] is None or exited:
                counted = time.monotonic() - start
                left = remaining(conn, queue)
                if left < fewest:
                    fewest, last_progress = left, counted
                if now >= next_count or left == 0:
                    samples.append((counted, left))
                    while next_count <= counted:  # a slow count skips the counts it missed
                        next_count += interval
                    progress.update(f"{n - left:,}/{n:,} jobs done in {counted:.1f}s")
                if left == 0:
                    break
                side.check(conn, claimed=True)
            if now - last_progress > STALL:
                raise BenchError(f"{side.title} made no progress for {STALL:g}s "
                                 f"({fewest:,} jobs left)")
        side.finish(n)
    # A marker claimed and done between a poll and the final count: claimed by the end.
    for name in MARKER_NAMES:
        claimed.setdefault(name, samples[-1][0])
    return {"startup_seconds": startup, **summarize(n, samples, claimed, interval)}


def summarize(n: int, samples: list[tuple[float, int]], claimed: dict[str, float],
              interval: float) -> dict[str, Any]:
    """A round's figures from its counts (``samples``: seconds, jobs left) and the times
    its marker jobs were claimed. A tenth claimed within one poll has no rate (None)."""
    seconds = samples[-1][0]
    intervals = [{"end_s": t1, "jobs_left": left1, "jobs_per_s": (left0 - left1) / (t1 - t0)}
                 for (t0, left0), (t1, left1) in pairwise(samples)]
    rates = [i["jobs_per_s"] for i in intervals]
    # A final stub much shorter than an interval is the drain's last jobs finishing: too
    # short to be a rate of its own, but part of every other figure.
    if len(intervals) > 1 and seconds - intervals[-2]["end_s"] < interval / 2:
        rates = rates[:-1]
    tenth = n // 10
    first = claimed["tenth"] - claimed["first"]
    last = claimed["last"] - claimed["ninth"]
    first_rate = tenth / first if first > 0 else None
    last_rate = tenth / last if last > 0 else None
    return {
        "jobs": n, "seconds": seconds, "mean_jobs_per_s": n / seconds,
        "intervals": intervals,
        "first_tenth_jobs_per_s": first_rate, "last_tenth_jobs_per_s": last_rate,
        "last_to_first_tenth": last_rate / first_rate if first_rate and last_rate else None,
        "slowest_interval_jobs_per_s": min(rates),
        # None when no job finished in the first interval (workers still starting).
        "slowest_to_first_interval": min(rates) / rates[0] if rates[0] else None,
    }


def table_stats(conn: psycopg.Connection) -> dict[str, Any]:
    """The jobs table's dead rows and autovacuum runs, from ``pg_stat_user_tables``."""
    dead, last, count, age = conn.execute(TABLE_STATS).fetchone()
    return {"n_dead_tup": dead, "last_autovacuum": last and last.isoformat(),
            "last_autovacuum_age_s": age, "autovacuum_count": count}


def render(report: dict[str, Any]) -> str:
    """The report as text: a paragraph per round, then each round against round 1."""
    s, o = report["server"], report["options"]
    pin = ", a REPEATABLE READ snapshot held open throughout" if o["pin"] else ""
    lines = [f"{o['jobs']:,} no-op jobs per round, {o['rounds']} rounds, no vacuum between "
             f"them{pin}; `pgpool run --procs {o['procs']} --batch {o['batch']} --burst`, claims "
             f"unthrottled; PostgreSQL {s['version']} (fsync={s['fsync']}, "
             f"synchronous_commit={s['synchronous_commit']})"]
    for r in report["rounds"]:
        t = r["table"]
        vacuumed = ("never" if t["last_autovacuum"] is None else
                    f"{t['last_autovacuum']} ({t['last_autovacuum_age_s']:.1f}s ago)")
        rates = "  ".join(f"{i['jobs_per_s']:,.0f}" for i in r["intervals"])
        lines += [
            f"round {r['round']}: drained in {r['seconds']:.2f}s, mean {r['mean_jobs_per_s']:,.0f}"
            f" jobs/s (loaded in {r['load_seconds']:.2f}s; first claim "
            f"{r['startup_seconds']:.2f}s after `pgpool run` started)",
            *textwrap.wrap(f"per {o['interval']:g}s interval (jobs/s): {rates}", width=88,
                           initial_indent="  ", subsequent_indent="    "),
            f"  first 10% rate {_rate(r['first_tenth_jobs_per_s'])}, last 10% rate "
            f"{_rate(r['last_tenth_jobs_per_s'])}, last/first "
            f"{ratio(r['last_to_first_tenth'])} (claim rates, by job)",
            f"  slowest interval {r['slowest_interval_jobs_per_s']:,.0f} jobs/s = "
            f"{ratio(r['slowest_to_first_interval'])} of the first",
            f"  pgpool_jobs at the end: n_dead_tup {t['n_dead_tup']:,}, last_autovacuum "
            f"{vacuumed}, autovacuum_count {t['autovacuum_count']}",
        ]
    lines += [f"round {r['round']} / round 1 mean rate: {r['mean_to_round_1']:.2f}"
              for r in report["rounds"][1:]]
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "n/a (a tenth claimed within one poll)" if value is None else f"{value:,.0f} jobs/s"


if __name__ == "__main__":
    sys.exit(main())
