"""``pgpool bench``: seed jobs, drive them through a real dispatcher, report the costs.

Contract:

- Isolation: everything happens in a new schema ``pgpool_bench_<random>`` on the target
  database, reached through ``search_path``, migrated with `pgpool.migrate` and dropped at
  the end, also on error and Ctrl-C. The user's own pgpool tables are never read or
  written. Server settings (the version, and the durability settings ``fsync``,
  ``synchronous_commit``, ``full_page_writes``) are reported, never changed.
- Profiles (`pgpool.benchjobs`): ``noop``; ``cpu``, a SHA-256 chain calibrated once on this
  host to take about 5 ms; ``sleep``, a random 2-5 ms; ``mixed``, the three in turn.
- Seed: `pgpool.enqueue_many` of N jobs against a raw COPY of the same rows (prepared
  beforehand, the best any loader could do) into the same, empty table, alternating,
  `SEED_ROUNDS` times each; the fastest round of each side gives rows/s and the ratio.
- Backlog (``--backlog N``, default 0): then N jobs due in a day are inserted (one
  ``INSERT ... SELECT`` from ``generate_series``) and the table analysed; they stay for
  the rest of the run. pgpool deletes finished jobs (dead-lettered ones move to
  ``pgpool_dead``, which a claim never reads), so rows not yet due are what makes the table
  a claim works on deep. Every later stage runs against that table, and checks at its end
  that no job is left due or running and that the N backlog rows are still there.
- Ceilings: no framework, two connections in two threads, each repeating the claim
  statement (`pgpool.sql.CLAIM`, the drive's batch of rows) then a DELETE of those ids,
  until no job is due: the database's jobs/s for the cycle, in two forms. "One
  transaction": claim and delete commit together. "Lease cycle": the claim commits, then
  the delete commits, the two commits per batch that any lease-based queue needs (a claim
  must be durable before its work starts). Runs of half a second vary by about 20% on a
  small VM, so each ceiling is measured before the drive and again after it (on re-seeded
  jobs) and the mean is reported next to the single runs. With ``--batch auto`` the batch
  is only known once the drive has settled it, so both runs follow the drive.
- Drive: an in-process `pgpool.dispatcher.Dispatcher` in burst mode with ``--procs``
  workers until drained, with a progress line on stderr (rewritten in place every 0.5 s on
  a terminal, a new line every 5 s otherwise). Reports wall and steady jobs/s (steady:
  first to last completion) and the ratio to both ceilings; the batch (with ``auto``, the
  one the dispatcher settled at by the end); claims and their round trip p50/p99; claimed
  jobs/s in the steady window against this host's share of ``--max-claims-per-sec``
  (without that option the drive runs unthrottled and is compared with run's default); ack
  flushes, their mean size and latency p50/p99; transactions per job
  (``pg_stat_database.xact_commit`` of the whole database, so other traffic counts);
  statements per job (sent by the dispatcher's pooled connections: claims, acks,
  heartbeats, reaper, host registry; the LISTEN connection and the start-up schema check
  are not counted); queue lag p50/p99 (enqueue commit to handler start, for 1 job in 64,
  all seeded in one transaction, so the lag of the last ones is about the drain time); CPU
  seconds of the dispatcher, its workers and the local ``postgres`` processes (``n/a``
  when none are visible); the formula ``procs * batch / (claim_rtt + batch *
  handle_time)`` next to what was achieved; and "workers only", procs / the workers' CPU
  per job, the most they could do with their cores to themselves (the cpu profile's
  reference).
- Pickup: then a real ``pgpool run --procs 1`` subprocess serves the bench schema. Once its
  LISTEN is in place and a warm-up job ran, jobs are enqueued one at a time, each in its
  own committed transaction, 5-20 ms apart so the queue is idle: pickup latency is the time
  from the commit returning to the handler starting, p50/p99/max over min(200, N) jobs (at
  least 20). Handlers report their start through `pgpool.benchjobs.STAMPS_ENV`, as
  ``CLOCK_MONOTONIC`` (system-wide on Linux) nanoseconds. The subprocess is stopped with
  SIGTERM and must exit 0. The floor is measured the same way with no framework: a
  LISTENing connection, then a bare claim committed on a second one.
- Each ceiling run, the drive and the pickup start on a vacuumed table, as autovacuum keeps
  a live queue: the dead rows one stage leaves would otherwise slow the next.
- Targets from the issue are printed next to their figures: enqueue_many >= 0.8 of raw
  COPY; noop steady >= 0.8 of the ceilings; transactions/job <= 0.05 at batch 50; pickup
  p50 <= 1.5 ms, p99 <= 3 ms. They are reported, not enforced.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import resource
import secrets
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any, ClassVar, Final, Literal, TextIO

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import dsn as dsnlib
from . import registry, schema, sql
from .benchjobs import KIND, STAMPS_ENV, sha256_chain
from .config import RunConfig
from .dispatcher import Dispatcher
from .enqueue import copy_rows, enqueue, enqueue_many
from .errors import PgpoolError
from .job import Outcome

#: The drive's budget when none is given: far above anything one host can claim.
_NO_BUDGET: Final = 1e9
#: Alternating rounds of the seed comparison: a single 0.1 s load is at the mercy of noise.
SEED_ROUNDS: Final = 3
#: Target duration of one ``cpu`` job, seconds.
CPU_JOB_SECONDS: Final = 0.005
_CEILING_THREADS: Final = 2
#: One seeded job in this many records its start, for the queue lag.
LAG_SAMPLE_EVERY: Final = 64
#: Pickup jobs: min(this, --jobs), but at least `PICKUP_MIN`.
PICKUP_SAMPLES: Final = 200
PICKUP_MIN: Final = 20
#: Idle gap before each pickup job, seconds.
PICKUP_GAP: Final = (0.005, 0.020)
#: How long one pickup job may take to start before the run fails (polling is 1 s).
PICKUP_TIMEOUT: Final = 10.0
#: How long the pickup dispatcher may take to start, and to stop after SIGTERM.
SUBPROCESS_TIMEOUT: Final = 60.0

class BenchError(PgpoolError):
    """The benchmark could not complete (the jobs did not drain, a dispatcher failed)."""


@dataclass(frozen=True)
class BenchOptions:
    """What to run: validated by the CLI."""

    dsn: str
    jobs: int
    procs: int
    batch: int | Literal["auto"]
    profile: str
    #: Rows due in a day, inserted before the ceilings and the drive.
    backlog: int
    #: The fleet's claim budget, as ``pgpool run --max-claims-per-sec``; None runs without
    #: one (the drive measures the engine) and compares with the default budget.
    max_claims_per_sec: float | None


class Progress:
    """Progress on ``stream``: one line per stage; during the drive, a line rewritten in
    place on a terminal, or a new line every few seconds otherwise (logs stay short)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._open = False  # an in-place line is showing, without its newline
        #: Seconds between `update` calls.
        self.interval = 0.5 if self._tty else 5.0

    def step(self, message: str) -> None:
        self._end_line()
        print(f"pgpool bench: {message}", file=self._stream, flush=True)

    def update(self, message: str) -> None:
        if not self._tty:
            self.step(message)
            return
        self._stream.write(f"\rpgpool bench: {message}\x1b[K")
        self._stream.flush()
        self._open = True

    def _end_line(self) -> None:
        if self._open:
            self._stream.write("\n")
            self._open = False


