"""``pgpool bench``: seed jobs, drive them through a real dispatcher, report the costs.

Contract:

- Isolation: everything happens in a new schema ``pgpool_bench_<random>`` on the target
  database, reached through ``search_path``, migrated with `pgpool.migrate` and dropped at
  the end, also on error and Ctrl-C. The user's own pgpool tables are never read or
  written. Server settings (durability included) are reported, never changed.
- Profiles (`pgpool.benchjobs`): ``noop``; ``cpu``, a SHA-256 chain calibrated once on this
  host to take about 5 ms; ``sleep``, a random 2-5 ms; ``mixed``, the three in turn.
- Seed: `pgpool.enqueue_many` of N jobs against a raw COPY of the same rows (prepared
  beforehand, the best any loader could do) into the same table; rows/s and the ratio.
- Ceiling: no framework, two connections in two threads, each repeating the claim
  statement (`pgpool.sql.CLAIM`, ``--batch`` rows) then a DELETE of those ids, one
  transaction per batch, until the table is empty: the database's jobs/s for this cycle.
- Drive: an in-process `pgpool.dispatcher.Dispatcher` in burst mode with ``--procs``
  workers until drained. Reports wall and steady jobs/s, claims, acks, transactions per
  job (``pg_stat_database.xact_commit`` of the whole database, so other traffic counts),
  claim round trips, CPU seconds of the dispatcher, its workers and the local ``postgres``
  processes (``n/a`` when none are visible), and the formula
  ``procs * batch / (claim_rtt + batch * handle_time)`` next to what was achieved.
"""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import orjson
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import dsn as dsnlib
from . import registry, schema, sql
from .benchjobs import KIND, sha256_chain
from .config import RunConfig
from .dispatcher import Dispatcher
from .enqueue import enqueue_many
from .errors import PgpoolError
from .job import Outcome

PROFILES: Final = ("noop", "cpu", "sleep", "mixed")
#: Target duration of one ``cpu`` job, seconds.
CPU_JOB_SECONDS: Final = 0.005
#: The raw side of the seed comparison: pgpool's own COPY statement, rows prepared up front.
_RAW_COPY: Final = sql.COPY_JOBS
_CEILING_THREADS: Final = 2


class BenchError(PgpoolError):
    """The benchmark could not complete (the jobs did not drain, a dispatcher failed)."""


@dataclass(frozen=True)
class BenchOptions:
    """What to run: validated by the CLI."""

    dsn: str
    jobs: int
    procs: int
    batch: int
    profile: str


Progress = Callable[[str], None]


def run(opts: BenchOptions, progress: Progress) -> dict[str, Any]:
    """Run the whole benchmark and return every figure as a JSON-ready dict.

    Creates and always drops its own schema; raises `BenchError` if the jobs did not drain.
    """
    name = f"pgpool_bench_{secrets.token_hex(6)}"
    with dsnlib.connect(opts.dsn, autocommit=True) as admin:
        server = _server_facts(admin)
        admin.execute(f"CREATE SCHEMA {name}")
        try:
            report = _run_in(opts, _schema_dsn(opts.dsn, name), admin, progress)
        finally:
            progress(f"dropping schema {name}")
            _drop_schema(opts.dsn, name)
    return {"server": server, "schema": name,
            "options": {"jobs": opts.jobs, "procs": opts.procs, "batch": opts.batch,
                        "profile": opts.profile}, **report}


def _run_in(opts: BenchOptions, dsn: str, admin: psycopg.Connection,
            progress: Progress) -> dict[str, Any]:
    with dsnlib.connect(dsn, autocommit=True) as conn:
        schema.migrate(conn)
        progress("calibrating the job profile on this host")
        rounds, handle_time = _calibrate(opts.profile)
        payloads = _payloads(opts.profile, opts.jobs, rounds)

        progress(f"seeding {opts.jobs} jobs: enqueue_many vs raw COPY")
        seed = _seed_comparison(conn, payloads)

        progress("database ceiling: bare claim + delete loop on 2 connections")
        enqueue_many(conn, KIND, payloads)
        ceiling = _ceiling(dsn, opts.batch)
        _expect_empty(conn, "the ceiling loop")

        enqueue_many(conn, KIND, payloads)
        progress(f"driving {opts.jobs} {opts.profile} jobs through a dispatcher with "
                 f"{opts.procs} workers, batch {opts.batch}")
        drive = _drive(opts, dsn, admin)
        _expect_empty(conn, "the dispatcher")
    drive["predicted_jobs_per_s"] = _predict(opts, drive["claim_rtt_p50_ms"] / 1000,
                                             handle_time)
    drive["ratio_to_ceiling"] = drive["steady_jobs_per_s"] / ceiling["jobs_per_s"]
    return {
        "calibration": {"cpu_rounds": rounds, "handle_time_ms": handle_time * 1000},
        "seed": seed,
        "ceiling": ceiling,
        "drive": drive,
    }


