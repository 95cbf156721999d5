"""A fleet of real hosts on one server: what it costs the database idle and under load, its
pickup latency, and a drain with nothing lost or run twice (issue 34).

    python bench/fleet.py --dsn DSN [--hosts 100] [--jobs 200000] [--idle 30] [--warmup 15]
                          [--pickups 30] [--lease 30] [--compare PATH] [--json]

Why: a fleet of a thousand idle hosts must cost the database less than half a core and 500
transactions per second in all (the issue's budget). Every host is a real ``pgpool run
--procs 1`` process (``--handlers fleetjobs``: bench/fleetjobs.py, which records each job
it runs), all on the server of ``--dsn``, in a scratch schema of their own
(`pgpool.bench.scratch`, dropped at the end). The server must allow about 11 connections
per host (a dispatcher's pools and its listener): the bench says so and stops if
``max_connections`` is too low.

Stages, one after another:

1. the pickup floor (`pgpool.bench.pickup`'s: a LISTENing connection and a hand-written
   claim, committed), on the quiet server;
2. idle: ``--hosts`` hosts started, ``--warmup`` seconds to settle, then ``--idle`` seconds
   measured: the database's transactions per second (``pg_stat_database``: commits and
   rollbacks), the server's CPU (every process of its postmaster, from ``/proc``: the
   server must run on this machine), both in all and per host, and what 1,000 such hosts
   would cost against the budget; with ``pg_stat_statements`` installed in the database,
   the statements the idle fleet sends, per host per second. With ``--compare PATH`` (a
   checkout of another pgpool, "main before this issue"), the same is measured for hosts of
   that code, in a schema it migrated, before and after this code's (the machine drifts);
3. pickup: ``--pickups`` jobs enqueued one at a time, each into the idle fleet, from the
   enqueue's commit to the job's start (CLOCK_MONOTONIC, the same clock in every process),
   and from the enqueue's call (the commit's stamp waits for this process to get a core),
   with the transactions and claim statements each pickup costs the database;
4. drain: ``--jobs`` no-op jobs enqueued in one transaction, drained by the fleet: jobs/s
   (the claims/s the fleet's budget counts), the database's transactions/s and the
   server's CPU meanwhile; then every job must have run exactly once: none left in the
   table or dead-lettered, none missing from the record, none run twice.

The hosts are stopped with SIGTERM and must exit 0. It prints one line per figure and the
command that reproduces the run (``--json``: one object). A host that exits early, or a
stage that stalls, ends the run with one line (``fleet: error: ...``, exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

import pgpool
from pgpool.bench.cpu import cpu_between, tree_cpu
from pgpool.bench.figures import quantile
from pgpool.bench.pickup import pickup_floor
from pgpool.bench.progress import Progress
from pgpool.bench.scratch import scratch_schema
from pgpool.host.budget import DEFAULT_MAX_CLAIMS_PER_SEC

BENCH = Path(__file__).resolve().parent
KIND = "fleet.noop"
#: Connections a host opens: its two pools (pgpool.host.dispatcher) and its listener.
CONNECTIONS_PER_HOST = 11
#: The issue's budget for an idle fleet of `FLEET` hosts.
FLEET = 1000
BUDGET_TPS = 500.0
BUDGET_CORES = 0.5
#: Idle gap before each pickup job, seconds: every host is idle again by then.
PICKUP_GAP = (0.2, 0.4)
STALL = 120.0  # seconds without progress that end a stage
#: Seconds the drain's last acks may take once every job ran, before what is left counts.
ACKED_WITHIN = 30.0
#: Hosts started at once.
WAVE = 10


class FleetError(Exception):
    """A stage failed: the run ends with this one line."""


def main() -> None:
    args = parse()
    try:
        report = run(args)
    except FleetError as exc:
        print(f"fleet: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    if args.json:
        print(json.dumps(report, indent=2))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/fleet.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("PGPOOL_DSN"),
                   help="the server (default $PGPOOL_DSN); it must run on this machine")
    p.add_argument("--hosts", type=int, default=100, help="real hosts, --procs 1 each")
    p.add_argument("--jobs", type=int, default=200_000, help="jobs the fleet drains")
    p.add_argument("--idle", type=float, default=30.0, help="seconds the idle fleet is measured")
    p.add_argument("--warmup", type=float, default=15.0,
                   help="seconds the started fleet settles before it is measured")
    p.add_argument("--pickups", type=int, default=30, help="jobs enqueued one at a time")
    p.add_argument("--lease", type=float, default=30.0, help="the hosts' --lease")
    p.add_argument("--compare", type=Path, metavar="PATH",
                   help="another pgpool checkout whose idle hosts are measured alongside")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    if not args.dsn:
        p.error("no server: give --dsn or set PGPOOL_DSN")
    if args.hosts < 1 or args.jobs < 1 or args.pickups < 1:
        p.error("--hosts, --jobs and --pickups must be at least 1")
    if args.compare is not None and not (args.compare / "pgpool" / "__init__.py").exists():
        p.error(f"--compare {args.compare}: no pgpool package there")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    progress = Progress(sys.stderr)
    report: dict[str, Any] = {"hosts": args.hosts, "jobs": args.jobs,
                              "command": "python bench/fleet.py " + shlex.join(
                                  a for a in sys.argv[1:] if not a.startswith("--dsn"))}
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        check_connections(admin, args.hosts)
        postmaster = postmaster_pid(admin)
        with scratch_schema(admin, args.dsn, progress) as scratch, \
                tempfile.TemporaryDirectory(prefix="pgpool-fleet-") as tmp:
            with psycopg.connect(scratch.dsn, autocommit=True) as conn:
                pgpool.migrate(conn)
                progress.step("the pickup floor, on the quiet server")
                floor = pickup_floor(scratch.dsn, conn, args.pickups)
                conn.execute("DELETE FROM pgpool_jobs")
            report["floor_p50_ms"] = quantile(floor, 0.5)
            idle: dict[str, list[dict[str, Any]]] = {}
            if args.compare is not None:
                idle["compare"] = [measure_compared(args, admin, args.compare, postmaster,
                                                    Path(tmp), progress)]
            record = Path(tmp) / "record.log"
            with fleet(args, scratch.dsn, None, record, Path(tmp) / "now", progress) as hosts:
                progress.step(f"idle: {args.hosts} hosts, {args.idle:g} s measured")
                idle["now"] = [measure_idle(args, admin, postmaster, hosts)]
                report["pickup"] = pickups(args, scratch.dsn, admin, record, hosts, progress)
                report["drain"] = drain(args, scratch.dsn, admin, postmaster, record, hosts,
                                        progress)
            if args.compare is not None:  # before and after: the machine drifts
                idle["compare"].append(measure_compared(args, admin, args.compare,
                                                        postmaster, Path(tmp), progress))
            report["idle"] = idle
    print_report(report, args)
    return report


# --- the server -----------------------------------------------------------------------------


def check_connections(admin: psycopg.Connection, hosts: int) -> None:
    allowed = int(admin.execute("SHOW max_connections").fetchone()[0])
    used = admin.execute("SELECT count(*) FROM pg_stat_activity").fetchone()[0]
    need = hosts * CONNECTIONS_PER_HOST + 10
    if allowed - used < need:
        raise FleetError(
            f"the server allows {allowed} connections ({used} in use); {hosts} hosts need "
            f"about {need}: ALTER SYSTEM SET max_connections = {need + used + 50} and restart "
            "it, or start fewer --hosts")


def postmaster_pid(admin: psycopg.Connection) -> int:
    """The server's postmaster: the parent of this session's backend (on this machine)."""
    backend = admin.execute("SELECT pg_backend_pid()").fetchone()[0]
    try:
        stat = Path(f"/proc/{backend}/stat").read_text()
    except OSError:
        raise FleetError("the server's processes are not visible here: run the bench on "
                         "the server's machine, as a user that may see them") from None
    return int(stat[stat.rfind(")") + 2:].split()[1])


def transactions(admin: psycopg.Connection) -> int:
    return admin.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                         "WHERE datname = current_database()").fetchone()[0]


def has_statements(admin: psycopg.Connection) -> bool:
    return admin.execute("SELECT EXISTS (SELECT FROM pg_extension "
                         "WHERE extname = 'pg_stat_statements')").fetchone()[0]


class Sample:
    """The server's transactions and CPU seconds, and the time, at one moment."""

    def __init__(self, admin: psycopg.Connection, postmaster: int) -> None:
        self.xacts = transactions(admin)
        self.cpu = tree_cpu([postmaster])
        self.at = time.monotonic()

    def since(self, before: Sample) -> tuple[float, float, float]:
        """(seconds, transactions per second, cores) from ``before`` to this one."""
        seconds = self.at - before.at
        cpu = cpu_between(before.cpu, self.cpu) or 0.0
        return seconds, (self.xacts - before.xacts) / seconds, cpu / seconds


