"""Claiming batches of ready jobs: one statement, one transaction, SKIP LOCKED.

Three claims: the plain one (`sql.CLAIM_PLAIN`) while nothing waiting has a tenant or a
concurrency key, which is what most queues are; the fair one (`sql.CLAIM`, or
`sql.CLAIM_CPU` with ``--fair-by cpu``) otherwise, so a queue pays for fairness only while
it uses it. A plain claim that takes nothing (nothing waits, or something needs fairness)
is followed by a look at whether something needs fairness (`sql.NEEDS_FAIR`), and by the
fair claim if it does, which says whether the next claim can be plain again. The kinds
with a concurrency limit (`pgpool.Limit`) are left out of both and claimed by the third,
`sql.CLAIM_LIMITED`, first, which takes a job only with a free slot of its kind's limit
(`sql.CLAIM_SLOTS` when no kind-wide limit has a rate; those limited per tenant
or per key by `sql.CLAIM_SCOPED`, its twin for scopes): a host without limited kinds never
runs any of them, and the plain and fair claims are the same statements with or without
limits elsewhere. A rate's claim may grant the host tokens that its next claims spend
without the rate's ring (`sql.CLAIM_GRANTED`, `pgpool.host.grant`).

The plain claim reads each (queue, kind) pair's ready jobs from a cursor: the claim-order
key of the last job this claimer took there. Before it lie the index entries of the jobs
claimed since the table was last vacuumed, dead, and with the xmin horizon pinned by a long
transaction, nothing removes them: a claim from the start would walk all of them, more at
every claim. What a cursor skips can also hold a job that became ready behind it (its
producer's transaction committed late, a retry fell due, another host let a locked row go),
so now and then a claim is a sweep, from the start (`sql.SWEEP`): after a claim that came
back short (the backlog ahead of the cursor is done) and every `SWEEP_EVERY` seconds, but no
sooner after the last one than `SWEEP_COST` times its round trip (`SWEEP_MAX_GAP` at most);
at once after a cursor claim that took nothing while sweeps are cheap (`CHEAP_SWEEP`); and
whatever it costs when the host knows a job lies behind a cursor (`sweep_next`: it handed
jobs back, or a burst host reaped before it decides it is drained).
On a clean table a sweep costs what a cursor claim does, so a job committed behind a cursor
waits for no poll, as before cursors; with a pinned horizon, sweeps are few and the cursor
claims stay cheap. The kind-wide limited claim reads its kinds from cursors of its own, on
the same terms, while none of their waiting jobs has a tenant or a concurrency key (then
by its plain twin, `sql.CLAIM_SLOTS_PLAIN` or `sql.CLAIM_LIMITED_PLAIN`). The fair
claim has a cursor per tenant (`sql.CLAIM_CURSORS`), on the same terms, but that it sweeps
at every claim while sweeps cost no more than claims from its cursors (a clean table: the
cursors cost each tenant two more index descents there, and skip nothing).
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Collection
from typing import cast

import psycopg
from psycopg.adapt import Loader
from psycopg_pool import AsyncConnectionPool

from ..db import statements
from ..limits import Limit
from ..registry import Handler
from ..sql import jobs as sql
from ..sql.common import int_array, nullable_int_array
from .attempt import Job
from .config import FairBy
from .grant import Grants
from .lease import Lease

RTT_SAMPLES = 10_000
RECENT_RTTS = 15
#: Claims the p99 published for `pgpool status` covers: the recent ones.
P99_SAMPLES = 1000
#: Tries of a claim that lost a race for a concurrency key (`sql.CLAIM`): each retry sees
#: the winner's commit, so a second try almost always succeeds; past this, the claim loop's
#: own back-off takes over.
KEY_RACE_TRIES = 5
#: How a claim loses that race. Two claims taking two keys each, in opposite orders, each
#: wait for the other's uncommitted key: a deadlock, which the server ends after
#: ``deadlock_timeout`` by aborting one of them, or ``lock_timeout`` first. A claim waits
#: for no other lock (SKIP LOCKED) but a table's, held by a DDL statement.
KEY_RACE_LOST = (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected,
                 psycopg.errors.LockNotAvailable)
#: Seconds between sweeps while every claim comes back full (a backlog draining).
SWEEP_EVERY = 1.0
#: A sweep follows the last one by at least this many times its round trip: at most about a
#: twentieth of the claim connection's time goes to sweeps, however many dead rows they
#: walk; but never by more than `SWEEP_MAX_GAP` seconds, which bounds how long a job that
#: became ready behind a cursor waits (a round trip that waited for a lock, or for a
#: connection, would otherwise put sweeps off for minutes).
SWEEP_COST = 20
SWEEP_MAX_GAP = 5.0
#: Seconds: a sweep that took no longer than this (a clean table's) is run at once after a
#: cursor claim that took nothing, whatever `SWEEP_COST` says.
CHEAP_SWEEP = 0.005
#: The fair claim sweeps every time while a sweep's round trip is at most this many times a
#: claim from the cursors' (`TenantCursors.sweep_due`).
SWEEPS_AT_CURSORS_COST = 1.0
#: Seconds a tenant's cursor is kept after the last job taken there: a tenant gone quiet
#: costs neither memory nor a look at each claim.
TENANT_CURSOR_KEPT = 60.0
#: The cursor of a pair the claimer has taken nothing from: none, from the start.
_FROM_START = (None, None, None)


def _claim_order(row: tuple) -> tuple[int, int, int]:
    """A claimed job's row's claim-order key (priority, highest first; then due time in µs;
    then id): the order the claims' rows go to the workers in, and their cursors'."""
    return (-row[9], row[13], row[0])


class RawJsonLoader(Loader):
    """Load jsonb as its raw text bytes: the dispatcher never parses payloads."""

    def load(self, data: bytes | bytearray | memoryview) -> bytes:
        return bytes(data)


class Cursors:
    """A claim's cursors, per (queue, kind) pair, and when it sweeps instead (see the
    module's docstring): the plain claim's, or the kind-wide limited claim's."""

    def __init__(self) -> None:
        #: Per (queue, kind), the claim-order key (priority, run_at in microseconds since
        #: the epoch, id) of the last job taken there (a subclass's keys may say more).
        self._keys: dict[tuple[str, ...], tuple[int | float, ...]] = {}
        #: Whether a sweep is due (the last claim came back short), whether the next claim
        #: must sweep whatever it costs (`owe_sweep`), when the last sweep started
        #: (monotonic seconds) and its round trip.
        self._wanted = True
        self._owed = False
        self._swept_at = -math.inf
        self._rtt = 0.0
        self.sweeps = 0
        #: The last claim was a sweep.
        self.swept = False

    def sweep_due(self, now: float) -> bool:
        """Whether the claim starting at ``now`` sweeps."""
        wanted = self._wanted or now - self._swept_at >= SWEEP_EVERY
        gap = min(SWEEP_COST * self._rtt, SWEEP_MAX_GAP)
        return (wanted and now - self._swept_at >= gap) or not self._keys or self._owed

    def sweep_is_cheap(self) -> bool:
        """Whether sweeps cost what a clean table's do (`CHEAP_SWEEP`)."""
        return self._rtt <= CHEAP_SWEEP

    def owe_sweep(self) -> None:
        self._owed = True

    def params(self, queues: list[str], kinds: list[str], sweep: bool) -> dict[str, str | None]:
        """A claim's cursor parameters (``after_*``): a key per (queue, kind) pair, queues
        outer, kinds inner, `_FROM_START` for a pair with none yet; all NULL to sweep."""
        if sweep:
            # Cleared before the statement: a job handed back while it runs may be behind
            # the rows it reads, and is owed the next sweep.
            self._owed = False
            return sql.SWEEP
        keys = [self._keys.get((queue, kind), _FROM_START)
                for queue in queues for kind in kinds]
        return {"after_priorities": nullable_int_array(k[0] for k in keys),
                "after_run_at_us": nullable_int_array(k[1] for k in keys),
                "after_ids": nullable_int_array(k[2] for k in keys)}

    def ran(self, sweep: bool, started: float) -> None:
        """A claim that started at ``started`` has answered; a sweep's round trip is kept
        (not the first one's, which prepares the statement too)."""
        self.swept = sweep
        if sweep:
            if self.sweeps:
                self._rtt = time.monotonic() - started
            self._swept_at = started
            self.sweeps += 1

    def move(self, rows: list[tuple], limit: int) -> None:
        """Move the cursors on past ``rows`` (claimed jobs without a tenant, in claim
        order, of a claim of ``limit``): each pair's last row is its cursor."""
        self._wanted = len(rows) < limit
        self.advance(rows)

    def advance(self, rows: list[tuple]) -> None:
        """`move` the cursors of the pairs of ``rows`` only: a claim that says nothing of
        the others (a prompt claim's)."""
        last = {(row[2], row[1]): row for row in rows}
        for pair, row in last.items():
            self._keys[pair] = (row[9], row[13], row[0])


