"""The database's ceilings: hand-written claim + delete loops, no framework, on two
connections. They never send pgpool's claim (`pgpool.sql.jobs.CLAIM`, with its fairness,
tenants and concurrency keys), only the simplest statements a loop of one's own would.

"One transaction": `queries.PICK` (SELECT ... FOR NO KEY UPDATE SKIP LOCKED) and the DELETE
of those ids commit together. "Lease cycle": `queries.LEASE_CLAIM` (an UPDATE to running,
with a lease) commits, then the DELETE commits, the two commits per batch that any
lease-based queue needs (a claim must be durable before its work starts). A run drains
freshly seeded jobs; the caller runs this twice and reports the mean (`combine_ceilings`),
as half-second runs vary by about 20%.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from typing import Any, Final

import psycopg

from ..db import dsn as dsnlib
from ..enqueue import enqueue_many
from . import queries
from .jobs import KIND
from .progress import Progress
from .scratch import expect_empty, vacuum

#: Connections (one thread each) the ceiling loops run on.
CEILING_THREADS: Final = 2
CYCLES: Final = ("one_transaction", "lease_cycle")


def measure_ceilings(conn: psycopg.Connection, dsn: str, payloads: list[dict[str, Any]], *,
                     batch: int, backlog: int, when: str,
                     progress: Progress) -> dict[str, dict[str, Any]]:
    """One run of each ceiling loop at ``batch``, each on ``payloads`` freshly seeded into a
    vacuumed table; ``when`` labels the runs ("before the drive")."""
    progress.step(f"database ceilings ({when}): hand-written claim + delete loops on "
                  f"{CEILING_THREADS} connections, batch {batch}")
    out = {}
    for cycle in CYCLES:
        vacuum(conn)
        enqueue_many(conn, KIND, payloads)
        out[cycle] = {"when": when, **_drain(dsn, batch, lease_cycle=cycle == "lease_cycle")}
        expect_empty(conn, f"the {cycle.replace('_', ' ')} ceiling loop", backlog)
    return out


def combine_ceilings(runs: list[dict[str, dict[str, Any]]], batch: int) -> dict[str, Any]:
    """The reported ceilings: per cycle, the mean jobs/s of ``runs`` next to the runs."""
    ceiling: dict[str, Any] = {"batch": batch, "connections": CEILING_THREADS}
    for cycle in CYCLES:
        ceiling[cycle] = {"jobs_per_s": statistics.fmean(r[cycle]["jobs_per_s"] for r in runs),
                          "runs": [r[cycle] for r in runs]}
    return ceiling


def bare_claim(owner: str, limit: int) -> dict[str, Any]:
    """Parameters for `queries.PICK` and `queries.LEASE_CLAIM`: up to ``limit`` bench jobs,
    leased to ``owner`` (`PICK` takes no owner)."""
    return {"kind": KIND, "limit": limit, "owner": owner}


def _drain(dsn: str, batch: int, *, lease_cycle: bool) -> dict[str, Any]:
    """Drain the due jobs with hand-written claim + delete statements on `CEILING_THREADS`
    threads: `queries.PICK` and the delete in one transaction per batch, or
    (``lease_cycle``) `queries.LEASE_CLAIM` and the delete, each committed on its own."""
    done = [0] * CEILING_THREADS
    errors: list[BaseException] = []
    stop = threading.Event()
    claim = queries.LEASE_CLAIM if lease_cycle else queries.PICK

    def loop(index: int) -> None:
        params = bare_claim(f"bench-ceiling-{index}", batch)
        try:
            with dsnlib.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    with contextlib.nullcontext() if lease_cycle else conn.transaction():
                        ids = [r[0] for r in conn.execute(claim, params).fetchall()]
                        if not ids:
                            return
                        conn.execute(queries.DELETE, {"ids": ids})
                    done[index] += len(ids)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True)
               for i in range(CEILING_THREADS)]
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