# --- the fleet ------------------------------------------------------------------------------


@contextlib.contextmanager
def fleet(args: argparse.Namespace, dsn: str, tree: Path | None, record: Path, logs: Path,
          progress: Progress) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``--hosts`` real hosts of the code in ``tree`` (None: this one) on ``dsn``, all
    registered; stopped with SIGTERM on the way out (each must exit 0)."""
    logs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGPOOL_")}
    path = [str(BENCH)] + ([str(tree)] if tree is not None else
                           [str(BENCH.parent)])
    env.update(PGPOOL_DSN=dsn, FLEET_RECORD=str(record), PYTHONPATH=os.pathsep.join(path))
    hosts: list[subprocess.Popen[bytes]] = []
    progress.step(f"starting {args.hosts} hosts ({'this code' if tree is None else tree})")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # In waves of `WAVE`, each registered before the next starts: a hundred hosts
            # starting at once on two cores would not start their workers in time.
            for i in range(args.hosts):
                with open(logs / f"host{i}.log", "wb") as log:
                    hosts.append(subprocess.Popen(
                        [sys.executable, "-m", "pgpool", "run", "--handlers", "fleetjobs",
                         "--procs", "1", "--lease", f"{args.lease:g}", "--log-level",
                         "WARNING"], cwd=BENCH, env=env, stdout=subprocess.DEVNULL,
                        stderr=log))
                if len(hosts) % WAVE == 0 or len(hosts) == args.hosts:
                    wait_for(lambda: registered(conn) >= len(hosts), hosts, logs,
                             f"{len(hosts)} hosts to register", timeout=3 * STALL)
        yield hosts
    finally:
        for host in hosts:
            if host.poll() is None:
                host.send_signal(signal.SIGTERM)
        failed = []
        for i, host in enumerate(hosts):
            try:
                code = host.wait(120)
            except subprocess.TimeoutExpired:
                host.kill()
                code = host.wait()
            if code != 0:
                failed.append(f"host {i} exited {code} ({last_line(logs / f'host{i}.log')})")
        if failed:
            raise FleetError("; ".join(failed[:3]))


def registered(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM pgpool_hosts").fetchone()[0]


def wait_for(done: Any, hosts: list[subprocess.Popen[bytes]], logs: Path, what: str,
             timeout: float = STALL) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        for i, host in enumerate(hosts):
            if host.poll() is not None:
                raise FleetError(f"host {i} exited {host.returncode} while waiting for {what}: "
                                 f"{last_line(logs / f'host{i}.log')}")
        if time.monotonic() > deadline:
            raise FleetError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)


def last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1] if lines else "no output"


# --- idle -----------------------------------------------------------------------------------


def measure_idle(args: argparse.Namespace, admin: psycopg.Connection, postmaster: int,
                 hosts: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    time.sleep(args.warmup)
    statements = has_statements(admin)
    if statements:
        admin.execute("SELECT pg_stat_statements_reset()")
    before = Sample(admin, postmaster)
    time.sleep(args.idle)
    seconds, tps, cores = Sample(admin, postmaster).since(before)
    alive = sum(host.poll() is None for host in hosts)
    if alive < len(hosts):
        raise FleetError(f"{len(hosts) - alive} hosts exited while idle")
    out: dict[str, Any] = {
        "seconds": round(seconds, 1), "tps": round(tps, 2), "cores": round(cores, 4),
        "tps_per_host": round(tps / len(hosts), 4),
        "cores_per_host": round(cores / len(hosts), 6),
        f"tps_at_{FLEET}": round(tps / len(hosts) * FLEET, 1),
        f"cores_at_{FLEET}": round(cores / len(hosts) * FLEET, 3),
    }
    if statements:
        rows = admin.execute(
            "SELECT calls, regexp_replace(left(query, 90), '\\s+', ' ', 'g') "
            "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
            "WHERE datname = current_database()) ORDER BY calls DESC LIMIT 12").fetchall()
        out["statements_per_host_per_sec"] = [
            [round(calls / seconds / len(hosts), 4), query] for calls, query in rows]
    return out


def measure_compared(args: argparse.Namespace, admin: psycopg.Connection, tree: Path,
                     postmaster: int, tmp: Path, progress: Progress) -> dict[str, Any]:
    """`measure_idle` for hosts of the code in ``tree``, in a schema that code migrated."""
    with scratch_schema(admin, args.dsn, progress) as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGPOOL_")}
        env.update(PGPOOL_DSN=scratch.dsn, PYTHONPATH=str(tree))
        migrated = subprocess.run([sys.executable, "-m", "pgpool", "migrate"], env=env,
                                  cwd=tree, capture_output=True, text=True)
        if migrated.returncode != 0:
            raise FleetError(f"--compare {tree}: pgpool migrate failed: "
                             f"{migrated.stderr.strip().splitlines()[-1:]}")
        with fleet(args, scratch.dsn, tree, tmp / "compare.log", tmp / "compare",
                   progress) as hosts:
            progress.step(f"idle ({tree}): {args.hosts} hosts, {args.idle:g} s measured")
            return measure_idle(args, admin, postmaster, hosts)


# --- pickup and drain -----------------------------------------------------------------------


class Record:
    """The lines bench/fleetjobs.py appends, read as they come: {(job, claim): start ns}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.runs: Counter[int] = Counter()
        self.starts: dict[int, int] = {}

    def read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            job, _, started = line.split()
            self.runs[int(job)] += 1
            self.starts[int(job)] = int(started)