class TenantCursors(Cursors):
    """The fair claim's cursors, per (queue, kind) pair and tenant, on the same sweep policy
    as `Cursors`: the claim-order key of the last job taken from each tenant there."""

    def __init__(self) -> None:
        super().__init__()
        #: Per (queue, kind): its tenants with a cursor in tenant order (as PostgreSQL's
        #: "C" collation orders them: by code point), and per (queue, kind, tenant) the
        #: key (priority, run_at µs, id) and when it last moved (monotonic seconds).
        self._tenants: dict[tuple[str, str], list[str]] = {}
        self._pruned_at = time.monotonic()
        #: The last claim from the cursors: its round trip, and when it started.
        self._cursor_rtt = 0.0
        self._cursor_at = -math.inf

    def sweep_due(self, now: float) -> bool:
        """`Cursors.sweep_due`; and on a table where sweeps cost no more than claims from
        the cursors (a clean one: the cursors' probes cost each tenant two more index
        descents and skip nothing; `SWEEPS_AT_CURSORS_COST`), every claim sweeps but one
        every `SWEEP_EVERY` seconds, which measures what the cursors cost."""
        if super().sweep_due(now):
            return True
        return (now - self._cursor_at < SWEEP_EVERY
                and self._rtt <= SWEEPS_AT_CURSORS_COST * self._cursor_rtt)

    def ran(self, sweep: bool, started: float) -> None:
        """`Cursors.ran`; a claim from the cursors' round trip is kept too."""
        super().ran(sweep, started)
        if not sweep:
            self._cursor_rtt = time.monotonic() - started
            self._cursor_at = started

    def tenant_params(self, queues: list[str], kinds: list[str], after: str, limit: int,
                      sweep: bool) -> dict[str, object]:
        """A fair claim's cursor parameters (``cursor_*``): per pair (queues outer, kinds
        inner), the tenants with a cursor that its walk may visit (the first ``limit`` +
        `sql.TENANT_SKIPS` after ``after``, wrapping round), in tenant order; none for a
        sweep (`sql.CLAIM` takes none). A tenant left out is read from the start."""
        if sweep:
            self._owed = False  # as in `Cursors.params`
            return {}
        most = limit + sql.TENANT_SKIPS
        pns: list[int] = []
        names: list[str] = []
        keys: list[tuple[int | float, ...]] = []
        for pn, (queue, kind) in enumerate(itertools.product(queues, kinds), 1):
            known = self._tenants.get((queue, kind))
            if not known:
                continue
            start = bisect.bisect_right(known, after)
            sent = known[start:start + most]
            sent = known[:max(0, min(start, most - len(sent)))] + sent
            pns += [pn] * len(sent)
            names += sent
            keys += [self._keys[(queue, kind, tenant)] for tenant in sent]
        return {"cursor_pairs": int_array(pns), "cursor_tenants": names,
                "cursor_priorities": int_array(k[0] for k in keys),
                "cursor_run_at_us": int_array(k[1] for k in keys),
                "cursor_ids": int_array(k[2] for k in keys)}

    def move(self, rows: list[tuple], limit: int) -> None:
        """Move the cursors on past ``rows`` (claimed jobs in claim order, of a claim of
        ``limit``): each (queue, kind, tenant)'s last row is its cursor. Tenants not
        claimed from for `TENANT_CURSOR_KEPT` seconds lose theirs."""
        self._wanted = len(rows) < limit
        now = time.monotonic()
        last = {(row[2], row[1], row[8]): row for row in rows}
        for (queue, kind, tenant), row in last.items():
            if (queue, kind, tenant) not in self._keys:
                bisect.insort(self._tenants.setdefault((queue, kind), []), tenant)
            self._keys[(queue, kind, tenant)] = (row[9], row[13], row[0], now)
        if now - self._pruned_at >= TENANT_CURSOR_KEPT:
            self._pruned_at = now
            self._keys = {key: value for key, value in self._keys.items()
                          if now - value[3] < TENANT_CURSOR_KEPT}
            self._tenants = {}
            for queue, kind, tenant in sorted(self._keys):
                self._tenants.setdefault((queue, kind), []).append(tenant)


