"""Faults from outside pgpool: PostgreSQL restarted and connections killed mid-drain, and the
chaos soak (tests/support/chaos.py) at a small size.

Jobs are `tests/handlers/chaosjobs.py` ``chaos.record`` jobs: each attempt durably records
its job, attempt, worker pid, start and end (monotonic ns), so a test can prove that no job
was lost and no two attempts of one job ran at the same time, with the checker the soak uses
(``tests/support/chaos_checks.py``). Servers and processes are driven with
``tests/support/chaos_cluster.py``.

Every wait polls without blocking and has a deadline; each bound says why it holds on a
loaded two-core machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import psycopg
import pytest
from chaos_checks import (
    BACKENDS_TERMINATED,
    CALLBACK,
    DISPATCHER_KILL,
    MEMBER,
    PARENT,
    POSTGRES_RESTART,
    WORKER_KILL,
    Attempt,
    Fault,
    death_bound,
    failed_on_purpose,
    find_overlaps,
    judge,
    judge_workflows,
    read_attempts,
    read_identities,
)
from chaos_cluster import (
    KIND,
    RECORD_ENV,
    Db,
    Watcher,
    alive,
    now_ns,
    workers_of,
    workflow_outcomes,
)
from commands import clean_env, pgpool_cmd, pgpool_env
from jsonlogs import events
from places import HANDLERS, ROOT, SUPPORT
from psycopg.conninfo import make_conninfo
from waits import wait_until

import pgpool
from pgpool.host.scheduler import capacity

# The soak tier: `make soak-test` (which CI runs too), not `make test`.
pytestmark = pytest.mark.soak

LEASE = 2
PROCS = 2
BATCH = 50
RUN = ("run", "--handlers", "chaosjobs", "--lease", str(LEASE))
#: How long a queue of 1000 chaos jobs (2 ms of CPU each, two workers) may take to drain
#: after a fault: about 1 s of work on two busy cores, plus the reconnects (the listener's
#: back-off is capped at 10 s); 60 s is several times that.
DRAIN = 60
#: How long a dispatcher's listener may take to be connected again after a fault: its
#: reconnect back-off is capped at 10 s (pgpool.listener), so 30 s is three times that.
RELISTEN = 30


def lines(records: Path) -> list[str]:
    """Every complete record line written so far."""
    return [line for f in records.glob("*.log") for line in f.read_text().splitlines()]


def ended(records: Path) -> int:
    """How many attempts have recorded their end so far."""
    return sum(1 for line in lines(records) if not line.endswith(" -"))


def recorded(records: Path, job_id: int, ended: bool) -> bool:
    """Whether an attempt of job ``job_id`` has recorded its start (or, with ``ended``, its
    end) so far."""
    return any(int(line.split()[0]) == job_id and line.endswith(" -") != ended
               for line in lines(records))


def started_pids(records: Path) -> list[int]:
    """The worker pid of every attempt that recorded its start so far."""
    return [int(line.split()[2]) for line in lines(records) if line.endswith(" -")]


class Host:
    """One real dispatcher running chaos jobs, its output in a file (a pipe nobody reads
    could fill up and stall it)."""

    def __init__(self, dsn: str, records: Path, log: Path, *args: str) -> None:
        env = pgpool_env(dsn, PYTHONPATH=str(HANDLERS), **{RECORD_ENV: str(records)})
        self.log = log
        args = args or ("--procs", str(PROCS), "--batch", str(BATCH))
        with log.open("wb") as out:
            self.proc = subprocess.Popen(pgpool_cmd(*RUN, *args), cwd=HANDLERS, env=env,
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, and the exit status. A graceful stop lets running jobs finish (2.5 s
        at most here) and gives its last acks 15 s; 60 s is twice that on a slow machine."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "records"
    path.mkdir()
    yield path


@pytest.fixture
def watcher(records: Path) -> Iterator[Watcher]:
    """Notes when each worker that recorded an attempt exited (for the overlap check)."""
    w = Watcher(records)
    w.start()
    yield w
    w.stop()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Callable[..., Host]]:
    """``hosts(dsn, records, *args)`` starts a dispatcher (default ``--procs 2 --batch 50``);
    any still running after the test is killed."""
    started: list[Host] = []

    def start(dsn: str, records: Path, *args: str) -> Host:
        host = Host(dsn, records, tmp_path / f"dispatcher-{len(started)}.log", *args)
        started.append(host)
        return host

    yield start
    for host in started:
        if host.proc.poll() is None:
            host.proc.kill()
            host.proc.wait(timeout=30)


def check_run(ids: set[int], records: Path, watcher: Watcher,
              faults: list[Fault]) -> dict[int, list[Attempt]]:
    """Every job completed, no two attempts of a job overlapped, no attempt started twice,
    and every re-run is explained by one of ``faults`` and within what they could have
    interrupted: the soak's checker (`chaos_checks.judge`), with nothing dead or left."""
    # The dispatchers have exited; their workers die with them, seen within 10 s.
    assert watcher.settle() == [], "workers still running after their dispatcher exited"
    attempts = read_attempts(records)
    verdict = judge(ids, attempts, faults, died=watcher.died, lease=LEASE)
    assert verdict.failures() == []
    return attempts


