"""Fleet-wide limits of a kind: at most N of its jobs running at once, at most R of them
started in any window of ``per`` seconds, for the whole kind or per tenant or per
concurrency key (``by=``), whatever the number of hosts (docs/guides/limits.md).

Where a limit goes::

    @pgpool.handler(kind, limit=Limit(concurrency=3))      the code's limit (`Limit`)
    pgpool limits set KIND ... (pgpool.ops.set_limit)      an operator's `Override`, a row
        -> pgpool_limits -> every host's control poll         of pgpool_limits, wins over it
           (pgpool.host.parts.control, logged: the audit)     until `pgpool limits reset`
        -> Claimer.set_limits(the limits in force)
        -> pgpool.host.claimer: the kind leaves the plain and fair claims (which stay as
           they are, for the kinds without a limit) for sql.jobs.CLAIM_LIMITED
        -> the claim takes a job only with a slot for it (sql.jobs.CLAIM_LIMITED):
             concurrency: a slot number 1..N written on the running row, which the unique
               index pgpool_jobs_limit_running makes the database's to hold: two claims
               racing for one slot cannot both commit (the loser retries, as for a
               concurrency key); the slot is free again when the row stops running
               (acked, retried, handed back, reaped), so a dead or frozen host holds its
               slots until the reaper returns its expired jobs, and the worker fence
               (pgpool.worker.fence) ends its workers before that lease can expire: never
               N+1 running, also while hosts crash, freeze or are fenced;
             rate: a ring of min(R, 64) rows per kind (pgpool_limit_ticks), each letting
               its share of R start in an episode (one job a row up to R = 64): a claim
               takes a job only with a row whose episode is over (last used ``per``
               seconds ago or more) or not yet full, and sets its use to now() and its
               count to the jobs of the episode. A row's episode holds its share at most
               and the next begins ``per`` seconds after the last of them, so any window
               of ``per`` seconds holds one episode of each row at most: at most R jobs
               claimed in one, an exact sliding window, not a token bucket (whose burst
               lets 2R through in a window that straddles a refill), and no counter every
               claim must wait on: claims take rows FOR UPDATE SKIP LOCKED, racing claims
               take different ones, and a claim of 50 under a high rate writes one row.
               Judged at the claim, on the server's clock (``now()``); a job starts a
               moment later in its worker, so start times can bunch by that moment.

Per tenant or per key (``by="tenant"``, ``by="concurrency_key"``): the same, for each scope
value on its own (a job's tenant, or its key; the jobs without one share a scope)::

    sql.jobs.CLAIM_SCOPED, instead of CLAIM_LIMITED:
      walk: the tenants with ready jobs, from the claimer's cursor on (a loose index scan,
            `SCOPE_WALK` at most), each one's room guessed without locking, until the
            batch is full
      -> the jobs of the tenants with room, as many as the batch has left
      -> per scope: its free slots (pgpool_jobs.limit_scope, limit_slot: the unique index
         pgpool_jobs_limit_scoped_running holds one running job per (kind, scope, slot))
         and its ring's free rows (pgpool_limit_ticks, scope), locked as for a kind
      -> a scope without a ring gets one (min(R, 64) rows), which the claimer's next
         claim (at once) uses;
         the maintenance leader deletes the rings unused for a day (`MAX_PER`)

A limit never touches a kind without one: its jobs are claimed by the same statements as
before, which read nothing of limits.

This module is imported by workers (through `pgpool.registry`): no psycopg, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Final, Literal

from .errors import HandlerError

#: What a limit may be counted per (`Limit.by`): a job's tenant, or its concurrency key.
By = Literal["tenant", "concurrency_key"]
BY: Final[tuple[By, ...]] = ("tenant", "concurrency_key")
#: What an operator's override may set it to (`Override.by`), and the `Limit.by` each
#: makes: those, or the kind as a whole.
_OVERRIDDEN_BY: Final[dict[str, By | None]] = {"kind": None, "tenant": "tenant",
                                                "concurrency_key": "concurrency_key"}
OVERRIDE_BY: Final = tuple(_OVERRIDDEN_BY)

#: The largest concurrency limit: a slot number is a PostgreSQL integer.
MAX_CONCURRENCY: Final = 2**31 - 1
#: The largest rate: a PostgreSQL integer (its ring is 64 rows however high the rate).
MAX_RATE: Final = 2**31 - 1
#: The shortest and longest window of a rate, seconds: shorter than a claim's round trips
#: means nothing, and a day is the longest quota a partner's API sets.
MIN_PER: Final = 0.01
MAX_PER: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``concurrency`` jobs of the kind running at once in the whole fleet, and at
    most ``rate`` of them started (claimed) in any window of ``per`` seconds (a number, or
    a timedelta; kept in seconds). Give either or both. With ``by`` ("tenant" or
    "concurrency_key"), each holds for every tenant (or key) on its own; the jobs without
    one share theirs.

    Every field is checked when it is built: a bad value raises `HandlerError`.
    """

    concurrency: int | None = None
    rate: int | None = None
    per: float | timedelta = 1.0
    by: By | None = None

    def __post_init__(self) -> None:
        concurrency, rate, per = self.concurrency, self.rate, self.per
        if self.by is not None and self.by not in BY:
            raise HandlerError(f"pgpool.Limit: by must be \"tenant\" or \"concurrency_key\" "
                               f"(or None, for the kind as a whole), got {self.by!r}")
        if concurrency is None and rate is None:
            raise HandlerError("pgpool.Limit: give concurrency=N (the most jobs of the kind "
                               "running at once), rate=R (the most started in per seconds), "
                               "or both")
        for name, value, most in (("concurrency", concurrency, MAX_CONCURRENCY),
                                  ("rate", rate, MAX_RATE)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 < value <= most):
                raise HandlerError(f"pgpool.Limit: {name} must be a positive integer (at "
                                   f"most {most:,}), got {value!r}")
        if isinstance(per, timedelta):
            per = per.total_seconds()
        if (not isinstance(per, int | float) or isinstance(per, bool)
                or not MIN_PER <= per <= MAX_PER):
            raise HandlerError(f"pgpool.Limit: per must be a number of seconds (or a "
                               f"timedelta) from {MIN_PER} to {MAX_PER:,}, got {self.per!r}")
        object.__setattr__(self, "per", float(per))


