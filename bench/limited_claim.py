"""What one claim of a limited kind costs against the plain claim, side by side in one run:
the statements alone, as the claimer runs them, on one table (issue 36).

    python bench/limited_claim.py [--dsn DSN] [--jobs 20000] [--batch 50] [--pin] [--json]

Loads ``--jobs`` ready no-op jobs of one kind into the just-vacuumed table of a scratch
schema (dropped at the end), then claims them ``--batch`` at a time, the ways below taking
turns claim by claim, each on its own connection (set up as a host's claim connections
are: generic plans for prepared statements), every claimed job deleted at once, as its ack
would; until the table is empty. Each way claims from its own cursor, the last job it took,
as a host's claimer does between its sweeps (the first claim of each is a sweep, from the
start). None reaches its limit:

- ``plain``: `sql.CLAIM_PLAIN`, prepared: a kind without a limit;
- ``concurrency``: `sql.CLAIM_SLOTS_PLAIN`, prepared: ``Limit(concurrency=1_000_000)``,
  as a host claims a kind-wide concurrency limit without a rate while no job waiting has
  a tenant or a concurrency key;
- ``rate``: `sql.CLAIM_LIMITED_PLAIN`, prepared: ``Limit(rate=100_000, per=1)``, as a
  host claims a kind-wide limit with a rate, likewise (its ring made first:
  `sql.RING_MAX` rows);
- ``granted``: `sql.CLAIM_GRANTED`, prepared: the same rate, as a host claims it from
  the tokens a claim from the ring granted it (`pgpool.host.grant`; here a grant that
  never ends), reading no ring row;
- ``concurrency_planned`` and ``rate_planned``: `sql.CLAIM_LIMITED` for the same limits,
  planned for its values at each claim, as hosts claimed them before.

(The limits per tenant or per key, `sql.CLAIM_SCOPED`, need jobs with tenants, which the
plain claim leaves to the fair one: `bench/limits.py --tenants 50` drains them.)

With ``--pin``, another session holds a REPEATABLE READ snapshot from the load to the end
(the xmin horizon pinned: no vacuum removes the rows the claims leave behind), as a long
transaction does.

Reported per way: the jobs it claimed, its claims, their mean and median round trip (the
first two of each left out: the first plans, prepares, or reads a cold index), the median
against the plain claim's, and the mean round trip of each fifth of its claims, in order
(whether a claim costs more as the jobs claimed before it pile up, dead, behind a pin).
The run fails if a job is left or claimed twice.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
from drains import Parser, at_least, pinned, script_main, session  # bench/ is on the path

from pgpool.bench.options import BenchError
from pgpool.bench.progress import Progress
from pgpool.db import statements as converted
from pgpool.host.claimer import configure_connection
from pgpool.host.lease import Lease
from pgpool.sql import jobs as sql
from pgpool.sql.common import int_array

WAYS: Final = ("plain", "concurrency", "rate", "granted", "concurrency_planned",
                "rate_planned")
#: A grant that never ends, for the ``granted`` way.
FOREVER: Final = datetime(9999, 1, 1, tzinfo=UTC)
LEASE: Final = Lease(30)
#: The claims of each way left out of its figures: its first plans, prepares or warms up.
WARMUP: Final = 2


def parser() -> Parser:
    p = Parser(prog="limited_claim", description=__doc__.splitlines()[0])
    p.add_argument("--dsn", help="the database (default: as `pgpool run` resolves it)")
    p.add_argument("--jobs", type=at_least(100), default=20_000)
    p.add_argument("--batch", type=at_least(1), default=50)
    p.add_argument("--pin", action="store_true", help="the xmin horizon pinned throughout")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def statements(batch: int) -> dict[str, tuple[str, dict[str, object], bool]]:
    """Per way: its statement, its parameters, and whether it runs prepared."""
    common = {"queues": ["default"], "owner": "bench:1:x", "lease": LEASE.seconds,
              "limit": batch, **sql.SWEEP}
    limited = {**common, "limited_kinds": ["k"], "limited_max_attempts": [20],
               "limited_per": [1.0]}
    concurrency = {**limited, "limited_concurrency": [1_000_000], "limited_rate": [None]}
    rate = {**limited, "limited_concurrency": [None], "limited_rate": [100_000],
            "grant": 0, "hold": 0.05}
    return {
        "plain": (sql.CLAIM_PLAIN, {**common, "kinds": ["k"],
                                    "kind_max_attempts": [20], "after": ""}, True),
        "concurrency": (sql.CLAIM_SLOTS_PLAIN, concurrency, True),
        "rate": (sql.CLAIM_LIMITED_PLAIN, rate, True),
        "granted": (sql.CLAIM_GRANTED, {**rate, "until": FOREVER}, True),
        "concurrency_planned": (sql.CLAIM_LIMITED, concurrency, False),
        "rate_planned": (sql.CLAIM_LIMITED, rate, False),
    }


async def claim_in_turns(dsn: str, batch: int) -> tuple[dict[str, list[float]],
                                                        dict[str, int]]:
    """Claim until the table is empty, the ways taking turns: each way's round trips, and
    the jobs it claimed."""
    ways = statements(batch)
    conns = {}
    for way in WAYS:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        await configure_connection(conn, LEASE, claims=True)
        conns[way] = conn
    acks = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    claimed = dict.fromkeys(WAYS, 0)
    cursors: dict[str, dict[str, str | None]] = {way: sql.SWEEP for way in WAYS}
    try:
        while True:
            for way in WAYS:
                statement, params, prepared = ways[way]
                params = {**params, **cursors[way]}
                started = time.perf_counter()
                if prepared:
                    # As the claimer runs its limited claims: converted once.
                    cur = await converted.execute(conns[way], statement, params,
                                                  prepare=True)
                    rows = await cur.fetchall()
                else:
                    async with psycopg.AsyncClientCursor(conns[way]) as client:
                        await client.execute(statement, params)
                        rows = await client.fetchall()
                if not rows:  # the table is empty
                    return times, claimed
                times[way].append(time.perf_counter() - started)
                claimed[way] += len(rows)
                # Its cursor: the last job taken, in claim order (priority, run_at, id).
                last = max(rows, key=lambda row: (-row[9], row[13], row[0]))
                cursors[way] = {"after_priorities": int_array([last[9]]),
                                "after_run_at_us": int_array([last[13]]),
                                "after_ids": int_array([last[0]])}
                await acks.execute("DELETE FROM pgpool_jobs WHERE id = ANY(%s)",
                                   ([row[0] for row in rows],))
    finally:
        for conn in (*conns.values(), acks):
            await conn.close()


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    with session(args.dsn, progress) as s:
        s.conn.execute("INSERT INTO pgpool_jobs (kind, payload) "
                       "SELECT 'k', '{}' FROM generate_series(1, %s)", (args.jobs,))
        s.conn.execute(sql.ENSURE_TICKS, {"rate_kinds": ["k"], "rates": [100_000]})
        s.conn.execute("VACUUM ANALYZE pgpool_jobs, pgpool_limit_ticks")
        progress.step(f"claiming {args.jobs:,} jobs {args.batch} at a time, "
                     f"{len(WAYS)} ways in turns" + (", the horizon pinned" if args.pin else ""))
        with pinned(s.scratch.dsn if args.pin else None):
            times, claimed = asyncio.run(claim_in_turns(s.scratch.dsn, args.batch))
        left = s.conn.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0]
    if left or sum(claimed.values()) != args.jobs:
        raise BenchError(f"{sum(claimed.values()):,} jobs claimed of {args.jobs:,}, "
                         f"{left:,} left")
    figures = {}
    for way in WAYS:
        kept = times[way][WARMUP:] or times[way]
        fifth = max(1, len(kept) // 5)
        figures[way] = {"jobs": claimed[way], "claims": len(kept),
                        "mean_ms": 1e3 * statistics.mean(kept),
                        "median_ms": 1e3 * statistics.median(kept),
                        "fifths_ms": [1e3 * statistics.mean(kept[i:i + fifth])
                                      for i in range(0, fifth * min(5, len(kept)), fifth)]}
    for way in WAYS:
        figures[way]["of_plain"] = figures[way]["median_ms"] / figures["plain"]["median_ms"]
    return {"command": (f"python bench/limited_claim.py --jobs {args.jobs} "
                        f"--batch {args.batch}" + (" --pin" if args.pin else "")),
            "jobs": args.jobs, "batch": args.batch, "ways": figures}


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['jobs']:,} no-op jobs claimed {report['batch']} at a time, "
             "the ways in turns"]
    for way, f in report["ways"].items():
        lines.append(f"  {way:19} {f['claims']:5} claims: mean {f['mean_ms']:.2f} ms, "
                     f"median {f['median_ms']:.2f} ms ({f['of_plain']:.2f} of plain); "
                     "by fifths " + ", ".join(f"{m:.2f}" for m in f["fifths_ms"]) + " ms")
    lines.append(f"to repeat: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(script_main(parser(), run, render))