def jobs_left(db: Db) -> int | None:
    """Jobs still in the queue, or None while the server cannot be reached (one attempt,
    so a wait polling this keeps its deadline)."""
    return db.poll("SELECT count(*) FROM pgpool_jobs")


def listening(db: Db, app: str | None = None, not_pids: Collection[int] = ()) -> bool:
    """Whether a connection (named ``app``, if given; none of ``not_pids``) is LISTENing:
    what a dispatcher's listener shows in ``pg_stat_activity`` once it has (re)connected."""
    return bool(db.poll(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%' "
        "AND datname = current_database() "
        "AND (%s::text IS NULL OR application_name = %s) AND NOT pid = ANY(%s)",
        (app, app, list(not_pids))))


def running(conn: psycopg.Connection) -> int:
    """Jobs claimed and not yet acked: what a fault right now could interrupt."""
    return conn.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running'").fetchone()[0]


def test_postgres_restarted_mid_drain_the_dispatcher_carries_on(
        own_server, records, watcher, hosts):
    """``pg_ctl restart`` mid-drain: the dispatcher stays up, reconnects by itself and
    drains the queue; every job completes, and a job runs twice only if the restart could
    have interrupted it."""
    pg = own_server
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        pgpool.enqueue_many(conn, KIND, [{"ms": 2}] * 1000)
        ids = {row[0] for row in conn.execute("SELECT id FROM pgpool_jobs")}
        host = hosts(pg.dsn, records)
        # Start-up takes a few seconds on a loaded machine, 200 jobs half a second more;
        # the default 30 s is several times that.
        wait_until(lambda: ended(records) >= 200, "a fifth of the jobs to finish")
        in_flight = running(conn)
    t0 = now_ns()
    pg.restart()
    restart = Fault(POSTGRES_RESTART, t0, now_ns(),
                    cap=in_flight + capacity(PROCS, BATCH))
    db = Db(pg.dsn)
    wait_until(lambda: jobs_left(db) == 0, "the queue to drain after the restart", DRAIN)
    assert db.query("SELECT count(*) FROM pgpool_dead") == 0
    # The restart ended every session, so a LISTENing connection is a reconnected listener.
    wait_until(lambda: listening(db), "the listener to reconnect", RELISTEN)
    db.close()
    assert host.proc.poll() is None, f"the dispatcher died:\n{host.output()}"
    assert host.stop() == 0, host.output()
    attempts = check_run(ids, records, watcher, [restart])
    # It kept going: jobs started after the server came back. Not a timing bound: at the
    # restart at most 200 + a few had ended and `capacity` more were claimed, so hundreds
    # of the 1000 could only be claimed, and so start, once the server was back.
    assert any(a.start > restart.t1 for runs in attempts.values() for a in runs)