# --- setup and teardown ---------------------------------------------------------------------

def _schema_dsn(dsn: str, name: str) -> str:
    """``dsn`` with ``search_path`` set to ``name``, keeping any other ``options``."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c search_path={name}".strip())


def _drop_schema(dsn: str, name: str) -> None:
    """Drop the bench schema on a fresh connection; warn (not raise) if that fails."""
    try:
        with dsnlib.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    except (PgpoolError, psycopg.Error) as exc:
        print(f"pgpool: warning: could not drop schema {name} ({exc}); drop it by hand",
              file=sys.stderr)


def _server_facts(conn: psycopg.Connection) -> dict[str, str]:
    row = conn.execute(
        "SELECT current_setting('server_version'), current_setting('fsync'), "
        "current_setting('synchronous_commit'), current_setting('shared_buffers')"
    ).fetchone()
    assert row is not None
    return dict(zip(("version", "fsync", "synchronous_commit", "shared_buffers"), row,
                    strict=True))


def _expect_empty(conn: psycopg.Connection, what: str) -> None:
    row = conn.execute("SELECT (SELECT count(*) FROM pgpool_jobs), "
                       "(SELECT count(*) FROM pgpool_dead)").fetchone()
    assert row is not None
    if row != (0, 0):
        raise BenchError(f"{what} left {row[0]} jobs queued and {row[1]} dead-lettered")


# --- profiles -------------------------------------------------------------------------------

def _calibrate(profile: str) -> tuple[int | None, float]:
    """(SHA-256 rounds for a ~5 ms cpu job or None, the profile's mean job time in s)."""
    noop = _mean_seconds(lambda: None, 1000)
    if profile == "noop":
        return None, noop
    rounds = 2000
    for times in (3, 10):  # a rough probe, then a refinement at about the target length
        took = _mean_seconds(partial(sha256_chain, rounds), times)
        rounds = max(1, round(rounds * CPU_JOB_SECONDS / took))
    cpu = _mean_seconds(lambda: sha256_chain(rounds), 10)
    if profile == "cpu":
        return rounds, cpu
    from .benchjobs import bench_job

    sleep = _mean_seconds(lambda: bench_job({"do": "sleep"}), 30)
    if profile == "sleep":
        return None, sleep
    return rounds, (noop + cpu + sleep) / 3


def _mean_seconds(fn: Callable[[], object], times: int) -> float:
    started = time.perf_counter()
    for _ in range(times):
        fn()
    return (time.perf_counter() - started) / times


def _payloads(profile: str, jobs: int, rounds: int | None) -> list[dict[str, Any]]:
    kinds = {"noop": [{"do": "noop"}], "cpu": [{"do": "cpu", "rounds": rounds}],
             "sleep": [{"do": "sleep"}]}
    cycle = kinds.get(profile) or [*kinds["noop"], *kinds["cpu"], *kinds["sleep"]]
    return [cycle[i % len(cycle)] for i in range(jobs)]


# --- seed -----------------------------------------------------------------------------------

def _seed_comparison(conn: psycopg.Connection, payloads: list[dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    enqueue_many(conn, KIND, payloads)
    pgpool_s = time.perf_counter() - started
    conn.execute("TRUNCATE pgpool_jobs")

    rows = b"".join(b"default\t%s\t%s\t0\t\\N\n" % (KIND.encode(), orjson.dumps(p))
                    for p in payloads)
    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur, cur.copy(_RAW_COPY) as copy:
        for i in range(0, len(rows), 1 << 20):
            copy.write(rows[i:i + (1 << 20)])
    raw_s = time.perf_counter() - started
    conn.execute("TRUNCATE pgpool_jobs")
    n = len(payloads)
    return {"enqueue_many_rows_per_s": n / pgpool_s, "raw_copy_rows_per_s": n / raw_s,
            "ratio": raw_s / pgpool_s}


# --- ceiling --------------------------------------------------------------------------------

def _ceiling(dsn: str, batch: int) -> dict[str, Any]:
    """Drain the table with bare claim + delete transactions on two threads."""
    done = [0] * _CEILING_THREADS
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop(index: int) -> None:
        params = {"queues": ["default"], "kinds": [KIND], "kind_max_attempts": [1],
                  "owner": f"bench-ceiling-{index}", "lease": 60.0, "limit": batch}
        try:
            with psycopg.connect(dsn) as conn:
                while not stop.is_set():
                    with conn.transaction():
                        ids = [r[0] for r in conn.execute(sql.CLAIM, params).fetchall()]
                        if not ids:
                            return
                        conn.execute("DELETE FROM pgpool_jobs WHERE id = ANY(%s)", [ids])
                    done[index] += len(ids)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True)
               for i in range(_CEILING_THREADS)]
    started = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        for t in threads:
            t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return {"connections": _CEILING_THREADS, "jobs": sum(done),
            "jobs_per_s": sum(done) / elapsed}


# --- drive ----------------------------------------------------------------------------------

class _MeasuredDispatcher(Dispatcher):
    """A dispatcher that times its completions, and samples PostgreSQL's CPU once drained,
    while its own connections (and their backends) still exist."""

    def __init__(self, config: RunConfig, handlers: dict[str, registry.Handler]) -> None:
        super().__init__(config, handlers)
        self.first_done: float | None = None
        self.last_done = 0.0
        self.postgres_cpu_end: dict[int, float] = {}
        self.interrupted = False

    def _on_outcome(self, out: Outcome) -> None:
        now = time.perf_counter()
        if self.first_done is None:
            self.first_done = now
        self.last_done = now
        super()._on_outcome(out)

    def _on_signal(self, sig: int) -> None:
        self.interrupted = True
        super()._on_signal(sig)

    async def _drain(self) -> None:
        await super()._drain()
        self.postgres_cpu_end = _postgres_cpu()


def _drive(opts: BenchOptions, dsn: str, admin: psycopg.Connection) -> dict[str, Any]:
    from .cli import _run_async

    modules = ("pgpool.benchjobs",)
    config = RunConfig(dsn=dsn, modules=modules, procs=opts.procs, batch=opts.batch,
                       burst=True)
    dispatcher = _MeasuredDispatcher(config, {KIND: registry.load(modules)[KIND]})
    commits_before = _commits(admin)
    pg_before = _postgres_cpu()
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    status = _run_async(dispatcher.run())
    ended = time.perf_counter()
    self_cpu = _cpu(resource.getrusage(resource.RUSAGE_SELF)) - _cpu(self_before)
    children_cpu = _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)) - _cpu(children_before)
    transactions = _commits(admin, settle=True) - commits_before
    if dispatcher.interrupted:
        raise KeyboardInterrupt
    if status != 0:
        raise BenchError(f"the dispatcher failed ({dispatcher.fatal or f'exit {status}'})")

    done = dispatcher.counts["ok"]
    first = dispatcher.first_done or ended
    steady = max(1e-9, dispatcher.last_done - first)
    rtts = sorted(dispatcher.claimer.rtts) or [dispatcher.claimer.rtt]
    claims = dispatcher.claimer.claims
    flushes = dispatcher.completer.stats.flushes
    pg_cpu = _cpu_delta(pg_before, dispatcher.postgres_cpu_end)
    return {
        "jobs_drained": done,
        "seconds": ended - started,
        "wall_jobs_per_s": done / (ended - started),
        "steady_jobs_per_s": max(0, done - 1) / steady,
        "claims": claims,
        "claimed_per_claim": dispatcher.claimer.claimed / max(1, claims),
        "ack_flushes": flushes,
        "mean_flush_size": dispatcher.completer.stats.acks / max(1, flushes),
        "transactions": transactions,
        "transactions_per_job": transactions / max(1, done),
        "claim_rtt_p50_ms": 1000 * _quantile(rtts, 0.50),
        "claim_rtt_p99_ms": 1000 * _quantile(rtts, 0.99),
        "claim_rtt_ewma_ms": 1000 * dispatcher.claimer.rtt,
        "cpu_seconds": {"dispatcher": self_cpu, "workers": children_cpu, "postgres": pg_cpu},
    }


