"""Handlers of the test kit's tests (tests/api/test_testing_kit.py): run in the test's own
process by `pgpool.testing.drain`, and by real workers (``--handlers kitjobs``) where a
test compares the rows drain leaves with those ``pgpool run --burst`` leaves.

``kit.spawn`` enqueues its children on ``PGPOOL_DSN``: the test sets it for drain, and
``pgpool run`` gets it from the suite."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime

import pgpool

#: `pgpool.current_job()` as each ``kit.note`` attempt saw it, in this process.
seen_by_note: list[pgpool.JobInfo] = []
#: When ``kit.fanout`` schedules one of its follow-ups.
RUN_AT = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pgpool.handler("kit.ok")
def ok(payload: dict) -> None:
    pass


@pgpool.handler("kit.note")
def note(payload: dict) -> None:
    seen_by_note.append(pgpool.current_job())


# Retried a minute later, fixed: no host that runs it stays up until its retry is due (the ack
# wakes the stager), so a host leaves it 'scheduled' as drain does, however slow the machine.
@pgpool.handler("kit.fail", max_attempts=3, retry=pgpool.Retry(base=60, jitter=False))
def fail(payload: dict) -> None:
    raise ValueError("kit.fail always fails")


@pgpool.handler("kit.spawn")
def spawn(payload: dict) -> None:
    import psycopg  # here, not on import: real workers start without it

    parent = pgpool.current_job().id
    with psycopg.connect(os.environ["PGPOOL_DSN"]) as conn:
        for n in range(payload["children"]):
            pgpool.enqueue(conn, "kit.ok", {"parent": parent, "n": n})


@pgpool.handler("kit.answer")
def answer(payload: dict) -> int:
    return payload["x"] * 2


@pgpool.handler("kit.async")
async def async_answer(payload: dict) -> dict:
    job = pgpool.current_job()
    return {"id": job.id, "attempt": job.attempt, "payload": payload}


@pgpool.handler("kit.interrupt", max_attempts=1)
def interrupt(payload: dict) -> None:
    raise KeyboardInterrupt


@pgpool.handler("kit.asks")
def asks(payload: dict) -> None:
    """Raises what ``payload["ask"]`` names: a snooze of an hour, a discard or a cancel."""
    match payload["ask"]:
        case "snooze":
            raise pgpool.Snooze(3600)
        case "discard":
            raise pgpool.Discard("not ours to handle")
        case "cancel":
            raise pgpool.Cancel("the order was withdrawn")


@pgpool.handler("kit.picky", retry=pgpool.Retry(never=(KeyError,)))
def picky(payload: dict) -> None:
    """Raises a KeyError, which its Retry never retries."""
    raise KeyError(payload["missing"])


@dataclass
class Point:
    x: int
    y: int = 0


@pgpool.handler("kit.point", queue="points", priority=2, unique_key=lambda p: f"point-{p.x}")
def point(payload: Point) -> None:
    """A typed handler with enqueue defaults, for ``kit.fanout`` to name as a kind."""


@pgpool.handler("kit.fanout")
def fanout(payload: dict) -> str:
    """Enqueues follow-ups of every sort through its job, and returns "spread"."""
    job = pgpool.current_job()
    job.enqueue("kit.ok", {"n": 1, "pair": (1, 2)}, priority=5, delay=30, tenant="acme")
    job.enqueue(point, Point(3))  # a Handler as the kind: its defaults, its payload type
    job.enqueue(point, {"x": 4}, queue="other", unique_key=None, run_at=RUN_AT)
    job.enqueue_many("kit.ok", [{"n": 2}, {"n": 3}], queue="bulk", max_attempts=2)
    job.group("kit.ok", [{"n": 4}, {"n": 5}], then=("kit.note", {"done": True}),
              then_options={"priority": 7}, tenant="t", concurrency_key="c")
    return "spread"


@pgpool.handler("kit.combine")
def combine(payload: dict) -> dict:
    """A group's callback: what its members were, as it read them."""
    members = pgpool.current_job().group_members()
    return {"ids": [m.id for m in members], "results": [m.result for m in members],
            "errors": [m.error for m in members]}