@pytest.mark.xdist_group("fleet")  # several hosts on the shared server: tests/conftest.py
def test_connections_terminated_mid_drain_nothing_is_lost(dsn, db, records, watcher, hosts):
    """pg_terminate_backend on all of a dispatcher's connections, twice mid-drain: it
    reconnects and drains the queue; nothing is lost, no attempts overlap, and re-runs are
    only of jobs the terminations could have interrupted."""
    # application_name marks this dispatcher's connections, so only they are terminated
    # even on a server other tests (or other people) use.
    app = f"pgpool-test-{uuid.uuid4().hex[:8]}"
    pgpool.enqueue_many(db, KIND, [{"ms": 2}] * 1000)
    ids = {row[0] for row in db.execute("SELECT id FROM pgpool_jobs")}
    host = hosts(make_conninfo(dsn, application_name=app), records)
    faults = []
    killed: set[int] = set()
    for round_ in (1, 2):
        # Start-up and 250 jobs take a few seconds on a loaded machine; 30 s is plenty.
        wait_until(lambda n=round_: ended(records) >= 250 * n, f"{250 * round_} jobs to end")
        in_flight = running(db)
        t0 = now_ns()
        rows = db.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = %s", (app,)).fetchall()
        faults.append(Fault(BACKENDS_TERMINATED, t0, now_ns(),
                            cap=in_flight + capacity(PROCS, BATCH)))
        ended_now = {pid for pid, done in rows if done}
        assert len(ended_now) >= 2  # its pooled connections and its listener, at least
        killed |= ended_now
    poller = Db(dsn)
    wait_until(lambda: jobs_left(poller) == 0, "the queue to drain", DRAIN)
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    wait_until(lambda: listening(poller, app, not_pids=killed), "the listener to reconnect",
               RELISTEN)
    poller.close()
    assert host.proc.poll() is None, f"the dispatcher died:\n{host.output()}"
    assert host.stop() == 0, host.output()
    check_run(ids, records, watcher, faults)


def test_postgres_down_longer_than_a_lease_the_cut_off_host_stops_its_jobs(
        own_server, records, watcher, hosts):
    """A host that cannot reach the database for a whole lease must give its jobs up: kill
    the workers running them and start none of them again. Otherwise another host, which
    re-claims those jobs once their leases expire, runs them at the same time."""
    pg = own_server
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        pgpool.enqueue_many(conn, KIND, [{"sleep": 2.5}] * 4)
        ids = {row[0] for row in conn.execute("SELECT id FROM pgpool_jobs")}
    # The cut-off host claims all four: one runs, one waits in its worker, two in its backlog.
    first = hosts(pg.dsn, records, "--procs", "1", "--batch", "4")
    # Start-up takes a few seconds on a loaded machine; the default 30 s is plenty.
    (worker,) = wait_until(lambda: started_pids(records), "the first job to start")
    t0 = now_ns()
    pg.stop()
    # Within a lease (plus a heartbeat interval) of its last heartbeat it must kill the
    # worker running a job it can no longer vouch for: it gives up 0.8 lease after its last
    # good heartbeat (earlier than the stop), checked every 0.1 s, so about 1.7 s after the
    # stop. Polling five leases (10 s) leaves over 8 s for a loaded machine to stall its
    # event loop; a passing run stops polling as soon as the worker is gone, and a host that
    # never gives up keeps its worker alive (four 2.5 s jobs, then idle), so it still fails.
    patience = 5 * LEASE
    deadline = time.monotonic() + patience
    while watcher.died(worker) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    gave_up = watcher.died(worker)
    pg.start_again()
    outage = Fault(POSTGRES_RESTART, t0, now_ns(), cap=len(ids))
    # A second host with an idle worker per job re-claims the expired jobs at once.
    second = hosts(pg.dsn, records, "--procs", "4", "--batch", "4")
    db = Db(pg.dsn)
    wait_until(lambda: jobs_left(db) == 0, "the queue to drain after the outage", DRAIN)
    db.close()
    assert first.stop() == 0, first.output()
    assert second.stop() == 0, second.output()
    assert watcher.settle() == []
    attempts = read_attempts(records)
    overlaps = [
        f"job {a.job}: attempt {a.attempt} (pid {a.pid}) ran {(a.start - t0) / 1e9:.2f}s.."
        f"{((a.end or watcher.died(a.pid) or 0) - t0) / 1e9:.2f}s after the server went away, "
        f"attempt {b.attempt} (pid {b.pid}) started at {(b.start - t0) / 1e9:.2f}s"
        for a, b in find_overlaps(attempts, watcher.died)]
    assert gave_up is not None, (
        f"the cut-off host kept running its job for {patience}s without the database; "
        f"overlapping attempts: {overlaps}; its log:\n{first.output()}")
    # Once it gave its jobs up it must not start any of them (all held at attempt 1) again.
    restarted = [(a.job, round((a.start - t0) / 1e9, 2)) for runs in attempts.values()
                 for a in runs if a.ppid == first.proc.pid and a.attempt == 1
                 and a.start > gave_up]
    assert not restarted, (
        f"(job, seconds after the server went away) started by the cut-off host after it "
        f"gave them up at {(gave_up - t0) / 1e9:.2f}s: {restarted}; overlapping attempts: "
        f"{overlaps}; its log:\n{first.output()}")
    assert not overlaps, f"{overlaps}; first host's log:\n{first.output()}"
    check_run(ids, records, watcher, [outage])