def pickups(args: argparse.Namespace, dsn: str, admin: psycopg.Connection, path: Path,
            hosts: list[subprocess.Popen[bytes]], progress: Progress) -> dict[str, Any]:
    """Each job wakes every idle host, whose claims race for it: the transactions and
    claims each pickup costs the database are counted too."""
    progress.step(f"pickup: {args.pickups} jobs, one at a time, into the idle fleet")
    record = Record(path)
    latencies = []
    # Also from the enqueue's call: the commit returns to this process only once it gets a
    # core, and a fleet whose hosts all wake at each job delays that more than one that
    # wakes a few (the commit's stamp then flatters it; 100 hosts had a negative p50).
    from_call = []
    statements = has_statements(admin)
    if statements:
        admin.execute("SELECT pg_stat_statements_reset()")
    xacts = transactions(admin)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(args.pickups):
            time.sleep(random.uniform(*PICKUP_GAP))
            called = time.monotonic_ns()
            job = pgpool.enqueue(conn, KIND, {})
            committed = time.monotonic_ns()
            deadline = time.monotonic() + STALL
            while True:
                record.read()
                if job in record.starts:
                    break
                if time.monotonic() > deadline:
                    raise FleetError(f"pickup job {job} did not start within {STALL:g}s")
                time.sleep(0.001)
            latencies.append((record.starts[job] - committed) / 1e6)
            from_call.append((record.starts[job] - called) / 1e6)
    time.sleep(1.5)  # the last job's ack, and the statistics of the sessions, flushed
    out: dict[str, Any] = {
        "transactions_per_job": round((transactions(admin) - xacts) / args.pickups, 1)}
    if statements:
        claims = admin.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query ~ "
            "'UPDATE\\s+pgpool_jobs\\s+AS\\s+j\\s+SET\\s+state\\s*=.*"
            "attempts\\s*=\\s*j\\.attempts' "
            "AND dbid = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())").fetchone()[0]
        out["claims_per_job"] = round(claims / args.pickups, 1)
    latencies.sort()
    from_call.sort()
    return {"p50_ms": round(quantile(latencies, 0.5), 2),
            "p99_ms": round(quantile(latencies, 0.99), 2), "max_ms": round(latencies[-1], 2),
            "from_call_p50_ms": round(quantile(from_call, 0.5), 2),
            "from_call_p99_ms": round(quantile(from_call, 0.99), 2), **out}


