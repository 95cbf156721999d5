"""Prometheus metrics and the health check of one dispatcher, served on ``--metrics-port``.

Two kinds of figures, from two places:

- The host's own (every dispatcher serves them): jobs finished by kind and outcome, run
  time and queue lag by kind, claims and their round trips, ack flushes, jobs in flight,
  worker restarts by reason, lost leases, the batch and procs in use, and this host's
  share of the fleet's claim budget. `DispatcherMetrics` counts events on the event loop
  in plain Python (no lock per job); a scrape copies them on the loop, with what the parts
  count anyway, and prometheus-client turns them into its text format (`_HostCollector`).
- The queue's (`QueueCollector`), read from the database at scrape time: jobs by queue and
  state, the age of the oldest ready job, dead letters, the fleet's claims per second,
  autovacuum debt on ``pgpool_jobs``, the use of the kinds' limits, the dead rows and
  vacuums of each of pgpool's tables, and the age and kind of what holds back their vacuum
  (`pgpool.horizon`; figures and bounded labels only: never a query, a name or an address).
  Those describe the database, not a host, so exactly one dispatcher serves them at a time:
  the one whose scrape connection holds a session-level advisory lock (one per schema). If
  it dies, its connection closes, the lock is released, and the next host scraped takes
  over. Every host exports ``pgpool_queue_metrics_reporter`` (1 on the one that serves
  them), so ``sum(pgpool_queue_jobs)`` over a fleet scrape counts each job once.

The HTTP server runs on a thread of its own. What it reads of the dispatcher's state is
taken on the event loop (`on_loop`), never read across threads while the loop changes it;
``/healthz`` asks the loop to answer too (`Health`), so a stuck loop shows as unhealthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Final, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from .. import horizon
from ..errors import ConfigError
from ..ops import TOP_SCOPES, limit_uses
from ..sql import observe as sql
from ..sql.fleet import STALE_AFTER_LEASES
from ..sql.ops import LIMITS

if TYPE_CHECKING:
    import psycopg

    from .attempt import AttemptEnd, Job
    from .completer import Ack, FlushResult

log = logging.getLogger("pgpool.metrics")

T = TypeVar("T")

#: Seconds: from a few milliseconds (thumbnails) to an hour (simulations).
RUN_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                      900, 3600)
LAG_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                      900, 3600)
DB_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
FLUSH_SIZE_BUCKETS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
#: The ``reason`` of ``pgpool_queue_dead_jobs``, each served for every queue (0 when none).
DEAD_REASONS: Final[Mapping[str, int]] = {"failed": 0, "cancelled": 0, "discarded": 0}
#: The ``kind`` of ``pgpool_xmin_horizon_holder``, each served (1 for the oldest holder's).
HOLDER_KINDS: Final = ("backend", "prepared", "slot", "standby")
#: What ``/healthz`` waits for the event loop to answer, seconds.
LOOP_TIMEOUT: Final = 2.0
#: The scrape connection's statement timeout, ms: a scrape must not hang on a lock.
SCRAPE_TIMEOUT_MS: Final = 5000

#: `Completer` ack kinds as the ``outcome`` label; "lost" is a result dropped because the
#: lease was lost. "dead": dead-lettered as failed; "discarded" and "cancelled": by its
#: handler (`pgpool.Discard`, `pgpool.Cancel`); "snoozed": `pgpool.Snooze`, not an attempt.
OUTCOMES: Final[Mapping[str, str]] = {"done": "succeeded", "retry": "retried",
                                      "dead": "dead", "interrupted": "interrupted",
                                      "snooze": "snoozed", "discard": "discarded",
                                      "cancel": "cancelled"}


@dataclass(frozen=True, slots=True)
class HostState:
    """What the dispatcher reports at scrape time, taken on its event loop."""

    procs: int
    batch: int
    in_flight: int
    budget_share: float  # this host's claims per second
    restarts: dict[str, int]  # worker restarts by reason
    leases_lost: int  # attempts the database no longer showed as this host's
    lease_abandonments: int  # attempts given up for want of a heartbeat
    ack_flush_failures: int
    db_reached_at: float  # time.monotonic() when this host last reached the database
    vacuums: int  # the vacuum keeper's vacuums of pgpool_jobs (0: it runs none)
    vacuum_left: int  # dead rows its last vacuum could not remove, when that many were due


class _Histogram:
    """A Prometheus histogram's counts, kept on the event loop: an observation is a bisect and
    two additions (prometheus-client's own instruments take a lock per observation, which
    cost the dispatcher 10 µs more per noop job: bench/metrics_overhead.py)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.total += value

    def sample(self) -> tuple[list[tuple[str, float]], float]:
        """(cumulative buckets, sum) as `HistogramMetricFamily.add_metric` takes them."""
        buckets, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets, self.total