def test_an_outage_is_logged_as_state_changes_and_sigterm_during_one_is_bounded(
        own_server, records, hosts):
    """Each background part logs the start of an outage once and its end once (not a line
    per retry), held jobs are abandoned once, and a SIGTERM while the database is away
    ends within grace + 15 s (the last acks' wait), with exit status 1."""
    pg = own_server
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        pgpool.enqueue(conn, KIND, {"sleep": 0.3})
    host = hosts(pg.dsn, records, "--procs", "1", "--batch", "1", "--grace", "1",
                 "--log-format", "json")
    wait_until(lambda: started_pids(records), "the job to start")
    # Stopped at once, without the shutdown checkpoint: the job records its end with
    # fdatasync, and on a loaded disk a checkpoint's writes held that past the fence's
    # deadline (2 s lease), so the worker was stopped before it recorded its end.
    pg.stop(immediate=True)
    wait_until(lambda: ended(records) == 1, "the job to end during the outage")
    wait_until(lambda: {e["what"] for e in events(host.output(), "failing")}
               >= {"heartbeat", "ack flush"}, "the heartbeat and ack flush to fail")
    # The outage itself: three leases, in which the heartbeat retries every 0.5 s (about
    # twelve tries), the ack flush backs off, and the held job is abandoned at 0.8 lease.
    time.sleep(3 * LEASE)
    pg.start_again()
    wait_until(lambda: "ack flush" in {e["what"] for e in events(host.output(), "recovered")},
               "the waiting ack to be written")
    log = host.output()
    failing = [e["what"] for e in events(log, "failing")]
    assert len(failing) == len(set(failing)), failing  # once per part, not per retry
    # The heartbeat and the waiting ack retry on their own through the outage. Parts that
    # take a pooled connection for each pass (reaper, stager, claim) may instead wait on the
    # pool until the server is back, and then have nothing to report: with an immediate
    # stop, the reaper did so once in four CI runs.
    assert {"heartbeat", "ack flush"} <= set(failing), failing
    assert len(events(log, "abandoned")) == 1, log
    # The waiting ack was written once the server was back, in one line after the outage.
    # Its retries may have ended at its first failure: a retry may wait on the pool for a
    # connection until the server is back, as the parts above may.
    (back,) = [e for e in events(log, "recovered") if e["what"] == "ack flush"]
    assert back["failures"] >= 1 and back["seconds"] >= 3 * LEASE, back

    # A second outage with an ack waiting: SIGTERM gives up on it after 15 s and exits 1.
    # Known by its id: the first job may run again meanwhile (its lease ran out during the
    # outage, and the reaper can return it before the waiting ack lands: at least once).
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        second = pgpool.enqueue(conn, KIND, {"sleep": 0.3})
    wait_until(lambda: recorded(records, second, ended=False), "the second job to start")
    pg.stop(immediate=True)
    wait_until(lambda: recorded(records, second, ended=True),
               "the second job to end during the outage")
    started = time.monotonic()
    host.proc.send_signal(signal.SIGTERM)
    # grace (1 s) + the last acks' 15 s; 10 s more for a loaded machine, and for the
    # connection pool's close. Before, a 5 s deregistration came on top.
    status = host.proc.wait(timeout=1 + 15 + 10)
    took = time.monotonic() - started
    assert status == 1, host.output()
    assert 15 <= took <= 1 + 15 + 10, took
    pg.start_again()  # the fixture stops it