def run(opts: BenchOptions, progress: Progress) -> dict[str, Any]:
    """Run the whole benchmark and return every figure as a JSON-ready dict.

    Creates and always drops its own schema; raises `BenchError` if the jobs did not drain.
    """
    name = f"pgpool_bench_{secrets.token_hex(6)}"
    with dsnlib.connect(opts.dsn, autocommit=True) as admin:
        server = _server_facts(admin)
        admin.execute(pgsql.SQL(sql.BENCH_CREATE_SCHEMA).format(pgsql.Identifier(name)))
        try:
            report = _run_in(opts, _schema_dsn(opts.dsn, name), admin, progress)
        finally:
            progress.step(f"dropping schema {name}")
            _drop_schema(opts.dsn, name)
    return {"server": server, "schema": name,
            "options": {"jobs": opts.jobs, "procs": opts.procs, "batch": opts.batch,
                        "profile": opts.profile, "backlog": opts.backlog,
                        "max_claims_per_sec": opts.max_claims_per_sec}, **report}


def _run_in(opts: BenchOptions, dsn: str, admin: psycopg.Connection,
            progress: Progress) -> dict[str, Any]:
    with (dsnlib.connect(dsn, autocommit=True) as conn,
          tempfile.TemporaryDirectory(prefix="pgpool-bench-") as tmp):
        schema.migrate(conn)
        progress.step("calibrating the job profile on this host")
        rounds, handle_time = _calibrate(opts.profile)
        payloads = _payloads(opts.profile, opts.jobs, rounds)

        progress.step(f"seeding {opts.jobs} jobs: enqueue_many vs raw COPY")
        seed = _seed_comparison(conn, payloads)
        if opts.backlog:
            progress.step(f"backlog: inserting {opts.backlog} jobs due in a day")
            conn.execute(sql.BENCH_BACKLOG, {"kind": KIND, "n": opts.backlog})
            conn.execute(sql.BENCH_ANALYZE)

        runs: list[dict[str, Any]] = []
        if opts.batch != "auto":
            runs.append(_ceilings(conn, dsn, payloads, opts, opts.batch, "before the drive",
                                  progress))
        drive = _drive(opts, dsn, admin, conn, payloads, Path(tmp), progress)
        _expect_empty(conn, "the dispatcher", opts.backlog)
        while len(runs) < 2:  # with auto, both runs follow the drive (see the docstring)
            runs.append(_ceilings(conn, dsn, payloads, opts, drive["batch"],
                                  "after the drive", progress))

        pickup = _pickup(opts, dsn, conn, Path(tmp), progress)
        _expect_empty(conn, "the pickup dispatcher", opts.backlog)

    ceiling: dict[str, Any] = {"batch": drive["batch"], "connections": _CEILING_THREADS}
    for cycle in ("one_transaction", "lease_cycle"):
        ceiling[cycle] = {"jobs_per_s": statistics.fmean(r[cycle]["jobs_per_s"] for r in runs),
                          "runs": [r[cycle] for r in runs]}
        drive[f"ratio_to_{cycle}"] = drive["steady_jobs_per_s"] / ceiling[cycle]["jobs_per_s"]
    # What the workers could do if they had their cores to themselves, at the CPU a job
    # took in them (all their CPU, start-up and hand-offs included, over the jobs): the
    # cpu profile's target. Not the calibrated time: a job's speed in the workers, both
    # busy, differs from the calibration's, run alone seconds earlier (by 15-30% either
    # way on a small VM).
    drive["worker_cpu_per_job_ms"] = 1000 * drive["cpu_seconds"]["workers"] / max(
        1, drive["jobs_drained"])
    drive["workers_only_jobs_per_s"] = opts.procs / max(1e-9, drive["worker_cpu_per_job_ms"]
                                                        / 1000)
    drive["predicted_jobs_per_s"] = _predict(opts.procs, drive["batch"],
                                             drive["claim_rtt_p50_ms"] / 1000, handle_time)
    return {
        "calibration": {"cpu_rounds": rounds, "handle_time_ms": handle_time * 1000},
        "seed": seed,
        "ceiling": ceiling,
        "drive": drive,
        "pickup": pickup,
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
            conn.execute(pgsql.SQL(sql.BENCH_DROP_SCHEMA).format(pgsql.Identifier(name)))
    except (PgpoolError, psycopg.Error) as exc:
        print(f"pgpool: warning: could not drop schema {name} ({exc}); drop it by hand",
              file=sys.stderr)


def _server_facts(conn: psycopg.Connection) -> dict[str, str]:
    row = conn.execute(sql.BENCH_SERVER_FACTS).fetchone()
    assert row is not None
    return dict(zip(("version", "fsync", "synchronous_commit", "full_page_writes",
                     "shared_buffers"), row, strict=True))


def _expect_empty(conn: psycopg.Connection, what: str, backlog: int) -> None:
    """No job left due or running, none dead-lettered, and the backlog rows intact."""
    row = conn.execute(sql.BENCH_LEFTOVERS).fetchone()
    assert row is not None
    if row != (0, backlog, 0):
        raise BenchError(f"{what} left {row[0]} jobs queued and {row[2]} dead-lettered; "
                         f"{row[1]} jobs not yet due, expected {backlog} (the backlog)")


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
    """Mean seconds per call over ``times`` calls, the lowest of three tries: a try
    disturbed by the rest of the machine only ever reads high."""
    tries = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(times):
            fn()
        tries.append((time.perf_counter() - started) / times)
    return min(tries)


def _payloads(profile: str, jobs: int, rounds: int | None) -> list[dict[str, Any]]:
    """The profile's payloads; one in `LAG_SAMPLE_EVERY` asks its handler for a stamp."""
    kinds = {"noop": [{"do": "noop"}], "cpu": [{"do": "cpu", "rounds": rounds}],
             "sleep": [{"do": "sleep"}]}
    cycle = kinds.get(profile) or [*kinds["noop"], *kinds["cpu"], *kinds["sleep"]]
    return [{**cycle[i % len(cycle)], "stamp": True} if i % LAG_SAMPLE_EVERY == 0
            else cycle[i % len(cycle)] for i in range(jobs)]


# --- seed -----------------------------------------------------------------------------------

def _seed_comparison(conn: psycopg.Connection, payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """enqueue_many against a raw COPY of pre-built rows, alternating, `SEED_ROUNDS` times
    each; the fastest of each side counts (the round least disturbed by the machine)."""
    # The very rows enqueue_many sends, encoded before the clock starts.
    pieces = [piece for piece, _ in copy_rows(KIND, payloads)]

    def raw_copy() -> None:
        with conn.transaction(), conn.cursor() as cur, cur.copy(sql.COPY_JOBS) as copy:
            for piece in pieces:
                copy.write(piece)

    best = {"pgpool": math.inf, "raw": math.inf}
    for _ in range(SEED_ROUNDS):
        for side, load in (("pgpool", lambda: enqueue_many(conn, KIND, payloads)),
                           ("raw", raw_copy)):
            started = time.perf_counter()
            load()
            best[side] = min(best[side], time.perf_counter() - started)
            conn.execute(sql.BENCH_EMPTY)
    n = len(payloads)
    return {"rounds": SEED_ROUNDS, "enqueue_many_rows_per_s": n / best["pgpool"],
            "raw_copy_rows_per_s": n / best["raw"], "ratio": best["raw"] / best["pgpool"]}


# --- ceilings -------------------------------------------------------------------------------

def _vacuum(conn: psycopg.Connection) -> None:
    """Start a phase on a vacuumed table, as autovacuum (aggressive on this table) keeps a
    live queue: otherwise the dead rows the previous phase left slow the next one down."""
    conn.execute(sql.BENCH_VACUUM)


def _ceilings(conn: psycopg.Connection, dsn: str, payloads: list[dict[str, Any]],
              opts: BenchOptions, batch: int, when: str,
              progress: Progress) -> dict[str, dict[str, Any]]:
    """One run of each ceiling loop, each on freshly seeded jobs."""
    progress.step(f"database ceilings ({when}): bare claim + delete loops on "
                  f"{_CEILING_THREADS} connections, batch {batch}")
    out = {}
    for cycle in ("one_transaction", "lease_cycle"):
        _vacuum(conn)
        enqueue_many(conn, KIND, payloads)
        out[cycle] = {"when": when, **_ceiling(dsn, batch, lease_cycle=cycle == "lease_cycle")}
        _expect_empty(conn, f"the {cycle.replace('_', ' ')} ceiling loop", opts.backlog)
    return out


def _bare_claim(owner: str, limit: int) -> dict[str, Any]:
    """Parameters for `sql.CLAIM` as a no-framework loop uses it: the bench kind, one
    attempt, a long lease."""
    return {"queues": ["default"], "kinds": [KIND], "kind_max_attempts": [1],
            "owner": owner, "lease": 60.0, "limit": limit}


def _ceiling(dsn: str, batch: int, *, lease_cycle: bool) -> dict[str, Any]:
    """Drain the due jobs with bare claim + delete statements on two threads: in one
    transaction per batch, or (``lease_cycle``) with a commit after each statement."""
    done = [0] * _CEILING_THREADS
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop(index: int) -> None:
        params = _bare_claim(f"bench-ceiling-{index}", batch)
        try:
            with dsnlib.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    with contextlib.nullcontext() if lease_cycle else conn.transaction():
                        ids = [r[0] for r in conn.execute(sql.CLAIM, params).fetchall()]
                        if not ids:
                            return
                        conn.execute(sql.BENCH_DELETE, {"ids": ids})
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
    return {"jobs": sum(done), "seconds": elapsed, "jobs_per_s": sum(done) / elapsed}


# --- drive ----------------------------------------------------------------------------------

class _CountingConnection(psycopg.AsyncConnection[Any]):
    """A pooled connection that counts the statements it sends: every dispatcher part
    (claimer, completer, heartbeat, reaper, host registry) goes through `execute`."""

    statements: ClassVar[int] = 0

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        _CountingConnection.statements += 1
        return await super().execute(*args, **kwargs)


class _MeasuredDispatcher(Dispatcher):
    """A dispatcher that times its completions, counts its statements, shows progress, and
    samples PostgreSQL's CPU once drained, while its own connections (and their backends)
    still exist."""

    connection_class = _CountingConnection

    def __init__(self, config: RunConfig, handlers: dict[str, registry.Handler], *,
                 total: int, progress: Progress) -> None:
        super().__init__(config, handlers)
        self.first_done: float | None = None
        self.last_done = 0.0
        self.claimed_at_first_done = 0
        self.postgres_cpu_end: dict[int, float] = {}
        self.interrupted = False
        self._total = total
        self._progress = progress

    async def run(self) -> int:
        ticker = asyncio.create_task(self._tick())
        try:
            return await super().run()
        finally:
            ticker.cancel()

    async def _tick(self) -> None:
        last_at, last_done = time.perf_counter(), 0
        while True:
            await asyncio.sleep(self._progress.interval)
            now, done = time.perf_counter(), self.counts["ok"] + self.counts["dead"]
            self._progress.update(f"drained {done}/{self._total} jobs "
                                  f"({(done - last_done) / (now - last_at):,.0f} jobs/s)")
            last_at, last_done = now, done

    def _on_outcome(self, out: Outcome) -> None:
        now = time.perf_counter()
        if self.first_done is None:
            self.first_done = now
            self.claimed_at_first_done = self.claimer.claimed
        self.last_done = now
        super()._on_outcome(out)

    def _on_signal(self, sig: int) -> None:
        self.interrupted = True
        super()._on_signal(sig)

    async def _drain(self) -> None:
        await super()._drain()
        self.postgres_cpu_end = _postgres_cpu()


def _drive(opts: BenchOptions, dsn: str, admin: psycopg.Connection,
           conn: psycopg.Connection, payloads: list[dict[str, Any]], tmp: Path,
           progress: Progress) -> dict[str, Any]:
    from .cli import _run_async

    modules = ("pgpool.benchjobs",)
    config = RunConfig(dsn=dsn, modules=modules, procs=opts.procs, batch=opts.batch,
                       burst=True, max_claims_per_sec=opts.max_claims_per_sec or _NO_BUDGET)
    dispatcher = _MeasuredDispatcher(config, {KIND: registry.load(modules)[KIND]},
                                     total=len(payloads), progress=progress)
    stamps = tmp / "drive-stamps"
    stamps.touch()
    _vacuum(conn)
    enqueue_many(conn, KIND, payloads)
    enqueued_ns = time.monotonic_ns()  # enqueue_many has committed its transaction
    progress.step(f"driving {opts.jobs} {opts.profile} jobs through a dispatcher with "
                  f"{opts.procs} workers, batch {opts.batch}")
    statements_before = _CountingConnection.statements
    commits_before = _commits(admin)
    pg_before = _postgres_cpu()
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.environ[STAMPS_ENV] = str(stamps)  # inherited by the workers the dispatcher spawns
    started = time.perf_counter()
    try:
        status = _run_async(dispatcher.run())
    finally:
        del os.environ[STAMPS_ENV]
    ended = time.perf_counter()
    self_cpu = _cpu(resource.getrusage(resource.RUSAGE_SELF)) - _cpu(self_before)
    children_cpu = _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)) - _cpu(children_before)
    statements = _CountingConnection.statements - statements_before
    transactions = _commits(admin, settle=True) - commits_before
    if dispatcher.interrupted:
        raise KeyboardInterrupt
    if status != 0:
        raise BenchError(f"the dispatcher failed ({dispatcher.fatal or f'exit {status}'})")

    done = dispatcher.counts["ok"]
    progress.step(f"drained {done}/{len(payloads)} jobs in {ended - started:.2f}s")
    first = dispatcher.first_done or ended
    steady = max(1e-9, dispatcher.last_done - first)
    rtts = sorted(dispatcher.claimer.rtts) or [dispatcher.claimer.rtt]
    claims = dispatcher.claimer.claims
    stats = dispatcher.completer.stats
    flush_times = sorted(stats.flush_seconds)
    lags = sorted((int(line) - enqueued_ns) / 1e6 for line in stamps.read_text().split())
    pg_cpu = _cpu_delta(pg_before, dispatcher.postgres_cpu_end)
    return {
        "batch": dispatcher.batch,  # with auto, the batch it settled at
        "jobs_drained": done,
        "seconds": ended - started,
        "wall_jobs_per_s": done / (ended - started),
        "steady_jobs_per_s": max(0, done - 1) / steady,
        "claims": claims,
        "claimed_per_claim": dispatcher.claimer.claimed / max(1, claims),
        "claim_rtt_p50_ms": 1000 * _quantile(rtts, 0.50),
        "claim_rtt_p99_ms": 1000 * _quantile(rtts, 0.99),
        "claim_rtt_recent_ms": 1000 * dispatcher.claimer.rtt,
        "claims_per_s": (dispatcher.claimer.claimed - dispatcher.claimed_at_first_done) / steady,
        "claim_budget_per_s": (dispatcher.budget.rate if opts.max_claims_per_sec
                               else RunConfig.max_claims_per_sec),
        "claim_budget_applied": opts.max_claims_per_sec is not None,
        "ack_flushes": stats.flushes,
        "mean_flush_size": stats.acks / max(1, stats.flushes),
        "flush_p50_ms": 1000 * _quantile(flush_times, 0.50),
        "flush_p99_ms": 1000 * _quantile(flush_times, 0.99),
        "transactions": transactions,
        "transactions_per_job": transactions / max(1, done),
        "statements": statements,
        "statements_per_job": statements / max(1, done),
        "queue_lag_samples": len(lags),
        "queue_lag_p50_ms": _quantile(lags, 0.50),
        "queue_lag_p99_ms": _quantile(lags, 0.99),
        "cpu_seconds": {"dispatcher": self_cpu, "workers": children_cpu, "postgres": pg_cpu},
    }