def _predict(opts: BenchOptions, claim_rtt: float, handle_time: float) -> float:
    """The throughput formula: procs * batch / (claim_rtt + batch * handle_time)."""
    return opts.procs * opts.batch / max(1e-9, claim_rtt + opts.batch * handle_time)


def _quantile(ordered: list[float], q: float) -> float:
    if len(ordered) < 2:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def _commits(conn: psycopg.Connection, *, settle: bool = False) -> int:
    """The database's committed transactions. With ``settle``, wait (up to ~2 s) until the
    count stops moving: backends report their statistics when they exit, a bit later."""
    last = -1
    for _ in range(10):
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
        assert row is not None
        if not settle or row[0] == last:
            return int(row[0])
        last = row[0]
        time.sleep(0.2)
    return last


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _postgres_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each visible process named ``postgres``."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for entry in _proc_dirs():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm_end = stat.rfind(")")
        if stat[stat.find("(") + 1:comm_end] != "postgres":
            continue
        fields = stat[comm_end + 2:].split()
        found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def _proc_dirs() -> Iterator[Path]:
    with contextlib.suppress(OSError):
        yield from (p for p in Path("/proc").iterdir() if p.name.isdigit())


def _cpu_delta(before: dict[int, float], after: dict[int, float]) -> float | None:
    """CPU used between the samples by the processes alive at the end; None if none seen."""
    if not after:
        return None
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