@dataclass(frozen=True, slots=True)
class Override:
    """An operator's override of a kind's limit (``pgpool limits set``, a row of
    ``pgpool_limits``): each field not None replaces the code's; ``set_by``, the database
    role that set it. ``by``: one of `OVERRIDE_BY` ("kind": the kind as a whole)."""

    concurrency: int | None
    rate: int | None
    per: float | None
    set_by: str
    by: str | None = None

    def describe(self) -> str:
        """How `pgpool limits` and the hosts' logs say it: ``concurrency 3, rate 20/1s``,
        ``rate 100/60s per tenant``."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate {self.rate}/{self.per or 1:g}s")
        elif self.per is not None:
            parts.append(f"per {self.per:g}s")
        said = ", ".join(parts)
        if self.by is None:
            return said
        scope = "for the kind as a whole" if self.by == "kind" else f"per {self.by}"
        return f"{said} {scope}" if said else scope

    def over(self, limit: Limit | None) -> Limit | None:
        """The limit in force: ``limit`` (the code's, or None) with this override's fields;
        None for an override of ``by`` alone on a kind without a limit (nothing to count)."""
        if limit is None and self.concurrency is None and self.rate is None:
            return None
        base = limit or Limit(concurrency=self.concurrency, rate=self.rate)
        by = base.by if self.by is None else _OVERRIDDEN_BY[self.by]
        return replace(base,
                       concurrency=self.concurrency or base.concurrency,
                       rate=self.rate or base.rate,
                       per=self.per or base.per,
                       by=by)
