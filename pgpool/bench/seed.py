"""Seeding: `pgpool.enqueue_many` against a raw COPY of the same rows, side by side."""

from __future__ import annotations

import math
import time
from typing import Any, Final

import psycopg

from ..enqueue import copy_rows, enqueue_many
from ..sql import jobs as sql
from . import queries
from .jobs import KIND

#: Alternating rounds of the comparison: a single 0.1 s load is at the mercy of noise.
SEED_ROUNDS: Final = 3


def compare_loads(conn: psycopg.Connection, payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """enqueue_many against a raw COPY of pre-built rows into the same, emptied table,
    alternating, `SEED_ROUNDS` times each; the fastest of each side counts (the round least
    disturbed by the machine). Leaves the table empty."""
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
            conn.execute(queries.EMPTY)
    n = len(payloads)
    return {"rounds": SEED_ROUNDS, "enqueue_many_rows_per_s": n / best["pgpool"],
            "raw_copy_rows_per_s": n / best["raw"], "ratio": best["raw"] / best["pgpool"]}
