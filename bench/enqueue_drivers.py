"""Enqueueing through SQLAlchemy on psycopg 3 beside psycopg2, measured in one run
(issue 25): on psycopg 3, `pgpool.contrib.sqlalchemy` calls `pgpool.enqueue` (one
statement) and `pgpool.enqueue_many` (``COPY``); on psycopg2, the SQL function
``pgpool_enqueue`` and one ``INSERT ... SELECT`` from a JSON array.

    python bench/enqueue_drivers.py [--dsn DSN] [--enqueues 2000] [--many 100000]
                                    [--rounds 2] [--json]

Each round, each driver in turn (a new order each round): ``--enqueues`` calls of
``enqueue`` in one session's transaction (µs a call), then ``enqueue_many`` of 1,000 and
of ``--many`` jobs, each in its own transaction, committed (jobs/s). Best of the rounds.
The jobs go into a scratch schema (`pgpool.bench.scratch`), emptied between runs and
dropped at the end.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Final

import psycopg
from drains import Parser, at_least, script_main, session  # bench/ is on the path
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import create_engine
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session

from pgpool.bench import queries
from pgpool.bench.progress import Progress
from pgpool.contrib import sqlalchemy as pgsa

DRIVERS: Final = ("psycopg", "psycopg2")
KIND: Final = "bench.enqueue"


def main() -> int:
    parser = Parser(description="SQLAlchemy enqueueing on psycopg 3 beside psycopg2")
    parser.add_argument("--dsn", help="the database (default: as `pgpool run` finds it)")
    parser.add_argument("--enqueues", type=at_least(100), default=2000)
    parser.add_argument("--many", type=at_least(1000), default=100_000)
    parser.add_argument("--rounds", type=at_least(1), default=2)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    return script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    sizes = (1000, args.many)
    best: dict[str, dict[str, float]] = {d: {} for d in DRIVERS}
    with session(args.dsn, progress) as s:
        engines = {d: engine(s.scratch.dsn, d) for d in DRIVERS}
        try:
            for r in range(args.rounds):
                for d in DRIVERS[r % 2:] + DRIVERS[:r % 2]:
                    progress.step(f"round {r + 1}: {d}")
                    figures = {"enqueue_us": enqueue_cost(engines[d], args.enqueues)}
                    for n in sizes:
                        figures[f"many_{n}"] = many_rate(engines[d], n, s.conn)
                    for key, value in figures.items():
                        better = min if key == "enqueue_us" else max
                        best[d][key] = better(value, best[d].get(key, value))
        finally:
            for e in engines.values():
                e.dispose()
    return {"server": s.server, "sizes": sizes, "best": best,
            "command": (f"python bench/enqueue_drivers.py --enqueues {args.enqueues} "
                        f"--many {args.many} --rounds {args.rounds}")}


def engine(dsn: str, driver: str) -> Engine:
    """A SQLAlchemy engine of ``driver`` on ``dsn``, its ``options`` (the scratch schema's
    search_path) kept."""
    params = conninfo_to_dict(dsn)
    url = URL.create(f"postgresql+{driver}", username=params.get("user"),
                     password=params.get("password"), database=params.get("dbname"),
                     query={"host": str(params.get("host", "")),
                            "port": str(params.get("port", 5432))})
    return create_engine(url, connect_args={"options": params.get("options", "")})


def enqueue_cost(eng: Engine, n: int) -> float:
    """µs per ``enqueue`` call, ``n`` calls in one transaction (rolled back)."""
    with Session(eng) as s:
        s.connection()  # the transaction begins before the clock starts
        started = time.perf_counter()
        for i in range(n):
            pgsa.enqueue(s, KIND, {"doc": i, "text": "x" * 50})
        seconds = time.perf_counter() - started
        s.rollback()
    return 1e6 * seconds / n


def many_rate(eng: Engine, n: int, conn: psycopg.Connection) -> float:
    """jobs/s of one ``enqueue_many`` of ``n`` jobs, committed; the table emptied after."""
    payloads = [{"doc": i, "text": "x" * 50} for i in range(n)]
    with Session(eng) as s:
        s.connection()
        started = time.perf_counter()
        pgsa.enqueue_many(s, KIND, payloads)
        s.commit()
        seconds = time.perf_counter() - started
    conn.execute(queries.EMPTY)
    return n / seconds


def render(report: dict[str, Any]) -> str:
    best = report["best"]
    base = best["psycopg"]
    lines = ["SQLAlchemy enqueueing, best of the rounds (psycopg2 as a ratio of psycopg 3):"]
    for d in DRIVERS:
        f = best[d]
        parts = [f"enqueue {f['enqueue_us']:.0f} µs a call"
                 + (f" ({f['enqueue_us'] / base['enqueue_us']:.2f})" if d != "psycopg" else "")]
        for n in report["sizes"]:
            key = f"many_{n}"
            parts.append(f"enqueue_many of {n:,}: {f[key]:,.0f} jobs/s"
                         + (f" ({f[key] / base[key]:.2f})" if d != "psycopg" else ""))
        lines.append(f"  {d:8}: " + "; ".join(parts))
    lines.append(f"to repeat: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
