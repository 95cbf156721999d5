"""What a handler (and a hook) sees of the job it runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The job the current worker is running, for handlers that want it."""

    id: int
    kind: str
    queue: str
    #: This attempt's number as counted against ``max_attempts`` (1 on the first run). An
    #: attempt cut off by a shutdown, or whose host died before it started, is not counted
    #: (at most three per job), so two attempts may share a number; ``claim`` tells them apart.
    attempt: int
    max_attempts: int
    #: How many times the job has been claimed, this attempt included: unique per attempt.
    claim: int
