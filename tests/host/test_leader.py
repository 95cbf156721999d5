"""The fleet's maintenance leader under chaos, with real hosts (pgpool.host.parts.leader): one
host leads; when it is killed another takes over within about one lease and its reaper
returns the dead leader's jobs; when it is frozen (SIGSTOP) past its lease another takes
over, and the frozen one, resumed, steps down and leads nothing; a clean exit hands over at
once. tests/db/test_leader_fence.py proves the fence itself on the database.

Every wait has a deadline; each bound says why it holds on a loaded two-core machine.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from commands import RUN
from processes import Pgpool, start_pgpool
from records import read_records
from waits import wait_until

import pgpool

#: Hosts killed, frozen and stopped while others wait out their leases: the soak tier; one
#: fleet test at a time on the shared server (eleven connections a host, of 100).
pytestmark = [pytest.mark.soak, pytest.mark.xdist_group("fleet")]

LEASE = 2.0
#: An idle poll far past every bound here: the hosts learn of work from notifications.
HOST = (*RUN, "--procs", "1", "--batch", "1", "--lease", str(LEASE), "--idle-poll", "120")
#: Room for a loaded machine: a host's statements and its event loop may lag by this much.
SLACK = 3.0


def leader(db: psycopg.Connection) -> tuple[str | None, int, datetime, datetime | None]:
    """(holder, token, expires_at, acquired_at) of the maintenance lease."""
    return db.execute("SELECT holder, token, expires_at, acquired_at FROM pgpool_leader "
                      "WHERE role = 'maintenance'").fetchone()


def owner(host: Pgpool) -> str:
    return host.event("started")["owner"]


def start_hosts(dsn: str, n: int, record_dir: Path) -> list[Pgpool]:
    hosts = [start_pgpool(dsn, *HOST, record_dir=record_dir) for _ in range(n)]
    for host in hosts:
        host.event("started")
    return hosts


def test_a_killed_leader_is_replaced_within_a_lease_and_its_jobs_come_back(
        db, dsn, record_dir):
    first = start_pgpool(dsn, *HOST, record_dir=record_dir)
    first.event("leader_elected")
    job = pgpool.enqueue(db, "record", {"sleep": 60})
    wait_until(lambda: read_records(record_dir), "the long job to start on the leader")
    others = start_hosts(dsn, 2, record_dir)
    assert leader(db)[0] == owner(first)

    first.kill()
    killed_at = db.execute("SELECT now()").fetchone()[0]
    holder, token, expires, _ = leader(db)
    assert holder == owner(first)  # it renewed every lease/3: not expired yet
    successor = wait_until(lambda: leader(db)[0] not in (None, holder) and leader(db),
                           "another host to take the lease", timeout=LEASE + 30)
    new_holder, new_token, _, acquired = successor
    assert new_token == token + 1
    assert new_holder in {owner(h) for h in others}
    # Never two at once: the lease was taken only once the dead leader's had expired ...
    assert acquired >= expires
    # ... and within one lease of the kill (plus the followers' jitter and a loaded
    # machine's lag).
    assert (acquired - killed_at).total_seconds() <= LEASE * 1.05 + SLACK
    # The new leader's reaper returns the dead leader's job (its lease expired about one
    # lease after the kill; the reaper passes every second) and wakes the idle hosts, one
    # of which runs it again: well before their idle poll.
    restarted = wait_until(
        lambda: [r for r in read_records(record_dir) if r[0] == job and r[3] == "start"
                 and r[1] == 2], "the dead leader's job to start again",
        timeout=2 * LEASE + 1 + 3 * SLACK)
    assert restarted
    # Exactly one host led at any time: each host's log shows its terms, and only the new
    # holder's took over.
    elected = [e["term"] for h in others for e in h.events("leader_elected")]
    assert elected == [new_token]
    for h in others:  # not stopped: one runs the minute-long job again (clean stops: below)
        h.kill()


def test_a_frozen_leader_is_replaced_and_once_resumed_leads_nothing(db, dsn, record_dir):
    frozen = start_pgpool(dsn, *HOST, record_dir=record_dir)
    frozen.event("leader_elected")
    (other,) = start_hosts(dsn, 1, record_dir)
    holder, token, _, _ = leader(db)
    assert holder == owner(frozen)

    frozen.send_signal(signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        other.event("leader_elected", timeout=LEASE + 30)
        took = time.monotonic() - stopped_at
        assert leader(db)[:2] == (owner(other), token + 1)
        assert took <= LEASE * 1.05 + SLACK
    finally:
        frozen.send_signal(signal.SIGCONT)
    # Resumed, it finds its term over (its election step, or its parts' fence) and steps
    # down; it does not take the lease back while the successor renews it.
    deposed = frozen.event("leader_deposed", timeout=30)
    assert deposed["term"] == token
    deadline = time.monotonic() + 2 * LEASE
    while time.monotonic() < deadline:
        assert leader(db)[:2] == (owner(other), token + 1)
        time.sleep(0.1)
    assert [e["term"] for e in frozen.events("leader_elected")] == [token]
    assert frozen.stop() == 0 and other.stop() == 0


def test_a_leader_that_stops_cleanly_hands_over_at_once(db, dsn, record_dir):
    # A 60 s lease: the follower would otherwise wait for it to run out.
    host = (*RUN, "--procs", "1", "--lease", "60")
    first = start_pgpool(dsn, *host, record_dir=record_dir)
    first.event("leader_elected")
    second = start_pgpool(dsn, *host, record_dir=record_dir)
    second.event("started")
    _, token, _, _ = leader(db)
    stopped_at = time.monotonic()
    assert first.stop() == 0
    second.event("leader_elected", timeout=30)
    # Far within the lease: the resignation's notification woke it.
    assert time.monotonic() - stopped_at < 20
    assert leader(db)[:2] == (owner(second), token + 1)
    assert second.stop() == 0


def test_jobs_a_stopping_host_hands_back_wake_the_idle_hosts(db, dsn, record_dir):
    """Scaled in (SIGTERM), a host hands its unstarted jobs back and notifies their queue:
    an idle host runs them at once, not at its idle poll."""
    # 2 s each: the busy host is still on its first ones when it is stopped, even when the
    # idle host is slow to start on a loaded machine (at 1 s each it once ran all six).
    ids = [pgpool.enqueue(db, "record", {"sleep": 2}) for _ in range(6)]
    busy = start_pgpool(dsn, *RUN, "--procs", "1", "--batch", "6", "--idle-poll", "120",
                        record_dir=record_dir)
    wait_until(lambda: read_records(record_dir), "the first job to start")
    assert db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'ready'"
                      ).fetchone()[0] == 0  # all six claimed by the busy host
    (idle,) = start_hosts(dsn, 1, record_dir)  # finds nothing: waits for a notification
    stopped_at = time.monotonic()
    assert busy.stop() == 0
    done = {r[0] for r in read_records(record_dir) if r[3] == "end"}
    wait_until(lambda: {r[0] for r in read_records(record_dir) if r[3] == "end"} >= set(ids),
               "the handed-back jobs to run on the idle host", timeout=60)
    # Five jobs of 2 s each on one worker, started on the notification: far within the
    # idle host's 120 s idle poll.
    assert time.monotonic() - stopped_at < 10 + 10 * SLACK
    assert len(done) < len(ids)
    assert idle.stop() == 0
