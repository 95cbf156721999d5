"""Long jobs' handler API, without a host: what `current_job().checkpoint` refuses (one
line, nothing stored), and what `progress` refuses; a checkpoint stored under
`pgpool.testing.drain` is the job's, seen in `job_status` and read back by its next
attempt."""

from __future__ import annotations

import math

import pytest

import pgpool
from pgpool.testing import drain, run_handler

stored: list[object] = []
#: The states the handler is told to store, by name (a payload could not hold most).
STATES = {"set": {1, 2}, "nan": {"x": math.nan}, "nul": {"x": "a\x00b"},
          "too-large": {"x": "y" * (1 << 20)}, "next": {"next": 4}}


@pgpool.handler("long_api.checkpoint")
def checkpoint_then_record(payload: dict) -> None:
    job = pgpool.current_job()
    stored.append(job.checkpoint_state)
    job.checkpoint(STATES[payload["state"]])
    stored.append(job.checkpoint_state)


@pgpool.handler("long_api.progress")
def report(payload: dict) -> None:
    pgpool.current_job().progress(*payload["args"])


@pytest.mark.parametrize(("state", "says"), [
    ("set", "a set that is not JSON-serialisable"),
    ("nan", "NaN or Infinity, which JSON cannot represent"),
    ("nul", "a NUL character"),
    ("too-large", "over the 1,048,576-byte limit of a checkpoint"),
])
def test_a_state_that_cannot_be_stored_is_a_one_line_error_and_nothing_is_stored(
        state, says):
    stored.clear()
    with pytest.raises(pgpool.CheckpointError) as caught:
        run_handler(checkpoint_then_record, {"state": state}, job_id=9001, attempt=2)
    message = str(caught.value)
    assert says in message and "nothing was stored" in message and "\n" not in message
    assert stored == [None]


@pytest.mark.parametrize(("args", "says"), [
    (("half",), "done must be a number, got 'half'"),
    ((1, -1), "total must be None or a number of 0 or more, got -1"),
    ((1, 2, 3), "note must be None or a str, got int"),
], ids=["done", "total", "note"])
def test_a_bad_progress_report_is_a_one_line_error(args, says):
    with pytest.raises(pgpool.ConfigError, match=f"^current_job\\(\\).progress\\(\\): {says}$"):
        run_handler(report, {"args": list(args)})


def test_a_checkpoint_under_drain_is_the_jobs_and_the_next_attempt_reads_it(db):
    stored.clear()
    job_id = pgpool.enqueue(db, "long_api.checkpoint", {"state": "next"})
    drain(db, "long_api.checkpoint")
    assert stored == [None, {"next": 4}]
    assert pgpool.job_status(db, job_id).state == "unknown"  # it succeeded, unkept
    # A job whose first attempt fails after its checkpoint: its retry reads it.
    stored.clear()
    job_id = pgpool.enqueue(db, "long_api.resume", {})
    assert drain(db, "long_api.resume", raise_errors=False, retries=True).done == 1
    assert stored == [None, {"claim": 2}]


@pgpool.handler("long_api.resume")
def resume(payload: dict) -> None:
    job = pgpool.current_job()
    stored.append(job.checkpoint_state)
    job.checkpoint({"claim": job.claim + 1})
    if job.claim == 1:
        raise ConnectionError("the first attempt fails after its checkpoint")