#: The small soak stops by itself after its 60 s limit and 60 s of grace for the drain (+
#: one query's patience, 30 s); with set-up (initdb, enqueue) and the dispatchers' graceful
#: stop, a passing run takes about a minute on a loaded machine (30 s on a quiet one). A
#: run still going after 240 s is told to stop (SIGTERM, so it stops its server and
#: dispatchers) and fails.
SOAK_TIMEOUT = 240


def test_a_small_chaos_soak_passes_every_check(tmp_path):
    """tests/support/chaos.py at CI size: two dispatchers, random kills and restarts, and
    its own checkers, with the group workload (4 groups of 250 members, 100 parents with
    follow-up children and groups), 20 long jobs that checkpoint after each of their 20
    steps, and 30 jobs of each limited kind: about 2000 jobs, which drain in about the time
    1500 plain ones did. It must pass and report the figures. Faults stop after 45 s; a
    machine busy with the soak tier's other tests may need more than the 15 s left to
    drain what is left: up to 60 s more (its speed is not what this checks)."""
    summary = tmp_path / "summary.json"
    soak = subprocess.Popen(
        [sys.executable, str(SUPPORT / "chaos.py"), "--jobs", "300", "--groups", "4",
         "--members", "1000", "--parents", "100", "--steps", "20", "--limited", "30",
         "--rated", "30", "--seconds", "60", "--drain-grace", "60",
         "--interval", "0.2,0.8", "--summary", str(summary)],
        cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = soak.communicate(timeout=SOAK_TIMEOUT)
    except subprocess.TimeoutExpired:
        soak.terminate()
        try:
            out, err = soak.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            soak.kill()
            out, err = soak.communicate()
        pytest.fail(f"the soak ran over {SOAK_TIMEOUT}s:\n{out}{err[-5000:]}")
    assert soak.returncode == 0, out + err[-5000:]
    figures = json.loads(summary.read_text())
    # The driver's 300 + 1000 + 4 callbacks + 100 parents + 20 long jobs + 60 limited, and
    # the parents' follow-ups.
    assert figures["jobs"] > 1484
    # The soak does one fault of each kind before it ends (unless its 45 s of faults run
    # out, which a passing run of 2000 jobs never nears).
    assert figures["faults"] >= 4
    assert figures["lost"] == 0
    assert figures["overlapping"] == 0
    assert figures["unexplained re-runs"] == 0
    assert figures["not drained"] == 0
    assert figures["completed"] + figures["dead"] >= figures["jobs"]
    # The four groups and those the parents that are done started, each released once.
    assert figures["groups"] > 4
    assert figures["callbacks run"] == figures["groups"]
    assert figures["members"] >= 1000
    for name in ("members lost", "callbacks duplicated", "callbacks early", "orphans",
                 "duplicates", "children lost", "bad resumes"):
        assert figures[name] == 0, name
    # Every long job resumed from its checkpoints, if a fault cut it off: none ran a step
    # twice but the one in flight (`chaos_checks.judge_steps`), so each step run twice was
    # run again by a claim after the first: a re-run.
    assert figures["long jobs"] == 20
    assert figures["steps run twice"] <= figures["re-runs"]
    # The limited kinds, 30 jobs each (200 each in `make chaos`): never over their limits
    # through the faults (the soak fails its run if they are), which they met. 200 of the
    # kind limited to one at a time could not drain here in 60 s: each dispatcher killed
    # while it held the one slot holds it a lease.
    assert figures["limited jobs"] == 30
    assert figures["most running at once"] == 1
    assert figures["rated claims"] >= 30
    assert 1 <= figures["most claimed in a window"] <= 20


# --- groups and follow-ups under kills ----------------------------------------------------


def attempts_of(records: Path, job_id: int) -> list[Attempt]:
    """The attempts of ``job_id`` recorded so far, by start time."""
    return read_attempts(records).get(job_id, [])


def kill_worker(pid: int) -> Fault:
    """SIGKILL worker ``pid``: the fault, which could interrupt the one job it runs."""
    t0 = now_ns()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return Fault(WORKER_KILL, t0, now_ns(), pid=pid, cap=1)


def kill_dispatcher(host: Host, db: psycopg.Connection) -> Fault:
    """SIGKILL ``host``'s dispatcher, wait until its workers are gone with it, and count
    the jobs it held (frozen until their leases expire): the fault."""
    workers = workers_of(host.proc.pid)
    t0 = now_ns()
    host.proc.kill()
    t1 = now_ns()
    host.proc.wait(timeout=30)
    # They die with it (PR_SET_PDEATHSIG): at once, 10 s on a loaded machine is plenty.
    wait_until(lambda: not any(alive(w) for w in workers), "its workers to die with it", 10,
               interval=0.002)
    gone = now_ns()
    held = db.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running' "
                      "AND locked_by LIKE %s",
                      (f"{socket.gethostname()}:{host.proc.pid}:%",)).fetchone()[0]
    return Fault(DISPATCHER_KILL, t0, t1, pid=host.proc.pid, cap=held, workers_gone=gone,
                 workers=workers)


