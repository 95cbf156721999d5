"""Handlers of the test kit's tests (tests/api/test_testing_kit.py): run in the test's own
process by `pgpool.testing.drain`, and by real workers (``--handlers kitjobs``) where a
test compares the rows drain leaves with those ``pgpool run --burst`` leaves.

``kit.spawn`` enqueues its children on ``PGPOOL_DSN``: the test sets it for drain, and
``pgpool run`` gets it from the suite."""

from __future__ import annotations

import os

import pgpool

#: `pgpool.current_job()` as each ``kit.note`` attempt saw it, in this process.
seen_by_note: list[pgpool.JobInfo] = []


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
