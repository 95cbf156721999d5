"""The database's ceilings: bare claim + delete loops with no framework, on two connections.

"One transaction": claim and delete commit together. "Lease cycle": the claim commits, then
the delete commits, the two commits per batch that any lease-based queue needs (a claim must
be durable before its work starts). A run drains freshly seeded jobs; the caller runs this
twice and reports the mean (`combine_ceilings`), as half-second runs vary by about 20%.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from typing import Any, Final

import psycopg

from .. import dsn as dsnlib
from .. import sql
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
    progress.step(f"database ceilings ({when}): bare claim + delete loops on "
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
    """Parameters for `sql.CLAIM` as a no-framework loop uses it: the bench kind, one
    attempt, a long lease."""
    return {"queues": ["default"], "kinds": [KIND], "kind_max_attempts": [1],
            "owner": owner, "lease": 60.0, "limit": limit, "after": "", "tenant_cap": None}


def _drain(dsn: str, batch: int, *, lease_cycle: bool) -> dict[str, Any]:
    """Drain the due jobs with bare claim + delete statements on `CEILING_THREADS` threads:
    in one transaction per batch, or (``lease_cycle``) with a commit after each statement."""
    done = [0] * CEILING_THREADS
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop(index: int) -> None:
        params = bare_claim(f"bench-ceiling-{index}", batch)
        try:
            with dsnlib.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    with contextlib.nullcontext() if lease_cycle else conn.transaction():
                        ids = [r[0] for r in conn.execute(sql.CLAIM, params).fetchall()]
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
