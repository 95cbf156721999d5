"""Jobs that take several slots (``@pgpool.handler(kind, cpus=N)``) on a real host with
``--procs 4``: it never runs more slots than it has, nor more than two ``cpus=2`` jobs at
once; narrow jobs fill the slots beside them; a wide job is not starved by the narrow
ones enqueued after it; a kind wider than the host's ``--procs`` is not claimed there."""

from __future__ import annotations

import logging

import pytest
from commands import status_json
from longjobs import spans, too_wide
from processes import start_pgpool
from waits import wait_until

import pgpool

SECONDS = 0.3


def most_at_once(found: list[tuple[str, int, int, int, int]], kind: str | None) -> int:
    """The most slots (of ``kind``'s jobs, or of all) in use at any moment."""
    edges = sorted((at, sign * cpus) for k, _, cpus, start, end in found
                   if kind is None or k == kind
                   for at, sign in ((start, 1), (end, -1)))
    most = used = 0
    for _, change in edges:  # at a tie, the end (negative) sorts first
        used += change
        most = max(most, used)
    return most


@pytest.mark.soak  # a real host running long jobs for 10 s or more: `make soak-test`
def test_wide_jobs_take_their_slots_and_are_not_starved(db, dsn, record_dir):
    host = start_pgpool(dsn, "run", "--handlers", "longjobs", "--procs", "4",
                        record_dir=record_dir)
    host.event("started")
    before = [pgpool.enqueue(db, "narrow", {"seconds": SECONDS}) for _ in range(6)]
    first_wide = pgpool.enqueue(db, "wide", {"seconds": SECONDS})
    after = [pgpool.enqueue(db, kind, {"seconds": SECONDS})
             for _ in range(6) for kind in ("narrow", "wide")]
    # Longer than any job before them: the first two run side by side once both start.
    last = [pgpool.enqueue(db, "wide", {"seconds": 3 * SECONDS}) for _ in range(3)]
    ids = [*before, first_wide, *after, *last]
    wait_until(lambda: all(pgpool.job_status(db, i).state == "unknown" for i in ids),
               "every job ran", timeout=60)
    found = spans(record_dir)
    assert sorted(job_id for _, job_id, _, _, _ in found) == sorted(ids)
    assert {(kind, cpus) for kind, _, cpus, _, _ in found} == {("narrow", 1), ("wide", 2)}
    assert most_at_once(found, None) == 4  # full, and never more
    assert most_at_once(found, "wide") == 4  # two wide jobs at once, never three
    # The first wide job waited for two slots, not for every narrow job behind it.
    starts = {job_id: start for _, job_id, _, start, _ in found}
    narrow_after = [job_id for kind, job_id, _, _, _ in found
                    if kind == "narrow" and job_id in after]
    assert starts[first_wide] < max(starts[i] for i in narrow_after)
    assert host.stop() == 0


def test_a_kind_wider_than_the_host_is_not_claimed_there(db, dsn, record_dir, caplog):
    host = start_pgpool(dsn, "run", "--handlers", "longjobs", "--procs", "2",
                        record_dir=record_dir)
    warned = host.event("kind_too_wide")
    assert (warned["kind"], warned["cpus"], warned["procs"]) == ("too_wide", 64, 2)
    host.event("started")
    with caplog.at_level(logging.WARNING, logger="pgpool.enqueue"):
        job_id = too_wide.enqueue(db, {})
        too_wide.enqueue(db, {})  # warned once
    assert [r.getMessage() for r in caplog.records] == [
        "kind 'too_wide' takes 64 cpus, more than every live host's --procs (at most 2): "
        "its jobs wait until a host with --procs 64 or more runs it"]
    done = pgpool.enqueue(db, "narrow", {"seconds": 0})
    wait_until(lambda: pgpool.job_status(db, done).state == "unknown", "a narrow job ran")
    assert pgpool.job_status(db, job_id).state == "ready"
    # `pgpool status` lists it among the kinds no live host handles.
    assert [(u["kind"], u["ready"]) for u in status_json(dsn)["unhandled"]] == [("too_wide", 2)]
    assert host.stop() == 0
