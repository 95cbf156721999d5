"""Fleet-wide limits of a kind: at most N of its jobs running at once, at most R of them
started in any window of ``per`` seconds, for the whole kind or per tenant or per
concurrency key, whatever the number of hosts (docs/guides/limits.md).

Where a limit goes::

    @pgpool.handler(kind, limit=Limit(concurrency=3))      the code's limit (`Limit`)
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
               N+1 running, also while hosts crash, freeze or are fenced.

A limit never touches a kind without one: its jobs are claimed by the same statements as
before, which read nothing of limits.

This module is imported by workers (through `pgpool.registry`): no psycopg, no asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .errors import HandlerError

#: The largest concurrency limit: a slot number is a PostgreSQL integer.
MAX_CONCURRENCY: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``concurrency`` jobs of the kind running at once in the whole fleet.

    Every field is checked when it is built: a bad value raises `HandlerError`.
    """

    concurrency: int | None = None

    def __post_init__(self) -> None:
        concurrency = self.concurrency
        if concurrency is None:
            raise HandlerError("pgpool.Limit: give concurrency=N, the most jobs of the kind "
                               "running at once")
        if (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                or not 0 < concurrency <= MAX_CONCURRENCY):
            raise HandlerError(f"pgpool.Limit: concurrency must be a positive integer, got "
                               f"{concurrency!r}")