def drain(args: argparse.Namespace, dsn: str, admin: psycopg.Connection, postmaster: int,
          path: Path, hosts: list[subprocess.Popen[bytes]],
          progress: Progress) -> dict[str, Any]:
    record = Record(path)
    record.read()
    ran_before = set(record.runs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        progress.step(f"drain: enqueuing {args.jobs} jobs in one transaction")
        with conn.transaction():
            pgpool.enqueue_many(conn, KIND, [{} for _ in range(args.jobs)])
            # This transaction's own rows: every job of the drain (those before are done).
            ids = [job for job, in conn.execute(
                "SELECT id FROM pgpool_jobs WHERE state = 'ready'")]
        before = Sample(admin, postmaster)
        progress.step(f"drain: {len(hosts)} hosts draining")
        last, stalled_at = 0, time.monotonic()
        while True:
            record.read()
            done = len(set(record.runs) - ran_before)
            if done >= len(ids):
                break
            if done > last:
                last, stalled_at = done, time.monotonic()
            elif time.monotonic() - stalled_at > STALL:
                raise FleetError(f"the drain stalled at {done} of {len(ids)} jobs; of those "
                                 f"left, {left_behind(conn, record, ids)}")
            if any(host.poll() is not None for host in hosts):
                raise FleetError("a host exited during the drain")
            time.sleep(0.2)
        seconds, tps, cores = Sample(admin, postmaster).since(before)
        # Nothing lost: every job ran; none left, none dead-lettered. Nothing run twice.
        # The last jobs to run are still in the table until their hosts' acks flush (50 ms
        # and more on a loaded machine): counted at once, they read as lost (622 once).
        deadline = time.monotonic() + ACKED_WITHIN
        while (conn.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0]
               and time.monotonic() < deadline):
            time.sleep(0.1)
        record.read()
        left, dead = conn.execute("SELECT (SELECT count(*) FROM pgpool_jobs), "
                                  "(SELECT count(*) FROM pgpool_dead)").fetchone()
    enqueued = set(ids)
    lost = len(enqueued - set(record.runs)) + left + dead
    duplicated = sum(1 for job in enqueued if record.runs[job] > 1)
    # What the hosts logged that runs a job again (at-least-once): leases lost or given up
    # (a host starved of CPU past its lease), and the reaper returning expired jobs.
    logs = "".join(p.read_text(errors="replace") for p in path.parent.glob("now/host*.log"))
    explained = {what: logs.count(text) for what, text in (
        ("leases_lost_lines", "lost the lease of"), ("abandoned_lines", "no heartbeat for"),
        ("reaper_returns_lines", "expired jobs returned to the queue"))}
    rate = len(ids) / seconds
    budget = DEFAULT_MAX_CLAIMS_PER_SEC
    return {"jobs": len(ids), "seconds": round(seconds, 2), "jobs_per_sec": round(rate),
            "claims_per_sec": round(rate), "claim_budget_per_sec": budget,
            "tps": round(tps), "cores": round(cores, 3), "lost": lost,
            "duplicated": duplicated, "left": left, "dead": dead, **explained}


