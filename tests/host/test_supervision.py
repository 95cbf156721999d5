"""Supervision: a dispatcher's parts that die are noticed, and so are its processes.

Real dispatchers (`pgpool run`) against the real database; a part is made to fail through
the database itself (a trigger), never by replacing code.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest
from commands import RUN
from dbtools import one
from processes import alive, start_pgpool
from records import read_records
from waits import wait_until

import pgpool


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
@pytest.mark.own_schema
def test_a_part_that_fails_unexpectedly_stops_the_host_loudly_after_a_drain(
        db, dsn, record_dir):
    # A trigger that skips every update of pgpool_hosts: the host registry's upsert then
    # returns no row, and its beat raises TypeError, a failure it does not expect (it
    # rides out database errors only). Installed once the host is up and its job runs.
    job_id = pgpool.enqueue(db, "record", {"sleep": 3})
    p = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "3", record_dir=record_dir)
    wait_until(lambda: any(r[3] == "start" for r in read_records(record_dir)),
               "the job to start")
    db.execute("""
        CREATE FUNCTION skip_update() RETURNS trigger LANGUAGE plpgsql
        AS $$ BEGIN RETURN NULL; END $$;
        CREATE TRIGGER skip_update BEFORE UPDATE ON pgpool_hosts
        FOR EACH ROW EXECUTE FUNCTION skip_update();
    """)
    # The registry beats every lease/3 = 1 s; 30 s is a generous bound on a loaded machine.
    failed = p.event("part_failed", timeout=30)
    assert failed["part"] == "host registry" and failed["error"] == "TypeError"
    assert "hosts.py" in failed["message"]
    # It drains: the running job finishes and is acked, then the host exits non-zero.
    assert p.wait(60) == 1
    assert [r[3] for r in read_records(record_dir)] == ["start", "end"]
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = %s", job_id) == (0,)
    assert p.events("finished"), p.stderr


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
@pytest.mark.own_schema
def test_a_failed_claim_loop_stops_the_host_loudly_after_a_drain(db, dsn, record_dir):
    # A trigger renames the kind of every job as it is claimed: the claim then returns a
    # kind this host has no handler for, which the claimer cannot expect (it claims only
    # kinds it handles), and the claim loop fails with KeyError. A job already running
    # when that happens still finishes and is acked.
    running = pgpool.enqueue(db, "record", {"sleep": 2})
    p = start_pgpool(dsn, *RUN, "--procs", "2", record_dir=record_dir)
    wait_until(lambda: any(r[3] == "start" for r in read_records(record_dir)),
               "the first job to start")
    db.execute("""
        CREATE FUNCTION rename_kind() RETURNS trigger LANGUAGE plpgsql
        AS $$ BEGIN NEW.kind := 'renamed'; RETURN NEW; END $$;
        CREATE TRIGGER rename_kind BEFORE UPDATE ON pgpool_jobs
        FOR EACH ROW WHEN (NEW.state = 'running' AND OLD.state = 'ready')
        EXECUTE FUNCTION rename_kind();
    """)
    pgpool.enqueue(db, "record", {})
    failed = p.event("part_failed", timeout=30)  # a claim is woken by NOTIFY, or the 1 s poll
    assert failed["part"] == "claim loops" and failed["error"] == "KeyError"
    assert p.wait(60) == 1
    assert [r[3] for r in read_records(record_dir) if r[0] == running] == ["start", "end"]
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = %s", running) == (0,)
    assert p.events("finished"), p.stderr


def test_a_killed_worker_is_noticed_and_replaced_while_its_handlers_child_holds_its_pipe(
        db, dsn, record_dir, host_path):
    # The reported case: the handler forks a child that sleeps 40 s (it inherits the
    # worker's pipes), and the job has a 2 s timeout. The worker is killed at 2 s; the job
    # must end then, the child with it, and a new worker must take the next job.
    job_id = pgpool.enqueue(db, "forker", {"sleep": 60, "child_sleep": 40})
    p = start_pgpool(dsn, *RUN, "--procs", "1", "--timeout", "2", record_dir=record_dir,
                     **host_path)
    # 20 s: far above 2 s plus a claim on a loaded machine, well below the child's 40 s.
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_dead WHERE id = %s", job_id)
               == (1,), "the timed-out job to be dead-lettered", timeout=20)
    (child,) = [r[2] for r in read_records(record_dir) if r[3] == "child"]
    assert not alive(child), f"the handler's child {child} outlived the attempt"
    pgpool.enqueue(db, "whoami", {})
    wait_until(lambda: any(r[3] == "run" for r in read_records(record_dir)),
               "the next job to run on a new worker")
    assert p.stop() == 0, p.stderr


# --- as PID 1 ----------------------------------------------------------------------------

UNSHARE = shutil.which("unshare")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1])


def _zombies_under(root: int) -> list[int]:
    """The zombie processes among ``root``'s descendants."""
    tree: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            states[int(entry)] = stat[0]
            tree.setdefault(stat[1], []).append(int(entry))
    found, todo = [], list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        if states.get(pid) == "Z":
            found.append(pid)
        todo.extend(tree.get(pid, []))
    return found


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
@pytest.mark.skipif(UNSHARE is None, reason="needs unshare (util-linux) to start a PID namespace")
@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root")
def test_as_pid_1_it_reaps_orphans_and_still_drains_on_sigterm(db, dsn, record_dir):
    # Each "orphan" job leaves a grandchild that is re-parented to PID 1 of the namespace:
    # pgpool itself. Run it as a container without an init would.
    pgpool.enqueue_many(db, "orphan", ({"n": i} for i in range(20)))
    p = start_pgpool(dsn, *RUN, "--procs", "2", record_dir=record_dir,
                     wrapper=[UNSHARE, "--pid", "--fork", "--mount-proc", "--kill-child"])
    wait_until(lambda: len(read_records(record_dir)) == 20, "the 20 orphan jobs to run")
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs") == (0,),
               "the 20 orphan jobs to be acked")
    # unshare forks PID 1 of the new namespace: `pgpool run` (it does not forward signals).
    with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
        (pid1,) = map(int, f.read().split())
    # Zombies last only until PID 1 reaps them, which it does at once; 10 s is a generous
    # bound on a loaded machine. Unreaped, they would stay for good.
    wait_until(lambda: not _zombies_under(pid1), "the orphans to be reaped", timeout=10)

    # It still stops as it should: a job running at SIGTERM finishes, and the exit is 0.
    job_id = pgpool.enqueue(db, "record", {"sleep": 1})
    wait_until(lambda: any(r[3] == "start" for r in read_records(record_dir)),
               "the record job to start")
    os.kill(pid1, signal.SIGTERM)
    assert p.wait(60) == 0, p.stderr
    assert p.events("stopping") and p.events("finished"), p.stderr
    assert [r[3] for r in read_records(record_dir) if r[0] == job_id] == ["start", "end"]
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
