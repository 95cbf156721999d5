"""What long jobs cost the server at scale: ``--jobs`` running jobs (2,000 by default)
spread over ``--hosts`` hosts (4), each host's beat sending the real statements a host
sends (issue 35).

    python bench/long_scale.py [--dsn DSN] [--jobs 2000] [--hosts 4] [--beats 20]
                               [--checkpoint-bytes 1024] [--json]

The jobs are made running on a scratch schema (`pgpool.bench.scratch`, dropped at the
end), as claims leave them, each host's ``--jobs / --hosts`` under its owner id. Then, for
``--beats`` rounds, in turns, each variant of a beat is sent for every host:

- ``heartbeat``: `pgpool.sql.jobs.HEARTBEAT` alone: what every running job costs today;
- ``+ progress``: and `pgpool.sql.long.PROGRESS` for every one of its jobs (each reported
  since the last beat: the most a beat writes);
- a checkpoint: `pgpool.sql.long.CHECKPOINT` of one job, ``--checkpoint-bytes`` of JSON.

Per variant: the server's time (the statements' wall time from here, one connection) and
the WAL each writes (``pg_current_wal_lsn``), per beat of all hosts, and so per second and
per running job at the default lease (30 s: a beat every 10 s). A checkpoint's figures are
per checkpoint: how often a handler stores one is its author's choice.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import orjson
import psycopg
from drains import Parser, at_least, script_main, session  # bench/ is on the path

from pgpool.bench.progress import Progress
from pgpool.sql import jobs as jobs_sql
from pgpool.sql import long as long_sql
from pgpool.sql.common import int_array

#: A beat's interval at the default lease (`pgpool.host.lease.Lease.beat_interval`).
BEAT_SECONDS = 10.0
LEASE = 30.0


def main() -> int:
    parser = Parser(description="Heartbeats, progress and checkpoints of many running jobs")
    parser.add_argument("--dsn", help="the database (default: as `pgpool run` finds it)")
    parser.add_argument("--jobs", type=at_least(1), default=2000)
    parser.add_argument("--hosts", type=at_least(1), default=4)
    parser.add_argument("--beats", type=at_least(2), default=20)
    parser.add_argument("--checkpoint-bytes", type=at_least(2), default=1024)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    return script_main(parser, run, render)


def run(args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    with session(args.dsn, progress) as s:
        conn = s.conn
        progress.step(f"making {args.jobs:,} jobs running on {args.hosts} hosts")
        conn.execute("INSERT INTO pgpool_jobs (kind, payload, state, attempts, locked_by, "
                     "lease_until, started) SELECT 'render', '{}', 'running', 1, "
                     "'host-' || (i %% %(hosts)s), now() + interval '1 hour', true "
                     "FROM generate_series(1, %(jobs)s) AS i",
                     {"hosts": args.hosts, "jobs": args.jobs})
        conn.execute("VACUUM ANALYZE pgpool_jobs")
        hosts = {owner: ids for owner, ids in conn.execute(
            "SELECT locked_by, array_agg(id ORDER BY id) FROM pgpool_jobs GROUP BY locked_by")}
        state = orjson.dumps({"blob": "x" * max(0, args.checkpoint_bytes - 12)}).decode()
        figures: dict[str, list[tuple[float, int]]] = {"heartbeat": [], "+ progress": [],
                                                       "checkpoint": []}
        for beat in range(args.beats):
            progress.step(f"beat {beat + 1} of {args.beats}")
            order = list(figures) if beat % 2 == 0 else list(figures)[::-1]
            for variant in order:
                figures[variant].append(measure(conn, variant, hosts, beat, state))
    return {"server": s.server, "jobs": args.jobs, "hosts": args.hosts,
            "checkpoint_bytes": len(state), "figures": figures,
            "command": (f"python bench/long_scale.py --jobs {args.jobs} --hosts {args.hosts} "
                        f"--beats {args.beats} --checkpoint-bytes {args.checkpoint_bytes}")}


def measure(conn: psycopg.Connection, variant: str, hosts: dict[str, list[int]], beat: int,
            state: str) -> tuple[float, int]:
    """One beat of ``variant`` for every host (a checkpoint: one): (seconds, WAL bytes)."""
    lsn = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    started = time.perf_counter()
    if variant == "checkpoint":
        owner, ids = next(iter(hosts.items()))
        cur = conn.execute(long_sql.CHECKPOINT, {"id": ids[beat % len(ids)], "attempt": 1,
                                                 "owner": owner, "state": state})
        assert cur.rowcount == 1
    else:
        for owner, ids in hosts.items():
            conn.execute(jobs_sql.HEARTBEAT, {
                "ids": int_array(ids), "attempts": int_array(1 for _ in ids),
                "started": "{" + ",".join("t" for _ in ids) + "}", "owner": owner,
                "lease": LEASE}).fetchall()
            if variant == "+ progress":
                conn.execute(long_sql.PROGRESS, {
                    "ids": int_array(ids), "attempts": int_array(1 for _ in ids),
                    "progress": [orjson.dumps({"done": beat, "total": 1000,
                                               "note": f"frame {beat}"}).decode()
                                 for _ in ids],
                    "owner": owner})
    seconds = time.perf_counter() - started
    wal = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (lsn,)).fetchone()[0]
    return seconds, int(wal)


def render(report: dict[str, Any]) -> str:
    jobs, hosts = report["jobs"], report["hosts"]
    lines = [f"{jobs:,} running jobs on {hosts} hosts; a beat every {BEAT_SECONDS:g}s "
             "(lease 30s); medians of the beats, variants alternated"]
    for variant, runs in report["figures"].items():
        ms = statistics.median(1e3 * s for s, _ in runs)
        wal = statistics.median(b for _, b in runs)
        if variant == "checkpoint":
            lines.append(f"  a checkpoint of {report['checkpoint_bytes']:,} bytes: 1 statement, "
                         f"{ms:.2f} ms, {wal:,.0f} WAL bytes")
            continue
        statements = hosts * (2 if variant == "+ progress" else 1)
        lines.append(
            f"  {variant:10}: {statements} statements a beat ({statements / BEAT_SECONDS:.1f}"
            f"/s for the fleet, {statements / BEAT_SECONDS / jobs:.5f}/s a job), "
            f"{ms:.1f} ms of server time a beat, {wal / 1024:,.0f} KiB WAL a beat "
            f"({wal / BEAT_SECONDS / jobs:,.0f} bytes/s a job)")
    lines.append(f"to repeat: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