def _predict(procs: int, batch: int, claim_rtt: float, handle_time: float) -> float:
    """The throughput formula: procs * batch / (claim_rtt + batch * handle_time)."""
    return procs * batch / max(1e-9, claim_rtt + batch * handle_time)


def _budget_row(d: dict[str, Any]) -> str:
    rate, budget = d["claims_per_s"], d["claim_budget_per_s"]
    if d["claim_budget_applied"]:
        return (f"{rate:,.0f} claimed jobs/s (steady) = {rate / budget:.2f} of this host's share "
                f"of --max-claims-per-sec, {budget:,.0f}/s (its bucket starts with 1 s of "
                "budget)")
    return (f"{rate:,.0f} claimed jobs/s (steady) = {rate / budget:.2f} of the default fleet "
            f"budget, {budget:,.0f}/s (not applied here: the drive measures the engine; "
            "pass --max-claims-per-sec to apply one)")


def _quantile(ordered: list[float], q: float) -> float:
    if len(ordered) < 2:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def _commits(conn: psycopg.Connection, *, settle: bool = False) -> int:
    """The database's committed transactions. With ``settle``, wait (up to ~2 s) until the
    count stops moving: backends report their statistics when they exit, a bit later."""
    last = -1
    for _ in range(10):
        row = conn.execute(sql.BENCH_COMMITS).fetchone()
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