def left_behind(conn: psycopg.Connection, record: Record, ids: list[int]) -> str:
    """What a stalled drain's jobs that never ran are doing, from their rows: by state and
    owner, with their attempts."""
    missing = sorted(set(ids) - set(record.runs))[:1000]
    rows = conn.execute(
        "SELECT state, locked_by, attempts, count(*), min(id) FROM pgpool_jobs "
        "WHERE id = ANY(%s) GROUP BY 1, 2, 3 ORDER BY 4 DESC", [missing]).fetchall()
    found = sum(n for *_, n, _ in rows)
    parts = [f"{n} {state} (owner {owner}, attempts {attempts}, e.g. id {first})"
             for state, owner, attempts, n, first in rows]
    if found < len(missing):
        parts.append(f"{len(missing) - found} not in pgpool_jobs")
    return "; ".join(parts)


# --- the report -----------------------------------------------------------------------------


def print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        return
    print(f"fleet: {report['hosts']} hosts (pgpool run --procs 1), one server")
    for name, runs in report["idle"].items():
        for idle in runs:
            print(f"idle ({name}): {idle['tps']:.1f} transactions/s "
                  f"({idle['tps_per_host']:.3f} per host), server CPU {idle['cores']:.3f} "
                  f"cores ({idle['cores_per_host'] * 100:.4f}% of a core per host); "
                  f"at {FLEET} hosts: {idle[f'tps_at_{FLEET}']:.0f} transactions/s (budget "
                  f"{BUDGET_TPS:.0f}), {idle[f'cores_at_{FLEET}']:.2f} cores (budget "
                  f"{BUDGET_CORES})")
            for calls, query in idle.get("statements_per_host_per_sec", []):
                print(f"    {calls:8.4f}/s per host  {query}")
    pickup = report["pickup"]
    print(f"pickup into the idle fleet: p50 {pickup['p50_ms']:.2f} ms, p99 "
          f"{pickup['p99_ms']:.2f} ms, max {pickup['max_ms']:.2f} ms from the enqueue's "
          f"commit (bare floor p50 {report['floor_p50_ms']:.2f} ms); p50 "
          f"{pickup['from_call_p50_ms']:.2f} ms, p99 {pickup['from_call_p99_ms']:.2f} ms "
          "from its call; per job picked up: "
          f"{pickup['transactions_per_job']} transactions"
          + (f", {pickup['claims_per_job']} claim statements" if "claims_per_job" in pickup
             else ""))
    d = report["drain"]
    print(f"drain: {d['jobs']} jobs in {d['seconds']:.1f} s, {d['jobs_per_sec']} jobs/s = "
          f"claims/s (budget {d['claim_budget_per_sec']:.0f}); server {d['tps']} "
          f"transactions/s, {d['cores']:.2f} cores; lost {d['lost']}, duplicated "
          f"{d['duplicated']} (host log lines: {d['leases_lost_lines']} leases lost, "
          f"{d['abandoned_lines']} leases given up, {d['reaper_returns_lines']} reaper "
          "returns)")
    print(f"command: {report['command']}")


if __name__ == "__main__":
    main()