# --- output ---------------------------------------------------------------------------------

def render(report: dict[str, Any]) -> str:
    """The report as an aligned, human-readable table."""
    s, o, cal = report["server"], report["options"], report["calibration"]
    seed, ceil, d = report["seed"], report["ceiling"], report["drive"]
    cpu = d["cpu_seconds"]
    pg_cpu = "n/a" if cpu["postgres"] is None else f"{cpu['postgres']:.2f}"
    profile = o["profile"]
    if cal["cpu_rounds"]:
        profile += f" (cpu job = {cal['cpu_rounds']} SHA-256 rounds)"
    rows = [
        ("PostgreSQL", f"{s['version']}; fsync={s['fsync']}, synchronous_commit="
                       f"{s['synchronous_commit']}, shared_buffers={s['shared_buffers']}"),
        ("run", f"{o['jobs']} jobs, profile {profile}, {o['procs']} workers, "
                f"batch {o['batch']}"),
        ("mean job time", f"{cal['handle_time_ms']:.4f} ms (measured in-process)"),
        ("seed: enqueue_many", f"{seed['enqueue_many_rows_per_s']:,.0f} rows/s"),
        ("seed: raw COPY", f"{seed['raw_copy_rows_per_s']:,.0f} rows/s; enqueue_many/raw "
                           f"= {seed['ratio']:.2f} (target >= 0.8)"),
        ("database ceiling", f"{ceil['jobs_per_s']:,.0f} jobs/s (claim + delete, "
                             f"{ceil['connections']} connections, no framework)"),
        ("drained", f"{d['jobs_drained']} jobs in {d['seconds']:.2f}s"),
        ("wall", f"{d['wall_jobs_per_s']:,.0f} jobs/s (including worker start-up)"),
        ("steady", f"{d['steady_jobs_per_s']:,.0f} jobs/s (first to last completion); "
                   f"{d['ratio_to_ceiling']:.2f} of the ceiling"),
        ("predicted", f"{d['predicted_jobs_per_s']:,.0f} jobs/s = procs x batch / "
                      "(claim_rtt p50 + batch x job time)"),
        ("claims", f"{d['claims']}, {d['claimed_per_claim']:.1f} jobs per claim; round trip "
                   f"p50 {d['claim_rtt_p50_ms']:.2f} ms, p99 {d['claim_rtt_p99_ms']:.2f} ms"),
        ("ack flushes", f"{d['ack_flushes']}, {d['mean_flush_size']:.1f} acks per flush"),
        ("transactions", f"{d['transactions']} = {d['transactions_per_job']:.3f} per job "
                         "(whole database)"),
        ("CPU seconds", f"dispatcher {cpu['dispatcher']:.2f}, workers {cpu['workers']:.2f}, "
                        f"local postgres {pg_cpu}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