@pytest.mark.xdist_group("fleet")  # several hosts on the shared server: tests/conftest.py
def test_groups_and_follow_ups_survive_worker_and_dispatcher_kills(
        dsn, db, records, watcher, hosts, tmp_path):
    """Two real hosts run a group of 300 members (3 discarded on purpose), whose callback
    starts a nested group, and 40 parents with follow-up children and groups (some
    discarded after enqueueing them, some failing their first claim), while the test
    SIGKILLs a parent's worker after it kept its follow-ups, a random worker mid-group,
    the dispatcher running another held parent (then starts a host in its place), and the
    callback's worker after it read its members and kept its nested group. Then: every
    group's callback ran exactly once and after all its members, every member is counted
    in its group, every parent that is done has exactly its children and group, of the
    claim that succeeded, and nothing else exists; the soak's accounting (nothing lost,
    no overlaps, every re-run explained) holds too."""
    holds = tmp_path / "holds"
    holds.mkdir()

    def parent(i: int) -> dict:
        payload = {"children": i % 5}
        if i % 4 == 0:
            payload["group"] = 5 + i % 6
        if i % 10 == 3:
            payload["fail"] = True
        elif i % 10 == 7:
            payload["flaky"] = True
        return payload

    first = [parent(i) for i in range(20)]
    last = [parent(i) for i in range(20, 40)]
    held_by_worker = {"children": 3, "group": 6, "hold": str(holds / "worker")}
    held_by_host = {"children": 4, "hold": str(holds / "host")}
    pgpool.enqueue_many(db, PARENT, first)
    p1 = pgpool.enqueue(db, PARENT, held_by_worker)
    members = [{"g": "d0", "i": i} | ({"fail": True} if i in (7, 150, 299) else {})
               for i in range(300)]
    # Its callback starts a nested group of 4 before it is held (and killed).
    group = pgpool.group(db, MEMBER, members, then=(
        CALLBACK, {"g": "d0", "total": 300, "group": 4, "hold": str(holds / "callback")}))
    p2 = pgpool.enqueue(db, PARENT, held_by_host)
    pgpool.enqueue_many(db, PARENT, last)
    args = ("--procs", "2", "--batch", "10")
    running = [hosts(dsn, records, *args), hosts(dsn, records, *args)]
    faults = []

    # A parent killed after it kept its follow-ups: they must never exist. Start-up takes a
    # few seconds on a loaded machine, 20 parents half a second more: 60 s is plenty.
    (attempt,) = wait_until(lambda: attempts_of(records, p1), "the held parent to start", 60)
    faults.append(kill_worker(attempt.pid))
    (holds / "worker").touch()
    # A worker killed mid-group, whatever it runs: after 100 attempts, while the claims
    # (at most two hosts' capacity ahead) are still far from the second held parent.
    wait_until(lambda: ended(records) >= 100, "100 attempts to end")
    victim = running[1].proc.pid
    faults.append(kill_worker(wait_until(lambda: workers_of(victim, ready=True),
                                         "a started worker")[0]))
    # The dispatcher running the second held parent, and a host started in its place.
    attempt = wait_until(lambda: attempts_of(records, p2), "the second held parent")[-1]
    (host,) = [h for h in running if h.proc.pid == attempt.ppid]
    faults.append(kill_dispatcher(host, db))
    (holds / "host").touch()
    running = [h for h in running if h is not host] + [hosts(dsn, records, *args)]
    # The callback, killed after it read its members and kept its nested group: its next
    # attempt is a second attempt of the one callback job, not a second release, and its
    # nested group is the next attempt's only. All 300 members first: a few
    # seconds, and the killed dispatcher's jobs wait out their lease (2 s).
    wait_until(lambda: attempts_of(records, group.id), "the callback to start", DRAIN)
    callback_first = attempts_of(records, group.id)[-1]
    faults.append(kill_worker(callback_first.pid))
    (holds / "callback").touch()

    poller = Db(dsn)
    wait_until(lambda: jobs_left(poller) == 0, "every job, follow-up and callback", DRAIN)
    poller.close()
    for host in running:
        assert host.stop() == 0, host.output()
    assert watcher.settle() == []
    attempts = read_attempts(records)
    identities = read_identities(records)
    finished, left, groups = workflow_outcomes(dsn)
    died = death_bound(faults, watcher.died)
    workflows = judge_workflows(attempts, identities, planned={"d0": 300}, groups=groups,
                                finished=finished, left=left, died=died)
    assert workflows.failures() == []
    everyone = [*first, held_by_worker, held_by_host, *last]
    done = [p for p in everyone if not p.get("fail")]
    assert workflows.figures() == {
        "groups": 2 + sum(1 for p in done if p.get("group")),
        "callbacks run": 2 + sum(1 for p in done if p.get("group")),
        "members": 300 + 4 + sum(p.get("group", 0) for p in done),
        "members cancelled": 0, "members lost": 0, "callbacks duplicated": 0,
        "callbacks early": 0, "parents done": len(done), "parents dead": len(everyone) - len(done),
        "children": sum(p["children"] for p in done),
        "orphans": 0, "duplicates": 0, "children lost": 0,
    }
    ids = {r[0] for r in db.execute("SELECT id FROM pgpool_dead")}
    verdict = judge(set(identities) | set(finished), attempts, faults, died=died,
                    lease=LEASE, dead=ids, failed=failed_on_purpose(attempts, identities))
    assert verdict.failures() == []
    # The kills hit what they were aimed at: each held attempt was cut off and run again.
    for job in (p1, p2, group.id):
        cut, *again = attempts[job]
        assert cut.end is None and again and again[-1].end is not None, attempts[job]
    # The group's row and its callback, as an application sees them.
    status = pgpool.group_status(db, group.id)
    assert (status.total, status.done, status.dead, status.callback) == (300, 297, 3, "done")
    callback = pgpool.job_status(db, group.id)
    assert callback.result == {"members": 300, "finished": 300,
                               "claim": len(attempts[group.id])}