@dataclass(frozen=True, slots=True)
class _Sample:
    """Everything /metrics shows of this host, copied on the event loop at one moment."""

    state: HostState
    finished: dict[tuple[str, str], int]
    run: dict[str, tuple[list[tuple[str, float]], float]]
    lag: dict[str, tuple[list[tuple[str, float]], float]]
    claims: int
    claimed: int
    claim_seconds: tuple[list[tuple[str, float]], float]
    flush_size: tuple[list[tuple[str, float]], float]
    flush_seconds: tuple[list[tuple[str, float]], float]


class DispatcherMetrics:
    """The figures of one dispatcher and the registry that serves them.

    Call `jobs_claimed`, `job_finished` and `acks_flushed` from the event loop. A scrape
    (on the HTTP thread) copies them, with ``state()``, on the loop (`on_loop`).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, state: Callable[[], HostState],
                 dsn: str) -> None:
        self._loop = loop
        self._state = state
        self._finished: dict[tuple[str, str], int] = {}
        self._run: dict[str, _Histogram] = {}
        self._lag: dict[str, _Histogram] = {}
        self._claims = 0
        self._claimed = 0
        self._claim_seconds = _Histogram(DB_BUCKETS)
        self._flush_size = _Histogram(FLUSH_SIZE_BUCKETS)
        self._flush_seconds = _Histogram(DB_BUCKETS)
        self.registry = CollectorRegistry()
        self.registry.register(_HostCollector(self))
        self.queues = QueueCollector(dsn)
        self.registry.register(self.queues)

    # --- on the event loop ----------------------------------------------------------------

    def jobs_claimed(self, seconds: float, jobs: list[Job]) -> None:
        """A claim returned ``jobs`` after ``seconds``."""
        self._claims += 1
        self._claimed += len(jobs)
        self._claim_seconds.observe(seconds)
        lag = self._lag
        for job in jobs:
            h = lag.get(job.kind)
            if h is None:
                h = lag[job.kind] = _Histogram(LAG_BUCKETS)
            h.observe(job.waited)

    def job_finished(self, outcome: AttemptEnd, ack: Ack | None) -> None:
        """An attempt ended; ``ack`` is what the completer made of it (None: lease lost)."""
        kind = outcome.job.kind
        key = (kind, OUTCOMES[ack.kind] if ack is not None else "lost")
        self._finished[key] = self._finished.get(key, 0) + 1
        h = self._run.get(kind)
        if h is None:
            h = self._run[kind] = _Histogram(RUN_BUCKETS)
        h.observe(outcome.elapsed)

    def jobs_done(self, jobs: list[Job], elapsed: list[float], acks: list[Ack | None]
                  ) -> None:
        """Plain successes (`job_finished` for each, without an `AttemptEnd`)."""
        for job, seconds, ack in zip(jobs, elapsed, acks, strict=True):
            kind = job.kind
            key = (kind, OUTCOMES[ack.kind] if ack is not None else "lost")
            self._finished[key] = self._finished.get(key, 0) + 1
            h = self._run.get(kind)
            if h is None:
                h = self._run[kind] = _Histogram(RUN_BUCKETS)
            h.observe(seconds)

    def acks_flushed(self, result: FlushResult) -> None:
        self._flush_size.observe(result.size)
        self._flush_seconds.observe(result.seconds)

    def sample(self) -> _Sample:
        """A copy of every figure (on the loop)."""
        return _Sample(
            state=self._state(), finished=dict(self._finished),
            run={k: h.sample() for k, h in self._run.items()},
            lag={k: h.sample() for k, h in self._lag.items()},
            claims=self._claims, claimed=self._claimed,
            claim_seconds=self._claim_seconds.sample(),
            flush_size=self._flush_size.sample(), flush_seconds=self._flush_seconds.sample(),
        )

    # --- on the HTTP thread ---------------------------------------------------------------

    def take_sample(self) -> _Sample | None:
        """`sample`, taken on the loop; None if the loop does not answer."""
        return on_loop(self._loop, self.sample)


def _histogram(name: str, doc: str, by_kind: dict[str, tuple[list[tuple[str, float]], float]]
               ) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["kind"])
    for kind, (buckets, total) in sorted(by_kind.items()):
        family.add_metric([kind], buckets, total)
    return family


class _HostCollector(Collector):
    """This host's figures (`DispatcherMetrics.sample`)."""

    def __init__(self, metrics: DispatcherMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics.take_sample()
        if m is None:  # the loop did not answer: /healthz says so; serve the rest
            return
        finished = CounterMetricFamily("pgpool_jobs_finished",
                                       "Attempts ended, by kind and outcome",
                                       labels=["kind", "outcome"])
        for labels, count in sorted(m.finished.items()):
            finished.add_metric(list(labels), count)
        yield finished
        yield _histogram("pgpool_job_run_seconds", "Time a handler ran, by kind", m.run)
        yield _histogram("pgpool_job_queue_lag_seconds",
                         "Time from when a job was due to its claim, by kind", m.lag)
        yield CounterMetricFamily("pgpool_claims", "Claim statements sent", value=m.claims)
        yield CounterMetricFamily("pgpool_claimed_jobs", "Jobs claimed", value=m.claimed)
        for name, doc, (buckets, total) in (
                ("pgpool_claim_duration_seconds", "Claim round trip", m.claim_seconds),
                ("pgpool_ack_flush_jobs", "Acks written per flush", m.flush_size),
                ("pgpool_ack_flush_duration_seconds", "Ack flush round trip",
                 m.flush_seconds)):
            family = HistogramMetricFamily(name, doc)
            family.add_metric([], buckets, total)
            yield family
        s = m.state
        yield GaugeMetricFamily("pgpool_jobs_in_flight",
                                "Jobs this host holds: claimed, running or not yet acked",
                                value=s.in_flight)
        yield GaugeMetricFamily("pgpool_worker_processes", "Worker processes (--procs)",
                                value=s.procs)
        yield GaugeMetricFamily("pgpool_batch_size", "Jobs per claim in use", value=s.batch)
        yield GaugeMetricFamily("pgpool_claim_budget_per_second",
                                "This host's share of the fleet's claims per second",
                                value=s.budget_share)
        restarts = CounterMetricFamily("pgpool_worker_restarts",
                                       "Workers replaced, by reason", labels=["reason"])
        for reason, count in sorted(s.restarts.items()):
            restarts.add_metric([reason], count)
        yield restarts
        yield CounterMetricFamily("pgpool_leases_lost",
                                  "Attempts the database no longer showed as this host's",
                                  value=s.leases_lost)
        yield CounterMetricFamily("pgpool_lease_abandonments",
                                  "Attempts given up because no heartbeat succeeded in time",
                                  value=s.lease_abandonments)
        yield CounterMetricFamily("pgpool_ack_flush_failures", "Ack flushes that failed "
                                  "(their acks are kept and retried)",
                                  value=s.ack_flush_failures)
        yield CounterMetricFamily("pgpool_vacuum_keeper_vacuums",
                                  "Vacuums of pgpool_jobs this host's vacuum keeper ran",
                                  value=s.vacuums)
        yield GaugeMetricFamily("pgpool_vacuum_keeper_dead_rows_left",
                                "Dead rows of pgpool_jobs the keeper's last vacuum could not "
                                "remove, as the xmin horizon held them (0: it removed what "
                                "was due)", value=s.vacuum_left)
        yield GaugeMetricFamily("pgpool_database_reached_seconds_ago",
                                "Seconds since this host last reached the database",
                                value=time.monotonic() - s.db_reached_at)


class QueueCollector(Collector):
    """The queue's figures, from the database, on exactly one host at a time (the holder of
    the advisory lock: a dispatcher, or ``pgpool web``). Runs on the HTTP server's threads,
    one scrape at a time."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self.reporter = False

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            try:
                metrics = self._read()
            except Exception as exc:  # a scrape must answer whatever the database does
                log.warning("queue metrics unavailable (%s)", type(exc).__name__)
                self.close()
                metrics = []
            yield GaugeMetricFamily(
                "pgpool_queue_metrics_reporter",
                "1 on the one host that serves the queue metrics (pgpool_queue_*), else 0",
                value=1 if self.reporter else 0)
            yield from metrics

    def _read(self) -> list[Metric]:
        import psycopg

        if self._conn is None or self._conn.closed:
            self.reporter = False
            self._conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5)
            self._conn.execute(f"SET statement_timeout = {SCRAPE_TIMEOUT_MS}")
        conn = self._conn
        if not self.reporter:
            self.reporter = conn.execute(sql.METRICS_TAKE_REPORTER).fetchone()[0]
        if not self.reporter:
            return []
        jobs = GaugeMetricFamily("pgpool_queue_jobs", "Jobs by queue and state "
                                 "(ready: due now; scheduled: due later; parked and done: "
                                 "their ack or reap was refused)",
                                 labels=["queue", "state"])
        paused = GaugeMetricFamily("pgpool_queue_paused", "1 if the queue is paused",
                                   labels=["queue"])
        lag = GaugeMetricFamily("pgpool_queue_oldest_ready_age_seconds",
                                "Age of the oldest job due now that more hosts could start "
                                "(not one waiting on its kind's limit), by queue (the queue "
                                "lag)", labels=["queue"])
        waiting = GaugeMetricFamily("pgpool_queue_waiting_on_limits", "Jobs due now that "
                                    "wait on their kind's limit (not lag: more hosts could "
                                    "not start them), by queue", labels=["queue"])
        dead = GaugeMetricFamily("pgpool_queue_dead_jobs", "Dead-lettered jobs, by queue "
                                 "and reason (failed, cancelled, discarded)",
                                 labels=["queue", "reason"])
        for (queue, ready, scheduled, running, parked, done, oldest, dead_counts,
             is_paused, on_limits) in conn.execute(sql.METRICS_QUEUES).fetchall():
            for state, count in (("ready", ready), ("scheduled", scheduled),
                                 ("running", running), ("parked", parked), ("done", done)):
                jobs.add_metric([queue, state], count)
            lag.add_metric([queue], oldest or 0.0)
            waiting.add_metric([queue], on_limits)
            for reason, count in sorted({**DEAD_REASONS, **dead_counts}.items()):
                dead.add_metric([queue, reason], count)
            paused.add_metric([queue], 1 if is_paused else 0)
        limits = self._limits(conn)
        hosts, claims_per_sec, budget = conn.execute(
            sql.METRICS_FLEET, {"stale_leases": STALE_AFTER_LEASES}).fetchone()
        dead_tuples, live_tuples, vacuum_ago = conn.execute(sql.METRICS_VACUUM).fetchone()
        return [
            jobs, lag, waiting, dead, paused, *limits, *self._horizon(conn),
            GaugeMetricFamily("pgpool_fleet_hosts", "Live dispatchers", value=hosts),
            GaugeMetricFamily("pgpool_fleet_claims_per_second",
                              "Jobs claimed per second by all live hosts",
                              value=claims_per_sec),
            GaugeMetricFamily("pgpool_fleet_claim_budget_per_second",
                              "The fleet's claim budget: set with pgpool budget set, else the "
                              "largest any live host runs with",
                              value=budget),
            GaugeMetricFamily("pgpool_jobs_table_dead_tuples",
                              "Dead tuples in pgpool_jobs (autovacuum debt)",
                              value=dead_tuples),
            GaugeMetricFamily("pgpool_jobs_table_live_tuples", "Live tuples in pgpool_jobs",
                              value=live_tuples),
            GaugeMetricFamily("pgpool_jobs_table_last_autovacuum_seconds_ago",
                              "Seconds since autovacuum last finished on pgpool_jobs "
                              "(NaN: never)", value=vacuum_ago),
        ]

    @staticmethod
    def _limits(conn: psycopg.Connection) -> list[Metric]:
        """The use of the kinds' limits (`pgpool.limits`), as `pgpool limits` lists it."""
        in_use = GaugeMetricFamily(
            "pgpool_limit_in_use", "Use of a kind's fleet-wide limit: running jobs holding a "
            "slot of its concurrency limit, and rows of its rate's ring used in the last "
            "period", labels=["kind", "limit"])
        waiting = GaugeMetricFamily(
            "pgpool_limit_waiting", "Jobs due now of a kind that wait on its fleet-wide "
            "limit: more than it lets start within the fleet's target lag (not lag)",
            labels=["kind"])
        scopes = GaugeMetricFamily(
            "pgpool_limit_scopes", "Scopes (tenants or concurrency keys) of a kind's limit by "
            "tenant or by key holding slots or with rows of their ring used in the last "
            "period", labels=["kind"])
        busiest = GaugeMetricFamily(
            "pgpool_limit_scope_busiest", "Use of the busiest scopes of a kind's limit by "
            "tenant or by key (the three with the most running jobs and ring rows used): the "
            "most running jobs holding slots of one of them, and the most rows of one's ring "
            "used in the last period", labels=["kind", "limit"])
        # Tenants are not labels: unbounded. `pgpool limits` names the busiest.
        for use in limit_uses(conn.execute(LIMITS, {"top": TOP_SCOPES}).fetchall()):
            in_use.add_metric([use.kind, "concurrency"], use.running)
            in_use.add_metric([use.kind, "rate"], use.rate_used)
            waiting.add_metric([use.kind], use.waiting)
            if use.scopes:
                scopes.add_metric([use.kind], use.scopes)
                busiest.add_metric([use.kind, "concurrency"],
                                   max(t.running for t in use.top))
                busiest.add_metric([use.kind, "rate"], max(t.rate_used for t in use.top))
        return [in_use, waiting, scopes, busiest]

    @staticmethod
    def _horizon(conn: psycopg.Connection) -> list[Metric]:
        """What holds back vacuum of pgpool's tables, and their dead rows and vacuums."""
        h = horizon.collect(conn, None)
        oldest = h["holders"][0] if h["holders"] else None
        holder = GaugeMetricFamily("pgpool_xmin_horizon_holder",
                                   "1 for the kind of the oldest holder of the xmin horizon of "
                                   "pgpool's tables (backend, prepared, slot, standby)",
                                   labels=["kind"])
        for kind in HOLDER_KINDS:
            holder.add_metric([kind], 1 if oldest and oldest["kind"] == kind else 0)
        dead = GaugeMetricFamily("pgpool_table_dead_tuples",
                                 "Dead rows in each of pgpool's tables", labels=["table"])
        live = GaugeMetricFamily("pgpool_table_live_tuples",
                                 "Live rows in each of pgpool's tables", labels=["table"])
        vacuums = CounterMetricFamily("pgpool_table_vacuums",
                                      "Vacuums of each of pgpool's tables, by a VACUUM (the "
                                      "vacuum keeper's or an operator's) or autovacuum",
                                      labels=["table", "by"])
        ago = GaugeMetricFamily("pgpool_table_last_vacuum_seconds_ago",
                                "Seconds since a vacuum of each kind last finished on each of "
                                "pgpool's tables (NaN: never)", labels=["table", "by"])
        for t in h["tables"]:
            dead.add_metric([t["table"]], t["dead_tuples"])
            live.add_metric([t["table"]], t["live_tuples"])
            for by, count, seconds in (("vacuum", t["vacuums"], t["last_vacuum_ago"]),
                                       ("autovacuum", t["autovacuums"],
                                        t["last_autovacuum_ago"])):
                vacuums.add_metric([t["table"], by], count)
                ago.add_metric([t["table"], by], math.nan if seconds is None else seconds)
        return [
            GaugeMetricFamily("pgpool_xmin_horizon_age_transactions",
                              "Age in transactions of the oldest xmin holding back vacuum of "
                              "pgpool's tables (0: none)",
                              value=0 if oldest is None else oldest["age_transactions"]),
            GaugeMetricFamily("pgpool_xmin_horizon_age_seconds",
                              "Age in seconds of the oldest xmin holding back vacuum of "
                              "pgpool's tables (0: none; NaN: the server keeps no clock for "
                              "it, a standby's feedback or an active slot)",
                              value=0 if oldest is None else
                              math.nan if oldest["age_seconds"] is None
                              else oldest["age_seconds"]),
            holder,
            GaugeMetricFamily("pgpool_xmin_horizon_hidden_sessions",
                              "Sessions of the database whose transactions this role may not "
                              "see (grant pg_read_all_stats): one may hold the horizon",
                              value=h["hidden_sessions"]),
            dead, live, vacuums, ago,
        ]

    def close(self) -> None:
        """Drop the scrape connection (and with it the reporter's lock)."""
        self.reporter = False
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


class Health:
    """``/healthz``: healthy when the event loop answers within `LOOP_TIMEOUT` and this host
    reached the database within one lease."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lease: float,
                 db_reached_at: Callable[[], float]) -> None:
        """``db_reached_at()``: `time.monotonic()` when the host last reached the database."""
        self._loop = loop
        self._lease = lease
        self._db_reached_at = db_reached_at

    def check(self) -> tuple[bool, str]:
        """(healthy, why), from any thread but the loop's."""
        reached_at = on_loop(self._loop, self._db_reached_at)
        if reached_at is None:
            return False, f"the event loop did not answer within {LOOP_TIMEOUT:g}s"
        ago = time.monotonic() - reached_at
        if ago > self._lease:
            return False, f"the database was last reached {ago:.0f}s ago (lease {self._lease:g}s)"
        return True, f"ok: the database was reached {ago:.1f}s ago"


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], T]) -> T | None:
    """``fn()`` run on ``loop`` (from another thread); None if the loop does not run it
    within `LOOP_TIMEOUT` seconds, or is closed."""
    answered = threading.Event()
    result: list[T] = []

    def call() -> None:
        try:
            result.append(fn())
        finally:
            answered.set()

    try:
        loop.call_soon_threadsafe(call)
    except RuntimeError:  # the loop is closed
        return None
    answered.wait(LOOP_TIMEOUT)
    return result[0] if result else None


class MetricsServer:
    """``GET /metrics`` (Prometheus text format) and ``GET /healthz`` on a thread."""

    def __init__(self, metrics: DispatcherMetrics, health: Health, host: str,
                 port: int) -> None:
        handler = _handler(metrics, health)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}): choose a "
                "free --metrics-port (or PGPOOL_METRICS_PORT)") from None
        self._server.daemon_threads = True
        self._metrics = metrics
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="pgpool metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._metrics.queues.close()


def _handler(metrics: DispatcherMetrics, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry))
            elif path == "/healthz":
                ok, why = health.check()
                self._send(200 if ok else 503, "text/plain; charset=utf-8",
                           (why + "\n").encode())
            else:
                self._send(404, "text/plain; charset=utf-8",
                           b"not found: try /metrics or /healthz\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds would flood the log

    return Handler