async def configure_connection(conn: psycopg.AsyncConnection, lease: Lease | None = None,
                               *, claims: bool = False) -> None:
    """Set up a pooled connection of a dispatcher: payloads stay raw bytes, transactions
    are read committed (`sql.READ_COMMITTED`), no JIT (`sql.NO_JIT`). With ``lease`` (the
    dispatcher's pools), every statement on it runs with `Lease.lock_timeout` and
    `Lease.statement_timeout` (unless the DSN, role or database sets them): set once per
    connection, not once per statement. With ``claims`` (the claim pool, which runs only
    the claimer's statements), prepared statements keep one generic plan
    (`sql.GENERIC_PLANS`), which reads no table whole where an index can do
    (`sql.INDEX_SCANS`).

    All in one round trip (a client-side cursor sends them as one string): a host opens ten
    connections as it starts, and each round trip of theirs delays its first claim."""
    conn.adapters.register_loader("jsonb", RawJsonLoader)
    settings = [sql.READ_COMMITTED, sql.NO_JIT,
                *([sql.GENERIC_PLANS, sql.INDEX_SCANS] if claims else [])]
    params = {}
    if lease is not None:
        settings.append(sql.SESSION_TIMEOUTS)
        params = {"lock": f"{round(lease.lock_timeout * 1000)}ms",
                  "statement": f"{round(lease.statement_timeout * 1000)}ms"}
    await psycopg.AsyncClientCursor(conn).execute(";".join(settings), params or None)


