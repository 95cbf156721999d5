"""What a bench run is asked to do (`BenchOptions`), and how it fails (`BenchError`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import PgpoolError


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
    #: Serve /metrics during the drive (`pgpool.host.metrics`), to measure what it costs.
    metrics: bool = False