# --- pickup ---------------------------------------------------------------------------------

_STAMP_JOB: Final = {"do": "noop", "stamp": True}


def _pickup(opts: BenchOptions, dsn: str, conn: psycopg.Connection, tmp: Path,
            progress: Progress) -> dict[str, Any]:
    """Pickup latency on an idle queue, through a real ``pgpool run`` subprocess."""
    samples = max(PICKUP_MIN, min(PICKUP_SAMPLES, opts.jobs))
    _vacuum(conn)
    progress.step(f"pickup latency: starting `pgpool run --procs 1`, then {samples} jobs "
                  "enqueued one at a time on an idle queue")
    fifo = tmp / "pickup-stamps"
    os.mkfifo(fifo)
    # A FIFO wakes the reader the moment a handler writes. Our own write end keeps it from
    # reporting end-of-file between the handlers' writes.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep_open = os.open(fifo, os.O_WRONLY)
    app = f"pgpool-bench-pickup-{os.getpid()}-{secrets.token_hex(3)}"
    env = {**os.environ, STAMPS_ENV: str(fifo), "PGPOOL_LOG_LEVEL": "WARNING",
           "PGPOOL_DSN": make_conninfo(dsn, application_name=app)}  # not in `ps` output
    with open(tmp / "pickup.log", "w+b") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgpool", "run", "--handlers", "pgpool.benchjobs",
             "--procs", "1", "--batch", str(opts.batch)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        try:
            _await_listener(conn, app, proc, log)
            enqueue(conn, KIND, _STAMP_JOB)  # warm-up: the worker's first job
            _read_stamp(reader, proc, log, SUBPROCESS_TIMEOUT)
            latencies = []
            for _ in range(samples):
                time.sleep(random.uniform(*PICKUP_GAP))
                enqueue(conn, KIND, _STAMP_JOB)  # autocommit: its own transaction
                committed = time.monotonic_ns()
                latencies.append((_read_stamp(reader, proc, log, PICKUP_TIMEOUT)
                                  - committed) / 1e6)
            proc.send_signal(signal.SIGTERM)
            try:
                status = proc.wait(SUBPROCESS_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise BenchError("the pickup dispatcher did not stop within "
                                 f"{SUBPROCESS_TIMEOUT:g}s of SIGTERM") from None
            if status != 0:
                raise BenchError(f"the pickup dispatcher exited with status {status} after "
                                 f"SIGTERM: {_last_line(log)}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(reader)
            os.close(keep_open)
    latencies.sort()
    floor = _pickup_floor(dsn, conn, samples)
    return {"samples": len(latencies), "procs": 1,
            "p50_ms": _quantile(latencies, 0.50), "p99_ms": _quantile(latencies, 0.99),
            "max_ms": latencies[-1], "floor_p50_ms": _quantile(floor, 0.50),
            "floor_p99_ms": _quantile(floor, 0.99)}


def _pickup_floor(dsn: str, conn: psycopg.Connection, samples: int) -> list[float]:
    """The latency no framework can beat, in ms: from the enqueue's commit to a bare
    claim's durable commit, by a connection that was LISTENing (then the job is deleted)."""
    params = _bare_claim("bench-pickup-floor", 1)
    latencies = []
    with dsnlib.connect(dsn, autocommit=True) as listener, \
            dsnlib.connect(dsn, autocommit=True) as claimer:
        listener.execute(sql.LISTEN)
        for _ in range(samples):
            time.sleep(random.uniform(*PICKUP_GAP))
            enqueue(conn, KIND, _STAMP_JOB)
            committed = time.monotonic_ns()
            if not list(listener.notifies(timeout=PICKUP_TIMEOUT, stop_after=1)):
                raise BenchError(f"no notification within {PICKUP_TIMEOUT:g}s")
            ids = [r[0] for r in claimer.execute(sql.CLAIM, params).fetchall()]
            latencies.append((time.monotonic_ns() - committed) / 1e6)
            claimer.execute(sql.BENCH_DELETE, {"ids": ids})
    return sorted(latencies)


def _await_listener(conn: psycopg.Connection, app: str, proc: subprocess.Popen[bytes],
                    log: IO[bytes]) -> None:
    """Wait until the pickup dispatcher's LISTEN is in place: before that, a job enqueued
    would wait for its poll, not its notification."""
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    while not conn.execute(sql.BENCH_LISTENING, {"app": app, "listen": sql.LISTEN}).fetchone():
        _check_alive(proc, log)
        if time.monotonic() > deadline:
            raise BenchError(f"the pickup dispatcher did not start within "
                             f"{SUBPROCESS_TIMEOUT:g}s")
        time.sleep(0.02)


def _read_stamp(fd: int, proc: subprocess.Popen[bytes], log: IO[bytes],
                timeout: float) -> int:
    """The next handler start time written to the FIFO ``fd``, in monotonic ns."""
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError(f"no pickup job started within {timeout:g}s")
        if select.select([fd], [], [], min(left, 0.5))[0]:
            line += os.read(fd, 64)
        else:
            _check_alive(proc, log)
    return int(line)


def _check_alive(proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    if proc.poll() is not None:
        raise BenchError(f"the pickup dispatcher exited with status {proc.returncode}: "
                         f"{_last_line(log)}")


def _last_line(log: IO[bytes]) -> str:
    log.seek(0)
    lines = log.read().decode(errors="replace").splitlines()
    return lines[-1] if lines else "(no output)"


# --- output ---------------------------------------------------------------------------------

def render(report: dict[str, Any]) -> str:
    """The report as an aligned, human-readable table."""
    s, o, cal = report["server"], report["options"], report["calibration"]
    seed, ceil, d, p = report["seed"], report["ceiling"], report["drive"], report["pickup"]
    cpu = d["cpu_seconds"]
    pg_cpu = "n/a" if cpu["postgres"] is None else f"{cpu['postgres']:.2f}"
    profile = o["profile"]
    if cal["cpu_rounds"]:
        profile += f" (cpu job = {cal['cpu_rounds']} SHA-256 rounds)"
    batch = f"auto (settled at {d['batch']})" if o["batch"] == "auto" else str(o["batch"])
    one, lease = ceil["one_transaction"], ceil["lease_cycle"]
    rows = [
        ("PostgreSQL", f"{s['version']}; fsync={s['fsync']}, synchronous_commit="
                       f"{s['synchronous_commit']}, full_page_writes={s['full_page_writes']}, "
                       f"shared_buffers={s['shared_buffers']} (reported, never changed)"),
        ("run", f"{o['jobs']} jobs, profile {profile}, {o['procs']} workers, batch {batch}, "
                f"backlog {o['backlog']} jobs due in a day"),
        ("mean job time", f"{cal['handle_time_ms']:.4f} ms (measured in-process)"),
        ("seed: enqueue_many", f"{seed['enqueue_many_rows_per_s']:,.0f} rows/s"),
        ("seed: raw COPY", f"{seed['raw_copy_rows_per_s']:,.0f} rows/s; enqueue_many/raw "
                           f"= {seed['ratio']:.2f} (target >= 0.8; best of {seed['rounds']} "
                           "alternating rounds each)"),
        ("ceiling: 1 transaction", f"{one['jobs_per_s']:,.0f} jobs/s (claim + delete, one "
                                   f"commit per batch; {_runs(one)})"),
        ("ceiling: lease cycle", f"{lease['jobs_per_s']:,.0f} jobs/s (claim commit, then "
                                 f"delete commit; {_runs(lease)})"),
        ("", f"both: no framework, {ceil['connections']} connections, batch {ceil['batch']}"),
        ("drained", f"{d['jobs_drained']} jobs in {d['seconds']:.2f}s"),
        ("wall", f"{d['wall_jobs_per_s']:,.0f} jobs/s (including worker start-up)"),
        ("steady", f"{d['steady_jobs_per_s']:,.0f} jobs/s (first to last completion)"),
        ("vs ceilings", f"{d['ratio_to_one_transaction']:.2f} of 1 transaction, "
                        f"{d['ratio_to_lease_cycle']:.2f} of the lease cycle "
                        "(target >= 0.8 for noop)"),
        ("predicted", f"{d['predicted_jobs_per_s']:,.0f} jobs/s = procs x batch / "
                      "(claim_rtt p50 + batch x job time)"),
        ("workers only", f"{d['workers_only_jobs_per_s']:,.0f} jobs/s = procs / worker CPU "
                         f"per job ({d['worker_cpu_per_job_ms']:.4f} ms); "
                         f"steady is {d['steady_jobs_per_s'] / d['workers_only_jobs_per_s']:.2f}"
                         " of it (target >= 0.95 for cpu)"),
        ("claims", f"{d['claims']}, {d['claimed_per_claim']:.1f} jobs per claim; round trip "
                   f"p50 {d['claim_rtt_p50_ms']:.2f} ms, p99 {d['claim_rtt_p99_ms']:.2f} ms"),
        ("claim budget", _budget_row(d)),
        ("ack flushes", f"{d['ack_flushes']}, {d['mean_flush_size']:.1f} acks per flush; "
                        f"p50 {d['flush_p50_ms']:.2f} ms, p99 {d['flush_p99_ms']:.2f} ms"),
        ("transactions", f"{d['transactions']} = {d['transactions_per_job']:.3f} per job "
                         "(whole database; target <= 0.05 at batch 50)"),
        ("statements", f"{d['statements']} = {d['statements_per_job']:.3f} per job "
                       "(dispatcher's pooled connections; LISTEN not counted)"),
        ("queue lag", f"p50 {d['queue_lag_p50_ms']:,.1f} ms, p99 {d['queue_lag_p99_ms']:,.1f} "
                      f"ms (enqueue commit -> handler start, {d['queue_lag_samples']} "
                      "sampled jobs, all seeded at once)"),
        ("pickup, idle queue", f"p50 {p['p50_ms']:.2f} ms (target <= 1.5), p99 "
                               f"{p['p99_ms']:.2f} ms (target <= 3), max {p['max_ms']:.2f} "
                               f"ms; {p['samples']} jobs, `pgpool run --procs {p['procs']}`"),
        ("pickup floor", f"p50 {p['floor_p50_ms']:.2f} ms, p99 {p['floor_p99_ms']:.2f} ms: "
                         "enqueue commit -> notification -> a bare claim committed, no "
                         "framework"),
        ("CPU seconds", f"dispatcher {cpu['dispatcher']:.2f}, workers {cpu['workers']:.2f}, "
                        f"local postgres {pg_cpu}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)


def _runs(ceiling: dict[str, Any]) -> str:
    """"mean of A before the drive, B after the drive", or "mean of A and B, both after
    the drive" (``--batch auto``)."""
    runs = ceiling["runs"]
    if len({r["when"] for r in runs}) == 1:
        figures = " and ".join(f"{r['jobs_per_s']:,.0f}" for r in runs)
        return f"mean of {figures}, both {runs[0]['when']}"
    return "mean of " + ", ".join(f"{r['jobs_per_s']:,.0f} {r['when']}" for r in runs)