class Claimer:
    """Claims jobs of the given queues and of the kinds this host has handlers for.

    Several claims may be in flight at once (the scheduler runs two claim loops): each
    claim sends its own parameters. The pool's connections must be set up by
    `configure_connection`.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        owner: str,
        *,
        queues: tuple[str, ...],
        handlers: dict[str, Handler],
        lease: Lease,
        max_attempts: int,
        timeout: float | None,
        on_claimed: Callable[[float, list[Job]], None] | None = None,
        tenant_cap: int | None = None,
        fair_by: FairBy = "count",
    ) -> None:
        """``on_claimed(seconds, jobs)`` is told of every claim: its round trip and jobs.
        ``tenant_cap``: the most running jobs of one tenant across the fleet
        (docs/guides/fairness.md), None for no cap. ``fair_by``: what the fair claim
        evens out between tenants, their jobs (`sql.CLAIM`) or their CPU time
        (`sql.CLAIM_CPU`)."""
        self._pool = pool
        self._on_claimed = on_claimed
        self._timeouts = {k: handlers[k].timeout or timeout for k in handlers}
        self._all_kinds = sorted(handlers)
        self._max_attempts = {k: handlers[k].max_attempts or max_attempts for k in handlers}
        self._owner = owner
        #: The fair claim, from the tenants' cursors (False) and as a sweep (True).
        self._fair_claim = ({False: sql.CLAIM_CPU_CURSORS, True: sql.CLAIM_CPU}
                            if fair_by == "cpu" else
                            {False: sql.CLAIM_CURSORS, True: sql.CLAIM})
        #: What every plain or fair claim sends, but its ``limit`` (and its kinds, those
        #: without a limit: `set_limits`).
        self._params: dict[str, object] = {
            "queues": list(queues),
            "owner": owner,
            "lease": lease.seconds,
            "tenant_cap": tenant_cap,
        }
        #: What every limited claim (`sql.CLAIM_LIMITED`) sends, but its ``limit`` and
        #: queues: the kinds with a kind-wide limit. Empty: this host has none, never runs
        #: it. The same for the kinds limited per tenant or per key (`sql.CLAIM_SCOPED`).
        self._limited: dict[str, object] = {}
        self._scoped: dict[str, object] = {}
        #: The limited kinds of both, for `sql.LIMITED_WAITING`.
        self._limited_kinds: list[str] = []
        #: The scoped claim's cursor: its walk over tenants starts after this one.
        self._scope_after = ""
        #: Whether the last limited claim took fewer jobs than it asked for: its kinds may
        #: wait on their limits, and the slots freed here are worth telling the fleet of.
        self.limited_short = False
        #: The rate rings' rows to add before the next limited claim (`sql.ENSURE_TICKS`).
        self._ticks: dict[str, object] | None = None
        #: Whether no kind-wide limit has a rate: they are claimed by `sql.CLAIM_SLOTS`,
        #: which reads no ring, else by `sql.CLAIM_LIMITED`.
        self._slots_only = True
        #: The tokens of a rate this host was granted (`pgpool.host.grant`).
        self._grants = Grants(0.0)
        #: Whether the next kind-wide limited claim is `sql.CLAIM_SLOTS_PLAIN` (or
        #: `sql.CLAIM_LIMITED_PLAIN`): as far as the last one saw, no job waiting in its
        #: kinds has a tenant or a concurrency key.
        self._limited_plain = True
        self._lease = lease
        self.set_limits({k: h.limit for k, h in handlers.items() if h.limit is not None})
        #: The fair claim's cursor: its loose scan over tenants starts after this one, so
        #: with more tenants waiting than a batch holds, every one of them gets its turn.
        self._after = ""
        #: Whether the next claim is the plain one (`sql.CLAIM_PLAIN`): as far as the last
        #: fair claim saw, no job waiting has a tenant or a concurrency key.
        self.plain = True
        #: The plain claim's cursors, and the kind-wide limited claim's.
        self._plain_cursors = Cursors()
        self._limited_cursors = Cursors()
        self._fair_cursors = TenantCursors()
        #: The last claim found no job this host could run waiting at all (a sweep took
        #: nothing, and no job waits for the fair claim): an idle queue.
        self.found_none = False
        self._queues = list(queues)
        #: The queues claimed from: those not paused.
        self._serving = self._queues
        self.claims = 0
        self.claimed = 0
        #: The most recent round trips, seconds, for percentiles.
        self.rtts: deque[float] = deque(maxlen=RTT_SAMPLES)

    def set_limits(self, limits: dict[str, Limit]) -> None:
        """Claim the kinds of ``limits`` (the limits in force: the code's, or an operator's
        override) with the limited claim, from the next claim on, and the others with the
        plain or fair one."""
        limited = sorted(k for k in limits if k in self._max_attempts)
        kinds = [k for k in self._all_kinds if k not in limits]
        self._params["kinds"] = kinds
        self._params["kind_max_attempts"] = int_array(self._max_attempts[k] for k in kinds)
        self._limited_kinds = limited
        self._limited_set = frozenset(limited)
        whole = [k for k in limited if limits[k].by is None]
        scoped = [k for k in limited if limits[k].by is not None]
        self._limited = self._limit_params("limited", whole, limits)
        self._scoped = self._limit_params("scoped", scoped, limits)
        if scoped:
            self._scoped["scoped_by"] = [limits[k].by for k in scoped]
            self._scoped["walk"] = sql.SCOPE_WALK
        # The kind-wide rings are made here; the scoped ones by the claims that need them.
        rated = [(k, limits[k].rate) for k in whole if limits[k].rate is not None]
        self._ticks = {"rate_kinds": [k for k, _ in rated],
                       "rates": int_array(r for _, r in rated)} if rated else None
        self._slots_only = not rated
        self._grants = Grants.for_limits([limits[k] for k in whole])

    def _limit_params(self, prefix: str, kinds: list[str], limits: dict[str, Limit]
                      ) -> dict[str, object]:
        """What a limited claim of ``kinds`` sends (its parameters named from ``prefix``),
        but its ``limit`` and queues; empty for no kinds."""
        if not kinds:
            return {}
        in_force = [limits[k] for k in kinds]
        return {
            f"{prefix}_kinds": kinds,
            f"{prefix}_concurrency": nullable_int_array(lim.concurrency for lim in in_force),
            f"{prefix}_rate": nullable_int_array(lim.rate for lim in in_force),
            f"{prefix}_per": [float(lim.per) for lim in in_force],
            f"{prefix}_max_attempts": int_array(self._max_attempts[k] for k in kinds),
            "owner": self._owner,
            "lease": self._lease.seconds,
        }

    @property
    def prompt_kinds(self) -> list[str]:
        """The kinds a prompt claim may take (`claim_prompt`): those without a limit."""
        return cast(list[str], self._params["kinds"])

    @property
    def limited_kinds(self) -> frozenset[str]:
        """The kinds claimed with a limit now: their jobs hold a slot or a rate's row."""
        return self._limited_set

    @property
    def rtt(self) -> float:
        """The typical claim round trip lately, seconds (0 before the first claim): the
        median of the last `RECENT_RTTS`, so a slow first claim (which also prepares the
        statement) or a stray hiccup does not skew the batch sized from it."""
        recent = sorted(itertools.islice(reversed(self.rtts), RECENT_RTTS))
        return recent[len(recent) // 2] if recent else 0.0

    def pause(self, paused: frozenset[str]) -> None:
        """Claim from none of the ``paused`` queues (`pgpool.host.parts.control`), until the next
        call."""
        self._serving = [q for q in self._queues if q not in paused]
        self._params["queues"] = self._serving

    def p99_ms(self, last: int = P99_SAMPLES) -> float | None:
        """The 99th percentile of the last ``last`` claim round trips, in ms (None before
        the first claim): what `pgpool status` shows per queue."""
        recent = sorted(itertools.islice(reversed(self.rtts), last))
        if not recent:
            return None
        return 1000 * recent[max(0, math.ceil(0.99 * len(recent)) - 1)]

    def sweep_next(self) -> None:
        """Make the next plain and limited claims sweeps, from the start, whatever sweeps
        cost: a job is ready behind a cursor (handed back unstarted, or returned by the
        reaper), and a burst host must not decide it is drained without looking there."""
        self._plain_cursors.owe_sweep()
        self._limited_cursors.owe_sweep()
        self._fair_cursors.owe_sweep()

    @property
    def sweeps(self) -> int:
        """The plain claims that were sweeps."""
        return self._plain_cursors.sweeps

    async def running(self) -> tuple[int, float]:
        """(jobs of this host's queues and kinds running anywhere, ready in the queues it
        serves, or ready but held back by their kind's limit; seconds until the last lease
        of those running ends, 0 if none)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql.RUNNING, {**self._params, "queues": self._queues,
                                                   "serving": self._serving,
                                                   "kinds": self._all_kinds})
            count, left = await cur.fetchone()
            if self._limited_kinds:  # a burst host is not drained while they wait their turn
                cur = await conn.execute(sql.LIMITED_WAITING, {
                    "limited_kinds": self._limited_kinds, "queues": self._queues})
                count += (await cur.fetchone())[0]
        return count, left.total_seconds() if left is not None else 0.0

    async def claim(self, limit: int) -> list[Job]:
        """Claim up to ``limit`` ready jobs: one statement and transaction, two when a
        plain claim takes nothing and the fair claim follows it.

        Each job's deadline counts from the moment the claim was started (waiting for a
        connection included), not from its answer: a slow claim hands out the lease that is
        left, and the pool hands back jobs with too little of it to start. With limited
        kinds, their claim goes first (bounded by their limits, it cannot crowd the others
        out), and the plain or fair claim asks for the rest.
        """
        queues = self._serving
        if not queues:
            return []  # every queue it serves is paused
        started = time.monotonic()
        # No longer than claiming goes on without a heartbeat: with the database gone, a
        # claim would otherwise wait out the pool's 30 s for a connection, and a stop waits
        # for the claim in flight. Its jobs would be handed back by then anyway.
        leased = started
        async with self._pool.connection(timeout=self._lease.at_risk_after) as conn:
            rows: list[tuple] = []
            self.found_none = False
            if self._limited_kinds:
                rows = await self._claim_limited(conn, queues, limit)
            # A dict per claim: a claim waiting for a connection must not send another's
            # limit.
            rest = limit - len(rows)
            if rest > 0 and self._params["kinds"]:
                more, more_leased = await self._claim_unlimited(
                    conn, {**self._params, "limit": rest}, queues, rest, started)
                if not rows:  # its jobs are leased from its own start: the first took none
                    leased = more_leased
                rows += more
        rtt = time.monotonic() - started
        self.rtts.append(rtt)
        return self._jobs(rows, rtt, leased)

    async def claim_prompt(self, kinds: Collection[str]) -> list[Job]:
        """A prompt claim (`pgpool.host.scheduler`): the first ready job of each (queue,
        kind) pair the host serves of ``kinds`` (of `prompt_kinds`), by the plain claim,
        from the cursors. Small and out of turn: it is left out of `rtt`, which sizes the
        batches, and of the sweeps' timing, and moves only its pairs' cursors. It takes
        nothing where a job waiting needs the fair claim (a tenant, a concurrency key):
        the full claims take those."""
        queues = self._serving
        chosen = [kind for kind in self.prompt_kinds if kind in kinds]
        if not queues or not chosen:
            return []
        started = time.monotonic()
        params = {**self._params, "kinds": chosen, "limit": len(queues) * len(chosen),
                  "kind_max_attempts": int_array(self._max_attempts[k] for k in chosen),
                  **self._plain_cursors.params(queues, chosen, False)}
        async with self._pool.connection(timeout=self._lease.at_risk_after) as conn:
            rows = await (await conn.execute(sql.CLAIM_PROMPT, params)).fetchall()
        rows.sort(key=_claim_order)
        self._plain_cursors.advance(rows)
        return self._jobs(rows, time.monotonic() - started, started)

    def _jobs(self, rows: list[tuple], rtt: float, leased: float) -> list[Job]:
        """The claimed ``rows`` as jobs, leased from ``leased`` (monotonic seconds), and the
        claim counted and told (``on_claimed``)."""
        self.claims += 1
        self.claimed += len(rows)
        timeouts = self._timeouts
        deadline = self._lease.deadline(leased)
        # Positional, every field in `Job`'s order: keywords cost more, once per job.
        jobs = [
            Job(id_, kind, queue, attempt, interruptions, max_attempts, payload,
                timeouts[kind], False, deadline, False, waited, snoozes, meta, group_id, tenant,
                priority)
            for (id_, kind, queue, attempt, interruptions, max_attempts, payload, waited,
                 tenant, priority, snoozes, meta, group_id, _) in rows
        ]
        if self._on_claimed is not None:
            self._on_claimed(rtt, jobs)
        return jobs

    async def _claim_unlimited(self, conn: psycopg.AsyncConnection, params: dict[str, object],
                               queues: list[str], limit: int, started: float
                               ) -> tuple[list[tuple], float]:
        """The plain claim, or the fair one (see the module's docstring), of the kinds
        without a limit: their rows, and when the statement that took them started."""
        rows: list[tuple] = []
        leased = started
        if self.plain:
            rows, leased = await self._claim_plain(conn, params, queues, limit, started)
        if not rows and (not self.plain or await self._needs_fair(conn, params)):
            # The fair claim's jobs are leased from its own start: the plain claim before
            # it took none, however long it waited (for a lock, say).
            leased = time.monotonic()
            rows = await self._claim_fair(conn, params, queues, limit)
        elif not rows and not self._limited_kinds:
            # A sweep took nothing and nothing waits for the fair claim: no job this host
            # could run is ready at all. (A host with limited kinds never says so: a job a
            # rate holds back is ready again in a second, not at the idle poll.)
            self.found_none = self._plain_cursors.swept
        return rows, leased

    async def _claim_limited(self, conn: psycopg.AsyncConnection, queues: list[str],
                             limit: int) -> list[tuple]:
        """Run the limited claims (`sql.CLAIM_LIMITED` for the kind-wide limits, then
        `sql.CLAIM_SCOPED` for the rest of the batch) on ``conn``: their rows in claim
        order."""
        rows: list[tuple] = []
        if self._limited:
            rows = await self._claim_whole(conn, queues, limit)  # in claim order
        if self._scoped and len(rows) < limit:
            rows += await self._claim_scoped(conn, queues, limit - len(rows))
            rows.sort(key=_claim_order)
        self.limited_short = len(rows) < limit
        return rows

    async def _claim_scoped(self, conn: psycopg.AsyncConnection, queues: list[str],
                            limit: int) -> list[tuple]:
        """Run the scoped claim (`sql.CLAIM_SCOPED`) on ``conn``, and move its cursor on:
        its jobs' rows. A claim that made rings for scopes waiting without one, and came
        back short, is run again once: those scopes have their rows now."""
        rows: list[tuple] = []
        for _ in range(2):
            got = await self._run_limited(conn, sql.CLAIM_SCOPED, {
                **self._scoped, "queues": queues, "limit": limit - len(rows),
                "after": self._scope_after})
            self._scope_after = got[0][14] or ""  # none walked (each kind waits): from ''
            rows += [row[:14] for row in got if row[0] is not None]
            if not got[0][15] or len(rows) >= limit:
                break
        return rows

    async def _run_limited(self, conn: psycopg.AsyncConnection, statement: str,
                           params: dict[str, object]) -> list[tuple]:
        """Run a limited claim on ``conn``, prepared (the pool's generic plan): its rows.
        Lost races for a slot (or a concurrency key) are tried again, as in
        `_claim_fair`."""
        tries = 1
        while True:
            try:
                # Planned for its values at each claim, planning was most of a limited
                # claim's cost: side by side, a claim of 50 took 8.3 ms against 5.4 generic
                # with a concurrency limit, 7.9 against 4.9 with a rate, 12.9 against 7.4
                # with a concurrency limit per tenant (50 tenants), 14.5 against 8.4 with a
                # rate per tenant; still so with the plan made on an empty ring table and
                # 500,000 rows of rings added since, unanalyzed.
                cur = await statements.execute(conn, statement, params, prepare=True)
                return await cur.fetchall()
            except KEY_RACE_LOST:
                # Another claim took one of these slots first; the whole statement rolled
                # back, so every job it had picked is still ready.
                if tries == KEY_RACE_TRIES:
                    raise
                tries += 1

    async def _claim_whole(self, conn: psycopg.AsyncConnection, queues: list[str],
                           limit: int) -> list[tuple]:
        """Run the kind-wide limited claim (`sql.CLAIM_LIMITED`, or `sql.CLAIM_SLOTS` with
        no rate) on ``conn``, its rings made first: its rows. As for the kinds without a
        limit, its plain twin (`sql.CLAIM_LIMITED_PLAIN`, `sql.CLAIM_SLOTS_PLAIN`) goes
        while no job waiting in its kinds has a tenant or a concurrency key: one that takes
        nothing is followed by a look (`sql.NEEDS_FAIR`), and by the whole claim if one
        has, whose rows say whether the next claim can be plain again. A grant of a rate's
        tokens (`pgpool.host.grant`) is spent first, by `sql.CLAIM_GRANTED`; the ring is
        read for what it does not cover."""
        if self._ticks is not None:
            added = await conn.execute(sql.ENSURE_TICKS, self._ticks)
            if added.rowcount:
                # Planned without statistics, a ring read as a handful of rows: sorted
                # whole (a sort of R rows per claim) instead of read in order as far as
                # it takes. Autovacuum would analyze it within a minute; a role that does
                # not own the table is told no, with a warning, and waits for that.
                await conn.execute(sql.ANALYZE_TICKS)
            self._ticks = None
        params = {**self._limited, "queues": queues, "limit": limit}
        plain = self._limited_plain
        rows, asked = await self._granted_rows(conn, params) if plain else ([], 0)
        # A grant's claim that took some but not all it asked for found nothing more
        # ready; one that took all may have had too few tokens left for the batch, and one
        # that took none may have been past its time, or a job waiting needs the whole
        # claim: the ring claims the rest.
        rest = limit - len(rows) if len(rows) in (0, asked) else 0
        if rest > 0:
            rows += await self._ring_rows(conn, {**params, "limit": rest}, plain)
        rows.sort(key=_claim_order)
        # Jobs with a tenant came from the start, in tenant order: no cursor's business.
        self._limited_cursors.move([row for row in rows if not row[8]], limit)
        return rows

    async def _granted_rows(self, conn: psycopg.AsyncConnection, params: dict[str, object]
                            ) -> tuple[list[tuple], int]:
        """The rows of a claim from this host's grant (`sql.CLAIM_GRANTED`), up to the
        tokens left of ``params``' limit, and how many it asked for; none without a grant.
        The grant ends when the claim comes back with fewer than it asked for (past its
        time, nothing more ready, or a job waiting needs the whole claim), or spends its
        last token."""
        grant = self._grants.current
        if grant is None:
            return [], 0
        now = time.monotonic()
        asked = grant.take(cast(int, params["limit"]), now)
        rows: list[tuple] = []
        if asked:
            self._grants.claimed(now)
            try:
                rows = await self._whole_rows(
                    conn, {**params, "limit": asked, "until": grant.until}, sql.CLAIM_GRANTED)
            finally:  # the tokens not spent are still the host's, until they expire
                grant.give_back(asked - len(rows))
        if (not asked or len(rows) < asked or not grant.tokens) and self._grants.current is grant:
            self._grants.current = None
        return rows, asked

    async def _ring_rows(self, conn: psycopg.AsyncConnection, params: dict[str, object],
                         plain: bool) -> list[tuple]:
        """The rows of a kind-wide limited claim of ``params`` from its ring (and slots):
        the plain twin while ``plain``, and the whole claim if that takes nothing and a
        job waiting needs it. A plain claim may grant this host tokens for its next
        claims (`pgpool.host.grant`)."""
        if self._slots_only:
            statement = sql.CLAIM_SLOTS_PLAIN if plain else sql.CLAIM_SLOTS
        else:
            statement = sql.CLAIM_LIMITED_PLAIN if plain else sql.CLAIM_LIMITED
        started = time.monotonic()
        asked = self._grants.ask(cast(int, params["limit"]), started)
        granted, until = 0, None
        try:
            rows = await self._whole_rows(conn, {**params, "grant": asked,
                                                 "hold": self._grants.hold}, statement)
            if plain and not self._slots_only and rows:  # each row: the grant, and its end
                granted, until = rows[0][14], rows[0][15]
                rows = [row[:14] for row in rows]
        finally:
            self._grants.answered(asked, granted, until, started)
        if plain and not rows and await self._needs_fair(conn, {
                "queues": params["queues"], "kinds": params["limited_kinds"]}):
            plain = False  # its jobs are leased from the claim's start, before this
            statement = sql.CLAIM_SLOTS if self._slots_only else sql.CLAIM_LIMITED
            rows = await self._whole_rows(conn, params, statement)
        if not plain:
            if rows:  # each row says whether the next claim may be plain again
                self._limited_plain = bool(rows[0][14])
                rows = [row[:14] for row in rows]
            else:  # no row to say so: whole again next time
                self._limited_plain = False
        return rows

    async def _whole_rows(self, conn: psycopg.AsyncConnection, params: dict[str, object],
                          statement: str) -> list[tuple]:
        """The rows of one kind-wide limited ``statement`` of ``params``, from the
        cursors, then as a sweep if that took nothing and sweeps are cheap."""
        # The kinds this claim sends (`set_limits` may change the claimer's meanwhile).
        kinds = cast(list[str], params["limited_kinds"])
        queues = cast(list[str], params["queues"])
        cursors = self._limited_cursors
        now = time.monotonic()
        sweep = cursors.sweep_due(now)
        rows = await self._run_limited(conn, statement,
                                       {**params, **cursors.params(queues, kinds, sweep)})
        cursors.ran(sweep, now)
        if not rows and not sweep and cursors.sweep_is_cheap():
            # Its jobs are leased from the claim's start, before this: on the safe side.
            now = time.monotonic()
            rows = await self._run_limited(conn, statement,
                                           {**params, **cursors.params(queues, kinds, True)})
            cursors.ran(True, now)
        return rows

    async def _claim_plain(self, conn: psycopg.AsyncConnection, params: dict[str, object],
                           queues: list[str], limit: int, now: float
                           ) -> tuple[list[tuple], float]:
        """Run the plain claim (`sql.CLAIM_PLAIN`) on ``conn``, from the cursors or as a
        sweep (see the module's docstring), and move the cursors on: its rows in claim
        order (priority, then due time, then id: the pool's backlog hands them out in turns
        across pairs), and when the statement that took them started (their lease counts
        from it). No rows
        when nothing waits, or when a job with a tenant or a concurrency key does: the fair
        claim, run next, tells which."""
        cursors = self._plain_cursors
        sweep = cursors.sweep_due(now)
        rows = await self._plain_rows(conn, params, queues, sweep, now)
        if not rows and not sweep and cursors.sweep_is_cheap():
            # Its jobs' lease counts from its own start, not the cursor claim's: that one
            # may have waited most of a lease for a lock (and another claim took its job).
            now = time.monotonic()
            rows = await self._plain_rows(conn, params, queues, True, now)
        rows.sort(key=_claim_order)
        cursors.move(rows, limit)
        return rows, now

    async def _plain_rows(self, conn: psycopg.AsyncConnection, params: dict[str, object],
                          queues: list[str], sweep: bool, now: float) -> list[tuple]:
        """The rows of one plain claim started at ``now``, a sweep or from the cursors."""
        # The kinds this claim sends (`set_limits` may change the claimer's meanwhile).
        kinds = cast(list[str], params["kinds"])
        cursors = self._plain_cursors
        rows = await (await conn.execute(
            sql.CLAIM_PLAIN if len(queues) * len(kinds) > 1 else sql.CLAIM_PLAIN_ONE,
            {**params, **cursors.params(queues, kinds, sweep)})).fetchall()
        cursors.ran(sweep, now)
        return rows

    async def _needs_fair(self, conn: psycopg.AsyncConnection, params: dict[str, object]
                          ) -> bool:
        """Whether a job waiting in the queues and kinds served needs the fair claim."""
        row = await (await conn.execute(sql.NEEDS_FAIR, params)).fetchone()
        return bool(row and row[0])

    async def _claim_fair(self, conn: psycopg.AsyncConnection, params: dict[str, object],
                          queues: list[str], limit: int) -> list[tuple]:
        """Run the fair claim (`sql.CLAIM`, or `sql.CLAIM_CPU`) on ``conn``, from the
        tenants' cursors or as a sweep, as the plain claim does, and move the cursors on:
        its rows, in fair order. After it, the next claim is the plain one if nothing
        waiting needs the fair one any more (its rows say)."""
        cursors = self._fair_cursors
        now = time.monotonic()
        sweep = cursors.sweep_due(now)
        rows = await self._fair_rows(conn, params, queues, limit, sweep, now)
        if not sweep and not any(row[0] is not None for row in rows) and cursors.sweep_is_cheap():
            # Its jobs are leased from the first claim's start, before this: on the safe side.
            rows = await self._fair_rows(conn, params, queues, limit, True, time.monotonic())
        if rows:
            self.plain = rows[0][14]
        rows = self._fair_order([row[:14] for row in rows])
        cursors.move(rows, limit)
        return rows

    async def _fair_rows(self, conn: psycopg.AsyncConnection, params: dict[str, object],
                         queues: list[str], limit: int, sweep: bool, now: float
                         ) -> list[tuple]:
        """The rows of one fair claim started at ``now``, a sweep or from the cursors."""
        kinds = cast(list[str], params["kinds"])
        cursors = self._fair_cursors
        statement = self._fair_claim[sweep]
        params = {**params, "after": self._after,
                  **cursors.tenant_params(queues, kinds, self._after, limit, sweep)}
        for tries in range(1, KEY_RACE_TRIES + 1):
            try:
                rows = await (await statements.execute(conn, statement, params)).fetchall()
                break
            except KEY_RACE_LOST:
                # Another claim took one of these concurrency keys first; the whole
                # statement rolled back, so every job it had picked is still ready.
                if tries == KEY_RACE_TRIES:
                    raise
        cursors.ran(sweep, now)
        return rows

    def _fair_order(self, rows: list[tuple]) -> list[tuple]:
        """The fair claim's jobs in the order the workers take them, and its cursor moved on.

        Round-robin over the batch's tenants (RETURNING keeps no order), so another tenant's
        job does not wait behind the flood's. Then the cursor: the last tenant served in
        its round order, where the next walk starts.
        """
        if rows and rows[0][0] is None:
            # Nothing claimed. If a walk went past `sql.TENANT_SKIPS` tenants that gave
            # nothing, the one row, with no job, says where it stopped: the next claim goes
            # on from there instead of visiting those tenants again.
            if rows[0][8] is not None:
                self._after = rows[0][8]
            return []
        if not rows:
            return rows
        seen: Counter[str] = Counter()
        rounds = []
        for row in rows:
            rounds.append(seen[row[8]])
            seen[row[8]] += 1
        after = self._after
        self._after = max((row[8] for row in rows), key=lambda t: (t <= after, t))
        return [row for _, row in sorted(zip(rounds, rows, strict=True),
                                         key=lambda pair: pair[0])]
